#!/usr/bin/env python3
"""A NumPy (float64) reference of Hugging Face's Llama, Qwen3, Mixtral and Qwen3-MoE causal LMs,
and tiny random checkpoints in the exact Hub layout for Quintet's import tests.

Each case is a directory as transformers' save_pretrained writes it (config.json, model.safetensors
or model-0000i-of-0000n.safetensors with model.safetensors.index.json), plus tokens.bin (int32
[rows, seq_len + 1]: inputs are a row's first seq_len tokens, targets its last seq_len) and
expected.json ({"loss": the mean cross-entropy over every target}). The forward follows
transformers' modeling code: RMSNorm x * rsqrt(mean(x^2) + eps) * weight; rotate-half RoPE with
inv_freq = 1 / theta^(2i / head_dim); QK-norm (Qwen3) over head_dim before RoPE; grouped-query
attention (query head h uses key/value head h // (heads / kv_heads)); causal softmax attention
scaled by 1 / sqrt(head_dim); SwiGLU down(silu(gate(x)) * up(x)); MoE routing softmax over the
experts in float, the top k of them, renormalized over the k when norm_topk_prob (Mixtral:
always); Qwen3-MoE's dense layers (decoder_sparse_step, mlp_only_layers: is_sparse) a SwiGLU MLP
of intermediate_size. Weights are drawn large enough that the loss depends on every one of them (a
transposed or swapped tensor changes it far beyond the tests' tolerance). BF16 cases store the
weights rounded to nearest even, and the reference computes with the rounded values.

scripts/hf/make_transformers_reference.py writes the same format with transformers itself.

    python3 hf_reference.py OUTDIR        # every case into OUTDIR/<case>/
"""

import json
import os
import struct
import sys

import numpy as np

# ---- safetensors -----------------------------------------------------------------------------


