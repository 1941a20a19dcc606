#!/usr/bin/env bash
# The second benchmark run of every op at the serving shapes (the first: scripts/gpu_foundation.sh),
# then the int8 baseline (byte planes) against the per-code kernel it replaced and bf16 SDPA decode.
# Usage: bash scripts/gpu_bench_twice.sh OUTDIR
set -u
OUT=$1
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KERNEL_AGENT_LEDGER=${KERNEL_AGENT_LEDGER:-/tmp/ka/ledger.db}
timeout 240 python3 -m kernel_agent.agent.cli bench --op all --shapes serving --out "$OUT/bench_run2.json" > "$OUT/bench_run2.txt" 2>&1
timeout 60 python3 -m kernel_agent.agent.cli bench --op decode_attention_int8 \
  tests/candidates/good/decode_attention_int8/per_code_reads.py --out "$OUT/bench_int8_per_code.json" > "$OUT/bench_int8_per_code.txt" 2>&1
tail -n 40 "$OUT/bench_run2.txt"; tail -n 8 "$OUT/bench_int8_per_code.txt"
