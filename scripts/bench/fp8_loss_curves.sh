#!/usr/bin/env bash
# Issue 45's loss measurement on one GPU: for each model, examples/04_gpt_train twice from the same
# seed on the same built-in data, in bf16 and then in FP8 (--fp8 hybrid), STEPS steps each with the
# per-step JSON (--json) in $OUT/<model>_bf16.log and <model>_fp8.log (else build/bench/; on the
# CPU the first run is in f32, the trainer's dtype there, under the same name); then
# loss_compare.py: the final losses (means of the last 20 steps), their relative difference
# against 1% (exit 1 outside), the largest gap of the smoothed curves, and both curves on one plot
# ($OUT/<model>_loss.png, where matplotlib imports). The models:
#   gpt406m: gpt_benchmarks.sh's GPT (24 layers, hidden 1024, 16 heads, vocab 50304, seq 1024),
#            micro 8: about 50 ms a step on an H100, 500 steps about 40 s a run with start-up;
#   llama1b: llama_benchmarks.sh's Llama-style 1 B model (--arch llama, 16 layers, hidden 2048,
#            32 heads, 8 key/value heads, SwiGLU 8192, vocab 50304, seq 2048), micro 4: about
#            120 ms a step, 500 steps about 75 s a run.
# About 240 s of GPU work in all at 500 steps (FP8 a little slower than bf16 today); each run is
# bounded by 60 s plus twice its expected steps' time.
#   STEPS=500 MODELS="gpt406m llama1b" SEED=1234 TOLERANCE=0.01 scripts/bench/fp8_loss_curves.sh
#   EXTRA="--lr 3e-4 --warmup 50"  (flags of both runs of every model)
#   DEVICE=cpu MODEL="--layers 2 --hidden 64 --heads 4 --vocab 512 --seq-len 64" \
#     MICRO=4 STEPS=30 TARGETS=04_gpt_train scripts/bench/fp8_loss_curves.sh   (the CPU smoke run:
#     MODEL and MICRO replace every model's shape and micro batch; FP8 is emulated on the CPU)
# SKIP, ONLY: run names (gpt406m_bf16, gpt406m_fp8, llama1b_bf16, llama1b_fp8) to leave out, the
# only ones to run. The exit status: 1 when a comparison is outside the tolerance or cannot be made.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
steps=${STEPS:-500}
models=${MODELS:-gpt406m llama1b}
seed=${SEED:-1234}
device=${DEVICE:-cuda}
tolerance=${TOLERANCE:-0.01}
extra=${EXTRA:-}
# shellcheck source=scripts/bench/bench_common.sh
. scripts/bench/bench_common.sh
targets=${TARGETS:-04_gpt_train}
# shellcheck disable=SC2086
run build "${BUILD_LIMIT:-600}" cmake --build build -j "$(nproc)" --target $targets -- -k
train=build/examples/04_gpt_train/04_gpt_train
base=bf16  # the trainer's dtype: bf16 on a GPU, f32 on the CPU (the logs keep the name _bf16)
[ "$device" = cuda ] || base=f32
status=0
for name in $models; do
  case $name in  # shape, micro batch, expected ms per step on an H100
    gpt406m) shape="--layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024"
      micro=8 step_ms=50 ;;
    llama1b) shape="--arch llama --layers 16 --hidden 2048 --heads 32 --kv-heads 8 \
      --ffn-hidden 8192 --vocab 50304 --seq-len 2048"
      micro=4 step_ms=120 ;;
    *) echo "=== unknown model $name (gpt406m, llama1b)"; status=1; continue ;;
  esac
  if [ -n "${MODEL:-}" ]; then  # the arch stays the model's
    case $name in llama1b) shape="--arch llama $MODEL" ;; *) shape=$MODEL ;; esac
  fi
  micro=${MICRO:-$micro}
  limit=${LIMIT:-$((60 + 2 * steps * step_ms / 1000))}
  for mode in bf16 fp8; do
    fp8=()
    [ "$mode" = fp8 ] && fp8=(--fp8 hybrid)
    # shellcheck disable=SC2086
    run "${name}_$mode" "$limit" mpirun -np 1 "$train" $shape "${fp8[@]}" --micro-batch "$micro" \
      --global-batch "$micro" --steps "$steps" --seed "$seed" $extra --json --device "$device" \
      --data-dir build/data/synthetic --no-progress
  done
  python3 scripts/bench/loss_compare.py "$out/${name}_bf16.log" "$out/${name}_fp8.log" \
    --name "$name" --labels "$base" "fp8 hybrid" --tolerance "$tolerance" \
    --plot "$out/${name}_loss.png" || status=1
done
exit $status
