#!/usr/bin/env bash
# --cpu-affinity auto against none (#46, docs/topology.md), in one invocation (after
# scripts/setup.sh), every run bounded in time, one log per run under $OUT (else
# build/bench/affinity/), then a summary of medians and auto/none ratios
# (scripts/bench/affinity_summary.py):
#
#   a. one GPU rank: the data loader's delivery to the GPU (03_loader_bench, 2 and 4 threads, the
#      built-in dataset in build/data/synthetic as gpu_benchmarks.sh reads it) and the trainer's
#      step (04_gpt_train, a small GPT whose step is short enough for the host to matter, --bench),
#      each with auto and with none, each on a quiet machine and with a competing CPU load: one
#      busy `yes` pinned by taskset to every CPU outside auto's placement (when auto places the
#      rank on every CPU, one NUMA node, the upper half of the CPUs; the summary says which).
#      The trainer runs under `mpirun --bind-to none`: mpirun binds one rank to one core by
#      default, which would leave auto nothing to place.
#   b. CPU ranks, 4 ranks of nproc/4 cores: the collective benchmark (01_collective_bench,
#      all_reduce, CPU) and the 4-rank data-parallel trainer, placed three ways: auto (mpirun
#      --bind-to none, Quintet shares the host out), mpirun's own binding (--map-by slot:PE=N
#      --bind-to core, --cpu-affinity none) and none (--bind-to none, --cpu-affinity none).
#
# Rounds (ROUNDS, default 3) are the outer loop, so a run cut short by BUDGET (seconds, default
# 400) still has whole rounds; within a round the variants' order is reversed every other round.
# DEVICE=cpu (2 cores are enough, ranks oversubscribed) runs part a on the CPU with tiny sizes
# and part b with tiny sizes: a smoke test of the script and its summary, not a measurement.
#
#   OUT=/tmp/aff bash scripts/bench/affinity_bench.sh             # the GPU machine, est. 330 s
#   DEVICE=cpu ROUNDS=2 OUT=/tmp/aff bash scripts/bench/affinity_bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-build/bench/affinity}
device=${DEVICE:-cuda}
rounds=${ROUNDS:-3}
budget=${BUDGET:-400}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ex=build/examples
loader=$ex/03_loader_bench/03_loader_bench
train=$ex/04_gpt_train/04_gpt_train
coll=$ex/01_collective_bench/01_collective_bench
ncpu=$(nproc)

case $device in
  cuda)
    loader_data=(--data-dir build/data/synthetic --device cuda:0)
    loader_run=(--threads "2,4" --steps 20000 --json)
    train1=(--device cuda --layers 4 --hidden 512 --heads 8 --seq-len 512 --micro-batch 8
            --global-batch 8 --steps 60 --bench --bench-skip 10 --warmup 2 --json
            --data-dir build/data/synthetic --no-progress)
    coll_args=(--op all_reduce --device cpu --min-bytes 1M --max-bytes 16M --step-factor 4
               --iters 10 --warmup 3 --reps 5 --json)
    train4=(--device cpu --layers 2 --hidden 128 --heads 4 --seq-len 128 --micro-batch 4
            --global-batch 16 --dp 4 --steps 14 --bench --bench-skip 4 --warmup 2 --json
            --data-dir build/data/synthetic --no-progress)
    mpi=()
    limit_loader=60 limit_train1=90 limit_coll=60 limit_train4=90
    ;;
  cpu)
    loader_data=(--data-dir build/data/affinity_smoke --synthetic-tokens 262144 --seq-len 128
                 --device cpu)
    loader_run=(--threads "1,2" --steps 200 --json)
    train1=(--device cpu --layers 2 --hidden 64 --heads 4 --seq-len 32 --micro-batch 2
            --global-batch 2 --steps 8 --bench --bench-skip 3 --warmup 2 --json
            --data-dir build/data/affinity_smoke --no-progress)
    coll_args=(--op all_reduce --device cpu --min-bytes 64K --max-bytes 256K --step-factor 4
               --iters 3 --warmup 1 --reps 3 --json)
    train4=(--device cpu --layers 2 --hidden 64 --heads 4 --seq-len 32 --micro-batch 2
            --global-batch 8 --dp 4 --steps 8 --bench --bench-skip 3 --warmup 2 --json
            --data-dir build/data/affinity_smoke --no-progress)
    mpi=(--oversubscribe)
    limit_loader=60 limit_train1=60 limit_coll=60 limit_train4=60
    ;;
  *) echo "affinity_bench: DEVICE must be cuda or cpu, not '$device'" >&2; exit 2 ;;
