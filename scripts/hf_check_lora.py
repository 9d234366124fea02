"""LoRA for scripts/hf_check.py (--families lora; needs `peft`): trains a llama base, exports it,
trains LoRA adapters on it (model.init_from, [lora] on all seven linears) and compares our logits of
the adapted model (--dump-logits) with PEFT's (PeftModel.from_pretrained on the base folder and our
--export-peft adapter), and with transformers' on our merged --export-hf.
"""
import os
import shutil

LORA_KEYS = '''
[lora]
rank = 4
alpha = 8
targets = ["q", "k", "v", "o", "gate", "up", "down"]
'''


def lora_case(h, train, data, workdir, devices, ref_device, tokens, sequences, steps, log):
    """The `lora` case: parts of its line and whether all passed. h is hf_check itself (its helpers)."""
    import torch
    from peft import PeftModel  # only this case needs peft

    parts, ok = [], True
    base_cfg = os.path.join(workdir, "lora-base.toml")
    with open(base_cfg, "w") as f:
        f.write(h.config_text("llama", data, workdir, "auto", steps).replace('name = "llama"', 'name = "lora-base"'))
    shutil.rmtree(os.path.join(workdir, "runs", "lora-base"), ignore_errors=True)
    h.run([train, base_cfg], log)
    base = os.path.join(workdir, "export", "lora-base")
    h.run([train, base_cfg, "--export-hf", base], log)
    cfg = os.path.join(workdir, "lora.toml")
    text = h.config_text("llama", data, workdir, "auto", steps).replace('name = "llama"', 'name = "lora"')
    text = text.replace("[model]\n", f'[model]\ninit_from = "{base}"\n').replace("lr = 3e-3", "lr = 2e-2")
    with open(cfg, "w") as f:
        f.write(text + LORA_KEYS)
    shutil.rmtree(os.path.join(workdir, "runs", "lora"), ignore_errors=True)
    h.run([train, cfg], log)
    adapter = os.path.join(workdir, "export", "lora-adapter")
    h.run([train, cfg, "--export-peft", adapter], log)
    merged = os.path.join(workdir, "export", "lora-merged")
    h.run([train, cfg, "--export-hf", merged], log)
    peft_model = PeftModel.from_pretrained(h.load_hf(base), adapter).to(torch.float32)
    ref = h.hf_logits(base, sequences, ref_device, model=peft_model)
    base_ref = h.hf_logits(base, sequences, ref_device)
    moved = h.compare(base_ref, ref)[1]  # how far the adapters moved the model: must be visible
    line, good = h.ours_vs(ref, train, cfg, tokens, sequences, devices, workdir, "lora-peft", log)
    parts.append(f"peft {line} (adapters move the logits by rel_rms {moved:.1e})")
    ok &= good and moved > 10 * h.TOLERANCE["cpu"]
    ref = h.hf_logits(merged, sequences, ref_device)
    line, good = h.ours_vs(ref, train, cfg, tokens, sequences, devices, workdir, "lora-merged", log)
    parts.append("merged " + line)
    ok &= good
    return parts, ok
