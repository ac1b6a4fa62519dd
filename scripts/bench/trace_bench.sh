#!/usr/bin/env bash
# The trace recorder's cost and pictures (after scripts/setup.sh), logs and PNGs into $OUT (else
# build/bench/): on a GPU, the 406 M GPT (as scripts/bench/gpt_benchmarks.sh) with steps 5-10
# traced against its untraced steps and a run without --trace; one GPU step drawn; on CPU ranks,
# tp 2 x dp 2, one step drawn.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
train=build/examples/04_gpt_train/04_gpt_train
steps=${STEPS:-16}
work=$(mktemp -d)
if nvidia-smi -L >/dev/null 2>&1; then
  gpu="--layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024 --micro-batch 8 \
    --global-batch 8 --steps $steps --warmup 2 --json --device cuda --data-dir build/data/synthetic \
    --no-progress"
  timeout 300 mpirun -np 1 $train $gpu >"$out/gpu_plain.jsonl" 2>&1
  timeout 300 mpirun -np 1 $train $gpu --trace "$work/gpu" --trace-steps 5:10 \
    >"$out/gpu_traced.jsonl" 2>&1
  python3 scripts/bench/trace_overhead.py "$out/gpu_traced.jsonl" 5 10 --plain "$out/gpu_plain.jsonl"
  python3 scripts/merge_traces.py "$work/gpu"
  python3 scripts/plot_timeline.py "$work/gpu/trace_merged.json" -o "$out/gpu_step.png" --step 6 \
    --title "406M GPT, one H200, step 6"
  grep straggler "$out/gpu_traced.jsonl" | tail -n 1
fi
cpu="--device cpu --layers 4 --hidden 256 --heads 8 --vocab 4096 --seq-len 128 --micro-batch 4 \
  --global-batch 16 --steps 6 --json --no-progress --data-dir build/data/synthetic"
timeout 300 mpirun -np 4 $train $cpu --tp 2 --dp 2 --zero 1 --trace "$work/cpu" --trace-steps 3:4 \
  >"$out/cpu_traced.jsonl" 2>&1
python3 scripts/merge_traces.py "$work/cpu"
python3 scripts/plot_timeline.py "$work/cpu/trace_merged.json" -o "$out/cpu_step.png" --step 4 \
  --title "tp 2 x dp 2 zero-1 on 4 cpu ranks, step 4"
grep straggler "$out/cpu_traced.jsonl" | tail -n 1
gzip -c "$work/cpu/trace_merged.json" >"$out/cpu_trace_merged.json.gz"
[ -f "$work/gpu/trace_merged.json" ] && gzip -c "$work/gpu/trace_merged.json" >"$out/gpu_trace_merged.json.gz"
rm -rf "$work"
