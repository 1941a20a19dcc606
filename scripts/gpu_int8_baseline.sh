#!/usr/bin/env bash
# The int8 baseline (byte planes) confirmed on a GPU machine, in one command of under ten minutes (the default
# steps; the tests step is a second command: STEPS=tests):
#   sanitize: `kernel-agent sanitize --gpu on` of kernels/baseline/decode_attention_int8.py (the full CPU checks
#             and the GPU ones: gpu_differential draws bf16 on the device, gpu_domain the pools past 2^31
#             elements; one merged verdict), sanitize_gpu.json;
#   bench:    `kernel-agent bench --op decode_attention_int8` of the per-code kernel it replaced
#             (tests/candidates/good/decode_attention_int8/per_code_reads.py) against the baseline and the torch
#             anchor, at the serving shapes (bench_serving.json) and at the two other decode points of
#             `bench --model` (B=8 ctx 32k, B=64 ctx 2k; bench_points.json);
#   tests:    the GPU tests that the change touches (tests/test_gpu.py): the benchmark-only cheat timed against
#             the per-code kernel, the baseline over the GPU regions of the domain, the bf16-only fault (built on
#             the per-code kernel) still failing gpu_differential, the committed serving set.
# Prints a short table last and writes int8_baseline_summary.json (scripts/int8_baseline_summary.py).
# Usage: [STEPS="sanitize bench" | STEPS=tests] bash scripts/gpu_int8_baseline.sh OUTDIR   (OUTDIR defaults to $OUT)
set -u
OUT=${1:-${OUT:?usage: bash scripts/gpu_int8_baseline.sh OUTDIR}}
STEPS=${STEPS:-sanitize bench}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export KERNEL_AGENT_LEDGER=${KERNEL_AGENT_LEDGER:-/tmp/ka/ledger.db}
mkdir -p "$(dirname "$KERNEL_AGENT_LEDGER")"
BASELINE=kernels/baseline/decode_attention_int8.py
PER_CODE=tests/candidates/good/decode_attention_int8/per_code_reads.py
POINTS='B=8,Hq=32,Hkv=8,D=128,block_size=16,ctx=32768;B=64,Hq=32,Hkv=8,D=128,block_size=16,ctx=2048'
ka() { python3 -m kernel_agent.agent.cli "$@"; }
step() { echo; echo "=== $* ($(date +%T))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -n 2

if [[ " $STEPS " == *" sanitize "* ]]; then
  step sanitize --gpu on "$BASELINE"
  timeout 400 python3 -m kernel_agent.agent.cli sanitize --gpu on --jobs 1 --timeout 390 \
    --op decode_attention_int8 "$BASELINE" --json > "$OUT/sanitize_gpu.json" 2> "$OUT/sanitize_gpu.err"
  echo "rc=$?"; tail -n 5 "$OUT/sanitize_gpu.err"
fi
if [[ " $STEPS " == *" bench "* ]]; then
  step bench: the per-code kernel against the baseline, serving shapes
  timeout 110 python3 -m kernel_agent.agent.cli bench --op decode_attention_int8 "$PER_CODE" --shapes serving \
    --dtype bfloat16 --out "$OUT/bench_serving.json" > "$OUT/bench_serving.txt" 2>&1
  echo "rc=$?"; tail -n 12 "$OUT/bench_serving.txt"
  step bench: the same at B=8 ctx 32k and B=64 ctx 2k
  timeout 60 python3 -m kernel_agent.agent.cli bench --op decode_attention_int8 "$PER_CODE" --shapes "$POINTS" \
    --dtype bfloat16 --out "$OUT/bench_points.json" > "$OUT/bench_points.txt" 2>&1
  echo "rc=$?"; tail -n 6 "$OUT/bench_points.txt"
fi
if [[ " $STEPS " == *" tests "* ]]; then
  step GPU tests the change touches
  timeout 540 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
    -k "decode_attention_int8 and (benchmark_only_cheats or gpu_regions or faults_the_interpreter) or committed_serving_set" \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "rc=$?"; tail -n 8 "$OUT/gpu_tests.txt"
fi

if [[ " $STEPS " == *" sanitize "* || " $STEPS " == *" bench "* ]]; then
  step summary
  benches=()
  for f in "$OUT/bench_serving.json" "$OUT/bench_points.json"; do [ -s "$f" ] && benches+=(--bench "$f"); done
  if [ -s "$OUT/sanitize_gpu.json" ] && [ ${#benches[@]} -gt 0 ]; then
    python3 scripts/int8_baseline_summary.py --sanitize "$OUT/sanitize_gpu.json" "${benches[@]}" \
      --out "$OUT/int8_baseline_summary.json"
  else
    echo "no summary: the sanitize or bench step did not write its document (STEPS=\"$STEPS\")"
  fi
fi
