#!/usr/bin/env bash
# Failures become errors (issue #21), with examples/04_gpt_train on the CPU under mpirun
# (ctest: reliability_trainer_*). Each run is bounded (timeout) and checked for its exit status,
# the time it took from the fault (the stderr line that reports it; timing.sh) and its messages:
#   throw   one rank throws alone (--inject-fault throw:STEP:RANK) at dp 2, tp 2 and dp 3: the job
#           ends non-zero within 30 s of the throw, the failing rank prints its own message, and
#           every other rank says "rank RANK failed: <that message>" (none waits for its own
#           deadline: the runs keep the default --timeout-s of 300 s)
#   stop    one rank stops itself (SIGSTOP) with --timeout-s 10, at dp 2 and tp 2: the job ends
#           non-zero, no sooner than 10 s after its launch (the deadline) and within 40 s of the
#           stop, with a Timeout naming the operation, its sequence number and the communicator
#           (the rank left waiting is usually inside the MPI call itself, where the progress
#           thread's watchdog reports it; a wait that sleeps throws it,
#           tests/mpi/collectives_failure_test.cpp), and names the stopped rank
#   flight  rank 5 of dp 2 x tp 2 x pp 2 stops itself with --timeout-s 10: the job ends non-zero
#           as in stop, a message names rank 5, the 7 other ranks leave flight_rank<r>.json, and
#           scripts/analyze_flight.py names rank 5 (issue #44)
# Usage: trainer_failure_test.sh TRAINER MPIEXEC WORKDIR CASE [mpirun flags...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/timing.sh"
trainer=$1 mpiexec=$2 work=$3 case=$4
shift 4
mpi_flags=("$@")
if [[ -z $trainer ]]; then echo "trainer_failure_test: SKIP (no 04_gpt_train in this build)"; exit 0; fi
rm -rf "$work/$case" && mkdir -p "$work/$case"
cd "$work/$case"
model=(--device cpu --layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --micro-batch 2
       --global-batch 12 --lr 3e-3 --warmup 5 --data-dir "$work/data" --json --no-progress
       --steps 200)

# expect_failure NAME RANKS MIN_SECONDS MAX_SECONDS FAULT FLAGS...: the run fails, no sooner than
# MIN_SECONDS after its launch and within MAX_SECONDS of its stderr's first line matching FAULT;
# its stderr (each line stamped with its arrival, timing.sh) is in NAME.err.
expect_failure() {
  local name=$1 ranks=$2 min_s=$3 max_s=$4 fault=$5
  shift 5
  echo "--- $name: $ranks ranks: $*"
  local t0 t1 status
  t0=$(date +%s.%N)
  set +e
  timeout $((max_s + 60)) "$mpiexec" "${mpi_flags[@]}" -np "$ranks" "$trainer" "${model[@]}" "$@" \
    2>&1 >"$name.jsonl" | stamp >"$name.err"
  status=${PIPESTATUS[0]}
  set -e
  t1=$(date +%s.%N)
  local took after
  took=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
  after=$(seconds_after "$name.err" "$fault" "$t1") || { echo "$after"; cat "$name.err"; exit 1; }
  echo "    exit status $status after $took s, $after s after the fault"
  if [[ $status -eq 0 ]]; then echo "$name: the run should have failed"; cat "$name.err"; exit 1; fi
  if [[ $status -eq 124 ]]; then echo "$name: still running after $((max_s + 60)) s (a hang)"; cat "$name.err"; exit 1; fi
  python3 -c "import sys; sys.exit(0 if $after <= $max_s else '$name: ended $after s after the fault, more than $max_s s')" ||
    { cat "$name.err"; exit 1; }
  python3 -c "import sys; sys.exit(0 if $took >= $min_s else '$name: ended $took s after its launch, before $min_s s')" ||
    { cat "$name.err"; exit 1; }
}

