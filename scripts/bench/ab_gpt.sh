#!/usr/bin/env bash
# A/B of examples/04_gpt_train on one GPU: this tree against another source tree (BASE, e.g. an
# earlier commit unpacked by `git archive`), both built here (Release, the trainer target only),
# run alternately ROUNDS times at the configuration of scripts/bench/gpt_benchmarks.sh. Prints
# each run's median tokens/s and MFU and the ratio ours/base of the medians over the rounds.
#   BASE=build-ab/base ROUNDS=2 scripts/bench/ab_gpt.sh
# Logs go to $OUT (else build/bench/).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
base=${BASE:?set BASE to the other source tree}
rounds=${ROUNDS:-2}
model=${MODEL:---layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024}
micro=${MICRO:-8}
steps=${STEPS:-12}
build() {  # build SRC BUILD_DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DQUINTET_BUILD_TESTS=OFF >"$out/cmake_$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target 04_gpt_train >>"$out/cmake_$(basename "$2").log" 2>&1
}
build . build-ab/ours || { echo "ours: build failed"; tail -20 "$out/cmake_ours.log"; exit 1; }
build "$base" build-ab/base_build || { echo "base: build failed"; tail -20 "$out/cmake_base_build.log"; exit 1; }
common="$model --micro-batch $micro --global-batch $micro --steps $steps --bench --bench-skip 4 \
  --warmup 2 --json --device cuda --data-dir build-ab/data --no-progress"
for r in $(seq 1 "$rounds"); do
  for who in base ours; do
    bin=build-ab/ours/examples/04_gpt_train/04_gpt_train
    [ "$who" = base ] && bin=build-ab/base_build/examples/04_gpt_train/04_gpt_train
    timeout 300 mpirun -np 1 "$bin" $common >"$out/ab_${who}_$r.log" 2>&1
    echo "$who round $r exit $?"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
res = {"base": [], "ours": []}
for who in res:
    for r in range(1, rounds + 1):
        for line in open(f"{out}/ab_{who}_{r}.log"):
            if '"summary"' in line:
                s = json.loads(line)
                res[who].append(s)
print("run    round  tokens/s   ms/step  MFU     final loss")
for who, runs in res.items():
    for i, s in enumerate(runs, 1):
        print(f"{who:6s} {i:5d}  {s['median_tokens_per_s']:8.0f}  {s['median_ms']:7.1f}  "
              f"{s.get('median_mfu') or 0:.3f}  {s['final_loss']:.4f}")
if res["base"] and res["ours"]:
    b = statistics.median(s["median_tokens_per_s"] for s in res["base"])
    o = statistics.median(s["median_tokens_per_s"] for s in res["ours"])
    print(f"ours/base tokens/s (median over rounds): {o / b:.3f}")
PY
