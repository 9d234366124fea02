#!/usr/bin/env python3
"""Checks the engine's Gated DeltaNet blocks (hybrid_layout letter G) against transformers'
Qwen3NextGatedDeltaNet, the published implementation of the layer.

No Hugging Face architecture is made of G blocks and dense MLPs alone (Qwen3-Next's attention
layers have output gates and partial RoPE, which the engine does not represent), so the check is
of the layer, in a model assembled here from PyTorch pieces around transformers' module:

  1. ./train trains a small hybrid model (layout "GAG" by default: Gated DeltaNet + MLP, attention
     + MLP, Gated DeltaNet + MLP; value heads sharing key heads) for a few steps on the demo data,
     on the CPU, and saves a checkpoint;
  2. the checkpoint's master weights (rank_0.safetensors, offsets from metadata.json) fill a
     reference: embedding, per layer an RMSNorm, the token mixer (Qwen3NextGatedDeltaNet with
     its in_proj_qkvz / in_proj_ba rows interleaved per key head as Qwen3-Next stores them, or a
     causal softmax attention with RoPE for A), the residual, an RMSNorm, a SwiGLU MLP, the
     residual; the final norm and the head;
  3. ./train --dump-logits runs the same token sequences; the logits are compared in f32
     (tolerance rel_rms 1e-4, as scripts/hf_check.py's CPU legs) and, when a GPU is visible and
     ./train was built with CUDA, on the GPU backend in bf16 (the chunked kernels of
     cuda/mamba/delta*.cu), held to the larger of hf_check.py's GPU tolerance and what bf16 costs
     the reference itself (the same model in bf16 on the GPU, with whichever implementation
     transformers picks there, against its f32 run; the script prints which).

    python3 scripts/check_gdn.py                 # builds ./train first if missing
    python3 scripts/check_gdn.py --layout GG --keep --workdir /tmp/gdn-check

Needs torch, transformers (with Qwen3-Next, 4.57 or later) and numpy. Prints one line and exits 0
when the logits agree.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_check  # noqa: E402
from hf_check import ROOT, compare, read_safetensors, run  # noqa: E402

MODEL = """
family = "hybrid"
hybrid_layout = "{layout}"
vocab_size = 257
hidden_size = 96
num_layers = {layers}
num_heads = 4
ffn_hidden_size = 160
rope_theta = 10000.0
norm_eps = 1e-6
gdn_num_key_heads = 2
gdn_num_value_heads = 4
gdn_key_head_dim = 16
gdn_value_head_dim = 24
gdn_conv_kernel = 4
"""


def config_text(layout, data, workdir, steps):
    """hf_check.py's run config (CPU) around this script's [model] table."""
    hf_check.FAMILIES["gdn"] = MODEL.format(layout=layout, layers=len(layout))
    hf_check.LONG_CONTEXT["gdn"] = 128  # sequences past Qwen3-Next's chunk of 64 tokens
    return hf_check.config_text("gdn", data, workdir, "cpu", steps)


def checkpoint_params(step_dir):
    """{name: numpy array} of a one-rank checkpoint's master weights."""
    meta = json.load(open(os.path.join(step_dir, "metadata.json")))
    master = read_safetensors(os.path.join(step_dir, "rank_0.safetensors"))["master"]
    out = {}
    for p in meta["params"]:
        n = 1
        for d in p["shape"]:
            n *= d
        out[p["name"]] = master[p["offset"]:p["offset"] + n].reshape(p["shape"]).copy()
    return out


