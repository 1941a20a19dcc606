"""The sandbox around candidate code (sanitizer/sandbox.py), one layer at a time.

Each test enters the sandbox in a child process and tries what a hostile candidate would,
with the layer under test the only thing in the way where that can be arranged (ctypes
calls straight into libc go past the Python audit hook, so the kernel's layers are seen
on their own). The hostile candidate suite (test_hostile.py) tries the same through the
whole sanitizer.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from kernel_agent.sanitizer import sandbox

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox's kernel layers are Linux's")


def _in_sandbox(body: str, tmp_path, gpu: bool = False, env_extra=None, timeout=60, fatal=False, rc=0,
                tool_ports=()):
    """Run `body` in a child after sandbox.enter (and the audit hook armed, record-only unless `fatal`);
    its last stdout line is JSON."""
    scratch = sandbox.make_scratch("ka-test-")
    code = textwrap.dedent(f"""
        import json, os, sys, ctypes
        from kernel_agent.sanitizer import sandbox
        prot = sandbox.enter({scratch!r}, gpu={gpu!r}, tool_ports={list(tool_ports)!r})
        sandbox.arm_audit_hook(fatal={fatal!r})
        result = {{}}
    """) + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    env = sandbox.child_env(scratch, extra=env_extra)
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=scratch, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == rc, r.stderr[-2000:]
    if rc:
        return r.stderr, scratch
    return json.loads(r.stdout.strip().splitlines()[-1]), scratch


def test_child_env_is_an_allowlist_and_never_passes_secrets(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-canary")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary")
    monkeypatch.setenv("SOME_RANDOM_VAR", "x")
    env = sandbox.child_env("/tmp/s", extra={"GITHUB_TOKEN": "canary", "CUDA_VISIBLE_DEVICES": "1"})
    assert "OPENAI_API_KEY" not in env and "AWS_SECRET_ACCESS_KEY" not in env and "GITHUB_TOKEN" not in env
    assert "SOME_RANDOM_VAR" not in env and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert env["HOME"] == env["TMPDIR"] == "/tmp/s" and "canary" not in json.dumps(env)


def test_landlock_stops_writes_outside_scratch_below_the_audit_hook(tmp_path):
    if sandbox.landlock_abi() < 1:
        pytest.skip("no Landlock on this kernel")
    target = tmp_path / "outside.txt"
    os.chmod(tmp_path, 0o777)
    # gpu=True: the audit hook lets ctypes through, so libc's open meets Landlock alone
    result, scratch = _in_sandbox(f"""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.open({str(target).encode()!r}, os.O_WRONLY | os.O_CREAT, 0o644)
        result["outside"] = [fd, ctypes.get_errno()]
        fd = libc.open(b"inside.txt", os.O_WRONLY | os.O_CREAT, 0o644)
        result["inside"] = fd
    """, tmp_path, gpu=True)
    assert result["outside"][0] == -1 and result["outside"][1] in (1, 13)  # EPERM / EACCES
    assert result["inside"] >= 0 and not target.exists()


def test_no_network_below_the_audit_hook(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    got = []
    t = threading.Thread(target=lambda: got.append(_accept(listener)), daemon=True)
    t.start()
    result, _ = _in_sandbox(f"""
        libc = ctypes.CDLL(None, use_errno=True)
        import struct
        s = libc.socket(2, 1, 0)
        addr = struct.pack("!HH4s8x", 2, {port}, bytes([127, 0, 0, 1]))
        addr = struct.pack("<H", 2) + addr[2:]
        rc = libc.connect(s, addr, len(addr))
        result["connect"] = [rc, ctypes.get_errno()]
    """, tmp_path, gpu=True)
    t.join(5)
    listener.close()
    assert result["connect"][0] == -1 and not [c for c in got if c]


def _listener():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    got = []
    t = threading.Thread(target=lambda: got.append(_accept(listener)), daemon=True)
    t.start()
    return listener, listener.getsockname()[1], got, t


@pytest.mark.skipif(sandbox.landlock_abi() < 4, reason="Landlock's TCP rules need ABI 4")
def test_a_wrapping_tools_port_is_the_only_tcp_reachable(tmp_path):
    """Under compute-sanitizer the executor keeps the host's network for the tool's front end: it may
    connect to the tool's ports and nothing else, and may not listen."""
    tool, tool_port, tool_got, t1 = _listener()
    other, other_port, other_got, t2 = _listener()
    result, _ = _in_sandbox(f"""
        libc = ctypes.CDLL(None, use_errno=True)
        import struct
        def addr(port):
            a = struct.pack("!HH4s8x", 2, port, bytes([127, 0, 0, 1]))
            return struct.pack("<H", 2) + a[2:]
        for name, port in (("tool", {tool_port}), ("other", {other_port})):
            s = libc.socket(2, 1, 0)
            rc = libc.connect(s, addr(port), 16)
            result[name] = [rc, ctypes.get_errno()]
        s = libc.socket(2, 1, 0)
        result["bind"] = [libc.bind(s, addr(0), 16), ctypes.get_errno()]
        result["prot"] = prot.active
        result["missing"] = prot.missing
    """, tmp_path, gpu=True, tool_ports=[tool_port])
    t1.join(5)
    t2.join(5)
    tool.close()
    other.close()
    assert result["tool"][0] == 0 and any(tool_got), result
    assert result["other"][0] == -1 and not any(other_got), result
    assert result["bind"][0] == -1, result
    assert not any("network namespace" in a or "PID namespace" in a for a in result["prot"])
    assert any("network and PID namespaces (kept for the wrapping tool" in m for m in result["missing"])
    assert any(f"connect to the wrapping tool's ports {tool_port}-{tool_port}" in a for a in result["prot"])


