#!/usr/bin/env python3
"""Writes the tokenizer test fixtures under tests/tokenizer/data/ with the Python `tokenizers`
package (pip install tokenizers), so the C++ tests (tests/tokenizer/test_tokenizer.cpp) run
without Python:

  gpt2.json        byte-level BPE, ByteLevel pre-tokenizer with GPT-2's built-in regex
  llama3.json      byte-level BPE, Split with Llama 3's pattern + ByteLevel, ignore_merges,
                   a TemplateProcessing post-processor prepending <|begin_of_text|>
  qwen2.json       as llama3 with Qwen2's pattern (\\p{N} one at a time), the NFC normalizer and
                   a non-special, normalized added token
  spm.json         SentencePiece-style BPE (Llama 2): Prepend + Replace normalizer, byte fallback
                   <0xNN> tokens, unk with fuse_unk, the Replace/ByteFallback/Fuse/Strip decoder;
                   merges written as "a b" strings
  spm_meta.json    the same model with the Metaspace pre-tokenizer (prepend_scheme "first",
                   split false) and decoder (newer Llama / Mistral conversions); merges as pairs
  expected.json    for each tokenizer and test string: ids of encode(text, add_special_tokens=False),
                   whether decode(ids) == text, and decode(ids) where not; plus decode cases of
                   arbitrary id lists (partial UTF-8: U+FFFD)

  tests/tokenizer/make_expected.py    (deterministic: fixed seeds; run from the repository root)
"""
import json
import os
import random

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = "tests/tokenizer/data"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

ENGLISH = ["The quick brown fox jumps over the lazy dog.", "It's a truth universally acknowledged, that a single man",
           "in possession of a good fortune, must be in want of a wife.", "We'll see; they've said I'd come, you're late!",
           "HELLO World -- don't SHOUT.", "Numbers: 3.14159, 2718281828, 1,000,000 and 42nd place.",
           "e-mail: someone@example.com; url: https://example.org/path?q=1&r=2#frag"]
CODE = ["def f(x):\n    return x * 2  # double\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }\n",
        "if __name__ == '__main__':\n\tmain()\n", "SELECT id, name FROM users WHERE age >= 18;\n",
        "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; }\n", "x = {'a': [1, 2], \"b\": None}\r\n"]
OTHER = ["日本語のテキストです。東京は大きい。", "中文文本，包含标点符号！", "한국어 텍스트입니다", "Привет, мир! Съешь же ещё",
         "Γειά σου Κόσμε", "مرحبا بالعالم", "नमस्ते दुनिया", "שלום עולם", "emoji 😀😃🎉 👩‍👩‍👧 🇫🇷 done",
         "café naïve résumé Ångström", "cafe\u0301 n\u0303 a\u0308\u0304", "ﬁ ﬂ ſt Kelvin K", "tab\tsep\tvalues\n",
         "   leading and trailing   ", "line1\n\nline2\r\n\r\nline3", "mixed日本English123中文"]


def corpus(seed=0, n=3000):
    rnd = random.Random(seed)
    pool = ENGLISH + CODE + OTHER
    lines = []
    for _ in range(n):
        k = rnd.randint(1, 4)
        lines.append(" ".join(rnd.choice(pool) for _ in range(k)) + rnd.choice(["", " ", "  ", "\n", "\t", "   \n"]))
    return lines


def random_text(rnd):
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x600, 0x6FF),
              (0x900, 0x97F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x4FFF),
              (0xAC00, 0xAD00), (0xFB00, 0xFB06), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1E5D0, 0x1E5FF),
              (0x10000, 0x1007F), (0xE000, 0xE010), (0x1D400, 0x1D4FF), (0x9, 0xD), (0x1C, 0x1F), (0x85, 0x85)]
    out = []
    for _ in range(rnd.randint(1, 30)):
        a, b = rnd.choice(blocks)
        out.append(chr(rnd.randint(a, b)))
    return "".join(out)


