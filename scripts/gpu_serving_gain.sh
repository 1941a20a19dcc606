#!/usr/bin/env bash
# The serving-gain figures on a GPU machine (torch and triton preinstalled; flashinfer-python, apache-tvm-ffi
# and SQLAlchemy carried as wheels in .whl/), in one command of under ten minutes. Steps (STEPS, default
# "prebuild study model"):
#   prebuild: FlashInfer's decode modules built once in this trusted process and installed as its
#             ahead-of-time modules (sandboxed benchmark children load them without compiling)
#   study:    scripts/decode_study.py: every decode variant, SDPA and FlashInfer at the three points
#   model:    bench --model llama-3-8b at 32x8192, 8x32768, 64x2048, bf16 and int8, torch/flashinfer/serving
#   budget:   bench --model llama-3-8b --kv-budget 60GiB --context 8192 (tokens/s at equal memory)
#   op:       bench --op decode_attention and decode_attention_int8 at the three points (FlashInfer row)
#   tests:    pytest -m gpu tests/test_gpu.py
# Usage: [STEPS=...] bash scripts/gpu_serving_gain.sh OUTDIR
set -u
OUT=$1
STEPS=${STEPS:-prebuild model budget tests}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 CUDA_HOME=/usr/local/cuda
export PATH=/usr/local/cuda/bin:$PATH KERNEL_AGENT_CACHE=${KERNEL_AGENT_CACHE:-/tmp/ka/cache}
KA="python3 -m kernel_agent.agent.cli"
POINTS=32x8192,8x32768,64x2048
SHAPES='B=32,Hq=32,Hkv=8,D=128,block_size=16,ctx=8192;B=8,Hq=32,Hkv=8,D=128,block_size=16,ctx=32768;B=64,Hq=32,Hkv=8,D=128,block_size=16,ctx=2048'
step() { [[ " $STEPS " == *" $1 "* ]]; }
echo "start $(date +%T)"
if step prebuild; then
  timeout 60 python3 -m kernel_agent.ops.flashinfer_paged --head-dims 128 > "$OUT/prebuild.txt" 2>&1
  echo "prebuild: exit $? ($(date +%T))"; grep -v installed "$OUT/prebuild.txt" | tail -4
fi
if step study; then
  timeout 200 python3 scripts/decode_study.py --rounds 7 --out "$OUT" > "$OUT/decode_study.txt" 2>&1
  echo "study: exit $? ($(date +%T))"
fi
if step model; then
  timeout 175 $KA bench --model llama-3-8b --points $POINTS --kv bf16,int8 --stacks torch,flashinfer,serving \
    --out "$OUT/model_step.json" > "$OUT/model_step.txt" 2>&1
  echo "model: exit $? ($(date +%T))"
fi
if step budget; then
  timeout 110 $KA bench --model llama-3-8b --kv-budget 60GiB --context 8192 --stacks torch,flashinfer,serving \
    --out "$OUT/kv_budget.json" > "$OUT/kv_budget.txt" 2>&1
  echo "budget: exit $? ($(date +%T))"
fi
if step op; then
  for op in decode_attention decode_attention_int8; do
    timeout 200 $KA bench --op $op --shapes "$SHAPES" --no-ledger --out "$OUT/bench_$op.json" >> "$OUT/bench_op.txt" 2>&1
    echo "bench $op: exit $? ($(date +%T))"
  done
fi
if step tests; then
  timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
    > "$OUT/gpu_tests.txt" 2>&1
  echo "gpu tests: exit $? ($(date +%T))"; tail -n 5 "$OUT/gpu_tests.txt"
fi
for f in decode_study model_step kv_budget bench_op; do
  [ -e "$OUT/$f.txt" ] && { echo; echo "== $f"; grep -v -i warn "$OUT/$f.txt" | tail -n 45; }
done
