"""Multi-token prediction for scripts/hf_check.py: the mtp_llama case (Fast-LLM's MTP Llama,
model_type "mtp_llama"), whose reference transformers has no class for, so it is rebuilt from
transformers' Llama modules (MtpReference), and every prediction head's logits are compared
with ours (./train --dump-logits writes logits_head<j>.<i> for extra head j).
"""
import json
import os
import shutil

# Fast-LLM's MTP Llama (model_type "mtp_llama"): transformers has no class for it, so the
# reference is rebuilt from its Llama modules (MtpReference); every head's logits compared.
CONFIGS = {
    "mtp_llama": """
family = "llama"
vocab_size = 257
hidden_size = 256
num_layers = 3
num_heads = 4
num_kv_heads = 2
ffn_hidden_size = 448
rope_theta = 50000.0
norm_eps = 1e-6
prediction_heads = 2
prediction_loss_weights = [1.0, 0.5, 0.5]
""",
}


def read_folder_tensors(folder):
    """{name: torch tensor} of a Hugging Face folder's safetensors (one file or an index)."""
    from safetensors.torch import load_file

    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_file(os.path.join(folder, "model.safetensors"))
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(load_file(os.path.join(folder, name)))
    return out


class MtpReference:
    """Fast-LLM's MTPLlamaForCausalLM (fast_llm_external_models/mtp_llama) rebuilt from
    transformers' Llama modules, since transformers has no class for it: LlamaForCausalLM holds
    the trunk (layers[:-1]), head 0 (its last layer, its norm = mtp_norms.0, lm_head), and each
    extra head j is a LlamaDecoderLayer on the trunk's output (the last layer's input), a
    LlamaRMSNorm (mtp_norms.j) and the shared lm_head. Weights come from a folder in that format
    (ours exported, or written by save())."""

    def __init__(self, folder):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

        with open(os.path.join(folder, "config.json")) as f:
            self.config_json = json.load(f)
        assert self.config_json["model_type"] == "mtp_llama", self.config_json["model_type"]
        self.heads = int(self.config_json["prediction_heads"])
        plain = {k: v for k, v in self.config_json.items()
                 if k not in ("prediction_heads", "auto_map", "architectures", "model_type")}
        config = LlamaConfig(**plain)
        config._attn_implementation = "eager"
        self.tied = bool(config.tie_word_embeddings)
        L = config.num_hidden_layers
        self.lm = LlamaForCausalLM(config).float()
        self.layers = torch.nn.ModuleList([LlamaDecoderLayer(config, layer_idx=L + j) for j in range(self.heads - 1)])
        self.norms = torch.nn.ModuleList([LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
                                          for _ in range(self.heads - 1)])
        for module in (self.layers, self.norms):
            module.float()
        self.load(read_folder_tensors(folder))

    def load(self, tensors):
        """Our (Fast-LLM's) names to the modules' parameters; every tensor used, every parameter set."""
        lm, extra = {}, {}
        for name, t in tensors.items():
            if name == "model.mtp_norms.0.weight":
                lm["model.norm.weight"] = t
            elif name.startswith("model.mtp_norms."):
                extra["norms." + str(int(name.split(".")[2]) - 1) + ".weight"] = t
            elif name.startswith("model.mtp_heads."):
                extra["layers." + name[len("model.mtp_heads."):]] = t
            else:
                lm[name] = t
        missing, unexpected = self.lm.load_state_dict(lm, strict=False)
        assert not unexpected, f"unexpected tensors {unexpected}"
        assert set(missing) <= ({"lm_head.weight"} if self.tied else set()), f"missing tensors {missing}"
        if self.tied:
            self.lm.tie_weights()
        heads = torch_module_dict(self.layers, self.norms)
        missing, unexpected = heads.load_state_dict(extra, strict=True)
        assert not missing and not unexpected, (missing, unexpected)

    def state(self):
        """The folder's tensors (Fast-LLM's names) of the current weights."""
        out = {}
        for name, t in self.lm.state_dict().items():
            if name == "lm_head.weight" and self.tied:
                continue
            if "rotary_emb" in name:
                continue
            out["model.mtp_norms.0.weight" if name == "model.norm.weight" else name] = t
        for name, t in torch_module_dict(self.layers, self.norms).state_dict().items():
            part, index, rest = name.split(".", 2)
            if part == "layers":
                out[f"model.mtp_heads.{index}.{rest}"] = t
            else:
                out[f"model.mtp_norms.{int(index) + 1}.{rest}"] = t
        return out

    def randomize(self, seed):
        """Random weights (norm weights around 1), as save_random_hf_model does."""
        import torch

        torch.manual_seed(seed)
        with torch.no_grad():
            for module in (self.lm, self.layers, self.norms):
                for name, p in module.named_parameters():
                    p.normal_(1.0 if "norm" in name else 0.0, 0.1 if p.dim() < 2 else 0.05)
        if self.tied:
            self.lm.tie_weights()

    def save(self, out_dir):
        from safetensors.torch import save_file

        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(self.config_json, f, indent=2)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state().items()},
                  os.path.join(out_dir, "model.safetensors"),
                  metadata={"format": "pt"})

    def logits(self, sequences, device):
        """[head][sequence] -> (T, V) float32 numpy: head 0 the next-token head's, then each extra head's."""
        import torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        for module in (self.lm, self.layers, self.norms):
            module.to(device).eval()
        out = [[] for _ in range(self.heads)]
        with torch.no_grad():
            for seq in sequences:
                ids = torch.tensor([seq], dtype=torch.long, device=device)
                # The trunk's output is the last layer's input, taken by a hook (whatever
                # hidden_states holds in this transformers version).
                captured = {}

                def keep_input(module, args, kwargs):
                    captured["h"] = args[0] if args else kwargs["hidden_states"]

                hook = self.lm.model.layers[-1].register_forward_pre_hook(keep_input, with_kwargs=True)
                try:
                    r = self.lm(input_ids=ids)
                finally:
                    hook.remove()
                out[0].append(r.logits[0].float().cpu().numpy())
                h = captured["h"]
                T = len(seq)
                pos = torch.arange(T, device=device)[None]
                pe = self.lm.model.rotary_emb(h, pos)
                mask = torch.full((T, T), float("-inf"), device=device).triu(1)[None, None]
                for j, (layer, norm) in enumerate(zip(self.layers, self.norms)):
                    y = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=pe)
                    y = y[0] if isinstance(y, tuple) else y
                    out[j + 1].append(self.lm.lm_head(norm(y))[0].float().cpu().numpy())
        return out


