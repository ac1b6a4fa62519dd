"""The timed training loop of the PyTorch comparisons gpt_torch.py and moe_torch.py: the same
optimizer, batches, gradient accumulation, timing and memory figures for both, and the trainers'
MFU formula, so their figures are measured alike. Imported from the scripts' directory."""
import contextlib
import os
import statistics
import time

PEAK = 989e12  # the trainers' MFU denominator: an H100's dense bf16 FLOP/s


def start_ranks(torch, device_kind):
    """This process's rank, the number of ranks and its device, from torchrun's environment
    (RANK, WORLD_SIZE, LOCAL_RANK; one rank without it): GPU LOCAL_RANK with device_kind "cuda",
    made current, else the CPU. With more than one rank, joins the process group (NCCL on GPUs,
    gloo on the CPU); the caller destroys it."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1:
        if device.type == "cuda":
            torch.distributed.init_process_group("nccl", device_id=device)
        else:
            torch.distributed.init_process_group("gloo")
    return rank, world, device


def timed_training(torch, args, model, mode, rank, world, device):
    """Trains `model` (model(x, y) returns the loss), wrapped in DDP when world > 1, for
    args.warmup + args.steps steps of args.global_batch random sequences of args.seq_len + 1
    tokens (args.micro_batch per rank and microbatch, drawn from seed args.seed + rank): AdamW
    (lr 1e-4, weight decay 0.1; fused on CUDA, the default on the CPU, where older PyTorch has no
    fused), bf16 autocast, clipping at 1, torch.compile with mode "compiled". Peak memory two ways,
    as the trainers report it: the steady state (the peak is reset when the timed steps begin:
    the most they reach) and the whole run (from the caller's last reset: set-up, warm-up and
    compile). Returns (median ms of the timed steps, steady peak bytes, run peak bytes); the peaks
    are 0 off CUDA."""
    cuda = device.type == "cuda"
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                            **({"fused": True} if cuda else {}))
    step_model = torch.compile(model) if mode == "compiled" else model
    accum = args.global_batch // (args.micro_batch * world)
    gen = torch.Generator(device=device).manual_seed(args.seed + rank)

    def batch():
        x = torch.randint(0, args.vocab, (args.micro_batch, args.seq_len + 1), device=device,
                          generator=gen)
        return x[:, :-1], x[:, 1:]

    def step():
        opt.zero_grad(set_to_none=True)
        for m in range(accum):
            x, y = batch()
            sync_grads = world == 1 or m == accum - 1
            ctx = model.no_sync() if not sync_grads else contextlib.nullcontext()
            with ctx, torch.autocast(device.type, dtype=torch.bfloat16):
                loss = step_model(x, y) / accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    times = []
    run_peak = 0
    for i in range(args.warmup + args.steps):
        if i == args.warmup and cuda:
            run_peak = torch.cuda.max_memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    steady_peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    return statistics.median(times) * 1000, steady_peak, max(run_peak, steady_peak)


def throughput(args, world, ms, flop_params):
    """The JSON figures of a step of ms milliseconds: tokens_per_s, ms, mfu and tflops per GPU,
    with the trainers' (6 N + 12 L d T) FLOPs per token, N = flop_params (the non-embedding
    parameters, or the active ones of an MoE model)."""
    tps = args.global_batch * args.seq_len / (ms / 1000)
    fpt = 6 * flop_params + 12 * args.layers * args.hidden * args.seq_len
    tflops = tps * fpt / world / 1e12
    return {"tokens_per_s": round(tps, 1), "ms": round(ms, 3),
            "mfu": round(tflops * 1e12 / PEAK, 4), "tflops": round(tflops, 2)}
