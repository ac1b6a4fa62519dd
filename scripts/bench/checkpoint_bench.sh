#!/usr/bin/env bash
# Checkpoint cost on one GPU (after scripts/setup.sh): the 406 M GPT of gpt_benchmarks.sh:
# 300 steps without saves, with a synchronous save every 150 steps (and at the end), and with
# --async-save; logs under
# $OUT (else build/bench/), summary by scripts/bench/checkpoint_cost.py.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
train=build/examples/04_gpt_train/04_gpt_train
ckpt=${CKPT_DIR:-$(mktemp -d)}
gpu="--layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024 --micro-batch 8 \
  --global-batch 8 --steps 300 --warmup 2 --json --device cuda --data-dir build/data/synthetic \
  --no-progress"
timeout 300 mpirun -np 1 $train $gpu >"$out/ckpt_none.jsonl" 2>&1
timeout 300 mpirun -np 1 $train $gpu --save "$ckpt/sync" --save-every 150 >"$out/ckpt_sync.jsonl" 2>&1
du -sh "$ckpt/sync/step_000150"
rm -rf "$ckpt/sync"
timeout 300 mpirun -np 1 $train $gpu --save "$ckpt/async" --save-every 150 --async-save \
  >"$out/ckpt_async.jsonl" 2>&1
rm -rf "$ckpt/async"
python3 scripts/bench/checkpoint_cost.py "$out/ckpt_none.jsonl" "$out/ckpt_sync.jsonl" \
  "$out/ckpt_async.jsonl" --every 150
