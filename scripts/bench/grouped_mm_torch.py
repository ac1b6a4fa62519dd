#!/usr/bin/env python3
"""PyTorch's grouped GEMM at the expert shapes of `09_op_bench --experts-only`, so our grouped
kernel (nn::grouped_linear_*, issue #47) and the per-expert cuBLASLt loop can be put beside it
from one device session:

    build/examples/09_op_bench/09_op_bench --experts-only --json [--expert-skew 1]
    python3 scripts/bench/grouped_mm_torch.py [--skew 1]

The six products of a GELU expert MLP's step, E experts, d = --hidden, F = --ffn, the T = tokens
x top_k rows split over the experts as 09_op_bench splits them (--skew 0: even; s > 0: expert e's
share proportional to max(0, 1 + s (2e - (E-1)) / (E-1)), the total unchanged), bf16, each ONE
grouped call with the experts' cumulative row counts as int32 device offsets
(torch.nn.functional.grouped_mm, PyTorch >= 2.10, else torch._grouped_mm, 2.8 / 2.9):
  fc_forward            [T, d] x w1_e^T  -> [T, F]     2d x 3d
  proj_forward          [T, F] x w2_e^T  -> [T, d]     2d x 3d
  proj_backward_input   [T, d] x w2_e    -> [T, F]     2d x 3d
  fc_backward_input     [T, F] x w1_e    -> [T, d]     2d x 3d
  proj_backward_weight  dy_e^T x h_e     -> [E, d, F]  2d x 2d, the offsets along the reduction
  fc_backward_weight    dh_e^T x x_e     -> [E, F, d]  2d x 2d
(the weight gradients come out in bf16, where ours accumulate into an f32 dw). Each product is
checked against a per-expert loop of torch.matmul first (max |diff| / max |loop| <= 1e-2), then
timed with CUDA events: the median of --iters after --warmup. FLOPs = 2 rows N K over the experts.
One JSON object per product and one for the total: {"bench": "experts_torch", "product", "api",
"experts", "hidden", "ffn", "rows_total", "expert_rows", "skew", "gflop", "grouped_mm_ms",
"grouped_mm_tflops", "loop_ms", "loop_tflops", "max_rel_diff"}, or {"bench", "error"} when the
installed PyTorch has no grouped GEMM or no GPU.
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_torch import grouped_mm_api  # noqa: E402 (the MoE peer's probe, beside this script)


def expert_rows(experts, tokens, top_k, skew):
    """Rows per expert, the rule of examples/09_op_bench/experts_bench.cpp (expert_rows)."""
    total = tokens * top_k
    weight = [1.0] * experts
    if experts > 1:
        weight = [max(0.0, 1.0 + skew * (2.0 * e - (experts - 1)) / (experts - 1))
                  for e in range(experts)]
    s = sum(weight)
    exact = [total * w / s for w in weight]
    rows = [math.floor(x) for x in exact]
    frac = [x - r for x, r in zip(exact, rows)]
    order = sorted(range(experts), key=lambda e: -frac[e])  # stable: ties keep the lower index
    i, given = 0, sum(rows)
    while given < total:
        rows[order[i % experts]] += 1
        i += 1
        given += 1
    while given > total:
        rows[rows.index(max(rows))] -= 1
        given -= 1
    return rows


def median_ms(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--skew", type=float, default=0.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    if args.experts < 1 or args.tokens < 1 or args.top_k < 1 or not args.skew >= 0:
        p.error("experts, tokens and top-k must be positive, skew >= 0")
    rows = expert_rows(args.experts, args.tokens, args.top_k, args.skew)
    base = {"bench": "experts_torch", "experts": args.experts, "hidden": args.hidden,
            "ffn": args.ffn, "rows_total": sum(rows), "expert_rows": rows, "skew": args.skew}

    def fail(message):
        print(json.dumps({**base, "error": message}), flush=True)
        return 1

    try:
        import torch
    except ImportError as e:
        return fail(f"no PyTorch: {e}")
    grouped_mm, api = grouped_mm_api(torch)
    if grouped_mm is None:
        return fail(f"PyTorch {torch.__version__} has no grouped GEMM (needs 2.8 or later)")
    if not torch.cuda.is_available():
        return fail("no CUDA GPU")

    dev, bf16 = torch.device("cuda"), torch.bfloat16
    E, d, F, T = args.experts, args.hidden, args.ffn, sum(rows)
    g = torch.Generator(device=dev).manual_seed(900)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(bf16)

    x, h, dh, dy = randn(T, d), randn(T, F), randn(T, F), randn(T, d)
    w1, w2 = randn(E, F, d), randn(E, d, F)
    ends = torch.tensor(rows, device=dev, dtype=torch.int64).cumsum(0)
    offs = ends.to(torch.int32)  # [E]: the end row of each expert
    starts = [0] + ends.tolist()[:-1]

    def per_expert(fn):  # a Python loop over the experts with rows: list of results
        return [fn(e, starts[e], starts[e] + rows[e]) for e in range(E) if rows[e] > 0]

    # (name, grouped call, per-expert loop giving the same result, rows x N x K FLOP factor)
    products = [
        ("fc_forward", lambda: grouped_mm(x, w1.transpose(1, 2), offs),
         lambda: torch.cat(per_expert(lambda e, a, b: x[a:b] @ w1[e].t())), F * d),
        ("proj_forward", lambda: grouped_mm(h, w2.transpose(1, 2), offs),
         lambda: torch.cat(per_expert(lambda e, a, b: h[a:b] @ w2[e].t())), d * F),
        ("proj_backward_input", lambda: grouped_mm(dy, w2, offs),
         lambda: torch.cat(per_expert(lambda e, a, b: dy[a:b] @ w2[e])), F * d),
        ("fc_backward_input", lambda: grouped_mm(dh, w1, offs),
         lambda: torch.cat(per_expert(lambda e, a, b: dh[a:b] @ w1[e])), d * F),
        ("proj_backward_weight", lambda: grouped_mm(dy.t(), h, offs),
         lambda: torch.stack([dy[a:b].t() @ h[a:b] if b > a else dy.new_zeros(d, F)
                              for a, b in zip(starts, ends.tolist())]), d * F),
        ("fc_backward_weight", lambda: grouped_mm(dh.t(), x, offs),
         lambda: torch.stack([dh[a:b].t() @ x[a:b] if b > a else dh.new_zeros(F, d)
                              for a, b in zip(starts, ends.tolist())]), F * d),
    ]
    total = {"gflop": 0.0, "grouped_mm_ms": 0.0, "loop_ms": 0.0}
    for name, grouped, loop, factor in products:
        got, want = grouped().float(), loop().float()
        diff = ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()
        if not diff <= 1e-2:
            return fail(f"{name}: {api} differs from the per-expert loop: {diff} > 1e-2")
        gflop = 2.0 * T * factor * 1e-9
        ms = median_ms(torch, grouped, args.warmup, args.iters)
        loop_ms = median_ms(torch, loop, args.warmup, args.iters)
        print(json.dumps({**base, "product": name, "api": api, "gflop": gflop,
                          "grouped_mm_ms": ms, "grouped_mm_tflops": gflop / ms,
                          "loop_ms": loop_ms, "loop_tflops": gflop / loop_ms,
                          "max_rel_diff": diff}), flush=True)
        total["gflop"] += gflop
        total["grouped_mm_ms"] += ms
        total["loop_ms"] += loop_ms
    print(json.dumps({**base, "product": "total", "api": api, **total,
                      "grouped_mm_tflops": total["gflop"] / total["grouped_mm_ms"],
                      "loop_tflops": total["gflop"] / total["loop_ms"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
