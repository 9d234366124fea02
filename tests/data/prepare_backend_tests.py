#!/usr/bin/env python3
"""Tests of prepare_data.py's tokenizer backends (--tokenizer-backend engine|hf|auto): the engine
backend (./tokenize, built by make) gives the same .bin/.idx as the tokenizers package byte for
byte (unicode, whitespace runs, digits, added tokens in the text, BOS/EOS, chat spans, the demo
corpus, one and two workers); and on its own, without the tokenizers package, the round trip
text -> tokens -> text, BOS from the post-processor, chat spans, and the errors and the auto
fallback when ./tokenize is missing or refuses the tokenizer.json. Cases needing `tokenizers`
skip with a message when it is absent; everything skips when ./tokenize is missing (run make).
Run by tests/data/test_prepare_data.cpp (make test), or alone:
    python3 tests/data/prepare_backend_tests.py [-v] [Test.name]"""
import json
import os
import random
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_tests import ROOT, SCRIPT, Base, load, need, read_output, train_tokenizer  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from prepare.engine_tokenizer import PROGRAM, EngineTokenizer  # noqa: E402

FIXTURES = os.path.join(ROOT, "tests", "tokenizer", "data")
have_program = unittest.skipUnless(os.path.isfile(PROGRAM), f"needs {PROGRAM}: run make first")

TRICKY = [
    "  leading spaces, trailing   ",
    "tabs\t\tand\n\n\nnewlines\r\n  \n",
    "digits 1234567890 3.14159 -42 1e10 0x1F 2026-12-02",
    "unicode: caf\u00e9 na\u00efve e\u0301 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0440\u0443\u0441\u0441\u043a\u0438\u0439 "
    "\u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \U0001F642\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469",
    "spaces of all kinds:\u00a0nbsp\u2003em\u3000ideographic \u2028 end",
    "it's we're they'll I'd DON'T 'quoted'",
    "",
    " ",
    "x" * 3000,
    "an added token <|endoftext|> inside the text<|endoftext|>",
    "def f(x):\n    return x ** 2  # comment\n\n\n\tpass\n",
]

CHATS = [[{"role": "system", "content": "Be brief. \u2603"}, {"role": "user", "content": "2+2?  "},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 33+33?\n\n"},
          {"role": "assistant", "content": "66 \U0001F642"}],
         [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],
         [{"role": "assistant", "content": "first"}]]


def random_texts(n, seed):
    """Texts drawn from a pool of awkward characters: runs of every kind of space, digits,
    punctuation, letters of several scripts, combining marks, emoji."""
    rng = random.Random(seed)
    pool = list(" \t\n\r\u00a0\u3000") + list("0123456789") + list(".,;:'\"!?()[]{}-_=+*/\\#@$%^&|<>~`") + \
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ") + list("\u00e9\u00df\u0153\u03b1\u03b2\u0434\u0436\u05d0\u0627") + \
        list("\u4e00\u4e8c\u3042\u30a2\uac00\u0301\u0308\u200d") + ["\U0001F600", "\U0001F3FD", "'s", "'ll", "  ", "\n\n"]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 400))) for _ in range(n)]


