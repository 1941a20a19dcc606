"""The seed streams (sanitizer/checks.py: SeedStream): every check draws its inputs from a named stream, no two
streams of one generator share seeds beyond the known pairs, each holds as many draws as today's ops take, and
the bases stay the numbers the suites were judged on."""

import ast
from itertools import combinations
from pathlib import Path

from kernel_agent.ops import NAMES, get_op
from kernel_agent.sanitizer import gpu
from kernel_agent.sanitizer.checks import FULL, KNOWN_OVERLAPS, QUICK, SeedStream
from kernel_agent.sanitizer.compared import MAX_COMPARED, MAX_SCALES

SANITIZER = Path(__file__).resolve().parents[1] / "sanitizer"

# The bases of the faulty and correct suites' verdicts (seed base 0): moving one changes its check's inputs,
# and with them which check first rejects a faulty candidate. Change one only with the suites judged again.
BASES = {
    "RUNS": 5,
    "ORDER_PERMUTATION": 7,
    "HOST_CODE": 21,
    "BOUNDS": 31,
    "COVERAGE": 41,
    "INPUTS_UNCHANGED": 51,
    "NO_STATE": 61,
    "ORDER": 71,
    "SENSITIVITY": 81,
    "DIFFERENTIAL_PROPERTY": 91,
    "DIFFERENTIAL": 95,
    "NEAR_SERVING": 111,
    "FPSAN": 121,
    "EXTENDED": 131,
    "DOMAIN": 141,
    "HOST_BRANCHES": 151,
    "COMPARED_VALUES": 161,
    "ERROR_BUDGET": 1001,
    "GPU_DIFFERENTIAL": 200,
    "GPU_DETERMINISM": 300,
    "GPU_PROBES": 400,
    "GPU_DOMAIN": 500,
}


def overlapping_pairs():
    """The pairs of streams of one generator whose ranges [base, base + count) meet."""
    return {
        frozenset({a, b})
        for a, b in combinations(SeedStream, 2)
        if a.generator == b.generator and set(a.seeds()) & set(b.seeds())
    }


def test_the_bases_are_the_judged_ones():
    assert {s.name: s.base for s in SeedStream} == BASES


def test_no_streams_overlap_but_the_known_pairs():
    found = overlapping_pairs()
    new = sorted(sorted(s.name for s in p) for p in found - KNOWN_OVERLAPS)
    gone = sorted(sorted(s.name for s in p) for p in KNOWN_OVERLAPS - found)
    assert not new, f"streams that share seeds: {new}"
    assert not gone, f"KNOWN_OVERLAPS lists pairs that no longer meet: {gone}"


def test_the_error_budget_no_longer_shares_the_differential_s_seeds():
    assert not set(SeedStream.ERROR_BUDGET.seeds()) & set(SeedStream.DIFFERENTIAL.seeds())
    assert all(SeedStream.ERROR_BUDGET not in p for p in KNOWN_OVERLAPS)


def test_every_stream_holds_the_draws_of_every_op():
    for mode in (QUICK, FULL):
        assert mode.budget_cases <= SeedStream.ERROR_BUDGET.count
        assert mode.fpsan_cases <= SeedStream.FPSAN.count
    # compared_values draws each compared size in every dimension that admits it, then the sm_scales either side
    # of each compared threshold (two factors, four sides), each list from draw 0
    assert 2 * 4 * MAX_SCALES <= SeedStream.COMPARED_VALUES.count
    for name in NAMES:
        op = get_op(name)
        tiny = len(op.shapes("tiny"))
        domain = op.domain()
        need = {
            SeedStream.HOST_CODE: min(2, tiny),
            SeedStream.BOUNDS: tiny,
            SeedStream.COVERAGE: tiny,
            SeedStream.INPUTS_UNCHANGED: min(2, tiny),
            SeedStream.ORDER: tiny,
            SeedStream.DIFFERENTIAL: 3 * len(op.distributions),
            SeedStream.NEAR_SERVING: len(op.shapes("near_serving")),
            SeedStream.DOMAIN: len(domain.on("cpu")),
            SeedStream.HOST_BRANCHES: len(op.branch_pool()),
            SeedStream.COMPARED_VALUES: MAX_COMPARED * len(op.value_dims),
            SeedStream.GPU_DIFFERENTIAL: len(gpu._gpu_cases(op)),
            SeedStream.GPU_PROBES: tiny,
            SeedStream.GPU_DOMAIN: len(domain.on("gpu")) + MAX_COMPARED * len(op.value_dims),
        }
        over = {s.name: (n, s.count) for s, n in need.items() if n > s.count}
        assert not over, f"{name}: streams too short for the op's draws (draws, count): {over}"


def _annotated_streams(fn: ast.AST) -> set:
    """The parameters of a function annotated SeedStream."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return {a.arg for a in args if isinstance(a.annotation, ast.Name) and a.annotation.id == "SeedStream"}


def unnamed_seed_calls(source: str, filename: str):
    """Each `<x>.seed(...)` call (hypothesis's decorator aside) whose first argument is not a SeedStream member,
    nor a parameter annotated SeedStream, of the enclosing function: 'file:line: text'."""
    tree = ast.parse(source)
    out = []

    def visit(node: ast.AST, streams: set) -> None:
        streams = streams | _annotated_streams(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "seed":
            receiver = node.func.value
            if not (isinstance(receiver, ast.Name) and receiver.id == "hypothesis"):
                first = node.args[0] if node.args else None
                named = (
                    isinstance(first, ast.Attribute)
                    and isinstance(first.value, ast.Name)
                    and first.value.id == "SeedStream"
                ) or (isinstance(first, ast.Name) and first.id in streams)
                if not named:
                    out.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, streams)

    visit(tree, set())
    return out


def test_every_seed_call_names_its_stream():
    bad = []
    seen = 0
    for path in sorted(SANITIZER.glob("*.py")):
        text = path.read_text()
        seen += text.count("subject.seed(")
        bad += unnamed_seed_calls(text, path.name)
    assert seen > 20  # the scan sees the checks' draws
    assert not bad, "seeds drawn outside a named stream (sanitizer/checks.py: SeedStream):\n" + "\n".join(bad)


def test_a_hand_numbered_seed_is_found():
    source = (
        "def f(subject, stream: SeedStream, other):\n"
        "    subject.seed(SeedStream.RUNS)\n"
        "    subject.seed(stream, 2)\n"
        "    subject.seed(95 + 3)\n"
        "    subject.seed(other)\n"
        "@hypothesis.seed(7)\n"
        "def g(): pass\n"
    )
    assert unnamed_seed_calls(source, "x.py") == ["x.py:4: subject.seed(95 + 3)", "x.py:5: subject.seed(other)"]
