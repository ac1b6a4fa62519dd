#!/usr/bin/env python3
"""The GPT model of examples/04_gpt_train in PyTorch, eager and torch.compile, reporting tokens/s
and MFU with the trainer's formula, so ours/PyTorch comes from one device command:

    mpirun -np 1 build/examples/04_gpt_train/04_gpt_train --bench --json ...
    python3 scripts/bench/gpt_torch.py --layers 24 --hidden 1024 --heads 16 --seq-len 1024 \
        --micro-batch 8 --global-batch 8
    torchrun --nproc_per_node 2 scripts/bench/gpt_torch.py ... --global-batch 16   # DDP, dp = 2

Model (same as the trainer's): token + position embeddings, `layers` pre-norm blocks
(LayerNorm, causal attention with biased fused QKV and output projections, LayerNorm, GELU-tanh
MLP of 4 x hidden with biases), final LayerNorm, untied LM head; init normal(0, 0.02), output
projections 0.02/sqrt(2 layers). bf16 autocast with f32 parameters, fused AdamW, clipping at 1.
Random tokens (speed does not depend on them).
MFU: (6 N + 12 L d T) FLOPs per token, N = non-embedding parameters, over 989 TFLOP/s per GPU.
One JSON object per mode: {"impl", "mode", "ranks", "tokens_per_s", "ms", "mfu", "tflops",
"params", "peak_mem_bytes" (the most the timed steps reached), "run_peak_mem_bytes" (the mode's
whole run: building, warm-up and compile included)}.
"""
import argparse
import gc
import contextlib
import json
import math
import os
import statistics
import sys
import time

PEAK = 989e12


def build(torch, args):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = args.hidden
            self.norm1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.norm2 = nn.LayerNorm(d)
            self.fc = nn.Linear(d, 4 * d)
            self.fc_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, d = x.shape
            h = args.heads
            q, k, v = self.qkv(self.norm1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.fc_proj(F.gelu(self.fc(self.norm2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(args.vocab, args.hidden)
            self.pos = nn.Embedding(args.seq_len, args.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm = nn.LayerNorm(args.hidden)
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * args.layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    return GPT


def run(torch, args, mode, rank, world, device):
    # The whole run's peak starts here, not with an earlier mode's leftovers.
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    GPT = build(torch, args)
    torch.manual_seed(args.seed)
    model = GPT().to(device)
    params = sum(p.numel() for p in model.parameters())
    embed = model.tok.weight.numel() + model.pos.weight.numel()
    non_embedding = params - embed
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode == "compiled" else model
    accum = args.global_batch // (args.micro_batch * world)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)

    def batch():
        x = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len + 1), device=device,
                          generator=gen)
        return x[:, :-1], x[:, 1:]

    def step():
        opt.zero_grad(set_to_none=True)
        for m in range(accum):
            x, y = batch()
            sync = world == 1 or m == accum - 1
            ctx = model.no_sync() if not sync else contextlib.nullcontext()
            with ctx, torch.autocast("cuda", dtype=torch.bfloat16):
                loss = step_model(x, y) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    # Peak memory two ways, as 04_gpt_train reports it: the steady state (the peak is reset when
    # the timed steps begin: the most they reach) and the whole run (set-up, warm-up and compile).
    times = []
    run_peak = 0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            run_peak = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize(device)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    steady_peak = torch.cuda.max_memory_allocated(device)
    run_peak = max(run_peak, steady_peak)
    ms = statistics.median(times) * 1000
    tokens = args.global_batch * args.seq_len
    tps = tokens / (ms / 1000)
    fpt = 6 * non_embedding + 12 * args.layers * args.hidden * args.seq_len
    tflops = tps * fpt / world / 1e12
    return {"impl": "pytorch", "mode": mode, "ranks": world, "tokens_per_s": round(tps, 1),
            "ms": round(ms, 3), "mfu": round(tflops * 1e12 / PEAK, 4), "tflops": round(tflops, 2),
            "params": params, "non_embedding_params": non_embedding,
            "peak_mem_bytes": steady_peak, "run_peak_mem_bytes": run_peak,
            "torch": torch.__version__}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--modes", nargs="+", default=["eager", "compiled"])
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print(json.dumps({"impl": "pytorch", "error": "torch not installed"}))
        return 0
    if not torch.cuda.is_available():
        print(json.dumps({"impl": "pytorch", "error": "no GPU"}))
        return 0
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    if world > 1:
        torch.distributed.init_process_group("nccl", device_id=device)
    torch.backends.cuda.matmul.allow_tf32 = True
    for mode in args.modes:
        result = run(torch, args, mode, rank, world, device)
        if rank == 0:
            print(json.dumps(result), flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
