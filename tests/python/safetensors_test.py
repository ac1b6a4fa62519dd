#!/usr/bin/env python3
"""Cross-check of Quintet's C++ safetensors reader and writer (quintet/data/safetensors.hpp)
against an independent reader and writer written here with the standard library alone (struct and
json), run by ctest (tests/cmake/python.cmake) as `safetensors_test.py TOOL`, TOOL being
tests/python/safetensors_tool.

Python writes files (one, or several with an index) that the C++ reader reads and copies,
converts or cuts a box from through the tool; the C++ writer's files are read back here and
checked byte for byte and against the format's rules: the header padded with spaces to a multiple
of 8 bytes, tensors back to back covering the data region and aligned, larger elements first, the
index's total_size and weight_map. Plain asserts; prints "N passed, N failed".
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import traceback

TOOL = sys.argv[1] if len(sys.argv) > 1 else ""

# struct codes and element sizes of the dtypes Quintet reads (BF16 as its 16-bit pattern).
CODES = {"F64": "d", "I64": "q", "F32": "f", "I32": "i", "F16": "e", "BF16": "H", "U16": "H",
         "U8": "B"}
SIZES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "U16": 2, "U8": 1}


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def random_values(rng, dtype, n):
    if dtype in ("F64", "F32", "F16"):
        return [rng.uniform(-4.0, 4.0) for _ in range(n)]
    if dtype == "BF16":  # the upper half of a random float's bits
        return [struct.unpack("<I", struct.pack("<f", rng.uniform(-4.0, 4.0)))[0] >> 16
                for _ in range(n)]
    # Integers small enough that their float value is exact in f32.
    bound = {"I64": 2**24, "I32": 2**24, "U16": 2**16, "U8": 2**8}[dtype]
    low = -bound if dtype.startswith("I") else 0
    return [rng.randrange(low, bound) for _ in range(n)]


def tensor(rng, name, dtype, shape):
    n = numel(shape)
    return (name, dtype, shape, struct.pack("<%d%s" % (n, CODES[dtype]),
                                            *random_values(rng, dtype, n)))


def write_file(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape, bytes)], laid out in the order given."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in tensors:
            f.write(t[3])


def read_file(path):
    """(metadata, {name: (dtype, shape, bytes)}, names in data order), checking the format's rules
    and the reference writer's layout."""
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    raw = b[8:8 + n]
    assert n % 8 == 0, "%s: header of %d bytes, not padded to 8" % (path, n)
    assert raw.rstrip(b" ").endswith(b"}"), "%s: the header is not padded with spaces" % path
    header = json.loads(raw.decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = b[8 + n:]
    order = sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"]))
    out, pos = {}, 0
    for name, e in order:
        begin, end = e["data_offsets"]
        size = SIZES[e["dtype"]]
        assert begin == pos, "%s: %s starts at %d, not %d" % (path, name, begin, pos)
        assert end - begin == numel(e["shape"]) * size, (path, name)
        assert begin % size == 0, "%s: %s is not aligned" % (path, name)
        out[name] = (e["dtype"], e["shape"], data[begin:end])
        pos = end
    assert pos == len(data), "%s: %d bytes after the last tensor" % (path, len(data) - pos)
    # The reference writer's order: larger elements first, then by name.
    keys = [(-SIZES[out[k][0]], k) for k, _ in order]
    assert keys == sorted(keys), "%s: order %s" % (path, [k for k, _ in order])
    return metadata, out, [k for k, _ in order]


def tool(*args, fail=False):
    assert TOOL, "usage: safetensors_test.py PATH/TO/safetensors_tool (ctest passes it)"
    r = subprocess.run([TOOL] + [str(a) for a in args], capture_output=True, text=True)
    if fail:
        assert r.returncode == 1, "expected a failure from %s: %s" % (args, r.stderr)
        return r.stderr
    assert r.returncode == 0, "%s failed: %s" % (args, r.stderr)
    return r.stdout


def sample(rng):
    # Python's order puts a 3-byte U8 tensor first, so the C++ reader meets unaligned data.
    return [
        tensor(rng, "mask", "U8", [3]),
        tensor(rng, "model.embed_tokens.weight", "BF16", [5, 3]),
        tensor(rng, "model.layers.0.mlp.up_proj.weight", "F32", [4, 6]),
        tensor(rng, "model.norm.weight", "F16", [7]),
        tensor(rng, "positions", "I64", [3]),
        tensor(rng, "scale", "F64", [2, 2]),
        tensor(rng, "counts", "I32", [5]),
        tensor(rng, "ids", "U16", [3]),
        tensor(rng, "loss_scale", "F32", []),
        tensor(rng, "empty", "F32", [0, 3]),
    ]


def check_same(tensors, got):
    assert sorted(got) == sorted(t[0] for t in tensors), sorted(got)
    for name, dtype, shape, data in tensors:
        assert got[name] == (dtype, shape, data), name


def test_cpp_reads_a_python_file_and_writes_transformers_shards(d, rng):
    tensors = sample(rng)
    src = os.path.join(d, "src.safetensors")
    write_file(src, tensors, {"format": "pt", "source": "python"})
    out = os.path.join(d, "out")
    tool("copy", src, out, 200)

    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        index = json.load(f)
    assert index["metadata"]["total_size"] == sum(len(t[3]) for t in tensors)
    files = sorted(set(index["weight_map"].values()))
    assert files == ["model-%05d-of-%05d.safetensors" % (i + 1, len(files))
                     for i in range(len(files))], files
    assert len(files) >= 2
    assert sorted(os.listdir(out)) == sorted(files + ["model.safetensors.index.json"])
    got = {}
    for name in files:
        metadata, part, _ = read_file(os.path.join(out, name))
        assert metadata == {"format": "pt", "source": "python"}, metadata
        assert all(index["weight_map"][k] == name for k in part)
        size = sum(len(v[2]) for v in part.values())
        assert size <= 200 or len(part) == 1, (name, size)
        got.update(part)
    check_same(tensors, got)


def test_cpp_reads_python_shards_and_writes_one_file(d, rng):
    tensors = sample(rng)
    src = os.path.join(d, "src")
    os.makedirs(src)
    halves = {"weights-a.safetensors": tensors[:4], "weights-b.safetensors": tensors[4:]}
    for name, part in halves.items():
        write_file(os.path.join(src, name), part)
    index = {"metadata": {"total_size": sum(len(t[3]) for t in tensors)},
             "weight_map": {t[0]: name for name, part in halves.items() for t in part}}
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
    out = os.path.join(d, "out")
    tool("copy", src, out, 10**9)
    assert os.listdir(out) == ["model.safetensors"], os.listdir(out)
    metadata, got, _ = read_file(os.path.join(out, "model.safetensors"))
    assert metadata == {}, metadata
    check_same(tensors, got)


def as_floats(dtype, data):
    n = len(data) // SIZES[dtype]
    values = struct.unpack("<%d%s" % (n, CODES[dtype]), data)
    if dtype == "BF16":
        return [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in values]
    return [float(v) for v in values]


def test_cpp_converts_every_dtype_to_f32(d, rng):
    tensors = sample(rng)
    src = os.path.join(d, "src.safetensors")
    write_file(src, tensors)
    out = os.path.join(d, "f32.safetensors")
    tool("to_f32", src, out)
    _, got, _ = read_file(out)
    for name, dtype, shape, data in tensors:
        values = as_floats(dtype, data)
        want = struct.pack("<%df" % len(values), *values)  # f64 rounds to nearest, as C++ does
        assert got[name] == ("F32", shape, want), name


def test_cpp_reads_a_box(d, rng):
    tensors = [tensor(rng, "w", "F32", [4, 5, 6]), tensor(rng, "m", "BF16", [6, 8])]
    src = os.path.join(d, "src.safetensors")
    write_file(src, tensors)
    for name, box in [("w", [(1, 3), (2, 5), (0, 6)]), ("w", [(0, 4), (0, 5), (4, 6)]),
                      ("w", [(2, 3)]), ("m", [(1, 5), (3, 7)]), ("m", [(0, 6), (7, 8)])]:
        _, dtype, shape, data = next(t for t in tensors if t[0] == name)
        values = as_floats(dtype, data)
        full = box + [(0, s) for s in shape[len(box):]]
        strides = [numel(shape[i + 1:]) for i in range(len(shape))]
        picked = [0]
        for (b, e), stride in zip(full, strides):
            picked = [p + i * stride for p in picked for i in range(b, e)]
        out = os.path.join(d, "box.safetensors")
        tool("box", src, name, out, *[x for r in box for x in r])
        _, got, _ = read_file(out)
        want = struct.pack("<%df" % len(picked), *[values[p] for p in picked])
        assert got[name] == ("F32", [e - b for b, e in full], want), (name, box)


def test_cpp_refuses_a_malformed_python_file(d, rng):
    a, b = tensor(rng, "a", "F32", [4]), tensor(rng, "b", "F32", [4])
    src = os.path.join(d, "overlap.safetensors")
    write_file(src, [a, b])
    with open(src, "r+b") as f:  # b's offsets moved onto a's second half
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        header["b"]["data_offsets"] = [8, 24]
        text = json.dumps(header).encode()
        text += b" " * (n - len(text))
        f.seek(8)
        f.write(text)
        f.truncate(8 + n + 24)
    err = tool("copy", src, os.path.join(d, "out"), 100, fail=True)
    assert "malformed safetensors file %s: tensors a [0, 16) and b [8, 24) overlap" % src in err, err
    assert not os.path.exists(os.path.join(d, "out", "model.safetensors"))


def main():
    tests = [(k, v) for k, v in sorted(globals().items()) if k.startswith("test_")]
    passed = failed = 0
    for seed, (name, fn) in enumerate(tests):
        with tempfile.TemporaryDirectory() as d:
            try:
                fn(d, random.Random(seed))
                passed += 1
                print("PASS", name)
            except Exception:
                failed += 1
                print("FAIL", name)
                traceback.print_exc()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
