"""A Ray cluster of nodes on this machine, to try `run --cluster` without a cluster: the cluster tests
(tests/test_ray_placement.py) and the one-node/two-node comparison (scripts/cluster_compare.py) start one.

Each node is a `ray start --block` process, the leader of a process group of its own, on free ports with
a short --temp-dir under /tmp (Ray's socket paths must fit). A node is stopped by killing its group, as a
machine that goes down (raylet, object store, workers), never with `ray stop`, which would stop every
Ray node of the machine, other clusters' too.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Mapping, Optional, Sequence

RAY = os.path.join(os.path.dirname(sys.executable), "ray")

# How many nodes (and GPUs among them) are alive, asked from a child so that the asking process never
# joins the cluster.
_PROBE = (
    "import ray, sys\nray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
    "alive = [node for node in ray.nodes() if node['Alive']]\n"
    "print(len(alive), int(sum(node['Resources'].get('GPU', 0) for node in alive)))\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_ports() -> List[str]:
    """Every port a node listens on, free ones: the nodes share this machine with each other and with
    other clusters."""
    return [
        "--node-manager-port",
        str(free_port()),
        "--object-manager-port",
        str(free_port()),
        "--dashboard-agent-listen-port",
        str(free_port()),
        "--dashboard-agent-grpc-port",
        str(free_port()),
        "--runtime-env-agent-port",
        str(free_port()),
        "--metrics-export-port",
        str(free_port()),
        "--object-store-memory",
        str(100 * 1024 * 1024),
        "--disable-usage-stats",
    ]


class LocalRayCluster:
    """Nodes by name; `start("head", ["--head", ...])` first, then others with `["--address",
    cluster.address]`. `env` is every node's environment (a node's own `env` is laid over it)."""

    def __init__(self, prefix: str = "kar", env: Optional[Mapping[str, str]] = None):
        self.dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(env if env is not None else os.environ)
        self.nodes: Dict[str, subprocess.Popen] = {}

    def start(self, name: str, args: List[str], env: Optional[Mapping[str, str]] = None) -> None:
        with open(os.path.join(self.dir, f"{name}.log"), "w") as log:  # the child keeps its own descriptor
            self.nodes[name] = subprocess.Popen(
                [RAY, "start", "--block"] + args + node_ports(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=dict(self.env, **(env or {})),
            )

    def start_head(self, args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None) -> None:
        self.start(
            "head",
            ["--head", "--port", str(self.port), "--include-dashboard=false", "--temp-dir", self.dir] + list(args),
            env,
        )

    def alive(self, connect: bool = False, timeout: float = 120.0) -> Optional[tuple]:
        """(nodes alive, GPUs among them), or None while the cluster does not answer. connect: ask from this
        process, which then stays connected (a test that calls Ray itself); else from a child."""
        if not connect:
            got = subprocess.run(
                [sys.executable, "-c", _PROBE, self.address],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
            )
            last = got.stdout.split("\n")[-2:-1] if got.returncode == 0 else []
            return tuple(int(x) for x in last[0].split()) if last else None
        import ray  # deferred: only a caller that joins the cluster needs Ray in its own process

        try:
            if not ray.is_initialized():
                ray.init(address=self.address, logging_level=logging.ERROR, log_to_driver=False)
            nodes = [node for node in ray.nodes() if node["Alive"]]
        except ConnectionError:
            return None
        return len(nodes), int(sum(node["Resources"].get("GPU", 0) for node in nodes))

    def wait_for(self, n: int, gpus: int = 0, timeout: float = 120.0, connect: bool = False) -> None:
        """Until `n` nodes are alive with `gpus` GPUs among them."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.alive(connect, timeout) == (n, gpus):
                return
            time.sleep(0.5)
        with open(os.path.join(self.dir, "head.log")) as f:
            raise RuntimeError(f"the cluster did not reach {n} nodes ({gpus} GPUs): {f.read()[-2000:]}")

    def kill(self, name: str) -> None:
        """The node goes down at once, as a machine that dies."""
        proc = self.nodes.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self) -> None:
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            sys.modules["ray"].shutdown()
        for name in list(self.nodes):
            self.kill(name)
        shutil.rmtree(self.dir, ignore_errors=True)  # the nodes' logs and session files
