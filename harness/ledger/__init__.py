"""Layer 7, ledger: the run ledger and what holds it.

- `ledger.py`: the ledger (SQLAlchemy; one transaction per step);
- `ledger_migrations.py`: its schema migrations, one step per version;
- `run_hold.py`: a run's hold on its ledger.

Nothing is re-exported here: import the module.
"""

__all__: list = []
