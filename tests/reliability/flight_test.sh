#!/usr/bin/env bash
# The flight recorder on a small job (tests/reliability/flight.cpp, issue #44). Each run is bounded
# and checked for its exit status, the time it took, its messages and the dumps:
#   skip      4 ranks, the last skips the fifth all_reduce on 'pp', --timeout-s 4: the job ends
#             non-zero within 30 s, a waiting rank's Timeout says "rank 3 never reached all_reduce
#             #4 on 'pp'", every rank leaves flight_rank<r>.json, and the analyzer says the same, and
#             still names rank 3 once its dump is removed
#   mismatch  2 ranks, the third all_reduce has 8 elements on rank 1 and 16 on rank 0: both dump
#             (however the mismatch ends), and the analyzer names seq 2 with both counts
#   usr1      2 ranks run for 12 s; SIGUSR1 to mpirun (which passes it on) makes both dump with
#             reason SIGUSR1 while the job goes on, and it exits 0
# Usage: flight_test.sh PROGRAM MPIEXEC ANALYZER CASE [mpirun flags...]
set -euo pipefail
program=$1 mpiexec=$2 analyzer=$3 case=$4
shift 4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# run RANKS MAX_S FLAGS...: runs the job; sets status and took.
run() {
  local ranks=$1 max_s=$2
  shift 2
  local t0
  t0=$(date +%s.%N)
  set +e
  timeout $((max_s + 30)) "$mpiexec" "${mpi_flags[@]}" -np "$ranks" "$program" --device cpu \
    --flight-dir "$work/dumps" "$@" >out.txt 2>err.txt
  status=$?
  set -e
  took=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
  echo "    exit status $status after $took s"
  if ((status == 124)); then echo "still running after $((max_s + 30)) s"; cat err.txt; exit 1; fi
  python3 -c "import sys; sys.exit(0 if $took <= $max_s else 'took $took s, more than $max_s s')" ||
    { cat err.txt; exit 1; }
}
mpi_flags=("$@")

# dumps RANKS [REASON_PATTERN]: every rank left its dump (whose reason matches).
dumps() {
  local r
  for ((r = 0; r < $1; ++r)); do
    [[ -s dumps/flight_rank$r.json ]] || { echo "no dump of rank $r"; ls -l dumps; cat err.txt; exit 1; }
    if [[ -n ${2:-} ]]; then
      python3 -c "import json,re,sys; d=json.load(open('dumps/flight_rank$r.json')); sys.exit(0 if re.search(r'''$2''', d['reason']) else 'rank $r dumped for: ' + d['reason'])"
    fi
  done
}

# analysis PATTERN: the analyzer's report has a line matching PATTERN.
analysis() {
  python3 "$analyzer" dumps >analysis.txt
  grep -q -E -- "$1" analysis.txt || { echo "analyzer: no line matches '$1':"; cat analysis.txt; exit 1; }
}

case $case in
  skip)
    echo "--- skip: 4 ranks"
    run 4 30 --mode skip --timeout-s 4
    ((status != 0)) || { echo "the job should have failed"; cat err.txt; exit 1; }
    grep -q "rank 3 never reached all_reduce #4 on 'pp'.*(ranks 0-2 waited 4 s)" err.txt ||
      { echo "no message names rank 3:"; cat err.txt; exit 1; }
    dumps 4
    analysis "^rank 3 never reached all_reduce #4 on 'pp' \(it issued up to #3\) \(ranks 0-2 waited\)"
    # A rank without a dump is named, and the rest is still read.
    rm dumps/flight_rank3.json
    analysis "^rank 3: no dump \(flight_rank3.json\)"
    analysis "^rank 3 left no dump \(stopped or dead\) and all_reduce #4 on 'pp' is not completed \(ranks 0-2 waited\)"
    ;;
  mismatch)
    echo "--- mismatch: 2 ranks"
    run 2 30 --mode mismatch --timeout-s 4
    dumps 2
    analysis "^mismatch at seq 2 on 'pp': rank 0: all_reduce f32 x 16; rank 1: all_reduce f32 x 8$"
    ;;
  usr1)
    echo "--- usr1: 2 ranks"
    t0=$(date +%s)
    "$mpiexec" "${mpi_flags[@]}" -np 2 "$program" --device cpu --flight-dir "$work/dumps" \
      --mode loop --seconds 12 >out.txt 2>err.txt &
    job=$!
    for ((i = 0; i < 200; ++i)); do
      (($(grep -c "ready" out.txt || true) == 2)) && break
      sleep 0.1
    done
    sleep 1
    kill -USR1 "$job"
    for ((i = 0; i < 100; ++i)); do
      [[ -s dumps/flight_rank0.json && -s dumps/flight_rank1.json ]] && break
      sleep 0.1
    done
    kill -0 "$job" 2>/dev/null || { echo "the job ended on SIGUSR1"; cat err.txt; exit 1; }
    set +e
    timeout 60 tail --pid="$job" -f /dev/null
    wait "$job"
    status=$?
    set -e
    echo "    exit status $status after $(($(date +%s) - t0)) s"
    ((status == 0)) || { echo "the job failed"; cat err.txt; exit 1; }
    grep -q "rank 1 done after" out.txt || { echo "rank 1 did not finish"; cat out.txt err.txt; exit 1; }
    dumps 2 "^SIGUSR1$"
    python3 -c "import json; d=json.load(open('dumps/flight_rank0.json')); c=[c for c in d['communicators'] if c['name']=='pp'][0]; assert c['completed'] > 0 and c['ops'], c"
    ;;
  *)
    echo "unknown case $case"; exit 2 ;;
esac
echo "flight_test $case: PASS"
