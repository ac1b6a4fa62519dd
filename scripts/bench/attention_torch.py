#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention (bf16, causal, forward and forward+backward) at the
shapes of examples/09_op_bench, with the same FLOP convention, printing the same JSON fields, so
that ours/PyTorch comes from one device command:

    build/examples/09_op_bench/09_op_bench --json --skip-linear
    python3 scripts/bench/attention_torch.py

Shapes: seq 1024..8192, head_dim 64 and 128, batch = 16384 // seq, heads = 2048 // head_dim.
FLOPs: forward = 4*b*h*s^2*d, halved for causal; forward+backward = 3.5 x forward.
"""
import argparse
import json
import sys

FLOPS = "forward = 4*b*h*s^2*d, halved for causal; forward+backward = 3.5 x forward"


def time_ms(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--table", action="store_true", help="print a table instead of JSON")
    args = parser.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("attention_torch.py: PyTorch is not installed (pip install torch)", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("attention_torch.py: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    for d in args.head_dim:
        for seq in args.seq:
            batch, heads = max(1, 16384 // seq), 2048 // d
            shape = (batch, heads, seq, d)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            iters = max(2, args.iters * 1024 // seq // 2)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)

            def fwd_bwd():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                torch.autograd.grad(out, (q, k, v), dout)

            fwd_ms = time_ms(torch, fwd, 1, iters)
            fb_ms = time_ms(torch, fwd_bwd, 1, iters)
            fwd_flops = 4.0 * batch * heads * seq * seq * d / 2.0
            row = {"bench": "attention", "impl": "torch_sdpa", "dtype": "bf16", "causal": True,
                   "batch": batch, "heads": heads, "seq": seq, "head_dim": d,
                   "fwd_ms": fwd_ms, "fwd_bwd_ms": fb_ms,
                   "fwd_tflops": fwd_flops / fwd_ms * 1e-9,
                   "fwd_bwd_tflops": 3.5 * fwd_flops / fb_ms * 1e-9,
                   "flops_convention": FLOPS, "torch": torch.__version__}
            if args.table:
                print(f"{batch:6d} {heads:6d} {seq:6d} {d:6d} {fwd_ms:10.3f} "
                      f"{row['fwd_tflops']:10.2f} {fb_ms:10.3f} {row['fwd_bwd_tflops']:10.2f}")
            else:
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
