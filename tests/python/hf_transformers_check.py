#!/usr/bin/env python3
"""Quintet's Hugging Face export, loaded by transformers itself (the GPU machine's test).

    hf_transformers_check.py GPT_TRAINER MOE_TRAINER CHECKPOINT_TOOL [MPIEXEC [FLAGS...]]
                             [--quintet-only]

Exits 77 (ctest: skipped) when torch or transformers cannot be imported, as in CI; the GPU
machine has both. For a Llama model (grouped-query attention), a Qwen3 one (QK-norm, tied
embeddings), a Mixtral one and two Qwen3-MoE ones (one with a dense layer):
- the trainer trains it a few steps on a token file with a pattern to learn (--device cuda when
  nvidia-smi lists a GPU, else cpu; at 1 rank, and at 2 ranks when MPIEXEC is given: cuda only
  when there are 2 GPUs) and exports it (--export-hf, f32, one file); 12_checkpoint_tool --to-hf
  exports the run's checkpoint in bf16, split into files of at most 3000 bytes with
  model.safetensors.index.json;
- Quintet's loss on the held-out windows of a validation file (--eval-only --init-from-hf EXPORT
  --val-data, on the CPU: f32 arithmetic) is the trained run's val_loss (within 1e-5 relative
  when the run was on the CPU; 3e-2 on the GPU, whose trainer computes in bf16), and the bf16
  export's within 3e-2 of the f32 export's (its weights rounded to 8 significant bits);
- what vLLM-style consumers read: config.json's `architectures` is the one class expected,
  `torch_dtype` is the dtype of every tensor in the files, one file is model.safetensors without
  an index, several files have model.safetensors.index.json whose weight_map names every tensor
  of the files (and only those) in its file, and total_size their bytes; every file has
  {"format": "pt"};
- transformers (unless --quintet-only): AutoConfig and AutoModelForCausalLM.from_pretrained(
  EXPORT, float32, output_loading_info=True) give that class with no missing, unexpected or
  mismatched keys, and its mean cross-entropy of the same windows (the logits' log-softmax in
  float64) is Quintet's within 1e-4 relative for both exports: transformers upcasts the bf16
  values exactly as Quintet's import does, so both compute in f32 from the same weights.
--quintet-only runs everything but the transformers part (no torch needed): the plumbing, in CI.
QUINTET_HF_CHECK_GPUS=N overrides the GPU count from nvidia-smi (0: train on the CPU too).
"""

import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

VOCAB, USED, SEQ, STEPS = 256, 64, 16, 12
COMMON = ["--layers", "2", "--hidden", "32", "--heads", "4", "--vocab", str(VOCAB),
          "--seq-len", str(SEQ), "--micro-batch", "2", "--global-batch", "4", "--lr", "1e-2",
          "--warmup", "0", "--no-progress", "--timeout-s", "120", "--json"]
MOE = ["--capacity-factor", "0"]  # dropless, as transformers computes

# name: (trainer, architecture, model flags, 2-rank layout)
MODELS = {
    "llama": ("gpt", "LlamaForCausalLM",
              ["--arch", "llama", "--kv-heads", "2", "--ffn-hidden", "40"], ["--tp", "2"]),
    "qwen3": ("gpt", "Qwen3ForCausalLM",
              ["--arch", "qwen3", "--head-dim", "16", "--ffn-hidden", "40", "--tied-embeddings"],
              ["--dp", "2", "--zero", "1"]),
    "mixtral": ("moe", "MixtralForCausalLM",
                ["--arch", "mixtral", "--kv-heads", "2", "--ffn-hidden", "24", "--experts", "4"]
                + MOE, ["--dp", "2", "--ep", "2"]),
    "qwen3_moe": ("moe", "Qwen3MoeForCausalLM",
                  ["--arch", "qwen3-moe", "--experts", "4", "--top-k", "2", "--expert-ffn", "12"]
                  + MOE, ["--tp", "2"]),
    # Block 0 a dense MLP (decoder_sparse_step 2 in config.json), block 1 MoE.
    "qwen3_moe_mixed": ("moe", "Qwen3MoeForCausalLM",
                        ["--arch", "qwen3-moe", "--experts", "4", "--top-k", "2", "--expert-ffn",
                         "12", "--ffn-hidden", "40", "--dense-layers", "0"] + MOE, ["--pp", "2"]),
}
DTYPES = {"F32": "float32", "BF16": "bfloat16"}


def fail(message):
    print("FAIL: " + message, flush=True)
    sys.exit(1)


def close(a, b, rel):
    return abs(a - b) <= rel * abs(b)


# ---- data ------------------------------------------------------------------------------------


def tokens(n, seed):
    """A pattern to learn: tokens below USED, mostly next = 7 prev + 3 (mod USED), one in five
    random."""
    rng = random.Random(seed)
    t = [rng.randrange(USED)]
    while len(t) < n:
        t.append((7 * t[-1] + 3) % USED if rng.random() < 0.8 else rng.randrange(USED))
    return t


