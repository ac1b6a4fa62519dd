#!/usr/bin/env bash
# A/B of the trainers on one GPU: this tree against another source tree (BASE, e.g. an earlier
# commit unpacked by `git archive`), both built here (Release, the trainer targets only), run
# alternately ROUNDS times: examples/04_gpt_train at the configuration of
# scripts/bench/gpt_benchmarks.sh and examples/05_moe_train at moe_benchmarks.sh's (TRAINERS
# picks: "gpt moe" by default). Prints each run's median tokens/s and MFU and, per trainer, the
# ratio ours/base of the medians over the rounds.
#   BASE=build-ab/base ROUNDS=2 scripts/bench/ab_gpt.sh
# OURS_BUILD=build: this tree's programs from that build folder (a carried prebuilt) instead of
# building them again. Logs go to $OUT (else build/bench/).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-build/bench}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
base=${BASE:?set BASE to the other source tree}
rounds=${ROUNDS:-2}
trainers=${TRAINERS:-gpt moe}
steps=${STEPS:-12}
# trainer name -> target, model flags, micro-batch (the benchmark scripts' configurations)
target() { [ "$1" = moe ] && echo 05_moe_train || echo 04_gpt_train; }
flags() {
  if [ "$1" = moe ]; then
    echo "${MOE_MODEL:---layers 12 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024 --experts 8 --top-k 2 --expert-ffn 2816}"
  else
    echo "${MODEL:---layers 24 --hidden 1024 --heads 16 --vocab 50304 --seq-len 1024}"
  fi
}
micro() { [ "$1" = moe ] && echo "${MOE_MICRO:-16}" || echo "${MICRO:-8}"; }
targets=""
for t in $trainers; do targets+=" $(target "$t")"; done
build() {  # build SRC BUILD_DIR
  # shellcheck disable=SC2086
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DQUINTET_BUILD_TESTS=OFF >"$out/cmake_$(basename "$2").log" 2>&1 &&
    cmake --build "$2" -j "$(nproc)" --target $targets >>"$out/cmake_$(basename "$2").log" 2>&1
}
ours_dir=${OURS_BUILD:-build-ab/ours}
if [ -z "${OURS_BUILD:-}" ]; then
  build . build-ab/ours || { echo "ours: build failed"; tail -20 "$out/cmake_ours.log"; exit 1; }
fi
build "$base" build-ab/base_build || { echo "base: build failed"; tail -20 "$out/cmake_base_build.log"; exit 1; }
for r in $(seq 1 "$rounds"); do
  for t in $trainers; do
    tgt=$(target "$t")
    common="$(flags "$t") --micro-batch $(micro "$t") --global-batch $(micro "$t") --steps $steps \
      --bench --bench-skip 4 --warmup 2 --json --device cuda --no-progress"
    for who in base ours; do
      # Each side its own built-in data (made by its first run), in case their formats differ.
      bin=$ours_dir/examples/$tgt/$tgt
      [ "$who" = base ] && bin=build-ab/base_build/examples/$tgt/$tgt
      # shellcheck disable=SC2086
      timeout 300 mpirun -np 1 "$bin" $common --data-dir "build-ab/data_$who" >"$out/ab_${t}_${who}_$r.log" 2>&1
      echo "$t $who round $r exit $?"
    done
  done
done
python3 - "$out" "$rounds" "$trainers" <<'PY'
import json, statistics, sys
out, rounds, trainers = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
print("trainer run    round  tokens/s   ms/step  MFU     final loss")
for t in trainers:
    res = {"base": [], "ours": []}
    for who in res:
        for r in range(1, rounds + 1):
            try:
                for line in open(f"{out}/ab_{t}_{who}_{r}.log"):
                    if '"summary"' in line:
                        res[who].append(json.loads(line))
            except OSError:
                pass
    for who, runs in res.items():
        for i, s in enumerate(runs, 1):
            print(f"{t:7s} {who:6s} {i:5d}  {s['median_tokens_per_s']:8.0f}  {s['median_ms']:7.1f}  "
                  f"{s.get('median_mfu') or 0:.3f}  {s['final_loss']:.4f}")
    if res["base"] and res["ours"]:
        b = statistics.median(s["median_tokens_per_s"] for s in res["base"])
        o = statistics.median(s["median_tokens_per_s"] for s in res["ours"])
        print(f"{t}: ours/base tokens/s (median over rounds): {o / b:.3f}")
PY
