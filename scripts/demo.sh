#!/usr/bin/env bash
# The demo: builds Quintet (scripts/setup.sh), then
#   1. trains the example GPT (examples/04_gpt_train) under mpirun with 4 ranks as tensor
#      parallel 2 x data parallel 2 on the built-in dataset, and plots its loss against the
#      dataset's entropy floor (the best loss any model can reach on it);
#   2. trains a Mixtral-style mixture of experts (examples/05_moe_train --arch mixtral: RoPE,
#      RMSNorm, grouped-query attention, 8 SwiGLU experts top-2, no biases) on the CPU with 8
#      ranks as tensor parallel 2 (+ sequence parallel) x pipeline 2 x data parallel 2, its
#      experts spread over expert parallel 2 (each split over etp = tp 2), ZeRO-1, and plots its
#      loss and the load of its experts.
# On CPUs (the default without GPUs) the two take about 5 minutes on 2 cores (the MoE 1); with
# GPUs present the GPT runs a larger model on them (one rank per GPU; tp 2 x dp 2 needs 4, else dp
# over what is there). QUINTET_DEMO=gpt or moe runs one of them. Extra arguments go to the trainers (e.g.
# --steps 500).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
out=build/demo
mkdir -p "$out"
which=${QUINTET_DEMO:-both}

# The plot needs matplotlib: Debian's python3-matplotlib (for /usr/bin/python3), installed when
# missing and we are root.
plotter=""
for py in python3 /usr/bin/python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then plotter=$py; break; fi
done
if [ -z "$plotter" ] && [ "$(id -u)" = 0 ] &&
   apt-get install -y -qq --no-install-recommends python3-matplotlib >/dev/null 2>&1; then
  plotter=/usr/bin/python3
fi

# train NAME RANKS TRAINER TITLE FLAGS...: runs the trainer, prints every 10th step, plots.
train() {
  local name=$1 ranks=$2 trainer=$3 title=$4
  shift 4
  echo "demo: $name on $title: $*"
  # Order-1 Markov data: the structure a small model learns within the demo's few minutes;
  # unless the user's flags name their own data (--data), which those two settings do not touch.
  local builtin=(--synthetic-order 1 --data-dir build/data/synthetic) flag
  for flag in "$@"; do
    case $flag in --data | --data=*) builtin=() ;; esac
  done
  mpirun --oversubscribe -np "$ranks" "$trainer" "$@" "${builtin[@]}" --json |
    tee "$out/$name.jsonl" |
    python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if "summary" in r:
        print("summary: final loss %.4f, median %.1f ms/step, %.0f tokens/s"
              % (r["final_loss"], r["median_ms"], r["median_tokens_per_s"]), flush=True)
    elif r["step"] % 10 == 0 or r["step"] == 1:
        moe = ("  tokens/expert %.0f/%.0f/%.0f" % (r["tokens_per_expert_min"],
               r["tokens_per_expert_mean"], r["tokens_per_expert_max"])
               if "tokens_per_expert_mean" in r else "")
        print("step %4d  loss %.4f  (entropy floor %.4f)  %.0f ms/step  %.0f tok/s%s"
              % (r["step"], r["loss"], r["entropy_floor"], r["ms"], r["tokens_per_s"], moe),
              flush=True)
'
  if [ -n "$plotter" ]; then
    "$plotter" scripts/plot_loss.py "$out/$name.jsonl" --out "$out/$name.png" \
      --label "$name" --title "$title"
    echo "demo: plot: $out/$name.png"
  else
    echo "demo: no matplotlib (Debian: apt-get install python3-matplotlib); no plot made"
  fi
  echo "demo: per-step log (JSON): $out/$name.jsonl"
}

if [ "$which" != moe ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l || true)
  if [ "${gpus:-0}" -ge 1 ] && [ "${QUINTET_DEVICE:-}" != cpu ]; then
    if [ "$gpus" -ge 4 ]; then ranks=4 dp=2 layout=(--tp 2 --dp 2); else ranks=$gpus dp=$gpus layout=(--dp "$gpus"); fi
    config=(--device cuda --layers 12 --hidden 768 --heads 12 --seq-len 1024 --micro-batch 8
            --global-batch $((8 * dp)) --steps 300 --lr 1e-3 --warmup 30)
    where="$ranks GPU(s)"
  else
    ranks=4 layout=(--tp 2 --dp 2)
    config=(--device cpu --layers 2 --hidden 128 --heads 4 --seq-len 128 --micro-batch 4
            --global-batch 16 --steps 250 --lr 3e-3 --warmup 10 --loader-threads 1)
    where="CPU, 4 ranks"
  fi
  train gpt "$ranks" build/examples/04_gpt_train/04_gpt_train \
    "04_gpt_train ($where, ${layout[*]})" "${layout[@]}" "${config[@]}" "$@"
fi
if [ "$which" != gpt ]; then
  layout=(--tp 2 --sp --pp 2 --dp 2 --ep 2 --zero 1)
  # --arch mixtral sets the MoE too: 8 experts of --ffn-hidden's width, top-2, softmax routing
  # renormalized over the two.
  config=(--device cpu --arch mixtral --layers 4 --hidden 64 --heads 4 --kv-heads 2
          --ffn-hidden 128 --seq-len 64 --micro-batch 2 --global-batch 16 --steps 150 --lr 3e-3
          --warmup 10 --loader-threads 1 --aux-loss-coeff 0.01)
  train moe 8 build/examples/05_moe_train/05_moe_train \
    "Mixtral-style MoE (CPU, 8 ranks, ${layout[*]})" "${layout[@]}" "${config[@]}" "$@"
fi
