"""FlashInfer's paged decode as a reference point for the paged decode ops (the optional `flashinfer` extra).

FlashInfer (flashinfer-python) is what serving engines run for paged decode; its CUDA-core decode kernels
read the same cache layout as this project's contract (NHD: [num_blocks, block_size, Hkv, D], K and V in
separate tensors) through a CSR page table (indptr, indices, last page length), which `PagedDecoder`
builds from the contract's block_table and seq_lens. It is timed beside the kernels (`bench --op
decode_attention`, the `flashinfer` stack of `bench --model`) and never served: the serving set serves
only what the sanitizer judged.

FlashInfer compiles its kernels the first time a shape's module is needed (nvcc and ninja, about 35 s on a
2-core machine for the bf16 decode module). `prebuild` does that in a trusted process and installs the
built modules where FlashInfer looks for ahead-of-time builds, so that sandboxed benchmark children, which
may not write outside their scratch folder, load them without compiling.

Without the extra every entry point raises FlashInferUnavailable with one line saying why.
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any, List, Optional

import torch

INSTALL_HINT = "pip install 'kernel-agent[flashinfer]' (flashinfer-python and apache-tvm-ffi; nvcc for its JIT)"
WORKSPACE_BYTES = 128 << 20  # FlashInfer's scratch for split-KV partial results


class FlashInferUnavailable(RuntimeError):
    """FlashInfer cannot run here (not installed, no GPU, unsupported dtype or head dim): one line."""


def _import():
    try:
        import flashinfer  # the optional extra
    except ImportError as e:
        raise FlashInferUnavailable(f"not installed ({e.name or e}): {INSTALL_HINT}") from None
    except Exception as e:  # noqa: BLE001 - a broken install (a missing CUDA library, a version clash) is one line too
        raise FlashInferUnavailable(f"does not import: {type(e).__name__}: {str(e).splitlines()[0][:160]}") from None
    return flashinfer


def require() -> None:
    """Raise FlashInferUnavailable (one line) unless FlashInfer imports here."""
    _import()


def version() -> Optional[str]:
    """The installed FlashInfer's version, or None without it."""
    try:
        return _import().__version__
    except FlashInferUnavailable:
        return None


class PagedDecoder:
    """FlashInfer's batch decode over one page table: planned once (on the host, outside any timing or CUDA
    graph), then `run(q, k_cache, v_cache)` any number of times, capturable in a CUDA graph (FlashInfer's
    fixed-buffer mode)."""

    def __init__(
        self,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        Hq: int,
        Hkv: int,
        D: int,
        block_size: int,
        dtype: torch.dtype,
        sm_scale: Optional[float] = None,
        tensor_cores: Optional[bool] = None,
    ):
        flashinfer = _import()
        if block_table.device.type != "cuda":
            raise FlashInferUnavailable("needs a CUDA GPU")
        if dtype not in (torch.float16, torch.bfloat16):
            raise FlashInferUnavailable(f"its paged decode takes float16 or bfloat16 caches, not {dtype}")
        if D not in (64, 128, 256):
            raise FlashInferUnavailable(f"its decode kernels are built for head dims 64, 128 and 256, not {D}")
        dev = block_table.device
        lens = seq_lens.to(torch.int64).cpu()
        pages = (lens + block_size - 1) // block_size
        indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(pages, 0)
        table = block_table.cpu()
        # only the pages each sequence owns: entries past them are unspecified by the contract
        indices = torch.cat([table[b, : int(pages[b])] for b in range(len(lens))]).to(torch.int32)
        last = (lens - (pages - 1) * block_size).to(torch.int32)
        self._buffers = [indptr.to(dev), indices.to(dev), last.to(dev)]
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)
        # FlashInfer's CUDA-core decode kernels by default (its decode module builds in seconds); its
        # tensor-core path (the prefill kernels, which it suggests for GQA groups of 4 and more) takes minutes
        # of JIT per head dim and is asked for with tensor_cores=True (KERNEL_AGENT_FLASHINFER_TENSOR_CORES=1)
        env_tc = os.environ.get("KERNEL_AGENT_FLASHINFER_TENSOR_CORES") == "1"
        self.tensor_cores = env_tc if tensor_cores is None else tensor_cores
        self._wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.tensor_cores,
            paged_kv_indptr_buffer=self._buffers[0],
            paged_kv_indices_buffer=self._buffers[1],
            paged_kv_last_page_len_buffer=self._buffers[2],
        )
        self._wrapper.plan(
            *self._buffers,
            Hq,
            Hkv,
            D,
            block_size,
            pos_encoding_mode="NONE",
            q_data_type=dtype,
            kv_data_type=dtype,
            sm_scale=sm_scale,
        )
        self.version = flashinfer.__version__
        self.label = f"flashinfer-{self.version}" + ("-tc" if self.tensor_cores else "")

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        return self._wrapper.run(q, (k_cache, v_cache))


