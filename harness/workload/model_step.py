"""One decode step of a transformer model, for torch, the baselines and the serving set (`bench --model`).

What a step is. One new token per sequence through one layer, in bf16, with random weights (seeded,
nothing downloaded), every sequence at the same context:

    h   = rmsnorm(x) ; qkv = h @ W_qkv                        matmul [B, hidden] x [hidden, (Hq + 2 Hkv) D]
    write the new token's K and V into the paged cache         bf16, or int8 codes + scales from quantize_kv
    a   = attention(q, cache)                                  decode_attention / decode_attention_int8
    x   = x + a @ W_o                                          matmul
    g,u = rmsnorm(x) @ W_gate_up ; x = x + (silu(g) * u) @ W_down

The whole model's step is that layer's time times `layers` (the layers differ only in their weights).
Left out, the same in every stack: RoPE (a few elementwise ops on q and k), biases (Qwen2's QKV bias),
the embedding, the final norm, the LM head and sampling. The sequence length after the write is the
context: the new token is the context-th token of its sequence.

Stacks (what computes each op; norms, SiLU and residuals are the same torch ops everywhere):
    torch     cuBLAS (torch.matmul) and SDPA over a contiguous [B, Hkv, L, D] cache (enable_gqa). It is
              the reference: in the int8 mode it stays bf16.
    baseline  the project's baseline kernels (kernel_agent.kernels.baseline.<op>.<op>) for every op.
    serving   harness.serving.serving.get(op) for every op: whatever the serving set dispatches each call to (a
              promoted kernel, the baseline or torch); `DecodeStep.served` says which.
    hybrid    cuBLAS matmuls with the baseline paged attention (and quantize_kv).
    flashinfer  cuBLAS matmuls with FlashInfer's paged decode over the same paged bf16 cache (the optional
              `flashinfer` extra; ops/flashinfer_paged.py): what a serving engine runs. FlashInfer has no
              int8 cache, so, like torch, it stays bf16 in the int8 mode. Without the extra the stack is left
              out with one line.

KV budget (`kv_budget_points`). At a fixed memory budget for the KV cache, a cache of half the bytes per
token holds twice the sequences: for each KV mode the largest batch whose whole-model cache (every layer,
K and V, codes and scales) fits the budget at one context, then tokens/s per stack at that batch.

Tensor parallelism. A config with tp > 1 is timed as one GPU's shard of a layer: heads / tp query heads,
kv_heads / tp KV heads (at least 1: KV heads are replicated when there are fewer than GPUs),
intermediate / tp MLP columns, the full hidden size. The two all-reduces per layer (after O and after
down) are not timed: the figure is per-GPU compute, not the interconnect.

Config files (JSON), a preset name or a path:

    {"name": "my-model", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
     "intermediate": 14336, "tp": 1, "rms_eps": 1e-5, "page_size": 16}

layers, hidden, heads, kv_heads and intermediate are required; head_dim defaults to hidden / heads,
name to the file's stem, tp to 1, rms_eps to 1e-5, page_size (tokens per KV cache block, a power of
two) to 16. Unknown keys are refused (a typo would otherwise be a silent default).

Timing (a CUDA GPU): each stack's layer is captured as one CUDA graph, warmed up, and replayed many
times between two CUDA events; the stacks are interleaved round by round (the order rotating, as
harness.bench.bench does for kernels) so that clock and thermal drift hit all alike; a layer's time is the
position-balanced median of its rounds. Each op call is timed alone the same way (its own graph, with
the arguments it had in the step) and reported as a share of its stack's layer time.

torch is imported inside the functions that need it, so that the command line checks a config and its
flags without paying for that import.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ... import ops  # the package door: its torch-bound names (dtype_from_name) load on first use
from ...ops import get_op
from ..env import gpu_name, versions

if TYPE_CHECKING:
    import torch

    from ...ops.common import Shape


class ModelConfigError(ValueError):
    """A bad model config, point, stack or KV mode (one line; the command line exits 2 on it)."""


# -- the model config --------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only transformer's shape. head_dim may differ from hidden / heads (e.g. Gemma)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tp: int = 1
    rms_eps: float = 1e-5
    page_size: int = 16

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "tp", "page_size"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ModelConfigError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
        if isinstance(self.rms_eps, bool) or not isinstance(self.rms_eps, (int, float)) or not self.rms_eps > 0:
            raise ModelConfigError(f"model {self.name!r}: rms_eps must be a positive number, got {self.rms_eps!r}")
        if self.heads % self.kv_heads:
            raise ModelConfigError(
                f"model {self.name!r}: heads={self.heads} is not divisible by kv_heads={self.kv_heads}"
            )
        if self.heads % self.tp:
            raise ModelConfigError(f"model {self.name!r}: heads={self.heads} is not divisible by tp={self.tp}")
        if self.kv_heads % self.tp and self.tp % self.kv_heads:
            raise ModelConfigError(
                f"model {self.name!r}: kv_heads={self.kv_heads} and tp={self.tp}: one must divide "
                f"the other (KV heads are split, or replicated when fewer than GPUs)"
            )
        if self.intermediate % self.tp:
            raise ModelConfigError(
                f"model {self.name!r}: intermediate={self.intermediate} is not divisible by tp={self.tp}"
            )
        if self.page_size & (self.page_size - 1):
            raise ModelConfigError(f"model {self.name!r}: page_size={self.page_size} is not a power of two")
        if self.head_dim not in (16, 32, 64, 128, 256):
            # the paged decode kernels' contract range; the timing would fail deep inside a kernel otherwise
            raise ModelConfigError(f"model {self.name!r}: head_dim={self.head_dim} must be one of 16, 32, 64, 128, 256")

    # one GPU's shard of a layer (the whole layer when tp == 1)
    @property
    def shard_heads(self) -> int:
        return self.heads // self.tp

    @property
    def shard_kv_heads(self) -> int:
        return max(1, self.kv_heads // self.tp)

    @property
    def shard_intermediate(self) -> int:
        return self.intermediate // self.tp

    @property
    def qkv_width(self) -> int:
        return (self.shard_heads + 2 * self.shard_kv_heads) * self.head_dim

    def to_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_mapping(cls, data: Any, default_name: str = "model") -> "ModelConfig":
        if not isinstance(data, Mapping):
            raise ModelConfigError(f"model config {default_name!r}: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelConfigError(
                f"model config {default_name!r}: unknown key(s) {', '.join(unknown)}; keys are "
                f"{', '.join(f.name for f in dataclasses.fields(cls))}"
            )
        missing = [k for k in ("layers", "hidden", "heads", "kv_heads", "intermediate") if k not in data]
        if missing:
            raise ModelConfigError(f"model config {default_name!r}: missing key(s) {', '.join(missing)}")
        values = dict(data)
        values.setdefault("name", default_name)
        if "head_dim" not in values:
            hidden, heads = values["hidden"], values["heads"]
            if not (isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads == 0):
                raise ModelConfigError(
                    f"model config {default_name!r}: no head_dim, and hidden={hidden!r} is not "
                    f"a multiple of heads={heads!r}; give head_dim"
                )
            values["head_dim"] = hidden // heads
        if not isinstance(values["name"], str) or not values["name"]:
            raise ModelConfigError(f"model config {default_name!r}: name must be a non-empty string")
        return cls(**values)


PRESETS: Dict[str, ModelConfig] = {
    c.name: c
    for c in (
        ModelConfig("llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336),
        ModelConfig(
            "llama-3-70b-tp8", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, tp=8
        ),
        ModelConfig(
            "qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, intermediate=18944, rms_eps=1e-6
        ),
        ModelConfig("mistral-7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336),
    )
}


def load_model_config(spec: str) -> ModelConfig:
    """A preset name (PRESETS) or the path of a JSON config file."""
    if spec in PRESETS:
        return PRESETS[spec]
    if not os.path.isfile(spec):
        raise ModelConfigError(f"unknown model {spec!r}: not a preset ({', '.join(PRESETS)}) and no such file")
    try:
        with open(spec, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"model config {spec}: not valid JSON ({e})") from None
    except OSError as e:
        raise ModelConfigError(f"model config {spec}: {e.strerror or e}") from None
    return ModelConfig.from_mapping(data, os.path.splitext(os.path.basename(spec))[0])


# -- what to time ---------------------------------------------------------------------------------

STACKS = ("torch", "baseline", "serving", "hybrid", "flashinfer", "unguarded")
# the serving dispatcher with its guard on, and the same dispatcher with the guard off: their ratio is the
# guard's steady-state cost (harness/serving/serving_guard.py)
SERVING_STACKS = ("serving", "unguarded")
# stacks that compute attention over a bf16 cache whatever the KV mode (the reference, and FlashInfer)
BF16_ONLY_STACKS = ("torch", "flashinfer")
KV_MODES = ("bf16", "int8")


@dataclass(frozen=True)
class Point:
    """A batch of `batch` sequences, each at `context` tokens (the new one included)."""

    batch: int
    context: int

    def __str__(self) -> str:
        return f"{self.batch}x{self.context}"


def parse_points(text: str) -> List[Point]:
    """'32x8192,8x32768' (batch x context) into points, in order, without repeats."""
    points: List[Point] = []
    for part in (p.strip() for p in (text or "").split(",")):
        m = re.fullmatch(r"(\d+)\s*[xX]\s*(\d+)", part)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise ModelConfigError(f"bad point {part!r} in {text!r}: use BATCHxCONTEXT, e.g. 32x8192,8x32768")
        p = Point(int(m.group(1)), int(m.group(2)))
        if p not in points:
            points.append(p)
    return points


def parse_names(text: str, allowed: Sequence[str], what: str) -> Tuple[str, ...]:
    """A comma list of names from `allowed`, in the order of `allowed`, without repeats."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ModelConfigError(
            f"{what}: {', '.join(map(repr, bad)) or 'none given'}; expected a comma list of {', '.join(allowed)}"
        )
    return tuple(n for n in allowed if n in names)