def copy_scripts_without_program(dest):
    """scripts/prepare_data.py and scripts/prepare/ in a tree with no ./tokenize."""
    os.makedirs(os.path.join(dest, "scripts"))
    shutil.copy(SCRIPT, os.path.join(dest, "scripts"))
    shutil.copytree(os.path.join(ROOT, "scripts", "prepare"), os.path.join(dest, "scripts", "prepare"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    return os.path.join(dest, "scripts", "prepare_data.py")


@have_program
class EngineAlone(Base):
    """The engine backend without the tokenizers package."""

    def test_round_trip_byte_level_bpe(self):
        tok = self.engine(os.path.join(FIXTURES, "gpt2.json"))
        self.jsonl("in.jsonl", TRICKY + random_texts(50, 3))
        self.prepare(self.path("in.jsonl"), "-o", self.path("out"), "--tokenizer", os.path.join(FIXTURES, "gpt2.json"),
                     "--tokenizer-backend", "engine", "--eos", "<|endoftext|>", "--workers", "2", "--chunk-mb", "0.01")
        docs, _, m = read_output(self.path("out"))
        self.assertEqual(m["tokenizer"]["eos"], 0)
        self.assertEqual(m["tokenizer"]["bos"], None)
        self.assertTrue(all(d[-1] == 0 for d in docs))
        self.assertEqual([tok.decode(d[:-1]) for d in docs], TRICKY + random_texts(50, 3))

    def engine(self, path):
        tok = EngineTokenizer(path)
        self.addCleanup(tok.close)
        return tok

    def test_bos_from_the_post_processor_and_overrides(self):
        # Model folders naming BOS and EOS (special_tokens_map.json) and no add_bos_token: BOS goes
        # first where the post-processor prepends it (llama3.json's template), not without one.
        tok = self.engine(os.path.join(FIXTURES, "llama3.json"))
        self.jsonl("in.jsonl", TRICKY)
        for name, first in (("llama3", [0]), ("gpt2", [])):
            os.makedirs(self.path(name))
            shutil.copy(os.path.join(FIXTURES, name + ".json"), self.path(name + "/tokenizer.json"))
            bos, eos = ("<|begin_of_text|>", "<|end_of_text|>") if name == "llama3" else ("<|endoftext|>",) * 2
            with open(self.path(name + "/special_tokens_map.json"), "w") as f:
                json.dump({"bos_token": bos, "eos_token": {"content": eos}}, f)
            self.prepare(self.path("in.jsonl"), "-o", self.path(name + "-out"), "--tokenizer", self.path(name),
                         "--tokenizer-backend", "engine")
            docs, _, m = read_output(self.path(name + "-out"))
            self.assertEqual(m["tokenizer"]["bos"], first[0] if first else None)
            self.assertEqual({tuple(d[:len(first)]) for d in docs}, {tuple(first)})
            self.assertEqual({d[-1] for d in docs}, {1 if name == "llama3" else 0})
            if name == "llama3":
                self.assertEqual([tok.decode(d[1:-1]) for d in docs], TRICKY)
        self.prepare(self.path("in.jsonl"), "-o", self.path("b"), "--tokenizer", self.path("llama3"),
                     "--tokenizer-backend", "engine", "--no-bos", "--eos", "0")
        docs, _, _ = read_output(self.path("b"))
        self.assertEqual({d[-1] for d in docs}, {0})
        self.assertEqual([tok.decode(d[:-1]) for d in docs], TRICKY)

    def test_chat_spans(self):
        path = os.path.join(FIXTURES, "gpt2.json")
        tok = self.engine(path)
        self.jsonl("chat.jsonl", CHATS, key="messages")
        self.prepare(self.path("chat.jsonl"), "--chat-field", "messages", "-o", self.path("out"), "--tokenizer", path,
                     "--tokenizer-backend", "engine", "--eos", "<|endoftext|>")
        docs, spans, _ = read_output(self.path("out"))
        trained = [[t for i, t in enumerate(d[:-1]) if not any(b <= i < e for b, e in s)] for d, s in zip(docs, spans)]
        self.assertEqual([tok.decode(t) for t in trained], ["4\n66 \U0001F642\n", "\n", "first\n"])
        masked = [[t for i, t in enumerate(d) if any(b <= i < e for b, e in s)] for d, s in zip(docs, spans)]
        self.assertEqual(tok.decode(masked[2]), "<|assistant|>\n")

    def test_program_missing(self):
        script = copy_scripts_without_program(self.path("tree"))
        self.jsonl("in.jsonl", ["a b c"])
        args = [sys.executable, script, self.path("in.jsonl"), "-o", self.path("out"), "--quiet",
                "--tokenizer", os.path.join(FIXTURES, "gpt2.json"), "--eos", "<|endoftext|>"]
        r = subprocess.run(args + ["--tokenizer-backend", "engine"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("error: --tokenizer-backend engine: ", r.stderr)
        self.assertIn("tokenize (the engine's tokenizer program) is missing: run make first\n", r.stderr)
        r = subprocess.run(args, capture_output=True, text=True)  # auto: a note, then tokenizers
        self.assertIn("prepare: tokenizer backend hf (the tokenizers package), not the engine's: ", r.stderr)
        self.assertIn("run make first", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_a_tokenizer_json_the_engine_refuses(self):
        path = self.write("wl.json", json.dumps({
            "version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None, "decoder": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "[UNK]": 2}, "unk_token": "[UNK]"}}))
        self.jsonl("in.jsonl", ["a b c"])
        r = self.prepare(self.path("in.jsonl"), "-o", self.path("out"), "--tokenizer", path,
                         "--tokenizer-backend", "engine", ok=False)
        self.assertIn('error: --tokenizer-backend engine: ' + path + ': model.type: "WordLevel" is not supported '
                      '(only BPE)\n', r.stderr)
        r = subprocess.run([sys.executable, SCRIPT, self.path("in.jsonl"), "-o", self.path("out"), "--quiet",
                            "--tokenizer", path, "--eos", "[UNK]"], capture_output=True, text=True)
        self.assertEqual(r.stderr.count("\n"), 1 if r.returncode == 0 else 2, r.stderr)  # one note (+ an error)
        self.assertIn('not the engine\'s: ' + path + ': model.type: "WordLevel" is not supported', r.stderr)

    def test_backend_needs_a_tokenizer(self):
        self.jsonl("in.jsonl", ["a"])
        r = self.prepare(self.path("in.jsonl"), "-o", self.path("out"), "--tokenizer-backend", "engine", ok=False)
        self.assertIn("--tokenizer-backend needs --tokenizer", r.stderr)


@have_program
@need("tokenizers")
class EngineEqualsHF(Base):
    """Byte-for-byte equal output of the two backends."""

    def both(self, inputs, *args):
        outs = {}
        for backend, workers in (("hf", "1"), ("engine", "2")):
            out = self.path(f"out-{backend}")
            r = self.prepare(*inputs, "-o", out, "--tokenizer-backend", backend, "--workers", workers,
                             "--chunk-mb", "0.02", *args)
            self.assertIn(f"{backend} tokenizer backend", r.stdout)
            outs[backend] = out
        for ext in (".bin", ".idx"):
            a, b = (load(outs[k] + ext) for k in ("hf", "engine"))
            self.assertTrue(a == b, f"{ext} differs: {len(a)} vs {len(b)} bytes")
        self.assertGreater(len(load(outs["hf"] + ".bin")), 0)
        ma, mb = (json.loads(load(outs[k] + ".manifest.json")) for k in ("hf", "engine"))
        self.assertEqual(ma["tokenizer"], mb["tokenizer"])  # so a run may resume with the other backend
        return read_output(outs["engine"])

    def test_trained_byte_level_bpe(self):
        texts = TRICKY + random_texts(300, 1)
        train_tokenizer(self.path("tok.json"), texts * 3 + random_texts(300, 2), vocab=1000)
        self.jsonl("in.jsonl", texts)
        docs, _, _ = self.both([self.path("in.jsonl")], "--tokenizer", self.path("tok.json"), "--eos", "<|endoftext|>",
                               "--bos", "<s>")
        self.assertEqual(len(docs), len(texts))
        self.jsonl("chat.jsonl", CHATS * 20, key="messages")
        _, spans, _ = self.both([self.path("chat.jsonl")], "--chat-field", "messages", "--tokenizer",
                                self.path("tok.json"), "--eos", "<|endoftext|>", "--bos", "<s>")
        self.assertTrue(all(spans))

    def test_the_pipelines_of_the_fixtures(self):
        # Split patterns (Llama 3, Qwen2, Mistral-Nemo), NFC, SentencePiece-style byte fallback and
        # Metaspace: the ids of each text and of each chat piece, in process (the preparation's
        # handling of them is the same for both backends, tested above through prepare_data.py).
        from tokenizers import Tokenizer
        texts = TRICKY + random_texts(100, 4) + [m["content"] + "\n" for c in CHATS for m in c]
        for name in ("gpt2", "llama3", "qwen2", "nemo", "spm", "spm_meta"):
            with self.subTest(name):
                path = os.path.join(FIXTURES, name + ".json")
                hf = [e.ids for e in Tokenizer.from_file(path).encode_batch(texts, add_special_tokens=False)]
                engine = EngineTokenizer(path)
                self.addCleanup(engine.close)
                self.assertEqual(engine.encode_many(texts), hf)

    def test_demo_corpus(self):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_corpus.py"), "--documents", "600",
                        self.path("demo.jsonl")], check=True, capture_output=True)
        with open(self.path("demo.jsonl"), encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line in f]
        train_tokenizer(self.path("tok.json"), texts, vocab=2000)
        docs, _, _ = self.both([self.path("demo.jsonl")], "--tokenizer", self.path("tok.json"), "--eos", "<|endoftext|>")
        self.assertEqual(len(docs), 600)


if __name__ == "__main__":
    unittest.main()
