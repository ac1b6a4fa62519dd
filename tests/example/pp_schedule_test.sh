#!/usr/bin/env bash
# Tests of examples/06_pp_schedule (ctest: pp_schedule_example_*):
#   json             --json for several schedules: the fields, 1F1B's bubble (p-1)/(m+p-1), ZB-H1's
#                    at most (p-1)/(3m+p-1), peaks per rank; the grid and --trace are written
#   bad_combination  an invalid combination exits non-zero with the rule in its message
#   file             --file loads a hand-written schedule; one that deadlocks exits non-zero naming
#                    the rank
# Usage: pp_schedule_test.sh PROGRAM WORKDIR CASE
set -euo pipefail
program=$1 work=$2 case=$3
rm -rf "$work/$case" && mkdir -p "$work/$case"
cd "$work/$case"

# check NAME PP M PYTHON-CONDITION FLAGS...: runs with --json, then asserts the condition on `d`.
check() {
  local name=$1 pp=$2 m=$3 cond=$4
  shift 4
  "$program" --pp "$pp" --microbatches "$m" --json "$@" >"$name.json"
  python3 - "$name.json" "$pp" "$m" "$cond" <<'PY'
import json, sys
path, p, m, cond = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
d = json.load(open(path))
for key in ("schedule", "makespan", "bubble_fraction", "peak_activations"):
    if key not in d: sys.exit(f"{path}: no '{key}' in {d}")
if len(d["peak_activations"]) != p: sys.exit(f"{path}: {len(d['peak_activations'])} peaks for pp {p}")
if not eval(cond): sys.exit(f"{path}: expected {cond}, found {d}")
print(f"{path}: {cond}: ok")
PY
}

case $case in
  json)
    check 1f1b 4 8 "d['schedule'] == '1f1b' and abs(d['bubble_fraction'] - 3/11) < 1e-9 and d['peak_activations'] == [4, 3, 2, 1]" --schedule 1f1b
    check 1f1b_unit 3 5 "abs(d['bubble_fraction'] - 2/7) < 1e-9 and d['makespan'] == 14" --schedule 1f1b --cost-b 1 --cost-w 0.5
    check gpipe 4 8 "d['peak_activations'] == [8, 8, 8, 8]" --schedule gpipe
    check zb_h1 4 8 "d['schedule'] == 'zb-h1' and d['bubble_fraction'] <= 3/27 + 1e-9 and max(d['peak_activations']) <= 4" --schedule zb-h1
    check interleaved 4 8 "d['schedule'] == 'interleaved' and d['vpp'] == 2 and d['bubble_fraction'] < 3/11" --schedule interleaved --vpp 2
    check zb_v 4 8 "d['schedule'] == 'zb-v' and d['bubble_fraction'] < 3/27" --schedule zb-v --vpp 2
    "$program" --pp 4 --microbatches 8 --schedule zb-h1 --trace trace.json >grid.txt
    grep -q "bubble fraction 0.1111" grid.txt
    grep -q "^rank 3 " grid.txt
    python3 -c "import json; t=json.load(open('trace.json')); x=[e for e in t['traceEvents'] if e['ph']=='X']; assert len(x) > 4*24, len(x)"
    ;;
  bad_combination)
    expect_error() {  # expect_error MESSAGE FLAGS...
      local message=$1
      shift
      if "$program" "$@" >out.txt 2>err.txt; then echo "expected failure: $*"; exit 1; fi
      grep -q -- "$message" err.txt || { echo "no '$message' in:"; cat err.txt; exit 1; }
    }
    expect_error "microbatches must be a multiple of pp, found 6" --schedule interleaved --pp 4 --vpp 2 --microbatches 6
    expect_error "zb-v takes vpp = 2" --schedule zb-v --pp 2 --vpp 3 --microbatches 4
    expect_error "zb-h1 needs microbatches >= pp" --schedule zb-h1 --pp 4 --microbatches 2
    expect_error "1f1b takes vpp = 1" --schedule 1f1b --pp 4 --vpp 2 --microbatches 8
    expect_error "expected gpipe, 1f1b, interleaved, zb-h1 or zb-v" --schedule pipedream
    ;;
  file)
    cat >hand.schedule <<'TXT'
# 1F1B on two ranks, by hand
schedule hand pp 2 vpp 1 microbatches 2
stages 0 1
rank 0: 0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1
rank 1: 1RF0 1F0 1B0 1SB0 1RF1 1F1 1B1 1SB1
TXT
    "$program" --file hand.schedule --json >hand.json
    python3 -c "import json; d=json.load(open('hand.json')); assert d['schedule']=='hand' and d['makespan']==9 and d['peak_activations']==[2,1], d"
    sed -e 's/^rank 0: .*/rank 0: 0F0 0SF0 0F1 0RB0 0B0 0SF1 0RB1 0B1/' \
        -e 's/^rank 1: .*/rank 1: 1RF0 1F0 1RF1 1F1 1B0 1SB0 1B1 1SB1/' hand.schedule >cycle.schedule
    if "$program" --file cycle.schedule 2>cycle.err >/dev/null; then echo "the cycle should fail"; exit 1; fi
    grep -q "rank 1 waits at 1RF1" cycle.err || { cat cycle.err; exit 1; }
    echo "schedule x pp 1 vpp 1 microbatches 1" >short.schedule
    if "$program" --file short.schedule 2>short.err >/dev/null; then echo "should fail"; exit 1; fi
    grep -q "short.schedule: line 1 (end of text)" short.err || { cat short.err; exit 1; }
    ;;
  *)
    echo "unknown case $case"; exit 2 ;;
esac
echo "pp_schedule_test $case: PASS"
