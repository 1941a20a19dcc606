#!/usr/bin/env bash
# A time-boxed `kernel-agent run` of the built-in search proposer on a GPU machine, over three ops,
# starting from the committed serving set, evaluating on every GPU of the machine (one child each).
# State (ledger, serving set, candidates) comes back in OUTDIR/state.tgz; run.txt is what it printed.
# SEED_LEDGER: start from a copy of an earlier run's ledger; what it recorded is replayed, not re-timed.
# SHAPES: the run's --shapes (default serving), e.g. 'matmul:128,8192,8192;matmul:256,4096,14336'.
# Usage: bash scripts/gpu_search_run.sh OUTDIR
#        [TIME_LIMIT=200s RUN_TIMEOUT=480 OPS=... SHAPES=... PER_ROUND=2 JOBS=12 SEED_LEDGER=...]
set -u
OUT=$1
mkdir -p "$OUT"
export KA=${KA:-/tmp/ka}
rm -rf "$KA/serving"; mkdir -p "$KA"; cp -r kernels/serving "$KA/serving"
export KERNEL_AGENT_LEDGER=$KA/ledger.db KERNEL_AGENT_SERVING_DIR=$KA/serving KERNEL_AGENT_CACHE=$KA/cache
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# a committed ledger may be of an older schema: its copy is upgraded (the committed file stays as it is)
if [ -n "${SEED_LEDGER:-}" ]; then
  cp "$SEED_LEDGER" "$KA/ledger.db" && python3 -m kernel_agent.agent.cli ledger upgrade --no-backup || exit 1
fi
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
echo "start $(date +%T)"
# SIGINT past RUN_TIMEOUT: the run is then marked interrupted and resumable, as with Ctrl-C
timeout -s INT "${RUN_TIMEOUT:-480}" python3 -m kernel_agent.agent.cli run --proposer search \
  --ops "${OPS:-matmul,quantize_kv,decode_attention_int8}" --candidates 80 --per-round ${PER_ROUND:-2} --jobs ${JOBS:-12} --shapes "${SHAPES:-serving}" \
  --time-limit "${TIME_LIMIT:-200s}" --candidates-dir "$KA/candidates" > "$OUT/run.txt" 2>&1
echo "run exit $? ($(date +%T))"
tar czf "$OUT/state.tgz" -C "$KA" ledger.db serving candidates
tail -n 45 "$OUT/run.txt"
python3 -m kernel_agent.agent.cli history --limit 3 2>&1 | tail -n 6
