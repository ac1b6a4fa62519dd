#!/usr/bin/env bash
# World's failure path for any program (tests/reliability/world_failure.cpp), at 2 and 3 ranks,
# with World::fail in the handler and with the exception leaving the World's scope: the job ends
# non-zero within 30 s of the failure's first report (a stderr line; timing.sh), the last rank
# prints its own error, every other rank names it.
# Usage: world_failure_test.sh PROGRAM MPIEXEC [mpirun flags...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/timing.sh"
program=$1 mpiexec=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
for ranks in 2 3; do
  for handler in fail outside; do
    echo "--- $ranks ranks, --handler $handler"
    set +e
    timeout 90 "$mpiexec" "$@" -np "$ranks" "$program" --handler "$handler" --device cpu \
      2>&1 >out.txt | stamp >err.txt
    status=${PIPESTATUS[0]}
    set -e
    end=$(date +%s.%N)
    # From the first line that reports the failure (the last rank's, or another's naming it).
    took=$(seconds_after err.txt "the last rank breaks|rank [0-9]+ failed" "$end") ||
      { echo "$took"; cat err.txt; exit 1; }
    echo "    exit status $status, $took s after the failure was reported"
    if ((status == 0 || status == 124)) ||
       ! python3 -c "import sys; sys.exit(0 if $took <= 30 else 1)"; then
      cat err.txt; exit 1
    fi
    last=$((ranks - 1))
    grep -v "rank $last failed" err.txt | grep -q "world_failure: the last rank breaks" ||
      { echo "the failing rank did not print its error:"; cat err.txt; exit 1; }
    if [[ $handler == fail ]]; then
      want="rank $last failed: the last rank breaks"
    else
      want="rank $last failed: an exception propagated out of the scope of its quintet::World"
    fi
    n=$(grep -c -- "$want" err.txt || true)
    ((n >= last)) || { echo "$n lines with '$want', expected >= $last:"; cat err.txt; exit 1; }
  done
done
echo "world_failure_test: PASS"
