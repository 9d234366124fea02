#!/usr/bin/env python3
"""Writes the tokenizer test fixtures under tests/tokenizer/data/ with the Python `tokenizers`
package (pip install tokenizers), so the C++ tests (tests/tokenizer/test_tokenizer.cpp) run
without Python:

  gpt2.json        byte-level BPE, ByteLevel pre-tokenizer with GPT-2's built-in regex
  llama3.json      byte-level BPE, Split with Llama 3's pattern + ByteLevel, ignore_merges,
                   a TemplateProcessing post-processor prepending <|begin_of_text|>
  qwen2.json       as llama3 with Qwen2's pattern (\\p{N} one at a time), the NFC normalizer and
                   a non-special, normalized added token
  nemo.json        byte-level BPE with Mistral-Nemo's (Tekken's) pattern: \p{Lu} \p{Ll} \p{M} ...
  gpt2_prefix.json, split_variants.json   gpt2.json's model with ByteLevel's add_prefix_space, and
                   behind Split pre-tokenizers of every behavior (invert, String patterns)
  gpt2_strip.json  gpt2.json plus added tokens with lstrip / rstrip, a non-special one and one
                   made of several words
  spm.json         SentencePiece-style BPE (Llama 2): Prepend + Replace normalizer, byte fallback
                   <0xNN> tokens, unk with fuse_unk, the Replace/ByteFallback/Fuse/Strip decoder;
                   merges written as "a b" strings
  spm_meta.json    the same model with the Metaspace pre-tokenizer (prepend_scheme "first",
                   split false) and decoder (newer Llama / Mistral conversions); merges as pairs
  tests/fuzz/corpus/tokenizer/   seeds of the fuzz target: tiny tokenizers of each kind (u16 text
                   length, a text, the tokenizer.json) and broken variants
  expected.json    for each tokenizer and test string: ids of encode(text, add_special_tokens=False),
                   whether decode(ids) == text, and decode(ids) where not; plus decode cases of
                   arbitrary id lists (partial UTF-8: U+FFFD); NFC of every code point NFC changes
                   and of random mixes of combining marks, Hangul jamo and precomposed letters
                   (tokenizers' NFC normalizer)

  tests/tokenizer/make_expected.py    (run from the repository root; the test strings come from fixed
  seeds, but training breaks frequency ties in hash order, so a rerun may learn a slightly different
  vocab: the expectations are always computed from the files as saved)
"""
import json
import os
import random

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

OUT = "tests/tokenizer/data"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral-Nemo (Tekken) / GPT-4o style: case-aware words, marks, '/' after punctuation.
NEMO = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}|"
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
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
             "the\nmodel\n", "  indented\n    more\n", "a" * 300, " " * 300, "ab" * 200, "1" * 50, "HeLLo WoRLD/ x//y", "ǅungla ǈ", "ÀÉÎõü",
             "x <mask> y", "x<mask>y", "x   <mask>", "[SEP]   next", "a [SEP]\n\tb", "new token", "a new token b",
             "<both>", "  <both>  x", "<mask><mask>  <mask>", "[SEP][SEP] ",
             "special_word", "special_word here", "specialwords"]
    strings = fixed + ENGLISH + CODE + OTHER
    strings += [" ".join(rnd.choice(ENGLISH + CODE + OTHER) for _ in range(rnd.randint(1, 3))) for _ in range(80)]
    strings += [random_text(rnd) for _ in range(150)]
    return strings


def byte_level(pattern, name, normalizer=None, extra=(), vocab_size=900, alphabet=True, text=None):
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
    opts = dict(initial_alphabet=pre_tokenizers.ByteLevel.alphabet()) if alphabet else dict(limit_alphabet=30)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, min_frequency=2,
                                  show_progress=False, **opts)
    tok.train_from_iterator(text or corpus(), trainer)
    if pattern is not None:
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    for t in extra:
        tok.add_tokens([t])
    if name:
        tok.save(os.path.join(OUT, name))
    return tok


def sentencepiece(name, metaspace, legacy_merges, vocab_size=700, alphabet=150, text=None, byte_tokens=range(256)):
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], min_frequency=2,
                                  show_progress=False, limit_alphabet=alphabet)
    tok.train_from_iterator(text or corpus(), trainer)
    j = json.loads(tok.to_str())
    # Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, then the learned vocab.
    old = j["model"]["vocab"]
    order = sorted(old, key=old.get)
    vocab = {}
    for t in order[:3] + [f"<0x{b:02X}>" for b in byte_tokens] + order[3:]:
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
    text = json.dumps(j, ensure_ascii=False, indent=None if name is None else 1)
    if name:
        with open(os.path.join(OUT, name), "w", encoding="utf-8") as f:
            f.write(text)
    return Tokenizer.from_str(text)


