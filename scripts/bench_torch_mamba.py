#!/usr/bin/env python3
"""PyTorch timings of the Mamba mixer ops that `./bench mamba` measures, on the same shapes:
Di = 4096 channels, N = 16 states, K = 4, bf16 inputs, 8 sequences of 4096 tokens and 1 of 32768.

usage: bench_torch_mamba.py [--no-compile] [--eager-reps N]   (scan first, then conv1d)
  conv1d   F.conv1d (depthwise, padding K-1, groups Di) + SiLU on the (B, Di, L) layout: forward,
           and forward + backward (autograd), eager and torch.compile
  scan     Hugging Face MambaMixer's slow path: exp(delta A) and delta B x materialised as
           (B, Di, L, N) f32, then a Python loop over the L tokens (h = dA h + dBu, y = h . C),
           D skip and silu(z) gate; eager forward and forward + backward
  scan compiled  the same loop cut into chunks of 32 tokens, each chunk's 32 steps one
           torch.compile'd function (compiling the whole L-step loop would unroll thousands of
           steps); the compile time is printed
Prints one line per measurement: ms, and GB/s on the bytes ./bench counts (bf16 inputs and
outputs read / written once), against the 4.28 TB/s copy bandwidth. Seen on the H200: the eager
scan forward takes about 0.54 s at 8 x 4096; its forward + backward (autograd through 4096
steps) did not finish within the 100 s a run had left, so give this script minutes.
"""
import sys
import time

import torch
import torch.nn.functional as F

DI, N, K = 4096, 16, 4
COPY_TBPS = 4.28
CHUNK = 32


def timed(fn, warmup=2, reps=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def report(name, ms, nbytes):
    gbs = nbytes / (ms * 1e-3) / 1e9
    print(f"{name:58s} {ms:10.3f} ms  {gbs:8.1f} GB/s  {100 * gbs / (COPY_TBPS * 1e3):5.1f}% of copy", flush=True)


def conv(x, w, b):  # x (B, Di, L) -> silu(causal depthwise conv)
    return F.silu(F.conv1d(x, w.unsqueeze(1), b, padding=K - 1, groups=DI)[..., : x.shape[-1]])


def scan_prepare(u, delta, A, Bm):
    # (B, Di, L, N) f32: the decay and the input of every step, as HF's slow path builds them.
    dA = torch.exp(delta.unsqueeze(-1) * A[:, None, :])
    dBu = (delta * u).unsqueeze(-1) * Bm.transpose(1, 2).unsqueeze(1)
    return dA, dBu


def scan_steps(h, dA, dBu, Cm, t0, t1):
    ys = []
    for t in range(t0, t1):
        h = dA[:, :, t] * h + dBu[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, :, t]))
    return h, torch.stack(ys, dim=-1)


def scan_finish(y, u, D, z):
    return (y + D[:, None] * u) * F.silu(z)


def scan_eager(u, delta, A, Bm, Cm, D, z):
    u, delta, z = u.float(), delta.float(), z.float()
    dA, dBu = scan_prepare(u, delta, A, Bm.float())
    h = torch.zeros(u.shape[0], DI, N, device=u.device)
    _, y = scan_steps(h, dA, dBu, Cm.float(), 0, u.shape[-1])
    return scan_finish(y, u, D, z).to(torch.bfloat16)


def chunk_body(h, dA, dBu, Cm):  # CHUNK steps, compiled once (shapes are the same every chunk)
    ys = []
    for t in range(CHUNK):
        h = dA[:, :, t] * h + dBu[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, :, t]))
    return h, torch.stack(ys, dim=-1)


def scan_chunked(body, u, delta, A, Bm, Cm, D, z):
    u, delta, z = u.float(), delta.float(), z.float()
    dA, dBu = scan_prepare(u, delta, A, Bm.float())
    Cm = Cm.float()
    h = torch.zeros(u.shape[0], DI, N, device=u.device)
    ys = []
    for t0 in range(0, u.shape[-1], CHUNK):
        h, y = body(h, dA[:, :, t0 : t0 + CHUNK].contiguous(), dBu[:, :, t0 : t0 + CHUNK].contiguous(),
                    Cm[:, :, t0 : t0 + CHUNK].contiguous())
        ys.append(y)
    return scan_finish(torch.cat(ys, dim=-1), u, D, z).to(torch.bfloat16)


