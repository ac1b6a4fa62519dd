#!/usr/bin/env python3
"""Tests of scripts/bench/ours_vs_torch.py (ours against PyTorch in llama_ and gpt_benchmarks.sh)
on made-up logs, run by ctest (tests/cmake/python.cmake): both modes in one PyTorch log (gpt) and
in one log each (llama) giving the same lines, the ratios' values, error lines and missing logs
left out, and different parameter counts flagged. Plain asserts (`python3 ours_vs_torch_test.py`,
which prints "N passed, N failed") or under pytest.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "bench"))
import ours_vs_torch as ovt  # noqa: E402
from plain_tests import run_tests  # noqa: E402

GiB = 2**30
OURS = {"summary": True, "median_tokens_per_s": 120000.0, "median_mfu": 0.45,
        "peak_mem_bytes": 12 * GiB, "params": 1000, "non_embedding_params": 800}


def torch_line(mode, tokens_per_s, mfu, peak_gib, params=1000):
    return {"impl": "pytorch", "mode": mode, "tokens_per_s": tokens_per_s, "mfu": mfu,
            "peak_mem_bytes": peak_gib * GiB, "params": params, "non_embedding_params": 800}


def write_log(directory, name, lines):
    with open(os.path.join(directory, name + ".log"), "w") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line))
            f.write("\n")


def ratio_lines(lines):
    return [line for line in lines if line.startswith("ours / ")]


def test_one_log_and_two_logs_alike():
    with tempfile.TemporaryDirectory() as d:
        write_log(d, "gpt_1gpu", ["=== noise", {"step": 1, "loss": 9.0}, dict(OURS)])
        eager, compiled = torch_line("eager", 100000.0, 0.375, 16), torch_line(
            "compiled", 150000.0, 0.5625, 8)
        write_log(d, "torch_1gpu", ["gpt_torch: 1000 params", eager, compiled])
        write_log(d, "torch_eager", [eager])
        write_log(d, "torch_compiled", [compiled])
        one = ovt.report(d, "gpt_1gpu", ["torch_1gpu"])
        assert one == ovt.report(d, "gpt_1gpu", ["torch_eager", "torch_compiled"]), one
        assert ratio_lines(one) == [
            "ours / compiled tokens/s 0.800  MFU 0.800  peak memory 1.500",
            "ours / eager    tokens/s 1.200  MFU 1.200  peak memory 0.750"], one
        assert one[0] == "params (non-embedding): ours 1000 (800), pytorch 1000 (800)", one[0]
        rows = [line.split()[0] for line in one[2:5]]
        assert rows == ["ours", "eager", "compiled"], one


def test_errors_later_lines_and_missing_logs():
    with tempfile.TemporaryDirectory() as d:
        write_log(d, "ours", [dict(OURS, median_tokens_per_s=1.0), dict(OURS)])  # the last counts
        write_log(d, "torch", [{"impl": "pytorch", "mode": "compiled", "error": "out of memory"},
                               torch_line("eager", 50000.0, 0.1, 24),
                               torch_line("eager", 100000.0, 0.375, 16)])
        lines = ovt.report(d, "ours", ["torch", "absent"])
        assert ratio_lines(lines) == [
            "ours / eager    tokens/s 1.200  MFU 1.200  peak memory 0.750"], lines
        assert not any(line.startswith("compiled") for line in lines), lines
        # no summary of ours: PyTorch's rows, no ratio
        lines = ovt.report(d, "absent", ["torch"])
        assert not ratio_lines(lines) and any(line.startswith("eager") for line in lines), lines


def test_different_models_flagged():
    with tempfile.TemporaryDirectory() as d:
        write_log(d, "ours", [dict(OURS)])
        write_log(d, "torch", [torch_line("compiled", 150000.0, 0.5625, 8, params=999)])
        lines = ovt.report(d, "ours", ["torch"])
        assert lines[0].endswith("DIFFERENT MODELS"), lines[0]


def main():
    return run_tests(globals())


if __name__ == "__main__":
    sys.exit(main())
