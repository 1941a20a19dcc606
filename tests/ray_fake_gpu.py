"""Stands in for a GPU on the Ray nodes of tests/test_ray_placement.py (named by KERNEL_AGENT_RAY_RUNNER in
the environment of `ray start`): GPU tasks return what a GPU child would without running one, after a
benchmark spec's `seed` in milliseconds (the tests' way of saying how long it takes) or FAKE_GPU_SLEEP_S; CPU
tasks run for real."""

import os
import time

FAKE_GPU_NAME = "Fake H200"


def gpu_name():
    return FAKE_GPU_NAME


def run_task(task, env=None, on_ready=None):
    from kernel_agent.agent import placement

    if task.resource != "gpu":
        return placement.run_task(task, env)
    with open(os.environ.get("FAKE_GPU_LOG", os.devnull), "a") as f:  # what ran, where: for the test to read
        f.write(f"{task.kind} {env.get('CUDA_VISIBLE_DEVICES')} {os.getpid()}\n")
    if isinstance(task, placement.BenchTask):
        time.sleep(task.spec.seed / 1000)
        with open(task.spec.candidate.file) as f:
            source = f.read()
        return {"results": [], "error": None, "source_seen": source}
    from kernel_agent.sanitizer.canonical import read_judged
    from kernel_agent.sanitizer.verdict import CheckOutcome, Verdict

    time.sleep(float(os.environ.get("FAKE_GPU_SLEEP_S", "0")))
    return Verdict(
        task.path,
        task.op,
        task.mode,
        checks=[CheckOutcome(c, "passed") for c in task.checks or ()],
        source_hash=read_judged(task.path).hash,
    )
