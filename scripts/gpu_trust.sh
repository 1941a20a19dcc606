#!/usr/bin/env bash
# The trust boundary on a GPU machine, in one command of under ten minutes:
#   sandbox:  what the candidate sandbox gets on this host (`kernel-agent sanitize --sandbox`)
#   probe:    each way out of the GPU sandbox tried, and legitimate GPU work run in it
#             (scripts/gpu_sandbox_probe.py; not in the default STEPS: the tests step runs it --quick)
#   baselines: every baseline through the full sanitizer with the GPU checks (the GPU checks'
#             executors and compute-sanitizer run under the sandbox), timed per file
#   tests:    the GPU tests (tests/test_gpu.py), which include a hostile candidate on the GPU paths; TESTS_K
#             selects a part (pytest -k) when the whole suite does not fit one call
#   run:      a short `kernel-agent run` of the built-in search over all five ops (RUN_LIMIT, 150s)
#   reads:    the legitimate kernel under each narrower GPU rule, with what CUDA was refused
#             (scripts/gpu_sandbox_probe.py --reads)
#   sweep:    the false-positive sweep (scripts/false_positive_sweep.py, full mode, at lowest priority) in the
#             background for SWEEP_S seconds while the other steps run. SWEEPS lists GROUP:SEEDS:JOBS (default
#             "baselines:50:8 good:10:6"); each group's file resumes from
#             SWEEP_FROM/false_positive_sweep_GROUP.jsonl where that exists and lands in DEST under that name
#   alone:    one candidate (ALONE_OP's baseline, default decode_attention_int8) through `sanitize --gpu on`
#             with nothing else on the GPU, timed: the verdict's latency
#             (SWEEP_DETACH=1: in a process session of its own, which outlives the call on a warm machine; the
#             step `sweepstop` of a later call ends it and collects its files)
#   hostile:  HOSTILE's OP:FILE pairs through `sanitize --gpu on`, HOSTILE_JOBS (4) at a time, each verdict's first
#             failed check in the summary
#             (HOSTILE_BESIDE_TESTS=1: at the same time as the tests step instead)
#   guard:    the serving guard on compiled kernels (results/cpu/hostile_round3/run_guard.py --device cuda)
#   guardcost: the serving guard's steady-state cost in `bench --model` (scripts/gpu_guard_cost.py)
# STEPS picks them (default "sandbox baselines tests run"). Prints a summary table last.
# Usage: [STEPS=...] [RUN_LIMIT=150s] bash scripts/gpu_trust.sh OUTDIR
set -u
DEST=$1
STEPS=${STEPS:-sandbox baselines tests run}
OUT=$(mktemp -d /tmp/ka-trust-XXXX)  # everything lands here, then in DEST/trust.tgz (few files travel back)
mkdir -p "$DEST"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export KA=${KA:-/tmp/ka} KERNEL_AGENT_CACHE=${KERNEL_AGENT_CACHE:-/tmp/ka/cache}
CLI="python3 -m kernel_agent.agent.cli"
if ls .whl/sqlalchemy*.whl >/dev/null 2>&1; then  # the ledger's one dependency the GPU image lacks
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/sqlalchemy*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
sweep_pids=()
if [[ " $STEPS " == *" sweep "* ]]; then
  mkdir -p "$KA"
  for spec in ${SWEEPS:-baselines:50:8 good:10:6}; do
    IFS=: read -r group seeds jobs <<< "$spec"
    file=$KA/false_positive_sweep_$group.jsonl
    [ -e "${SWEEP_FROM:-/nonexistent}/false_positive_sweep_$group.jsonl" ] && cp "$SWEEP_FROM/false_positive_sweep_$group.jsonl" "$file"
    touch "$file"
    if [ -n "${SWEEP_DETACH:-}" ]; then  # a session of its own: it outlives this call while the machine stays warm
      # started from a subshell, so that no `wait` of this script waits for it; its pid is its process group's
      ( OMP_NUM_THREADS=1 setsid timeout "${SWEEP_S:-540}" nice -n 19 python3 scripts/false_positive_sweep.py \
          --seeds "$seeds" --kernels "$group" --jobs "$jobs" --timeout 900 --out "$file" \
          --commit "${SWEEP_COMMIT:-unknown}" > "$KA/sweep_$group.txt" 2>&1 < /dev/null &
        echo $! > "$KA/sweep_$group.pid" )
      continue
    fi
    OMP_NUM_THREADS=1 timeout "${SWEEP_S:-540}" nice -n 19 python3 scripts/false_positive_sweep.py --seeds "$seeds" --kernels "$group" \
      --jobs "$jobs" --timeout 900 --out "$file" --commit "${SWEEP_COMMIT:-unknown}" > "$OUT/sweep_$group.txt" 2>&1 &
    sweep_pids+=($!)
  done
fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, sys; print('python', sys.version.split()[0], sys.executable, 'torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
summary=()
if [[ " $STEPS " == *" sandbox "* ]]; then
  $CLI sanitize --sandbox > "$OUT/sandbox.txt" 2>&1; rc=$?
  cat "$OUT/sandbox.txt"; summary+=("sandbox: exit $rc")
fi
if [[ " $STEPS " == *" probe "* ]]; then
  timeout 900 python3 scripts/gpu_sandbox_probe.py > "$OUT/probe.txt" 2>&1; rc=$?
  tail -n 24 "$OUT/probe.txt"; summary+=("sandbox probe: exit $rc: $(tail -n 1 "$OUT/probe.txt")")
fi
if [[ " $STEPS " == *" reads "* ]]; then
  timeout "${READS_TIMEOUT:-300}" python3 scripts/gpu_sandbox_probe.py --reads > "$OUT/reads.txt" 2>&1; rc=$?
  grep -E '^(ok  |FAIL)' "$OUT/reads.txt"; summary+=("narrower GPU rules: exit $rc")
fi
if [[ " $STEPS " == *" baselines "* ]]; then
  for op in matmul attention decode_attention quantize_kv decode_attention_int8; do
    ( t0=$(date +%s)
      timeout 420 $CLI sanitize --op $op kernels/baseline/$op.py --gpu on --json > "$OUT/sanitize_$op.json" 2> "$OUT/sanitize_$op.err"
      echo "sanitize $op (full + gpu, five files at once): exit $?, $(( $(date +%s) - t0 )) s" > "$OUT/sum_$op.txt" ) &
  done
  wait
  for op in matmul attention decode_attention quantize_kv decode_attention_int8; do summary+=("$(cat "$OUT/sum_$op.txt")"); done
fi
if [[ " $STEPS " == *" alone "* ]]; then
  op=${ALONE_OP:-decode_attention_int8}; t0=$(date +%s)
  timeout 420 $CLI sanitize --op "$op" "kernels/baseline/$op.py" --gpu on --json > "$OUT/alone_$op.json" 2> "$OUT/alone_$op.err"
  rc=$?; summary+=("sanitize --gpu on, $op's baseline alone on the GPU: exit $rc, $(( $(date +%s) - t0 )) s")
  python3 -c "
import json, sys
for f in json.load(open(sys.argv[1]))['files']:
    print(' '.join(f\"{c['name']}={c['duration_s']:.0f}s\" for c in f['checks']))" "$OUT/alone_$op.json" | tee "$OUT/alone_checks.txt"
fi
if [[ " $STEPS " == *" guardcost "* ]]; then
  t0=$(date +%s)
  timeout "${GUARD_S:-330}" python3 scripts/gpu_guard_cost.py --out "$OUT/guard_cost.json" > "$OUT/guard_cost.txt" 2>&1
  rc=$?; summary+=("guard cost (bench --model, serving against unguarded): exit $rc, $(( $(date +%s) - t0 )) s")
  grep -E "steady-state cost|promoted by force|Error|error" "$OUT/guard_cost.txt" | head -n 20
  while read -r line; do summary+=("  $line"); done < <(grep "steady-state cost" "$OUT/guard_cost.txt")
fi
if [[ " $STEPS " == *" benchprobe "* ]]; then
  timeout 200 python3 -c "
from kernel_agent.harness.bench.bench_worker import run_bench_isolated
from kernel_agent.ops import get_op
d = run_bench_isolated({'op': 'quantize_kv', 'shapes': [get_op('quantize_kv').shapes('serving')[0].key()], 'dtype': 'bfloat16',
                        'seed': 0, 'kernels': [{'label': 'candidate', 'file': None}]})
print('bench probe: error', d.get('error'), '| refused', d.get('sandbox_refused'))
for r in d.get('results', []):
    for m in r['measurements']:
        print('  ', m['label'], m.get('median_ms'), m.get('graph_ms'), (m.get('error') or '')[:300])
print(d.get('log', '')[-1500:])
" > "$OUT/benchprobe.txt" 2>&1
  head -c 2500 "$OUT/benchprobe.txt"; summary+=("bench probe: $(head -n 1 "$OUT/benchprobe.txt" | cut -c1-200)")
fi
hostile_step() {
  # Hostile candidates through `sanitize --gpu on`, HOSTILE_JOBS at a time: HOSTILE lists OP:FILE pairs
  t0=$(date +%s); i=0
  for spec in ${HOSTILE:-}; do
    IFS=: read -r op file <<< "$spec"; i=$((i + 1)); name=$(basename "$file" .py)
    ( s0=$(date +%s)
      timeout "${HOSTILE_TIMEOUT:-400}" $CLI sanitize --op "$op" "$file" --gpu on --json > "$OUT/hostile_$i.json" 2> "$OUT/hostile_$i.err"
      rc=$?
      verdict=$(python3 -c "
import json, sys
try:
    f = json.load(open(sys.argv[1]))['files'][0]
except Exception as e:
    print('no verdict:', type(e).__name__); raise SystemExit
bad = [c for c in f['checks'] if not c['passed']]
print('PASS' if not bad else 'FAIL ' + bad[0]['name'] + ': ' + (bad[0].get('detail') or '')[:160].replace(chr(10), ' '))" "$OUT/hostile_$i.json")
      echo "hostile $op $name: exit $rc, $(( $(date +%s) - s0 )) s, $verdict" > "$OUT/hostile_sum_$i.txt" ) &
    if (( i % ${HOSTILE_JOBS:-4} == 0 )); then wait; fi
  done
  wait
  for f in "$OUT"/hostile_sum_*.txt; do [ -e "$f" ] && summary+=("$(cat "$f")"); done
  summary+=("hostile step: $(( $(date +%s) - t0 )) s")
}
if [[ " $STEPS " == *" tests "* ]]; then
  # TESTS_K2: a second selection run at the same time as TESTS_K (parts with no timing assertion only)
  t0=$(date +%s)
  if [[ " $STEPS " == *" hostile "* ]] && [ -n "${HOSTILE_BESIDE_TESTS:-}" ]; then
    ( hostile_step; printf '%s\n' "${summary[@]}" > "$OUT/hostile_beside.txt" ) &
  fi
  if [ -n "${TESTS_K2:-}" ]; then
    ( timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -m gpu tests/test_gpu.py -k "$TESTS_K2" --durations=0 \
        -p no:cacheprovider --junitxml="$OUT/gpu_tests2.xml" > "$OUT/gpu_tests2.txt" 2>&1
      echo "gpu tests (second part, beside the first): exit $?, $(( $(date +%s) - t0 )) s: $(tail -n 1 "$OUT/gpu_tests2.txt")" \
        > "$OUT/gpu_tests2_sum.txt" ) &
  fi
  timeout "${TESTS_TIMEOUT:-420}" python3 -m pytest -q -m gpu tests/test_gpu.py ${TESTS_K:+-k "$TESTS_K"} --durations=0 \
    -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.txt" 2>&1
  rc=$?; summary+=("gpu tests: exit $rc, $(( $(date +%s) - t0 )) s: $(tail -n 1 "$OUT/gpu_tests.txt")")
  wait
  [ -e "$OUT/gpu_tests2_sum.txt" ] && summary+=("$(cat "$OUT/gpu_tests2_sum.txt")")
  [ -e "$OUT/hostile_beside.txt" ] && summary=("$(grep -E '^(hostile)' "$OUT/hostile_beside.txt")" "${summary[@]}")
  grep -hE "^(FAILED|ERROR)" "$OUT"/gpu_tests*.txt | cut -c1-300
fi
if [[ " $STEPS " == *" run "* ]]; then
  rm -rf "$KA/serving" "$KA/run"; mkdir -p "$KA/run"; cp -r kernels/serving "$KA/serving"
  t0=$(date +%s)
  KERNEL_AGENT_SERVING_DIR=$KA/serving timeout -s INT 400 $CLI run --proposer search --candidates 12 \
    --time-limit "${RUN_LIMIT:-150s}" --ledger "$KA/run/ledger.db" --candidates-dir "$KA/run/candidates" > "$OUT/run.txt" 2>&1
  rc=$?; summary+=("run, all five ops: exit $rc, $(( $(date +%s) - t0 )) s")
  tail -n 12 "$OUT/run.txt"
  cp "$KA/run/ledger.db" "$OUT/run_ledger.db" 2>/dev/null
fi
if [[ " $STEPS " == *" hostile "* ]] && [ -z "${HOSTILE_BESIDE_TESTS:-}" ]; then
  hostile_step
fi
if [[ " $STEPS " == *" guard "* ]]; then
  # The serving guard on compiled kernels: each round-3 case's first use, in a process of its own
  t0=$(date +%s)
  timeout "${GUARD_TIMEOUT:-300}" python3 results/cpu/hostile_round3/run_guard.py --device cuda --each-in-own-process \
    ${GUARD_CASES:-} > "$OUT/guard.txt" 2>&1
  rc=$?; summary+=("guard on the device: exit $rc, $(( $(date +%s) - t0 )) s"); tail -n 30 "$OUT/guard.txt"
fi
if [[ " $STEPS " == *" sweepstop "* ]]; then  # end a detached sweep; what it judged is already in its file
  for f in "$KA"/sweep_*.pid; do [ -e "$f" ] && kill -- -"$(cat "$f")" 2>/dev/null; done
  sleep 2
  for f in "$KA"/false_positive_sweep_*.jsonl; do
    cp "$f" "$DEST/"; summary+=("sweep $(basename "$f"): $(python3 scripts/false_positive_sweep.py --summary --out "$f" | tail -n 1)")
  done
  cp "$KA"/sweep_*.txt "$OUT/" 2>/dev/null
fi
if [[ ${#sweep_pids[@]} -gt 0 ]]; then
  wait "${sweep_pids[@]}"
  for f in "$KA"/false_positive_sweep_*.jsonl; do
    cp "$f" "$DEST/"; summary+=("sweep $(basename "$f"): $(python3 scripts/false_positive_sweep.py --summary --out "$f" | tail -n 1)")
  done
fi
echo
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
tar czf "$DEST/trust.tgz" -C "$OUT" .
cp "$OUT/summary.txt" "$DEST/"
