#!/usr/bin/env python3
"""Where a training step's GPU time goes, by kind of kernel, from the CSVs that
scripts/bench/kernel_summary.cpp writes (KERNEL_SUMMARY_OUT: name, calls, total_ms, mean_us, share):

    kernel_groups.py --side ours ours_12.csv 12 ours_4.csv 4 --side torch torch_10.csv 10 torch_2.csv 2

Each --side is NAME CSV STEPS [BASE_CSV BASE_STEPS]: the CSV of a run of STEPS training steps, and
optionally that of the same run with fewer steps; with the base, a kernel's time per step is the
difference over STEPS - BASE_STEPS, so what both runs do once (start-up, initialisation, warm-up,
torch.compile's compilation and autotuning, a check before timing) drops out; without it, the
whole run's kernel time over STEPS. Kernels are put in groups by their (mangled) names, first
matching pattern wins (GROUPS below: our kernels in lib/nn/cuda, lib/core/cuda, cuBLAS(Lt),
cuDNN, PyTorch's ATen and its Triton kernels, fused_op names included; our FP8 casts on their own). The names are a guide, not
a proof: a Triton kernel that fuses a norm with an add counts as a norm, PyTorch's embedding
backward sorts its indices (MoE routing here). The largest kernels are listed below the table to
check by eye.

The difference holds only when both runs did the same start-up work: where a group's comes out
below -NEGATIVE_MS ms per step (torch.compile compiling and autotuning in the first run, finding
its caches warm in the second), the side's figures are not per-step figures; the output says so
(a line naming the side and its negative groups, its columns marked "NOT per-step") and the exit
status is 1. run_profile's PROFILE_WARM=1 (bench_common.sh) warms such caches before both runs.

Prints a markdown table of ms per step by group, one column per side (and the difference, first
side minus second, when two), totals last; then each side's 10 largest kernels. --json prints one
JSON object instead: {"kernel_groups": {side: {"steps", "total_ms", "groups": {group: ms},
"top": [[name, group, ms, calls], ...], "negative_groups": {group: ms}}}}.
"""
import argparse
import csv
import json
import re
import sys

# (group, pattern searched case-insensitively in the kernel's name), first match wins.
GROUPS = [
    ("communication", r"nccl"),
    ("attention", r"flash|fmha|sdpa|cudnn|attention|_attn|scaled_dot|probs_kernel|dscores_kernel"),
    ("optimizer", r"adam|multi_tensor_apply|lpnorm|sum_of_squares|device_clip_scale|clip_grad"
                  r"|_foreach_"),
    ("cross-entropy", r"cross_entropy|nll_loss|log_?softmax|vp_ce_"),
    ("embedding", r"embedding|compute_grad_weight|sum_and_scatter|partial_segment"
                  r"|num_of_segments|segment_offsets"),
    ("GEMM", r"gemm|cutlass|cublas|xmma|nvjet|wgmma|grouped_(fp8_)?(mma|simt|wgmma)_kernel"
             r"|splitk|matmul|triton_tem_"),
    # Our FP8 casts (with their amax and transpose) and scale kernels (lib/nn/cuda/fp8.cu; its
    # scale_kernel is the untemplated one, elementwise.cu's scale_kernel<T> is not FP8's).
    ("FP8 casts/scales", r"quintet.*(cast(_vec)?_kernel|dequantize_kernel|scale_kernelEPKf)"),
    ("norm", r"layer_?norm|rms_?norm|norm_forward|norm_backward|batch_norm|group_norm"),
    ("activation", r"gelu|silu|swiglu|swish|sigmoid|tanh"),
    ("MoE routing/permutation", r"route_(stats_|backward_)?kernel|permute_gather|permute_keys"
                                r"|unpermute|capacity_(drop|keys)|topk|top_k|sort|histc|histogram"
                                r"|bincount|cumsum|scan|scatter|gather|index|softmax"
                                r"|searchsorted|unique"),
    ("reductions", r"reduce|column_sum|triton_red_|triton_per_|_sum_|sum_kernel|mean"),
    ("elementwise/copies", r"elementwise|vectorized|copy|convert|cast|fill|add_|add_kernel|scale"
                           r"|store_kernel|triton_poi_|memset|memcpy|random|philox|distribution"
                           r"|rope|mul|where|zero"),
]
OTHER = "other"
# A group's ms per step below minus this: the side's two runs did different start-up work.
NEGATIVE_MS = 0.05
GROUP_NAMES = [g for g, _ in GROUPS] + [OTHER]
_COMPILED = [(g, re.compile(p, re.IGNORECASE)) for g, p in GROUPS]


def group_of(name):
    for group, pattern in _COMPILED:
        if pattern.search(name):
            return group
    return OTHER


