#!/usr/bin/env bash
# Tensor-parallel overlap on CPU ranks: examples/04_gpt_train at tp 4 (one MPI rank per core
# pair of the GPU machine's 16 cores), with and without sequence parallelism, each without
# --tp-overlap and with 2 and 4 chunks, in rounds (A B C, A B C, ...) so that drift on a shared
# machine lands on every variant alike. Prints one line per variant: the median over rounds of
# the run's median step time and median exposed tp communication (tp_comm_ms), and how much of the
# unchunked run's exposed tp time the chunks hid. Logs (JSON lines) go to $OUT or build/bench.
#
#   scripts/bench/tp_overlap_cpu.sh [ROUNDS] [extra trainer flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench}/tp_overlap
mkdir -p "$out"
rounds=${1:-3}
shift || true
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
trainer=build/examples/04_gpt_train/04_gpt_train
# Wide enough that each GEMM of a block takes milliseconds on one core.
model=(--device cpu --layers 2 --hidden 1024 --heads 16 --seq-len 256 --micro-batch 4
       --global-batch 4 --steps 6 --warmup 1 --json --no-progress --data-dir "$out/data" "$@")
variants=("plain" "chunks2:--tp-overlap --tp-overlap-chunks 2" "chunks4:--tp-overlap --tp-overlap-chunks 4")
for sp in "" "--sp"; do
  for ((r = 1; r <= rounds; r++)); do
    for v in "${variants[@]}"; do
      name=${v%%:*}
      flags=""
      [[ $v == *:* ]] && flags=${v#*:}
      tag="${name}${sp:+_sp}_r$r"
      # shellcheck disable=SC2086
      mpirun -np 4 --bind-to none "$trainer" "${model[@]}" --tp 4 $sp $flags >"$out/$tag.jsonl"
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def summary(tag):
    for line in open(f"{out}/{tag}.jsonl"):
        if line.startswith("{") and '"summary"' in line:
            return json.loads(line)
    sys.exit(f"{tag}: no summary record")
for sp in ("", "_sp"):
    base = None
    for name in ("plain", "chunks2", "chunks4"):
        runs = [summary(f"{name}{sp}_r{r}") for r in range(1, rounds + 1)]
        ms = statistics.median(s["median_ms"] for s in runs)
        tp = statistics.median(s["median_tp_comm_ms"] for s in runs)
        if base is None:
            base = (ms, tp)
        hidden = 100.0 * (1 - tp / base[1]) if base[1] > 0 else 0.0
        print(json.dumps({"variant": name, "sp": bool(sp), "median_step_ms": round(ms, 2),
                          "median_exposed_tp_ms": round(tp, 2),
                          "step_speedup": round(base[0] / ms, 3),
                          "exposed_tp_hidden_pct": round(hidden, 1)}))
PY
