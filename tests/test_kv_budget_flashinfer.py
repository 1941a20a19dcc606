"""The KV-budget arithmetic of `bench --model --kv-budget`, and FlashInfer as an optional reference: without
the extra, its stack and its bench row say so in one line and nothing fails."""

import subprocess
import sys

import pytest
import torch

from kernel_agent.harness.bench import bench
from kernel_agent.harness.workload.model_step import (
    PRESETS,
    ModelConfigError,
    available_stacks,
    cache_bytes_per_token,
    kv_budget_points,
    parse_bytes,
)
from kernel_agent.ops import get_op
from kernel_agent.ops.flashinfer_paged import FlashInferUnavailable, version

LLAMA = PRESETS["llama-3-8b"]
no_flashinfer = pytest.mark.skipif(version() is not None, reason="FlashInfer is installed here")


def test_cache_bytes_per_token_counts_every_layer_k_and_v_and_the_int8_scales():
    # 32 layers x (K, V) x 8 KV heads x 128 dims x 2 bytes
    assert cache_bytes_per_token(LLAMA, "bf16") == 32 * 2 * 8 * 128 * 2
    # int8: one byte per code plus a float32 scale per (token, KV head)
    assert cache_bytes_per_token(LLAMA, "int8") == 32 * 2 * 8 * (128 + 4)


def test_a_60_gib_budget_holds_60_bf16_and_116_int8_sequences_of_8k_tokens():
    points = kv_budget_points(LLAMA, parse_bytes("60GiB"), 8192)
    assert (points["bf16"].batch, points["int8"].batch) == (60, 116)
    assert {p.context for p in points.values()} == {8192}


def test_a_context_that_is_not_whole_pages_is_charged_whole_pages():
    # 8193 tokens take 513 pages of 16: the budget holds one sequence fewer than 60 at 8192
    assert kv_budget_points(LLAMA, parse_bytes("60GiB"), 8193)["bf16"].batch == 59


def test_a_budget_that_holds_no_sequence_is_one_line():
    with pytest.raises(ModelConfigError, match="holds no sequence"):
        kv_budget_points(LLAMA, parse_bytes("512MiB"), 8192)


@pytest.mark.parametrize(
    "text,expected",
    [("60GiB", 60 << 30), ("60G", 60 << 30), ("512MiB", 512 << 20), ("1.5TiB", int(1.5 * (1 << 40))), ("4096", 4096)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "60x", "-1GiB", "0GiB", "GiB"])
def test_parse_bytes_refuses_what_is_not_a_size(text):
    with pytest.raises(ModelConfigError, match="bad memory size"):
        parse_bytes(text)


@no_flashinfer
def test_without_flashinfer_its_stack_is_left_out_with_one_line():
    lines = []
    assert available_stacks(("torch", "flashinfer", "serving"), lines.append) == ("torch", "serving")
    assert len(lines) == 1 and "not installed" in lines[0] and "kernel-agent[flashinfer]" in lines[0]


@no_flashinfer
def test_without_flashinfer_the_bench_row_is_one_line_and_the_other_contenders_stay():
    op = get_op("decode_attention")
    case = op.make_case(op.shapes("tiny")[0], torch.float16, seed=0)
    with pytest.raises(FlashInferUnavailable):
        from kernel_agent.ops.flashinfer_paged import decode_anchor

        decode_anchor(case.args)
    results = {}
    assert bench._reference_contenders(op, case, results) == []
    ((label, m),) = results.items()
    assert label == "anchor:flashinfer" and "not installed" in m.error and "\n" not in m.error


def test_ops_without_a_serving_engine_reference_have_none():
    op = get_op("matmul")
    assert op.reference_anchors(op.make_case(op.shapes("tiny")[0], torch.float32, seed=0)) == []


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--kv-budget", "60x"], "bad memory size"),
        (["--kv-budget", "60GiB", "--points", "32x8192"], "the budget sets the batch"),
        (["--kv-budget", "60GiB", "--batch", "8"], "the budget sets the batch"),
        (["--stacks", "torch,flashinfr"], "flashinfr"),
    ],
)
def test_bench_model_budget_flags_are_checked_in_one_line(flags, message):
    r = subprocess.run(
        [sys.executable, "-m", "kernel_agent.agent.cli", "bench", "--model", "llama-3-8b"] + flags,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize(
    "names,backend",
    [
        (["cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma"], "cuDNN"),
        (["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>"], "flash"),
        (["fmha_cutlassF_bf16_aligned_64x128_rf_sm80"], "memory-efficient"),
        (["ampere_bf16_s16816gemm", "softmax_warp_forward"], "math"),
        ([], "unknown (no kernel seen)"),
    ],
)
def test_the_sdpa_backend_is_named_from_the_kernels_that_ran(names, backend):
    assert bench.sdpa_backend(names) == backend
