"""The serving kernel set: manifest, install/remove, and the dispatching import API.

Kernels run on the CPU through Triton's interpreter, so TRITON_INTERPRET must be set
before triton is imported anywhere in this process.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import socket  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from kernel_agent.harness.serving import serving, serving_install  # noqa: E402
from kernel_agent.ops import get_op  # noqa: E402
from kernel_agent.sanitizer.canonical import as_written, judge_text  # noqa: E402

OP = "quantize_kv"
GPU = "NVIDIA H200"
# the baseline computes 127/amax on masked-out rows too (then discards it); numpy says so
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
BASELINE_SRC = (Path(serving.__file__).resolve().parents[2] / "kernels" / "baseline" / "quantize_kv.py").read_text()
# A distinguishable but equivalent kernel: the baseline with another rows-per-program choice.
VARIANT_SRC = BASELINE_SRC.replace(
    "return max(1, min(64, 4096 // block_d)), 4", "return 2, 4  # serving variant: two rows per program"
)
assert VARIANT_SRC != BASELINE_SRC


@pytest.fixture
def sdir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "serving"
    monkeypatch.setenv(serving.ENV_DIR, str(d))
    return d


def _case(shape="4,2,16", dtype=torch.float32, seed=0):
    op = get_op(OP)
    return op.make_case(op.parse_shape(shape), dtype, seed=seed)


def _install(bucket="tsmall-d16", dtype="float32", gpu=GPU, source=VARIANT_SRC, **kw):
    return serving_install.install(
        OP,
        bucket,
        dtype,
        gpu,
        judge_text(source) if isinstance(source, str) else source,
        candidate_id=kw.pop("candidate_id", 7),
        gain=0.12,
        reason="12.0% faster than the incumbent",
        versions={"torch": "2.13", "triton": "3.9"},
        **kw,
    )


def test_serving_dir_default_and_override(sdir, monkeypatch):
    assert serving.serving_dir() == sdir
    monkeypatch.delenv(serving.ENV_DIR)
    import kernel_agent.kernels

    assert serving.serving_dir() == Path(kernel_agent.kernels.__file__).resolve().parent / "serving"


def test_manifest_round_trip(sdir):
    assert serving.load_manifest() == serving.Manifest(2, ())  # missing file: empty set
    entry = _install(shapes=["T=4,H=2,D=16"])
    assert entry.file == "quantize_kv__tsmall-d16__float32__nvidia-h200.py"
    assert (sdir / entry.file).read_text() == judge_text(VARIANT_SRC).text  # the text that runs, as judged
    manifest = serving.load_manifest()
    assert manifest.version == 2 and manifest.entries == (entry,)
    assert json.loads((sdir / "manifest.json").read_text()) == manifest.to_json()
    assert set(entry.to_json()) == {
        "op",
        "bucket",
        "dtype",
        "gpu",
        "impl",
        "file",
        "source_hash",
        "candidate_id",
        "promoted_at",
        "gain",
        "reason",
        "versions",
        "shapes",
    }
    assert entry.shapes == ("T=4,H=2,D=16",)  # what it was judged on, for review and the GPU check
    assert entry.source_hash == judge_text(VARIANT_SRC).hash and entry.candidate_id == 7
    assert serving.lookup(OP, "tsmall-d16", "float32", "nvidia-h200") == entry  # GPU names compare by slug
    # replacing the same key keeps one entry; another key adds one
    again = _install(candidate_id=8)
    other = _install(dtype="float16")
    entries = serving.load_manifest(sdir).entries
    assert [(e.dtype, e.candidate_id) for e in entries] == [("float16", 7), ("float32", 8)]
    assert again in entries and other in entries
    assert not [p for p in sdir.iterdir() if p.name.endswith(".tmp")]  # no temp files left


def test_install_validates(sdir):
    with pytest.raises(ValueError, match="unknown op"):
        serving_install.install("conv9d", "b", "float32", GPU, judge_text("def conv9d(x): pass\n"), 1, 0.1, "", {})
    with pytest.raises(ValueError, match="unknown dtype"):
        _install(dtype="int4")
    with pytest.raises(serving.ServingError, match="no top-level function"):
        _install(source="def something_else(x):\n    return x\n")
    assert serving.load_manifest().entries == ()


def test_install_refuses_a_record_whose_canonical_text_is_not_the_judged_text(sdir):
    """`install` takes the record of the text the sanitizer and the benchmark judged, and stores its canonical
    text: a record whose canonical text is another text (one kept as written, its comment hashed with it) is
    refused in one line and nothing is written; the judged text goes in under its hash."""

    with pytest.raises(serving.ServingError) as e:
        _install(source=as_written(VARIANT_SRC + "\n# a comment that the canonical text drops\n"))
    assert "is not the judged text" in str(e.value) and "\n" not in str(e.value)
    assert serving.load_manifest().entries == () and not list(sdir.glob("*.py"))
    judged = judge_text(VARIANT_SRC)
    assert _install(source=judged).source_hash == judged.hash


def test_bad_manifest_is_an_error(sdir):
    sdir.mkdir()
    (sdir / "manifest.json").write_text("{not json")
    with pytest.raises(serving.ServingError, match="not valid JSON"):
        serving.load_manifest()
    (sdir / "manifest.json").write_text('{"version": 4, "entries": []}')
    with pytest.raises(serving.ServingError, match="version 4"):
        serving.load_manifest()


def test_gpu_slug():
    assert serving.gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert serving.gpu_slug("NVIDIA GeForce RTX 4090 (24GB)") == "nvidia-geforce-rtx-4090-24gb"
    assert serving.gpu_slug("cpu") == "cpu"


def test_get_dispatches_by_bucket_dtype_and_gpu(sdir):
    entry = _install()
    fn = serving.get(OP, gpu=GPU)
    assert fn.__name__ == OP
    case = _case()  # T=4, H=2, D=16: bucket tsmall-d16
    x = case.args["x"]
    assert str(fn.resolve(x)) == entry.file
    assert str(fn.resolve(x=x)) == entry.file
    assert str(fn.resolve(_case("4,2,32").args["x"])) == "baseline"  # another bucket
    assert str(fn.resolve(_case(dtype=torch.float16).args["x"])) == "baseline"  # another dtype
    assert str(serving.get(OP, gpu="NVIDIA A100").resolve(x)) == "baseline"  # another GPU
    assert str(serving.get(OP, gpu="nvidia-h200").resolve(x)) == entry.file
    if not torch.cuda.is_available():
        assert str(serving.get(OP).resolve(x)) == "baseline"  # default GPU name here is 'cpu'

    out = fn(x)
    ref = serving.baseline(OP)(x)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    assert get_op(OP).compare(out, case.args).ok
    # the installed kernel really is the variant, and it is loaded once
    assert fn.kernel_for(x) is fn.kernel_for(x)
    assert fn.kernel_for(x) is not serving.baseline(OP)
    assert fn.kernel_for(x).__module__.startswith("kernel_agent_serving_")


def test_dispatch_falls_back_to_baseline_and_matches(sdir):
    fn = serving.get(OP, gpu=GPU)
    case = _case(seed=3)
    assert str(fn.resolve(**case.args)) == "baseline"
    assert fn.kernel_for(**case.args) is serving.baseline(OP)
    out = case.call(fn)  # a serving-style call by keyword
    assert get_op(OP).compare(out, case.args).ok


def test_remove_falls_back(sdir):
    entry = _install()
    _install(dtype="float16")
    fn = serving.get(OP, gpu=GPU)
    x = _case().args["x"]
    assert str(fn.resolve(x)) == entry.file
    fn(x)  # loaded and cached
    assert serving.remove(OP, "tsmall-d16", "float32", GPU) is True
    assert serving.remove(OP, "tsmall-d16", "float32", GPU) is False
    assert not (sdir / entry.file).exists()
    assert [e.dtype for e in serving.load_manifest().entries] == ["float16"]
    # the same dispatcher sees the manifest change
    assert str(fn.resolve(x)) == "baseline"
    assert get_op(OP).compare(fn(x), {"x": x}).ok


def test_dispatcher_checks_arguments(sdir):
    fn = serving.get(OP, gpu=GPU)
    x = _case().args["x"]
    with pytest.raises(TypeError, match="missing required"):
        fn()
    with pytest.raises(TypeError, match="unexpected keyword"):
        fn(x, scale=2)
    with pytest.raises(TypeError, match="at most 1"):
        fn(x, x)
    with pytest.raises(TypeError, match="multiple values"):
        fn(x, x=x)


def test_unknown_op_is_a_value_error():
    with pytest.raises(ValueError, match="unknown op 'conv9d'") as info:
        serving.get("conv9d")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError):
        serving.baseline("conv9d")


def test_load_kernel_file_errors(tmp_path):
    with pytest.raises(serving.ServingError, match="does not exist"):
        serving.load_kernel_file(tmp_path / "missing.py", OP)
    f = tmp_path / "k.py"
    f.write_text("def other(x):\n    return x\n")
    with pytest.raises(serving.ServingError, match="refused by the static gate.*no module-level function named"):
        serving.load_kernel_file(f, OP)
    # a promoted file edited into something outside the candidate language is never imported
    f.write_text("import os\n" + VARIANT_SRC)
    with pytest.raises(serving.ServingError, match="refused by the static gate.*import"):
        serving.load_kernel_file(f, OP)
    f.write_text(VARIANT_SRC + "\n_BOOM = 1 // 0\n")
    with pytest.raises(serving.ServingError, match="failed to import: ZeroDivisionError"):
        serving.load_kernel_file(f, OP)
    f.write_text(VARIANT_SRC)
    a, b = serving.load_kernel_file(f, OP), serving.load_kernel_file(f, OP)
    assert a is not b and a.__module__ != b.__module__  # unique module per load


def test_tampered_kernel_file_is_refused(sdir):
    entry = _install()
    (sdir / entry.file).write_text(VARIANT_SRC + "\nEVIL = 1\n")
    fn = serving.get(OP, gpu=GPU)
    x = _case().args["x"]
    with pytest.raises(serving.ServingError, match="does not match its manifest hash"):
        fn(x)


# -- a promoted file is loaded as its canonical text, re-gated, never as its bytes -------------------

HOSTILE = Path(__file__).resolve().parent / "candidates" / "hostile"
# the tricks on the text a trusted process imports: coding cookies, kernel bodies hidden in strings for the
# interpreter or the GPU compiler, Python called while Triton compiles a kernel (tests/candidates/hostile/)
TRICKS = sorted(
    p for family in ("text_mismatch", "trusted_import", "host_arithmetic") for p in (HOSTILE / family).glob("*.py")
)
BOM_TRICK = Path("byte_order_mark")


class _Canary:
    """What a trick would leave: a file in a watched folder, a variable in os.environ, a connection."""

    def __init__(self, tmp_path: Path, monkeypatch):
        self.watch = tmp_path / "watch"
        self.watch.mkdir()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.listener.setblocking(False)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-canary-serving")
        monkeypatch.delenv("KA_HOSTILE_CANARY", raising=False)

    def text(self, path: Path) -> bytes:
        if path == BOM_TRICK:
            return b"\xef\xbb\xbf" + VARIANT_SRC.encode()
        text = path.read_text()
        for ph, value in (
            ("{{WATCH_DIR}}", str(self.watch)),
            ("{{MARKER}}", "kcanary"),
            ("{{PORT}}", str(self.listener.getsockname()[1])),
            ("{{REPO}}", str(self.watch)),
        ):
            text = text.replace(ph, value)
        return text.encode()

    def untouched(self) -> list:
        left = [f"a file in the watched folder: {p.name}" for p in self.watch.iterdir()]
        if os.environ.get("KA_HOSTILE_CANARY"):
            left.append("KA_HOSTILE_CANARY was set")
        try:
            conn, _ = self.listener.accept()
            conn.close()
            left.append("a connection to the listener")
        except BlockingIOError:
            pass
        self.listener.close()
        return left


@pytest.mark.parametrize(
    "trick", TRICKS + [BOM_TRICK], ids=lambda p: p.name if p == BOM_TRICK else f"{p.parent.name}/{p.name}"
)
def test_a_promoted_file_with_a_trick_is_refused_at_load_and_never_runs(trick, sdir, tmp_path, monkeypatch):
    """A file planted in the serving set with a matching manifest hash (what the sanitizer would have had
    to miss) is refused by the dispatcher and by load_kernel_file in one line, and nothing of it ran: the
    bytes are read once, and only their canonical text, re-gated, could be imported."""
    canary = _Canary(tmp_path, monkeypatch)
    raw = canary.text(trick)
    entry = _install()  # a real promotion, then its file swapped for the trick with the hash to match
    (sdir / entry.file).write_bytes(raw)
    doc = json.loads((sdir / "manifest.json").read_text())
    doc["entries"][0]["source_hash"] = as_written(raw.decode("utf-8")).hash
    (sdir / "manifest.json").write_text(json.dumps(doc))
    x = _case().args["x"]
    for load in (lambda: serving.get(OP, gpu=GPU)(x), lambda: serving.load_kernel_file(sdir / entry.file, OP)):
        with pytest.raises(serving.ServingError, match="refused by the static gate") as e:
            load()
        assert "\n" not in str(e.value)
    assert canary.untouched() == []


@pytest.mark.parametrize("trick", TRICKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_search_reads_a_configuration_without_running_the_text(trick, tmp_path, monkeypatch):
    """The search's `source_config` runs in the loop's own process (which holds the model's key): it reads an
    incumbent's `_config` from the syntax tree, so a trick in its text is refused or never reached, and
    nothing of it runs."""
    from kernel_agent.agent.search import baseline_config, source_config
    from kernel_agent.sanitizer.config_reader import ConfigUnreadable

    canary = _Canary(tmp_path, monkeypatch)
    shape = get_op(OP).parse_shape("4,2,16")
    try:
        cfg = source_config(OP, canary.text(trick).decode("utf-8"), shape)
    except ConfigUnreadable as e:
        assert "\n" not in str(e)
        cfg = None
    assert cfg in (None, baseline_config(OP, shape))  # the tricks leave `_config` as the baseline's
    assert canary.untouched() == []


def test_other_ops_bind_keyword_arguments(sdir):
    """attention's optional causal flag takes part in its bucket (shape_of reads it)."""
    fn = serving.get("attention", gpu=GPU)
    op = get_op("attention")
    case = op.make_case(op.parse_shape("1,2,2,8,16,causal"), torch.float32)
    q, k, v = case.args["q"], case.args["k"], case.args["v"]
    bucket_causal = op.bucket(op.shape_of({"q": q, "k": k, "causal": True}))
    bucket_full = op.bucket(op.shape_of({"q": q, "k": k}))
    assert bucket_causal != bucket_full
    src = (Path(serving.__file__).resolve().parents[2] / "kernels" / "baseline" / "attention.py").read_text()
    entry = serving_install.install("attention", bucket_causal, "float32", GPU, judge_text(src), 1, 0.1, "test", {})
    assert str(fn.resolve(q, k, v, True)) == entry.file
    assert str(fn.resolve(q, k, v, causal=True)) == entry.file
    assert str(fn.resolve(q, k, v)) == "baseline"
    assert str(fn.resolve(q=q, k=k, v=v, causal=False, sm_scale=0.5)) == "baseline"


def test_dispatch_finds_a_promoted_decode_kernel_from_the_block_table_capacity(tmp_path, monkeypatch):
    """The block table has spare capacity beyond the bucket's context length: dispatch must still match.
    (Found on the H200: the promoted int8 decode kernels were not dispatched to at the serving shape.)"""
    monkeypatch.setenv("KERNEL_AGENT_SERVING_DIR", str(tmp_path))
    op = get_op("decode_attention_int8")
    shape = op.parse_shape("B=1,Hq=2,Hkv=1,D=16,block_size=16,ctx=8192")
    case = op.make_case(shape, torch.float32, seed=0)
    assert case.args["block_table"].shape[1] * 16 > 8192  # the spare column
    import kernel_agent.kernels.baseline as kb

    with open(os.path.join(os.path.dirname(kb.__file__), "decode_attention_int8.py")) as f:
        src = f.read()
    serving_install.install(
        "decode_attention_int8", op.bucket(shape), "float32", "cpu", judge_text(src), 1, 0.1, "test", {}
    )
    fn = serving.get("decode_attention_int8", gpu="cpu")
    assert str(fn.resolve(**case.args)) != "baseline"
