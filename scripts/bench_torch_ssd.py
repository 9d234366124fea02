#!/usr/bin/env python3
"""The peers of `./bench ssd`: the Triton SSD kernels of mamba-ssm and flash-linear-attention's on
the same Mamba-2 shapes.

64 heads of 64 channels, one group of 128 states shared by all heads, bf16, 8 sequences of 4096
tokens (packed, cu_seqlens) and 1 of 32768. The Mamba-2 scan is fla's chunk_simple_gla with
q = C, k = B (expanded to the heads: fla takes per-head keys), v = delta x, g = delta A (log
decay per head and token) and scale 1; the D skip and delta = softplus(dt + dt_bias) are
elementwise and left out of the peer's time (ours includes them), so the comparison favours fla.
mamba-ssm's mamba_chunk_scan_combined (chunk 256, seq_idx for the documents) takes the same
inputs as ours (x, dt with dt_bias and the softplus, A, B and C of one group, D) and is timed as
it is. Timed: forward, and forward + backward (autograd), the median of 10 after 3 warm-ups, CUDA
events. Needs einops and, for each peer, its Python sources on PYTHONPATH (fla-core's wheel;
mamba-ssm's mamba_ssm/ops/triton/ssd_*.py with the modules they import: its package cannot be
installed from PyPI without building its CUDA extensions); a peer that does not import or run is
reported as such.

usage: bench_torch_ssd.py
"""

import torch

from bench_torch import time_peers  # (scripts/)

H, P, N = 64, 64, 128


def peer_fla():
    try:
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError as e:
        print(f"fla: not importable ({e})")
        return None

    def make(x, dt, A, bias, Bm, Cm, D, cu, seq_idx):
        delta = torch.nn.functional.softplus(dt + bias)
        H = x.shape[2]
        k = Bm.expand(-1, -1, H, -1).contiguous()
        q = Cm.expand(-1, -1, H, -1).contiguous()
        v = (x.float() * delta[..., None]).to(torch.bfloat16)
        g = (delta * A).float()
        args = [t.detach().clone().requires_grad_(True) for t in (q, k, v, g)]
        return lambda: chunk_simple_gla(args[0], args[1], args[2], g=args[3], scale=1.0, cu_seqlens=cu)[0]
    return "fla chunk_simple_gla (core only)", make


def peer_mamba_ssm():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError as e:
        print(f"mamba-ssm: not importable ({e})")
        return None

    def make(x, dt, A, bias, Bm, Cm, D, cu, seq_idx):
        args = [t.detach().clone().requires_grad_(True) for t in (x, dt, A, Bm, Cm, D, bias)]
        return lambda: mamba_chunk_scan_combined(args[0], args[1], args[2], args[3], args[4], 256, D=args[5],
                                                 dt_bias=args[6], seq_idx=seq_idx, dt_softplus=True)
    return "mamba-ssm mamba_chunk_scan_combined", make


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    peers = [p for p in (peer_mamba_ssm(), peer_fla()) if p]
    for seqs, length in ((8, 4096), (1, 32768)):
        T = seqs * length
        cu = torch.arange(0, T + 1, length, dtype=torch.long, device=dev)
        seq_idx = (torch.arange(T, device=dev) // length).to(torch.int32)[None]
        A = -torch.exp(torch.log1p(15 * torch.arange(H, device=dev) / (H - 1))).float()
        bias = torch.log(torch.expm1(0.001 + 0.1 * torch.arange(H, device=dev) / (H - 1))).float()
        dt = (torch.randn(1, T, H, device=dev) * 0.5).to(torch.bfloat16)
        x = torch.randn(1, T, H, P, device=dev, dtype=torch.bfloat16)
        Bm = torch.randn(1, T, 1, N, device=dev, dtype=torch.bfloat16)
        Cm = torch.randn(1, T, 1, N, device=dev, dtype=torch.bfloat16)
        D = torch.ones(H, device=dev)
        dy = torch.randn(1, T, H, P, device=dev, dtype=torch.bfloat16)
        time_peers(peers, f"{seqs}x{length} H={H} P={P} N={N}", (x, dt.float(), A, bias, Bm, Cm, D, cu, seq_idx), dy)


if __name__ == "__main__":
    main()