def write_llmc(path, toks):
    """llm.c's token shard: 256 int32 (magic 20240520, version 1, count), then uint16 tokens."""
    header = [20240520, 1, len(toks)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(toks), *toks))


def windows(toks):
    """The trainer's validation windows: SEQ + 1 tokens from each multiple of SEQ."""
    return [toks[w * SEQ:w * SEQ + SEQ + 1] for w in range((len(toks) - 1) // SEQ)]


# ---- Quintet ---------------------------------------------------------------------------------


class Quintet:
    def __init__(self, argv, work):
        self.gpt, self.moe, self.tool = (os.path.abspath(a) for a in argv[:3])
        self.mpiexec = argv[3] if len(argv) > 3 else None
        self.mpi_flags = argv[4:]
        self.work = work
        self.gpus = count_gpus()

    def run(self, cmd):
        print("+ " + " ".join(cmd), flush=True)
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=300, cwd=self.work)
        except subprocess.TimeoutExpired:
            fail("hung: " + " ".join(cmd))
        if p.returncode != 0:
            fail("exit %d: %s\n%s" % (p.returncode, " ".join(cmd), p.stdout))
        return p.stdout

    def trainer(self, ranks, kind, args):
        program = self.gpt if kind == "gpt" else self.moe
        if ranks == 1:
            return self.run([program] + args)
        return self.run([self.mpiexec] + self.mpi_flags + ["-np", str(ranks), program] + args)

    def device(self, ranks):
        return "cuda" if self.gpus >= ranks else "cpu"


def count_gpus():
    forced = os.environ.get("QUINTET_HF_CHECK_GPUS")
    if forced is not None:
        return int(forced)
    if not shutil.which("nvidia-smi"):
        return 0
    p = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True)
    return sum(line.startswith("GPU ") for line in p.stdout.splitlines()) if p.returncode == 0 \
        else 0


def val_loss(output, what):
    losses = [json.loads(line)["val_loss"] for line in output.splitlines()
              if line.startswith("{") and '"val_loss"' in line]
    if not losses:
        fail("%s: no val_loss in its output:\n%s" % (what, output))
    return losses[-1]


# ---- the files, as vLLM-style consumers read them --------------------------------------------


def safetensors_header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return header.pop("__metadata__", {}), header


def check_files(d, arch, dtype):
    """config.json's architectures and torch_dtype, the files and their index; returns the
    number of files."""
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    if config.get("architectures") != [arch]:
        fail("%s/config.json: architectures %s, expected [%s]" %
             (d, config.get("architectures"), arch))
    if config.get("torch_dtype") != DTYPES[dtype]:
        fail("%s/config.json: torch_dtype %s, the files hold %s" %
             (d, config.get("torch_dtype"), dtype))
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    where, total = {}, 0
    for name in files:
        meta, header = safetensors_header(os.path.join(d, name))
        if meta.get("format") != "pt":
            fail("%s/%s: metadata %s lacks format pt (transformers refuses it)" % (d, name, meta))
        for tensor, e in header.items():
            if e["dtype"] != dtype:
                fail("%s/%s: %s is %s, config.json says %s" %
                     (d, name, tensor, e["dtype"], config["torch_dtype"]))
            if tensor in where:
                fail("%s: %s in %s and %s" % (d, tensor, where[tensor], name))
            where[tensor] = name
            total += e["data_offsets"][1] - e["data_offsets"][0]
    index = os.path.join(d, "model.safetensors.index.json")
    if len(files) == 1:
        if files != ["model.safetensors"] or os.path.exists(index):
            fail("%s: one file should be model.safetensors without an index: %s" % (d, files))
        return 1
    if not os.path.exists(index):
        fail("%s: %d files and no model.safetensors.index.json" % (d, len(files)))
    with open(index) as f:
        idx = json.load(f)
    if idx.get("weight_map") != where:
        missing = sorted(set(where) - set(idx.get("weight_map", {})))
        extra = sorted(set(idx.get("weight_map", {})) - set(where))
        fail("%s: the index's weight_map disagrees with the files (not in it: %s; not in the "
             "files or in another file: %s)" % (index, missing, extra))
    if idx.get("metadata", {}).get("total_size") != total:
        fail("%s: total_size %s, the tensors hold %d bytes" % (index, idx.get("metadata"), total))
    return len(files)


# ---- transformers ----------------------------------------------------------------------------