def decode_anchor(args: dict) -> PagedDecoder:
    """A PagedDecoder for a paged decode case's arguments (a bf16/fp16 cache: the caller dequantizes codes)."""
    q, k = args["q"], args["k_cache"]
    return PagedDecoder(
        args["block_table"],
        args["seq_lens"],
        q.shape[1],
        k.shape[2],
        q.shape[2],
        k.shape[1],
        k.dtype,
        args.get("sm_scale"),
    )


def prebuild(head_dims=(128,), dtypes=(torch.bfloat16,), log=print, tensor_cores=(False,)) -> List[str]:
    """Build FlashInfer's decode modules for these head dims and dtypes on this GPU (JIT), and install each
    built module where FlashInfer loads ahead-of-time builds from (its AOT folder), so that any later process
    loads it without compiling. Returns the installed paths."""
    flashinfer = _import()
    from flashinfer.jit import env as jit_env  # the optional extra, imported by _import above

    if not torch.cuda.is_available():
        raise FlashInferUnavailable("needs a CUDA GPU")
    for D in head_dims:
        for dt in dtypes:
            B, page, ctx = 2, 16, 64
            table = torch.arange(B * ctx // page, dtype=torch.int32, device="cuda").view(B, -1)
            lens = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
            for tc in tensor_cores:
                dec = PagedDecoder(table, lens, 8, 8, D, page, dt, tensor_cores=tc)
                cache = torch.zeros(B * ctx // page, page, 8, D, dtype=dt, device="cuda")
                dec.run(torch.zeros(B, 8, D, dtype=dt, device="cuda"), cache, cache)
                torch.cuda.synchronize()
                log(f"flashinfer {flashinfer.__version__}: {dec.label} decode module for D={D} {dt} built")
    installed = []
    jit_dir = jit_env.FLASHINFER_JIT_DIR
    for root, _dirs, files in os.walk(jit_dir):
        for f in files:
            name = os.path.basename(root)
            if f == f"{name}.so":
                dest = jit_env.FLASHINFER_AOT_DIR / name / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(os.path.join(root, f), dest)
                installed.append(str(dest))
    return installed


def main(argv=None) -> int:
    """`python -m kernel_agent.ops.flashinfer_paged [--head-dims 64,128]`: prebuild (see `prebuild`)."""
    ap = argparse.ArgumentParser(description="Build FlashInfer's paged decode modules once, for sandboxed benchmarks")
    ap.add_argument("--head-dims", default="128", help="comma list of head dims (default 128)")
    args = ap.parse_args(argv)
    try:
        for path in prebuild(tuple(int(d) for d in args.head_dims.split(",")), (torch.bfloat16, torch.float16)):
            print(f"installed {path}")
    except FlashInferUnavailable as e:
        print(f"flashinfer: {e}")
        return 2
    return 0


__all__: List[Any] = [
    "FlashInferUnavailable",
    "PagedDecoder",
    "decode_anchor",
    "prebuild",
    "require",
    "version",
    "INSTALL_HINT",
]


if __name__ == "__main__":
    raise SystemExit(main())
