#!/usr/bin/env python3
"""PyTorch DataLoader baseline for examples/03_loader_bench (run on the GPU machine).

Reads the same token shards (Quintet .qts, llm.c .bin, Megatron .bin/.idx) as fixed windows of
seq_len + 1 tokens, exactly as quintet::data::Windows cuts them, and copies each batch to the GPU
with non_blocking=True, as a PyTorch trainer would, in every way a PyTorch user who cares would
write it, all in one run:
  - nanogpt: no DataLoader; each batch is one batched read from the memmaps in the training
    process (random windows, np.stack, int64, pin_memory, .to(non_blocking=True)), as nanoGPT's
    get_batch does;
  - a DataLoader over a per-sample Dataset (shuffle, default collate, pin_memory=True) with 0, 2
    and 4 worker processes (--workers);
  - a DataLoader over a batched Dataset (a BatchSampler hands each __getitem__ a whole batch of
    window indices, read and stacked at once; batch_size=None) with the same worker counts.
Prints tokens/s of each; "best" is the fastest of them all. With
--quintet-bench it also runs 03_loader_bench with the same settings and prints the ratio to the
best; with
--quintet-python it also runs the Python module quintet_data (python/, PYTHONPATH=build/python)
in this process, the same way (the copy to the GPU included; on a GPU both ways: the loader
copying to the device itself and torch.from_dlpack, or torch.from_numpy and .to), and prints its
ratio to the best torch form.

  python3 scripts/bench/loader_torch.py --data 'data/synthetic/train_*.qts' --seq-len 1024 \
      --batch 8 --steps 200 --device cuda:0 \
      --quintet-bench build/examples/03_loader_bench/03_loader_bench --quintet-python
"""
import argparse
import glob
import json
import os
import struct
import subprocess
import sys
import time
from collections import deque

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler

MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                   6: np.float64, 7: np.float32, 8: np.uint16}


def open_tokens(path):
    """A numpy memmap of the tokens of one file (any of the three formats)."""
    prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
    if os.path.exists(prefix + ".idx") and os.path.exists(prefix + ".bin"):
        with open(prefix + ".idx", "rb") as f:
            head = f.read(34)
        assert head[:9] == b"MMIDIDX\x00\x00", f"{prefix}.idx: bad Megatron magic"
        dtype = MEGATRON_DTYPES[head[17]]
        return np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:8] == b"QTSHARD\x00":
        _, _, width, count, docs, _, payload = struct.unpack("<8sIIQQQQ", head[:48])
        dtype = np.uint16 if width == 2 else np.uint32
        return np.memmap(path, dtype=dtype, mode="r", offset=payload + 8 * (docs + 1),
                         shape=(count,))
    magic, version, count = struct.unpack("<iii", head[:12])
    assert magic in (20240520, 20240801), f"{path}: not a token file"
    dtype = np.uint16 if magic == 20240520 else np.uint32
    return np.memmap(path, dtype=dtype, mode="r", offset=1024, shape=(count,))


def expand(spec):
    paths, seen = [], set()
    for entry in spec.split(","):
        matches = sorted(glob.glob(entry)) if any(c in entry for c in "*?[") else [entry]
        if not matches:
            sys.exit(f"data spec '{entry}' matches no file")
        for p in matches:
            key = p[:-4] if p.endswith((".bin", ".idx")) and os.path.exists(p[:-4] + ".idx") else p
            if key not in seen:
                seen.add(key)
                paths.append(p)
    return paths


