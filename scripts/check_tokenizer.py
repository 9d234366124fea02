#!/usr/bin/env python3
"""Checks the engine's tokenizer (csrc/tokenizer) against Hugging Face `tokenizers` on published
tokenizer.json files: GPT-2's, Llama 3's, Qwen2's, Mistral's, TinyLlama's, ... (files too big to
check in). For each path (a tokenizer.json or a model folder holding one) it encodes a few hundred
strings with Python (encode(text, add_special_tokens=False), decode(ids, skip_special_tokens=False)),
and, where `transformers` is installed and PATH is a model folder, takes BOS / EOS / whether a
prompt gets BOS from AutoTokenizer; it writes the expectations to a JSON file and runs the C++ test case
"tokenizer: published tokenizer.json files agree with tokenizers" on it.

  scripts/check_tokenizer.py [--build build] PATH...
  scripts/check_tokenizer.py --hf-cache        every tokenizer.json under ~/.cache/huggingface/hub

Needs `pip install tokenizers` and a built test binary ($BUILD/engine_tests, default build/). Prints
per file the cases checked and ends with the C++ test's summary; exit status 0 when all agree.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "tokenizer"))


def strings():
    import make_expected  # the fixture strings: English, code, numbers, whitespace, CJK, emoji, ...
    out = make_expected.test_strings()
    out += ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>",
            "<s>[INST] What is 2 + 2? [/INST]", "</s><unk><pad>", "  def __init__(self):\n        pass\n" * 3,
            open(os.path.join(HERE, "..", "README.md"), encoding="utf-8").read()[:20000]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--hf-cache", action="store_true", help="every tokenizer.json in the Hugging Face hub cache")
    args = ap.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("check_tokenizer.py: needs the tokenizers package (pip install tokenizers)")
    paths = list(args.paths)
    if args.hf_cache:
        hub = os.environ.get("HF_HUB_CACHE", os.path.expanduser("~/.cache/huggingface/hub"))
        paths += sorted(os.path.dirname(f) for f in glob.glob(os.path.join(hub, "*", "snapshots", "*", "tokenizer.json")))
    if not paths:
        sys.exit("check_tokenizer.py: no tokenizer.json given (or found with --hf-cache)")
    cases, configs = [], []
    texts = strings()
    for p in paths:
        f = os.path.join(p, "tokenizer.json") if os.path.isdir(p) else p
        tok = Tokenizer.from_file(f)
        tok.no_truncation()
        tok.no_padding()
        n = 0
        for s in texts:
            ids = tok.encode(s, add_special_tokens=False).ids
            cases.append({"path": f, "text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
            n += 1
        print(f"{f}: {n} strings, vocab {tok.get_vocab_size(with_added_tokens=True)}")
        if os.path.isdir(p):
            try:
                from transformers import AutoTokenizer
            except ImportError:
                print("  (no transformers: BOS / EOS not checked)")
                continue
            at = AutoTokenizer.from_pretrained(p)
            first = at("hello").input_ids[:1]
            configs.append({"path": p, "bos": at.bos_token_id, "eos": at.eos_token_id,
                            "add_bos": at.bos_token_id is not None and first == [at.bos_token_id]})
            print(f"  transformers: bos {at.bos_token_id}, eos {at.eos_token_id}, add_bos {configs[-1]['add_bos']}")
    exe = os.path.join(args.build, "engine_tests")
    if not os.path.exists(exe):
        sys.exit(f"check_tokenizer.py: {exe} not found (make, or --build DIR)")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as out:
        json.dump({"cases": cases, "configs": configs}, out)
    env = dict(os.environ, TOKENIZER_EXPECTED=out.name)
    rc = subprocess.call([exe, "-tc=tokenizer: published*"], env=env, cwd=os.path.join(HERE, ".."))
    os.unlink(out.name)
    sys.exit(rc)


if __name__ == "__main__":
    main()
