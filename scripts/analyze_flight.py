#!/usr/bin/env python3
"""Reads the flight recorder dumps of a job (flight_rank<r>.json, issue #44) and says, per
communicator, which ranks never reached the first operation not completed everywhere, and which
operations differ across ranks at the same sequence number.

    scripts/analyze_flight.py DIR

A rank without a dump is named (it was stopped, died, or could not write), never fatal. Point-to-
point operations (send, recv, p2p) are numbered per rank, so only collectives are compared across
ranks; for them the pending operation of each rank is listed instead. Exit status: 0 when the
dumps were read (whatever they say), 2 when DIR holds none. Python 3 standard library only.
"""
import glob
import json
import os
import re
import sys

P2P = {"send", "recv", "p2p"}


def rank_list(ranks):
    """[0, 1, 2, 5] -> '0-2, 5'."""
    ranks = sorted(set(ranks))
    out, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ", ".join(out)


def ranks_phrase(ranks):
    return ("rank " if len(set(ranks)) == 1 else "ranks ") + rank_list(ranks)


def load(directory):
    dumps, bad = {}, []
    for path in sorted(glob.glob(os.path.join(directory, "flight_rank*.json"))):
        m = re.search(r"flight_rank(\d+)\.json$", path)
        if not m:
            continue
        try:
            with open(path) as f:
                dumps[int(m.group(1))] = json.load(f)
        except (OSError, ValueError) as e:
            bad.append(f"{path}: {e}")
    return dumps, bad


def describe(op):
    return f"{op['op']} {op['dtype']} x {op['count']}"


def analyze(directory):
    dumps, bad = load(directory)
    lines = []
    for b in bad:
        lines.append(f"unreadable dump: {b}")
    if not dumps:
        lines.append(f"no flight_rank<r>.json in {directory}")
        return lines, 2
    world = max(d.get("world_size", 0) for d in dumps.values())
    world = max(world, max(dumps) + 1)
    missing = [r for r in range(world) if r not in dumps]
    lines.append(f"{len(dumps)} of {world} ranks dumped")
    for r in missing:
        lines.append(f"rank {r}: no dump (flight_rank{r}.json): it was stopped, died, or could not write")
    for r in sorted(dumps):
        lines.append(f"rank {r}: {dumps[r].get('reason', '')}")

    # One entry per communicator instance: its name and its members' world ranks.
    groups = {}
    for r, d in dumps.items():
        for c in d.get("communicators", []):
            key = (c["name"], tuple(c["world_ranks"]))
            group = groups.setdefault(key, {})
            if r not in group or not c.get("retired"):  # a live one wins over a retired one
                group[r] = c
    for (name, members), by_rank in sorted(groups.items()):
        head = f"'{name}' (world ranks {rank_list(members)})"
        absent = [m for m in members if m not in dumps]
        ops_by_seq = {}
        for r, c in by_rank.items():
            for op in c.get("ops", []):
                ops_by_seq.setdefault(op["seq"], {})[r] = op
        first = min(c["completed"] for c in by_rank.values()) + 1
        last = max(c["enqueued"] for c in by_rank.values())
        if last < 0:
            continue  # never used
        point_to_point = any(o["op"] in P2P for o in ops_by_seq.get(first, {}).values())
        if first > last:  # nothing pending among the dumps
            note = f" ({ranks_phrase(absent)} left no dump)" if absent else ""
            lines.append(f"{head}: every rank completed up to #{last}{note}")
        elif point_to_point:
            for r, c in sorted(by_rank.items()):
                if c["completed"] < c["enqueued"]:
                    op = ops_by_seq.get(c["completed"] + 1, {}).get(r)
                    if op:
                        peer = f"rank {members[op['peer']]}" if 0 <= op["peer"] < len(members) else "several ranks"
                        what = f"{op['op']} #{op['seq']} with {peer} ({op['state']})"
                    else:
                        what = f"#{c['completed'] + 1}"
                    lines.append(f"{head}: rank {r} waits for {what}")
            for r in absent:
                lines.append(f"{head}: rank {r} left no dump (stopped or dead)")
        else:
            at = ops_by_seq.get(first, {})
            opname = next(iter(at.values()))["op"] if at else "operation"
            what = f"{opname} #{first} on '{name}'"
            never = [r for r, c in by_rank.items() if c["enqueued"] < first]
            waited = [r for r, c in by_rank.items() if c["enqueued"] >= first and c["completed"] < first]
            for r in sorted(never):
                lines.append(f"rank {r} never reached {what} (it issued up to #{by_rank[r]['enqueued']})"
                             + (f" ({ranks_phrase(waited)} waited)" if waited else ""))
            for r in absent:
                lines.append(f"rank {r} left no dump (stopped or dead) and {what} is not completed"
                             + (f" ({ranks_phrase(waited)} waited)" if waited else ""))
            if not never and not absent:
                lines.append(f"{head}: every rank reached {what}; {ranks_phrase(waited)} did not complete it")
        # Collectives that differ across ranks at the same sequence number.
        for seq in sorted(ops_by_seq):
            at = ops_by_seq[seq]
            if len(at) < 2 or any(o["op"] in P2P for o in at.values()):
                continue
            kinds = {}
            for r, o in at.items():
                kinds.setdefault(describe(o), []).append(r)
            if len(kinds) > 1:
                parts = "; ".join(f"{ranks_phrase(rs)}: {k}" for k, rs in sorted(kinds.items(), key=lambda kv: min(kv[1])))
                lines.append(f"mismatch at seq {seq} on '{name}': {parts}")
    return lines, 0


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    lines, status = analyze(argv[1])
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
