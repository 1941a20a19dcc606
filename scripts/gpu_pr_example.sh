#!/usr/bin/env bash
# From a night's run to a pull request, on a GPU machine: a clean clone of the repository, a
# `kernel-agent run` aimed at a model's decode step, the run's branch, the decode step timed with the
# branch's serving set, and `kernel-agent pr` (plus `show` and `report`, whose figures the body repeats).
# Usage: [SOURCE=repository or bundle (default: this checkout)] [OPS=decode_attention_int8]
#        [TARGET_MODEL=llama-3-8b] [POINTS=32x8192] [TIME_LIMIT=5m] bash scripts/gpu_pr_example.sh OUTDIR
#   OUTDIR/run.txt, model_step.txt, pr.txt, show.txt: what the commands printed; commands.txt: the
#   commands; branch.txt: the branch's commits; patches/: the branch as patches; pr/: the body and
#   plots; report/: the run's report; model_step.json: the step document; ledger.db: the run ledger.
set -u
OUT=$(realpath -m "$1")
mkdir -p "$OUT"
SOURCE=${SOURCE:-$PWD}
CLONE=${CLONE:-/tmp/ka-pr-clone}
BRANCH_TREE=${BRANCH_TREE:-/tmp/ka-pr-branch}
rm -rf "$CLONE" "$BRANCH_TREE"
git clone -q "$SOURCE" "$CLONE" || { echo "git clone $SOURCE failed"; exit 1; }
cd "$CLONE" || exit 1
git log -1 --format='%H %s' > "$OUT/commit.txt"
export PYTHONPATH=$CLONE${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export KERNEL_AGENT_CACHE=${KERNEL_AGENT_CACHE:-/tmp/ka-pr-cache}
CLI="python3 -m kernel_agent.agent.cli"
MODEL=${TARGET_MODEL:-llama-3-8b}
POINTS=${POINTS:-32x8192}
log() { echo "\$ kernel-agent $*" >> "$OUT/commands.txt"; }
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
ARGS=(run --ops "${OPS:-decode_attention_int8}" --target-model "$MODEL" --target-points "$POINTS" --time-limit "${TIME_LIMIT:-5m}")
log "${ARGS[@]}"; $CLI "${ARGS[@]}" > "$OUT/run.txt" 2>&1
echo "run: exit $?" >> "$OUT/commands.txt"
RUN=$(grep -o -m1 'run r[0-9-]*[a-f0-9]*' "$OUT/run.txt" | awk '{print $2}')
[ -n "$RUN" ] || { echo "no run id in run.txt"; tail -n 20 "$OUT/run.txt"; exit 1; }
BRANCH=kernel-agent/$RUN
if git rev-parse -q --verify "refs/heads/$BRANCH" > /dev/null; then
  git log --reverse --format='%h %s%n%n%b' "HEAD..$BRANCH" > "$OUT/branch.txt"
  git format-patch -q -o "$OUT/patches" "HEAD..$BRANCH"
  git worktree add -q "$BRANCH_TREE" "$BRANCH"
  # the decode step with the branch's serving set: what the pull request would serve
  ARGS=(bench --model "$MODEL" --points "$POINTS" --kv bf16,int8 --stacks torch,baseline,serving --out "$OUT/model_step.json")
  log "${ARGS[@]}  # with KERNEL_AGENT_SERVING_DIR=<the branch's kernels/serving>"
  KERNEL_AGENT_SERVING_DIR=$BRANCH_TREE/kernels/serving timeout 400 $CLI "${ARGS[@]}" > "$OUT/model_step.txt" 2>&1
  echo "bench --model: exit $?" >> "$OUT/commands.txt"
  STEP=(--model-step "$OUT/model_step.json")
  [ -s "$OUT/model_step.json" ] || STEP=()
else
  echo "the run opened no branch (nothing promoted or chosen)" > "$OUT/branch.txt"
  STEP=()
fi
ARGS=(pr "$RUN" --out "$OUT/pr" "${STEP[@]}"); log "${ARGS[@]}"; $CLI "${ARGS[@]}" > "$OUT/pr.txt" 2>&1
echo "pr: exit $?" >> "$OUT/commands.txt"
ARGS=(show "$RUN"); log "${ARGS[@]}"; $CLI "${ARGS[@]}" > "$OUT/show.txt" 2>&1
ARGS=(report "$RUN" --out "$OUT/report"); log "${ARGS[@]}"; $CLI "${ARGS[@]}" > "$OUT/report.txt" 2>&1
cp runs/ledger.db "$OUT/ledger.db" 2>/dev/null
cat "$OUT/commands.txt"; tail -n 15 "$OUT/run.txt"; cat "$OUT/branch.txt" | head -40
[ -e "$OUT/model_step.txt" ] && tail -n 30 "$OUT/model_step.txt"
cat "$OUT/pr.txt"