def _accept(listener):
    import time
    deadline = time.time() + 4
    while time.time() < deadline:
        try:
            conn, _ = listener.accept()
            conn.close()
            return True
        except socket.timeout:
            continue
    return False


def test_the_audit_hook_refuses_and_records(tmp_path):
    result, _ = _in_sandbox("""
        import socket, subprocess
        for name, action in [("socket", lambda: socket.create_connection(("127.0.0.1", 9), timeout=1)),
                             ("subprocess", lambda: subprocess.run(["true"])),
                             ("fork", os.fork),
                             ("write", lambda: open("/tmp/ka-sandbox-probe", "w")),
                             ("ctypes", lambda: ctypes.CDLL("libc.so.6"))]:
            try:
                action()
                result[name] = "allowed"
            except PermissionError as e:
                result[name] = str(e)
        open("scratch-file", "w").write("ok")
        result["violations"] = sandbox.violations()
    """, tmp_path)
    for name in ("socket", "subprocess", "fork", "write", "ctypes"):
        assert result[name].startswith("sandbox:"), (name, result[name])
    assert len(result["violations"]) == 5 and not os.path.exists("/tmp/ka-sandbox-probe")


def test_a_fatal_hook_ends_the_process_and_cannot_be_disarmed(tmp_path):
    # the executor's hook: the first refusal ends the process, whatever the candidate did to the module
    stderr, _ = _in_sandbox("""
        sandbox._violations.clear()
        sandbox._config.update(gpu=True)
        import socket
        try:
            socket.create_connection(("127.0.0.1", 9), timeout=1)
        except BaseException:
            pass
        result["survived"] = True
    """, tmp_path, fatal=True, rc=sandbox.REFUSED_EXIT)
    assert "sandbox refused: network access" in stderr


def test_processes_the_hook_missed_are_still_seen(tmp_path):
    result, _ = _in_sandbox("""
        libc = ctypes.CDLL(None, use_errno=True)
        pid = libc.fork()  # ctypes past the hook (gpu=True lets ctypes through)
        if pid == 0:
            import time
            time.sleep(30)
            os._exit(0)
        import time
        time.sleep(0.5)
        result["foreign"] = sandbox.foreign_processes()
    """, tmp_path, gpu=True)
    if "PID namespace" not in json.dumps(sandbox.host_protections().active):
        pytest.skip("no PID namespace on this host")
    assert len(result["foreign"]) == 1


def test_other_processes_are_invisible_and_nothing_survives(tmp_path):
    result, _ = _in_sandbox("""
        result["pid"] = os.getpid()
        result["procs"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        try:
            result["parent_environ"] = open(f"/proc/{os.getppid()}/environ", "rb").read().decode(errors="replace")
        except OSError as e:
            result["parent_environ"] = ""
    """, tmp_path, env_extra={"NOT_A_SECRET": "visible"})
    if "PID namespace" not in json.dumps(sandbox.host_protections().active):
        pytest.skip("no PID namespace on this host")
    assert result["pid"] == 1 and result["procs"] == [1]
    assert "OPENAI" not in result["parent_environ"]


def test_limits_stop_a_runaway_allocation(tmp_path):
    result, _ = _in_sandbox("""
        try:
            blob = bytearray(12 << 30)
            result["alloc"] = "allowed"
        except MemoryError:
            result["alloc"] = "refused"
    """, tmp_path)
    assert result["alloc"] == "refused"


def test_host_protections_names_every_layer():
    prot = sandbox.host_protections()
    text = prot.describe()
    for layer in ("network namespace", "limits", "no_new_privs", "audit hook"):
        assert layer in text or layer in " ".join(prot.missing), text


def test_landlock_confines_reads_on_a_cpu_run(tmp_path):
    import torch
    if sandbox.landlock_abi() < 1:
        pytest.skip("no Landlock on this kernel")
    secret = tmp_path / ".netrc"
    secret.write_text("password sk-canary")
    os.chmod(tmp_path, 0o755)
    os.chmod(secret, 0o644)
    result, _ = _in_sandbox(f"""
        try:
            result["secret"] = open({str(secret)!r}).read()
        except OSError as e:
            result["secret"] = type(e).__name__
        # the interpreter's libraries and the package stay readable
        result["torch"] = open({torch.__file__!r}).read(10)
        result["package"] = open(sandbox.__file__).read(10)
    """, tmp_path)
    assert result["secret"] == "PermissionError" and result["torch"] and result["package"]
