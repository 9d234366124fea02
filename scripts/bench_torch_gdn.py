#!/usr/bin/env python3
"""The peer of `./bench gdn`: flash-linear-attention's chunked Gated DeltaNet kernels on the same
shapes.

16 key and 16 value heads of 128 channels, bf16, 8 sequences of 4096 tokens (packed, cu_seqlens)
and 1 of 32768. fla's chunk_gated_delta_rule computes what ops/delta.h's gated_delta does: the q
and k l2 norms in the kernel (use_qk_l2norm_in_kernel), beta = sigmoid(b) in the kernel
(use_beta_sigmoid_in_kernel), the decay -exp(A_log) softplus(a + dt_bias) in the kernel
(use_gate_in_kernel with A_log and dt_bias), scale 1/sqrt(dk); where this fla version lacks one
of these fused options, that part runs as a PyTorch op before the call and is timed with it.
Timed: forward, and forward + backward (autograd, gradients of q, k, v, a, b), the median of 10
after 3 warm-ups, CUDA events. Needs einops and fla-core's sources on PYTHONPATH (its wheel); a
peer that does not import or run is reported as such.

usage: bench_torch_gdn.py
"""

import inspect

import torch

from bench_torch import time_peers  # (scripts/)

H, D = 16, 128


def peer_fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:
        print(f"fla: not importable ({e})")
        return None
    params = inspect.signature(chunk_gated_delta_rule).parameters
    fused_beta = "use_beta_sigmoid_in_kernel" in params

    def make(q, k, v, a, b, A_log, bias, cu):
        args = [t.detach().clone().requires_grad_(True) for t in (q, k, v, a, b)]

        def run():
            qq, kk, vv, aa, bb = args
            beta = bb if fused_beta else torch.sigmoid(bb.float()).to(bb.dtype)
            extra = {"use_beta_sigmoid_in_kernel": True} if fused_beta else {}
            return chunk_gated_delta_rule(qq, kk, vv, aa, beta, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                          A_log=A_log, dt_bias=bias, cu_seqlens=cu, **extra)[0]
        return run
    return "fla chunk_gated_delta_rule", make


def main():
    torch.manual_seed(0)
    dev = torch.device("cuda")
    peers = [p for p in (peer_fla(),) if p]
    for seqs, length in ((8, 4096), (1, 32768)):
        T = seqs * length
        cu = torch.arange(0, T + 1, length, dtype=torch.long, device=dev)
        A_log = torch.log1p(15 * torch.arange(H, device=dev) / (H - 1)).float()
        bias = torch.ones(H, device=dev)
        q, k, v = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        a, b = (torch.randn(1, T, H, device=dev, dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16)
        time_peers(peers, f"{seqs}x{length} H={H} D={D}", (q, k, v, a, b, A_log, bias, cu), do)


if __name__ == "__main__":
    main()
