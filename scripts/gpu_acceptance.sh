#!/usr/bin/env bash
# The acceptance runs on a GPU machine (torch and triton preinstalled), in one command of under
# ten minutes, steps in order of priority (each capped):
#   1. every op benchmarked at the serving shapes (the second of two runs; the first is the
#      Foundation's, results/bench_run1.json);
#   2. an int8 variant (evict-first hints) promoted by hand through the rule (full sanitizer with the
#      GPU checks, benchmark against the incumbent, install into the serving set);
#   3. serving-style calls through serving.get(op) at every serving shape, differential-checked;
#   4. the code-model path through a loopback scripted endpoint (429, a good rewrite, a cheat, a
#      refusal, a 500, a truncated reply, a wrong op);
#   5. a time-boxed run of the built-in search proposer over three ops.
# State (ledger, serving set, candidates) lives in $KA and comes back in OUTDIR/state.tgz.
# Usage: bash scripts/gpu_acceptance.sh OUTDIR
set -u
OUT=$1
mkdir -p "$OUT"
export KA=${KA:-/tmp/ka}
mkdir -p "$KA/serving"
export KERNEL_AGENT_LEDGER=$KA/ledger.db KERNEL_AGENT_SERVING_DIR=$KA/serving PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
[ -e "$KA/serving/manifest.json" ] || echo '{"version": 1, "entries": []}' > "$KA/serving/manifest.json"
ka() { python3 -m kernel_agent.agent.cli "$@"; }
step() { echo; echo "=== $* ($(date +%T))"; }
step 1 bench, second run
timeout 150 python3 -m kernel_agent.agent.cli bench --op all --shapes serving --out "$OUT/bench_run2.json" > "$OUT/bench_run2.txt" 2>&1
tail -n 28 "$OUT/bench_run2.txt"
step 2 promote by hand: int8 decode with evict-first hints
timeout 150 python3 -m kernel_agent.agent.cli promote --op decode_attention_int8 \
  tests/candidates/good/decode_attention_int8/evict_first_hint.py \
  --reason "evict-first hints on the streaming cache loads" 2>&1 | tail -n 12
step 3 serving-style calls through the API
timeout 60 python3 scripts/serving_check.py 2>&1 | tail -n 16
step 4 code-model path through a loopback scripted endpoint
(cd scripts/loopback && exec python3 ../../tests/openai_stub.py --script int8_demo.json --port 8765) > "$OUT/stub.log" 2>&1 &
sleep 2
timeout 100 python3 -m kernel_agent.agent.cli run --proposer model --base-url http://127.0.0.1:8765/v1 --model scripted \
  --ops decode_attention_int8 --candidates 3 --per-round 3 --jobs 8 --time-limit 60s \
  --candidates-dir "$KA/candidates" 2>&1 | tail -n 14
step 5 search proposer over three ops, time-boxed
timeout 200 python3 -m kernel_agent.agent.cli run --proposer search --ops quantize_kv,decode_attention,decode_attention_int8 \
  --candidates 4 --per-round 1 --jobs 8 --time-limit 60s --candidates-dir "$KA/candidates" 2>&1 | tail -n 16
step history; ka history --limit 10 2>&1 | tail -n 8
tar czf "$OUT/state.tgz" -C "$KA" . 2>/dev/null
echo done
