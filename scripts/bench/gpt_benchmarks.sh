#!/usr/bin/env bash
# The GPT trainer on GPUs against PyTorch on the same model, in one go (after scripts/setup.sh):
# tokens/s and MFU of examples/04_gpt_train on one GPU, on two (dp 2, tp 2), with the data-parallel
# communication time and the part of it exposed, beside scripts/bench/gpt_torch.py (eager,
# torch.compile, DDP on two), with ours_vs_torch.py's table of ours against both on one GPU; last,
# where the one-GPU step's time goes, by kernel, ours beside torch.compile's (gpt_profile,
# gpt_profile_torch, as moe_benchmarks.sh's moe_profile, PyTorch's after an unprofiled warm-up
# run: the table in $OUT/gpt_kernel_groups.txt). Each run is bounded in time; logs go to $OUT
# (else build/bench/).
#   MODEL="--layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024" MICRO=8 STEPS=12
#   SKIP, ONLY: run names to leave out, the only ones to run (e.g. ONLY="gpt_profile
#   gpt_profile_torch": the profile alone)
set -uo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/bench/bench_common.sh
. scripts/bench/bench_common.sh
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model=${MODEL:---layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024}
micro=${MICRO:-8}
steps=${STEPS:-12}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
train=build/examples/04_gpt_train/04_gpt_train
common="$model --micro-batch $micro --steps $steps --bench --bench-skip 4 --warmup 2 --json \
  --device cuda --data-dir build/data/synthetic --no-progress"
run() {  # run NAME SECONDS COMMAND... (its own: fewer result lines than bench_common.sh's)
  local name=$1 limit=$2; shift 2
  selected "$name" || return 0
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "=== $name exit $?"
  grep -E '"summary"|"impl"|error|Error' "$out/$name.log" | tail -n 5
}
run gpt_1gpu 240 mpirun -np 1 $train $common --global-batch $micro
run torch_1gpu 300 python3 scripts/bench/gpt_torch.py $model --micro-batch $micro \
  --global-batch $micro --steps $((steps - 4))
if [ "$gpus" -ge 2 ]; then
  run gpt_dp2 240 mpirun -np 2 $train $common --dp 2 --global-batch $((2 * micro))
  run gpt_dp2_serial 240 mpirun -np 2 $train $common --dp 2 --global-batch $((2 * micro)) \
    --no-overlap
  run gpt_dp2_zero1 240 mpirun -np 2 $train $common --dp 2 --zero 1 --global-batch $((2 * micro))
  run gpt_tp2 240 mpirun -np 2 $train $common --tp 2 --global-batch $micro
  run gpt_tp2_sp 240 mpirun -np 2 $train $common --tp 2 --sp --global-batch $micro
  run torch_ddp2 300 torchrun --standalone --nproc_per_node 2 scripts/bench/gpt_torch.py $model \
    --micro-batch $micro --global-batch $((2 * micro)) --steps $((steps - 4))
fi
# ours / PyTorch on one GPU: tokens/s and MFU (> 1: ours faster), peak memory (< 1: ours smaller),
# against eager and torch.compile; only when both runs ran here (no stale logs of an earlier one).
if selected gpt_1gpu >/dev/null && selected torch_1gpu >/dev/null; then
  python3 scripts/bench/ours_vs_torch.py "$out" gpt_1gpu torch_1gpu
fi
# shellcheck disable=SC2086
run_profile gpt_profile 90 12 4 mpirun -np 1 -x LD_PRELOAD -x KERNEL_SUMMARY_OUT $train $model \
  --micro-batch "$micro" --global-batch "$micro" --steps @STEPS@ --warmup 2 --device cuda \
  --data-dir build/data/synthetic --no-progress
# An unprofiled run first warms torch.compile's caches: both profiled runs then compile alike.
# shellcheck disable=SC2086
PROFILE_WARM=1 run_profile gpt_profile_torch 200 10 2 python3 scripts/bench/gpt_torch.py $model \
  --micro-batch "$micro" --global-batch "$micro" --modes compiled --warmup 3 --steps @STEPS@
profile_table gpt_kernel_groups.txt gpt_profile 12 4 gpt_profile_torch 10 2
