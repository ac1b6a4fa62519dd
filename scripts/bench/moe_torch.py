#!/usr/bin/env python3
"""The mixture-of-experts GPT of examples/05_moe_train in PyTorch, eager and torch.compile,
reporting tokens/s and MFU on the active parameters with the trainer's formula, so ours/PyTorch
comes from one device command:

    mpirun -np 1 build/examples/05_moe_train/05_moe_train --bench --json --layers 12 ...
    python3 scripts/bench/moe_torch.py --layers 12 --hidden 1024 --heads 16 --vocab 50304 \
        --seq-len 1024 --micro-batch 16 --experts 8 --top-k 2 --expert-ffn 2816
    torchrun --nproc_per_node 2 scripts/bench/moe_torch.py ... --global-batch 32   # DDP, dp = 2

Model: gpt_torch.py's GPT (token + position embeddings, pre-norm LayerNorm blocks with causal
SDPA attention and biased fused QKV / output projections, final LayerNorm, untied LM head; init
normal(0, 0.02), output projections 0.02/sqrt(2 layers)) whose MLP, in blocks l with
l % moe_every == 0, is the library's MoE layer (parallel/expert/moe_layer.hpp, router.hpp):
  router   logits = x @ W_r^T in f32 (autocast off), W_r [E, d] normal(0, 0.02), no bias;
           probs = softmax(logits); the top_k experts by probs; weights = their probs,
           renormalised over the k when top_k > 1; dropless (no capacity).
  losses   aux = aux_loss_coeff * mean over sequences g of E * sum_e f_ge P_ge, f_ge = (g's
           assignments to e) / (S k) (no gradient), P_ge = mean over g's tokens of probs[:, e];
           z = z_loss_coeff * mean_t logsumexp(logits_t)^2; both, of every MoE block, are added
           to the LM loss.
  experts  E GELU-tanh MLPs without biases, width F: fc [E, F, d] normal(0, 0.02), proj [E, d, F]
           normal(0, 0.02/sqrt(2 layers)); f32 parameters, bf16 compute.
--arch mixtral makes it 05_moe_train --arch mixtral's model (GptConfig::mixtral): RMSNorm (eps
1e-5), no position table but RoPE on q and k (rotate-half, theta --rope-theta 1e6, in f32),
--kv-heads key/value heads (grouped-query attention: SDPA's enable_gqa, PyTorch >= 2.5, else k and
v repeated), no biases anywhere, and SwiGLU MLPs: each expert's fc is [E, 2F, d], gate then up in
one grouped GEMM, silu(gate) * up, then proj (dense blocks alike, width Fd = --ffn-hidden, 4d
by default; gpt_torch.py --arch llama is this model with no MoE block).
Experts (--expert-impl): "grouped" (default) sorts the T k assignments by expert (stable sort),
gathers the rows, and runs each of the two GEMMs as ONE bf16 grouped GEMM over all experts
(torch.nn.functional.grouped_mm, PyTorch >= 2.10, else torch._grouped_mm, 2.8 / 2.9) with the
experts' cumulative row counts as int32 device offsets: no host synchronisation, no Python loop.
"loop" is the same with one GEMM per expert in a Python loop (one host sync per block for the
counts). The results are un-permuted (a gather by the inverse permutation) and summed per token
weighted by the router's weights, in f32.
Grouped GEMM constraints (aten GroupedMMUtils.h, cuda/GroupedBlas.cpp): bf16 operands; 2d x 3d with
offs [E] int32, offs[e] the end row of expert e (an expert may have 0 rows); every operand row- or
column-major with 16-byte aligned strides and data (so hidden and the expert width must be
multiples of 8); the fast CUTLASS kernel needs SM 9.x / 10.x (H100/H200/B200), elsewhere aten falls
back to a loop with a host sync. Group sizes need no alignment in that source; --group-align A
pads every expert's rows to a multiple of A with zero rows (the last expert also takes the static
slack) for PyTorch builds that do want it, e.g. --group-align 16. --check (default on) compares one
MoE layer's output and gradients, grouped against loop, at the run's shapes before timing.
bf16 autocast with f32 parameters, fused AdamW, clipping at 1, random tokens; no TF32 (the
router's f32 matmul stays exact). --device cpu runs it on the CPU, as a smoke test only.
MFU (examples/04_gpt_train/metrics.cpp, GptConfig::active_non_embedding_params): (6 N_active +
12 L d S) FLOPs per token over 989 TFLOP/s per GPU, N_active = every weight outside the token and
position embeddings with only top_k of the E experts counted per MoE block: per block
4d^2 + 4d (attention) + 4d (2 LayerNorms) + MLP, the MLP E d + top_k 2 d F for MoE blocks (router +
experts) or 2 d Fd + Fd + d for dense ones; plus 2d (final norm) + d V (head). With --arch mixtral:
2d^2 + 2 d kv hd (attention), 2d (2 RMSNorms), E d + top_k 3 d F (MoE) or 3 d Fd (dense), d + d V.
One JSON object per mode: {"impl": "pytorch-moe", "mode", "ranks", "tokens_per_s", "ms", "mfu",
"tflops", "params" (all), "active_params" (N_active), "non_embedding_params", "peak_mem_bytes"
(timed steps), "run_peak_mem_bytes" (the whole mode), "expert_impl", ...}, or {"impl", "mode", "error"} when that mode failed (e.g. torch.compile).
"""
import argparse
import gc
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train_timing  # noqa: E402 (beside this script, put on the path above)

