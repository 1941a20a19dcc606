"""Layer 2, kernels: the kernel texts the project serves and judges against.

- `baseline/`: each op's baseline kernel, a module named after the op (`kernels/baseline/<op>.py`) defining a
  function of that name with the op's contract signature; the trusted implementation the sanitizer compares
  with and the serving set falls back to;
- `serving/`: the promoted serving set, data rather than a package (`manifest.json` and the promoted kernels'
  files), read by `harness/serving/serving.py`;
- `candidates/`: the candidates a run writes, judged and never imported by the trusted processes.

Nothing is re-exported here: import the module (a baseline imports Triton, so this package's door imports
nothing).
"""

__all__: list = []
