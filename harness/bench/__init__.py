"""Layer 6, bench: timing kernels and judging the figures.

- `bench.py`: the benchmark protocol (interleaved rounds, graph replays, ceilings);
- `bench_records.py`: a benchmark's spec and results as typed records;
- `bench_worker.py`: the sandboxed benchmark child;
- `sequential.py`: the sequential test that stops a slower candidate's timing early;
- `promotion.py`: the promotion rule;
- `figures.py`: judged figures, the one reading of benchmark rows;
- `compile_probe.py`, `diagnosis.py`: a kernel compiled for sm_90 on the CPU, and what bounds an
  incumbent.

Below the ledger (which stores these records) and the serving set. Nothing is re-exported here
(the protocol imports torch): import the module.
"""

__all__: list = []
