#!/usr/bin/env python3
"""Step time with the trace recorder on against off, from trainer JSON logs (--json).

  trace_overhead.py RUN.jsonl FIRST LAST [--skip N] [--plain PLAIN.jsonl]

RUN was started with --trace-steps FIRST:LAST: its steps FIRST..LAST were traced, the others
were not. Prints the median ms of the traced steps against the untraced ones after the first N
(default 4, warm-up), and against a run without --trace (PLAIN) when given.
"""
import argparse
import json
import statistics


def steps(path):
    return {j["step"]: j["ms"] for j in map(json.loads, (l for l in open(path) if l.startswith("{")))
            if "step" in j and "ms" in j}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("first", type=int)
    ap.add_argument("last", type=int)
    ap.add_argument("--skip", type=int, default=4)
    ap.add_argument("--plain")
    a = ap.parse_args()
    ms = steps(a.run)
    on = [v for s, v in ms.items() if a.first <= s <= a.last and s > a.skip]
    off = [v for s, v in ms.items() if not a.first <= s <= a.last and s > a.skip]
    m_on, m_off = statistics.median(on), statistics.median(off)
    print(f"traced steps: median {m_on:.2f} ms ({len(on)} steps); untraced steps of the same run: "
          f"median {m_off:.2f} ms ({len(off)} steps); on/off {m_on / m_off:.3f}")
    if a.plain:
        p = [v for s, v in steps(a.plain).items() if s > a.skip]
        m_p = statistics.median(p)
        print(f"run without --trace: median {m_p:.2f} ms ({len(p)} steps); traced/plain "
              f"{m_on / m_p:.3f}, untraced/plain {m_off / m_p:.3f}")


if __name__ == "__main__":
    main()