class Windows(Dataset):
    def __init__(self, paths, seq_len):
        self.paths, self.seq_len = paths, seq_len
        self.files = None  # opened lazily in each worker
        sizes = [len(open_tokens(p)) for p in paths]
        self.first = np.cumsum([0] + [max(0, (n - 1) // seq_len) for n in sizes])

    def __len__(self):
        return int(self.first[-1])

    def __getitem__(self, i):
        if self.files is None:
            self.files = [open_tokens(p) for p in self.paths]
        f = int(np.searchsorted(self.first, i, side="right")) - 1
        start = (i - int(self.first[f])) * self.seq_len
        w = torch.from_numpy(self.files[f][start:start + self.seq_len + 1].astype(np.int64))
        return w[:-1], w[1:]


class BatchedWindows(Windows):
    """The same windows; __getitem__ takes a list of window indices and returns the whole batch,
    read with one slice per window and stacked (what a user writes to avoid per-sample collate)."""

    def __getitem__(self, indices):
        if self.files is None:
            self.files = [open_tokens(p) for p in self.paths]
        rows = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for r, i in enumerate(indices):
            f = int(np.searchsorted(self.first, i, side="right")) - 1
            start = (i - int(self.first[f])) * self.seq_len
            rows[r] = self.files[f][start:start + self.seq_len + 1]
        w = torch.from_numpy(rows)
        return w[:, :-1], w[:, 1:]


def time_loop(a, device, next_batch):
    """tokens/s of a.steps batches from next_batch(), each copied to the device non-blocking, after
    5 warm-up batches."""
    cuda = device.type == "cuda"
    for _ in range(5):  # warm-up: workers started, queues filled
        next_batch()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        x, y = next_batch()
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
    if cuda:
        torch.cuda.synchronize(device)
    return a.steps * a.batch * a.seq_len / (time.perf_counter() - t0)


def nanogpt_batches(ds, a, device):
    """nanoGPT's get_batch over the same windows: random window indices, one batched read."""
    files = [open_tokens(p) for p in ds.paths]
    rng = np.random.default_rng(1)
    pin = device.type == "cuda"

    def next_batch():
        ix = rng.integers(0, len(ds), size=a.batch)
        rows = []
        for i in ix:
            f = int(np.searchsorted(ds.first, i, side="right")) - 1
            start = (int(i) - int(ds.first[f])) * a.seq_len
            rows.append(files[f][start:start + a.seq_len + 1])
        w = torch.from_numpy(np.stack(rows).astype(np.int64))
        x, y = w[:, :-1], w[:, 1:]
        if pin:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y
    return next_batch


def dataloader_batches(loader):
    it = iter(loader)

    def next_batch():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = iter(loader)
            return next(it)
    return next_batch


def time_quintet_python(a, device, threads, loader_copies):
    """tokens/s of quintet_data.Loader consumed as a PyTorch trainer would.

    loader_copies (GPU only): Loader(device=...) copies each batch to the GPU itself, on its own
    stream, and torch.from_dlpack views the device memory (torch's stream waits for the copy on
    the GPU). Otherwise each batch is viewed by torch.from_numpy (no copy) and, on a GPU, copied
    with non_blocking=True from the loader's pinned memory. That memory is not torch's, so torch
    cannot keep it alive for an unfinished copy: each batch's arrays are kept until an event
    after its copy has completed (two batches back, so the host never waits for the copy just
    queued)."""
    import quintet_data

    cuda = device.type == "cuda"
    loader = quintet_data.Loader(a.data, a.seq_len, a.batch, seed=1, threads=threads,
                                 device=str(device) if loader_copies else "cpu")
    held = deque()

    def step():
        x, y = next(loader)
        if loader_copies:
            return torch.from_dlpack(x), torch.from_dlpack(y)
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        if cuda:
            xt = xt.to(device, non_blocking=True)
            yt = yt.to(device, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            held.append((x, y, done))
            while len(held) > 2:
                held.popleft()[2].synchronize()
        return xt, yt

    for _ in range(5):  # warm-up, as for the DataLoader
        step()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    rate = a.steps * a.batch * a.seq_len / (time.perf_counter() - t0)
    held.clear()
    loader.close()
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="data/synthetic/train_*.qts")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--workers", default="0,2,4")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quintet-bench", default="", help="path of 03_loader_bench to compare")
    ap.add_argument("--threads", default="1,2,4,8", help="03_loader_bench thread counts")
    ap.add_argument("--quintet-python", action="store_true",
                    help="also time quintet_data.Loader from Python (thread counts: --threads)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    paths = expand(a.data)
    ds = Windows(paths, a.seq_len)
    batched = BatchedWindows(paths, a.seq_len)
    device = torch.device(a.device)
    pin = device.type == "cuda"
    results = {}

    def report(name, rate, **fields):
        results[name] = rate
        line = {"mode": "torch", "form": name, "device": a.device, "seq_len": a.seq_len,
                "batch": a.batch, "steps": a.steps, "tokens_per_s": rate, **fields}
        print(json.dumps(line) if a.json else f"torch {name}: {rate:.4g} tokens/s", flush=True)

    report("nanogpt get_batch (memmap, no DataLoader)", time_loop(a, device, nanogpt_batches(ds, a, device)),
           workers=0)
    for workers in [int(w) for w in a.workers.split(",")]:
        extra = {"persistent_workers": True, "prefetch_factor": 4} if workers else {}
        loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=workers, **extra,
                            pin_memory=pin, drop_last=True,
                            generator=torch.Generator().manual_seed(1))
        report(f"DataLoader per-sample, {workers} workers",
               time_loop(a, device, dataloader_batches(loader)), workers=workers)
        del loader
        sampler = BatchSampler(RandomSampler(batched, generator=torch.Generator().manual_seed(1)),
                               a.batch, drop_last=True)
        loader = DataLoader(batched, batch_size=None, sampler=sampler, num_workers=workers,
                            **extra, pin_memory=pin)
        report(f"DataLoader batched, {workers} workers",
               time_loop(a, device, dataloader_batches(loader)), workers=workers)
        del loader
    best_name = max(results, key=results.get)
    best_torch = results[best_name]
    print(json.dumps({"mode": "torch_best", "form": best_name, "tokens_per_s": best_torch})
          if a.json else f"best torch form: {best_name} ({best_torch:.4g} tokens/s)", flush=True)

    if a.quintet_python:
        ways = [False, True] if device.type == "cuda" else [False]
        for loader_copies in ways:
            how = "Loader(device=...) + from_dlpack" if loader_copies else "from_numpy + .to"
            for threads in [int(t) for t in a.threads.split(",")]:
                rate = time_quintet_python(a, device, threads, loader_copies)
                line = {"mode": "quintet_python_device" if loader_copies else "quintet_python",
                        "threads": threads, "device": a.device, "seq_len": a.seq_len,
                        "batch": a.batch, "steps": a.steps, "tokens_per_s": rate,
                        "vs_best_torch": rate / best_torch}
                print(json.dumps(line) if a.json else
                      f"quintet_data (Python, {how}) {threads} threads: {rate:.4g} tokens/s = "
                      f"{rate / best_torch:.2f}x the best torch form")

    if a.quintet_bench:
        out = subprocess.run([a.quintet_bench, "--data", a.data, "--seq-len", str(a.seq_len),
                              "--batch", str(a.batch), "--steps", str(a.steps), "--threads",
                              a.threads, "--device", a.device, "--json"],
                             check=True, capture_output=True, text=True).stdout
        for row in (json.loads(l) for l in out.splitlines() if l.startswith("{")):
            row["vs_best_torch"] = row["tokens_per_s"] / best_torch
            print(json.dumps(row) if a.json else
                  f"quintet {row['mode']} threads {row['threads']}: {row['tokens_per_s']:.4g} "
                  f"tokens/s = {row['vs_best_torch']:.2f}x the best torch form")


if __name__ == "__main__":
    main()
