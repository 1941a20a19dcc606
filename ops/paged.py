"""The paged KV cache shared by decode_attention and decode_attention_int8.

Token t of sequence b lives at cache[block_table[b, t // block_size], t % block_size].
Blocks are handed out as a serving stack's allocator hands them out: in a random order (a fragmented
cache), in consecutive ids (a fresh allocator), or with a prefix shared by every sequence (prefix
caching). block_table entries past the blocks a sequence needs hold invalid ids, and every cache slot
that no live token owns holds garbage, so a kernel that reads one of them shows it. A pool past 2^31
elements always has live pages on both sides of element 2^31 (where an int32 offset wraps).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F

from .attention import HEAD_DIMS_DRAWN, SOFTMAX_BOUND_TOL, attention_reference, softmax_rounding_bound
from .common import (
    COMMON_LIMITS,
    SM_SCALE_LIMIT,
    Anchor,
    Case,
    Distribution,
    Domain,
    ElementBound,
    IntegerChange,
    Op,
    ReferenceUnavailable,
    Region,
    Shape,
    ValueDim,
)
from .tuning import SMEM_LIMIT


# Ids no cache has: below zero, at the end, far past the end, and huge.
def _invalid_ids(num_blocks: int):
    return (-1, num_blocks, num_blocks + 12345, 2**30)


# The order of a ragged batch's lengths (DecodeShape.order, an index): the longest first and a one-token
# sequence last (what the fixed suites were written against), ascending, descending, the longest last, and
# shuffled. A kernel that takes the first sequence for the longest (its split count, its grid) meets the others.
ORDERS = ("longest first", "ascending", "descending", "longest last", "shuffled")
# How a batch's pages are handed out (DecodeShape.pages, an index): in a random order over the pool, in
# consecutive ids (a fresh allocator), or with the longest sequence's full pages shared by every other
# sequence as their prefix (prefix caching: one page in several block tables).
PAGINGS = ("fragmented", "consecutive", "shared prefix")
# The joint layout of a paged cache whose K and V halves are one storage, `kv[0]` and `kv[1]` of a [2, blocks, ...]
# tensor (vLLM's layout): V starts at a storage offset inside the storage K starts, and so do their scales.
KV_ONE_STORAGE = "kv one storage"
KV_PAIRS = (("k_cache", "v_cache"), ("k_scale", "v_scale"))
# Element 2^31 of a cache: an int32 offset (block id times the block stride) wraps past it.
FAR_ELEMENT = 2**31


@dataclass(frozen=True)
class DecodeShape(Shape):
    B: int
    Hq: int
    Hkv: int
    D: int
    block_size: int
    ctx: int  # longest context; max_blocks = ctx / block_size (+1 spare column)
    ragged: bool = False  # seq_lens drawn from [1, ctx] instead of all equal to ctx
    spare_blocks: int = 3  # blocks of the pool no sequence owns (a serving pool is far larger than one batch)
    order: int = 0  # ORDERS[order]: how a ragged batch's lengths are ordered
    pages: int = 0  # PAGINGS[pages]: how its pages are handed out
    full_table: bool = False  # no spare column: a sequence of ctx tokens (a multiple of block_size) fills its table


def decode_shape_strategy():
    """Interpreter-sized paged caches: ragged lengths, GQA groups (MQA too), head dims and page sizes that
    are not powers of two among those that are (SGLang pages hold 1 token; FlashInfer takes any size),
    contexts on both sides of the 256-token steps at which the baselines add a split."""
    from hypothesis import strategies as st  # deferred: only the sanitizer's property checks draw shapes

    @st.composite
    def shapes(draw):
        hkv = draw(st.sampled_from([1, 2, 3]))
        group = draw(st.sampled_from([1, 2, 4, 5, 8]))
        B = draw(st.sampled_from([1, 2, 3, 5]))
        D = draw(st.sampled_from(HEAD_DIMS_DRAWN))
        bs = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16, 24]))
        ctx = draw(st.sampled_from([1, 2, 15, 16, 17, 33, 64, 100, 129, 257, 520]))
        # the lengths' order and the paging follow from the sizes drawn, not from draws of their own: an extra draw
        # moves every later example of a seeded run (the suites name the check that meets a fault on their seed);
        # every order and paging comes up over a run's examples, and the domain's regions draw each of them
        return DecodeShape(
            B,
            hkv * group,
            hkv,
            D,
            bs,
            ctx,
            draw(st.booleans()),
            order=(B + ctx) % len(ORDERS),
            pages=(D + bs) % len(PAGINGS),
        )

    return shapes()


def decode_bucket(shape: DecodeShape) -> str:
    # Ranges, not exact sizes: a serving stack's block table has spare capacity, and the
    # dispatcher sees only that capacity (reading seq_lens would cost a device sync).
    c = "c1k" if shape.ctx <= 1536 else "c8k" if shape.ctx <= 12288 else "clong"
    g = shape.Hq // max(shape.Hkv, 1)
    # Pages under 16 tokens are a bucket of their own: a token tile then gathers from several pages (one
    # block-table entry per token at one-token pages), which a kernel tuned for whole pages may not suit.
    # Pages of 16 tokens or more keep the names the serving set was measured under.
    p = f"-p{shape.block_size}" if shape.block_size < 16 else ""
    return f"{c}-g{g}-d{shape.D}{p}"


def _ordered_lens(shape: DecodeShape, gen: torch.Generator, device) -> torch.Tensor:
    """seq_lens (int64): all ctx, or ragged from [1, ctx] with ctx and 1 among them, in ORDERS[shape.order]."""
    B = shape.B
    if not shape.ragged:
        return torch.full((B,), shape.ctx, device=device, dtype=torch.int64)
    lens = torch.randint(1, shape.ctx + 1, (B,), generator=gen, device=device, dtype=torch.int64)
    lens[0] = shape.ctx  # the longest sequence is always present
    if B > 1:
        lens[-1] = 1
    order = ORDERS[shape.order]
    if order == "ascending":
        lens = lens.sort().values
    elif order == "descending":
        lens = lens.sort(descending=True).values
    elif order == "longest last":
        lens = torch.cat([lens[1:], lens[:1]])
    elif order == "shuffled":
        lens = lens[torch.randperm(B, generator=gen, device=device)]
    return lens


def _far_boundary(shape: DecodeShape, num_blocks: int) -> Optional[int]:
    """The first block that starts at or past element 2^31 of a cache, when the pool reaches past it."""
    per_block = shape.block_size * shape.Hkv * shape.D
    if num_blocks * per_block <= FAR_ELEMENT:
        return None
    return min(-(-FAR_ELEMENT // per_block), num_blocks - 1)


def _live_ids(shape: DecodeShape, total: int, num_blocks: int, far: Optional[int], gen, device) -> torch.Tensor:
    """The ids of a batch's `total` live pages in table order: a random order over the pool, or a run of
    consecutive ids (across the 2^31 boundary of a pool past it)."""
    if PAGINGS[shape.pages] != "consecutive":
        return torch.randperm(num_blocks, generator=gen, device=device)[:total]
    room = num_blocks - total
    if far is not None:
        base = max(0, min(room, far - 1 - (total - 1) // 2))
    else:
        base = int(torch.randint(0, room + 1, (1,), generator=gen, device=device))
    return base + torch.arange(total, device=device)


def _share_prefix(block_table: torch.Tensor, seq_lens: torch.Tensor, needed: torch.Tensor, bs: int) -> None:
    """Prefix caching: every sequence's first pages are the longest sequence's full pages (in place)."""
    ref = int(seq_lens.argmax())
    full = int(seq_lens[ref]) // bs
    for b in range(block_table.shape[0]):
        n = min(full, int(needed[b]))
        if b != ref and n:
            block_table[b, :n] = block_table[ref, :n]


def _place_far_pages(block_table, live, num_blocks: int, far: int, gen, device) -> None:
    """Live pages on both sides of element 2^31 on every draw (in place): the block just before the boundary,
    the first one past it and the pool's last block each take the place of a live page (every entry of
    that page, so a shared page stays shared) unless one is live already."""
    ids = block_table[live]
    for target in sorted({far - 1, far, num_blocks - 1}):
        if bool((ids == target).any()):
            continue
        others = ids[(ids != far - 1) & (ids != far) & (ids != num_blocks - 1)].unique()
        if others.numel() == 0:
            break
        pick = others[int(torch.randint(0, others.numel(), (1,), generator=gen, device=device))]
        ids = torch.where(ids == pick, torch.full_like(ids, target), ids)
    block_table[live] = ids


def table_columns(shape: DecodeShape) -> int:
    """The block table's columns: ctx in whole blocks, plus one spare column that no sequence reaches, except
    where the shape asks for a full table (a serving engine sizes its table to the longest sequence it admits,
    and a sequence of that length fills it)."""
    return math.ceil(shape.ctx / shape.block_size) + (0 if shape.full_table else 1)


def make_paged_layout(shape: DecodeShape, gen: torch.Generator, device) -> Dict[str, Any]:
    """seq_lens, block_table and the slot ownership mask of a paged cache (PAGINGS[shape.pages])."""
    B, bs = shape.B, shape.block_size
    max_blocks = table_columns(shape)
    if torch.device(device).type == "meta":  # shapes only (a compile's launches): as many blocks as full sequences
        num_blocks = B * math.ceil(shape.ctx / bs) + 3
        return {
            "seq_lens": torch.empty((B,), device=device, dtype=torch.int32),
            "block_table": torch.empty((B, max_blocks), device=device, dtype=torch.int32),
            "num_blocks": num_blocks,
            "owned": torch.empty((num_blocks, bs), device=device, dtype=torch.bool),
        }
    seq_lens = _ordered_lens(shape, gen, device)
    needed = (seq_lens + bs - 1) // bs
    total = int(needed.sum())
    num_blocks = total + shape.spare_blocks  # blocks nobody owns, spread among the live ones
    far = _far_boundary(shape, num_blocks)
    ids = _live_ids(shape, total, num_blocks, far, gen, device)
    invalid = torch.tensor(_invalid_ids(num_blocks), device=device, dtype=torch.int64)
    pick = torch.randint(0, len(invalid), (B, max_blocks), generator=gen, device=device)
    block_table = invalid[pick]
    col = torch.arange(max_blocks, device=device)
    live = col[None, :] < needed[:, None]
    block_table[live] = ids
    if PAGINGS[shape.pages] == "shared prefix":
        _share_prefix(block_table, seq_lens, needed, bs)
    if far is not None:
        _place_far_pages(block_table, live, num_blocks, far, gen, device)
    # which (block, slot) pairs hold a live token
    owned = torch.zeros(num_blocks, bs, dtype=torch.bool, device=device)
    tok = torch.arange(max_blocks * bs, device=device)
    tok_live = tok[None, :] < seq_lens[:, None]
    blk = block_table.gather(1, (tok // bs)[None, :].expand(B, -1))
    owned[blk[tok_live], (tok % bs)[None, :].expand(B, -1)[tok_live]] = True
    return {
        "seq_lens": seq_lens.to(torch.int32),
        "block_table": block_table.to(torch.int32),
        "num_blocks": num_blocks,
        "owned": owned,
        "far": far is not None,
    }


# The "needles" distribution of the long-context regions: normal values, and in each sequence a few keys aligned
# with its query so that they carry the attention. On random values a kernel that drops or re-weights the keys past
# some position moves the output by about 1/sqrt(context), inside the tolerance; with needles it returns another
# vector. Each needle's score is NEEDLE_LEAD (natural log) above log(context), so the background keys hold e^-6 of
# the mass; the steps below the strongest give shares of about 45, 27, 17 and 10%, in a random order of positions.
NEEDLES = Distribution("needles", "normal values; per sequence four keys aligned with its queries carry the attention")
NEEDLE_LEAD = 6.0
NEEDLE_STEPS = (0.0, 0.5, 1.0, 1.5)


def needle_positions(length: int, gen: torch.Generator, device) -> List[int]:
    """Distinct token positions of a sequence of `length` for its needles: the last token, one uniform, one at a
    log-uniform distance from the end and one from the start, so that a fault past (or before) a position of any
    scale meets one."""
    u = torch.rand(3, generator=gen, device=device).tolist()
    span = math.log2(length)
    picks = (length - 1, int(u[0] * length), length - int(2 ** (u[1] * span)), int(2 ** (u[2] * span)) - 1)
    out: List[int] = []
    for p in picks:
        p = min(max(p, 0), length - 1)
        if p not in out:
            out.append(p)
    return out


def place_needles(q: torch.Tensor, k: torch.Tensor, layout: Mapping[str, Any], gen: torch.Generator) -> None:
    """Write the needles into the float keys `k` ([rows of pool_rows(layout), bs, Hkv, D]) in place: each needle
    key of sequence b and KV head h points along the mean direction of the group's queries `q` ([B, Hq, D], as
    the case's dtype holds them), scaled so that its score q.k / sqrt(D) averages the needle's target over the
    group. Shared pages are shared: another sequence then meets the needle too, as its own cache says."""
    B, Hq, D = q.shape
    Hkv, bs = k.shape[2], k.shape[1]
    qg = q.float().reshape(B, Hkv, Hq // Hkv, D)
    u = F.normalize(F.normalize(qg, dim=-1).sum(2), dim=-1)  # [B, Hkv, D]
    along = (qg * u[:, :, None, :]).sum(-1).mean(-1).clamp(min=1e-3)  # [B, Hkv]: > 0 but for a freak draw
    owned = layout["owned"]
    live = torch.nonzero(owned.any(1)).flatten() if layout.get("far") else None
    table = layout["block_table"].to(torch.int64)
    for b, length in enumerate(int(x) for x in layout["seq_lens"].tolist()):
        if length < 2:
            continue
        positions = needle_positions(length, gen, k.device)
        steps = torch.tensor(NEEDLE_STEPS, device=k.device)[
            torch.randperm(len(NEEDLE_STEPS), generator=gen, device=k.device)
        ]
        for p, step in zip(positions, steps.tolist()):
            block = table[b, p // bs]
            row = block if live is None else torch.searchsorted(live, block)
            target = (math.log(length) + NEEDLE_LEAD - step) * math.sqrt(D)
            k[row, p % bs] = (u[b] * (target / along[b])[:, None]).to(k.dtype)


def pool_rows(layout: Mapping[str, Any]) -> torch.Tensor:
    """The slot ownership of the blocks whose values a case draws: every block of the pool, or of a pool past 2^31
    elements only its live ones (in id order), so that the interpreter affords such a pool (paged_pool)."""
    owned = layout["owned"]
    return owned[owned.any(1)] if layout.get("far") else owned


def paged_pool(values: torch.Tensor, layout: Mapping[str, Any], pad) -> torch.Tensor:
    """The cache of `values` drawn for the blocks of pool_rows(layout). A pool past 2^31 elements is allocated
    whole and only its live blocks are written; on the CPU the others are never touched, so their pages stay
    virtual (a few MB resident for a pool of GBs: what the interpreter affords); on a GPU they hold `pad`."""
    if not layout.get("far"):
        return values
    owned = layout["owned"]
    shape = (owned.shape[0], *values.shape[1:])
    if values.device.type == "cpu":
        pool = torch.empty(shape, dtype=values.dtype)
    else:
        pool = torch.full(shape, pad, dtype=values.dtype, device=values.device)
    pool[owned.any(1)] = values
    return pool


def garbage_fill(cache: torch.Tensor, owned: torch.Tensor, garbage) -> torch.Tensor:
    """Overwrite the slots no live token owns (cache: [num_blocks, bs, H, D])."""
    if cache.device.type == "meta":
        return cache  # no values to overwrite
    cache[~owned] = garbage
    return cache


def gather_tokens(cache: torch.Tensor, block_table: torch.Tensor, b: int, length: int) -> torch.Tensor:
    """[length, ...] slots of sequence b, in token order."""
    return gather_tokens_of(cache, block_table, torch.tensor([b]), length)[0]


def gather_tokens_of(cache: torch.Tensor, block_table: torch.Tensor, seqs: torch.Tensor, length: int) -> torch.Tensor:
    """[len(seqs), length, ...] slots of the sequences `seqs` (all `length` tokens long), in token order."""
    bs = cache.shape[1]
    t = torch.arange(length, device=cache.device)
    blocks = block_table[seqs.to(block_table.device)].to(torch.int64)[:, t // bs]
    return cache[blocks, (t % bs)[None, :].expand_as(blocks)]


def gather_kv_of(args: Mapping[str, Any], seqs: torch.Tensor, length: int, precision):
    """The keys and values of the sequences `seqs` (all `length` tokens long), [len(seqs), length, Hkv, D] each in
    `precision`, from a paged op's arguments. A cache of codes (with k_scale and v_scale) gives the values used,
    codes times scales; its value scales [len(seqs), length, Hkv] come third (None for a plain cache)."""
    k = gather_tokens_of(args["k_cache"], args["block_table"], seqs, length).to(precision)
    v = gather_tokens_of(args["v_cache"], args["block_table"], seqs, length).to(precision)
    if args.get("k_scale") is None:
        return k, v, None
    k_s = gather_tokens_of(args["k_scale"], args["block_table"], seqs, length).to(precision)
    v_s = gather_tokens_of(args["v_scale"], args["block_table"], seqs, length).to(precision)
    return k * k_s[..., None], v * v_s[..., None], v_s


# Elements of one block of same-length sequences that the reference and the element bound take at once
# (float64 keys and values, and the scores of every query head): a batch of 3840 short sequences in one block
# instead of 3840 steps (4 s on the H100), and a long sequence alone, as before (a block of tensors this large
# is fresh memory on every call: four 30000-token sequences at once took three times as long).
SEQUENCE_BLOCK = 1 << 22


def same_length_blocks(args: Mapping[str, Any]):
    """(length, a block of the sequences of that length as an index tensor), for every length in the batch."""
    lens = [int(x) for x in args["seq_lens"].tolist()]
    Hq, D = int(args["q"].shape[1]), int(args["q"].shape[2])
    Hkv = int(args["k_cache"].shape[2])
    by_length: Dict[int, List[int]] = {}
    for b, n in enumerate(lens):
        by_length.setdefault(n, []).append(b)
    for length, seqs in sorted(by_length.items()):
        step = max(1, SEQUENCE_BLOCK // (max(length, 1) * max(Hkv * D, Hq)))
        for i in range(0, len(seqs), step):
            yield length, torch.tensor(seqs[i : i + step], dtype=torch.int64, device=args["q"].device)


def gather_kv(args: Mapping[str, Any], b: int, length: int, precision):
    """gather_kv_of for sequence b alone: [length, Hkv, D] keys and values, [length, Hkv] value scales or None."""
    k, v, v_s = gather_kv_of(args, torch.tensor([b]), length, precision)
    return k[0], v[0], None if v_s is None else v_s[0]


def paged_reference(args: Mapping[str, Any], precision):
    """Attention of one query per sequence over its gathered cache, in `precision`, from a paged op's
    arguments. With scales, the cache is int8 and the value used is cache * scale[..., None]."""
    q, sm_scale = args["q"], args.get("sm_scale")
    B, Hq, D = q.shape
    out = torch.empty(B, Hq, D, dtype=precision, device=q.device)
    for length, seqs in same_length_blocks(args):
        k, v, _ = gather_kv_of(args, seqs, length, precision)  # [n, L, Hkv, D]
        o = attention_reference(
            q[seqs][:, :, None, :],
            k.permute(0, 2, 1, 3),
            v.permute(0, 2, 1, 3),
            False,
            sm_scale if sm_scale is not None else 1.0 / math.sqrt(D),
            precision,
        )
        out[seqs] = o[:, :, 0, :]
    return out


def slot_readable(owned: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """Readable mask of a [num_blocks, bs, H, (D)] tensor from slot ownership [num_blocks, bs]."""
    m = owned
    while m.dim() < cache.dim():
        m = m[..., None]
    return m.expand(cache.shape)


def owned_from_args(args: Mapping[str, Any]) -> torch.Tensor:
    """Recompute slot ownership from block_table and seq_lens (the contract's own rule)."""
    k_cache, block_table, seq_lens = args["k_cache"], args["block_table"], args["seq_lens"]
    num_blocks, bs = k_cache.shape[0], k_cache.shape[1]
    owned = torch.zeros(num_blocks, bs, dtype=torch.bool, device=k_cache.device)
    for b, length in enumerate(int(x) for x in seq_lens.tolist()):
        t = torch.arange(length, device=k_cache.device)
        owned[block_table[b].to(torch.int64)[t // bs], t % bs] = True
    return owned


def decode_flops(shape: DecodeShape) -> float:
    return 4.0 * shape.B * shape.Hq * shape.ctx * shape.D


def decode_shape_suites():
    S = DecodeShape
    return {
        "tiny": [
            S(1, 1, 1, 16, 16, 1),
            S(2, 4, 2, 32, 16, 37, True),
            S(3, 2, 2, 16, 4, 23, True),
            S(2, 8, 1, 64, 16, 64),
            S(1, 6, 3, 32, 8, 129, True),
        ],
        # the long context reaches the most splits; the batch of 33 the most programs. D = 96 in 6-token
        # pages with MQA over 4100 tokens crosses every split count (1 to 16) the baselines' host code picks;
        # one-token pages (SGLang's) with ragged lengths across three split counts
        "near_serving": [
            S(2, 8, 2, 128, 16, 8192, True),
            S(33, 4, 4, 64, 16, 300, True),
            S(2, 8, 1, 96, 6, 4100, True),
            S(3, 4, 1, 64, 1, 700, True),
        ],
        # 16-token pages at D = 128 (vLLM's default page, Llama), D = 64 and D = 96 (Phi-3), and one-token
        # pages (SGLang's default)
        "serving": [
            S(32, 32, 32, 128, 16, 8192),
            S(32, 32, 8, 128, 16, 8192),
            S(32, 32, 8, 64, 16, 8192),
            S(32, 32, 32, 96, 16, 8192),
            S(32, 32, 8, 128, 1, 8192),
        ],
    }


def _decode_gpu_regions() -> List[Region]:
    """The paged decodes' regions only the device affords: serving heads, batches and pools, long contexts."""
    S = DecodeShape
    return [
        Region("context 131072, needles", S(1, 8, 1, 128, 256, 131072), where="gpu", dist=NEEDLES.name),
        # live pages on both sides of element 2^31 on every draw (make_paged_layout), in a 131000-block pool
        Region("a pool past 2^31 elements", S(2, 8, 8, 128, 16, 2048, spare_blocks=131072), where="gpu"),
        Region(
            "a pool of about 66000 16-token blocks, a batch of 254",
            S(254, 32, 8, 128, 16, 2048, True, spare_blocks=50000),
            where="gpu",
        ),
        Region(
            "128-token pages, GQA group 7, a batch of 66, contexts to 40000, shuffled, needles",
            S(66, 56, 8, 128, 128, 40000, True, order=4),
            where="gpu",
            dist=NEEDLES.name,
        ),
        Region("context 131072 at serving heads", S(2, 32, 8, 128, 16, 131072, True), where="gpu"),
        Region(
            "context 131072 at serving heads, needles",
            S(2, 32, 8, 128, 16, 131072, True),
            where="gpu",
            dist=NEEDLES.name,
        ),
        Region("page 256 at serving heads", S(8, 32, 8, 128, 256, 8192), where="gpu"),
        Region("MQA group 128 at serving heads", S(4, 128, 1, 128, 16, 4096), where="gpu"),
    ]


def decode_domain() -> Domain:
    """What the paged decodes' contract admits, and the regions that reach its corners: on the CPU at one or
    two heads and a short batch (few programs), on the GPU where only the device can afford it."""
    S = DecodeShape
    cpu = [
        Region("page 32", S(1, 2, 1, 16, 32, 100, True)),
        Region("page 64", S(2, 2, 2, 32, 64, 200, True)),
        Region("page 256", S(1, 1, 1, 16, 256, 600)),
        Region("head dim 160", S(1, 2, 1, 160, 16, 40)),
        Region("head dim 256", S(1, 1, 1, 256, 8, 33)),
        Region("GQA group 16", S(1, 16, 1, 16, 16, 40)),
        Region("MQA group 128", S(1, 128, 1, 16, 4, 20)),
        Region("a pool 4000 blocks larger than the batch", S(2, 2, 1, 16, 8, 40, spare_blocks=4000)),
        Region("context 9000", S(1, 1, 1, 16, 64, 9000)),
        # keys that carry the attention from every scale of distance (NEEDLES): a dropped or re-weighted tail shows
        Region("context 32768, needles", S(1, 2, 1, 16, 64, 32768), dist=NEEDLES.name),
        Region("vLLM cache view kv[:, 0]", S(2, 4, 2, 32, 16, 37, True), "pair"),
        Region("HND cache view", S(2, 4, 2, 32, 16, 37, True), "bshd"),
        Region("q broadcast over its heads (stride 0)", S(2, 4, 2, 16, 16, 40), "expanded"),
        Region("q broadcast over the batch (stride 0)", S(3, 2, 1, 16, 8, 20, True), "expanded:q:0"),
        Region("every cache at a storage offset (vLLM's kv_cache[1])", S(2, 4, 2, 32, 16, 37, True), "offset"),
        # real shapes at proxy extents: 128-token pages, GQA group 7, a batch past 64
        Region("page 128", S(1, 2, 1, 16, 128, 300, True)),
        Region("GQA group 7", S(2, 14, 2, 16, 16, 40, True)),
        Region("a batch of 66", S(66, 1, 1, 16, 4, 6, True)),
        # the relations between a batch's runtime values (ORDERS, PAGINGS), each order at least once
        Region("lengths ascending, consecutive pages", S(4, 2, 1, 16, 4, 30, True, order=1, pages=1)),
        Region("lengths descending, a shared prefix", S(4, 2, 1, 16, 4, 30, True, order=2, pages=2)),
        Region("the longest last, a shared prefix", S(3, 2, 1, 16, 8, 50, True, order=3, pages=2)),
        Region("lengths shuffled, consecutive pages", S(5, 2, 1, 16, 4, 30, True, order=4, pages=1)),
        # a sequence as long as its table allows (no spare column), the caches' storages shared, and the views
        # and pagings of a fresh allocator together: relations a serving engine's inputs have
        Region("a sequence that fills its block table", S(3, 2, 1, 16, 16, 48, True, full_table=True)),
        Region("a full block table, consecutive pages", S(2, 2, 1, 16, 8, 32, full_table=True, pages=1)),
        Region("K and V caches in one storage (vLLM's kv[0], kv[1])", S(2, 4, 2, 32, 16, 37, True), KV_ONE_STORAGE),
        Region("vLLM cache view kv[:, 0], consecutive pages", S(2, 4, 2, 32, 16, 70, True, pages=1), "pair"),
        Region("head dim 192", S(1, 2, 1, 192, 16, 40)),
        # block ids past 65535 (16 bits) on nearly every draw: the live pages land at random in the pool
        Region("a pool of 131072 blocks", S(2, 2, 1, 16, 8, 40, True, spare_blocks=131072)),
        Region("sm_scale 1/D (muP), head dim 64", S(2, 2, 1, 64, 16, 40, True), args=(("sm_scale", 1 / 64),)),
    ]
    gpu = _decode_gpu_regions()
    limits = (
        ("head dim D", "1..256"),
        ("block_size", "1..256"),
        ("context", "1..131072, ragged in a batch"),
        ("GQA group", "1..128 (MQA included)"),
        ("pool", "any number of blocks (past 2^31 elements on the GPU: live pages on both sides of element 2^31)"),
        ("batch", "any (254 on the GPU), lengths in any order, pages shared or consecutive"),
        ("sm_scale", SM_SCALE_LIMIT),
    ) + COMMON_LIMITS
    return Domain(limits, tuple(cpu + gpu))


def decode_config_fits(c, shape: DecodeShape) -> bool:
    """The pipelined K and V tiles of a (NUM_SPLITS, BLOCK_N, num_warps, num_stages) config in shared memory."""
    splits, bn, warps, stages = c
    return 2 * bn * shape.D * 2 * max(stages - 1, 1) <= SMEM_LIMIT


def int8_underflow_floor(codes: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """What multiplies a probability after a kernel rounds it for the P @ V dot of a cache of codes ([..., L, Hkv, D]
    codes, [..., L, Hkv] value scales): the probability's float16 underflow (softmax_rounding_bound's 2^-24) costs
    that much. A kernel may fold token j's value scale s_j into its probability before the rounding, in whole
    (p_j s_j, then times code_jd: the baseline) or in part (p_j s_j / max s, then times code_jd max s: the serving
    kernels), or not at all (p_j, then times code_jd s_j): the factor after the rounding is |code_jd| times at
    most max(1, max s), the largest scale of the sequence's head. (A scale below 1, as every int8 cache whose
    values are under 127 has, makes the probability smaller and so its underflow larger relative to it; the
    largest-scale factor alone understated the baseline's underflow by 1 / max s, 40x at standard normal values.)"""
    return codes.abs() * v_scale.amax(-2, keepdim=True).clamp(min=1.0)[..., None]


def _needle_at(args: Mapping[str, Any], page: int, slot: int) -> None:
    """The key at (page, slot) of every KV head set to its query group's mean query, scaled so that sequence 0's
    logit there is about 30: the attention of sequence 0 rests on that token (its last at the class's corner),
    and a kernel that drops or re-weights the tail of a long sequence is far off (with the pages copied from
    the sequence's own, the tail weighs no more than any other token). A cache of codes gets the needle's codes
    and scales."""
    q, k = args["q"][0].to(torch.float64), args["k_cache"]
    hkv, d = int(k.shape[2]), int(q.shape[-1])
    sm_scale = args.get("sm_scale")
    mean_q = q.view(hkv, -1, d).mean(1)
    gain = 30.0 / ((sm_scale if sm_scale is not None else d**-0.5) * (mean_q * mean_q).sum(-1)).clamp_min(1e-3)
    needle = (mean_q * gain[:, None]).clamp(-1e4, 1e4)
    if isinstance(args.get("k_scale"), torch.Tensor):
        amax = needle.abs().amax(-1).clamp_min(1e-6)
        k[page, slot] = (needle / amax[:, None] * 127).round().clamp(-127, 127).to(k.dtype)
        args["k_scale"][page, slot] = (amax / 127).to(args["k_scale"].dtype)
    else:
        k[page, slot] = needle.to(k.dtype)


def _same_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in a copy of its storage, at its offset, with its size and strides (the serving guard's class
    key holds all three)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage().clone(), t.storage_offset(), tuple(t.shape), tuple(t.stride())
    )


class PagedDecodeOp(Op):
    """What decode_attention and decode_attention_int8 share: shapes, buckets, the cost model's tokens, the
    baselines' `_config` arguments and the benchmark's anchor."""

    shape_cls = DecodeShape
    region_distributions = (NEEDLES,)  # the long-context regions' (decode_domain)
    streaming = True  # every cached token is read once per call
    # q may be a broadcast view (one query for every head, or every sequence); the caches may not: the serving
    # stack writes them in place, and a stride-0 cache would alias every block (the scales are caches too)
    expandable = (("q", 1),)

    def shape_suites(self):
        return decode_shape_suites()

    def shape_strategy(self):
        return decode_shape_strategy()

    value_dims = (
        ValueDim("ctx", 1, 131072, 32768),
        ValueDim("block_size", 1, 256, 256),
        ValueDim("D", 1, 256, 256),
        ValueDim("group", 1, 128, 128),
        ValueDim("B", 1, 4096, 64),
        ValueDim("Hkv", 1, 128, 32),
    )

    def value_base(self) -> DecodeShape:
        return DecodeShape(2, 2, 1, 16, 16, 40)

    def with_value(self, base: DecodeShape, dim: str, value: int) -> DecodeShape:
        if dim == "group":
            return dataclasses.replace(base, Hq=value * base.Hkv)
        changes: Dict[str, Any] = {"Hkv": value, "Hq": value} if dim == "Hkv" else {dim: value}
        return dataclasses.replace(base, **changes)

    joint_layouts = (KV_ONE_STORAGE,)

    def joint_layout_args(self, args: Dict[str, Any], layout: str) -> Dict[str, Any]:
        """K and V (and their scales) as kv[0] and kv[1] of one storage: the same values, in one allocation."""
        if layout != KV_ONE_STORAGE:
            return super().joint_layout_args(args, layout)
        out = dict(args)
        for k, v in KV_PAIRS:
            if k in args and v in args:
                both = torch.stack([args[k], args[v]])
                out[k], out[v] = both[0], both[1]
        return out

    def domain(self) -> Domain:
        return decode_domain()

    def bucket(self, shape):
        return decode_bucket(shape)

    def shape_of(self, args: Mapping[str, Any]) -> DecodeShape:
        """ctx is the block table's capacity (blocks x block size), the longest context it can address."""
        q, k = args["q"], args["k_cache"]
        B, Hq, D = (int(x) for x in q.shape)
        bs = int(k.shape[1])
        return DecodeShape(B, Hq, int(k.shape[2]), D, bs, int(args["block_table"].shape[1]) * bs)

    def flops(self, shape):
        return decode_flops(shape)

    def config_args(self, shape: DecodeShape, device) -> tuple:
        # the wrapper passes the block table's capacity: its columns (table_columns) in tokens
        return (shape.B, shape.Hkv, table_columns(shape) * shape.block_size, device)

    def bench_anchor(self, case: Case) -> Optional[Anchor]:
        """SDPA on the cache gathered into contiguous [B, Hkv, L, D] ahead of time (gather not timed). A cache of
        codes with scales (k_scale, v_scale) is dequantized to the query's dtype: the anchor is then bf16/fp16
        SDPA decode."""
        a = case.args
        lens = [int(x) for x in a["seq_lens"].tolist()]
        if len(set(lens)) != 1:
            raise ValueError("the SDPA decode anchor needs equal sequence lengths (serving shapes)")
        L, B, dt = lens[0], a["q"].shape[0], a["q"].dtype

        # float32 first: exact for a 16-bit cache, the dequantized values for codes
        kvs = [gather_kv(a, b, L, torch.float32) for b in range(B)]
        k, v = (torch.stack([x[i] for x in kvs]).to(dt).permute(0, 2, 1, 3).contiguous() for i in (0, 1))
        gqa = a["q"].shape[1] != k.shape[1]
        return Anchor(
            "anchor:sdpa-decode",
            lambda **kw: F.scaled_dot_product_attention(
                kw["q"][:, :, None, :], k, v, scale=kw.get("sm_scale"), enable_gqa=gqa
            )[:, :, 0, :],
        )

    def reference_anchors(self, case: Case) -> List[Anchor]:
        """FlashInfer's paged decode over the same page table (flashinfer_paged.py). A cache of codes is first
        dequantized to the query's dtype, in its paged layout (not timed): FlashInfer's bf16 decode of the same
        values, what the int8 cache competes with."""
        from .flashinfer_paged import FlashInferUnavailable, decode_anchor  # the optional extra

        a = dict(case.args)
        if a.get("k_scale") is not None:
            dt = a["q"].dtype
            a["k_cache"] = (a["k_cache"].float() * a["k_scale"][..., None]).to(dt)
            a["v_cache"] = (a["v_cache"].float() * a["v_scale"][..., None]).to(dt)
        try:
            dec = decode_anchor(a)
        except FlashInferUnavailable as e:
            raise ReferenceUnavailable(f"flashinfer: {e}") from None
        k, v = a["k_cache"], a["v_cache"]
        return [Anchor(f"anchor:{dec.label}", lambda **kw: dec.run(kw["q"], k, v))]

    def reference(self, args, precision=torch.float32):
        return paged_reference(args, precision)

    def integer_changes(self, args: Mapping[str, Any], gen: torch.Generator) -> List[IntegerChange]:
        """The longest sequence cut short inside its pages, and one block-table entry of a full page pointed at
        another sequence's full page (or another of its own): the output follows both, by contract."""
        lens = [int(x) for x in args["seq_lens"].tolist()]
        bs = int(args["k_cache"].shape[1])
        table = args["block_table"]
        out = []
        b = max(range(len(lens)), key=lambda i: lens[i])
        if lens[b] > 1:
            n = 1 + int(torch.randint(0, lens[b] - 1, (1,), generator=gen))
            out.append(IntegerChange(f"seq_lens[{b}] {lens[b]} -> {n}", lambda a: a["seq_lens"].__setitem__(b, n)))
        full = [(s, i) for s, length in enumerate(lens) for i in range(length // bs)]
        if len(full) >= 2:
            s, i = full[int(torch.randint(0, len(full), (1,), generator=gen))]
            others = [(t, j) for t, j in full if int(table[t, j]) != int(table[s, i]) and (t != s or len(lens) == 1)]
            if others:
                t, j = others[int(torch.randint(0, len(others), (1,), generator=gen))]
                page = int(table[t, j])
                out.append(
                    IntegerChange(
                        f"block_table[{s}, {i}] {int(table[s, i])} -> {page}",
                        lambda a: a["block_table"].__setitem__((s, i), page),
                    )
                )
        return out

    def class_corners(self, args: Mapping[str, Any]) -> List[Tuple[str, Dict[str, Any]]]:
        """Sequence 0 fills its whole block table (seq_lens[0] = columns x page size, no spare column), over the
        pool's last pages in order (the highest ids: past 2^31 elements in a pool that large, past any bit mask
        a drawn pool leaves whole), the other sequences as they were (sharing a page is allowed). A real pool's
        unused pages hold anything (NaN in the drawn ones): each of those last pages that no sequence of `args`
        reads gets a copy of one of sequence 0's own pages, written into `args`'s caches in place (the call's
        output cannot change: it reads none of them), and the corner's last token a key its query attends to
        (`_needle_at`), so that the tail of the long sequence carries the output."""
        table, k = args["block_table"], args["k_cache"]
        columns, pool, page = int(table.shape[1]), int(k.shape[0]), int(k.shape[1])
        if columns == 0 or pool == 0:
            return []
        last = [(pool - columns + i) % pool for i in range(columns)]
        lens = [int(x) for x in args["seq_lens"].tolist()]
        read = {int(p) for b, n in enumerate(lens) for p in table[b, : -(-n // page)].tolist()}
        own = [int(p) for p in table[0, : -(-lens[0] // page)].tolist()]
        for i, p in enumerate(last):
            if p not in read:
                for name in ("k_cache", "v_cache", "k_scale", "v_scale"):
                    if isinstance(args.get(name), torch.Tensor):
                        args[name][p] = args[name][own[i % len(own)]]
        if last[-1] not in read:
            _needle_at(args, last[-1], (columns * page - 1) % page)
        corner_table = _same_layout(table)
        corner_table[0] = torch.tensor(last, dtype=table.dtype)
        corner_lens = _same_layout(args["seq_lens"])
        corner_lens[0] = columns * page
        return [
            (
                f"sequence 0 fills its {columns}-page table with the pool's last pages (ids up to {last[-1]})",
                {**args, "block_table": corner_table, "seq_lens": corner_lens},
            )
        ]

    def element_bounds(self, args):
        """Each output element against its own softmax's rounding over the sequence's gathered cache
        (softmax_rounding_bound), with the rms-based bound as well. A cache of codes is bounded with its values
        (codes times scales); a kernel may fold the value scales into the probabilities before rounding them,
        so their underflow counts with what multiplies them after (int8_underflow_floor)."""
        q = args["q"].detach().to(torch.float64)
        B, Hq, D = q.shape
        Hkv = args["k_cache"].shape[2]
        g = Hq // Hkv
        sm_scale = args.get("sm_scale")
        scale = 1.0 / math.sqrt(D) if sm_scale is None else float(sm_scale)
        cond = torch.empty_like(q)
        # a block of same-length sequences at a time, every kv head with its query group, the group's g query
        # heads as the rows of one query (each row's bound is its own softmax's): [n, Hkv, g, D] queries against
        # [n, Hkv, L, D] keys and values, batch dimensions equal (a broadcast one would be copied by matmul)
        for length, seqs in same_length_blocks(args):
            k, v, v_s = gather_kv_of(args, seqs, length, torch.float64)  # [n, L, Hkv, D]
            floor = None
            if v_s is not None:
                codes = gather_tokens_of(args["v_cache"], args["block_table"], seqs, length).to(torch.float64)
                floor = int8_underflow_floor(codes, v_s).permute(0, 2, 1, 3).contiguous()
            n = len(seqs)
            bound = softmax_rounding_bound(
                q[seqs].view(n, Hkv, g, D),
                k.permute(0, 2, 1, 3).contiguous(),
                v.permute(0, 2, 1, 3).contiguous(),
                scale,
                None,
                args["q"].dtype,
                floor,
            )
            cond[seqs] = bound.reshape(n, Hq, D)
        return ElementBound(cond, SOFTMAX_BOUND_TOL, "softmax rounding bound", with_rms=True)

    @staticmethod
    def tokens(shape: DecodeShape) -> float:
        """Cached tokens a call reads: all of them at serving shapes, half on average when ragged."""
        return shape.B * (shape.ctx if not shape.ragged else (shape.ctx + 1) / 2)

    def _check_heads(self, shape: DecodeShape) -> None:
        if shape.Hq % shape.Hkv:
            raise ValueError(f"{self.name}: Hq={shape.Hq} is not a multiple of Hkv={shape.Hkv}")