def to_bf16_bits(x):
    """float32 -> bfloat16 bits (uint16), rounded to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_to(dtype, x):
    """x as the file will hold it, as float64."""
    if dtype == "BF16":
        return from_bf16_bits(to_bf16_bits(x)).astype(np.float64)
    return np.asarray(x, dtype=np.float32).astype(np.float64)


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, float64 array); written back to back in dtype (F32 or BF16)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        raw = (to_bf16_bits(t) if dtype == "BF16" else np.asarray(t, np.float32)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def save(dirname, tensors, dtype, shards=1):
    """save_pretrained's layout: one file, or `shards` files and the index."""
    os.makedirs(dirname, exist_ok=True)
    if shards == 1:
        write_safetensors(os.path.join(dirname, "model.safetensors"), tensors, dtype)
        return
    per = -(-len(tensors) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, shards)
        part = tensors[i * per:(i + 1) * per]
        write_safetensors(os.path.join(dirname, name), part, dtype)
        for n, t in part:
            weight_map[n] = name
            total += t.size * (2 if dtype == "BF16" else 4)
    with open(os.path.join(dirname, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


# ---- the forward ----------------------------------------------------------------------------


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta, scaling=None):
    """x [B, S, H, D], rotate-half convention, token s at position s; scaling: config.json's
    rope_scaling of rope_type "llama3" (transformers' _compute_llama3_parameters) or None."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if scaling and scaling.get("rope_type") == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv_freq = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    angle = np.arange(x.shape[1], dtype=np.float64)[:, None] * inv_freq[None, :]  # [S, D/2]
    cos = np.concatenate([np.cos(angle)] * 2, axis=-1)[None, :, None, :]
    sin = np.concatenate([np.sin(angle)] * 2, axis=-1)[None, :, None, :]
    half = d // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def silu(x):
    return x / (1.0 + np.exp(-x))


def linear(x, w, b=None):
    y = x @ w.T
    return y if b is None else y + b


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def attention(c, w, p, x):
    B, S, _ = x.shape
    H, K, D = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    get = lambda n: w.get(p + n)
    q = linear(x, get("q_proj.weight"), get("q_proj.bias")).reshape(B, S, H, D)
    k = linear(x, get("k_proj.weight"), get("k_proj.bias")).reshape(B, S, K, D)
    v = linear(x, get("v_proj.weight"), get("v_proj.bias")).reshape(B, S, K, D)
    if p + "q_norm.weight" in w:
        q = rms_norm(q, w[p + "q_norm.weight"], c["rms_norm_eps"])
        k = rms_norm(k, w[p + "k_norm.weight"], c["rms_norm_eps"])
    scaling = c.get("rope_scaling")
    q, k = rope(q, c["rope_theta"], scaling), rope(k, c["rope_theta"], scaling)
    group = H // K
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(D)
    scores = scores + np.triu(np.full((S, S), -np.inf), 1)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    probs = scores / scores.sum(-1, keepdims=True)
    out = np.einsum("bhst,bthd->bshd", probs, v).reshape(B, S, H * D)
    return linear(out, w[p + "o_proj.weight"], get("o_proj.bias"))


def swiglu(x, gate, up, down):
    return linear(silu(linear(x, gate)) * linear(x, up), down)


def moe(c, w, p, x, names, fused, margins):
    """names: (module, gate, up, down) expert names; fused: transformers 5's 3-D tensors."""
    module, g, u, d = names
    E, k = c["num_local_experts"] if "num_local_experts" in c else c["num_experts"], \
        c["num_experts_per_tok"]
    renorm = c.get("norm_topk_prob", True)
    B, S, dim = x.shape
    t = x.reshape(-1, dim)
    logits = linear(t, w[p + module + ".gate.weight"])
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    order = np.argsort(-probs, axis=-1)
    top = order[:, :k]
    srt = np.take_along_axis(probs, order, axis=-1)
    if k < E:
        margins.append(float(np.min(srt[:, k - 1] - srt[:, k])))
    weights = np.take_along_axis(probs, top, axis=-1)
    if renorm:
        weights = weights / weights.sum(-1, keepdims=True)
    out = np.zeros_like(t)
    pre = p + module + ".experts."
    for e in range(E):
        if fused:
            F = w[pre + "down_proj"].shape[2]
            gu = w[pre + "gate_up_proj"][e]
            gate, up, down = gu[:F], gu[F:], w[pre + "down_proj"][e]
        else:
            gate, up, down = (w["%s%d.%s.weight" % (pre, e, n)] for n in (g, u, d))
        y = swiglu(t, gate, up, down)
        for j in range(k):
            sel = top[:, j] == e
            out[sel] += weights[sel, j:j + 1] * y[sel]
    return out.reshape(B, S, dim)


def is_sparse(c, layer, expert_names):
    """Whether the layer holds the MoE block: Mixtral's always; Qwen3-MoE's as transformers'
    Qwen3MoeDecoderLayer decides, not in mlp_only_layers, num_experts > 0 and
    (layer + 1) % decoder_sparse_step == 0 (the others a dense MLP of intermediate_size)."""
    if expert_names is None:
        return False
    if c["model_type"] != "qwen3_moe":
        return True
    return (layer not in c.get("mlp_only_layers", []) and c["num_experts"] > 0
            and (layer + 1) % c.get("decoder_sparse_step", 1) == 0)


def forward_loss(c, w, tokens, expert_names=None, fused=False):
    """Mean cross-entropy of the causal LM on rows [rows, S + 1]; returns (loss, routing margins)."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    eps = c["rms_norm_eps"]
    x = w["model.embed_tokens.weight"][inputs]
    margins = []
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        h = x + attention(c, w, p + "self_attn.", rms_norm(x, w[p + "input_layernorm.weight"], eps))
        y = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        if not is_sparse(c, layer, expert_names):
            m = p + "mlp."
            x = h + swiglu(y, w[m + "gate_proj.weight"], w[m + "up_proj.weight"],
                           w[m + "down_proj.weight"])
        else:
            x = h + moe(c, w, p, y, expert_names, fused, margins)
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    logits = x @ head.T
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)
    return float(nll.mean()), margins


# ---- random checkpoints ---------------------------------------------------------------------


def random_weights(c, rng, expert_names=None, fused=False):
    """The model's tensors, in save_pretrained's order, float64 (before rounding)."""
    d, H, K, D = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    out = []
    mat = lambda rows, cols: rng.normal(0.0, 1.0 / np.sqrt(cols), (rows, cols))
    gain = lambda n: 1.0 + 0.3 * rng.normal(size=n)
    out.append(("model.embed_tokens.weight", rng.normal(0.0, 1.0, (c["vocab_size"], d))))
    # Qwen2: biases on q, k and v always, never on o; the others: attention_bias, all four.
    qkv_bias = c.get("attention_bias", False) or c["model_type"] == "qwen2"
    o_bias = c.get("attention_bias", False)
    for layer in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % layer
        a = p + "self_attn."
        out.append((a + "q_proj.weight", mat(H * D, d)))
        out.append((a + "k_proj.weight", mat(K * D, d)))
        out.append((a + "v_proj.weight", mat(K * D, d)))
        out.append((a + "o_proj.weight", mat(d, H * D)))
        if qkv_bias:
            out.append((a + "q_proj.bias", 0.3 * rng.normal(size=H * D)))
            out.append((a + "k_proj.bias", 0.3 * rng.normal(size=K * D)))
            out.append((a + "v_proj.bias", 0.3 * rng.normal(size=K * D)))
        if o_bias:
            out.append((a + "o_proj.bias", 0.3 * rng.normal(size=d)))
        if c["model_type"] in ("qwen3", "qwen3_moe"):
            out.append((a + "q_norm.weight", gain(D)))
            out.append((a + "k_norm.weight", gain(D)))
        out.append((p + "input_layernorm.weight", gain(d)))
        out.append((p + "post_attention_layernorm.weight", gain(d)))
        if not is_sparse(c, layer, expert_names):
            F = c["intermediate_size"]
            out.append((p + "mlp.gate_proj.weight", mat(F, d)))
            out.append((p + "mlp.up_proj.weight", mat(F, d)))
            out.append((p + "mlp.down_proj.weight", mat(d, F)))
            continue
        module, g, u, dn = expert_names
        E = c.get("num_local_experts", c.get("num_experts"))
        F = c.get("moe_intermediate_size", c["intermediate_size"])
        m = p + module + "."
        out.append((m + "gate.weight", 3.0 * mat(E, d)))
        if fused:
            out.append((m + "experts.gate_up_proj",
                        np.stack([np.concatenate([mat(F, d), mat(F, d)]) for _ in range(E)])))
            out.append((m + "experts.down_proj", np.stack([mat(d, F) for _ in range(E)])))
        else:
            for e in range(E):
                out.append(("%sexperts.%d.%s.weight" % (m, e, g), mat(F, d)))
                out.append(("%sexperts.%d.%s.weight" % (m, e, u), mat(F, d)))
                out.append(("%sexperts.%d.%s.weight" % (m, e, dn), mat(d, F)))
    out.append(("model.norm.weight", gain(d)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", 2.0 * mat(c["vocab_size"], d)))
    return out


def base_config(arch, model_type, **sizes):
    c = {"architectures": [arch], "model_type": model_type, "hidden_act": "silu",
         "max_position_embeddings": 64, "torch_dtype": "float32", "attention_dropout": 0.0,
         "initializer_range": 0.02, "use_cache": True}
    c.update(sizes)
    return c


# The cases: name -> (config, dtype, shards, expert names or None, fused experts).
MIXTRAL = ("block_sparse_moe", "w1", "w3", "w2")
QWEN3_MOE = ("mlp", "gate_proj", "up_proj", "down_proj")
CASES = {
    # Llama, grouped-query attention (q apart, k and v fused in Quintet), every attention bias,
    # odd-ish sizes, untied, F32.
    "llama_gqa": (base_config("LlamaForCausalLM", "llama", hidden_size=24, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                              intermediate_size=44, vocab_size=52, rms_norm_eps=1e-5,
                              rope_theta=500000.0, tie_word_embeddings=False,
                              attention_bias=True, mlp_bias=False, rope_scaling=None),
                  "F32", 1, None, False),
    # Llama 3.1's RoPE scaling (rope_type llama3: every band of frequencies, kept, interpolated
    # and divided, at this head_dim and original length), MHA, untied, BF16.
    "llama31": (base_config("LlamaForCausalLM", "llama", hidden_size=24, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=2, head_dim=12,
                            intermediate_size=32, vocab_size=40, rms_norm_eps=1e-5,
                            rope_theta=500000.0, tie_word_embeddings=False,
                            attention_bias=False, mlp_bias=False,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 1024}),
                "BF16", 1, None, False),
    # Qwen2: biases on q, k and v but not o (GQA: q apart, k and v fused in Quintet), tied, F32,
    # 4 layers (for pp 2 x vpp 2).
    "qwen2": (base_config("Qwen2ForCausalLM", "qwen2", hidden_size=24, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, intermediate_size=28,
                          vocab_size=46, rms_norm_eps=1e-6, rope_theta=1000000.0,
                          tie_word_embeddings=True, use_sliding_window=False,
                          sliding_window=None, max_window_layers=4),
              "F32", 1, None, False),
    # Qwen3: QK-norm, head_dim apart from hidden / heads, q/k/v fused in Quintet, biases, tied,
    # BF16, two files with the index.
    "qwen3_tied_bf16": (base_config("Qwen3ForCausalLM", "qwen3", hidden_size=20,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=4, head_dim=8, intermediate_size=36,
                                    vocab_size=42, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                    tie_word_embeddings=True, attention_bias=True,
                                    use_sliding_window=False, sliding_window=None),
                        "BF16", 2, None, False),
    # Mixtral as transformers 4 writes it (block_sparse_moe, w1/w3/w2), GQA, untied, F32.
    "mixtral": (base_config("MixtralForCausalLM", "mixtral", hidden_size=24, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                            intermediate_size=20, vocab_size=48, rms_norm_eps=1e-5,
                            rope_theta=1000000.0, tie_word_embeddings=False,
                            num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.0,
                            sliding_window=None, output_router_logits=False),
                "F32", 1, MIXTRAL, False),
    # Qwen3-MoE with transformers 5's fused experts, no renormalization, QK-norm, tied, BF16,
    # sharded.
    "qwen3_moe_fused": (base_config("Qwen3MoeForCausalLM", "qwen3_moe", hidden_size=20,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, intermediate_size=32,
                                    moe_intermediate_size=12, vocab_size=40,
                                    rms_norm_eps=1e-6, rope_theta=1000000.0,
                                    tie_word_embeddings=True, num_experts=4,
                                    num_experts_per_tok=2, norm_topk_prob=False,
                                    decoder_sparse_step=1, mlp_only_layers=[],
                                    use_sliding_window=False),
                        "BF16", 2, QWEN3_MOE, True),
    # Qwen3-MoE with dense layers: decoder_sparse_step 2 makes layers 1, 3 and 5 sparse,
    # mlp_only_layers takes 3 back, so 1 and 5 are MoE and 0, 2, 3, 4 dense MLPs of
    # intermediate_size (28; the experts 12); renormalized, per-expert tensors, untied, F32.
    "qwen3_moe_mixed": (base_config("Qwen3MoeForCausalLM", "qwen3_moe", hidden_size=20,
                                    num_hidden_layers=6, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, intermediate_size=28,
                                    moe_intermediate_size=12, vocab_size=40,
                                    rms_norm_eps=1e-6, rope_theta=1000000.0,
                                    tie_word_embeddings=False, num_experts=4,
                                    num_experts_per_tok=2, norm_topk_prob=True,
                                    decoder_sparse_step=2, mlp_only_layers=[3],
                                    use_sliding_window=False),
                        "F32", 1, QWEN3_MOE, False),
}

SEQ_LEN = 8
ROWS = 4  # the global batch


def write_case(outdir, name, seed=0):
    c, dtype, shards, experts, fused = CASES[name]
    c = dict(c)
    c["torch_dtype"] = "bfloat16" if dtype == "BF16" else "float32"
    for attempt in range(50):  # a draw whose routing has no near-tie (f32 vs f64 could differ)
        rng = np.random.default_rng([seed, attempt, len(name)])
        tensors = [(n, round_to(dtype, t)) for n, t in random_weights(c, rng, experts, fused)]
        tokens = rng.integers(0, c["vocab_size"], size=(ROWS, SEQ_LEN + 1)).astype(np.int32)
        loss, margins = forward_loss(c, dict(tensors), tokens, experts, fused)
        if not margins or min(margins) > 1e-4:
            break
    else:
        raise RuntimeError("no draw without a near-tie in the routing")
    d = os.path.join(outdir, name)
    save(d, tensors, dtype, shards)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    tokens.tofile(os.path.join(d, "tokens.bin"))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"loss": loss, "seq_len": SEQ_LEN, "rows": ROWS,
                   "uniform_loss": float(np.log(c["vocab_size"]))}, f)
    return d


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: hf_reference.py OUTDIR")
    for case in CASES:
        print(write_case(sys.argv[1], case))
