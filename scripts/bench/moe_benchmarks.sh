#!/usr/bin/env bash
# The MoE measurements of docs/PERFORMANCE.md in one go on a GPU machine: builds what they need,
# runs the GPU MoE test, then examples/05_moe_train on one GPU (its experts on the per-expert
# cuBLASLt loop, then on our grouped kernel and on the Hopper kernel: the runs named *_kernel,
# *_wgmma)
# beside scripts/bench/moe_torch.py
# (the same model in PyTorch, grouped bf16 expert GEMMs; eager and torch.compile) twice: GPT-2
# style with GELU experts, and Mixtral style ($MIXTRAL: SwiGLU experts, RMSNorm, RoPE, GQA with 4
# key/value heads, no biases; --arch mixtral, the same sizes and experts), the grouped expert
# GEMM against a per-expert cuBLASLt loop (09_op_bench --experts-only: cuBLAS's grouped call and
# our grouped kernel) and PyTorch's grouped_mm at the same shapes (grouped_mm_torch.py), and the
# CPU token exchange against raw MPI on all cores (10_moe_dispatch_bench); and where the GPT-2
# style step's GPU time goes, by kernel, ours beside torch.compile's (moe_profile,
# moe_profile_torch: kernel_summary.cpp under LD_PRELOAD at 4 and 12 steps, resp. 2 and 10 timed
# after 3 of warm-up, so start-up and compilation drop out of the difference; torch.compile's
# after an unprofiled run (PROFILE_WARM=1) that fills its compilation and autotuning caches, else
# only the first of its two runs pays for them; kernel_groups.py's table in
# $OUT/moe_kernel_groups.txt). Each run is bounded in time; logs go to $OUT (else build/bench/).
#   MODEL="--layers 12 ..." MICRO=16 STEPS=12 SKIP="torch torch_mixtral" TARGETS=05_moe_train \
#     scripts/bench/moe_benchmarks.sh      (SKIP: run names to leave out, ONLY: the runs to run;
#     TARGETS: what to build;
#     DEVICE=cpu runs the trainer runs on the CPU, a smoke test of the script)
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
model=${MODEL:---layers 12 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024}
moe=${MOE:---experts 8 --top-k 2 --expert-ffn 2816}
mixtral=${MIXTRAL:---arch mixtral --kv-heads 4}
micro=${MICRO:-16}
steps=${STEPS:-12}
# shellcheck source=scripts/bench/bench_common.sh
. scripts/bench/bench_common.sh
targets=${TARGETS:-gpu_ep_moe_test 05_moe_train 09_op_bench 10_moe_dispatch_bench}
# shellcheck disable=SC2086
run build 400 cmake --build build -j "$(nproc)" --target $targets -- -k
run gpu_test 150 build/tests/gpu_ep_moe_test
# --arch before the MoE flags: the family sets the experts' shape, $moe overrides it.
for arch in gpt2 mixtral; do
  if [ "$arch" = gpt2 ]; then suffix="" family=""; else suffix="_$arch" family=$mixtral; fi
  # The experts on the per-expert cuBLASLt loop (the default: one host wait per layer's
  # forward), on our grouped kernel (QUINTET_GROUPED_GEMM=kernel, ep = 1: no host wait) and on
  # the Hopper kernel (QUINTET_GROUPED_GEMM=wgmma), in the same build.
  for gemm in loop kernel wgmma; do
    name="moe_1gpu$suffix"
    [ "$gemm" != loop ] && name="moe_1gpu${suffix}_$gemm"
    # (mpirun's local ranks inherit its environment.)
    run "$name" 200 env QUINTET_GROUPED_GEMM=$gemm \
      mpirun -np 1 build/examples/05_moe_train/05_moe_train $model \
      $family $moe --micro-batch "$micro" --global-batch "$micro" --steps "$steps" --bench \
      --bench-skip 4 --warmup 2 --json --device "${DEVICE:-cuda}" --data-dir build/data/synthetic --no-progress
  done
  run "torch$suffix" 300 python3 scripts/bench/moe_torch.py $model $family $moe \
    --micro-batch "$micro" --global-batch "$micro" --steps $((steps - 4))
done
# The step by kernel (#47), GPT-2 style: the same model and experts, a few steps each.
# shellcheck disable=SC2086
run_profile moe_profile 90 12 4 mpirun -np 1 -x LD_PRELOAD -x KERNEL_SUMMARY_OUT \
  build/examples/05_moe_train/05_moe_train $model $moe --micro-batch "$micro" \
  --global-batch "$micro" --steps @STEPS@ --warmup 2 --device cuda \
  --data-dir build/data/synthetic --no-progress
# Ours alone first: the table survives a time-out of PyTorch's compilation.
profile_table moe_kernel_groups_ours.txt moe_profile 12 4
# An unprofiled run first warms torch.compile's caches: both profiled runs then compile alike.
# shellcheck disable=SC2086
PROFILE_WARM=1 run_profile moe_profile_torch 200 10 2 python3 scripts/bench/moe_torch.py $model $moe \
  --micro-batch "$micro" --global-batch "$micro" --modes compiled --no-check --warmup 3 \
  --steps @STEPS@
profile_table moe_kernel_groups.txt moe_profile 12 4 moe_profile_torch 10 2
run grouped_gemm 120 build/examples/09_op_bench/09_op_bench --experts-only --json
run grouped_gemm_skew 120 build/examples/09_op_bench/09_op_bench --experts-only --json \
  --expert-skew 1
# PyTorch's grouped GEMM at the same shapes (beside our grouped kernel's columns above).
run grouped_mm_torch 120 python3 scripts/bench/grouped_mm_torch.py
run grouped_mm_torch_skew 120 python3 scripts/bench/grouped_mm_torch.py --skew 1
run dispatch_cpu 120 mpirun --oversubscribe -np "$(nproc)" \
  build/examples/10_moe_dispatch_bench/10_moe_dispatch_bench --tokens 4096 --hidden 1024 --json
# The exposed ep communication of CPU ranks training, with the exchange in one piece and in 2
# overlapped chunks (the default).
cpu_model="--device cpu --layers 2 --hidden 256 --heads 4 --vocab 4096 --seq-len 128 \
  --micro-batch 2 --global-batch 16 --experts 8 --top-k 2 --steps 8 --bench --bench-skip 3 \
  --json --no-progress --data-dir build/data/synthetic_cpu"
for chunks in 1 2; do
  run "cpu_ep8_chunks$chunks" 150 mpirun --oversubscribe -np 8 \
    build/examples/05_moe_train/05_moe_train $cpu_model --dp 8 --ep 8 --moe-chunks "$chunks"
done