def test_strings():
    rnd = random.Random(1)
    fixed = ["", " ", "  ", "\n", "a", "Hello", " Hello", "Hello world", "hello  world", "hello   world ",
             "   ", "\t\t", "\n\n\n", " \n \n", "x \n\ny", "a    b", "don't", "DON'T", "I'M", "you'LL", "x'ſt",
             "it's 's 't", "''''", "12345678", "1 22 333 4444", "3.14", "١٢٣ ४५६ ½ Ⅻ", "$100.00!!", "...",
             "a\u0301", "\u0301", "e\u0308\u0301", "\u1100\u1161\u11A8", "한", "\uAC00\u11A8", "Å", "\u212B",
             "<|endoftext|>", "a<|endoftext|>b", " <|endoftext|> ", "<|endoftext|><|endoftext|>",
             "<|end", "<|begin_of_text|>Hi<|end_of_text|>", "<s>hello</s>", " <s> ", "<unk>", "hi <s>there",
             "<0x41>", "▁", "▁▁hello", "Ġhello", "\u00A0nbsp\u00A0", "\u3000ideographic", "\u2028\u2029",
             "\x1c\x1d\x1e\x1f", "\x85", "\x00nul", "\x7f", "𝐀𝐁𝐂", "\U0001E5D0\U0001E5D1", "\U00016EA0",
             "\uE000private", "\uFFFD", "\uFEFFbom", "​zero​width", "mixed日本English123中文", "🤖🤖🤖",
             "the\nmodel\n", "  indented\n    more\n", "a" * 300, " " * 300, "ab" * 200, "1" * 50,
             "special_word", "special_word here", "specialwords"]
    strings = fixed + ENGLISH + CODE + OTHER
    strings += [" ".join(rnd.choice(ENGLISH + CODE + OTHER) for _ in range(rnd.randint(1, 3))) for _ in range(80)]
    strings += [random_text(rnd) for _ in range(150)]
    return strings


def byte_level(pattern, name, normalizer=None, extra=()):
    tok = Tokenizer(models.BPE(ignore_merges=pattern is not None))
    if normalizer:
        tok.normalizer = normalizer
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>"] if pattern is None else ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    if pattern is not None:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    for t in extra:
        tok.add_tokens([t])
    tok.save(os.path.join(OUT, name))
    return tok


def sentencepiece(name, metaspace, legacy_merges):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<unk>", "<s>", "</s>"], min_frequency=2,
                                  show_progress=False, limit_alphabet=150)
    tok.train_from_iterator(corpus(), trainer)
    j = json.loads(tok.to_str())
    # Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, then the learned vocab.
    old = j["model"]["vocab"]
    order = sorted(old, key=old.get)
    vocab = {}
    for t in order[:3] + [f"<0x{b:02X}>" for b in range(256)] + order[3:]:
        vocab.setdefault(t, len(vocab))
    j["model"]["vocab"] = vocab
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    if legacy_merges:
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    if metaspace:
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
        j["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    else:
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    text = json.dumps(j, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
        f.write(text)
    return Tokenizer.from_str(text)


def main():
    os.makedirs(OUT, exist_ok=True)
    toks = {
        "gpt2.json": byte_level(None, "gpt2.json"),
        "llama3.json": byte_level(LLAMA3, "llama3.json"),
        "qwen2.json": byte_level(QWEN2, "qwen2.json", normalizers.NFC(), extra=["special_word"]),
        "spm.json": sentencepiece("spm.json", metaspace=False, legacy_merges=True),
        "spm_meta.json": sentencepiece("spm_meta.json", metaspace=True, legacy_merges=False),
    }
    # Reload each saved file: the expectations come from what the C++ side reads.
    cases, decode_cases = [], []
    rnd = random.Random(2)
    for name in toks:
        tok = Tokenizer.from_file(os.path.join(OUT, name))
        for s in test_strings():
            ids = tok.encode(s, add_special_tokens=False).ids
            d = tok.decode(ids, skip_special_tokens=False)
            case = {"tokenizer": name, "text": s, "ids": ids, "roundtrip": d == s}
            if d != s:
                case["decoded"] = d
            cases.append(case)
        n = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(40):
            ids = [rnd.randrange(n) for _ in range(rnd.randint(1, 12))]
            decode_cases.append({"tokenizer": name, "ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "encode": cases, "decode": decode_cases}, f,
                  ensure_ascii=True, indent=0)
    print(f"{OUT}: {len(toks)} tokenizers, {len(cases)} encode cases, {len(decode_cases)} decode cases "
          f"(tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
