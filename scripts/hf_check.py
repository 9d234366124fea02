#!/usr/bin/env python3
"""Checks the Hugging Face export and import of every model family against `transformers`.

For each family (gpt2, llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, mamba, mamba2 and
mtp_llama: a llama with two extra prediction heads, whose every head's logits are compared with a
reference made of transformers' Llama modules, MtpReference) and the llama cases with RoPE scaling
(llama-linear, llama-llama3, llama-yarn: model.rope_scaling, config.json's rope_scaling /
rope_parameters; a pretraining context of 32 and a 120-token sequence, so the llama3 and yarn
ramps fall inside the head dims and the positions pass the original context):
  export  trains a small model for a few steps with ./train (so the weights are no longer the
          init), exports it with `./train CONFIG --export-hf`, loads the export with
          transformers' AutoModelForCausalLM and runs the same token sequences through both
          (ours through `./train CONFIG --dump-logits`);
  import  builds a model with transformers from the export's config.json with random weights
          (norm weights and biases too), saves it with save_pretrained, starts ./train from it
          (model.init_from) and compares the logits the same way;
  generate  greedy generation from the imported model: `./train CONFIG --generate IDS
          --temperature 0` (data.tokenizer = "ids") against transformers' model.generate(
          do_sample=False) for two prompts, one long enough that the sequence passes the sliding
          windows;
and prints one line per family:

    gpt2     export cpu-f32 max_abs 6.0e-07 rel_rms 1.4e-07, cuda-bf16 ... | import cpu-f32 ... |
             generate cpu-f32 48/48, cuda-bf16 48/48 | OK

Greedy output must equal transformers' token for token. Where two ids' logits are within the
backend's rounding of each other (a near tie) either pick is right: the first difference then
passes when transformers' logit gap there (between its pick and ours) is at most twice the
largest logit error the import check measured for that backend on the same model (each of the
two logits may be off by that much), and the rest of the sequence is not compared
("cuda-bf16 31/48, then a near tie (gap 4.1e-02 <= 2 x 5.0e-02)").

The reference is transformers in float32 (eager attention, no TF32). Our logits are compared on
the CPU backend (f32: tolerance rel_rms 1e-4) and, when a GPU is visible and ./train was built
with CUDA, on the GPU backend (bf16 compute: tolerance rel_rms 3e-2, or transformers' own bf16
run's rel_rms against its f32 where that is larger, printed beside ours: a router near a tie
picks other experts in bf16 on either side). rel_rms = rms(ours - ref) / rms(ref). Exit code 0
when every family passes.

The opt-in case `lora` (--families lora; needs `peft`) trains a llama base, exports it, trains
LoRA adapters on it (model.init_from, [lora] on all seven linears) and compares our logits of the
adapted model (--dump-logits) with PEFT's (PeftModel.from_pretrained on the base folder and our
--export-peft adapter), and with transformers' on our merged --export-hf (hf_check_lora.py).

    python3 scripts/hf_check.py                 # all families, builds ./train first if missing
    python3 scripts/hf_check.py --families qwen2 --keep --workdir /tmp/hf-check

Needs torch, transformers and numpy (not needed by the engine itself).
"""
import argparse
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import types

import hf_check_families
import hf_check_lora
import hf_check_mtp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAMILIES = dict(hf_check_families.FAMILIES)
FAMILIES.update(hf_check_mtp.CONFIGS)  # mtp_llama: multi-token prediction (hf_check_mtp.py)

TOLERANCE = {"cpu": 1e-4, "cuda": 3e-2}
# Cases with a longer context: data.sequence_length, and one more sequence of LONG_TOKENS.
LONG_CONTEXT = {"llama-linear": 128, "llama-llama3": 128, "llama-yarn": 128}
LONG_TOKENS = 120


def sequence_length(family):
    return LONG_CONTEXT.get(family, 64)
GENERATE_TOKENS = 24


def run(cmd, log, env=None):
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if r.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{tail}")


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (F32 and I32 tensors)."""
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        dtype = {"F32": np.float32, "I32": np.int32}[t["dtype"]]
        out[name] = np.frombuffer(data[8 + n + begin:8 + n + end], dtype=dtype).reshape(t["shape"])
    return out


def config_text(family, data_prefix, workdir, device, steps):
    return f"""[run]
