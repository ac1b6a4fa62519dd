#!/usr/bin/env bash
# A skipped collective on the mesh's NCCL 'dp' axis (tests/reliability/nccl_flight.cpp, issue #44),
# with --timeout-s 5, launched twice: under mpirun, and as two processes with RANK/WORLD_SIZE.
# Checked each time:
#   - rank 0's error names "all_reduce #2 on communicator 'dp' (nccl, rank 0 of 2, ...)" and ends
#     with its dump's path; under mpirun it says "rank 1 never reached all_reduce #2 on 'dp (nccl)'"
#     (the ranks compared their progress over the job monitor), under RANK/WORLD_SIZE (no channel
#     to ask over) that a rank may not have issued it; the job ends non-zero (under
#     RANK/WORLD_SIZE: rank 0 exits 3, rank 1, which skipped #2, exits 0);
#   - both ranks dumped; each dump has 'dp (nccl)' with world ranks [0, 1]: rank 0's with #2
#     (all_reduce f32 x 4096) issued and not completed, rank 1's with #1 completed and nothing
#     after it;
#   - scripts/analyze_flight.py says "rank 1 never reached all_reduce #2 on 'dp (nccl)'".
# Then twice more under mpirun with rank 0 never waiting for #2 (nccl_flight.cpp's `watchdog`
# modes): the communicator's watchdog ends the job, and its "error [Timeout]: all_reduce #2 on
# communicator 'dp' ... did not complete within 5 s of being issued" names the laggard: "rank 1
# never reached all_reduce #2 on 'dp (nccl)' ... (rank 0 waited 5 s)" while rank 1 sleeps, "rank 1
# has not completed all_reduce #2 on 'dp (nccl)' and does not answer: it is stopped or dead" when
# it is stopped (SIGSTOP).
# Exit 77 (skipped) with fewer than 2 GPUs, like the other gpu tests.
# Usage: nccl_flight_test.sh PROGRAM ANALYZER MPIEXEC [MPIRUN FLAGS...]
set -euo pipefail
program=$1 analyzer=$2 mpiexec=$3
shift 3
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if ((gpus < 2)); then
  echo "nccl_flight_test: ${gpus:-0} GPU(s), 2 needed: SKIP"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export NCCL_NVLS_ENABLE=0
flags=(--device cuda --timeout-s 5)

check() {  # check MODE: the dumps in MODE/ and rank 0's stderr in MODE.err
  local mode=$1
  grep -q -E "all_reduce #2 on communicator 'dp' \(nccl, rank 0 of 2, cuda:[0-9]+\) timed out" \
    "$mode.err" || { echo "$mode: rank 0's error does not name all_reduce #2 on 'dp'"; exit 1; }
  grep -q "(flight recorder: $work/$mode/flight_rank0.json)" "$mode.err" ||
    { echo "$mode: rank 0's error does not name its dump"; exit 1; }
  python3 - "$mode" <<'PY'
import json, sys
mode = sys.argv[1]
for rank, enqueued, completed in ((0, 2, 1), (1, 1, 1)):
    d = json.load(open(f"{mode}/flight_rank{rank}.json"))
    dp = [c for c in d["communicators"] if c["name"] == "dp (nccl)"]
    if len(dp) != 1:
        sys.exit(f"{mode}: rank {rank}'s dump has {len(dp)} 'dp (nccl)': {[c['name'] for c in d['communicators']]}")
    c = dp[0]
    if c["world_ranks"] != [0, 1] or c["rank"] != rank:
        sys.exit(f"{mode}: rank {rank}'s 'dp (nccl)' is rank {c['rank']} of world ranks {c['world_ranks']}")
    if c["enqueued"] != enqueued or c["completed"] != completed:
        sys.exit(f"{mode}: rank {rank}'s 'dp (nccl)' enqueued {c['enqueued']}, completed "
                 f"{c['completed']}; expected {enqueued} and {completed}")
    last = {o["seq"]: o for o in c["ops"]}.get(enqueued, {})
    if (last.get("op"), last.get("dtype"), last.get("count")) != ("all_reduce", "f32", 4096):
        sys.exit(f"{mode}: rank {rank}'s #{enqueued} is not the all_reduce f32 x 4096: {last}")
PY
  python3 "$analyzer" "$mode" >"$mode.analysis"
  cat "$mode.analysis"
  grep -q "rank 1 never reached all_reduce #2 on 'dp (nccl)'" "$mode.analysis" ||
    { echo "$mode: the analyzer does not name rank 1"; exit 1; }
}

echo "--- mpirun -np 2"
set +e
timeout 90 "$mpiexec" "$@" -np 2 "$program" "${flags[@]}" --flight-dir "$work/mpi" \
  >mpi.out 2>mpi.err
status=$?
set -e
cat mpi.out mpi.err
if ((status == 0 || status == 4 || status == 124 || status == 137)); then
  echo "mpi: exit status $status; expected the job to fail on rank 0's Timeout"
  exit 1
fi
check mpi
grep -q "rank 1 never reached all_reduce #2 on 'dp (nccl)' (it has issued up to #1 there; .*) (rank 0 waited 5 s)" mpi.err ||
  { echo "mpi: rank 0's Timeout does not name rank 1"; exit 1; }

for mode in watchdog watchdog-stop; do
  echo "--- mpirun -np 2, $mode"
  set +e
  timeout 90 "$mpiexec" "$@" -np 2 "$program" "$mode" "${flags[@]}" --flight-dir "$work/$mode" \
    >"$mode.out" 2>"$mode.err"
  status=$?
  set -e
  cat "$mode.out" "$mode.err"
  if ((status == 0 || status == 4 || status == 124 || status == 137)); then
    echo "$mode: exit status $status; expected the watchdog to end the job"
    exit 1
  fi
  grep -q -E "error \[Timeout\]: all_reduce #2 on communicator 'dp' \(nccl, rank 0 of 2, cuda:[0-9]+\) did not complete within 5 s of being issued" \
    "$mode.err" || { echo "$mode: no watchdog error for all_reduce #2 on 'dp'"; exit 1; }
  if [[ $mode == watchdog ]]; then
    want="rank 1 never reached all_reduce #2 on 'dp (nccl)' (it has issued up to #1 there; .*) (rank 0 waited 5 s); the watchdog aborts the communicator"
  else
    want="rank 1 has not completed all_reduce #2 on 'dp (nccl)' and does not answer: it is stopped or dead (rank 0 waited 5 s); the watchdog aborts the communicator"
  fi
  grep -q "$want" "$mode.err" || { echo "$mode: the watchdog's error does not say: $want"; exit 1; }
done

echo "--- RANK/WORLD_SIZE"
port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 90 "$program" "${flags[@]}" --flight-dir "$work/env" >"env$r.out" 2>"env$r.err" &
  pids+=($!)
done
set +e
wait "${pids[0]}"; s0=$?
wait "${pids[1]}"; s1=$?
set -e
cat env0.out env0.err env1.out env1.err
((s0 == 3 && s1 == 0)) || { echo "env: exit statuses $s0 and $s1; expected 3 and 0"; exit 1; }
cp env0.err env.err
check env
grep -q "a rank of the group may not have issued the matching operation" env.err ||
  { echo "env: rank 0's Timeout does not say what may have happened"; exit 1; }
echo "nccl_flight_test: PASS"
