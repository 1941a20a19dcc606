#!/usr/bin/env bash
# The whole-model decode step of issue 18 on a GPU machine (torch and triton preinstalled): Llama-3-8B
# at B=32 ctx 8k, B=8 ctx 32k and B=64 ctx 2k, with the KV cache in bf16 and in int8, for torch
# (cuBLAS + SDPA), the baselines, the serving set and the hybrid (cuBLAS matmuls + the baseline paged
# attention), all in one process so that the stacks are interleaved round by round.
# Usage: bash scripts/gpu_model_step.sh OUTDIR
#   OUTDIR/model_step.json: the full result (`kernel-agent bench --model ... --out`);
#   OUTDIR/model_step.txt: what the command printed (the tables); OUTDIR/machine.txt: GPU and versions.
set -u
OUT=$1
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
{ nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
timeout 540 python3 -m kernel_agent.agent.cli bench --model llama-3-8b --points 32x8192,8x32768,64x2048 \
  --kv bf16,int8 --stacks torch,baseline,serving,hybrid --out "$OUT/model_step.json" > "$OUT/model_step.txt" 2>&1
rc=$?
echo "exit $rc" >> "$OUT/model_step.txt"
cat "$OUT/machine.txt" "$OUT/model_step.txt"
exit $rc