esac
pe=$((ncpu / 4))
bind_core=core
if [ "$pe" -lt 1 ]; then pe=1 bind_core=core:overload-allowed; fi

# CPU lists ("0-3,8") to one CPU a line, and back.
expand() {
  local part IFS=,
  for part in $1; do
    if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
  done
}
join() { paste -sd, -; }

# Where auto places one rank of this device: the loader bench's header says it.
probe=$(timeout 120 "$loader" "${loader_data[@]}" --steps 1 --threads 1 --cpu-affinity auto 2>&1 |
  tee "$out/probe.log" | grep -m1 '^cpus ')
placed=$(sed -E 's/^cpus ([^ ]*) \(given ([^,]*), .*/\1/' <<<"$probe")
given=$(sed -E 's/^cpus ([^ ]*) \(given ([^,]*), .*/\2/' <<<"$probe")
if [ -z "$placed" ] || [ -z "$given" ]; then
  echo "affinity_bench: could not read auto's placement (see $out/probe.log)" >&2
  cat "$out/probe.log" >&2
  exit 1
fi
load_cpus=$(expand "$given" | grep -vxF -f <(expand "$placed") | join)
load_note="the CPUs outside auto's placement"
if [ -z "$load_cpus" ]; then
  load_cpus=$(expand "$given" | tail -n $(($(expand "$given" | wc -l) / 2)) | join)
  load_note="the upper half of the CPUs: auto places the rank on all of them, as none leaves it"
fi
[ -z "$load_cpus" ] && load_cpus=$given  # a single CPU
{
  echo "device $device, $ncpu cpus, commit $(git rev-parse --short HEAD 2>/dev/null)"
  echo "one rank, auto: cpus $placed (given $given); load on cpus $load_cpus ($load_note)"
  echo "4 ranks: mpirun --map-by slot:PE=$pe --bind-to $bind_core for mpirun's binding"
} >"$out/setup.txt"

load_pids=()
start_load() {
  local c
  for c in $(expand "$load_cpus"); do
    taskset -c "$c" yes >/dev/null &
    load_pids+=($!)
  done
}
stop_load() {
  local p
  for p in "${load_pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${load_pids[@]}"; do wait "$p" 2>/dev/null; done
  load_pids=()
}
trap stop_load EXIT

run() {  # run NAME SECONDS COMMAND...: bounded by SECONDS and by the budget left
  local name=$1 limit=$2; shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 15 ]; then echo "=== $name not run (budget)"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "=== $name exit $? ($((SECONDS - t0)) s)"
}

# One GPU rank (part a): NAME = PART_AFFINITY_LOAD_rROUND.
one_rank() {  # one_rank ROUND AFFINITY LOAD
  local r=$1 aff=$2 load=$3
  [ "$load" = load ] && start_load
  run "loader_${aff}_${load}_r$r" "$limit_loader" "$loader" "${loader_data[@]}" "${loader_run[@]}" \
    --cpu-affinity "$aff"
  run "train1_${aff}_${load}_r$r" "$limit_train1" mpirun -np 1 --bind-to none "${mpi[@]}" \
    "$train" "${train1[@]}" --cpu-affinity "$aff"
  [ "$load" = load ] && stop_load
}

# Four CPU ranks (part b).
four_ranks() {  # four_ranks ROUND PLACEMENT
  local r=$1 how=$2 bind aff
  case $how in
    auto) bind=(--bind-to none) aff=auto ;;
    mpirun) bind=(--map-by "slot:PE=$pe" --bind-to "$bind_core") aff=none ;;
    none) bind=(--bind-to none) aff=none ;;
  esac
  run "coll_${how}_quiet_r$r" "$limit_coll" mpirun -np 4 "${bind[@]}" "${mpi[@]}" "$coll" \
    "${coll_args[@]}" --cpu-affinity "$aff"
  run "train4_${how}_quiet_r$r" "$limit_train4" mpirun -np 4 "${bind[@]}" "${mpi[@]}" "$train" \
    "${train4[@]}" --cpu-affinity "$aff"
}

for ((r = 1; r <= rounds; ++r)); do
  a=("auto quiet" "none quiet" "none load" "auto load")
  b=(auto mpirun none)
  if ((r % 2 == 0)); then a=("auto load" "none load" "none quiet" "auto quiet") b=(none mpirun auto); fi
  for v in "${a[@]}"; do
    # shellcheck disable=SC2086  # "AFFINITY LOAD"
    one_rank "$r" $v
  done
  for v in "${b[@]}"; do four_ranks "$r" "$v"; done
done
python3 scripts/bench/affinity_summary.py "$out" | tee "$out/summary.md"
