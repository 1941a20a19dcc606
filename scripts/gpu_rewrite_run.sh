#!/usr/bin/env bash
# The catalog's must-show on a GPU machine: first each baseline's sm_90 compile profile under the machine's
# Triton (what the diagnosis and the compile screen read: registers, spills, shared memory, programs),
# then the README's default `kernel-agent run` (built-in search, 10 candidates over the five ops) from a
# copy of the committed serving set, then `show` (the diagnoses, what was pruned and why) and `report`.
# State (ledger, serving set, candidates, report) comes back in OUTDIR/state.tgz.
# Usage: bash scripts/gpu_rewrite_run.sh OUTDIR   [RUN_TIMEOUT=2400 SEED_LEDGER=...]
set -u
OUT=$1
mkdir -p "$OUT"
export KA=${KA:-/tmp/ka-rewrite}
rm -rf "$KA"; mkdir -p "$KA"; cp -r kernels/serving "$KA/serving"
export KERNEL_AGENT_LEDGER=$KA/ledger.db KERNEL_AGENT_SERVING_DIR=$KA/serving KERNEL_AGENT_CACHE=$KA/cache
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
if [ -n "${SEED_LEDGER:-}" ]; then
  cp "$SEED_LEDGER" "$KA/ledger.db" && python3 -m kernel_agent.agent.cli ledger upgrade --no-backup || exit 1
fi
python3 - > "$OUT/profiles.txt" 2>&1 <<'EOF'
from kernel_agent.agent.search import baseline_source
from kernel_agent.harness.bench.compile_probe import profile_source
from kernel_agent.ops import OPS
for name, op in OPS.items():
    p = profile_source(baseline_source(name), name, [s.key() for s in op.shapes("serving")], "bfloat16")
    print(name, p.error or "", f"{p.wall_s:.1f}s")
    for x in p.launches:
        print("  ", x)
EOF
cat "$OUT/profiles.txt"
echo "start $(date +%T)"
timeout -s INT "${RUN_TIMEOUT:-2400}" python3 -m kernel_agent.agent.cli run --candidates-dir "$KA/candidates" \
  > "$OUT/run.txt" 2>&1
echo "run exit $? ($(date +%T))"
RUN=$(python3 -m kernel_agent.agent.cli history --limit 1 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['runs'][0]['id'])")
python3 -m kernel_agent.agent.cli show "$RUN" > "$OUT/show.txt" 2>&1
python3 -m kernel_agent.agent.cli report "$RUN" --out "$KA/report" && cp "$KA/report/report.md" "$OUT/"
tar czf "$OUT/state.tgz" -C "$KA" ledger.db serving candidates report
tail -n 45 "$OUT/run.txt"
cat "$OUT/show.txt"
