#!/usr/bin/env bash
# The flight recorder's cost (#44): the CPU collective benchmark (examples/01_collective_bench)
# and the trainer's step (examples/04_gpt_train) with the recorder on (--flight-size SIZE) and off
# (--flight-size 0: the sequence counters only, which naming a laggard needs), in one call.
#
#   scripts/bench/flight_cost.sh                   # the 2-core CPU machine: 4 CPU ranks
#   scripts/bench/flight_cost.sh --device cuda --ranks 2 --train "--layers 12 --hidden 768 ..."
#
# Each round runs every case four times in the order on, off, off, on (the same process layout,
# a new job each time), so a drift over the round weighs on both sides alike. Printed per case:
# the median over rounds of the mean of each side, on/off of those medians, each round's on/off
# (median, interquartile range, range), and an A/A control from the same runs: each round's
# second off over its first off, whose spread is what the machine resolves. Each round also runs
# the bench once with --flight-overhead (the recorder on and off in one job, repetitions paired:
# docs/PERFORMANCE.md), whose per-round flight_ratio is summarised the same way, and once with
# --flight-overhead --flight-control (the recorder off on both sides: that form's A/A control,
# whose ratio is what the comparison shows by itself), summarised beside it. The load average
# is printed before and after. The bench is always on the CPU (the MPI backend's recorder);
# --device picks the trainer's device. On cuda (jobs of 2 or more ranks, one GPU each) the
# trainer's NCCL world communicator and the mesh's axes (NCCL splits, recorded as '<axis> (nccl)')
# keep the recorder, so its on/off is the recorder's cost on the GPU step; a one-rank job has no
# recorder at all, so there the trainer's on/off is an A/A comparison (the script says so). Logs
# go to $OUT (else build/bench/flight_cost).
#
# Options: --device cpu|cuda (trainer; default cpu), --rounds N (5), --size N (recorder on: 2048),
# --ranks N (trainer ranks: 4 on cpu, one per visible GPU on cuda), --layout "..." (default
# "--tp 2 --dp 2" on cpu, "--dp RANKS" on cuda), --steps N (30), --train "..." (model flags),
# --bench-ranks N (4), --bytes "8 512 32K" (bench sizes), --build DIR (build).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
device=cpu rounds=5 size=2048 ranks="" layout=unset steps=30 train="" bench_ranks=4
sizes="8 512 32K" build=build
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2 ;;
    --rounds) rounds=$2 ;;
    --size) size=$2 ;;
    --ranks) ranks=$2 ;;
    --layout) layout=$2 ;;
    --steps) steps=$2 ;;
    --train) train=$2 ;;
    --bench-ranks) bench_ranks=$2 ;;
    --bytes) sizes=$2 ;;
    --build) build=$2 ;;
    *) echo "flight_cost.sh: unknown option $1 (see the header)" >&2; exit 2 ;;
  esac
  shift 2 || { echo "flight_cost.sh: $1 needs a value" >&2; exit 2; }
done
case $device in
  cpu) : "${ranks:=4}"; [ "$layout" = unset ] && layout="--tp 2 --dp 2"
       [ -n "$train" ] || train="--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32 \
--micro-batch 2 --global-batch 12" ;;
  cuda) gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); [ "$gpus" -ge 1 ] || gpus=1
        : "${ranks:=$gpus}"; [ "$layout" = unset ] && layout="--dp $ranks"
        [ -n "$train" ] || train="--layers 12 --hidden 768 --heads 12 --vocab 50304 --seq-len 1024 \
--micro-batch 8 --global-batch $((8 * ranks))" ;;
  *) echo "flight_cost.sh: --device cpu|cuda, not $device" >&2; exit 2 ;;
esac
[ "$size" -gt 0 ] 2>/dev/null || { echo "flight_cost.sh: --size must be > 0 (on)" >&2; exit 2; }
[ "$rounds" -ge 1 ] 2>/dev/null || { echo "flight_cost.sh: --rounds must be >= 1" >&2; exit 2; }
bench=$build/examples/01_collective_bench/01_collective_bench
trainer=$build/examples/04_gpt_train/04_gpt_train
for b in "$bench" "$trainer"; do
  [ -x "$b" ] || { echo "flight_cost.sh: $b not built (cmake --build $build --target \
01_collective_bench 04_gpt_train)" >&2; exit 2; }
done
out=${OUT:-build/bench/flight_cost}
rm -rf "$out" && mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
mpi=(mpirun --oversubscribe)
min_bytes=${sizes%% *} max_bytes=${sizes##* }
if [ "$device" = cuda ] && [ "$ranks" -eq 1 ]; then
  echo "note: a one-rank job has no flight recorder: the trainer's on/off is an A/A comparison," \
    "not the recorder's cost (use --ranks 2 or more, one GPU each)"
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) cores)"
echo "bench: ${mpi[*]} -np $bench_ranks 01_collective_bench --device cpu --op all_reduce" \
  "--min-bytes $min_bytes --max-bytes $max_bytes --step-factor 64 --wait-each --reps 21" \
  "--iters 100 --json --flight-size {$size|0}"
