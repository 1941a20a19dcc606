#!/usr/bin/env bash
# The catalog's structural moves (docs/REWRITES.md) against the incumbent on a GPU machine: each move applied
# to its op's baseline, then `kernel-agent bench` times it beside the baseline and the torch anchor, at the
# shapes where the move's bucket test holds (where the search tries it first) and at a serving shape where it
# should change nothing or little. Nothing is recorded in a ledger; the JSON documents and tables come back
# in OUTDIR. Last, a block shape past the configuration grid (agent/search.py past_grid_neighbours).
# Usage: bash scripts/gpu_moves.sh OUTDIR   [BENCH_TIMEOUT=300 PROCESSES=2]
set -u
OUT=$1
mkdir -p "$OUT/moves"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 KERNEL_AGENT_CACHE=${KERNEL_AGENT_CACHE:-/tmp/ka-moves-cache}
unset TRITON_INTERPRET
# decode: B * Hkv * 16 < 264 at a long context (the cap of 16 splits leaves SMs idle), then the serving batch
DECODE="1,32,8,128,16,131072;2,32,8,128,16,32768;2,8,1,128,16,131072;1,64,8,128,16,32768;32,32,8,128,16,8192"
# matmul: decode-sized M over long K (Llama-3-8B's projections at M = 1, 16, 64), then a large square
MATMUL="1,4096,4096;16,4096,14336;16,28672,4096;64,8192,8192;1,8192,8192;4096,4096,4096"
bench() {  # op name shapes: times $OUT/moves/<op>_<name>.py beside the baseline and the anchor
  echo "== $1 $2 ($(date +%T))"
  timeout "${BENCH_TIMEOUT:-300}" python3 -m kernel_agent.agent.cli bench --op "$1" --shapes "$3" --dtype bfloat16 \
    --no-ledger --processes "${PROCESSES:-2}" --out "$OUT/$1_$2.json" "$OUT/moves/$1_$2.py" > "$OUT/$1_$2.txt" 2>&1
  echo "bench exit $?"
  tail -n 30 "$OUT/$1_$2.txt"
}
run_move() {  # op move shapes
  python3 -c "import sys; from kernel_agent.agent.rewrites import apply_rewrite, target_for
from kernel_agent.agent.search import baseline_source
sys.stdout.write(apply_rewrite('$2', baseline_source('$1'), target_for('$1')))" > "$OUT/moves/$1_$2.py" &&
    bench "$1" "$2" "$3"
}
run_move decode_attention kv-splits-wide "$DECODE"
run_move decode_attention_int8 kv-splits-wide "$DECODE"
run_move matmul split-k-waves "$MATMUL"
# int8 byte planes past powers of two: D = 96 (Phi-3, a serving shape) and 80, then D = 128 (unchanged: the control)
run_move decode_attention_int8 planes-padded "32,32,32,96,16,8192;32,32,8,96,16,8192;32,32,8,80,16,8192;32,32,8,128,16,8192"
# a block shape past the grid: the bf16 decode at D = 64 takes 128-token tiles, the grid's largest; 256 past it
PAST_GRID_SHAPE="32,32,8,64,16,8192"
python3 - "$OUT/moves/decode_attention_past-grid.py" "$PAST_GRID_SHAPE" <<'PY' && bench decode_attention past-grid "$PAST_GRID_SHAPE"
import sys
from kernel_agent.agent.search import baseline_config, baseline_source, past_grid_neighbours, with_config
from kernel_agent.ops import get_op
op = get_op("decode_attention")
shape = op.parse_shape(sys.argv[2])
base = baseline_config(op.name, shape)
past = past_grid_neighbours(op.tuning_space, base, [shape])[0]
print("past the grid:", base, "->", past)
with open(sys.argv[1], "w") as f:
    f.write(with_config(baseline_source(op.name), base, past, op.bucket(shape), op.tuning_space))
PY
