"""The harness: layers 5 to 9 (docs/ARCHITECTURE.md's tree), above the sanitizer and below the agent.

Its top-level modules are what its parts share (layer 5): `env.py` (facts about the machine),
`manifest.py` (the serving manifest's records), `field_failures.py` (a retired shape class, from serving to
the ledger). Its subpackages, from the bottom up: `bench/` (6), `ledger/` (7), `serving/` (8), `workload/` (9).
Nothing is re-exported here: import the module.
"""

__all__: list = []