def torch_module_dict(layers, norms):
    import torch

    return torch.nn.ModuleDict({"layers": layers, "norms": norms})


def mtp_vs(legs, ref_heads, train, cfg, tokens, sequences, devices, workdir, tag, log, errors=None):
    """ours_vs for every head of an MTP model: 'head 0 cpu-f32 ...; head 1 ...' and whether all pass;
    errors receives head 0's max_abs per device (the one generation uses)."""
    parts, ok = [], True
    for head, ref in enumerate(ref_heads):
        errs = {}
        line, good = legs.ours_vs(ref, train, cfg, tokens, sequences, devices, workdir, f"{tag}-head{head}", log,
                                  errs, head=head)
        parts.append(f"head {head} {line}")
        ok &= good
        if errors is not None and head == 0:  # (generation reads head 0 only)
            errors.update(errs)
    return "; ".join(parts), ok


def mtp_check(family, export, args, cfg, tokens, sequences, devices, ref_device, workdir, data, log, parts, legs):
    """The export, import and generate legs of an MTP family against MtpReference; appends each
    leg's line to parts, then "OK" or "FAILED". legs: hf_check.py's ours_vs, generate_vs and
    sequence_length."""
    ok = True
    ref = MtpReference(export)
    line, good = mtp_vs(legs, ref.logits(sequences, ref_device), args.train, cfg, tokens, sequences, devices, workdir,
                        family + "-export", log)
    parts.append("export " + line)
    ok &= good
    # The other direction: random weights in the reference, saved in the folder format, read by
    # model.init_from.
    hf_dir = os.path.join(workdir, "hf", family)
    ref.randomize(args.seed)
    ref.save(hf_dir)
    cfg_in = os.path.join(workdir, f"{family}-import.toml")
    with open(cfg_in, "w") as f:
        f.write(f'[run]\nname = "{family}-import"\noutput_dir = "{workdir}/runs"\n'
                f'[model]\ninit_from = "{hf_dir}"\n[data]\ntrain = [{{ path = "{data}" }}]\n'
                f'sequence_length = {legs.sequence_length(family)}\n[training]\nsteps = 1\n')
    shutil.rmtree(os.path.join(workdir, "runs", family + "-import"), ignore_errors=True)
    errors = {}
    line, good = mtp_vs(legs, ref.logits(sequences, ref_device), args.train, cfg_in, tokens, sequences, devices, workdir,
                        family + "-import", log, errors)
    parts.append("import " + line)
    ok &= good
    # Generation uses the next-token head only: transformers' LlamaForCausalLM of head 0.
    line, good = legs.generate_vs(ref.lm, hf_dir, args.train, cfg_in, devices, ref_device, log, errors)
    parts.append("generate " + line)
    ok &= good
    parts.append("OK" if ok else "FAILED")
