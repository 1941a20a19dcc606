"""Layer 9, workload: a model's decode step and the workloads it serves.

- `model_step.py`: a model's decode step (presets, the stacks, timing, op shares);
- `workload_trace.py`: workload traces (the format, the importers);
- `workload.py`: a trace replayed as a continuous-batching engine under a KV budget;
- `kv_plan.py`: a KV-cache plan for a workload;
- `warmup.py`: a warm-up's calls with real inputs.

Nothing is re-exported here (the decode step imports torch): import the module.
"""

__all__: list = []
