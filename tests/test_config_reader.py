"""The search's configuration reader (sanitizer/config_reader.py) runs in the loop's process, which holds the model's
key: a hostile `_config` is refused (ConfigUnreadable) before it makes that process build anything large or spend
long, and every committed kernel's `_config` stays readable, with the values Python gives it."""

import importlib.util
import inspect
import resource
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from kernel_agent.ops import OPS, get_op
from kernel_agent.sanitizer.config_reader import ConfigUnreadable, read_config

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
ARGS = (64, 64, 64, CPU)  # matmul's convention: _config(M, N, K, device), as Op.config_args passes it


def _source(body: str, head: str = "") -> str:
    """A kernel file whose `_config(M, N, K, device)` has `body`, after module-level `head`."""
    return f"import math\n\nimport triton\n{head}\n\ndef _config(M, N, K, device):\n{body}\n"


def _refused_cheaply(source: str, match: str) -> None:
    """read_config refuses the source in one line, within 2 s, the process's peak RSS growing by less than 200 MB.
    Python's own allocations are traced as well: a peak of RSS reached earlier in the session would hide one."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(ConfigUnreadable, match=match) as e:
            read_config(source, ARGS)
    finally:
        took = time.monotonic() - start
        traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
    assert "\n" not in str(e.value)
    assert grew < 200 * 1024, f"peak RSS grew by {grew} KiB"
    assert traced < 200 << 20, f"{traced} bytes allocated at the peak"
    assert took < 2.0, f"took {took:.2f} s"


# The red team's bombs (8.29 GiB and 66 s in the loop's process before): a list literal was read as a tuple, so
# `[M] == (M,)` held and shifted 1 by 33; then `math.prod` repeated a string, or bytes escaped the size checks.
def test_the_red_team_prod_over_a_string_is_refused():
    _refused_cheaply(_source('    return (64, 64, 32, 4, math.prod((1 << 33*([M]==(M,)), "x")))'), "not a number")


def test_the_red_team_bytes_repetition_is_refused():
    _refused_cheaply(_source(r'    pad = b"\x00" * (1 << 33*([M]==(M,)))' + "\n    return (64, 64, 32, 4)"), "bytes")


def test_the_red_team_prod_over_a_tuple_is_refused():
    _refused_cheaply(_source("    return (64, math.prod(((0,)*4096, 4096, 4096)))"), "grows too large")
    _refused_cheaply(_source("    return (64, math.prod(((0,)*512, 4096, 4096)))"), "not a number")


_CHAIN = "\n".join(f"_C{i} = _C{i + 1} + 1" for i in range(50)) + "\n_C50 = _C0"

ATTACKS = {
    # values past the bounds, whichever way they are built: each is measured before it is built
    "pow": ("    return (64, (M << 58) ** 64)", "grows too large"),
    "pow-exponent": ("    return (64, M ** (1 << 40))", "exponent"),
    "pow-complex": ("    return (64, (-M) ** 0.5)", "type complex"),
    "shifts": ("    return (64, ((M << 64) << 64) << 64)", "grows too large"),
    "int-literal": ("    return (64, " + "9" * 400 + ")", "grows too large"),
    "int-of-str": ('    return (64, int("9" * 1000))', "not a number"),
    "int-of-long-str": ('    return (64, int("9" * 5000))', "grows too large"),
    "int-of-float": ("    return (64, int(1e308))", "grows too large"),
    "float-of-str": ('    return (64, float("1e308"))', "not a number"),
    "str-literal": ('    return (64, len("' + "x" * 5000 + '"))', "grows too large"),
    "str-concatenation": ('    s = "x" * 1000\n    s = s + s + s\n    return (64, 4)', "grows too large"),
    "str-repetition": ('    s = "x" * (M << 30)\n    return (64, 4)', "grows too large"),
    "list-repetition": ("    s = [M] * (M << 30)\n    return (64, 4)", "grows too large"),
    "str-len": ('    return (64, len("x"))', "not a tuple or a list"),
    "substring": ('    return (64, ("a" * 1000) in ("a" * 999 + "b"))', "`in` over a str"),
    "ellipsis": ("    return (64, ...)", "type ellipsis"),
    "nested-tuple": ("    t = (M,) * 1000\n    u = (t,) * 1000\n    return (64, u == u)", "grows too large"),
    "spread": ("    t = (M,) * 1000\n    return (64, " + "*t, " * 2000 + ")", "grows too large"),
    "spread-into-call": ("    t = (M,) * 1000\n    return (64, max(" + "*t, " * 2000 + "))", "grows too large"),
    "spread-a-str": ('    return (64, max(*"123"))', "spreads a str"),
    "nested-min": ("    return (64, min(((M,), (N,))))", "not a number"),
    "prod-of-big-ints": ("    return (64, math.prod(((1 << 64) - 1,) * 1000))", "grows too large"),
    "lcm-of-big-ints": ("    return (64, math.lcm((1 << 64) - 59, (1 << 64) - 95, (1 << 63) - 25))", "grows too large"),
    "exp-overflow": ("    return (64, math.exp(M * 1000))", "OverflowError"),
    # a value doubled at each level of host calls: its cells are counted in full, shared or not
    "nest-by-recursion": (
        "    return (64, _nest((M,), 15) == _nest((N,), 15))",
        "grows too large",
        "def _nest(t, n):\n    return t if n == 0 else _nest((t, t), n - 1)",
    ),
    # recursion through host functions: bounded in depth, and in steps however wide it branches
    "recursion": ("    return (64, _f(M))", "nest too deeply", "def _f(n):\n    return _f(n) + 1"),
    "mutual-recursion": (
        "    return (64, _f(M))",
        "nest too deeply",
        "def _f(n):\n    return _g(n)\n\ndef _g(n):\n    return _f(n)",
    ),
    "branching-recursion": (
        "    return (64, _f(12))",
        "steps",
        "def _f(n):\n    return 0 if n == 0 else _f(n - 1) + _f(n - 1)",
    ),
    "comparisons-until-the-steps-run-out": (
        "    return (64, _f([M] * 1000, 12))",
        "steps",
        "def _f(t, n):\n    return 0 if n == 0 else (t == t[:]) + _f(t, n - 1) + _f(t, n - 1)",
    ),
    # defaults are evaluated per call: their cost counts, and a default that calls its own function nests
    "reading-until-the-steps-run-out": (
        "    return (64, _f((M,) * 1000, 12))",
        "steps",
        "def _f(t, n):\n    return 0 if n == 0 else len(t * 0) + min(t) + max(t) + _f(t, n - 1) + _f(t, n - 1)",
    ),
    "default-per-call": (
        "    return (64, _f(12))",
        "steps",
        "def _f(n, pad=(0,) * 1000):\n    return 0 if n == 0 else _f(n - 1) + _f(n - 1)",
    ),
    "default-recursion": ("    return (64, _f())", "nest too deeply", "def _f(x=_f()):\n    return x"),
    # module constants that refer to each other, directly or through a host function
    "constant-cycle": ("    return (64, _A)", "refers to itself", "_A = _B + 1\n_B = _A + 1"),
    "constant-cycle-long": ("    return (64, _C0)", "refers to itself|RecursionError", _CHAIN),
    "constant-cycle-through-call": ("    return (64, _A)", "refers to itself", "_A = _f()\n\ndef _f():\n    return _A"),
}


@pytest.mark.parametrize("name", ATTACKS)
def test_an_attack_on_the_reader_is_refused_cheaply(name):
    body, match, *head = ATTACKS[name]
    _refused_cheaply(_source(body, "\n" + head[0] if head else ""), match)


def test_lists_are_read_as_python_reads_them():
    """List literals are lists (`[M] == (M,)` is False, as in Python), and subscripts, unpacking, `len`, `tuple`,
    `min`/`max` and `math.prod` take them as they take tuples; a `_config` that returns a list is read as a tuple."""
    body = (
        "    sizes = [M, N]\n"
        "    bm, bn = sizes\n"
        "    bk = 64 if [K] == (K,) else 32\n"
        "    assert [M] != (M,)\n"
        "    return [bm, sizes[1], bk, len(sizes), max(sizes), min([K, 16]), tuple(sizes)[0], *sizes[:1],\n"
        "            math.prod(sizes), math.lcm(*sizes), K in [1, 64], [M] + [N] == [M, N]]"
    )
    source = _source(body)
    namespace: dict = {}
    exec(source, namespace)  # the test's own text: Python's answer to compare with
    assert read_config(source, ARGS) == tuple(namespace["_config"](*ARGS)) == (
        64, 64, 32, 2, 64, 16, 64, 64, 4096, 64, True, True
    )  # fmt: skip


def _committed_kernels():
    """Every committed kernel file with a `_config`: baselines, the serving set, the good candidates."""
    paths = sorted(ROOT.glob("kernels/baseline/*.py")) + sorted(ROOT.glob("kernels/serving/*.py"))
    paths += sorted(ROOT.glob("tests/candidates/good/*/*.py"))
    return [p for p in paths if "\ndef _config(" in p.read_text()]


def _op_of(path: Path) -> str:
    if path.parent.name == "serving":
        return path.name.split("__")[0]  # <op>__<bucket>__<dtype>__<gpu>.py
    return path.stem if path.parent.name == "baseline" else path.parent.name


@pytest.mark.parametrize("path", _committed_kernels(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_kernel_config_is_readable(path):
    """read_config reads each committed kernel's `_config` at every shape of its op's suites, as the kernel's own
    `_config` computes it (imported here: the test's process holds no key)."""
    op_name = _op_of(path)
    assert op_name in OPS, path
    spec = importlib.util.spec_from_file_location(f"_config_reader_probe_{path.stem.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    op, source = get_op(op_name), path.read_text()
    # some good candidates predate an argument the op passes now (decode_attention's head dim, last): they are
    # read with the arguments their `_config` takes, as the kernel's wrapper passes them
    params = inspect.signature(module._config).parameters.values()
    taken = None if any(p.kind is p.VAR_POSITIONAL for p in params) else len(params)  # a variant's `_config(*args)`
    for shape in op.shapes("serving") + op.shapes("tiny"):
        args = tuple(op.config_args(shape, CPU))[:taken]
        assert read_config(source, args) == tuple(module._config(*args)), (path.name, shape)
