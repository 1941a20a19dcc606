#!/usr/bin/env bash
# The benchmark/serving checks on a GPU machine (torch and triton preinstalled), in one command of
# under ten minutes when it does one bench run (RUNS=N), steps chosen by STEPS (default "bench tests"):
#   bench: `kernel-agent bench --op all --shapes serving` twice, as two processes back to back on a
#          quiet host (bench_run3.json, bench_run4.json: do the medians agree within the reported
#          spread?). Nothing else runs meanwhile: a busy host CPU slows the launches of small kernels.
#   tests: the pytest tests marked `gpu` (tests/test_gpu.py), then serving-style calls through
#          serving.get(op) over the committed serving set at every serving shape, differential-checked.
# Prints the agreement table last.
# BENCH_ARGS: extra `bench` options, e.g. "--processes 2" (each shape timed by two processes; the
# spread then includes their difference; twice the time: raise BENCH_TIMEOUT, 540 s by default; one run of
# the serving suite took 340 s on the H200 since it has the shapes of any head dim and page size, so two
# runs, the default, take two commands: RUNS=3, then RUNS=4).
# SERVING_EXTRA: shapes the serving check adds to the serving suite (serving_check.py --extra).
# RUNS: the numbers of the bench runs (default "3 4": bench_run3.json and bench_run4.json).
# OPS: the ops benched (default all), e.g. OPS=decode_attention,decode_attention_int8: their serving shapes only.
# Usage: [STEPS="bench"] [BENCH_ARGS=...] [RUNS=...] [OPS=...] bash scripts/gpu_checks.sh OUTDIR
set -u
OUT=$1
STEPS=${STEPS:-bench tests}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export KERNEL_AGENT_CACHE=${KERNEL_AGENT_CACHE:-/tmp/ka/cache} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
echo "start $(date +%T)"
if [[ " $STEPS " == *" bench "* ]]; then
  for i in ${RUNS:-3 4}; do
    rm -f "$OUT/bench_run$i.txt"
    for op in $(echo "${OPS:-all}" | tr ',' ' '); do  # one op at a time: each writes its own JSON
      out=$OUT/bench_run$i.json; [ "${OPS:-all}" = all ] || out=$OUT/bench_run${i}_$op.json
      timeout "${BENCH_TIMEOUT:-540}" python3 -m kernel_agent.agent.cli bench --op "$op" --shapes serving --no-ledger \
        ${BENCH_ARGS:-} --out "$out" >> "$OUT/bench_run$i.txt" 2>&1
      echo "bench run $i ($op): exit $? ($(date +%T))"
    done
  done
fi
if [[ " $STEPS " == *" tests "* ]]; then
  timeout 300 python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider \
    --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $? ($(date +%T))"
  KERNEL_AGENT_SERVING_DIR=$PWD/kernels/serving timeout 90 python3 scripts/serving_check.py --extra "${SERVING_EXTRA:-}" > "$OUT/serving_check.txt" 2>&1
  echo "serving check: exit $? ($(date +%T))"
  echo; tail -n 3 "$OUT/gpu_tests.txt"; echo; cat "$OUT/serving_check.txt"
fi
set -- ${RUNS:-3 4}
if [ $# -ge 2 ] && [ -e "$OUT/bench_run$2.json" ]; then
  echo; python3 scripts/foundation_table.py "$OUT/bench_run$1.json" "$OUT/bench_run$2.json" | sed -n '/Run twice/,/^$/p'
fi
