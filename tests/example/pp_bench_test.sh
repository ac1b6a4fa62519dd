#!/usr/bin/env bash
# examples/07_pp_bench on 2 CPU ranks, tiny model, every schedule: it runs, and its JSON has every
# figure for every schedule, in range (bubbles in [0, 1), a peak in flight per rank equal to the
# simulator's, a positive step time and activation memory, GPipe holding at least 1F1B's).
# Usage: pp_bench_test.sh BENCH MPIEXEC WORKDIR [mpirun flags...]
set -euo pipefail
bench=$1 mpiexec=$2 work=$3
shift 3
rm -rf "$work" && mkdir -p "$work" && cd "$work"
"$mpiexec" "$@" -np 2 "$bench" --device cpu --layers 4 --hidden 32 --heads 2 --vocab 64 \
  --seq-len 16 --micro-batch 2 --microbatches 4 --steps 2 --warmup 1 --json pp.json
python3 - <<'PY'
import json, sys
d = json.load(open("pp.json"))
rs = {r["schedule"]: r for r in d["results"]}
want = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"}
if set(rs) != want:
    sys.exit(f"schedules {sorted(rs)}, expected {sorted(want)}")
for name, r in rs.items():
    for key in ("bubble_measured", "bubble_predicted"):
        if not 0.0 <= r[key] < 1.0:
            sys.exit(f"{name}: {key} = {r[key]}")
    if r["step_ms"] <= 0 or min(r["peak_activation_mib"]) <= 0:
        sys.exit(f"{name}: step {r['step_ms']} ms, memory {r['peak_activation_mib']}")
    if r["peak_in_flight_measured"] != r["peak_in_flight_simulated"]:
        sys.exit(f"{name}: in flight {r['peak_in_flight_measured']} vs {r['peak_in_flight_simulated']}")
    if len(r["costs_ms"]) != 2 * r["vpp"]:
        sys.exit(f"{name}: {len(r['costs_ms'])} stage costs")
if rs["gpipe"]["peak_in_flight_measured"][0] != 4 or rs["1f1b"]["peak_in_flight_measured"][0] != 2:
    sys.exit(f"in flight on rank 0: gpipe {rs['gpipe']['peak_in_flight_measured']}, 1f1b {rs['1f1b']['peak_in_flight_measured']}")
if rs["gpipe"]["peak_activation_mib"][0] < rs["1f1b"]["peak_activation_mib"][0]:
    sys.exit("gpipe holds less activation memory than 1f1b on rank 0")
print("pp_bench_test: PASS")
PY