# -- the step's op calls in the registry's terms (roofline) ----------------------------------------

# Nominal H200 ceilings for the roofline estimate (the spec sheet's HBM rate, dense bf16 tensor cores
# as measured matmuls reach): shares of a step depend on their ratio, not on the exact values.
NOMINAL_TBPS = 4.2
NOMINAL_TFLOPS = 700.0


@dataclass(frozen=True)
class OpCall:
    """One registry op call of a layer's decode step, with its roofline estimate."""

    label: str  # its role in the layer: qkv, quantize_kv, attention, o, gate_up, down
    op: str  # the registry op it is
    shape: "Shape"
    bucket: str
    dtype: str
    calls_per_step: int  # the model's layers: one call per layer
    flops: float  # per call
    bytes: float  # per call: the least the op must move (op.bytes)
    roofline_ms: float  # per call: the larger of flops and bytes over the nominal ceilings
    share: float  # of the step's roofline time over all its op calls (the shares sum to 1)

    def to_json(self) -> Dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["shape"] = self.shape.key()
        return d


def roofline_ms(flops: float, nbytes: float) -> float:
    """The roofline time of a call: the larger of its FLOPs and bytes over the nominal ceilings."""
    return max(flops / (NOMINAL_TFLOPS * 1e9), nbytes / (NOMINAL_TBPS * 1e9))


