#!/usr/bin/env python3
"""PyTorch reference benchmarks for the shapes `./bench` measures, run side by side on the GPU.

usage: bench_torch.py [train-llama] [train-gpt2] [attention] [loss] [distill] [gemm]   (default: all)
  train-*    training step of the same model in PyTorch: fp32 master weights, bf16 autocast,
             fused AdamW, SDPA attention; eager and torch.compile; tokens/s and peak memory
  attention  F.scaled_dot_product_attention, causal, bf16: flash and cuDNN backends, TFLOP/s
  loss       cross-entropy fwd+bwd on bf16 logits, eager and compiled: ms and extra memory
  distill    forward / reverse KL (temperature 2) and cross-entropy + z-loss, the same way
  gemm       bf16 matmul 8192^3 TFLOP/s (the ceiling the kernels are judged against)
Prints one line per measurement, in the same units as ./bench.
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def timed(fn, warmup=3, reps=10):
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


class Block(nn.Module):
    def __init__(self, d, heads, kv_heads, ffn, llama):
        super().__init__()
        self.h, self.kv, self.hd, self.llama = heads, kv_heads, d // heads, llama
        norm = (lambda: nn.RMSNorm(d, eps=1e-5)) if llama else (lambda: nn.LayerNorm(d))
        self.n1, self.n2 = norm(), norm()
        self.qkv = nn.Linear(d, (heads + 2 * kv_heads) * self.hd, bias=not llama)
        self.o = nn.Linear(heads * self.hd, d, bias=not llama)
        if llama:
            self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        else:
            self.up = nn.Linear(d, ffn)
        self.down = nn.Linear(ffn, d, bias=not llama)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, s, -1, self.hd).split([self.h, self.kv, self.kv], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.llama:
            def rope(t):
                t1, t2 = t.chunk(2, dim=-1)
                return t * cos + torch.cat((-t2, t1), dim=-1) * sin
            q, k = rope(q), rope(k)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        h = self.n2(x)
        if self.llama:
            g, u = self.gate_up(h).chunk(2, dim=-1)
            h = F.silu(g) * u
        else:
            h = F.gelu(self.up(h), approximate="tanh")
        return x + self.down(h)


class Model(nn.Module):
    def __init__(self, vocab, d, layers, heads, kv_heads, ffn, seq, llama):
        super().__init__()
        self.llama = llama
        self.emb = nn.Embedding(vocab, d)
        self.pos = None if llama else nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, kv_heads, ffn, llama) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-5) if llama else nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(seq).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tokens, labels):
        x = self.emb(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def train(name, vocab, d, layers, heads, kv_heads, ffn, seq, batch, llama):
    for compiled in (False, True):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = Model(vocab, d, layers, heads, kv_heads, ffn, seq, llama).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        fwd = torch.compile(model) if compiled else model
        tokens = torch.randint(0, vocab, (batch, seq), device="cuda")
        labels = torch.randint(0, vocab, (batch, seq), device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(tokens, labels)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        ms = timed(step, warmup=3, reps=10)
        tps = batch * seq / (ms / 1e3)
        n = sum(p.numel() for p in model.parameters())
        flops = 6 * (n - vocab * d) + 6 * layers * seq * d
        print(f"torch train {name} {'compiled' if compiled else 'eager'}: {tps / 1e3:.1f} k tokens/s, "
              f"{ms / 1e3:.3f} s/step, MFU {tps * flops / 989e12:.3f}, peak memory "
              f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB, {n / 1e6:.0f} M parameters", flush=True)
        del model, opt, fwd


def attention():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for b, h, s, d in ((16, 16, 2048, 128), (4, 16, 8192, 128), (16, 32, 2048, 64)):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        flops = 4 * b * h * s * s * d / 2
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            with sdpa_kernel(backend):
                fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                # The output gradient: random like ./bench's (the default), and all ones as this
                # script used before 2026-12-01. The GPU runs at its power cap, where a constant
                # operand (less power in the backward's products) is speed: cuDNN at hd128 B4
                # S8192 fwd+bwd 512-513 TFLOP/s with ones, 489-490 random (docs/PERF.md).
                fb = {}
                for name, grad in (("random", torch.randn_like(q)), ("ones", torch.ones_like(q))):
                    def both():
                        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
                    fb[name] = timed(both)
            print(f"torch attention {backend.name.lower()} B{b} H{h} S{s} D{d}: fwd {flops / fwd / 1e9:.0f} "
                  f"TFLOP/s, fwd+bwd {3.5 * flops / fb['random'] / 1e9:.0f} TFLOP/s "
                  f"(dO all ones: {3.5 * flops / fb['ones'] / 1e9:.0f})", flush=True)


def loss():
    for t, v in ((16384, 128256), (16384, 32000), (32768, 50304)):
        logits = torch.randn(t, v, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, v, (t,), device="cuda")
        for compiled in (False, True):
            f = lambda x, y: F.cross_entropy(x.float(), y)
            f = torch.compile(f) if compiled else f
            def run():
                f(logits, labels).backward()
            run()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ms = timed(run)
            extra = (torch.cuda.max_memory_allocated() - base) / 2**30
            print(f"torch cross-entropy {t}x{v} {'compiled' if compiled else 'eager'}: {ms:.2f} ms, "
                  f"+{extra:.2f} GiB", flush=True)
            logits.grad = None


def distill():
    # The distillation losses and the z-loss beside our fused kernels (./bench loss): student
    # logits with gradient, teacher logits without, both bf16, temperature 2.
    t, v, tau = 16384, 128256, 2.0
    x = torch.randn(t, v, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = torch.randn(t, v, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, v, (t,), device="cuda")

    def forward_kl(a, b):
        return F.kl_div(F.log_softmax(a.float() / tau, -1), F.log_softmax(b.float() / tau, -1),
                        log_target=True, reduction="batchmean")

    def reverse_kl(a, b):
        ls = F.log_softmax(a.float() / tau, -1)
        return (ls.exp() * (ls - F.log_softmax(b.float() / tau, -1))).sum(-1).mean()

    def z_loss_ce(a, b):
        a = a.float()
        return F.cross_entropy(a, labels) + 1e-4 * torch.logsumexp(a, -1).pow(2).mean()

    for name, f in (("forward KL", forward_kl), ("reverse KL", reverse_kl), ("cross-entropy + z-loss", z_loss_ce)):
        for compiled in (False, True):
            g = torch.compile(f) if compiled else f
            def run():
                g(x, y).backward()
            run()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ms = timed(run)
            extra = (torch.cuda.max_memory_allocated() - base) / 2**30
            print(f"torch {name} {t}x{v} {'compiled' if compiled else 'eager'}: {ms:.2f} ms, +{extra:.2f} GiB",
                  flush=True)
            x.grad = None


def gemm():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b)
    print(f"torch gemm bf16 8192^3: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s", flush=True)


def main():
    what = sys.argv[1:] or ["gemm", "attention", "loss", "distill", "train-gpt2", "train-llama"]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    for w in what:
        if w == "train-llama":
            train("llama-0.9b", 32000, 2048, 16, 16, 8, 5632, 4096, 4, True)
        elif w == "train-gpt2":
            train("gpt2-162m", 50257, 768, 12, 12, 12, 3072, 1024, 32, False)
        elif w == "attention":
            attention()
        elif w == "loss":
            loss()
        elif w == "distill":
            distill()
        elif w == "gemm":
            gemm()
        else:
            sys.exit(f"error: unknown benchmark {w!r} (see --help)")


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
    else:
        main()
