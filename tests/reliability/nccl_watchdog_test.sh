#!/usr/bin/env bash
# The NCCL watchdog on a GPU (tests/reliability/nccl_watchdog.cpp, issue #44): a held-back
# all_reduce that the program never waits for, with --timeout-s 3. Checked:
#   - the process ends non-zero (neither the program's own "no watchdog" exit 4 nor a kill by this
#     script) 3 to 15 s after its line saying the operation was issued (the 3 s timeout, a watchdog
#     period, at most 5 s for ncclCommAbort, the exit; timed as timing.sh says);
#   - stderr has "error [Timeout]: all_reduce #2 on communicator 'held' ... did not complete within
#     3 s ... the watchdog aborts the communicator and ends the process (flight recorder: PATH)";
#     'held' has no other rank to be behind (nor a channel to ask one), so the message names none
#     and says that the GPU work the operation follows never finished (a communicator of several
#     ranks names the one behind: nccl_flight_test.sh's watchdog modes);
#   - PATH (dumps/flight_rank0.json) exists, its reason names the operation, and its 'held'
#     communicator ('held (nccl)') has #1 completed and #2 still enqueued;
#     scripts/analyze_flight.py names #2.
# Exit 77 (skipped) without a GPU, like the other gpu tests.
# Usage: nccl_watchdog_test.sh PROGRAM ANALYZER
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/timing.sh"
program=$1 analyzer=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

set +e
timeout 50 "$program" --timeout-s 3 --flight-dir "$work/dumps" 2>&1 >out.txt | stamp >err.txt
status=${PIPESTATUS[0]}
set -e
end=$(date +%s.%N)
if ((status == 77)); then
  cat out.txt
  echo "nccl_watchdog_test: SKIP"
  exit 77
fi
cat out.txt err.txt
if ((status == 0 || status == 4 || status == 124 || status == 137)); then
  echo "exit status $status: the watchdog did not end the process"
  exit 1
fi
# From the moment the operation was issued (its stderr line; timing.sh): no earlier than the
# timeout, no later than 15 s.
took=$(seconds_after err.txt "nccl_watchdog: issued" "$end") || { echo "$took"; exit 1; }
echo "exit status $status, $took s after the operation was issued"
python3 -c "import sys; sys.exit(0 if 2.9 <= $took <= 15 else 'ended $took s after the operation was issued; expected 3-15 s')"

want="error \[Timeout\]: all_reduce #2 on communicator 'held' \(nccl, rank 0 of 1, cuda:0\) did not complete within 3 s"
grep -q -E "$want" err.txt || { echo "no line matches: $want"; exit 1; }
grep -q "(the communicator's timeout, --timeout-s): the GPU work it follows never finished, or a rank of the group" err.txt ||
  { echo "the error does not say what may have happened"; exit 1; }
if grep -q -E "rank [0-9]+ (never reached|has not completed)" err.txt; then
  echo "the error names a rank behind on a communicator of one rank"; exit 1
fi
grep -q "the watchdog aborts the communicator and ends the process (flight recorder: $work/dumps/flight_rank0.json)" err.txt ||
  { echo "the error does not name the dump"; exit 1; }

[[ -s dumps/flight_rank0.json ]] || { echo "no dump"; ls -la dumps || true; exit 1; }
python3 - <<'EOF'
import json, sys
d = json.load(open("dumps/flight_rank0.json"))
if "all_reduce #2 on communicator 'held'" not in d["reason"]:
    sys.exit("the dump's reason does not name the operation: " + d["reason"])
held = [c for c in d["communicators"] if c["name"] == "held (nccl)"]
if not held:
    sys.exit("no communicator 'held (nccl)' in the dump")
c = held[0]
ops = {o["seq"]: o for o in c["ops"]}
if c["completed"] != 1 or c["enqueued"] != 2:
    sys.exit(f"'held' completed {c['completed']}, enqueued {c['enqueued']}; expected 1 and 2")
if ops.get(1, {}).get("state") != "completed" or ops.get(2, {}).get("state") != "enqueued":
    sys.exit(f"unexpected states: {c['ops']}")
if ops[2]["op"] != "all_reduce" or ops[2]["count"] != 4096 or ops[2]["dtype"] != "f32":
    sys.exit(f"#2 is not the all_reduce f32 x 4096: {ops[2]}")
EOF
python3 "$analyzer" dumps >analysis.txt
cat analysis.txt
grep -q "'held (nccl)' (world ranks 0): every rank reached all_reduce #2 on 'held (nccl)'; rank 0 did not complete it" \
  analysis.txt || { echo "the analyzer does not name all_reduce #2"; exit 1; }
echo "nccl_watchdog_test: PASS"
