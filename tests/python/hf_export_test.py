#!/usr/bin/env python3
"""Quintet's Hugging Face export, checked file by file against what transformers writes.

    hf_export_test.py GPT_TRAINER MOE_TRAINER CHECKPOINT_TOOL HF_EXPORT_TOOL MPIEXEC [FLAGS...]

For a Llama model (grouped-query attention, untied), a Qwen3 one (QK-norm, tied embeddings), a
Mixtral one and two Qwen3-MoE ones (one with a dense block: decoder_sparse_step 2), each trained
two steps at a parallel layout:
- the trainer's --export-hf (every rank writing its pieces and its share of the files) and
  12_checkpoint_tool --to-hf of the run's checkpoint give the same bytes; --export-hf-every 1
  exports each step into DIR/step_NNNNNN;
- the tensor names and shapes are the ones transformers' model class of that architecture has in
  its state dict (written out below from the config, not from Quintet's mapping), per expert for
  the MoE ones; config.json holds the keys transformers' config class reads, with the run's sizes;
- --export-dtype bf16 holds the f32 export rounded to nearest even (NumPy), split into files of
  at most --max-shard-bytes with model.safetensors.index.json;
- export -> import at another layout -> export (hf_export_tool, its files shared out between the
  ranks) gives the same bytes again;
- hf_reference.py's checkpoints in the Hub layout (Llama with every attention bias, Llama 3.1's
  RoPE scaling, Qwen2's q/k/v biases, Qwen3 in BF16, Mixtral, Qwen3-MoE with dense layers from
  decoder_sparse_step and mlp_only_layers), imported at tp 2, pp 2 or ep 2 and exported, hold the same
  tensors, bit for bit, and the same config.json values (the Qwen2 case is the only Qwen2 model
  Quintet builds: from --init-from-hf);
- an export that fails midway (a file-size limit) fails on every rank and leaves nothing;
- bad inputs are refused with their message and leave nothing: OUT an existing file, an unknown
  --export-dtype, a GPT-2 model (no Hugging Face layout), in the tool and in the trainer (before
  training).
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

MODEL = ["--device", "cpu", "--layers", "2", "--hidden", "32", "--heads", "4", "--vocab", "256",
         "--seq-len", "16", "--micro-batch", "2", "--global-batch", "4", "--steps", "2",
         "--lr", "3e-3", "--no-progress", "--timeout-s", "60"]

# name: (trainer, ranks, flags, expected config sizes)
CASES = {
    "llama": ("gpt", 2, ["--arch", "llama", "--kv-heads", "2", "--ffn-hidden", "40", "--tp", "2"],
              ["--pp", "2"]),
    "qwen3": ("gpt", 2, ["--arch", "qwen3", "--head-dim", "16", "--ffn-hidden", "40",
                         "--tied-embeddings", "--dp", "2", "--zero", "1"], ["--tp", "2"]),
    "mixtral": ("moe", 2, ["--arch", "mixtral", "--kv-heads", "2", "--ffn-hidden", "24",
                           "--experts", "4", "--dp", "2", "--ep", "2"], []),
    "qwen3_moe": ("moe", 2, ["--arch", "qwen3-moe", "--experts", "4", "--top-k", "2",
                             "--expert-ffn", "12", "--tp", "2"], ["--dp", "2", "--ep", "2"]),
    # Block 0 dense (40 wide), block 1 MoE: decoder_sparse_step 2.
    "qwen3_moe_mixed": ("moe", 2, ["--arch", "qwen3-moe", "--experts", "4", "--top-k", "2",
                                   "--expert-ffn", "12", "--ffn-hidden", "40", "--dense-layers",
                                   "0", "--pp", "2"], ["--dp", "2", "--ep", "2"]),
}


def fail(message):
    sys.exit("FAIL: " + message)


class Runner:
    def __init__(self, argv, work):
        self.gpt, self.moe, self.tool, self.roundtrip, self.mpiexec = argv[:5]
        self.mpi_flags = argv[5:]
        self.work = work  # the programs' working directory (a failure's flight recorder dumps)

    def run(self, cmd, expect_ok=True):
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=240, cwd=self.work)
        if expect_ok and p.returncode != 0:
            fail("exit %d: %s\n%s" % (p.returncode, " ".join(cmd), p.stdout))
        if not expect_ok and p.returncode == 0:
            fail("expected a failure: %s\n%s" % (" ".join(cmd), p.stdout))
        return p.stdout

    def mpi(self, ranks, program, args, expect_ok=True):
        return self.run([self.mpiexec] + self.mpi_flags + ["-np", str(ranks), program] + args,
                        expect_ok)


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} and the metadata of one file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[8 + n + b:8 + n + end])
    return out, meta


def read_export(d):
    """Every tensor of an export directory, checking the index when there is one."""
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    tensors = {}
    where = {}
    for f in files:
        t, meta = read_safetensors(os.path.join(d, f))
        if meta.get("format") != "pt":
            fail("%s/%s: metadata %s lacks format pt (transformers refuses it)" % (d, f, meta))
        for name in t:
            where[name] = f
        tensors.update(t)
    index = os.path.join(d, "model.safetensors.index.json")
    if len(files) > 1:
        with open(index) as f:
            idx = json.load(f)
        if idx["weight_map"] != where:
            fail("%s: the index's weight_map disagrees with the files" % index)
        total = sum(len(v[2]) for v in tensors.values())
        if idx["metadata"]["total_size"] != total:
            fail("%s: total_size %s, the tensors hold %d bytes" % (index, idx["metadata"], total))
    elif files != ["model.safetensors"] or os.path.exists(index):
        fail("%s: one file should be model.safetensors without an index: %s" % (d, files))
    return tensors


def expected_tensors(c):
    """The state dict transformers' *ForCausalLM of config.json's architecture has."""
    arch = c["model_type"]
    d, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    D = c["head_dim"]
    H, K = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    t = {"model.embed_tokens.weight": [V, d], "model.norm.weight": [d]}
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = [V, d]
    for l in range(L):
        p = "model.layers.%d." % l
        t[p + "input_layernorm.weight"] = [d]
        t[p + "post_attention_layernorm.weight"] = [d]
        t[p + "self_attn.q_proj.weight"] = [H, d]
        t[p + "self_attn.k_proj.weight"] = [K, d]
        t[p + "self_attn.v_proj.weight"] = [K, d]
        t[p + "self_attn.o_proj.weight"] = [d, H]
        if arch in ("qwen3", "qwen3_moe"):
            t[p + "self_attn.q_norm.weight"] = [D]
            t[p + "self_attn.k_norm.weight"] = [D]
        if arch in ("llama", "qwen3") or (arch == "qwen3_moe" and not ref.is_sparse(c, l, ())):
            F = c["intermediate_size"]
            t[p + "mlp.gate_proj.weight"] = [F, d]
            t[p + "mlp.up_proj.weight"] = [F, d]
            t[p + "mlp.down_proj.weight"] = [d, F]
        elif arch == "mixtral":
            E, F = c["num_local_experts"], c["intermediate_size"]
            t[p + "block_sparse_moe.gate.weight"] = [E, d]
            for e in range(E):
                q = p + "block_sparse_moe.experts.%d." % e
                t[q + "w1.weight"], t[q + "w3.weight"], t[q + "w2.weight"] = [F, d], [F, d], [d, F]
        else:
            E, F = c["num_experts"], c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = [E, d]
            for e in range(E):
                q = p + "mlp.experts.%d." % e
                t[q + "gate_proj.weight"], t[q + "up_proj.weight"] = [F, d], [F, d]
                t[q + "down_proj.weight"] = [d, F]
    return t


# The keys each config class reads (transformers' LlamaConfig, Qwen3Config, MixtralConfig,
# Qwen3MoeConfig), and the values these runs must give them.
COMMON = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
          "max_position_embeddings": 16, "hidden_act": "silu", "rope_scaling": None,
          "attention_dropout": 0.0, "use_cache": True}
EXPECTED_CONFIG = {
    "llama": dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama",
                  num_key_value_heads=2, head_dim=8, intermediate_size=40, rms_norm_eps=1e-5,
                  rope_theta=500000.0, tie_word_embeddings=False, attention_bias=False,
                  mlp_bias=False, pretraining_tp=1),
    "qwen3": dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                  num_key_value_heads=4, head_dim=16, intermediate_size=40, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False,
                  use_sliding_window=False, sliding_window=None, max_window_layers=2),
    "mixtral": dict(COMMON, architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_key_value_heads=2, head_dim=8, intermediate_size=24, rms_norm_eps=1e-5,
                    rope_theta=1000000.0, tie_word_embeddings=False, num_local_experts=4,
                    num_experts_per_tok=2, router_jitter_noise=0.0, sliding_window=None,
                    output_router_logits=False),
    "qwen3_moe": dict(COMMON, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                      num_key_value_heads=4, head_dim=8, moe_intermediate_size=12,
                      rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False,
                      use_sliding_window=False, output_router_logits=False),
}
EXPECTED_CONFIG["qwen3_moe_mixed"] = dict(EXPECTED_CONFIG["qwen3_moe"], decoder_sparse_step=2,
                                          intermediate_size=40)


def check_layout(name, d, dtype):
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    want = dict(EXPECTED_CONFIG[name], torch_dtype={"F32": "float32", "BF16": "bfloat16"}[dtype])
    for k, v in want.items():
        if k not in c or c[k] != v:
            fail("%s/config.json: %s is %s, expected %s" % (d, k, c.get(k, "absent"), v))
    tensors = read_export(d)
    expected = expected_tensors(c)
    if sorted(tensors) != sorted(expected):
        fail("%s: tensors %s, transformers has %s" % (
            d, sorted(set(tensors) ^ set(expected)), "the others"))
    for n, shape in expected.items():
        if tensors[n][0] != dtype or tensors[n][1] != shape:
            fail("%s: %s is %s %s, expected %s %s" % (d, n, tensors[n][0], tensors[n][1], dtype,
                                                      shape))
    return tensors


def same_export(a, b):
    ta, tb = read_export(a), read_export(b)
    if ta.keys() != tb.keys():
        fail("%s and %s hold different tensors" % (a, b))
    for n in ta:
        if ta[n] != tb[n]:
            fail("%s: %s differs from %s's" % (a, n, b))
    with open(os.path.join(a, "config.json")) as f, open(os.path.join(b, "config.json")) as g:
        if json.load(f) != json.load(g):
            fail("%s/config.json differs from %s's" % (a, b))


def bf16_of(raw_f32):
    """Round to nearest even, as torch's float -> bfloat16 does (finite values)."""
    u = np.frombuffer(raw_f32, dtype=np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()


def main():
    work = tempfile.mkdtemp(prefix="quintet_hf_export_")
    r = Runner(sys.argv[1:], work)
    try:
        run_cases(r, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_cases(r, work):
    data = ["--data-dir", os.path.join(work, "data")]
    for name, (kind, ranks, flags, other_layout) in CASES.items():
        trainer = r.gpt if kind == "gpt" else r.moe
        w = os.path.join(work, name)
        os.makedirs(w)
        ck, exported = os.path.join(w, "ck"), os.path.join(w, "trained")
        r.mpi(ranks, trainer, MODEL + data + flags + ["--save", ck, "--export-hf", exported])
        check_layout(name, exported, "F32")
        from_tool = os.path.join(w, "tool")
        r.run([r.tool, "--to-hf", ck, from_tool])
        same_export(exported, from_tool)

        bf = os.path.join(w, "bf16")
        r.run([r.tool, "--to-hf", ck, bf, "--export-dtype", "bf16", "--max-shard-bytes", "6000"])
        f32, b16 = read_export(exported), check_layout(name, bf, "BF16")
        if not os.path.exists(os.path.join(bf, "model.safetensors.index.json")):
            fail("%s: 6000-byte files should need an index" % bf)
        for n, (_, _, raw) in f32.items():
            if bf16_of(raw) != b16[n][2]:
                fail("%s: %s is not the f32 export rounded to nearest even" % (bf, n))

        # Export -> import at another layout -> export: the same bytes (in files of at most
        # 6000 bytes, shared out between the ranks).
        again = os.path.join(w, "again")
        r.mpi(2 if other_layout else 1, r.roundtrip,
              [kind + ":6000", "--init-from-hf", exported, "--export-hf", again, "--device", "cpu",
               "--seq-len", "16", "--micro-batch", "2", "--global-batch", "4"] + other_layout)
        same_export(exported, again)
        print("ok %s: %d tensors, trained at %s, imported and exported again at %s" % (
            name, len(f32), " ".join(flags[-4:]), " ".join(other_layout) or "1 rank"))

    # --export-hf-every 1: DIR/step_000001 and DIR/step_000002, the last the checkpoint's; a tied
    # table across pp 2 (its second copy, on the last stage, is not written twice).
    w = os.path.join(work, "every")
    ck, every = os.path.join(w, "ck"), os.path.join(w, "every")
    r.mpi(2, r.gpt, MODEL + data + ["--arch", "qwen3", "--head-dim", "16", "--ffn-hidden", "40",
                                    "--tied-embeddings", "--pp", "2", "--save", ck,
                                    "--export-hf", every, "--export-hf-every", "1"])
    if sorted(os.listdir(every)) != ["step_000001", "step_000002"]:
        fail("--export-hf-every 1: %s holds %s" % (every, sorted(os.listdir(every))))
    check_layout("qwen3", os.path.join(every, "step_000001"), "F32")
    r.run([r.tool, "--to-hf", ck, os.path.join(w, "tool")])
    same_export(os.path.join(every, "step_000002"), os.path.join(w, "tool"))
    if read_export(os.path.join(every, "step_000001")) == read_export(os.path.join(w, "tool")):
        fail("--export-hf-every 1: step 1's export equals step 2's")
    print("ok --export-hf-every 1: step_000001 and step_000002 (tied, pp 2)")

    # The reference's checkpoints, as transformers writes them: import -> export gives them back.
    for case, kind, layout in [("llama_gqa", "dense", ["--pp", "2"]),
                               ("llama31", "dense", ["--tp", "2"]),
                               ("qwen2", "dense", ["--tp", "2"]),
                               ("qwen3_tied_bf16", "dense", ["--tp", "2"]),
                               ("mixtral", "moe", ["--dp", "2", "--ep", "2"]),
                               ("qwen3_moe_mixed", "moe", ["--pp", "2"])]:
        source = ref.write_case(os.path.join(work, "reference"), case)
        config = json.load(open(os.path.join(source, "config.json")))
        dtype = "bf16" if config["torch_dtype"] == "bfloat16" else "f32"
        out = os.path.join(work, "reference", case + "_exported")
        r.mpi(2, r.roundtrip,
              [kind, "--init-from-hf", source, "--export-hf", out, "--export-dtype", dtype,
               "--device", "cpu", "--seq-len", "8", "--micro-batch", "2", "--global-batch",
               "4", "--data", os.path.join(source, "tokens.bin")] + layout)  # (not read)
        want, got = read_export(source), read_export(out)
        if sorted(want) != sorted(got):
            fail("%s: exported %s, the reference holds %s" % (case, sorted(got), sorted(want)))
        for n in want:
            if want[n] != got[n]:
                fail("%s: %s differs from the reference's" % (case, n))
        exported = json.load(open(os.path.join(out, "config.json")))
        for k, v in config.items():
            if exported.get(k, "absent") != v:
                fail("%s: config.json's %s is %s, the reference's %s" % (
                    case, k, exported.get(k, "absent"), v))
        print("ok reference %s: %d tensors and the config back from %s" % (
            case, len(want), " ".join(layout)))

    # A write that fails midway (a 4 KiB file-size limit: every rank's pieces are larger) fails
    # on every rank and leaves neither DIR nor DIR.partial.
    source = os.path.join(work, "reference", "llama_gqa")
    failed = os.path.join(work, "reference", "failed")
    # (The limit is set in each rank: mpirun's own files would hit it in mpirun.)
    out = r.mpi(2, "bash", ["-c", 'ulimit -f 4; exec "$0" "$@"', r.roundtrip, "dense:6000",
                            "--init-from-hf", source, "--export-hf", failed, "--device", "cpu",
                            "--seq-len", "8", "--micro-batch", "2", "--global-batch", "4",
                            "--data", os.path.join(source, "tokens.bin"), "--pp", "2"],
                expect_ok=False)
    if out.count("File too large [System") != 2:
        fail("an export past a file-size limit should fail on both ranks:\n" + out)
    if os.path.exists(failed) or os.path.exists(failed + ".partial"):
        fail("a failed export left %s or %s.partial behind" % (failed, failed))
    print("ok a failed export (file-size limit) fails on every rank and leaves nothing")

    # Refused, with nothing written.
    w = os.path.join(work, "refused")
    os.makedirs(w)
    ck = os.path.join(work, "llama", "ck")
    a_file = os.path.join(w, "a_file")
    open(a_file, "w").close()
    for args, message in [
            ([r.tool, "--to-hf", ck, a_file], "exists already (as a file)"),
            ([r.tool, "--to-hf", ck, os.path.join(w, "f16"), "--export-dtype", "f16"],
             "--export-dtype f16: expected f32"),
    ]:
        out = r.run(args, expect_ok=False)
        if message not in out:
            fail("%s: expected '%s' in\n%s" % (" ".join(args), message, out))
    gpt2_ck = os.path.join(w, "gpt2_ck")
    r.mpi(1, r.gpt, MODEL + data + ["--save", gpt2_ck])
    out = r.run([r.tool, "--to-hf", gpt2_ck, os.path.join(w, "gpt2")], expect_ok=False)
    if "no Hugging Face layout here: its norms are LayerNorm" not in out:
        fail("a GPT-2 checkpoint: expected a refusal naming its LayerNorm, got\n" + out)
    for flags, message in [(["--export-hf", os.path.join(w, "gpt2_run")],
                            "no Hugging Face layout here"),
                           (["--arch", "llama", "--export-hf", a_file], "exists already"),
                           (["--arch", "llama", "--export-hf", os.path.join(w, "x"),
                             "--export-dtype", "fp8"], "--export-dtype fp8"),
                           (["--arch", "llama", "--export-hf-every", "2"],
                            "--export-hf-every 2 needs --export-hf DIR")]:
        out = r.mpi(2, r.gpt, MODEL + data + ["--dp", "2"] + flags, expect_ok=False)
        if message not in out:
            fail("trainer %s: expected '%s' before training, got\n%s" % (flags, message, out))
    left = sorted(os.listdir(w))
    if left != ["a_file", "gpt2_ck"]:
        fail("refused exports left %s behind" % left)
    print("ok refused: an existing file, --export-dtype f16 / fp8, GPT-2, --export-hf-every alone")


if __name__ == "__main__":
    main()