IMPL = "pytorch-moe"


def grouped_mm_api(torch):
    """(fn(a [M, K], b [E, K, N], offs [E] int32) -> [M, N], its name), or (None, None)."""
    fn = getattr(torch.nn.functional, "grouped_mm", None)  # public since PyTorch 2.10
    if fn is not None:
        return (lambda a, b, offs: fn(a, b, offs=offs)), "torch.nn.functional.grouped_mm"
    fn = getattr(torch, "_grouped_mm", None)  # PyTorch 2.8, 2.9
    if fn is not None:
        return (lambda a, b, offs: fn(a, b, offs=offs)), "torch._grouped_mm"
    return None, None


def dense_width(args):
    """The dense MLP's width: --ffn-hidden, or 4 x hidden when 0 (GptConfig::mlp_width)."""
    return args.ffn_hidden if args.ffn_hidden > 0 else 4 * args.hidden


def expert_width(args):
    return args.expert_ffn if args.expert_ffn > 0 else dense_width(args)


def is_moe_block(args, layer):
    # experts == 0: a dense model (gpt_torch.py --arch llama builds its model here).
    return args.experts > 0 and layer % args.moe_every == 0


def swiglu(args):
    """mixtral and llama: RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases."""
    return args.arch in ("mixtral", "llama")


def kv_heads(args):
    return args.kv_heads if args.kv_heads > 0 else args.heads


def param_counts(args):
    """(all parameters, non-embedding, active non-embedding) as GptConfig counts them
    (parallel/model/gpt_config.cpp). gpt2: LayerNorm, biased attention, GELU dense MLP with
    biases; mixtral: RMSNorm, attention with kv_heads key/value heads and no biases, SwiGLU MLPs
    (3 matrices each) without biases, no position table."""
    d, f, fe = args.hidden, dense_width(args), expert_width(args)
    hd = d // args.heads
    if swiglu(args):
        norm = d
        attn = 2 * d * d + 2 * d * kv_heads(args) * hd
        dense = 3 * d * f
        per_expert = 3 * d * fe
    else:
        norm = 2 * d
        attn = 4 * d * d + 4 * d
        dense = 2 * d * f + f + d
        per_expert = 2 * d * fe

    def moe(experts):
        return args.experts * d + experts * per_expert

    total = active = 0
    for layer in range(args.layers):
        moe_block = is_moe_block(args, layer)
        total += attn + 2 * norm + (moe(args.experts) if moe_block else dense)
        active += attn + 2 * norm + (moe(args.top_k) if moe_block else dense)
    total += norm + d * args.vocab
    active += norm + d * args.vocab
    positions = 0 if swiglu(args) else args.seq_len * d
    return total + args.vocab * d + positions, total, active