echo "train: ${mpi[*]} -np $ranks 04_gpt_train --device $device $train $layout --steps $steps" \
  "--bench --bench-skip 5 --json --no-progress --flight-size {$size|0}"
bench_job() {  # bench_job PATH FLAGS...: the bench, its output in PATH.jsonl and PATH.err
  timeout 600 "${mpi[@]}" -np "$bench_ranks" "$bench" --device cpu --op all_reduce \
    --min-bytes "$min_bytes" --max-bytes "$max_bytes" --step-factor 64 --wait-each --reps 21 \
    --iters 100 --json "${@:2}" >"$1.jsonl" 2>"$1.err" || echo "bench failed (exit $?): $1.err"
}
run() {  # run ROUND SLOT SIDE FLIGHT_SIZE
  local tag="$1_$2_$3"
  bench_job "$out/bench_$tag" --flight-size "$4"
  # shellcheck disable=SC2086  # the model and layout flags are word lists
  timeout 600 "${mpi[@]}" -np "$ranks" "$trainer" --device "$device" $train $layout \
    --steps "$steps" --bench --bench-skip 5 --warmup 2 --json --no-progress \
    --data-dir "$out/data" --flight-size "$4" >"$out/train_$tag.jsonl" 2>"$out/train_$tag.err" ||
    echo "train $tag failed (exit $?): $out/train_$tag.err"
}
one_job() {  # one_job ROUND KIND [FLAGS]: the bench once with --flight-overhead (and FLAGS)
  bench_job "$out/$2_$1" --flight-overhead "${@:3}" --flight-size "$size"
}
for r in $(seq 1 "$rounds"); do
  run "$r" 1 on "$size"
  run "$r" 2 off 0
  run "$r" 3 off 0
  run "$r" 4 on "$size"
  one_job "$r" paired
  one_job "$r" control --flight-control
  echo "round $r/$rounds done (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$rounds" "$device" "$ranks" "$bench_ranks" <<'PY'
import json, statistics, sys
out, rounds, device, ranks, bench_ranks = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def rows(path):
    try:
        return [json.loads(l) for l in open(path) if l.startswith("{")]
    except OSError:
        return []
def bench(path):  # {bytes: time_us}
    return {r["bytes"]: r["time_us"] for r in rows(path) if "time_us" in r}
def train(path):  # {"step": median ms}
    s = [r for r in rows(path) if r.get("summary")]
    return {"step": s[-1]["median_ms"]} if s else {}
cases = {}  # name -> round -> slot -> value
for r in range(1, rounds + 1):
    for slot, side in ((1, "on"), (2, "off"), (3, "off"), (4, "on")):
        tag = f"{r}_{slot}_{side}"
        for k, v in bench(f"{out}/bench_{tag}.jsonl").items():
            cases.setdefault(f"all_reduce {k} B, {bench_ranks} CPU ranks, us/op", {}) \
                .setdefault(r, {})[slot] = v
        for k, v in train(f"{out}/train_{tag}.jsonl").items():
            cases.setdefault(f"trainer step, {ranks} {device} ranks, ms", {}) \
                .setdefault(r, {})[slot] = v
def spread(xs):  # "median [p25-p75] (min-max)"
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{statistics.median(xs):.3f} [{q[0]:.3f}-{q[2]:.3f}] ({min(xs):.3f}-{max(xs):.3f})"
print(f"\n{'case':40s} {'on':>8s} {'off':>8s} {'on/off':>6s}  "
      f"{'per round on/off: median [IQR] (range)':38s}  {'A/A off2/off1: median [IQR] (range)':36s}"
      f" rounds")
for name, by_round in cases.items():
    full = [v for v in by_round.values() if len(v) == 4]
    if not full:
        print(f"{name:40s} (no complete round)")
        continue
    on = [(v[1] + v[4]) / 2 for v in full]
    off = [(v[2] + v[3]) / 2 for v in full]
    per = [a / b for a, b in zip(on, off)]
    aa = [v[3] / v[2] for v in full]
    print(f"{name:40s} {statistics.median(on):8.2f} {statistics.median(off):8.2f} "
          f"{statistics.median(on) / statistics.median(off):6.3f}  {spread(per):38s}  "
          f"{spread(aa):36s} {len(full):6d}")
def ratios(kind):  # bytes -> [flight_ratio per round]
    by = {}
    for r in range(1, rounds + 1):
        for row in rows(f"{out}/{kind}_{r}.jsonl"):
            if "flight_ratio" in row:
                by.setdefault(row["bytes"], []).append(row["flight_ratio"])
    return by
paired, control = ratios("paired"), ratios("control")
for k, xs in paired.items():  # the A/A column: the same form with the recorder off on both sides
    aa = control.get(k, [])
    print(f"{f'all_reduce {k} B, one job, rec/unrec':40s} {'':8s} {'':8s} {'':6s}  "
          f"{spread(xs):38s}  {spread(aa) if aa else '(none)':36s} {len(xs):6d}")
PY
