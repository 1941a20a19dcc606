#!/usr/bin/env bash
# The overnight job's throughput on a GPU machine: `kernel-agent run` over all five ops with the
# built-in search and default flags except the time limit, then `--resume` of the same run, then the
# table of scripts/throughput.py (time to the first benchmark, judged per GPU-hour, GPU occupancy,
# how far past its limit each session ended, what was left unjudged and finished by the resume).
# The run starts from the committed serving set (a copy: nothing here changes the checkout).
# Usage: [TIME_LIMIT=10m] [RESUME_LIMIT=] [RESUME=0: no resume] bash scripts/gpu_throughput.sh OUTDIR
#   OUTDIR/run.txt, resume.txt: what the commands printed; wall.txt: each command's wall time;
#   throughput.txt/.json: the table; state.tgz: the ledger and the serving set after the run.
set -u
OUT=$1
mkdir -p "$OUT"
export KA=${KA:-/tmp/ka-throughput}
rm -rf "$KA"; mkdir -p "$KA"; cp -r kernels/serving "$KA/serving"
export KERNEL_AGENT_LEDGER=$KA/ledger.db KERNEL_AGENT_SERVING_DIR=$KA/serving KERNEL_AGENT_CACHE=$KA/cache
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
CLI="python3 -m kernel_agent.agent.cli"
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
t0=$(date +%s.%N)
$CLI run --time-limit "${TIME_LIMIT:-10m}" --candidates-dir "$KA/candidates" > "$OUT/run.txt" 2>&1
rc=$?
t1=$(date +%s.%N)
echo "run: exit $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s from the command's start to its exit (limit ${TIME_LIMIT:-10m})" > "$OUT/wall.txt"
RUN=$(grep -o -m1 'run r[0-9-]*[a-f0-9]*' "$OUT/run.txt" | awk '{print $2}')
if [ "${RESUME:-1}" != 0 ]; then
  t0=$(date +%s.%N)
  $CLI run --resume "$RUN" ${RESUME_LIMIT:+--time-limit "$RESUME_LIMIT"} > "$OUT/resume.txt" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "resume: exit $rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s" >> "$OUT/wall.txt"
fi
python3 scripts/throughput.py report "$KERNEL_AGENT_LEDGER" "$RUN" --json "$OUT/throughput.json" > "$OUT/throughput.txt" 2>&1
tar czf "$OUT/state.tgz" -C "$KA" ledger.db serving
cat "$OUT/machine.txt" "$OUT/wall.txt"
tail -n 25 "$OUT/run.txt"
[ -e "$OUT/resume.txt" ] && tail -n 12 "$OUT/resume.txt"
cat "$OUT/throughput.txt"