def build(torch, args, grouped_mm):
    nn = torch.nn
    F = torch.nn.functional
    d, E, K = args.hidden, args.experts, args.top_k
    FE, FD = expert_width(args), dense_width(args)
    H, KV, hd = args.heads, kv_heads(args), args.hidden // args.heads
    align = args.group_align
    bf16 = torch.bfloat16
    gated = swiglu(args)
    # Experts' first GEMM: fc (GELU) or gate and up in one [E, 2F, d] weight (SwiGLU).
    fc_rows = 2 * FE if gated else FE

    def act(h):
        # [.., F] or, gated, [.., 2F] (gate then up) -> [.., F]
        if gated:
            gate, up = h.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(h, approximate="tanh")

    def norm():
        if not gated:
            return nn.LayerNorm(d)
        if hasattr(nn, "RMSNorm"):  # PyTorch >= 2.4
            return nn.RMSNorm(d, eps=1e-5)
        return RMSNorm()

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + 1e-5)).type_as(x) * \
                self.weight

    # RoPE (mixtral), rotate-half as nn/ops.hpp: f32 inv_freq, angle f32(pos) * inv_freq.
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    angles = torch.arange(args.seq_len, dtype=torch.float32)[:, None] * inv_freq  # [S, hd/2]
    rope_cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # [S, hd]
    rope_sin = torch.cat([angles.sin(), angles.sin()], dim=-1)  # [S, hd]

    def rope(x, cos, sin):
        # x [B, h, S, hd], cos, sin [S, hd] f32 -> x rotated in f32 and rounded once
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).type_as(x)

    def attention(q, k, v):
        # q [B, H, S, hd], k, v [B, KV, S, hd] -> [B, H, S, hd], causal
        if KV == H:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        try:  # PyTorch >= 2.5
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        except TypeError:
            k, v = (z.repeat_interleave(H // KV, dim=1) for z in (k, v))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.router = nn.Parameter(torch.empty(E, d))  # [E, d]
            self.fc = nn.Parameter(torch.empty(E, fc_rows, d))  # [E, F or 2F (gate, up), d]
            self.proj = nn.Parameter(torch.empty(E, d, FE))  # [E, d, F]
            self.impl = args.expert_impl

        def route(self, h):
            # h [B, S, d] -> experts [T, K] int64, weights [T, K] f32, aux + z loss (scalar f32)
            b, s, _ = h.shape
            with torch.autocast(h.device.type, enabled=False):
                logits = h.reshape(b * s, d).float() @ self.router.float().t()  # [T, E] f32
                probs = logits.softmax(dim=-1)  # [T, E]
                top_p, top_e = probs.topk(K, dim=-1)  # [T, K], [T, K]
                weights = top_p / top_p.sum(dim=-1, keepdim=True) if K > 1 else top_p  # [T, K]
                loss = logits.new_zeros(())
                if args.aux_loss_coeff > 0:
                    with torch.no_grad():
                        counts = logits.new_zeros(b, E)  # [B, E] assignments per sequence
                        counts.scatter_add_(1, top_e.reshape(b, s * K),
                                            logits.new_ones(b, s * K))
                        frac = counts / (s * K)  # [B, E] f_ge
                    mean_p = probs.view(b, s, E).mean(dim=1)  # [B, E] P_ge
                    per_seq = E * (frac * mean_p).sum(dim=-1)  # [B] L_g
                    loss = loss + args.aux_loss_coeff * per_seq.mean()
                if args.z_loss_coeff > 0:
                    lse = torch.logsumexp(logits, dim=-1)  # [T]
                    loss = loss + args.z_loss_coeff * lse.square().mean()
            return top_e, weights, loss

        def experts_grouped(self, x, sorted_e, order):
            # x [T, d] bf16; sorted_e, order [M = T K]: the assignments (t K + j) sorted by expert
            # -> [M, d] bf16, row i the expert output of assignment order[i]
            M = order.shape[0]
            tok = order // K  # [M] token of each sorted row
            counts = torch.zeros(E, dtype=torch.int64, device=x.device)
            counts.scatter_add_(0, sorted_e, torch.ones_like(sorted_e))  # [E] rows per expert
            fc = self.fc.to(bf16).transpose(1, 2)  # [E, d, F or 2F], column-major per expert
            proj = self.proj.to(bf16).transpose(1, 2)  # [E, F, d], column-major per expert
            if align > 1:
                padded = (counts + align - 1) // align * align  # [E] rows per expert, padded
                rows = (M + E * (align - 1) + align - 1) // align * align  # static bound >= sum
                ends = padded.cumsum(0)  # [E]
                shift = (ends - padded) - (counts.cumsum(0) - counts)  # [E] padded - real start
                dest = torch.arange(M, device=x.device) + shift[sorted_e]  # [M] padded row
                # The last expert also takes the slack rows (zeros), so every row is in a group.
                offs = torch.cat([ends[:-1], ends.new_full((1,), rows)]).to(torch.int32)  # [E]
                xs = x.new_zeros(rows, d).index_put((dest,), x[tok])  # [rows, d], pads zero
            else:
                offs = counts.cumsum(0).to(torch.int32)  # [E], offs[-1] = M
                xs = x[tok]  # [M, d]
            hid = act(grouped_mm(xs, fc, offs))  # [rows, F]
            y = grouped_mm(hid, proj, offs)  # [rows, d]
            return y[dest] if align > 1 else y  # [M, d]

        def experts_loop(self, x, sorted_e, order):
            # The same with one GEMM pair per expert; the split sizes cost one host sync.
            tok = order // K  # [M]
            counts = torch.bincount(sorted_e, minlength=E).tolist()  # E ints (host sync)
            fc = self.fc.to(bf16)  # [E, F or 2F, d]
            proj = self.proj.to(bf16)  # [E, d, F]
            ys = []
            for e, xe in enumerate(x[tok].split(counts)):  # xe [n_e, d]
                he = act(xe @ fc[e].t())  # [n_e, F]
                ys.append(he @ proj[e].t())  # [n_e, d]
            return torch.cat(ys)  # [M, d]

        def forward(self, h):
            # h [B, S, d] (the normed residual, f32 under autocast) -> [B, S, d] f32, loss
            b, s, _ = h.shape
            T = b * s
            top_e, weights, loss = self.route(h)  # [T, K], [T, K], scalar
            x = h.reshape(T, d).to(bf16)  # [T, d]
            # Stable: by expert, then token, then choice (the library's order).
            sorted_e, order = torch.sort(top_e.reshape(T * K), stable=True)  # [M], [M]
            experts = self.experts_grouped if self.impl == "grouped" else self.experts_loop
            y = experts(x, sorted_e, order)  # [M, d] bf16 in sorted order
            inv = torch.empty_like(order).scatter_(
                0, order, torch.arange(T * K, device=order.device))  # [M] sorted row of t K + j
            y = y[inv].view(T, K, d)  # [T, K, d]
            out = (y.float() * weights.unsqueeze(-1)).sum(dim=1)  # [T, d] f32
            return out.view(b, s, d), loss

    class Block(nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.norm1 = norm()
            self.qkv = nn.Linear(d, (H + 2 * KV) * hd, bias=not gated)
            self.proj = nn.Linear(H * hd, d, bias=not gated)
            self.norm2 = norm()
            if moe:
                self.moe = MoE()
            else:  # dense: GELU with biases, or SwiGLU (gate and up fused) without
                self.moe = None
                self.fc = nn.Linear(d, (2 * FD if gated else FD), bias=not gated)
                self.fc_proj = nn.Linear(FD, d, bias=not gated)

        def forward(self, x, cos, sin):
            # x [B, S, d], cos, sin [S, hd] (RoPE) or None -> [B, S, d], MoE loss or None
            b, t, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split([H * hd, KV * hd, KV * hd], dim=2)
            q = q.view(b, t, H, hd).transpose(1, 2)  # [B, H, S, hd]
            k, v = (z.view(b, t, KV, hd).transpose(1, 2) for z in (k, v))  # [B, KV, S, hd]
            if gated:
                q, k = rope(q, cos, sin), rope(k, cos, sin)
            y = attention(q, k, v)  # [B, H, S, hd]
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, H * hd))
            if self.moe is not None:
                y, loss = self.moe(self.norm2(x))
                return x + y, loss
            return x + self.fc_proj(act(self.fc(self.norm2(x)))), None

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(args.vocab, d)
            self.pos = None if gated else nn.Embedding(args.seq_len, d)  # RoPE instead
            self.blocks = nn.ModuleList(Block(is_moe_block(args, l)) for l in range(args.layers))
            self.norm = norm()
            if gated:  # the rotary angles' cosines and sines, [S, hd] f32, moved with the model
                self.register_buffer("rope_cos", rope_cos, persistent=False)
                self.register_buffer("rope_sin", rope_sin, persistent=False)
            self.head = nn.Linear(d, args.vocab, bias=False)
            out_std = 0.02 / math.sqrt(2 * args.layers)
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:  # matrices, embeddings, router [E, d], experts [E, ., .]
                    out = name.endswith("proj.weight") or name.endswith("moe.proj")
                    nn.init.normal_(p, 0.0, out_std if out else 0.02)

        def forward(self, idx, targets):
            # idx, targets [B, S] -> LM loss + every MoE block's aux and z losses
            x = self.tok(idx)  # [B, S, d] f32
            if self.pos is not None:
                x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
            moe_loss = None
            s = idx.shape[1]
            cos = self.rope_cos[:s] if gated else None
            sin = self.rope_sin[:s] if gated else None
            for blk in self.blocks:
                x, loss = blk(x, cos, sin)
                if loss is not None:
                    moe_loss = loss if moe_loss is None else moe_loss + loss
            logits = self.head(self.norm(x))  # [B, S, V] bf16
            ce = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
            return ce if moe_loss is None else ce + moe_loss

    return GPT, MoE


def autocast(torch, device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def check_experts(torch, args, device, grouped_mm):
    """Max relative difference (over the output and the gradients of the input, router, fc and
    proj) between the grouped and the loop experts of one MoE layer, at the run's token count."""
    _, MoE = build(torch, args, grouped_mm)
    torch.manual_seed(args.seed)
    layer = MoE().to(device)
    with torch.no_grad():
        layer.router.normal_(0.0, 0.02)
        layer.fc.normal_(0.0, 0.02)
        layer.proj.normal_(0.0, 0.02 / math.sqrt(2 * args.layers))
    h = torch.randn(args.micro_batch, args.seq_len, args.hidden, device=device)
    gy = torch.randn(args.micro_batch, args.seq_len, args.hidden, device=device)
    results = []
    for impl in ("grouped", "loop"):
        layer.impl = impl
        layer.zero_grad(set_to_none=True)
        x = h.clone().requires_grad_(True)
        with autocast(torch, device):
            y, loss = layer(x)
        ((y * gy).sum() + loss).backward()
        results.append([y.detach(), x.grad, layer.router.grad, layer.fc.grad, layer.proj.grad])
    err = 0.0
    for a, b in zip(*results):
        err = max(err, ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item())
    del layer, results
    return err


def run(torch, args, mode, rank, world, device, grouped_mm):
    if device.type == "cuda":  # the whole run's peak starts here (the caller freed the last mode)
        torch.cuda.reset_peak_memory_stats(device)
    GPT, _ = build(torch, args, grouped_mm)
    torch.manual_seed(args.seed)
    model = GPT().to(device)
    params = sum(p.numel() for p in model.parameters())
    embed = model.tok.weight.numel() + (model.pos.weight.numel() if model.pos is not None else 0)
    non_embedding = params - embed
    n_moe = sum(1 for l in range(args.layers) if is_moe_block(args, l))
    per_expert = (3 if swiglu(args) else 2) * args.hidden * expert_width(args)
    inactive = n_moe * (args.experts - args.top_k) * per_expert
    active = non_embedding - inactive  # N_active: top_k of the E experts per MoE block
    expected = param_counts(args)
    if (params, non_embedding, active) != expected:
        print(f"moe_torch: parameter counts {(params, non_embedding, active)} differ from "
              f"GptConfig's {expected}", file=sys.stderr)
    ms, steady_peak, run_peak = torch_train_timing.timed_training(torch, args, model, mode, rank,
                                                                  world, device)
    return {"impl": IMPL, "mode": mode, "ranks": world,
            **torch_train_timing.throughput(args, world, ms, active),
            "params": params, "active_params": active, "non_embedding_params": non_embedding,
            "peak_mem_bytes": steady_peak, "run_peak_mem_bytes": run_peak,
            "expert_impl": args.expert_impl, "arch": args.arch, "torch": torch.__version__}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--arch", choices=["gpt2", "mixtral"], default="gpt2",
                   help="gpt2: LayerNorm, learned positions, biases, GELU experts; mixtral: "
                   "RMSNorm, RoPE, grouped-query attention, no biases, SwiGLU experts")
    p.add_argument("--kv-heads", type=int, default=0,
                   help="key/value heads with --arch mixtral (0: heads)")
    p.add_argument("--rope-theta", type=float, default=1e6, help="RoPE's base (--arch mixtral)")
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=0,
                   help="sequences per step (default: micro-batch x ranks)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--modes", nargs="+", default=["eager", "compiled"],
                   choices=["eager", "compiled"])
    p.add_argument("--experts", type=int, default=8, help="experts per MoE block")
    p.add_argument("--top-k", type=int, default=2, help="experts per token (1..8)")
    p.add_argument("--ffn-hidden", type=int, default=0,
                   help="the dense MLP's width (0: 4 x hidden)")
    p.add_argument("--expert-ffn", type=int, default=0,
                   help="each expert's width (0: --ffn-hidden)")
    p.add_argument("--moe-every", type=int, default=1, help="every N-th block is MoE (from 0)")
    p.add_argument("--aux-loss-coeff", type=float, default=0.01)
    p.add_argument("--z-loss-coeff", type=float, default=0.001)
    p.add_argument("--expert-impl", choices=["grouped", "loop"], default="grouped")
    p.add_argument("--group-align", type=int, default=0,
                   help="pad each expert's rows to a multiple of this for grouped_mm (0: none)")
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                   help="compare grouped against loop experts on one layer before timing")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: a smoke test only (--expert-impl loop)")
    args = p.parse_args()

    def fail(msg):
        print(json.dumps({"impl": IMPL, "expert_impl": args.expert_impl, "error": msg}), flush=True)
        return 0

    if not (1 <= args.top_k <= min(8, args.experts)) or args.moe_every < 1:
        return fail(f"need 1 <= top_k ({args.top_k}) <= min(8, experts = {args.experts}) and "
                    f"moe_every ({args.moe_every}) >= 1")
    if args.hidden % args.heads:
        return fail(f"hidden {args.hidden} is not divisible by heads {args.heads}")
    if args.heads % kv_heads(args) or (args.kv_heads > 0 and not swiglu(args)):
        return fail(f"kv heads {args.kv_heads} need --arch mixtral and must divide heads "
                    f"{args.heads}")
    try:
        import torch
    except ImportError:
        return fail("torch not installed")
    if args.device == "cuda" and not torch.cuda.is_available():
        return fail("no GPU")
    grouped_mm, api = grouped_mm_api(torch)
    if args.expert_impl == "grouped":
        if grouped_mm is None:
            return fail(f"PyTorch {torch.__version__} has neither torch.nn.functional.grouped_mm "
                        "(2.10+) nor torch._grouped_mm (2.8, 2.9); upgrade, or use "
                        "--expert-impl loop")
        if args.hidden % 8 or expert_width(args) % 8:
            return fail(f"grouped_mm needs 16-byte aligned bf16 strides: hidden {args.hidden} and "
                        f"the expert width {expert_width(args)} must be multiples of 8")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.global_batch <= 0:
        args.global_batch = args.micro_batch * world
    if args.global_batch % (args.micro_batch * world):
        return fail(f"global batch {args.global_batch} is not a multiple of micro batch "
                    f"{args.micro_batch} x ranks {world}")
    rank, world, device = torch_train_timing.start_ranks(torch, args.device)
    # No TF32 (gpt_torch.py allows it): the router is the one f32 matmul and stays exact f32.
    extra = {"grouped_api": api if args.expert_impl == "grouped" else None,
             "group_align": args.group_align}
    if args.expert_impl == "grouped" and args.check:
        try:
            err = check_experts(torch, args, device, grouped_mm)
            extra["check_max_rel_err"] = round(err, 6)
            if rank == 0 and err > 0.05:
                print(f"moe_torch: WARNING grouped and loop experts differ by {err:.3g} "
                      "(relative); try --group-align 16", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 (reported, not fatal)
            extra["check_error"] = f"{type(e).__name__}: {str(e)[:1000]}"
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for mode in args.modes:
        try:
            result = run(torch, args, mode, rank, world, device, grouped_mm)
        except Exception as e:  # noqa: BLE001 (e.g. torch.compile of grouped_mm): report the mode
            result = {"impl": IMPL, "mode": mode, "ranks": world, "expert_impl": args.expert_impl,
                      "error": f"{type(e).__name__}: {str(e)[:2000]}", "torch": torch.__version__}
        result.update(extra)
        if rank == 0:
            print(json.dumps(result), flush=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
