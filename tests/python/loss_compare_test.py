#!/usr/bin/env python3
"""Tests of scripts/bench/loss_compare.py (bf16 against FP8 in fp8_loss_curves.sh) on made-up
per-step logs, run by ctest (tests/cmake/python.cmake): two curves within the tolerance (exit 0),
outside it (exit 1), a NaN loss, and missing or step-less logs (exit 2), with the JSON line's
fields: the means of the last steps, the relative difference, the largest gap of the running
means after the first steps. Plain asserts (`python3 loss_compare_test.py`, which prints
"N passed, N failed") or under pytest.
"""
import contextlib
import io
import json
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "bench"))
import loss_compare as lc  # noqa: E402
from plain_tests import run_tests  # noqa: E402


def write_log(path, losses, noise=True):
    """A trainer log: step records 1..N (None: JSON's null, a NaN loss), other lines around."""
    with open(path, "w") as f:
        if noise:
            f.write("=== starting\n[warn] something on stderr\n")
        for i, loss in enumerate(losses, start=1):
            f.write(json.dumps({"step": i, "loss": loss, "entropy_floor": 2.0, "ms": 50.0}) + "\n")
        if noise:
            f.write(json.dumps({"summary": True, "final_loss": losses[-1]}) + "\n")


def run(*argv):
    """loss_compare's exit status, its JSON record (or None) and its other lines."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = lc.main(list(argv))
    lines = buf.getvalue().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(records) <= 1, lines
    return rc, records[0] if records else None, [line for line in lines if line[:1] != "{"]


def curve(n, end, start=6.0):
    """A falling curve from start to end over n steps."""
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def test_within_tolerance():
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "bf16.log"), os.path.join(d, "fp8.log")
        write_log(a, [3.0] * 100)
        # 0.5 % above over the last 20 steps, 1 % above at steps 51..70: the running mean of 20
        # steps is 1 % above at step 70 alone
        losses = [3.0] * 50 + [3.03] * 20 + [3.0] * 10 + [3.015] * 20
        write_log(b, losses)
        rc, r, lines = run(a, b, "--name", "gpt406m", "--labels", "bf16", "fp8")
        assert rc == 0, (rc, lines)
        assert r["loss_compare"] == "gpt406m" and r["within"] is True, r
        assert (r["first"], r["second"]) == ("bf16", "fp8"), r
        assert r["final_window"] == 20 and r["common_steps"] == 100, r
        assert math.isclose(r["final_first"], 3.0) and math.isclose(r["final_second"], 3.015), r
        assert math.isclose(r["rel_diff"], 0.005), r
        assert math.isclose(r["max_smoothed_gap"], 0.01) and r["max_gap_step"] == 70, r
        assert lines[0].startswith("loss gpt406m: final (mean of the last 20 of 100"), lines
        assert "fp8 +0.50% of bf16, within 1%" in lines[0], lines
        assert "1.00% at step 70" in lines[0], lines


def test_outside_tolerance_and_flags():
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "bf16.log"), os.path.join(d, "fp8.log")
        write_log(a, curve(60, 3.0))
        write_log(b, curve(60, 2.94, start=6.0))  # ends 2 % below
        rc, r, lines = run(a, b)
        assert rc == 1, (rc, lines)
        assert r["within"] is False and r["rel_diff"] < -0.01, r
        assert "OUTSIDE 1%" in lines[0], lines
        rc, r, _ = run(a, b, "--tolerance", "0.05")  # a wider tolerance takes it
        assert rc == 0 and r["tolerance"] == 0.05, r
        rc, r, lines = run(a, b, "--skip", "60", "--window", "5")  # no step after the first 60
        assert r["max_smoothed_gap"] is None and r["final_window"] == 5, r
        assert "no steps after the first 60" in lines[0], lines


def test_nan_and_different_lengths():
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "bf16.log"), os.path.join(d, "fp8.log")
        write_log(a, [3.0] * 80)
        write_log(b, [3.0] * 70 + [None] * 5)  # diverged, and cut short (a time-out)
        rc, r, lines = run(a, b)
        assert rc == 1 and r["within"] is False, (rc, r)
        assert r["final_second"] is None and r["rel_diff"] is None, r  # NaN: null in the JSON
        assert (r["steps_first"], r["steps_second"], r["common_steps"]) == (80, 75, 75), r
        assert r["last_step"] == 75 and r["max_gap_step"] == 71, r  # the first NaN step
        assert "(steps: first 80, second 75)" in lines[0], lines


def test_unreadable_inputs():
    with tempfile.TemporaryDirectory() as d:
        a, empty = os.path.join(d, "bf16.log"), os.path.join(d, "empty.log")
        write_log(a, [3.0] * 30)
        with open(empty, "w") as f:
            f.write("mpirun: error, no step ran\n{\"summary\": true}\n")
        for other in (empty, os.path.join(d, "absent.log"), d):
            rc, r, lines = run(a, other)
            assert rc == 2 and r is None, (other, rc, r)
            assert "no step records in " + other in lines[0], lines
            rc, _, _ = run(other, a)
            assert rc == 2, other
        late = os.path.join(d, "late.log")  # steps, but none in common
        with open(late, "w") as f:
            f.write(json.dumps({"step": 31, "loss": 3.0}) + "\n")
        rc, r, lines = run(a, late)
        assert rc == 2 and r is None and "share no step" in lines[0], lines


def test_running_mean():
    assert lc.running_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert lc.running_mean([2.0, 4.0], 20) == [2.0, 3.0]


def main():
    return run_tests(globals())


if __name__ == "__main__":
    sys.exit(main())
