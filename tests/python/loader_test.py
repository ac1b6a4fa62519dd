#!/usr/bin/env python3
"""Tests of the Python module quintet_data (python/), run by ctest (tests/cmake/python.cmake).

Each test_* function asserts values computed another way: the C++ DataLoader's batches (written
by the helper named in QUINTET_DUMP_BATCHES), the tokens the test wrote itself, or the sampler's
rule of which rank takes which sample. Runs with plain asserts (`python3 loader_test.py`, which
prints "N passed, N failed") or under pytest.
"""
import gc
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import numpy as np

import quintet_data as qd

DUMP = os.environ.get("QUINTET_DUMP_BATCHES", "")


try:  # under pytest a skip is its own; run as a script, main() counts it
    import pytest
    Skip = pytest.skip.Exception
except ImportError:
    class Skip(Exception):
        pass


def cpp_batches(spec, seq_len, batch, count, dp_rank=0, dp_size=1, seed=0, threads=2,
                state=None, shuffle=True):
    """The C++ loader's first count batches: (tokens, targets) arrays of [count, batch, seq_len]."""
    assert DUMP, "QUINTET_DUMP_BATCHES must name tests/python/dump_batches (ctest sets it)"
    state = state or {"epoch": 0, "sample_index": 0}
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "batches.i32")
        subprocess.run([DUMP, spec, str(seq_len), str(batch), str(dp_rank), str(dp_size),
                        str(seed), str(threads), str(state["epoch"]), str(state["sample_index"]),
                        "1" if shuffle else "0", str(count), out], check=True)
        raw = np.fromfile(out, dtype=np.int32).reshape(count, 2, batch, seq_len)
    return raw[:, 0], raw[:, 1]


def make_dataset(d, rng):
    """Three files, one of each format and width; returns (spec, the token arrays in file order)."""
    a = rng.integers(0, 50000, size=3001, dtype=np.int64)
    b = rng.integers(0, 2**31 - 1, size=2050, dtype=np.int64)
    c = rng.integers(0, 255, size=1700, dtype=np.int64)
    qd.write_quintet_shard(os.path.join(d, "train_0.qts"), a, document_offsets=[0, 1000, 3001],
                           metadata={"source": "test"})
    qd.write_llmc_shard(os.path.join(d, "train_1.bin"), b.astype(np.uint32), token_type="u32")
    qd.write_megatron_dataset(os.path.join(d, "train_2"), c.tolist(), [0, 600, 1700], "u8")
    return os.path.join(d, "train_*"), [a, b, c]