# require NAME PATTERN [MIN_COUNT]: NAME.err has at least MIN_COUNT (1) lines matching PATTERN.
require() {
  local name=$1 pattern=$2 min=${3:-1} n
  n=$(grep -c -E -- "$pattern" "$name.err" || true)
  if ((n < min)); then
    echo "$name: $n lines match '$pattern', expected >= $min, in:"; cat "$name.err"; exit 1
  fi
}

case $case in
  throw)
    for layout in "dp2 2 --dp 2" "tp2 2 --tp 2" "dp3 3 --dp 3"; do
      read -r name ranks flags <<<"$layout"
      last=$((ranks - 1))
      own="--inject-fault throw:3:$last: rank $last fails on its own at step 3"
      # shellcheck disable=SC2086
      expect_failure "$name" "$ranks" 0 30 "$own" $flags --inject-fault "throw:3:$last"
      # The failing rank's own message (not quoted by another rank) ...
      grep -v "rank $last failed" "$name.err" | grep -q -- "$own" ||
        { echo "$name: rank $last did not print its own error:"; cat "$name.err"; exit 1; }
      # ... and every other rank names it.
      require "$name" "rank $last failed: .*$own" "$last"
      # It trained until the failing step.
      python3 -c "import json,sys; s=[json.loads(l)['step'] for l in open('$name.jsonl') if '\"loss\"' in l]; sys.exit(0 if s and s[-1] == 2 else f'steps {s}: expected 1..2')"
    done
    ;;
  stop)
    for layout in "dp2 2 --dp 2" "tp2 2 --tp 2"; do
      read -r name ranks flags <<<"$layout"
      # shellcheck disable=SC2086
      expect_failure "$name" "$ranks" 10 40 "rank 1 stops itself \(SIGSTOP\)" $flags --timeout-s 10 \
        --inject-fault stop:3:1
      require "$name" "rank 1 stops itself \(SIGSTOP\) at step 3"
      # The rank left waiting names the operation, its sequence number and the communicator.
      require "$name" "Timeout.*[a-z_]+ #[0-9]+ .*on communicator '[a-z-]+' .*did not finish within 10 s|[a-z_]+ #[0-9]+ .*on communicator '[a-z-]+' .*did not finish within 10 s.*Timeout"
      # ... and names the stopped rank (issue #44).
      require "$name" "rank 1 has not completed [a-z_]+ #[0-9]+ on '[a-z-]+' and does not answer: it is stopped or dead"
    done
    ;;
  flight)
    # dp 2 x tp 2 x pp 2, world rank 5 stops: a message names it, the 7 others leave their flight
    # recorder's dump, and scripts/analyze_flight.py names it too.
    analyzer=$(dirname "$0")/../../scripts/analyze_flight.py
    expect_failure dp2tp2pp2 8 10 40 "rank 5 stops itself \(SIGSTOP\)" --dp 2 --tp 2 --pp 2 \
      --timeout-s 10 --inject-fault stop:3:5 --flight-dir "$work/$case/dumps"
    require dp2tp2pp2 "rank 5 stops itself \(SIGSTOP\) at step 3"
    require dp2tp2pp2 "rank 5 has not completed [a-z_2]+ #[0-9]+ on '[a-z-]+' and does not answer: it is stopped or dead|rank 5 of the job does not answer"
    for r in 0 1 2 3 4 6 7; do
      [[ -s dumps/flight_rank$r.json ]] || { echo "rank $r left no dump:"; ls dumps; cat dp2tp2pp2.err; exit 1; }
    done
    python3 "$analyzer" dumps >analysis.txt
    cat analysis.txt
    # Stopped, rank 5 leaves no dump; or it dumps when the end of the job continues it (mpirun
    # sends SIGCONT before it kills), and then it is behind.
    grep -q -E "^rank 5 (left no dump \(stopped or dead\)|never reached [a-z_]+ #[0-9]+ on '[a-z-]+') " analysis.txt ||
      { echo "the analyzer does not name rank 5"; exit 1; }
    ;;
  *)
    echo "unknown case $case"; exit 2 ;;
esac
echo "trainer_failure_test $case: PASS"