def read_csv(path):
    """{kernel name: (calls, total_ms)} of one kernel_summary.cpp CSV."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = {"name", "calls", "total_ms"} - set(reader.fieldnames or [])
            if missing:
                raise SystemExit(f"{path}: not a kernel_summary CSV (no column {sorted(missing)})")
            kernels = {}
            for row in reader:
                try:
                    calls, ms = int(row["calls"]), float(row["total_ms"])
                except (TypeError, ValueError):
                    raise SystemExit(f"{path}: line {reader.line_num}: bad calls or total_ms")
                old_calls, old_ms = kernels.get(row["name"], (0, 0.0))
                kernels[row["name"]] = (old_calls + calls, old_ms + ms)
            return kernels
    except OSError as e:
        raise SystemExit(f"{path}: {e.strerror}")


def per_step(csv_path, steps, base_path=None, base_steps=0):
    """{kernel name: (calls per step, ms per step)}: the run's, less the base run's when given,
    over the steps that differ."""
    if steps <= base_steps:
        raise SystemExit(f"{csv_path}: STEPS {steps} must exceed BASE_STEPS {base_steps} (and 0)")
    kernels = read_csv(csv_path)
    base = read_csv(base_path) if base_path else {}
    n = steps - base_steps
    out = {}
    for name in set(kernels) | set(base):
        calls, ms = kernels.get(name, (0, 0.0))
        base_calls, base_ms = base.get(name, (0, 0.0))
        out[name] = ((calls - base_calls) / n, (ms - base_ms) / n)
    return out


def summarize(kernels, top=10):
    groups = {g: 0.0 for g in GROUP_NAMES}
    for name, (_, ms) in kernels.items():
        groups[group_of(name)] += ms
    largest = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    return {"total_ms": sum(ms for _, ms in kernels.values()), "groups": groups,
            "top": [[name, group_of(name), ms, calls] for name, (calls, ms) in largest]}


def parse_sides(raw):
    sides = []
    for spec in raw:
        if len(spec) not in (3, 5):
            raise SystemExit(f"--side {' '.join(spec)}: want NAME CSV STEPS [BASE_CSV BASE_STEPS]")
        try:
            steps = int(spec[2])
            base_steps = int(spec[4]) if len(spec) == 5 else 0
        except ValueError:
            raise SystemExit(f"--side {' '.join(spec)}: STEPS and BASE_STEPS are integers")
        base = spec[3] if len(spec) == 5 else None
        summary = summarize(per_step(spec[1], steps, base, base_steps))
        summary["steps"] = steps - base_steps
        summary["negative_groups"] = {g: ms for g, ms in summary["groups"].items()
                                      if ms < -NEGATIVE_MS}
        sides.append((spec[0], summary))
    if len({name for name, _ in sides}) != len(sides):
        raise SystemExit("--side: every side needs its own NAME")
    return sides


def not_per_step(name, s):
    """The line saying that side `name`'s figures are not per-step figures ("" when they are)."""
    if not s["negative_groups"]:
        return ""
    groups = ", ".join(f"{g} {ms:.3f}" for g, ms in s["negative_groups"].items())
    return (f"{name}: NOT per-step figures: its two runs did different start-up work (ms/step "
            f"below -{NEGATIVE_MS}: {groups}), e.g. torch.compile compiling or autotuning in one "
            f"run only; warm its caches with a run before both (PROFILE_WARM=1 in bench_common.sh)")


def table(sides):
    names = [name for name, _ in sides]
    marked = [name + (" (NOT per-step)" if s["negative_groups"] else "") for name, s in sides]
    head = ["group"] + [f"{n} ms/step" for n in marked] + [f"{n} share" for n in marked]
    if len(sides) == 2:
        head.append(f"{names[0]} - {names[1]}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in GROUP_NAMES + ["total"]:
        ms = [s["total_ms"] if group == "total" else s["groups"][group] for _, s in sides]
        if group != "total" and all(abs(v) < 5e-4 for v in ms):
            continue
        shares = [100 * v / s["total_ms"] if s["total_ms"] else 0.0 for v, (_, s) in zip(ms, sides)]
        row = [group] + [f"{v:.3f}" for v in ms] + [f"{v:.1f}%" for v in shares]
        if len(sides) == 2:
            row.append(f"{ms[0] - ms[1]:+.3f}")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--side", action="append", nargs="+", required=True,
                   metavar="NAME CSV STEPS [BASE_CSV BASE_STEPS]",
                   help="one run (and its base run of fewer steps); repeat for each side")
    p.add_argument("--top", type=int, default=10, help="largest kernels listed per side")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the tables")
    args = p.parse_args(argv)
    sides = parse_sides(args.side)
    for _, s in sides:
        s["top"] = s["top"][:args.top]
    invalid = [line for line in (not_per_step(name, s) for name, s in sides) if line]
    if args.json:
        print(json.dumps({"kernel_groups": dict(sides)}))
        return 1 if invalid else 0
    print("GPU kernel time per training step, by group (" +
          ", ".join(f"{n}: {s['steps']} steps" for n, s in sides) + ")")
    for line in invalid:
        print(line)
    print("\n".join(table(sides)))
    for name, s in sides:
        print(f"\n{name}: the {len(s['top'])} largest kernels (ms/step, calls/step, group)")
        for kernel, group, ms, calls in s["top"]:
            short = kernel if len(kernel) <= 110 else kernel[:107] + "..."
            print(f"  {ms:9.3f} {calls:8.1f}  {group:24} {short}")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
