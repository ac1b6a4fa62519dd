#!/usr/bin/env python3
"""A random Llama-style checkpoint in the Hugging Face layout, for scripts/bench/hf_io_bench.sh.

    hf_make_checkpoint.py OUTDIR [--layers 16] [--hidden 2048] [--heads 32] [--kv-heads 8]
                          [--ffn 8192] [--vocab 50304] [--max-shard-bytes 5000000000]

BF16 tensors (tests/python/hf_reference.py's rounding), in save_pretrained's order and file
layout: model.safetensors, or model-0000i-of-0000n.safetensors of at most --max-shard-bytes
each (transformers' 5 GB) with model.safetensors.index.json. One tensor at a time is in memory,
so a 1 B-parameter model needs about 1 GB here. Prints the parameter count and the bytes.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "python"))
from hf_reference import to_bf16_bits  # noqa: E402


def tensors(a):
    """(name, shape, scale) in save_pretrained's order; scale: the values' standard deviation."""
    d, D = a.hidden, a.hidden // a.heads
    out = [("model.embed_tokens.weight", (a.vocab, d), 1.0)]
    for layer in range(a.layers):
        p = "model.layers.%d." % layer
        out += [(p + "self_attn.q_proj.weight", (a.heads * D, d), d ** -0.5),
                (p + "self_attn.k_proj.weight", (a.kv_heads * D, d), d ** -0.5),
                (p + "self_attn.v_proj.weight", (a.kv_heads * D, d), d ** -0.5),
                (p + "self_attn.o_proj.weight", (d, a.heads * D), d ** -0.5),
                (p + "mlp.gate_proj.weight", (a.ffn, d), d ** -0.5),
                (p + "mlp.up_proj.weight", (a.ffn, d), d ** -0.5),
                (p + "mlp.down_proj.weight", (d, a.ffn), a.ffn ** -0.5),
                (p + "input_layernorm.weight", (d,), 0.0),
                (p + "post_attention_layernorm.weight", (d,), 0.0)]
    out += [("model.norm.weight", (d,), 0.0), ("lm_head.weight", (a.vocab, d), d ** -0.5)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--max-shard-bytes", type=int, default=5_000_000_000)
    a = ap.parse_args()
    all_tensors = tensors(a)
    nbytes = lambda shape: 2 * int(np.prod(shape))
    # save_pretrained's sharding: tensors in order, a new file when the next would pass the limit.
    files = [[]]
    size = 0
    for t in all_tensors:
        if files[-1] and size + nbytes(t[1]) > a.max_shard_bytes:
            files.append([])
            size = 0
        files[-1].append(t)
        size += nbytes(t[1])
    names = (["model.safetensors"] if len(files) == 1 else
             ["model-%05d-of-%05d.safetensors" % (i + 1, len(files)) for i in range(len(files))])
    os.makedirs(a.outdir, exist_ok=True)
    rng = np.random.default_rng(0)
    weight_map, total = {}, 0
    for name, part in zip(names, files):
        header, offset = {}, 0
        for tname, shape, _ in part:
            header[tname] = {"dtype": "BF16", "shape": list(shape),
                             "data_offsets": [offset, offset + nbytes(shape)]}
            offset += nbytes(shape)
            weight_map[tname] = name
        header["__metadata__"] = {"format": "pt"}
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(a.outdir, name), "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, shape, scale in part:
                if scale == 0.0:  # the norms' gains
                    values = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
                else:
                    values = scale * rng.standard_normal(shape, dtype=np.float32)
                f.write(to_bf16_bits(values).tobytes())
        total += offset
    if len(files) > 1:
        with open(os.path.join(a.outdir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "hidden_size": a.hidden, "num_hidden_layers": a.layers,
              "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
              "head_dim": a.hidden // a.heads, "intermediate_size": a.ffn,
              "vocab_size": a.vocab, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
              "rope_theta": 500000.0, "rope_scaling": None, "tie_word_embeddings": False,
              "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16",
              "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True}
    with open(os.path.join(a.outdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print("parameters %d bytes %d files %d" % (total // 2, total, len(files)))


if __name__ == "__main__":
    main()
