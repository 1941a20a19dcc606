"""Layer 3, isolation: what keeps a child process in bounds.

- `isolation.py`: children with a time limit and a hard kill, and the hard stop of a run;
- `sandbox.py`: what a candidate's process may do (scrubbed environment, Landlock, namespaces, limits,
  audit hook);
- `lease.py`: the GPU lease handshake between a child and the parent that places it.

Used by the sanitizer, the benchmark child and the loop. Nothing is re-exported here: import the module
(the sandbox is entered before torch is imported, so this package's door imports nothing).
"""

__all__: list = []