name = "{family}"
output_dir = "{workdir}/runs"
seed = 7
device = "{device}"
log_every = 1

[model]
{FAMILIES[family].strip()}

[data]
train = [{{ path = "{data_prefix}" }}]
sequence_length = {sequence_length(family)}

[batch]
micro_batch_size = 4
global_batch_size = 8

[optimizer]
lr = 3e-3
warmup_steps = 1

[training]
steps = {steps}
checkpoint_every = {steps}
"""


def load_hf(model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers < 4.56 names it torch_dtype
        return AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")


def hf_logits(model_dir, sequences, device, model=None):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = (model if model is not None else load_hf(model_dir)).to(device).eval()
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], dtype=torch.long, device=device)
            out.append(model(input_ids=ids).logits[0].float().cpu().numpy())
    return out


def hf_bf16_error(model_dir, sequences, ref, model=None):
    """rel_rms of transformers' own bf16 run (on the GPU) against its f32 reference `ref`: what
    bf16 costs the reference itself, the bound ours is held to where it exceeds TOLERANCE."""
    import copy

    import torch

    base = model if model is not None else load_hf(model_dir)
    bf16 = copy.deepcopy(base).to(torch.bfloat16)
    out = hf_logits(model_dir, sequences, "cuda", model=bf16)
    del bf16
    return compare(out, ref)[1]


def save_random_hf_model(export_dir, out_dir, seed):
    """A transformers model of the export's config with random weights, saved with save_pretrained."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(export_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name or "ln_" in name else 0.0, 0.1 if p.dim() < 2 else 0.05)
    shutil.rmtree(out_dir, ignore_errors=True)
    model.save_pretrained(out_dir)
    return model


def ours_vs(ref, train, cfg, tokens, sequences, devices, workdir, tag, log, errors=None, hf_bf16=None, head=0):
    """'cpu-f32 max_abs .. rel_rms .., cuda-bf16 ...' and whether all are within tolerance;
    errors (a dict, when given) receives each device's max_abs. hf_bf16: transformers' own bf16
    rel_rms against its f32 (hf_bf16_error); the GPU tolerance is the larger of it and
    TOLERANCE["cuda"]. head: which prediction head's logits of the dump (multi-token prediction)."""
    parts, ok = [], True
    for dev in devices:
        out = os.path.join(workdir, f"logits-{tag}-{dev}.safetensors")
        run([train, cfg, f"run.device={dev}", "--dump-logits", tokens, out], log)
        got = read_safetensors(out)
        key = "logits" if head == 0 else f"logits_head{head}"
        ours = [got[f"{key}.{i}"] for i in range(len(sequences))]
        for i, s in enumerate(sequences):
            assert list(got[f"tokens.{i}"]) == s, "token mismatch in the dump"
            assert ours[i].shape == ref[i].shape, f"shape {ours[i].shape} vs {ref[i].shape}"
        max_abs, rel = compare(ours, ref)
        if errors is not None:
            errors[dev] = max_abs
        tol = TOLERANCE[dev] if dev == "cpu" or hf_bf16 is None else max(TOLERANCE[dev], hf_bf16)
        good = rel <= tol
        ok &= good
        name = "cpu-f32" if dev == "cpu" else "cuda-bf16"
        own = f" (transformers bf16 {hf_bf16:.1e})" if dev != "cpu" and hf_bf16 is not None else ""
        parts.append(f"{name} max_abs {max_abs:.1e} rel_rms {rel:.1e}{own}" + ("" if good else " (too large)"))
    return ", ".join(parts), ok


def hf_greedy(model, prompt, device, new_tokens):
    """transformers' greedy continuation of `prompt` (the new ids; shorter when it met its EOS)."""
    import torch

    model = model.to(device).eval()
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                             max_new_tokens=new_tokens, pad_token_id=0 if pad is None else pad)
    return out[0, len(prompt):].tolist()


def ours_greedy(train, cfg, dev, prompt, new_tokens, log):
    """Our greedy continuation: the last stdout line of ./train --generate is every id, prompt first."""
    cmd = [train, cfg, f"run.device={dev}", 'data.tokenizer="ids"', "--generate", ",".join(map(str, prompt)),
           "--temperature", "0", "--max-new-tokens", str(new_tokens)]
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    with open(log, "a") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    ids = [int(t) for t in r.stdout.strip().splitlines()[-1].split()]
    if ids[:len(prompt)] != prompt:
        raise RuntimeError(f"./train --generate printed {ids[:len(prompt)]}..., not the prompt {prompt}")
    return ids[len(prompt):]