def transformers_loss(d, arch, val_windows):
    """Loads d as a consumer would; its mean cross-entropy over the windows."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(d)
    if list(config.architectures or []) != [arch] or not hasattr(transformers, arch):
        fail("%s: transformers reads architectures %s; %s is %s in transformers %s" %
             (d, config.architectures, arch, "a class" if hasattr(transformers, arch) else
              "not a class", transformers.__version__))
    dtype_arg = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        d, output_loading_info=True, attn_implementation="eager", **{dtype_arg: torch.float32})
    if type(model).__name__ != arch:
        fail("%s: transformers made a %s, not a %s" % (d, type(model).__name__, arch))
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        value = info.get(key) if isinstance(info, dict) else getattr(info, key, None)
        if value:
            fail("%s: transformers' loading info: %s %s (all of it: %s)" % (d, key, value, info))
    model.eval()
    rows = torch.tensor(val_windows, dtype=torch.long)
    with torch.no_grad():
        logits = model(input_ids=rows[:, :-1]).logits
    logp = torch.log_softmax(logits.double(), dim=-1)
    nll = -logp.gather(-1, rows[:, 1:].unsqueeze(-1)).squeeze(-1)
    return nll.mean().item()


# ---- the check -------------------------------------------------------------------------------


def check_model(q, name, ranks, train_file, val_file, val_windows, with_transformers):
    kind, arch, flags, layout = MODELS[name]
    w = os.path.join(q.work, "%s_%d" % (name, ranks))
    os.makedirs(w)
    ck, f32, bf16 = os.path.join(w, "ck"), os.path.join(w, "f32"), os.path.join(w, "bf16")
    device = q.device(ranks)
    out = q.trainer(ranks, kind, COMMON + flags + (layout if ranks > 1 else []) + [
        "--device", device, "--steps", str(STEPS), "--data", train_file, "--val-data", val_file,
        "--save", ck, "--export-hf", f32])
    trained = val_loss(out, "%s training" % name)
    q.run([q.tool, "--to-hf", ck, bf16, "--export-dtype", "bf16", "--max-shard-bytes", "3000"])
    if check_files(f32, arch, "F32") != 1:
        fail("%s: the trainer's export should be one file" % f32)
    if check_files(bf16, arch, "BF16") < 2:
        fail("%s: 3000-byte files should need several and an index" % bf16)

    # Quintet's loss of each export: imported on one CPU rank, so f32 arithmetic.
    quintet = {}
    for d in (f32, bf16):
        out = q.trainer(1, kind, ["--init-from-hf", d, "--eval-only", "--val-data", val_file,
                                  "--seq-len", str(SEQ), "--micro-batch", "2", "--global-batch",
                                  "4", "--device", "cpu", "--no-progress", "--json"] +
                        (MOE if kind == "moe" else []))
        quintet[d] = val_loss(out, "%s --eval-only" % d)
    first = math.log(VOCAB)
    print("%s at %d rank(s) on %s: val_loss trained %.7f, f32 export %.7f, bf16 export %.7f "
          "(ln %d = %.4f)" % (name, ranks, device, trained, quintet[f32], quintet[bf16], VOCAB,
                              first), flush=True)
    if not quintet[f32] < first - 0.3:
        fail("%s: %d steps left the loss at %.4f: nothing learned, a weak test" %
             (name, STEPS, quintet[f32]))
    rel = 1e-5 if device == "cpu" else 3e-2  # the GPU trainer computes in bf16
    if not close(quintet[f32], trained, rel):
        fail("%s: the f32 export's loss %.7f, the trained model's %.7f (%s)" %
             (name, quintet[f32], trained, device))
    if not close(quintet[bf16], quintet[f32], 3e-2):
        fail("%s: the bf16 export's loss %.7f, the f32 export's %.7f" %
             (name, quintet[bf16], quintet[f32]))
    if not with_transformers:
        return
    for d in (f32, bf16):
        theirs = transformers_loss(d, arch, val_windows)
        print("  %s: transformers %.7f, Quintet %.7f, relative difference %.2e" %
              (os.path.basename(d), theirs, quintet[d], abs(theirs - quintet[d]) / abs(theirs)),
              flush=True)
        if not close(quintet[d], theirs, 1e-4):
            fail("%s: transformers' loss %.7f, Quintet's %.7f" % (d, theirs, quintet[d]))


def main():
    argv = sys.argv[1:]
    quintet_only = "--quintet-only" in argv
    argv = [a for a in argv if a != "--quintet-only"]
    if len(argv) < 3:
        sys.exit(__doc__)
    if not quintet_only:
        try:
            import torch
            import transformers
        except ImportError as e:
            print("SKIP: torch and transformers are needed (%s); --quintet-only checks the rest"
                  % e)
            sys.exit(77)
        print("transformers %s, torch %s" % (transformers.__version__, torch.__version__))
    work = tempfile.mkdtemp(prefix="quintet_hf_check_")
    q = Quintet(argv, work)
    print("GPUs: %d; MPI: %s" % (q.gpus, q.mpiexec or "none (1 rank only)"), flush=True)
    train_file, val_file = os.path.join(work, "train.bin"), os.path.join(work, "val.bin")
    write_llmc(train_file, tokens(4096, 1))
    val_tokens = tokens(8 * SEQ + 1, 2)  # 8 windows: 2 global batches
    write_llmc(val_file, val_tokens)
    try:
        for name in MODELS:
            for ranks in ([1, 2] if q.mpiexec else [1]):
                check_model(q, name, ranks, train_file, val_file, windows(val_tokens),
                            not quintet_only)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("PASS")


if __name__ == "__main__":
    main()