def reference(params, layout, cfg, device="cpu", dtype=None):
    """The model of the checkpoint, assembled from PyTorch pieces and Qwen3NextGatedDeltaNet, on
    `device` in `dtype` (default f32); it returns f32 logits."""
    import torch
    import torch.nn.functional as F
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    dtype = dtype or torch.float32
    impl = reference.impl
    t = {k: torch.tensor(v).to(device, dtype) for k, v in params.items()}
    hk, hv, dk, dv = cfg["hk"], cfg["hv"], cfg["dk"], cfg["dv"]
    r = hv // hk
    hf_cfg = Qwen3NextConfig(hidden_size=cfg["hidden"], linear_num_key_heads=hk, linear_num_value_heads=hv,
                             linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=cfg["conv"],
                             rms_norm_eps=cfg["eps"], hidden_act="silu", num_hidden_layers=len(layout))
    from transformers.models.qwen3_next import modeling_qwen3_next as hf_mod
    mixers = {}
    for i, letter in enumerate(layout):
        if letter != "G":
            continue
        m = Qwen3NextGatedDeltaNet(hf_cfg, layer_idx=i).float().eval()
        rule = getattr(m, "chunk_gated_delta_rule", None)  # (absent where transformers picks it per call)
        impl[0] = getattr(rule, "__module__", "transformers") if rule is not None else "transformers"
        g = lambda n: t[f"layers.{i}.gdn.{n}"]  # noqa: E731
        rows = []  # in_proj_qkvz: per key head [q_h | k_h | v of its r value heads | z of them]
        for h in range(hk):
            rows += [g("in_proj_q")[h * dk:(h + 1) * dk], g("in_proj_k")[h * dk:(h + 1) * dk],
                     g("in_proj_v")[h * r * dv:(h + 1) * r * dv], g("in_proj_z")[h * r * dv:(h + 1) * r * dv]]
        ba = []  # in_proj_ba: per key head [b of its value heads | a of them]
        for h in range(hk):
            ba += [g("in_proj_b")[h * r:(h + 1) * r], g("in_proj_a")[h * r:(h + 1) * r]]
        with torch.no_grad():
            m.in_proj_qkvz.weight.copy_(torch.cat(rows))
            m.in_proj_ba.weight.copy_(torch.cat(ba))
            m.conv1d.weight.copy_(torch.cat([g("conv_q"), g("conv_k"), g("conv_v")]).unsqueeze(1))
            m.dt_bias.copy_(g("dt_bias"))
            m.A_log.copy_(g("A_log"))
            m.norm.weight.copy_(g("norm"))
            m.out_proj.weight.copy_(g("out_proj"))
        mixers[i] = m.to(device, dtype)

    def rmsnorm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["eps"]) * w

    def attention(x, i):
        n, hd = cfg["heads"], cfg["hidden"] // cfg["heads"]
        T = x.shape[1]
        q, k, v = (F.linear(x, t[f"layers.{i}.attn.w{c}"]).view(1, T, n, hd).transpose(1, 2) for c in "qkv")
        inv = 1.0 / (cfg["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
        cos, sin = (torch.cat([f(ang)] * 2, -1).to(device, dtype) for f in (torch.cos, torch.sin))

        def rope(u):
            u1, u2 = u[..., :hd // 2], u[..., hd // 2:]
            return u * cos + torch.cat([-u2, u1], -1) * sin

        o = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(1, T, n * hd), t[f"layers.{i}.attn.wo"])

    def forward(ids):
        with torch.no_grad():
            x = t["embed.tokens"][torch.tensor([ids], device=device)]
            for i, letter in enumerate(layout):
                xn = rmsnorm(x, t[f"layers.{i}.norm1.weight"])
                x = x + (mixers[i](xn) if letter == "G" else attention(xn, i))
                xn = rmsnorm(x, t[f"layers.{i}.norm2.weight"])
                mlp = F.linear(F.silu(F.linear(xn, t[f"layers.{i}.mlp.w_gate"])) * F.linear(xn, t[f"layers.{i}.mlp.w_up"]),
                               t[f"layers.{i}.mlp.w_out"])
                x = x + mlp
            head = t["head.weight"] if "head.weight" in t else t["embed.tokens"]
            return F.linear(rmsnorm(x, t["final_norm.weight"]), head)[0].float().cpu().numpy()

    return forward


reference.impl = ["?"]  # the module of the last reference's chunked rule (transformers' or fla's)


def reference_logits(step_dir, layout, cfg, sequences, device, workdir, log):
    """The reference's logits of `sequences`, computed by this script in a child process: on the
    CPU in f32 with flash-linear-attention kept off the import path (transformers then runs its
    PyTorch forms; fla's kernels take only GPU tensors), on the GPU in bf16 as transformers runs
    it there (its own pick of implementation: PyTorch's forms, or fla's kernels)."""
    out = os.path.join(workdir, f"reference-{device}.npz")
    env = dict(os.environ)
    if device == "cpu":
        import importlib.util
        spec = importlib.util.find_spec("fla")
        if spec is not None and spec.submodule_search_locations:
            site = os.path.dirname(list(spec.submodule_search_locations)[0])
            env["PYTHONPATH"] = os.pathsep.join(d for d in env.get("PYTHONPATH", "").split(os.pathsep)
                                                if d and os.path.realpath(d) != os.path.realpath(site))
    job = {"step_dir": step_dir, "layout": layout, "cfg": cfg, "sequences": sequences, "device": device, "out": out}
    run([sys.executable, os.path.abspath(__file__), "--reference-job", json.dumps(job)], log, env=env)
    got = np.load(out)
    reference.impl[0] = str(got["impl"])
    return [got[f"logits{i}"] for i in range(len(sequences))]


def reference_job(job):
    """The child process of reference_logits."""
    import torch
    dtype = torch.float32 if job["device"] == "cpu" else torch.bfloat16
    forward = reference(checkpoint_params(job["step_dir"]), job["layout"], job["cfg"], job["device"], dtype)
    logits = {f"logits{i}": forward(s) for i, s in enumerate(job["sequences"])}
    np.savez(job["out"], impl=np.array(reference.impl[0]), **logits)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", default=os.path.join(ROOT, "train"))
    p.add_argument("--layout", default="GAG", help="hybrid_layout of G and A letters (default GAG)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--workdir")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--cpu-only", action="store_true", help="skip the GPU backend even when there is a GPU")
    p.add_argument("--reference-job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.reference_job:
        return reference_job(json.loads(args.reference_job))
    if set(args.layout) - set("GA"):
        sys.exit(f"--layout {args.layout}: letters G and A only")
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from transformers.models.qwen3_next import modeling_qwen3_next  # noqa: F401
    except ImportError as e:
        sys.exit(f"check_gdn.py needs torch and transformers with Qwen3-Next: {e}")
    if not os.path.exists(args.train):
        subprocess.run(["make", f"-j{os.cpu_count()}", "train"], cwd=ROOT, check=True)
    workdir = args.workdir or tempfile.mkdtemp(prefix="gdn-check.")
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "log.txt")
    data = os.path.join(workdir, "data", "demo")
    if not os.path.exists(data + ".idx"):
        os.makedirs(os.path.dirname(data), exist_ok=True)
        corpus = os.path.join(workdir, "data", "corpus.jsonl")
        run([sys.executable, "scripts/make_demo_corpus.py", "--documents", "300", corpus], log)
        run([sys.executable, "scripts/prepare_data.py", corpus, "--output", data], log)
    cfg_path = os.path.join(workdir, "gdn.toml")
    with open(cfg_path, "w") as f:
        f.write(config_text(args.layout, data, workdir, args.steps))
    shutil.rmtree(os.path.join(workdir, "runs", "gdn"), ignore_errors=True)
    run([args.train, cfg_path], log)
    step_dir = os.path.join(workdir, "runs", "gdn", "checkpoints", f"step_{args.steps}")

    rng = random.Random(99)
    sequences = [[rng.randrange(257) for _ in range(n)] for n in (100, 29)]  # 100: past the chunk of 64
    tokens = os.path.join(workdir, "tokens.txt")
    with open(tokens, "w") as f:
        for s in sequences:
            f.write(" ".join(map(str, s)) + "\n")
    cfg = {"hidden": 96, "heads": 4, "theta": 10000.0, "eps": 1e-6, "hk": 2, "hv": 4, "dk": 16, "dv": 24, "conv": 4}
    ref = reference_logits(step_dir, args.layout, cfg, sequences, "cpu", workdir, log)
    devices = ["cpu"] + (["cuda"] if not args.cpu_only and hf_check.train_has_cuda(args.train) else [])
    own = None
    if "cuda" in devices:
        bf16 = reference_logits(step_dir, args.layout, cfg, sequences, "cuda", workdir, log)
        own = compare(bf16, ref)[1]
        print(f"the GPU reference's chunked gated delta rule: {reference.impl[0]}", flush=True)
    line, ok = hf_check.ours_vs(ref, args.train, cfg_path, tokens, sequences, devices, workdir, "gdn", log, hf_bf16=own)
    print(f"gated deltanet ({args.layout}) vs transformers {transformers.__version__} Qwen3NextGatedDeltaNet: "
          f"{line} | {'OK' if ok else 'FAILED'}", flush=True)
    if not args.keep and not args.workdir and ok:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