def generate_vs(model, model_dir, train, cfg, devices, ref_device, log, errors):
    """'cpu-f32 48/48, cuda-bf16 48/48' (equal new ids of all) and whether every backend passes;
    errors: each device's largest logit error on this model (the import check's max_abs)."""
    import numpy as np

    rng = random.Random(99)
    prompts = [[rng.randrange(257) for _ in range(n)] for n in (5, 23)]
    refs = [hf_greedy(model, p, ref_device, GENERATE_TOKENS) for p in prompts]
    parts, ok = [], True
    for dev in devices:
        name = "cpu-f32" if dev == "cpu" else "cuda-bf16"
        equal, total, note, good = 0, 0, "", True
        for prompt, ref in zip(prompts, refs):
            ours = ours_greedy(train, cfg, dev, prompt, GENERATE_TOKENS, log)
            # transformers stops at its EOS; we (token ids, no EOS) go on: compare its length.
            total += len(ref)
            i = 0
            while i < len(ref) and i < len(ours) and ours[i] == ref[i]:
                i += 1
            equal += i
            if i == len(ref):
                continue
            if i == len(ours):
                good, note = False, f" (ours stopped after {len(ours)})"
                break
            logits = hf_logits(model_dir, [prompt + ref[:i]], ref_device, model=model)[0][-1].astype(np.float64)
            gap = float(logits[ref[i]] - logits[ours[i]])
            bound = f"{gap:.1e} <= 2 x {errors[dev]:.1e}"
            if gap <= 2 * errors[dev]:
                note += f", then a near tie (gap {bound})"
            else:
                good = False
                note = f" (differs at new token {i}: {ours[i]} vs {ref[i]}, gap {gap:.1e} > 2 x {errors[dev]:.1e})"
                break
        ok &= good
        parts.append(f"{name} {equal}/{total}{note}")
    return ", ".join(parts), ok


def compare(ours, ref):
    import numpy as np

    diff = np.concatenate([(a.astype(np.float64) - b).ravel() for a, b in zip(ours, ref)])
    scale = np.sqrt(np.mean(np.concatenate([b.astype(np.float64).ravel() for b in ref]) ** 2))
    return float(np.max(np.abs(diff))), float(np.sqrt(np.mean(diff ** 2)) / max(scale, 1e-30))


