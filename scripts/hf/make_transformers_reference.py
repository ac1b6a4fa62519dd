#!/usr/bin/env python3
"""Quintet's Hugging Face import test data, made by transformers itself.

NOT RUN IN CI: it needs PyTorch and transformers, which the CI machine does not have; run it on
a machine that has them (the GPU machine). CI uses tests/python/hf_reference.py instead, a NumPy
reference that writes the same format; this script checks that format, and Quintet's import,
against the real thing.

For each case of hf_reference.CASES (Llama with GQA and every attention bias; Qwen3 with
QK-norm, tied, BF16, sharded; Mixtral; Qwen3-MoE without renormalization, tied, BF16, sharded;
Qwen3-MoE with dense layers from decoder_sparse_step and mlp_only_layers)
it builds the model with transformers from the same config (eager attention, float32), draws
weights large enough that the loss depends on each of them (as hf_reference.py does), rounds
them to bfloat16 for the BF16 cases, writes the directory with save_pretrained (the layout and
expert names of the installed transformers version: transformers 5 writes fused 3-D experts),
and beside it tokens.bin (int32 [rows, seq_len + 1]), expected.json (transformers' loss on those
tokens: model(input_ids=rows, labels=rows).loss, the mean cross-entropy of every next token, and
the transformers and torch versions) and logits.npy (float32 [rows, seq_len + 1, vocab]).

    python3 scripts/hf/make_transformers_reference.py OUTDIR
    # then Quintet's import against it (same checks as CI, on these directories):
    QUINTET_HF_REFERENCE_DIR=OUTDIR ctest --test-dir build -R train_hf_import_ -V
"""

import json
import os
import sys

import numpy as np
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tests", "python"))
import hf_reference as ref  # noqa: E402


def draw_(model, seed):
    """Weights like hf_reference.random_weights': N(0, 1/fan_in) matrices, N(0, 1) embedding,
    norm gains 1 + 0.3 N(0, 1), biases 0.3 N(0, 1), routers 3x."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                scale = 3.0 if name.endswith("gate.weight") else 1.0
                p.copy_(scale * torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            elif "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def write_case(outdir, name, seed=0):
    config_dict, dtype, shards, experts, fused = ref.CASES[name]
    config_dict = {k: v for k, v in config_dict.items() if k not in ("architectures",)}
    arch = ref.CASES[name][0]["architectures"][0]
    config = transformers.AutoConfig.for_model(**config_dict)
    config.architectures = [arch]
    config._attn_implementation = "eager"
    model = getattr(transformers, arch)(config).to(torch.float32).eval()
    draw_(model, seed)
    if dtype == "BF16":
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    rng = np.random.default_rng([seed, len(name)])
    tokens = rng.integers(0, config.vocab_size, size=(ref.ROWS, ref.SEQ_LEN + 1)).astype(np.int32)
    ids = torch.from_numpy(tokens.astype(np.int64))
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    d = os.path.join(outdir, name)
    save = model.to(torch.bfloat16) if dtype == "BF16" else model
    save.save_pretrained(d, safe_serialization=True,
                         max_shard_size="4KB" if shards > 1 else "5GB")
    tokens.tofile(os.path.join(d, "tokens.bin"))
    np.save(os.path.join(d, "logits.npy"), out.logits.to(torch.float32).numpy())
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"loss": float(out.loss), "seq_len": ref.SEQ_LEN, "rows": ref.ROWS,
                   "uniform_loss": float(np.log(config.vocab_size)),
                   "transformers_version": transformers.__version__,
                   "torch_version": torch.__version__}, f, indent=2)
    # The NumPy reference on the files written must agree: the two references check each other.
    numpy_loss = numpy_reference_loss(d, ref.CASES[name][0], tokens, experts)
    rel = abs(numpy_loss - float(out.loss)) / float(out.loss)
    if rel > 1e-5:
        sys.exit("%s: transformers' loss %.9f, hf_reference.py's %.9f" % (d, out.loss, numpy_loss))
    return d, float(out.loss)


def numpy_reference_loss(d, config, tokens, experts):
    from safetensors.torch import load_file
    weights = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            weights.update({k: v.to(torch.float64).numpy() for k, v in load_file(
                os.path.join(d, f)).items()})
    fused = any(k.endswith("experts.gate_up_proj") for k in weights)
    if experts is not None:  # the module the installed transformers wrote (mlp in version 5)
        module = "block_sparse_moe" if any(".block_sparse_moe." in k for k in weights) else "mlp"
        experts = (module,) + tuple(experts[1:])
    loss, _ = ref.forward_loss(config, weights, tokens, experts, fused)
    return loss


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for name in ref.CASES:
        d, loss = write_case(sys.argv[1], name)
        print("%s: transformers %s loss %.9f" % (d, transformers.__version__, loss))


if __name__ == "__main__":
    main()
