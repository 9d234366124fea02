#!/usr/bin/env python3
"""PyTorch reference timings for `./bench moe` (csrc/bench/moe.cpp): the same grouped GEMM shapes
through torch._grouped_mm and through a loop of torch.matmul over the experts, bf16, TFLOP/s of
useful work (2 x rows x K x N).

  fwd    Y = X W_e^T       torch._grouped_mm(x, w.transpose(-2, -1), offs)   x (rows, K), w (E, N, K)
  dgrad  dX = dY W_e       torch._grouped_mm(dy, w, offs)
  wgrad  dW_e = dY_e^T X_e torch._grouped_mm(dy.t(), x, offs)  (a new bf16 tensor: this torch
         build refuses an f32 output; ./bench accumulates into an f32 one)

Cases: balanced (8 experts sharing 32768 rows evenly, 4096 -> 7168), skewed (8 experts, one with
24576 of the 32768 rows), small (64 experts x 80 rows, 2048 -> 2816). Row counts are multiples of
16 (the alignment torch._grouped_mm asks for). usage: bench_torch_moe.py
"""
import torch

from bench_torch import timed


def cases():
    skewed = [24576] + [1168] * 6 + [1184]
    return [("balanced", [4096] * 8, 4096, 7168), ("skewed", skewed, 4096, 7168), ("small", [80] * 64, 2048, 2816)]


def main():
    for name, counts, k, n in cases():
        e, rows = len(counts), sum(counts)
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        dy = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0).to(torch.int32)
        starts = [0]
        for c in counts:
            starts.append(starts[-1] + c)
        flops = 2.0 * rows * k * n
        base = f"torch moe {name} E={e} rows={rows} {k}->{n}"
        runs = {
            "fwd _grouped_mm": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
            "fwd matmul loop": lambda: [x[starts[i]:starts[i + 1]] @ w[i].t() for i in range(e)],
            "dgrad _grouped_mm": lambda: torch._grouped_mm(dy, w, offs=offs),
            "dgrad matmul loop": lambda: [dy[starts[i]:starts[i + 1]] @ w[i] for i in range(e)],
            "wgrad _grouped_mm": lambda: torch._grouped_mm(dy.t(), x, offs=offs),
            "wgrad matmul loop": lambda: [dy[starts[i]:starts[i + 1]].t() @ x[starts[i]:starts[i + 1]]
                                          for i in range(e)],
        }
        for label, fn in runs.items():
            try:
                ms = timed(fn)
                print(f"{base} {label}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
            except Exception as err:  # an unsupported layout on this torch build: say so, go on
                print(f"{base} {label}: failed: {str(err).splitlines()[0]}", flush=True)
        # Same numbers from the grouped and the loop forward (a check that the call is what we time).
        try:
            got = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
            ref = torch.cat([x[starts[i]:starts[i + 1]] @ w[i].t() for i in range(e)])
            err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            print(f"{base} fwd _grouped_mm vs loop: rel error {err:.2e}", flush=True)
        except Exception as err:
            print(f"{base} check failed: {str(err).splitlines()[0]}", flush=True)
        del x, w, dy
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