def paged_blocks(cfg: ModelConfig, context: int) -> int:
    """Block-table columns per sequence: the blocks a context of `context` tokens fills."""
    return -(-context // cfg.page_size)


def step_op_calls(
    cfg: ModelConfig, batch: int, context: int, kv: str = "bf16", dtype: str = "bfloat16"
) -> List[OpCall]:
    """Every registry op call of one decode step, as the serving dispatcher sees it (shape, bucket,
    dtype), with a roofline share of the step (NOMINAL_TBPS, NOMINAL_TFLOPS). Work that is no registry
    op (norms, SiLU, residuals, cache writes) is left out: it is the same in every stack and no kernel of
    this project can make it faster."""
    from ...ops.matmul import MatmulShape  # keeps the CLI's startup light (torch)
    from ...ops.paged import DecodeShape  # keeps the CLI's startup light (torch)
    from ...ops.quantize_kv import QuantizeShape  # keeps the CLI's startup light (torch)

    if kv not in KV_MODES:
        raise ModelConfigError(f"unknown KV mode {kv!r}; expected one of {', '.join(KV_MODES)}")
    if batch < 1 or context < 1:
        raise ModelConfigError(f"batch and context must be at least 1, got {batch} and {context}")
    dt = ops.dtype_from_name(dtype)
    Hq, Hkv, D, I, H = cfg.shard_heads, cfg.shard_kv_heads, cfg.head_dim, cfg.shard_intermediate, cfg.hidden
    # ctx: the block table's capacity, the figure the dispatcher buckets by (PagedDecodeOp.shape_of)
    decode = DecodeShape(batch, Hq, Hkv, D, cfg.page_size, paged_blocks(cfg, context) * cfg.page_size)
    calls: List[Tuple[str, str, Any]] = [("qkv", "matmul", MatmulShape(batch, cfg.qkv_width, H))]
    if kv == "int8":
        calls += [
            ("quantize_kv", "quantize_kv", QuantizeShape(batch, 2 * Hkv, D)),
            ("attention", "decode_attention_int8", decode),
        ]
    else:
        calls.append(("attention", "decode_attention", decode))
    calls += [
        ("o", "matmul", MatmulShape(batch, H, Hq * D)),
        ("gate_up", "matmul", MatmulShape(batch, 2 * I, H)),
        ("down", "matmul", MatmulShape(batch, H, I)),
    ]
    rows = []
    for label, name, shape in calls:
        op = get_op(name)
        flops, nbytes = op.flops(shape), op.bytes(shape, dt)
        ms = roofline_ms(flops, nbytes)
        rows.append((label, name, shape, op.bucket(shape), flops, nbytes, ms))
    total = sum(r[-1] for r in rows)
    return [
        OpCall(label, name, shape, bucket, dtype, cfg.layers, flops, nbytes, ms, ms / total)
        for label, name, shape, bucket, flops, nbytes, ms in rows
    ]


# -- weights, cache and the step ------------------------------------------------------------------


@dataclass
class LayerWeights:
    """One layer's weights, matmul operands stored [K, N] (the matmul contract's b)."""

    attn_norm: "torch.Tensor"  # [hidden]
    w_qkv: "torch.Tensor"  # [hidden, (Hq + 2 Hkv) D]: q heads, then k heads, then v heads
    w_o: "torch.Tensor"  # [Hq D, hidden]
    mlp_norm: "torch.Tensor"  # [hidden]
    w_gate_up: "torch.Tensor"  # [hidden, 2 I]: gate columns, then up columns
    w_down: "torch.Tensor"  # [I, hidden]


def make_weights(cfg: ModelConfig, dtype: "torch.dtype", device, seed: int = 0) -> LayerWeights:
    """Random weights scaled by 1/sqrt(fan-in), so activations stay of order one through the layer."""
    import torch  # keeps the CLI's startup light (torch)

    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def mat(k, n):
        return (torch.randn(k, n, generator=g, device=device) / math.sqrt(k)).to(dtype)

    def norm():
        return (1.0 + 0.1 * torch.randn(cfg.hidden, generator=g, device=device)).to(dtype)

    H, D = cfg.hidden, cfg.head_dim
    return LayerWeights(
        norm(),
        mat(H, cfg.qkv_width),
        mat(cfg.shard_heads * D, H),
        norm(),
        mat(H, 2 * cfg.shard_intermediate),
        mat(cfg.shard_intermediate, H),
    )


@dataclass
class KVState:
    """The KV caches of one point, every sequence at `context` tokens. The paged cache's blocks are handed
    out in a random order (a fragmented cache, as a serving stack's is); `slots` is the flat slot
    (block * page_size + offset) of each sequence's newest token, where the step writes. The contiguous
    cache (torch stack) and the int8 cache hold the same values as the paged bf16 one."""

    context: int
    block_table: "torch.Tensor"  # int32 [B, blocks]
    seq_lens: "torch.Tensor"  # int32 [B], all equal to context
    slots: "torch.Tensor"  # int64 [B]
    k_paged: "torch.Tensor"  # [num_blocks, page, Hkv, D]
    v_paged: "torch.Tensor"
    k_contig: Optional["torch.Tensor"] = None  # [B, Hkv, context, D]
    v_contig: Optional["torch.Tensor"] = None
    k_codes: Optional["torch.Tensor"] = None  # int8 [num_blocks, page, Hkv, D]
    k_scale: Optional["torch.Tensor"] = None  # float32 [num_blocks, page, Hkv]
    v_codes: Optional["torch.Tensor"] = None
    v_scale: Optional["torch.Tensor"] = None


def make_kv_state(
    cfg: ModelConfig,
    batch: int,
    context: int,
    dtype: "torch.dtype",
    device,
    seed: int = 1,
    contiguous: bool = True,
    int8: bool = True,
) -> KVState:
    """Random K and V (standard normal, as the projections produce) for `batch` sequences of `context`
    tokens, in the paged layout, and as asked the contiguous copy and the int8 copy (the quantize_kv rule)."""
    import torch  # keeps the CLI's startup light (torch)

    from ...ops.decode_attention_int8 import quantize_rows  # keeps the CLI's startup light (torch)

    g = torch.Generator(device=device)
    g.manual_seed(seed)
    Hkv, D, page = cfg.shard_kv_heads, cfg.head_dim, cfg.page_size
    blocks = paged_blocks(cfg, context)
    num_blocks = batch * blocks + 1  # one block nobody owns
    perm = torch.randperm(num_blocks, generator=g, device=device)
    block_table = perm[: batch * blocks].view(batch, blocks).to(torch.int32)
    last = context - 1
    slots = block_table[:, last // page].to(torch.int64) * page + last % page
    k = torch.randn(num_blocks, page, Hkv, D, generator=g, device=device).to(dtype)
    v = torch.randn(num_blocks, page, Hkv, D, generator=g, device=device).to(dtype)
    state = KVState(context, block_table, torch.full((batch,), context, dtype=torch.int32, device=device), slots, k, v)
    if contiguous:

        def gather(cache):
            flat = cache[block_table.to(torch.int64)].reshape(batch, blocks * page, Hkv, D)[:, :context]
            return flat.permute(0, 2, 1, 3).contiguous()

        state.k_contig, state.v_contig = gather(k), gather(v)
    if int8:
        state.k_codes, state.k_scale = quantize_rows(k.float())
        state.v_codes, state.v_scale = quantize_rows(v.float())
    return state


def rms_norm(x: "torch.Tensor", weight: "torch.Tensor", eps: float) -> "torch.Tensor":
    """Llama's RMSNorm: normalised in float32, rounded to x's dtype, then scaled."""
    import torch  # keeps the CLI's startup light (torch)

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


@dataclass
class StepOutput:
    attn: "torch.Tensor"  # [B, Hq D]: the attention output, before the O projection
    hidden: "torch.Tensor"  # [B, hidden]: the layer's output


@dataclass
class RecordedCall:
    """An op call of the step as it ran: the function and the very arguments, to time it alone."""

    label: str
    op: str  # the registry op this call implements (the torch stack's SDPA implements decode_attention)
    fn: Callable
    args: Tuple[Any, ...]

    def __call__(self):
        return self.fn(*self.args)


def _baseline_fn(op: str) -> Callable:
    return getattr(importlib.import_module(f"kernel_agent.kernels.baseline.{op}"), op)


def _flashinfer_attention(decoder) -> Callable:
    """The contract's decode_attention signature over a planned FlashInfer decoder (its table is planned)."""

    def flashinfer_decode(q, k_cache, v_cache, block_table, seq_lens):
        return decoder.run(q, k_cache, v_cache)

    return flashinfer_decode


def _sdpa_decode(q, k_contig, v_contig):
    """SDPA of one query per sequence over the contiguous cache: q [B, Hq, D] -> [B, Hq, D]."""
    import torch.nn.functional as F  # keeps the CLI's startup light (torch)

    return F.scaled_dot_product_attention(
        q[:, :, None, :], k_contig, v_contig, enable_gqa=q.shape[1] != k_contig.shape[1]
    )[:, :, 0, :]


class DecodeStep:
    """One layer's decode step for one stack and KV mode, on fixed input and cache tensors (so that it can
    be captured as a CUDA graph). Calling it runs the layer once and returns its StepOutput; the op calls
    of the last call are in `calls`."""

    def __init__(self, cfg: ModelConfig, stack: str, kv: str, weights: LayerWeights, state: KVState, x: "torch.Tensor"):
        import torch  # keeps the CLI's startup light (torch)

        if stack not in STACKS:
            raise ModelConfigError(f"unknown stack {stack!r}; expected one of {', '.join(STACKS)}")
        if kv not in KV_MODES:
            raise ModelConfigError(f"unknown KV mode {kv!r}; expected one of {', '.join(KV_MODES)}")
        self.cfg, self.stack, self.weights, self.state, self.x = cfg, stack, weights, state, x
        # the torch stack is the bf16 reference in both modes; FlashInfer has no int8 cache
        self.kv = "bf16" if stack in BF16_ONLY_STACKS else kv
        if stack == "torch" and state.k_contig is None:
            raise ValueError("the torch stack needs the contiguous cache (make_kv_state(contiguous=True))")
        if self.kv == "int8" and state.k_codes is None:
            raise ValueError("the int8 mode needs the int8 cache (make_kv_state(int8=True))")
        self.calls: List[RecordedCall] = []
        self._decoder = None
        if stack == "flashinfer":
            from ...ops.flashinfer_paged import PagedDecoder  # the optional extra, loaded only for its stack

            self._decoder = PagedDecoder(
                state.block_table,
                state.seq_lens,
                cfg.shard_heads,
                cfg.shard_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                state.k_paged.dtype,
            )
        if stack in SERVING_STACKS:
            from ..serving import serving  # keeps the CLI's startup light (torch)

            # Checks run in the first call of each shape class (which gets the trusted output), so that a
            # promoted kernel's class is verified by the warm-up calls and the CUDA graph captures the kernel,
            # not the trusted implementation an unfinished background check would leave in its place.
            synchronous = serving.GuardConfig(asynchronous=False)
            self._fns: Dict[str, Any] = {
                op: serving.get(op, guard=stack == "serving", guard_config=synchronous)
                for op in ("matmul", "decode_attention", "quantize_kv", "decode_attention_int8")
            }
        else:
            base = stack in ("baseline", "hybrid")
            attention = _baseline_fn("decode_attention") if base else None
            if self._decoder is not None:
                attention = _flashinfer_attention(self._decoder)
            self._fns = {
                "matmul": _baseline_fn("matmul") if stack == "baseline" else torch.matmul,
                "decode_attention": attention,
                "quantize_kv": _baseline_fn("quantize_kv") if base else None,
                "decode_attention_int8": _baseline_fn("decode_attention_int8") if base else None,
            }

    @property
    def name(self) -> str:
        return f"{self.stack}/{self.kv}"

    def _op(self, label: str, op: str, fn: Callable, *args):
        call = RecordedCall(label, op, fn, args)
        self.calls.append(call)
        return call()

    def __call__(self) -> StepOutput:
        import torch.nn.functional as F  # keeps the CLI's startup light (torch)

        cfg, w, st, x = self.cfg, self.weights, self.state, self.x
        B = x.shape[0]
        Hq, Hkv, D, I = cfg.shard_heads, cfg.shard_kv_heads, cfg.head_dim, cfg.shard_intermediate
        mm = self._fns["matmul"]
        self.calls = []
        qkv = self._op("qkv", "matmul", mm, rms_norm(x, w.attn_norm, cfg.rms_eps), w.w_qkv)
        q = qkv[:, : Hq * D].view(B, Hq, D)
        kv_new = qkv[:, Hq * D :].view(B, 2 * Hkv, D)  # the new token's k heads, then its v heads
        if self.stack == "torch":
            assert st.k_contig is not None and st.v_contig is not None  # make_kv_state(contiguous=True) made them
            last = st.context - 1
            st.k_contig[:, :, last].copy_(kv_new[:, :Hkv])
            st.v_contig[:, :, last].copy_(kv_new[:, Hkv:])
            o = self._op("attention", "decode_attention", _sdpa_decode, q, st.k_contig, st.v_contig)
        elif self.kv == "bf16":
            st.k_paged.view(-1, Hkv, D).index_copy_(0, st.slots, kv_new[:, :Hkv])
            st.v_paged.view(-1, Hkv, D).index_copy_(0, st.slots, kv_new[:, Hkv:])
            o = self._op(
                "attention",
                "decode_attention",
                self._fns["decode_attention"],
                q,
                st.k_paged,
                st.v_paged,
                st.block_table,
                st.seq_lens,
            )
        else:
            # one quantize_kv call for both: its rows are (token, head) pairs, K's and V's alike
            codes, scale = self._op("quantize_kv", "quantize_kv", self._fns["quantize_kv"], kv_new)
            assert (
                st.k_codes is not None and st.v_codes is not None and st.k_scale is not None and st.v_scale is not None
            )  # make_kv_state(int8=True) made them
            st.k_codes.view(-1, Hkv, D).index_copy_(0, st.slots, codes[:, :Hkv])
            st.v_codes.view(-1, Hkv, D).index_copy_(0, st.slots, codes[:, Hkv:])
            st.k_scale.view(-1, Hkv).index_copy_(0, st.slots, scale[:, :Hkv])
            st.v_scale.view(-1, Hkv).index_copy_(0, st.slots, scale[:, Hkv:])
            o = self._op(
                "attention",
                "decode_attention_int8",
                self._fns["decode_attention_int8"],
                q,
                st.k_codes,
                st.k_scale,
                st.v_codes,
                st.v_scale,
                st.block_table,
                st.seq_lens,
            )
        attn = o.reshape(B, Hq * D)
        h = x + self._op("o", "matmul", mm, attn, w.w_o)
        gate_up = self._op("gate_up", "matmul", mm, rms_norm(h, w.mlp_norm, cfg.rms_eps), w.w_gate_up)
        act = F.silu(gate_up[:, :I]) * gate_up[:, I:]
        return StepOutput(attn, h + self._op("down", "matmul", mm, act, w.w_down))

    def served(self) -> List[Tuple[str, str, str]]:
        """(label, op, implementation) of each op call of the last step: for the serving stack what the
        dispatcher says serves it (resolve), for the others the implementation the stack names."""
        out = []
        for c in self.calls:
            if self.stack in SERVING_STACKS:
                impl = str(c.fn.resolve(*c.args))  # type: ignore[attr-defined]  # a serving Dispatcher
            elif c.fn is _sdpa_decode:
                impl = "torch SDPA (contiguous cache)"
            elif self.stack == "flashinfer" and c.op != "matmul":
                impl = f"FlashInfer paged decode ({self._decoder.label})"  # type: ignore[union-attr]
            elif self.stack in ("torch", "flashinfer") or (self.stack == "hybrid" and c.op == "matmul"):
                impl = "torch.matmul (cuBLAS)"
            else:
                impl = "baseline"
            out.append((c.label, c.op, impl))
        return out


def reference_step(
    cfg: ModelConfig,
    weights: LayerWeights,
    state: KVState,
    x: "torch.Tensor",
    precision: Optional["torch.dtype"] = None,
) -> StepOutput:
    """The function every stack computes, in `precision` (default float64) from the same weights, input
    and cache: the cached tokens are the paged bf16 cache's (the new token's K and V in `precision`)."""
    import torch  # keeps the CLI's startup light (torch)

    from ...ops.paged import gather_tokens  # keeps the CLI's startup light (torch)

    p = precision or torch.float64
    w = {f.name: getattr(weights, f.name).to(p) for f in dataclasses.fields(weights)}
    B = x.shape[0]
    Hq, Hkv, D, I = cfg.shard_heads, cfg.shard_kv_heads, cfg.head_dim, cfg.shard_intermediate

    def norm(t, weight):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * weight

    xp = x.to(p)
    qkv = norm(xp, w["attn_norm"]) @ w["w_qkv"]
    q = qkv[:, : Hq * D].view(B, Hq, D)
    k_new = qkv[:, Hq * D : (Hq + Hkv) * D].view(B, Hkv, D)
    v_new = qkv[:, (Hq + Hkv) * D :].view(B, Hkv, D)
    attn = torch.empty(B, Hq, D, dtype=p, device=x.device)
    L, group = state.context, Hq // Hkv
    for b in range(B):
        k = gather_tokens(state.k_paged, state.block_table, b, L).to(p)  # [L, Hkv, D]
        v = gather_tokens(state.v_paged, state.block_table, b, L).to(p)
        k[L - 1], v[L - 1] = k_new[b], v_new[b]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [L, Hq, D]
        s = torch.einsum("hd,lhd->hl", q[b], k) / math.sqrt(D)
        attn[b] = torch.einsum("hl,lhd->hd", torch.softmax(s, dim=-1), v)
    attn = attn.reshape(B, Hq * D)
    h = xp + attn @ w["w_o"]
    gate_up = norm(h, w["mlp_norm"]) @ w["w_gate_up"]
    act = torch.nn.functional.silu(gate_up[:, :I]) * gate_up[:, I:]
    return StepOutput(attn, h + act @ w["w_down"])


def rel_error(out: "torch.Tensor", ref: "torch.Tensor") -> float:
    """||out - ref|| / ||ref||, in float32."""
    o, r = out.detach().float(), ref.detach().to(out.device).float()
    return float((o - r).norm() / r.norm())


# -- the int8 KV cache's accuracy -------------------------------------------------------------------


@dataclass
class Int8Accuracy:
    """What the int8 KV cache costs in accuracy on the model shape: the int8 step of `stack` against its
    bf16 step, from the same weights, input and cache contents (the int8 cache is the bf16 one quantized).
    The floor is what bf16 kernels differ from torch's bf16 step by, for scale (None without torch)."""

    stack: str
    attn_rel_error: float
    hidden_rel_error: float
    bf16_attn_floor: Optional[float] = None
    bf16_hidden_floor: Optional[float] = None

    def describe(self) -> str:
        floor = ""
        if self.bf16_attn_floor is not None:
            floor = f" (bf16 {self.stack} vs torch: {self.bf16_attn_floor:.2e} and {self.bf16_hidden_floor:.2e})"
        return (
            f"int8 KV cache ({self.stack} stack): relative error of the attention output "
            f"{self.attn_rel_error:.2e}, of the layer's output {self.hidden_rel_error:.2e}{floor}"
        )


def int8_accuracy(steps: Mapping[Tuple[str, str], DecodeStep], stack: str) -> Int8Accuracy:
    """Int8Accuracy of `stack` from its built steps (keys (stack, kv)); the torch step, when present,
    gives the floor."""
    bf16, int8 = steps[(stack, "bf16")](), steps[(stack, "int8")]()
    acc = Int8Accuracy(stack, rel_error(int8.attn, bf16.attn), rel_error(int8.hidden, bf16.hidden))
    if ("torch", "bf16") in steps and stack != "torch":
        ref = steps[("torch", "bf16")]()
        acc.bf16_attn_floor, acc.bf16_hidden_floor = rel_error(bf16.attn, ref.attn), rel_error(bf16.hidden, ref.hidden)
    return acc


# -- timing on the GPU ------------------------------------------------------------------------------

LAYER_ROUNDS = 7  # at least; and at least one per stack, so each is timed at every position of the order
OP_ROUNDS = 5
ROUND_MS = 25.0  # replays per round: about this long per graph
WARMUP_REPLAYS = 3


@dataclass
class StackTiming:
    stack: str
    kv: str
    layer_ms: float  # one layer's step, CUDA-graph replay
    spread_ms: float  # half the interquartile range of the rounds, at least harness.bench.bench's REPRO_FLOOR
    step_ms: float  # layer_ms x layers
    tokens_per_s: float  # batch / step
    vs_torch: Optional[float]  # tokens/s over the torch stack's (None without torch)
    rounds: List[float]
    op_ms: Dict[str, float] = field(default_factory=dict)  # each op call alone, by label
    shares: Dict[str, float] = field(default_factory=dict)  # op_ms / layer_ms; 'other': the rest (norms...)
    vs_flashinfer: Optional[float] = None  # tokens/s over the flashinfer stack's (None without it)


@dataclass
class Served:
    kv: str
    label: str
    op: str
    bucket: str
    implementation: str


@dataclass
class PointResult:
    batch: int
    context: int
    timings: List[StackTiming]
    served: List[Served]  # the serving stack's op calls and what served them
    accuracy: Optional[Int8Accuracy]
    op_calls: Dict[str, List[OpCall]]  # the roofline list per KV mode


@dataclass
class ModelBenchResult:
    config: ModelConfig
    gpu: str
    versions: Dict[str, Any]
    stacks: Tuple[str, ...]
    kv_modes: Tuple[str, ...]
    points: List[PointResult]

    def to_json(self) -> Dict[str, Any]:
        def point(p: PointResult) -> Dict[str, Any]:
            return {
                "batch": p.batch,
                "context": p.context,
                "timings": [dataclasses.asdict(t) for t in p.timings],
                "served": [dataclasses.asdict(s) for s in p.served],
                "accuracy": dataclasses.asdict(p.accuracy) if p.accuracy else None,
                "op_calls": {kv: [c.to_json() for c in calls] for kv, calls in p.op_calls.items()},
            }

        return {
            "config": self.config.to_json(),
            "gpu": self.gpu,
            "versions": self.versions,
            "stacks": list(self.stacks),
            "kv_modes": list(self.kv_modes),
            "method": "one layer captured as a CUDA graph and replayed, interleaved round by round; step = "
            "layer x layers; tensor-parallel all-reduces not timed",
            "points": [point(p) for p in self.points],
        }


def _capture(fn: Callable[[], Any]):
    """A CUDA graph of one call of `fn`, after warm-up calls on a side stream (Triton compiles, cuBLAS
    picks its kernels, and the caching allocator settles before the capture, as graph capture needs)."""
    import torch  # keeps the CLI's startup light (torch)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def _replay_ms(graph, n: int) -> float:
    """Mean time of one replay over n back-to-back replays, by CUDA events."""
    import torch  # keeps the CLI's startup light (torch)

    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def _interleaved(graphs: Sequence[Tuple[Any, Any]], rounds: int) -> Dict[Any, Tuple[float, float, List[float]]]:
    """(key, graph) pairs timed round by round, the order rotating every round (harness.bench.bench's rotation):
    per key (time, spread, rounds). The time is the position-balanced median when every key was timed at
    every position, else the plain median."""
    from ..bench.bench import _rotation, _spread, balanced_median  # keeps the CLI's startup light (torch)

    reps = {key: max(10, min(500, int(ROUND_MS / max(_replay_ms(g, 3), 1e-3)))) for key, g in graphs}
    times: Dict[Any, List[float]] = {key: [] for key, _ in graphs}
    positions: Dict[Any, List[int]] = {key: [] for key, _ in graphs}
    for r in range(rounds):
        for pos, (key, g) in _rotation(graphs, r):
            times[key].append(_replay_ms(g, reps[key]))
            positions[key].append(pos)
    out = {}
    for key, xs in times.items():
        med = balanced_median(xs, positions[key] if rounds >= len(graphs) else ())
        out[key] = (med, _spread(xs, med), xs)
    return out


# long: one decode-step point: build every stack and KV mode, check them against torch, time them, measure accuracy
def run_point(
    cfg: ModelConfig,
    point: Point,
    stacks: Sequence[str],
    kv_modes: Sequence[str],
    seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> PointResult:
    """Build, check, time and measure the accuracy of every (stack, KV mode) at one point, on the GPU."""
    import torch  # keeps the CLI's startup light (torch)

    dt = torch.bfloat16
    B = point.batch
    want_int8 = "int8" in kv_modes and any(s not in BF16_ONLY_STACKS for s in stacks)
    weights = make_weights(cfg, dt, "cuda", seed)
    state = make_kv_state(cfg, B, point.context, dt, "cuda", seed + 1, contiguous="torch" in stacks, int8=want_int8)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed + 2)
    x = torch.randn(B, cfg.hidden, generator=gen, device="cuda").to(dt)
    # torch is the bf16 reference of both modes; int8 accuracy needs the bf16 step of the stack it
    # judges, timed or not
    keys = [(s, "bf16") for s in BF16_ONLY_STACKS if s in stacks]
    keys += [
        (s, kv)
        for kv in KV_MODES
        for s in stacks
        if s not in BF16_ONLY_STACKS and (kv in kv_modes or (kv == "bf16" and want_int8))
    ]
    steps = {k: DecodeStep(cfg, k[0], k[1], weights, state, x) for k in keys}
    timed = [k for k in keys if k[1] in kv_modes or k[0] in BF16_ONLY_STACKS]
    log(f"{cfg.name} B={B} ctx={point.context}: checking {len(steps)} steps")
    ref = steps[("torch", "bf16")]() if ("torch", "bf16") in steps else None
    for k, step in steps.items():
        out = step()
        torch.cuda.synchronize()
        if not bool(torch.isfinite(out.hidden).all()):
            raise RuntimeError(f"{step.name}: the layer's output has non-finite values")
        if ref is not None and k[1] == "bf16" and rel_error(out.hidden, ref.hidden) > 2e-2:
            raise RuntimeError(
                f"{step.name}: the layer's output differs from torch's by "
                f"{rel_error(out.hidden, ref.hidden):.2e} (more than bf16 rounding)"
            )
    judge = next((s for s in ("serving", "baseline", "hybrid") if s in stacks), None)
    accuracy = int8_accuracy(steps, judge) if want_int8 and judge else None
    served = []
    if "serving" in stacks:
        for kv in kv_modes:
            step = steps[("serving", kv)]
            for call, (label, op, impl) in zip(step.calls, step.served()):
                spec = get_op(op)
                bucket = spec.bucket(spec.shape_of(dict(zip(spec.arg_names + spec.optional_args, call.args))))
                served.append(Served(kv, label, op, bucket, impl))
    log(f"{cfg.name} B={B} ctx={point.context}: capturing and timing {len(timed)} layers")
    from ..bench.bench import warm_gpu  # keeps the CLI's startup light (torch)

    layer_graphs = [(k, _capture(steps[k])) for k in timed]
    warm_gpu()
    layer = _interleaved(layer_graphs, max(LAYER_ROUNDS, len(layer_graphs)))
    op_graphs, op_calls = [], []
    for k in timed:
        steps[k]()  # the arguments of each call, as the step made them
        # a graph holds its inputs' addresses, not the tensors: the calls keep them alive until timed
        op_calls += steps[k].calls
        op_graphs += [((k, c.label), _capture(c)) for c in steps[k].calls]
    ops = _interleaved(op_graphs, OP_ROUNDS)
    torch_ms = layer[("torch", "bf16")][0] if ("torch", "bf16") in layer else None
    flashinfer_ms = layer[("flashinfer", "bf16")][0] if ("flashinfer", "bf16") in layer else None
    timings = []
    for k in timed:
        ms, spread, rounds = layer[k]
        op_ms = {label: ops[(kk, label)][0] for kk, label in ops if kk == k}
        shares = {label: t / ms for label, t in op_ms.items()}
        shares["other"] = max(0.0, 1.0 - sum(shares.values()))
        step_ms = ms * cfg.layers
        timings.append(
            StackTiming(
                k[0],
                k[1],
                ms,
                spread,
                step_ms,
                B / (step_ms / 1e3),
                torch_ms / ms if torch_ms else None,
                rounds,
                op_ms,
                shares,
                flashinfer_ms / ms if flashinfer_ms else None,
            )
        )
    del layer_graphs, op_graphs, op_calls, steps, state
    torch.cuda.empty_cache()
    return PointResult(
        B, point.context, timings, served, accuracy, {kv: step_op_calls(cfg, B, point.context, kv) for kv in kv_modes}
    )


def run_model_bench(
    cfg: ModelConfig,
    points: Sequence[Point],
    stacks: Sequence[str] = ("torch", "baseline", "serving"),
    kv_modes: Sequence[str] = KV_MODES,
    seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> ModelBenchResult:
    """Every point's PointResult, on this process's CUDA GPU (harness.bench.bench.NoGPU without one)."""
    from ..bench.bench import require_gpu  # keeps the CLI's startup light (torch)

    require_gpu()
    for s in stacks:
        if s not in STACKS:
            raise ModelConfigError(f"unknown stack {s!r}; expected one of {', '.join(STACKS)}")
    for kv in kv_modes:
        if kv not in KV_MODES:
            raise ModelConfigError(f"unknown KV mode {kv!r}; expected one of {', '.join(KV_MODES)}")
    stacks = available_stacks(stacks, log)
    results = [run_point(cfg, p, stacks, kv_modes, seed, log) for p in points]
    return ModelBenchResult(cfg, gpu_name() or "?", versions(), tuple(stacks), tuple(kv_modes), results)


def available_stacks(stacks: Sequence[str], log: Callable[[str], None]) -> Tuple[str, ...]:
    """`stacks` less the flashinfer stack when FlashInfer cannot run here, which is said in one line."""
    if "flashinfer" not in stacks:
        return tuple(stacks)
    from ...ops.flashinfer_paged import FlashInferUnavailable, require  # keeps the CLI's startup light (torch)

    try:
        require()
    except FlashInferUnavailable as e:
        log(f"flashinfer stack left out: {e}")
        return tuple(s for s in stacks if s != "flashinfer")
    return tuple(stacks)


# -- the cost of a token at a fixed KV memory budget -------------------------------------------------


def cache_bytes_per_token(cfg: ModelConfig, kv: str) -> int:
    """Bytes one token's K and V take in one GPU's cache over every layer: bf16 values, or int8 codes plus a
    float32 scale per (token, KV head) (the quantize_kv rule)."""
    per_head = 2 * cfg.head_dim if kv == "bf16" else cfg.head_dim + 4
    return cfg.layers * 2 * cfg.shard_kv_heads * per_head


def kv_budget_points(
    cfg: ModelConfig, budget_bytes: int, context: int, kv_modes: Sequence[str] = KV_MODES
) -> Dict[str, Point]:
    """For each KV mode, the point with the most sequences of `context` tokens whose cache fits the budget
    (whole pages: a sequence holds ceil(context / page_size) pages)."""
    out = {}
    for kv in kv_modes:
        per_seq = paged_blocks(cfg, context) * cfg.page_size * cache_bytes_per_token(cfg, kv)
        batch = budget_bytes // per_seq
        if batch < 1:
            raise ModelConfigError(
                f"a KV budget of {budget_bytes / 2**30:.1f} GiB holds no sequence of {context} "
                f"tokens in {kv} ({per_seq / 2**30:.2f} GiB each)"
            )
        out[kv] = Point(int(batch), context)
    return out


def parse_bytes(text: str) -> int:
    """'60GiB', '60G', '512MiB', '1.5TB' (GB and G are GiB here: memory is counted in binary units) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B?)\s*", text or "", re.I)
    if not m or float(m.group(1)) <= 0:
        raise ModelConfigError(f"bad memory size {text!r}: use e.g. 60GiB, 512MiB")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def run_kv_budget(
    cfg: ModelConfig,
    budget_bytes: int,
    context: int,
    stacks: Sequence[str],
    kv_modes: Sequence[str] = KV_MODES,
    seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> "ModelBenchResult":
    """Each KV mode at its budget point (kv_budget_points): the bf16 stacks (torch, flashinfer) at the bf16
    point, every other stack at each mode's own point. The result's points are in KV-mode order."""
    from ..bench.bench import require_gpu  # keeps the CLI's startup light (torch)

    require_gpu()
    stacks = available_stacks(stacks, log)
    points = kv_budget_points(cfg, budget_bytes, context, kv_modes)
    results = []
    for kv, point in points.items():
        here = [s for s in stacks if kv == "bf16" or s not in BF16_ONLY_STACKS]
        if not here:
            continue
        log(f"KV budget {budget_bytes / 2**30:.1f} GiB, {kv}: {point.batch} sequences of {context} tokens")
        results.append(run_point(cfg, point, here, (kv,), seed, log))
    return ModelBenchResult(cfg, gpu_name() or "?", versions(), tuple(stacks), tuple(kv_modes), results)


__all__ = [
    "ModelConfig",
    "ModelConfigError",
    "PRESETS",
    "load_model_config",
    "STACKS",
    "KV_MODES",
    "Point",
    "parse_points",
    "parse_names",
    "OpCall",
    "step_op_calls",
    "NOMINAL_TBPS",
    "NOMINAL_TFLOPS",
    "LayerWeights",
    "make_weights",
    "KVState",
    "make_kv_state",
    "rms_norm",
    "StepOutput",
    "RecordedCall",
    "DecodeStep",
    "reference_step",
    "rel_error",
    "Int8Accuracy",
    "int8_accuracy",
    "StackTiming",
    "Served",
    "PointResult",
    "ModelBenchResult",
    "run_point",
    "run_model_bench",
    "paged_blocks",
    "BF16_ONLY_STACKS",
    "cache_bytes_per_token",
    "kv_budget_points",
    "parse_bytes",
    "run_kv_budget",
    "available_stacks",
    "roofline_ms",
]