def with_stripped_tokens(src, name):
    """gpt2.json plus added tokens exercising lstrip / rstrip / normalized matching."""
    tok = Tokenizer.from_file(os.path.join(OUT, src))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False)])
    tok.add_special_tokens([AddedToken("[SEP]", lstrip=False, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("new token", normalized=True), AddedToken("<both>", lstrip=True, rstrip=True)])
    tok.save(os.path.join(OUT, name))


def variants(src):
    """gpt2.json's model behind other pre-tokenizer settings: ByteLevel's add_prefix_space, and
    Split with each behavior, invert and a String pattern."""
    j = json.load(open(os.path.join(OUT, src), encoding="utf-8"))
    j["pre_tokenizer"]["add_prefix_space"] = True
    with open(os.path.join(OUT, "gpt2_prefix.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\d"}, "behavior": "Contiguous", "invert": False},
        {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"[aeiou]+"}, "behavior": "MergedWithNext", "invert": True},
        {"type": "Split", "pattern": {"String": "x"}, "behavior": "Removed", "invert": False},
        {"type": "Split", "pattern": {"Regex": r"(?:\p{Lu}|[.,;])"}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    with open(os.path.join(OUT, "split_variants.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)


def fuzz_seeds():
    """Tiny tokenizers (a few hundred bytes to ~2 KB) as the fuzz target's seeds, with broken variants."""
    d = "tests/fuzz/corpus/tokenizer"
    os.makedirs(d, exist_ok=True)
    small = ["hello world, hello there", "the cat sat on the mat 123", "日本 語 hello\n\n  x", "don't stop 42 !!"] * 20
    seeds = {
        "gpt2": (byte_level(None, None, vocab_size=60, alphabet=False, text=small), "hello <|endoftext|> 12"),
        "llama3": (byte_level(LLAMA3, None, vocab_size=60, alphabet=False, text=small), "I'm 1234 \n\n x"),
        "qwen2": (byte_level(QWEN2, None, normalizers.NFC(), vocab_size=60, alphabet=False, text=small), "cafe\u0301"),
        "nemo": (byte_level(NEMO, None, vocab_size=60, alphabet=False, text=small), "HeLLo World/"),
        "spm": (sentencepiece(None, False, True, vocab_size=50, alphabet=20, text=small, byte_tokens=range(0xE0, 0xF0)),
                "<s>hello 日本"),
        "spm_meta": (sentencepiece(None, True, False, vocab_size=50, alphabet=20, text=small, byte_tokens=range(0x60, 0x70)),
                     " the cat"),
    }
    def put(name, text, js):
        t = text.encode()
        with open(os.path.join(d, name), "wb") as f:
            f.write(len(t).to_bytes(2, "little") + t + js.encode())
    for name, (tok, text) in seeds.items():
        js = tok.to_str()
        put(name, text, js)
    js = json.loads(seeds["gpt2"][0].to_str())
    raw = seeds["gpt2"][0].to_str()
    put("bad_truncated", "hi", raw[: len(raw) // 2])
    bad = dict(js, model=dict(js["model"], type="WordPiece"))
    put("bad_model_type", "hi", json.dumps(bad))
    bad = dict(js, model=dict(js["model"], merges=js["model"]["merges"] + [["qqq", "zzz"]]))
    put("bad_merge_unknown", "hi", json.dumps(bad))
    bad = dict(js, model=dict(js["model"], vocab=dict(js["model"]["vocab"], h="x")))
    put("bad_vocab_type", "hi", json.dumps(bad))
    bad = dict(js, pre_tokenizer={"type": "Split", "pattern": {"Regex": "\\s*\\s*\\s*x|(?!a)[^a-c]{2,5}"},
                                  "behavior": "MergedWithNext", "invert": True})
    put("split_regex", "   aaa  x  bc" * 3, json.dumps(bad))


def main():
    os.makedirs(OUT, exist_ok=True)
    toks = {
        "gpt2.json": byte_level(None, "gpt2.json"),
        "llama3.json": byte_level(LLAMA3, "llama3.json"),
        "qwen2.json": byte_level(QWEN2, "qwen2.json", normalizers.NFC(), extra=["special_word"]),
        "nemo.json": byte_level(NEMO, "nemo.json"),
        "spm.json": sentencepiece("spm.json", metaspace=False, legacy_merges=True),
        "spm_meta.json": sentencepiece("spm_meta.json", metaspace=True, legacy_merges=False),
    }
    with_stripped_tokens("gpt2.json", "gpt2_strip.json")
    toks["gpt2_strip.json"] = None
    variants("gpt2.json")
    toks["gpt2_prefix.json"] = toks["split_variants.json"] = None
    fuzz_seeds()
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
    # NFC as tokenizers' normalizer has it (Unicode 9.0 data, older than its regex engine's).
    hf_nfc = normalizers.NFC().normalize_str
    nfc = []
    for cp in range(0x110000):
        if not 0xD800 <= cp < 0xE000 and hf_nfc(chr(cp)) != chr(cp):
            nfc.append([chr(cp), hf_nfc(chr(cp))])
    blocks = [(0x41, 0x7A), (0xC0, 0x24F), (0x300, 0x36F), (0x1100, 0x11FF), (0xAC00, 0xAC40), (0x1E00, 0x1EFF),
              (0x0900, 0x097F), (0x0B00, 0x0B7F), (0x3040, 0x30FF), (0x1F00, 0x1FFF), (0x0591, 0x05C7),
              (0x1DC0, 0x1DFF), (0x1E900, 0x1E95F), (0x1E5D0, 0x1E5FF), (0x10F30, 0x10F6F)]
    for _ in range(1500):
        t = "".join(chr(rnd.randint(*rnd.choice(blocks))) for _ in range(rnd.randint(1, 8)))
        nfc.append([t, hf_nfc(t)])
    # One case a line (diffs stay readable), UTF-8 as is.
    with open(os.path.join(OUT, "expected.json"), "w", encoding="utf-8") as f:
        f.write(f'{{"tokenizers_version": "{tokenizers.__version__}", '
                f'"nfc": "tokenizers normalizers.NFC",\n')
        for key, rows in (("encode", cases), ("decode", decode_cases), ("nfc", nfc)):
            f.write(f'"{key}": [\n')
            f.write(",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows))
            f.write("\n]" + (",\n" if key != "nfc" else "\n}\n"))
    print(f"{OUT}: {len(toks)} tokenizers, {len(cases)} encode cases, {len(decode_cases)} decode cases "
          f"(tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