def train_has_cuda(train):
    """A GPU is visible and ./train was built with CUDA (it links the CUDA runtime)."""
    import torch

    if not torch.cuda.is_available():
        return False
    return b"libcudart" in subprocess.run(["ldd", train], capture_output=True).stdout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default: all)")
    p.add_argument("--train", default=os.path.join(ROOT, "train"), help="the train program")
    p.add_argument("--steps", type=int, default=4, help="training steps before the export")
    p.add_argument("--workdir", help="where runs, exports and logs go (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--seed", type=int, default=11, help="seed of the import leg's random transformers weights")
    p.add_argument("--cpu-only", action="store_true", help="skip the GPU backend even when there is a GPU")
    args = p.parse_args()

    families = [f for f in args.families.split(",") if f]
    for f in families:
        if f not in FAMILIES and f != "lora":
            sys.exit(f"unknown family {f} (known: {', '.join(FAMILIES)}, and the case lora)")
    try:
        import numpy  # noqa: F401
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"hf_check.py needs torch, transformers and numpy: {e}")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    if not os.path.exists(args.train):
        print(f"building {args.train} (make -j{os.cpu_count()})", flush=True)
        subprocess.run(["make", f"-j{os.cpu_count()}", "train"], cwd=ROOT, check=True)

    workdir = args.workdir or tempfile.mkdtemp(prefix="hf-check.")
    os.makedirs(workdir, exist_ok=True)
    log = os.path.join(workdir, "log.txt")
    devices = ["cpu"] + (["cuda"] if not args.cpu_only and train_has_cuda(args.train) else [])
    ref_device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; ours on {', '.join(devices)}; "
          f"reference f32 on {ref_device}; log {log}", flush=True)

    # Byte-level data (vocabulary 257) from the demo corpus.
    data = os.path.join(workdir, "data", "demo")
    if not os.path.exists(data + ".idx"):
        os.makedirs(os.path.dirname(data), exist_ok=True)
        corpus = os.path.join(workdir, "data", "corpus.jsonl")
        run([sys.executable, "scripts/make_demo_corpus.py", "--documents", "400", corpus], log)
        run([sys.executable, "scripts/prepare_data.py", corpus, "--output", data], log)

    rng = random.Random(1234)
    base_sequences = [[rng.randrange(257) for _ in range(n)] for n in (57, 33)]
    long_sequence = [rng.randrange(257) for _ in range(LONG_TOKENS)]

    failed = 0
    for family in families:
        parts, ok = [], True
        sequences = base_sequences + ([long_sequence] if family in LONG_CONTEXT else [])
        tokens = os.path.join(workdir, f"tokens-{family}.txt")
        with open(tokens, "w") as f:
            for s in sequences:
                f.write(" ".join(map(str, s)) + "\n")
        try:
            if family == "lora":
                parts, ok = hf_check_lora.lora_case(sys.modules[__name__], args.train, data, workdir, devices,
                                                    ref_device, tokens, sequences, args.steps, log)
            else:
                devs = ["cpu"] if family in hf_check_families.CPU_ONLY else devices
                cfg = os.path.join(workdir, f"{family}.toml")
                with open(cfg, "w") as f:
                    f.write(config_text(family, data, workdir,
                                        "cpu" if family in hf_check_families.CPU_ONLY else "auto", args.steps))
                shutil.rmtree(os.path.join(workdir, "runs", family), ignore_errors=True)
                run([args.train, cfg], log)
                export = os.path.join(workdir, "export", family)
                run([args.train, cfg, "--export-hf", export], log)
                if family in hf_check_mtp.CONFIGS:
                    legs = types.SimpleNamespace(ours_vs=ours_vs, generate_vs=generate_vs,
                                                 sequence_length=sequence_length)
                    hf_check_mtp.mtp_check(family, export, args, cfg, tokens, sequences, devs, ref_device, workdir,
                                           data, log, parts, legs)
                    ok &= parts.pop() != "FAILED"
                else:
                    ref = hf_logits(export, sequences, ref_device)
                    own = hf_bf16_error(export, sequences, ref) if "cuda" in devs else None
                    line, good = ours_vs(ref, args.train, cfg, tokens, sequences, devs, workdir, family + "-export", log,
                                         hf_bf16=own)
                    parts.append("export " + line)
                    ok &= good
                    # The other direction: a checkpoint written by transformers, read by model.init_from.
                    hf_dir = os.path.join(workdir, "hf", family)
                    model = save_random_hf_model(export, hf_dir, seed=args.seed)
                    ref = hf_logits(hf_dir, sequences, ref_device, model=model)
                    cfg_in = os.path.join(workdir, f"{family}-import.toml")
                    with open(cfg_in, "w") as f:
                        f.write(f'[run]\nname = "{family}-import"\noutput_dir = "{workdir}/runs"\n'
                                f'[model]\ninit_from = "{hf_dir}"\n[data]\ntrain = [{{ path = "{data}" }}]\n'
                                f'sequence_length = {sequence_length(family)}\n[training]\nsteps = 1\n')
                    shutil.rmtree(os.path.join(workdir, "runs", family + "-import"), ignore_errors=True)
                    errors = {}
                    own = hf_bf16_error(hf_dir, sequences, ref, model=model) if "cuda" in devs else None
                    line, good = ours_vs(ref, args.train, cfg_in, tokens, sequences, devs, workdir, family + "-import", log,
                                         errors, hf_bf16=own)
                    parts.append("import " + line)
                    ok &= good
                    # Greedy generation from the same model, both sides with their caches.
                    if family not in hf_check_families.NO_GENERATE:
                        line, good = generate_vs(model, hf_dir, args.train, cfg_in, devs, ref_device, log, errors)
                        parts.append("generate " + line)
                        ok &= good
        except Exception as e:  # one line per family, whatever went wrong
            ok = False
            parts.append("error: " + str(e).strip().splitlines()[0][:300] + f" (see {log})")
        failed += not ok
        print(f"{family:9s} " + " | ".join(parts) + (" | OK" if ok else " | FAILED"), flush=True)
    if not args.keep and not args.workdir and failed == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
