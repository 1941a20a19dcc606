#!/usr/bin/env bash
# The second benchmark run of every op at the serving shapes (the first: scripts/gpu_foundation.sh),
# then the int8 baseline against the promoted byte-plane variant and bf16 SDPA decode.
# Usage: bash scripts/gpu_bench_twice.sh OUTDIR
set -u
OUT=$1
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KERNEL_AGENT_LEDGER=${KERNEL_AGENT_LEDGER:-/tmp/ka/ledger.db}
timeout 240 python3 -m kernel_agent.agent.cli bench --op all --shapes serving --out "$OUT/bench_run2.json" > "$OUT/bench_run2.txt" 2>&1
timeout 60 python3 -m kernel_agent.agent.cli bench --op decode_attention_int8 \
  tests/candidates/good/decode_attention_int8/byte_planes.py --out "$OUT/bench_int8_planes.json" > "$OUT/bench_int8_planes.txt" 2>&1
tail -n 40 "$OUT/bench_run2.txt"; tail -n 8 "$OUT/bench_int8_planes.txt"
