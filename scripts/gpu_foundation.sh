#!/usr/bin/env bash
# The GPU script of the Foundation: on a GPU machine with torch and triton preinstalled,
#   1. the sanitizer's GPU checks on every baseline (the differential suite compiled for the device at
#      tiny odd shapes and every serving shape, compute-sanitizer memcheck/initcheck/racecheck, bitwise
#      determinism; the CPU checks run too),
#   2. every baseline timed against its torch anchor at the serving shapes (DESIGN.md section 4 protocol),
#   3. the table of results/FOUNDATION.md (printed last).
# Usage: bash scripts/gpu_foundation.sh OUTDIR
set -u
OUT=${1:-results/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
ka() { python3 -m kernel_agent.agent.cli "$@"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
for op in matmul attention decode_attention quantize_kv decode_attention_int8; do
  timeout "${SANITIZE_TIMEOUT:-330}" python3 -m kernel_agent.agent.cli sanitize --op $op kernels/baseline/$op.py \
    --gpu on --json --timeout 320 > "$OUT/sanitize_$op.json" 2> "$OUT/sanitize_$op.log" &
done
wait
timeout "${BENCH_TIMEOUT:-420}" python3 -m kernel_agent.agent.cli bench --op all --shapes serving \
  --out "$OUT/bench.json" --no-ledger > "$OUT/bench.txt" 2>&1
tail -n 40 "$OUT/bench.txt"
python3 scripts/foundation_table.py "$OUT"
