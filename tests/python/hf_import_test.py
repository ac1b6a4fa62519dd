#!/usr/bin/env python3
"""Quintet's Hugging Face import against a NumPy reference (hf_reference.py).

    hf_import_test.py dense|moe|malformed|trainers HF_IMPORT_TOOL MPIEXEC [MPIEXEC FLAGS...]

dense, moe: hf_reference.py writes tiny checkpoints in the Hub layout with the expected loss of
a fixed batch; hf_import_tool loads each with --init-from-hf at several layouts (1 rank, tp x pp
with sp, tp with replicated key/value heads, cp (ring and Ulysses), dp with ZeRO-1; MoE: ep x tp;
Qwen3-MoE with dense layers, decoder_sparse_step and mlp_only_layers: pp 3, pp x ep, tp x ep) and its first-step loss must be the reference's within
1e-5 relative (f32), and a second step at learning rate 0 the same loss (the optimizer's master
weights are the imported ones). trainers: 04_gpt_train and 05_moe_train ($QUINTET_GPT_TRAIN,
$QUINTET_MOE_TRAIN) with --init-from-hf give the same losses at 1 and 4 ranks. malformed: broken checkpoints and contradicting flags are refused with a
message naming what is wrong (and no rank hangs).
With QUINTET_HF_REFERENCE_DIR set, the dense and moe cases found there (made by transformers:
scripts/hf/make_transformers_reference.py) are used instead of hf_reference.py's.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

BATCH = ["--seq-len", str(ref.SEQ_LEN), "--micro-batch", "2", "--global-batch", str(ref.ROWS),
         "--device", "cpu", "--timeout-s", "60"]

LAYOUTS = {
    "dense": [
        ("llama_gqa", 1, []),
        ("llama_gqa", 4, ["--tp", "2", "--pp", "2", "--sp"]),
        ("llama_gqa", 2, ["--dp", "2", "--zero", "1"]),
        ("llama_gqa", 4, ["--tp", "4"]),  # each of the 2 key/value heads on 2 tp ranks
        ("llama_gqa", 2, ["--cp", "2"]),
        ("llama31", 1, []),
        ("llama31", 2, ["--cp", "2"]),
        ("qwen2", 1, []),
        ("qwen2", 2, ["--tp", "2", "--sp"]),
        ("qwen2", 2, ["--pp", "2", "--vpp", "2", "--schedule", "interleaved"]),
        ("qwen3_tied_bf16", 1, []),
        ("qwen3_tied_bf16", 4, ["--tp", "2", "--pp", "2"]),
        ("qwen3_tied_bf16", 2, ["--cp", "2", "--cp-kind", "ulysses"]),
    ],
    "moe": [
        ("mixtral", 1, []),
        ("mixtral", 4, ["--tp", "2", "--dp", "2", "--ep", "2"]),
        ("mixtral", 4, ["--tp", "2", "--sp", "--dp", "2", "--ep", "2", "--etp", "1"]),
        ("qwen3_moe_fused", 1, []),
        ("qwen3_moe_fused", 4, ["--tp", "2", "--dp", "2", "--ep", "2", "--zero", "1"]),
        # Dense layers 0, 2, 3, 4 and MoE 1, 5: pp 3's middle stage holds no MoE layer, pp 2
        # cuts between dense 2 and 3.
        ("qwen3_moe_mixed", 1, []),
        ("qwen3_moe_mixed", 3, ["--pp", "3"]),
        ("qwen3_moe_mixed", 4, ["--pp", "2", "--dp", "2", "--ep", "2"]),
        ("qwen3_moe_mixed", 4, ["--tp", "2", "--dp", "2", "--ep", "2"]),
    ],
}


class Runner:
    def __init__(self, tool, mpiexec, mpi_flags):
        self.tool, self.mpiexec, self.mpi_flags = tool, mpiexec, mpi_flags

    def run(self, ranks, kind, case_dir, flags, tokens=None):
        tokens = tokens or os.path.join(case_dir, "tokens.bin")
        cmd = [self.mpiexec] + self.mpi_flags + ["-np", str(ranks), self.tool, kind, tokens,
                                                 "--init-from-hf", case_dir] + BATCH + flags
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=240)
        except subprocess.TimeoutExpired:
            sys.exit("FAIL (hung): " + " ".join(cmd))
        return p.returncode, p.stdout, " ".join(cmd)


def check_losses(runner, which, work):
    kind = "moe" if which == "moe" else "dense"
    made = {}
    for case, ranks, flags in LAYOUTS[which]:
        if case not in made:
            made[case] = ref.write_case(work, case)
            # The same case made by transformers (scripts/hf/make_transformers_reference.py).
            given = os.path.join(os.environ.get("QUINTET_HF_REFERENCE_DIR", ""), case)
            if os.environ.get("QUINTET_HF_REFERENCE_DIR") and os.path.isdir(given):
                shutil.rmtree(made[case])
                made[case] = shutil.copytree(given, made[case])
            with open(os.path.join(made[case], "expected.json")) as f:
                expected = json.load(f)
            # The reference's loss is away from chance (log vocab), so that it depends on the
            # weights; 0.1 because transformers' draws of the same distribution gave a gap of 0.22
            # and 0.34 (0.5 failed them), still far above the comparison's 1e-5 relative.
            assert abs(expected["loss"] - expected["uniform_loss"]) > 0.1, expected
        rc, out, cmd = runner.run(ranks, kind, made[case], flags)
        m = re.search(r"^loss (\S+)$", out, re.M)
        if rc != 0 or not m:
            sys.exit("FAIL: %s\n%s" % (cmd, out))
        loss = float(m.group(1))
        # After a step at learning rate 0 the weights are the master copy's: the same loss.
        loss2 = float(re.search(r"^loss2 (\S+)$", out, re.M).group(1))
        if loss2 != loss:
            sys.exit("FAIL: %s: loss %r after a step at lr 0, %r before: the optimizer's master "
                     "weights are not the imported ones" % (cmd, loss2, loss))
        rel = abs(loss - expected["loss"]) / expected["loss"]
        print("%-16s np%d %-32s loss %.9f reference %.9f rel %.1e" %
              (case, ranks, " ".join(flags), loss, expected["loss"], rel))
        if rel > 1e-5:
            sys.exit("FAIL: %s: loss %r, reference %r" % (cmd, loss, expected["loss"]))


# ---- the trainers ------------------------------------------------------------------------------


def trainer_losses(runner, trainer, ranks, flags, work, name):
    cmd = [runner.mpiexec] + runner.mpi_flags + ["-np", str(ranks), trainer, "--device", "cpu",
                                                 "--seq-len", str(ref.SEQ_LEN), "--micro-batch",
                                                 "2", "--global-batch", "4", "--steps", "3",
                                                 "--json", "--no-progress", "--data-dir",
                                                 os.path.join(work, "data")] + flags
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240)
    if p.returncode != 0 or "initialized from" not in p.stderr + p.stdout:
        sys.exit("FAIL: %s (exit %d)\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    losses = [json.loads(l)["loss"] for l in p.stdout.splitlines()
              if l.startswith("{") and '"step"' in l]
    print("%-20s np%d %-30s losses %s" % (name, ranks, " ".join(flags[2:]),
                                           " ".join("%.6f" % x for x in losses)))
    if len(losses) != 3:
        sys.exit("FAIL: %s: %d steps" % (" ".join(cmd), len(losses)))
    return losses


def check_trainers(runner, work, dense_trainer, moe_trainer):
    """--init-from-hf in both trainers (the built-in dataset's 256 tokens): 3 steps at 1 rank and
    at 4 ranks agree (the loader gives every layout the same batches), and --resume-if-exists
    over an empty directory starts from the Hugging Face weights."""
    for case, trainer, layout in (("llama_gqa", dense_trainer, ["--tp", "2", "--pp", "2"]),
                                  ("mixtral", moe_trainer, ["--tp", "2", "--dp", "2", "--ep", "2",
                                                            "--zero", "1"])):
        c, dtype, shards, experts, fused = ref.CASES[case]
        ref.CASES[case + "_256"] = (dict(c, vocab_size=256), dtype, shards, experts, fused)
        d = ref.write_case(work, case + "_256")
        one = trainer_losses(runner, trainer, 1, ["--init-from-hf", d], work, case)
        four = trainer_losses(runner, trainer, 4, ["--init-from-hf", d] + layout, work, case)
        again = trainer_losses(runner, trainer, 1, ["--init-from-hf", d, "--resume-if-exists",
                                                    os.path.join(work, "none_" + case)], work,
                               case + " (resume-if-exists)")
        for a, b in zip(one, four):
            if abs(a - b) > 1e-5 * abs(a):
                sys.exit("FAIL: %s: losses at 1 rank %s, at 4 ranks %s" % (case, one, four))
        if again != one:
            sys.exit("FAIL: %s: --resume-if-exists without a checkpoint: %s, not %s" %
                     (case, again, one))


# ---- malformed checkpoints --------------------------------------------------------------------


def read_f32_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = []
    for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        b, end = e["data_offsets"]
        out.append((name, np.frombuffer(data[b:end], np.float32).reshape(e["shape"])))
    return out


def copy_case(src, dst):
    shutil.copytree(src, dst)
    return dst


def edit_config(case_dir, **changes):
    path = os.path.join(case_dir, "config.json")
    with open(path) as f:
        c = json.load(f)
    c.update(changes)
    with open(path, "w") as f:
        json.dump(c, f)


def edit_tensors(case_dir, fn):
    path = os.path.join(case_dir, "model.safetensors")
    ref.write_safetensors(path, fn(read_f32_safetensors(path)), "F32")


def check_malformed(runner, work):
    good = ref.write_case(work, "llama_gqa")
    moe = ref.write_case(work, "mixtral")
    mixed = ref.write_case(work, "qwen3_moe_mixed")
    cases = []

    def case(name, pattern, flags=(), ranks=1, kind="dense", base=good):
        d = copy_case(base, os.path.join(work, name))
        cases.append((name, d, pattern, list(flags), ranks, kind))
        return d

    with open(os.path.join(case("bad_json", r"config\.json: not valid JSON"), "config.json"),
              "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"], ')
    edit_config(case("unknown_arch", r"architecture \"GPT2LMHeadModel\".*not one Quintet imports"),
                architectures=["GPT2LMHeadModel"], model_type="gpt2")
    edit_config(case("rope_scaling", r"\"rope_scaling\".*as Llama 3 does"),
                rope_scaling={"rope_type": "yarn", "factor": 4.0})
    edit_config(case("llama3_no_factor", r"\"rope_scaling\".*its low_freq_factor must be a number"),
                rope_scaling={"rope_type": "llama3", "factor": 8.0})
    edit_config(case("gelu", r"\"hidden_act\" is \"gelu\""), hidden_act="gelu")
    edit_config(case("no_hidden", r"config\.json: no \"hidden_size\""), hidden_size=None)
    edit_config(case("shape", r"model\.layers\.0\.mlp\.gate_proj\.weight.*\[40, 24\].*\[44, 24\]"
                     r"|model\.layers\.0\.mlp\.gate_proj\.weight.*\[44, 24\].*\[40, 24\]"),
                intermediate_size=40)
    for name, ranks in (("missing", 1), ("missing_np2", 2)):
        edit_tensors(case(name, name + r": no tensor "
                          r"model\.layers\.1\.self_attn\.k_proj\.weight", ["--tp", str(ranks)],
                          ranks=ranks),
                     lambda ts: [t for t in ts if t[0] != "model.layers.1.self_attn.k_proj.weight"])
    edit_tensors(case("stray", r"model\.safetensors: tensor model\.layers\.0\.mlp\.up_proj\.bias "
                      r"is not part of"),
                 lambda ts: ts + [("model.layers.0.mlp.up_proj.bias", np.zeros(44, np.float32))])
    d = case("truncated", r"model\.safetensors")
    with open(os.path.join(d, "model.safetensors"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(d, "model.safetensors")) - 10)
    case("contradicts", r"--hidden 32 contradicts .*config\.json: its \"hidden_size\" makes it 24",
         ["--hidden", "32"])
    case("with_resume", r"--resume .* and --init-from-hf .*give one of them",
         ["--resume", os.path.join(work, "no_such_checkpoint")])
    case("moe_in_dense", r"an MoE model, and this job is dense", base=moe)
    case("dense_in_moe", r"a dense model, and this job is an MoE", kind="moe")
    # Qwen3-MoE's dense layers: an mlp_only_layers entry that is no layer, settings that leave
    # no layer sparse, a --dense-layers that contradicts them.
    edit_config(case("mlp_only_range", r"\"mlp_only_layers\" is \[6\]: each entry must be a "
                     r"layer index, 0 \.\. 5", kind="moe", base=mixed), mlp_only_layers=[6])
    edit_config(case("no_sparse", r"\"decoder_sparse_step\" 7 and \"mlp_only_layers\" \[3\] "
                     r"leave none of the 6 layers sparse", kind="moe", base=mixed),
                decoder_sparse_step=7)
    case("dense_layers", r"--dense-layers 0 contradicts .*\"mlp_only_layers\" makes it 0,2,3,4",
         ["--dense-layers", "0"], kind="moe", base=mixed)
    case("no_dir", r"config\.json: cannot be read")
    shutil.rmtree(os.path.join(work, "no_dir"))

    for name, d, pattern, flags, ranks, kind in cases:
        rc, out, cmd = runner.run(ranks, kind, d, flags, tokens=os.path.join(good, "tokens.bin"))
        ok = rc != 0 and re.search(pattern, out) is not None and "loss " not in out
        print("%-14s np%d %s" % (name, ranks, "refused" if ok else "NOT REFUSED AS EXPECTED"))
        if not ok:
            sys.exit("FAIL: %s (exit %d), expected /%s/ in:\n%s" % (cmd, rc, pattern, out))


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("dense", "moe", "malformed", "trainers"):
        sys.exit(__doc__)
    runner = Runner(sys.argv[2], sys.argv[3], sys.argv[4:])
    work = tempfile.mkdtemp(prefix="hf_import_test_")
    try:
        if sys.argv[1] == "malformed":
            check_malformed(runner, work)
        elif sys.argv[1] == "trainers":
            check_trainers(runner, work, os.environ["QUINTET_GPT_TRAIN"],
                           os.environ["QUINTET_MOE_TRAIN"])
        else:
            check_losses(runner, sys.argv[1], work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("hf_import_test %s: PASS" % sys.argv[1])


if __name__ == "__main__":
    main()
