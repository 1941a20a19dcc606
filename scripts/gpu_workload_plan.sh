#!/usr/bin/env bash
# One `kernel-agent workload plan` on a GPU machine (torch and triton preinstalled; SQLAlchemy carried as a
# wheel in .whl/), under ten minutes: a seeded long-context chat trace (2000 requests, prompts of about 6k
# tokens, so that a 60 GiB KV budget binds and the cache format matters), planned for Llama-3-8B at 60 GiB
# per GPU, first estimated (roofline, --measure off) and then measured (--measure on: the serving stack's
# step timed with bench --model's machinery at each option's heaviest point, int8 error measured).
# Usage: bash scripts/gpu_workload_plan.sh OUTDIR
#   OUTDIR/trace.jsonl            the trace (scripts/gen_workload_trace.py, seed 2)
#   OUTDIR/analyze.txt, .json     workload analyze of it (bf16 and int8)
#   OUTDIR/plan_estimate.{txt,json}  the plan without the GPU
#   OUTDIR/plan_measured.{txt,json}  the plan measured on the GPU; OUTDIR/machine.txt: GPU and versions
#   OUTDIR/gpu_test.txt          pytest -m gpu tests/test_gpu.py -k workload_plan (the measured path's checks)
set -u
OUT=$1
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
KA="python3 -m kernel_agent.agent.cli"
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
echo "start $(date +%T)"
python3 scripts/gen_workload_trace.py 2000 "$OUT/trace.jsonl" --rate 20 --prompt-median 6000 --output-median 300 \
  --sigma 0.6 --seed 2 || exit 1
timeout 60 $KA workload analyze "$OUT/trace.jsonl" --model llama-3-8b --kv-budget 60GiB --kv bf16,int8 \
  --json "$OUT/analyze.json" > "$OUT/analyze.txt" 2>&1
echo "analyze: exit $? ($(date +%T))"
timeout 90 $KA workload plan "$OUT/trace.jsonl" --model llama-3-8b --kv-budget 60GiB --page-sizes 16,32 \
  --measure off --out "$OUT/plan_estimate.json" > "$OUT/plan_estimate.txt" 2>&1
echo "plan (estimate): exit $? ($(date +%T))"
timeout 330 $KA workload plan "$OUT/trace.jsonl" --model llama-3-8b --kv-budget 60GiB --page-sizes 16,32 \
  --measure on --out "$OUT/plan_measured.json" > "$OUT/plan_measured.txt" 2>&1
rc=$?
echo "plan (measured): exit $rc ($(date +%T))"
timeout 90 python3 -m pytest -q -m gpu tests/test_gpu.py -k workload_plan > "$OUT/gpu_test.txt" 2>&1
echo "gpu test: exit $? ($(date +%T))"
cat "$OUT/machine.txt" "$OUT/plan_estimate.txt" "$OUT/plan_measured.txt"; tail -3 "$OUT/gpu_test.txt"
exit $rc
