#!/usr/bin/env python3
"""Checks a trainer run with --trace (tests/example/gpt_train_test.sh, case trace).

  check_trace.py DIR RUN.jsonl RANKS KINDS FIRST LAST

DIR holds trace_rank<r>.json for r < RANKS. Each is valid Chrome trace JSON; every rank has
compute ranges and communication of each kind in KINDS (comma-separated: dp,tp,zero,pp); every
range has a start and a duration >= 0 and lies within its step's range; the steps are FIRST..LAST.
RUN.jsonl: every step record has, per kind, hidden + exposed <= in flight, the measured exposed
time (before the cut at in flight) at most 5% + 0.5 ms past in flight, and exposed <= the step
time; the kinds in KINDS other than zero had communication; the straggler record counts every
compared collective once.
The meters against the trace (rank 0, whose step records RUN.jsonl holds; CPU runs, where both
read the host clock): in each traced step, the trace's waits on the operations a meter covers add
up to that meter's exposed time. Each meter's interval is taken just outside the waits the trace
records (its marks before and after them), so the meter is at least the waits' sum (less
rounding) and at most it plus what the code between the marks, or a preemption there, may add.
"""
import json
import sys

tol_us = 1.0  # the step range and its events are read from one clock, printed to 1 ns

# What each meter covers, as the trace names it (group, operation, bytes of a wait): tp, cp, ep
# and pp time every operation of their axis's communicator (TimedCommunicator, from the wait),
# pp only its transfers; dp times the waits for the gradient reductions (DataParallel, from
# finish()), not the loss's or the norm's one-element reductions.
METERED = {
    "tp": lambda group, op, size: group == "tp",
    "cp": lambda group, op, size: group == "cp",
    "ep": lambda group, op, size: group == "ep",
    "pp": lambda group, op, size: group == "pp" and op in ("p2p", "send", "recv"),
    "dp": lambda group, op, size: group in ("dp", "dp-cp", "edp") and size > 8 and
                                  op in ("all_reduce", "reduce_scatter"),
}
METER_BELOW_MS = 0.01  # the meter may fall short of the waits by rounding only


def meter_over_ms(waits_ms):
    """How far the meter may pass the waits: the code between its marks and the trace's."""
    return 2.0 + 0.1 * waits_ms


def fail(msg):
    sys.exit(f"check_trace: FAIL: {msg}")


def main():
    d, run, ranks, kinds, first, last = sys.argv[1:7]
    ranks, first, last = int(ranks), int(first), int(last)
    kinds = kinds.split(",")
    waits = {}  # rank 0's (step, meter) -> ms of the waits that meter covers
    for r in range(ranks):
        path = f"{d}/trace_rank{r}.json"
        try:
            with open(path) as f:
                t = json.load(f)
        except (OSError, ValueError) as e:
            fail(f"{path}: {e}")
        if t.get("rank") != r or "clock_sync_us" not in t:
            fail(f"{path}: rank {t.get('rank')}, clock_sync_us missing or wrong")
        events = t["traceEvents"]
        x = [e for e in events if e.get("ph") == "X"]
        steps = {e["args"]["step"]: (e["ts"], e["ts"] + e["dur"]) for e in x
                 if e["cat"] == "step"}
        if sorted(steps) != list(range(first, last + 1)):
            fail(f"{path}: steps {sorted(steps)}, expected {first}..{last}")
        cats = {e["cat"] for e in x}
        for k in ["compute"] + kinds:
            if k not in cats:
                fail(f"{path}: no {k} event (categories {sorted(cats)})")
        for e in x:
            if e["cat"] == "step":
                continue
            if not isinstance(e.get("ts"), (int, float)) or e.get("dur", -1) < 0:
                fail(f"{path}: event without start or end: {e}")
            s = e["args"]["step"]
            if s not in steps:
                fail(f"{path}: event of step {s} outside the traced steps: {e}")
            lo, hi = steps[s]
            if e["ts"] < lo - tol_us or e["ts"] + e["dur"] > hi + tol_us:
                fail(f"{path}: event outside its step {s} [{lo}, {hi}]: {e}")
        if r == 0:
            for e in x:
                a = e["args"]
                if not a.get("wait"):
                    continue
                op = e["name"].split()[-1]  # "wait all_reduce"
                for kind, covers in METERED.items():
                    if covers(a["group"], op, a["bytes"]):
                        key = (a["step"], kind)
                        waits[key] = waits.get(key, 0.0) + e["dur"] / 1000.0
        names = {e["name"] for e in x if e["cat"] == "compute"}
        for n in ("block 0 fwd", "block 0 bwd", "optimizer step"):
            if n not in names and r == 0:
                fail(f"{path}: no compute range {n!r}")
    records = [json.loads(l) for l in open(run) if l.startswith("{")]
    steps = [j for j in records if "step" in j and "comm" in j]
    if not steps:
        fail(f"{run}: no step records")
    seen = set()
    for j in steps:
        for kind, c in j["comm"].items():
            if c["hidden_ms"] + c["exposed_ms"] > c["comm_ms"] * (1 + 1e-9) + 1e-9:
                fail(f"step {j['step']} {kind}: hidden + exposed > in flight: {c}")
            if c["exposed_ms"] > j["ms"]:
                fail(f"step {j['step']} {kind}: exposed {c['exposed_ms']} > step {j['ms']} ms")
            # The cut of exposed at in flight is clock skew only: the measured value may pass
            # in flight by a little, not by a real interval.
            if c["measured_exposed_ms"] > c["comm_ms"] * 1.05 + 0.5:
                fail(f"step {j['step']} {kind}: measured exposed {c['measured_exposed_ms']} ms "
                     f"is past in flight {c['comm_ms']} ms")
            if min(c.values()) < 0:
                fail(f"step {j['step']} {kind}: negative time {c}")
            if c["comm_ms"] > 0:
                seen.add(kind)
    compared = 0
    for j in steps:
        if not first <= j["step"] <= last:
            continue
        for kind in METERED:
            meter = j["comm"][kind]["exposed_ms"]
            w = waits.get((j["step"], kind), 0.0)
            if meter < w - METER_BELOW_MS or meter > w + meter_over_ms(w):
                fail(f"step {j['step']} {kind}: the meter's exposed {meter:.3f} ms does not match "
                     f"the trace's waits on rank 0, {w:.3f} ms (allowed "
                     f"{w - METER_BELOW_MS:.3f}..{w + meter_over_ms(w):.3f})")
            compared += w > 0
    if compared == 0:
        fail(f"{run}: no metered wait in the traced steps to compare")
    for k in kinds:
        if k != "zero" and k not in seen:
            fail(f"{run}: no step had {k} communication (had {sorted(seen)})")
    strag = [j for j in records if "straggler" in j]
    if len(strag) != 1:
        fail(f"{run}: {len(strag)} straggler records")
    s = strag[0]
    if s["collectives_compared"] <= 0 or sum(s["last_at"]) != s["collectives_compared"]:
        fail(f"{run}: straggler record does not add up: {s}")
    if not 0 <= s["straggler"] < ranks:
        fail(f"{run}: straggler {s['straggler']} is not a rank")
    print(f"check_trace: {ranks} traces, steps {first}..{last}, kinds {kinds}, "
          f"{compared} meters matched by the trace's waits: OK")


if __name__ == "__main__":
    main()