def main():
    compile_ok = "--no-compile" not in sys.argv
    reps = 1
    if "--eager-reps" in sys.argv:
        reps = int(sys.argv[sys.argv.index("--eager-reps") + 1])
    dev = "cuda"
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    conv_c = torch.compile(conv) if compile_ok else None
    body_c = None
    compile_s = 0.0
    for b, l in ((8, 4096), (1, 32768)):
        t = b * l
        act = t * DI * 2.0  # bytes of one (T, Di) bf16 tensor
        bc = t * N * 2.0
        tag = f"{b}x{l} Di={DI} N={N}"
        # The eager loop takes seconds per call: one warm-up and one timed call at 8 x 4096, a
        # single timed call at 1 x 32768 (the first call's allocations are a few ms of it).
        warm, rep = (1, reps) if l <= 4096 else (0, 1)
        u = torch.randn(b, DI, l, device=dev, dtype=torch.bfloat16, requires_grad=True)
        delta = F.softplus(0.5 * torch.randn(b, DI, l, device=dev) - 3.4).to(torch.bfloat16).requires_grad_()
        z = torch.randn(b, DI, l, device=dev, dtype=torch.bfloat16, requires_grad=True)
        A = (-torch.arange(1, N + 1, device=dev, dtype=torch.float32).repeat(DI, 1)).requires_grad_()
        Bm = torch.randn(b, N, l, device=dev, dtype=torch.bfloat16, requires_grad=True)
        Cm = torch.randn(b, N, l, device=dev, dtype=torch.bfloat16, requires_grad=True)
        D = torch.ones(DI, device=dev, requires_grad=True)
        gy = torch.randn(b, DI, l, device=dev, dtype=torch.bfloat16)
        args = (u, delta, A, Bm, Cm, D, z)
        with torch.no_grad():
            ms = timed(lambda: scan_eager(*args), warmup=warm, reps=rep)
        report(f"torch scan fwd eager (sequential loop) {tag}", ms, 4 * act + 2 * bc)
        ms = timed(lambda: scan_eager(*args).backward(gy), warmup=warm, reps=rep)
        report(f"torch scan fwd+bwd eager (sequential loop) {tag}", ms, 11 * act + 6 * bc)
        if compile_ok and compile_s > 60:
            print(f"  (compiled scan skipped for {tag}: the first compile took {compile_s:.0f} s)", flush=True)
        elif compile_ok:
            if body_c is None:
                body_c = torch.compile(chunk_body)
            start = time.time()
            scan_chunked(body_c, *args).backward(gy)
            torch.cuda.synchronize()
            compile_s = time.time() - start
            print(f"  (compile of the {CHUNK}-step chunk, forward + backward, and one run: {compile_s:.1f} s)",
                  flush=True)
            with torch.no_grad():
                ms = timed(lambda: scan_chunked(body_c, *args), warmup=1, reps=reps)
            report(f"torch scan fwd compiled ({CHUNK}-step chunks) {tag}", ms, 4 * act + 2 * bc)
            ms = timed(lambda: scan_chunked(body_c, *args).backward(gy), warmup=1, reps=reps)
            report(f"torch scan fwd+bwd compiled ({CHUNK}-step chunks) {tag}", ms, 11 * act + 6 * bc)
        del u, delta, z, Bm, Cm, gy, args
        torch.cuda.empty_cache()

    for b, l in ((8, 4096), (1, 32768)):
        act = b * l * DI * 2.0
        tag = f"{b}x{l} Di={DI} N={N}"
        x = torch.randn(b, DI, l, device=dev, dtype=torch.bfloat16, requires_grad=True)
        w = (0.3 * torch.randn(DI, K, device=dev, dtype=torch.bfloat16)).requires_grad_()
        cb = (0.1 * torch.randn(DI, device=dev, dtype=torch.bfloat16)).requires_grad_()
        gy = torch.randn(b, DI, l, device=dev, dtype=torch.bfloat16)
        with torch.no_grad():
            report(f"torch conv1d fwd eager {tag}", timed(lambda: conv(x, w, cb)), 2 * act)
        report(f"torch conv1d fwd+bwd eager {tag}", timed(lambda: conv(x, w, cb).backward(gy)), 5 * act)
        if conv_c is not None:
            with torch.no_grad():
                report(f"torch conv1d fwd compiled {tag}", timed(lambda: conv_c(x, w, cb)), 2 * act)
            report(f"torch conv1d fwd+bwd compiled {tag}", timed(lambda: conv_c(x, w, cb).backward(gy)), 5 * act)
        del x, w, cb, gy


if __name__ == "__main__":
    main()
