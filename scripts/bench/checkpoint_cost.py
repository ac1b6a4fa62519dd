#!/usr/bin/env python3
"""The cost of checkpoints, from three trainer JSON logs (--json) of the same run: without saves,
with synchronous saves and with --async-save (both --save-every N).

  checkpoint_cost.py NONE.jsonl SYNC.jsonl ASYNC.jsonl --every N

Prints the time each save held the trainer (synchronous: the whole save; asynchronous: the
snapshot, plus any wait for the previous save's write), the total of it over the run for both,
and the median step
time of the 50 steps after each asynchronous save (while its files are written) and of the last
50 before the next one, against the same steps of the run without saves.
"""
import argparse
import json
import statistics


def load(path):
    steps, saves = {}, {}
    for line in open(path):
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        if "saved_step" in j:
            saves[j["saved_step"]] = (j["save_ms"], j.get("waited_ms", 0.0))
        elif "step" in j and "ms" in j:
            steps[j["step"]] = j["ms"]
    return steps, saves


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("none")
    ap.add_argument("sync")
    ap.add_argument("asynchronous")
    ap.add_argument("--every", type=int, required=True)
    a = ap.parse_args()
    none, _ = load(a.none)
    sync_steps, sync = load(a.sync)
    async_steps, asyn = load(a.asynchronous)
    print("synchronous save: " +
          ", ".join(f"step {s} {ms / 1e3:.2f} s" for s, (ms, _) in sync.items()))
    print("asynchronous save: " + ", ".join(
        f"step {s} snapshot {ms:.0f} ms (after waiting {w:.0f} ms for the previous write)"
        for s, (ms, w) in asyn.items()))
    # What the trainer waited in all, each save's own time plus its wait for the previous write.
    sync_total = sum(ms + w for ms, w in sync.values())
    async_total = sum(ms + w for ms, w in asyn.values())
    print(f"the trainer waited in all: synchronous {sync_total / 1e3:.2f} s, asynchronous "
          f"{async_total / 1e3:.2f} s (snapshots and waits for earlier writes), "
          f"{sync_total / max(async_total, 1e-9):.1f}x less")
    for s in sorted(asyn):
        if s in sync:
            ms, w = asyn[s]
            print(f"  step {s}: synchronous {sync[s][0] + sync[s][1]:.0f} ms, asynchronous "
                  f"{ms + w:.0f} ms ({(sync[s][0] + sync[s][1]) / max(ms + w, 1e-9):.1f}x less)")
    for s in sorted(asyn)[:-1]:  # the last save is at the end of the run
        for lo, hi, what in ((s + 1, s + 50, "while its files are written"),
                             (s + a.every - 50, s + a.every - 1, "later (control)")):
            r = [t for t in range(lo, hi + 1) if t in async_steps and t in none]
            if not r:
                continue
            m_async = statistics.median(async_steps[t] for t in r)
            m_none = statistics.median(none[t] for t in r)
            print(f"steps {r[0]}-{r[-1]} after the asynchronous save of step {s} ({what}): "
                  f"median {m_async:.2f} ms against {m_none:.2f} ms without saves "
                  f"({m_async / m_none:.3f}x)")


if __name__ == "__main__":
    main()
