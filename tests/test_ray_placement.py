"""Evaluation on a Ray cluster (agent/ray_placement.py): a real two-node cluster on this machine, started
here with `ray start` (each node in a process group of its own, so a test can kill one node and nothing
else), a short `kernel-agent run --cluster` on its CPUs with one node killed mid-task, and GPU placement
on a third node that declares a GPU which tests/ray_fake_gpu.py stands in for."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest

from kernel_agent.agent.placement import BenchTask, SanitizeTask, TaskLost
from kernel_agent.harness.ledger.ledger import Ledger

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'kernel-agent[cluster]')")

from kernel_agent.agent.local_ray_cluster import LocalRayCluster  # noqa: E402
from kernel_agent.agent.ray_placement import Node, RayPlacement, choose_gpu_model  # noqa: E402
from tiers import exhaustive  # noqa: E402

# one worker starts the cluster under pytest-xdist (module-scoped fixtures; tests/conftest.py)
pytestmark = pytest.mark.xdist_group("ray-cluster")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, "-m", "kernel_agent.agent.cli"]


def _processes_under(path):
    """Processes whose command line names `path` (the sandboxed children a node's Ray workers started)."""
    pids = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if path.encode() in f.read():
                        pids.append(int(pid))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def cluster():
    c = LocalRayCluster()
    c.node2_tmp = os.path.join(c.dir, "node2tmp")  # the second node's scratch: its tasks' files are under it
    os.makedirs(c.node2_tmp)
    c.gpu_log = os.path.join(c.dir, "fake_gpu_tasks.log")  # not gpu.log: that is the "gpu" node's own log
    try:
        # a dead node is noticed after 5 missed health checks a second apart (default 3 s apart): the killed
        # node's stage comes back sooner; a slow but live node still answers, each check waits 10 s
        c.start_head(
            ["--num-cpus", "1", "--num-gpus", "0"],
            env={"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"},
        )
        c.wait_for(1, timeout=90, connect=True)  # this process calls Ray itself: it joins the cluster
        c.start("node2", ["--address", c.address, "--num-cpus", "1", "--num-gpus", "0"], env={"TMPDIR": c.node2_tmp})
        c.wait_for(2, timeout=90, connect=True)
        yield c
    finally:
        for pid in _processes_under(
            c.node2_tmp
        ):  # judges orphaned by the killed node (they run in sessions of their own)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        c.stop()


@pytest.fixture(scope="module")
def gpu_node(cluster):
    """A node (once the second is gone) that declares one H200 (Ray's accelerator type resource); its GPU
    tasks are the fakes of tests/ray_fake_gpu.py."""
    if "node2" in cluster.nodes:  # (the run's test, which kills it, was not run)
        cluster.kill("node2")
    cluster.start(
        "gpu",
        [
            "--address",
            cluster.address,
            "--num-cpus",
            "1",
            "--num-gpus",
            "1",
            "--resources",
            json.dumps({"accelerator_type:H200": 1}),
        ],
        env={
            "KERNEL_AGENT_RAY_RUNNER": "ray_fake_gpu",
            "PYTHONPATH": os.path.join(ROOT, "tests"),
            "FAKE_GPU_LOG": cluster.gpu_log,
        },
    )
    cluster.wait_for(2, gpus=1, timeout=90, connect=True)  # (the second node, killed by the run's test, gone)
    try:
        yield cluster
    finally:
        cluster.kill("gpu")


def _bench(tmp_path, sleep_s, text="# the candidate's text\n"):
    path = tmp_path / "cand.py"
    path.write_text(text)
    from kernel_agent.harness.bench.bench_records import BenchKernel, BenchSpec

    spec = BenchSpec(
        "quantize_kv",
        (),
        "bfloat16",
        (BenchKernel("incumbent"), BenchKernel("candidate", str(path))),
        seed=int(sleep_s * 1000),
    )  # (tests/ray_fake_gpu.py sleeps `seed` ms)
    return BenchTask(spec)


def _ledger_state(db):
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        cands = con.execute("select id, status, path from candidate order by id").fetchall()
        checks = con.execute("select candidate_id, mode, name from check_result").fetchall()
        props = con.execute("select count(*) from proposal").fetchone()[0]
    return cands, checks, props


@exhaustive
def test_a_run_on_the_cluster_requeues_the_candidate_of_a_node_that_dies(cluster, tmp_path):
    """Two candidates on two one-CPU nodes; the second node is killed while it judges one of them. The run
    ends normally, that candidate's stage is queued again and runs on the node left, and each candidate
    is judged once: every check recorded once, nothing proposed twice."""
    db = tmp_path / "l.db"
    args = [
        "run",
        "--cluster",
        cluster.address,
        "--ops",
        "quantize_kv",
        "--proposer",
        "search",
        "--candidates",
        "2",
        "--per-round",
        "1",
        "--seed",
        "7",
        "--ledger",
        str(db),
        "--candidates-dir",
        str(tmp_path / "c"),
    ]
    out = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen(CLI + args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 150
        on_node2 = []
        while time.time() < deadline and proc.poll() is None and not on_node2:
            time.sleep(0.3)
            on_node2 = [
                pid
                for pid in _processes_under(cluster.node2_tmp)
                if b"kernel_agent.sanitizer.worker" in open(f"/proc/{pid}/cmdline", "rb").read()
            ]
        assert on_node2, "no task reached the second node"
        cmd = open(f"/proc/{on_node2[0]}/cmdline", "rb").read().decode().split("\0")
        judged_there = os.path.basename(cmd[cmd.index("--file") + 1])  # <label>-<hash>.py
        cluster.kill("node2")
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out.seek(0)
    text = out.read()
    assert proc.returncode == 0, text[-3000:]
    assert "cluster: Ray cluster at" in text and "2 nodes, 2 CPUs, no GPU" in text  # what it chose, said
    assert "node lost" in text and "queued again" in text, text[-3000:]
    cands, checks, props = _ledger_state(db)
    assert props == 2 and len(cands) == 2
    assert {status for _, status, _ in cands} == {"verified"}, cands  # judged, not lost, not rejected
    assert any(os.path.basename(path) == judged_there for _, _, path in cands)
    assert checks and max(Counter(checks).values()) == 1  # no check recorded twice
    assert {(cid, mode) for cid, mode, _ in checks} == {(cid, m) for cid, _, _ in cands for m in ("quick", "full")}
    led = Ledger(str(db))
    assert led.runs()[0].status == "finished"
    led.close()


# (the run with a node killed comes first: the GPU node joins after it, so that run has no GPU)


def test_the_run_uses_the_gpus_of_one_model():
    nodes = [
        Node("a", "", 8, 4, "H200"),
        Node("b", "", 8, 8, "A100"),
        Node("c", "", 8, 2, "H200"),
        Node("d", "", 4, 0, None),
    ]
    assert choose_gpu_model(nodes) == "A100"  # the model with the most GPUs
    assert choose_gpu_model(nodes, "H200") == "H200"
    with pytest.raises(ValueError, match="no node of the cluster has a B200"):
        choose_gpu_model(nodes, "B200")
    assert choose_gpu_model(nodes[3:]) is None


@exhaustive
def test_gpu_tasks_hold_a_gpu_of_the_runs_model_and_get_the_source_as_text(gpu_node, tmp_path):
    p = RayPlacement(gpu_node.address)
    try:
        assert p.gpu_model == "H200" and p.gpu_name == "Fake H200" and len(p.gpus) == 1
        assert p.cpu_slots == 2 - 1  # a CPU of the cluster goes with each GPU task
        assert "2 nodes, 2 CPUs, 1 Fake H200 GPU" in p.describe()
        task = _bench(tmp_path, 2.0)
        fut = p.submit(task)
        assert not p.can_start(_bench(tmp_path, 0.0)) and p.running("gpu") == 1  # its one GPU is held
        doc = fut.result(timeout=60)
        assert doc["error"] is None and doc["source_seen"] == "# the candidate's text\n"  # travelled as text
        check = p.submit(SanitizeTask(str(tmp_path / "cand.py"), "quantize_kv", "gpu", ("determinism",), gated=True))
        v = check.result(timeout=60)
        assert v.passed and v.file == str(tmp_path / "cand.py")  # named by the driver's path, not the node's copy
        spans = p.log()
        assert [s.kind for s in spans] == ["bench", "gpu"] and {s.gpu for s in spans} == {p.gpus[0]}
        assert spans[0].end - spans[0].start >= 2.0
        with open(gpu_node.gpu_log) as f:
            ran = [line.split()[:2] for line in f]
        assert ran[-2:] == [["bench", "0"], ["gpu", "0"]]  # on the GPU Ray gave the task
    finally:
        p.close()


@exhaustive
def test_a_task_over_its_limit_is_cancelled_and_stop_cancels_the_rest(gpu_node, tmp_path):
    p = RayPlacement(gpu_node.address, time_limits={"bench": 4.0})
    try:
        t0 = time.time()
        doc = p.submit(_bench(tmp_path, 120.0)).result(timeout=60)
        assert "over its time limit of 4s" in doc["error"] and time.time() - t0 < 30
        fut = p.submit(_bench(tmp_path, 120.0))
        time.sleep(3.0)
        with open(gpu_node.gpu_log) as f:
            pid = int(f.read().splitlines()[-1].split()[2])
        p.stop()
        assert fut.result(timeout=30) == TaskLost("stopped")  # not a verdict on the candidate
        assert not p.can_start(_bench(tmp_path, 0.0))
        assert isinstance(p.submit(_bench(tmp_path, 0.0)).result(timeout=5), TaskLost)  # nothing new starts
        deadline = time.time() + 20
        while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
            time.sleep(0.5)
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    finally:
        p.close()
