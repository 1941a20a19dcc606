"""Layer 8, serving: what a serving stack calls.

- `serving.py`: the serving set's read side (`get`, `resolve`, the manifest's kernels, the choices), all a
  serving stack imports: torch, Triton and the manifest, not the static gate;
- `serving_install.py`: the write side that judges text (`install` of a promotion's `JudgedText`);
- `serving_guard.py`: the guarded rollout of a promoted kernel's new shape classes;
- `dispatch.py`: which implementation serves a bucket, from the ledger.

The manifest's records and a field failure, which the ledger stores too, are one layer down
(`harness/manifest.py`, `harness/field_failures.py`). Nothing is re-exported here: import the module.
"""

__all__: list = []