def windows_of(tokens, seq_len):
    """Every window of the files in order, as the loader cuts them: (inputs, targets) rows."""
    xs, ys = [], []
    for t in tokens:
        for j in range((len(t) - 1) // seq_len):
            w = t[j * seq_len:(j + 1) * seq_len + 1]
            xs.append(w[:-1])
            ys.append(w[1:])
    return np.array(xs, dtype=np.int32), np.array(ys, dtype=np.int32)


def take(loader, n):
    xs, ys = zip(*(next(loader) for _ in range(n)))
    return np.stack(xs), np.stack(ys)


def test_first_50_batches_equal_the_cpp_loader():
    with tempfile.TemporaryDirectory() as d:
        spec, _ = make_dataset(d, np.random.default_rng(1))
        for dp_rank, dp_size, threads in [(0, 1, 1), (1, 3, 3)]:
            loader = qd.Loader(spec, seq_len=32, batch=4, dp_rank=dp_rank, dp_size=dp_size,
                               seed=7, threads=threads)
            x, y = take(loader, 50)
            cx, cy = cpp_batches(spec, 32, 4, 50, dp_rank, dp_size, seed=7)
            assert x.dtype == np.int32 and x.shape == (50, 4, 32)
            assert np.array_equal(x, cx) and np.array_equal(y, cy), (dp_rank, dp_size)
            assert np.array_equal(x[:, :, 1:], y[:, :, :-1])  # targets: inputs shifted by one
            assert loader.stats()["batches"] == 50


def test_unshuffled_windows_are_the_written_tokens():
    with tempfile.TemporaryDirectory() as d:
        spec, tokens = make_dataset(d, np.random.default_rng(2))
        wx, wy = windows_of(tokens, 64)
        files = qd.describe(spec)
        assert [f["format"] for f in files] == ["quintet", "llm.c", "megatron"]
        assert [f["tokens"] for f in files] == [len(t) for t in tokens]
        assert files[0]["document_offsets"] == [0, 1000, 3001]
        assert files[0]["metadata"] == {"source": "test"}
        assert files[2]["token_type"] == "u8"
        with qd.Loader(spec, seq_len=64, batch=1, shuffle=False, threads=2) as loader:
            assert loader.num_windows == len(wx)
            x, y = take(loader, len(wx) + 3)  # past the end: the next epoch starts again
        assert np.array_equal(x[:len(wx), 0], wx) and np.array_equal(y[:len(wx), 0], wy)
        assert np.array_equal(x[len(wx):, 0], wx[:3])


def test_resume_at_another_dp_size():
    with tempfile.TemporaryDirectory() as d:
        spec, _ = make_dataset(d, np.random.default_rng(3))
        seq, batch = 16, 3
        two = [qd.Loader(spec, seq, batch, dp_rank=r, dp_size=2, seed=5) for r in range(2)]
        for loader in two:
            take(loader, 7)
        state = two[0].state()
        assert state == two[1].state()
        single = qd.Loader(spec, seq, 2 * batch, seed=5)  # the same global stream at dp 1
        take(single, 7)
        assert single.state() == state

        three = [qd.Loader(spec, seq, batch, dp_rank=r, dp_size=3, seed=5) for r in range(3)]
        got = []
        for r, loader in enumerate(three):
            loader.load_state(state)
            x, y = take(loader, 9)
            cx, cy = cpp_batches(spec, seq, batch, 9, r, 3, seed=5, state=state)
            assert np.array_equal(x, cx) and np.array_equal(y, cy), r
            got.append(x)
        # Rank r's sample i of a step is global position g + 3 i + r: the dp 1 stream from the same
        # state, 3 * batch samples a step, holds the three ranks' rows interleaved.
        whole = qd.Loader(spec, seq, 3 * batch, seed=5)
        whole.load_state(state)
        wx, _ = take(whole, 9)
        for r in range(3):
            assert np.array_equal(wx[:, r::3], got[r]), r


def test_bad_files_raise_with_the_file_name():
    with tempfile.TemporaryDirectory() as d:
        garbage = os.path.join(d, "garbage.qts")
        with open(garbage, "wb") as f:
            f.write(b"QTSHARD\0" + b"\x07" * 200)
        try:
            qd.Loader(garbage, 8, 2)
            raise AssertionError("a malformed shard was accepted")
        except qd.Error as e:
            assert "garbage.qts" in str(e) and "at byte" in str(e), str(e)

        flipped = os.path.join(d, "flipped.qts")
        qd.write_quintet_shard(flipped, np.arange(5000) % 1000)
        with open(flipped, "r+b") as f:
            f.seek(-7, os.SEEK_END)
            byte = f.read(1)
            f.seek(-7, os.SEEK_END)
            f.write(bytes([byte[0] ^ 0x10]))
        try:
            qd.Loader(flipped, 8, 2)
            raise AssertionError("a shard with a flipped byte was accepted")
        except qd.InvalidArgument as e:
            assert "flipped.qts" in str(e) and "checksum" in str(e), str(e)
        assert qd.describe(flipped, verify_checksum=False)[0]["tokens"] == 5000

        try:
            qd.Loader(os.path.join(d, "missing_*.qts"), 8, 2)
            raise AssertionError("a glob matching nothing was accepted")
        except ValueError as e:  # InvalidArgument is a ValueError too
            assert "missing_*.qts" in str(e), str(e)

        # A stored token past int32 is found when its batch is read: next() raises, naming it.
        wide = os.path.join(d, "wide.bin")
        qd.write_llmc_shard(wide, [1, 2, 3, 3_000_000_000, 5, 6, 7, 8, 9], token_type="u32")
        loader = qd.Loader(wide, 4, 2, shuffle=False, threads=1)
        try:
            next(loader)
            raise AssertionError("a token past int32 was handed out")
        except qd.Error as e:
            assert "wide.bin" in str(e) and "3000000000" in str(e), str(e)


def test_bad_arguments_raise_before_any_thread_starts():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.qts")
        qd.write_quintet_shard(path, np.arange(1000) % 100)
        for kwargs, words in [({"seq_len": 0}, "seq_len"), ({"batch": 0}, "batch"),
                              ({"dp_rank": 2, "dp_size": 2}, "dp_rank"),
                              ({"threads": 0}, "threads"), ({"seq_len": 5000}, "window")]:
            args = {"seq_len": 8, "batch": 2}
            args.update(kwargs)
            try:
                qd.Loader(path, **args)
                raise AssertionError(f"{kwargs} was accepted")
            except qd.InvalidArgument as e:
                assert words in str(e), (kwargs, str(e))
        loader = qd.Loader(path, 8, 2)
        for state, words in [({"epoch": 0}, "sample_index"),
                             ({"epoch": 0, "sample_index": 10**6}, "sample_index"),
                             ({"epoch": -1, "sample_index": 0}, "epoch"),
                             ({"epoch": 0, "sample_index": 0, "step": 3}, "step")]:
            try:
                loader.load_state(state)
                raise AssertionError(f"state {state} was accepted")
            except qd.InvalidArgument as e:
                assert words in str(e), (state, str(e))
        first = next(loader)[0].copy()  # the loader is as it was after the refused states
        loader.load_state({"epoch": 0, "sample_index": 0})
        assert np.array_equal(next(loader)[0], first)
        loader.close()
        try:
            next(loader)
            raise AssertionError("a closed loader handed out a batch")
        except qd.Error as e:
            assert "closed" in str(e)


def test_writers_refuse_tokens_that_do_not_fit():
    with tempfile.TemporaryDirectory() as d:
        for tokens, token_type, words in [([1, 70000], "u16", "70000"), ([1, -2], "u16", "-2"),
                                          (np.array([0.5, 1.0]), "u16", "integers"),
                                          ([1, 2], "u12", "u12")]:
            path = os.path.join(d, "x.qts")
            try:
                qd.write_quintet_shard(path, tokens, token_type=token_type)
                raise AssertionError(f"{tokens} as {token_type} was written")
            except ValueError as e:
                assert words in str(e), (tokens, str(e))
            assert not os.path.exists(path)


def _spinner_progress(loader, per_s):
    """One measurement of test_next_releases_the_gil: the spinner's progress during next() and
    during a GIL-holding call, each over its progress during sleeps of the same lengths, with
    the seconds next() waited and the calls made."""
    counter, stop = [0], [False]

    def spin():
        while not stop[0]:
            counter[0] += 1

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        in_next = in_sleep = in_held = waited = 0.0
        calls = 0
        while waited < 0.3 and calls < 200:
            c0, t0 = counter[0], time.perf_counter()
            x, y = next(loader)
            dt = time.perf_counter() - t0
            in_next += counter[0] - c0
            del x, y
            c1 = counter[0]
            time.sleep(dt)
            in_sleep += counter[0] - c1
            c2 = counter[0]
            sum(range(int(dt * per_s)))  # one C call: the GIL held for about dt
            in_held += counter[0] - c2
            waited += dt
            calls += 1
    finally:
        stop[0] = True
        spinner.join()
        sys.setswitchinterval(old_interval)
    return in_next / max(in_sleep, 1), in_held / max(in_sleep, 1), waited, calls


def test_next_releases_the_gil():
    """A pure-Python thread runs while next() waits for a batch that takes long to prepare.

    The spinner's progress during next() calls is compared with its progress during sleeps of
    the same length (time.sleep releases the GIL) and during a C call of the same length that
    holds the GIL (sum over a range), the three interleaved so that load on the machine hits
    them alike. With the GIL released, next() lets the spinner run about as far as a sleep
    does; with it held, about as little as the held call (measured on the 2-core machine:
    0.6-0.8 of the sleep's progress released, 0.1-0.2 held; with a build sharing the cores,
    0.75 and 0.39 once). So the bound follows from the run's own held call: next() must let the
    spinner run at least twice as far, in one of up to three measurements (a next() that holds
    the GIL fails all three: its spinner runs about as far as during the held call each time).
    """
    with tempfile.TemporaryDirectory() as d:
        seq_len, batch = 1 << 19, 32
        path = os.path.join(d, "zeros.bin")  # a sparse llm.c shard of zeros: nothing to write
        count = 3 * batch * seq_len + 1
        with open(path, "wb") as f:
            f.write(struct.pack("<3i", 20240520, 1, count) + b"\0" * (1024 - 12))
            f.truncate(1024 + 2 * count)
        loader = qd.Loader(path, seq_len, batch, threads=1, queue_depth=1)

        # Elements a sum over a range goes through per second, to hold the GIL for a given time.
        t0 = time.perf_counter()
        sum(range(1 << 20))
        per_s = (1 << 20) / max(time.perf_counter() - t0, 1e-6)

        for _ in range(3):
            ratio, held, waited, calls = _spinner_progress(loader, per_s)
            print(f"  GIL: {calls} next() calls waited {waited:.3f} s; the spinner ran "
                  f"{ratio:.2f}x as far as during sleeps of the same length, and {held:.2f}x "
                  f"during a call that holds the GIL")
            assert waited >= 0.3, f"next() waited only {waited:.3f} s in {calls} calls"
            if ratio > 2 * held:
                return
        raise AssertionError(
            f"the spinner ran {ratio:.2f}x as far during next() as during sleeps, and "
            f"{held:.2f}x during a call that holds the GIL, in each of 3 measurements: next() "
            f"holds it")


def test_a_batch_stays_valid_after_later_batches():
    """Batches of 2 MiB: the CPU allocator would hand freed blocks of that size straight back."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "big.qts")
        rng = np.random.default_rng(4)
        qd.write_quintet_shard(path, rng.integers(0, 65535, size=40 * 65536 + 1), "u16")
        loader = qd.Loader(path, 65536, 8, seed=3, threads=2)
        x0, y0 = next(loader)
        keep = x0.copy(), y0.copy()
        assert not x0.flags.owndata and isinstance(x0.base, qd._BatchMemory)
        addresses = {x0.ctypes.data}
        for _ in range(12):
            x, y = next(loader)
            addresses.add(x.ctypes.data)
            del x, y
            gc.collect()
        assert np.array_equal(x0, keep[0]) and np.array_equal(y0, keep[1])
        cx, cy = cpp_batches(path, 65536, 8, 1, seed=3)
        assert np.array_equal(x0, cx[0]) and np.array_equal(y0, cy[0])
        assert x0.ctypes.data in addresses and len(addresses) > 1
        del loader  # the arrays outlive the loader too
        gc.collect()
        assert np.array_equal(x0, keep[0])


def test_torch_sees_the_same_memory():
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.qts")
        qd.write_quintet_shard(path, np.arange(4000) % 300)
        x, y = next(qd.Loader(path, 32, 4))
        t = torch.from_numpy(x)
        assert t.data_ptr() == x.ctypes.data and t.dtype == torch.int32
        u = torch.from_dlpack(y)
        assert u.data_ptr() == y.ctypes.data
        assert torch.equal(t[:, 1:], u[:, :-1])
        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")  # is_pinned() says False before torch's CUDA is up
            assert t.is_pinned(), "batches are pinned host memory where CUDA is present"
            g = t.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            assert torch.equal(g.cpu(), t)


def test_device_arguments_are_checked():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.qts")
        qd.write_quintet_shard(path, np.arange(4000) % 300)
        cases = [({"device": "tpu"}, qd.InvalidArgument, "unknown device"),
                 ({"device": "cuda:-1"}, qd.InvalidArgument, "unknown device"),
                 ({"stream": 5}, qd.InvalidArgument, "stream is for a GPU loader")]
        if qd.cuda_available():
            cases += [({"device": "cuda:0", "stream": "s"}, qd.InvalidArgument, "stream must be"),
                      ({"device": "cuda:0", "stream": -3}, qd.InvalidArgument, ">= 0")]
        else:
            cases += [({"device": "cuda:0"}, qd.Error, "no GPU is visible"),
                      ({"device": 0}, qd.Error, "no GPU is visible")]
        for kwargs, kind, words in cases:
            try:
                qd.Loader(path, 32, 4, **kwargs)
                raise AssertionError(f"{kwargs} was accepted")
            except kind as e:
                assert words in str(e), (kwargs, str(e))
        assert qd.Loader(path, 32, 4).device == "cpu"


def gpu_torch():
    try:
        import torch
    except ImportError:
        raise Skip("torch is not installed")
    if not (torch.cuda.is_available() and qd.cuda_available()):
        raise Skip("no GPU")
    return torch


def test_gpu_batches_equal_the_cpu_loaders_and_stay_valid():
    """device='cuda:0': DLPack views of the loader's device memory, the same batches as on the
    CPU; batches of 2 MiB so that a copy still running, or a block reused too early, shows."""
    torch = gpu_torch()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "big.qts")
        rng = np.random.default_rng(5)
        qd.write_quintet_shard(path, rng.integers(0, 65535, size=40 * 65536 + 1), "u16")
        cpu = qd.Loader(path, 65536, 8, seed=2, threads=2)
        gpu = qd.Loader(path, 65536, 8, seed=2, threads=2, device=torch.device("cuda:0"))
        assert gpu.device == "cuda:0"
        x, y = next(gpu)
        assert isinstance(x, qd.DeviceArray) and x.shape == [8, 65536] and x.device == "cuda:0"
        assert x.__dlpack_device__() == (2, 0)
        x.__dlpack__(stream=1)  # a capsule nobody takes is freed with it
        first = torch.from_dlpack(x), torch.from_dlpack(y)
        assert first[0].device.type == "cuda" and first[0].dtype == torch.int32
        want = next(cpu)
        keep = [w.copy() for w in want]
        for i in range(12):
            gx, gy = (torch.from_dlpack(a) for a in next(gpu))
            cx, cy = next(cpu)
            assert np.array_equal(gx.cpu().numpy(), cx) and np.array_equal(gy.cpu().numpy(), cy), i
            del gx, gy
        for t, w in zip(first, keep):
            assert np.array_equal(t.cpu().numpy(), w)
        del gpu  # the device memory outlives the loader
        gc.collect()
        assert np.array_equal(first[1].cpu().numpy(), keep[1])


def test_gpu_batches_on_a_torch_stream():
    torch = gpu_torch()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.qts")
        qd.write_quintet_shard(path, np.arange(200000) % 50000)
        side = torch.cuda.Stream()
        gpu = qd.Loader(path, 1000, 16, seed=9, device="cuda", stream=side)
        cpu = qd.Loader(path, 1000, 16, seed=9)
        with torch.cuda.stream(side):
            for _ in range(6):
                x, y = (torch.from_dlpack(a) for a in next(gpu))
                s = (x.long() * 3 + y.long()).sum()  # work on side, after the copy
                cx, cy = next(cpu)
                assert s.item() == int((cx.astype(np.int64) * 3 + cy).sum())


def test_make_synthetic_dataset_is_the_trainers_and_made_once():
    with tempfile.TemporaryDirectory() as d:
        made = qd.make_synthetic_dataset(d, order=1, train_shards=2, tokens_per_shard=4096,
                                         val_tokens=1024)
        folder = os.path.dirname(made["train"][0])
        # One folder per configuration under d, named by its description, as the trainers use.
        assert os.path.dirname(folder) == d and "-k1-" in os.path.basename(folder), folder
        assert [os.path.basename(p) for p in made["train"]] == ["train_000.qts", "train_001.qts"]
        assert [os.path.basename(p) for p in made["val"]] == ["val_000.qts"]
        files = qd.describe(made["train"] + made["val"])
        assert [f["tokens"] for f in files] == [4096, 4096, 1024]
        floor = float(files[0]["metadata"]["entropy_floor_nats"])
        assert abs(made["entropy_nats"] - floor) < 1e-12 and floor > 0
        stamp = os.stat(made["train"][0]).st_mtime_ns
        again = qd.make_synthetic_dataset(d, order=1, train_shards=2, tokens_per_shard=4096,
                                          val_tokens=1024)
        assert again["train"] == made["train"] and os.stat(made["train"][0]).st_mtime_ns == stamp
        with qd.Loader(",".join(made["train"]), seq_len=64, batch=2, threads=1) as loader:
            x, _ = next(loader)
            assert x.shape == (2, 64) and int(x.max()) < 256


def main():
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_")]
    passed = failed = skipped = 0
    for name, fn in tests:
        t0 = time.perf_counter()
        try:
            fn()
            passed += 1
            print(f"PASS {name} ({time.perf_counter() - t0:.2f} s)", flush=True)
        except Skip as e:
            skipped += 1
            print(f"SKIP {name}: {e}", flush=True)
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
