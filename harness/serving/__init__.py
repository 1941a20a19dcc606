"""Layer 8, serving: what a serving stack calls.

- `serving.py`: the serving set (`get`, `install`, `resolve`, the manifest's kernels);
- `serving_guard.py`: the guarded rollout of a promoted kernel's new shape classes;
- `dispatch.py`: which implementation serves a bucket, from the ledger.

The manifest's records and a field failure, which the ledger stores too, are one layer down
(`harness/manifest.py`, `harness/field_failures.py`). Nothing is re-exported here: import the module.
"""

__all__: list = []
