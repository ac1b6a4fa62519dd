#!/usr/bin/env python3
"""The GPT model of examples/04_gpt_train in PyTorch, eager and torch.compile, reporting tokens/s
and MFU with the trainer's formula, so ours/PyTorch comes from one device command:

    mpirun -np 1 build/examples/04_gpt_train/04_gpt_train --bench --json ...
    python3 scripts/bench/gpt_torch.py --layers 24 --hidden 1024 --heads 16 --seq-len 1024 \
        --micro-batch 8 --global-batch 8
    torchrun --nproc_per_node 2 scripts/bench/gpt_torch.py ... --global-batch 16   # DDP, dp = 2
    python3 scripts/bench/gpt_torch.py --arch llama --layers 16 --hidden 2048 --heads 32 \
        --kv-heads 8 --ffn-hidden 8192 --seq-len 2048 --micro-batch 4 --global-batch 4

Model --arch gpt2 (the default; same as the trainer's): token + position embeddings, `layers`
pre-norm blocks (LayerNorm, causal attention with biased fused QKV and output projections,
LayerNorm, GELU-tanh MLP of 4 x hidden with biases), final LayerNorm, untied LM head; init
normal(0, 0.02), output projections 0.02/sqrt(2 layers).
Model --arch llama (the trainer's --arch llama, GptConfig::llama): RMSNorm (eps 1e-5, nn.RMSNorm),
no position table but RoPE on q and k (rotate-half, theta --rope-theta 500000, in f32), --kv-heads
key/value heads (grouped-query attention through SDPA's enable_gqa, PyTorch >= 2.5), no biases,
SwiGLU MLPs of width --ffn-hidden (gate and up in one GEMM), final RMSNorm, untied LM head, the
same init. It is moe_torch.py's --arch mixtral model with no MoE block (imported from there, not
copied); its parameter count is checked against GptConfig's formula and printed to stderr.
bf16 autocast with f32 parameters, fused AdamW, clipping at 1.
Random tokens (speed does not depend on them).
--device cpu runs either on the CPU, as a smoke test only (no timing worth reading, no memory).
MFU: (6 N + 12 L d T) FLOPs per token, N = non-embedding parameters, over 989 TFLOP/s per GPU.
One JSON object per mode: {"impl", "mode", "ranks", "tokens_per_s", "ms", "mfu", "tflops",
"params", "non_embedding_params", "peak_mem_bytes" (the most the timed steps reached),
"run_peak_mem_bytes" (the mode's whole run: building, warm-up and compile included), "arch"}.
"""
import argparse
import gc
import contextlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train_timing  # noqa: E402 (beside this script, put on the path above)


def llama_args(args):
    """moe_torch.py's settings for its SwiGLU model with no MoE block: the trainer's llama."""
    return argparse.Namespace(
        arch="llama", layers=args.layers, hidden=args.hidden, heads=args.heads,
        kv_heads=args.kv_heads, ffn_hidden=args.ffn_hidden, rope_theta=args.rope_theta,
        vocab=args.vocab, seq_len=args.seq_len, experts=0, top_k=0, moe_every=1, expert_ffn=0,
        expert_impl="grouped", group_align=0, aux_loss_coeff=0.0, z_loss_coeff=0.0)


def build(torch, args):
    if args.arch == "llama":
        import moe_torch  # beside this script (on the path since the imports)

        return moe_torch.build(torch, llama_args(args), None)[0]
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
    cuda = device.type == "cuda"
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    GPT = build(torch, args)
    torch.manual_seed(args.seed)
    # Built and initialised on the GPU (PyTorch >= 2.0): a 1 B model's init on the CPU takes
    # tens of seconds.
    with device if cuda else contextlib.nullcontext():
        model = GPT().to(device)
    params = sum(p.numel() for p in model.parameters())
    embed = model.tok.weight.numel() + (model.pos.weight.numel() if model.pos is not None else 0)
    non_embedding = params - embed
    if args.arch == "llama":
        import moe_torch  # on the path since build()

        expected = moe_torch.param_counts(llama_args(args))[:2]
        if rank == 0:
            print(f"gpt_torch: llama {params} params ({non_embedding} non-embedding); "
                  f"GptConfig's formula: {expected[0]} ({expected[1]})"
                  + ("" if (params, non_embedding) == expected else " DIFFERENT"),
                  file=sys.stderr, flush=True)
    ms, steady_peak, run_peak = torch_train_timing.timed_training(torch, args, model, mode, rank,
                                                                  world, device)
    return {"impl": "pytorch", "mode": mode, "ranks": world,
            **torch_train_timing.throughput(args, world, ms, non_embedding),
            "params": params, "non_embedding_params": non_embedding,
            "peak_mem_bytes": steady_peak, "run_peak_mem_bytes": run_peak,
            "arch": args.arch, "torch": torch.__version__}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2",
                   help="gpt2: LayerNorm, learned positions, biases, GELU; llama: RMSNorm, RoPE, "
                   "grouped-query attention, no biases, SwiGLU (the trainer's --arch llama)")
    p.add_argument("--kv-heads", type=int, default=0,
                   help="key/value heads with --arch llama (0: heads)")
    p.add_argument("--ffn-hidden", type=int, default=0,
                   help="MLP width with --arch llama (0: 4 x hidden)")
    p.add_argument("--rope-theta", type=float, default=500000.0,
                   help="RoPE's base with --arch llama (Llama 3's 500000, as the trainer's)")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--modes", nargs="+", default=["eager", "compiled"],
                   choices=["eager", "compiled"])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: a smoke test only")
    args = p.parse_args()
    kv = args.kv_heads if args.kv_heads > 0 else args.heads
    hd = args.hidden // args.heads if args.heads > 0 else 0
    if args.hidden % args.heads or args.heads % kv or (args.arch == "llama" and hd % 2):
        print(json.dumps({"impl": "pytorch", "error": f"hidden {args.hidden}, heads {args.heads} "
                          f"and kv heads {kv}: heads must divide hidden (into an even head dim) "
                          "and kv heads divide heads"}))
        return 0
    if args.arch == "gpt2" and (args.kv_heads > 0 or args.ffn_hidden > 0):
        print(json.dumps({"impl": "pytorch", "error": "--kv-heads and --ffn-hidden need --arch "
                          "llama"}))
        return 0
    try:
        import torch
    except ImportError:
        print(json.dumps({"impl": "pytorch", "error": "torch not installed"}))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"impl": "pytorch", "error": "no GPU"}))
        return 0
    rank, world, device = torch_train_timing.start_ranks(torch, args.device)
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
