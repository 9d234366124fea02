#!/usr/bin/env python3
"""Tests of scripts/prepare_data.py on CPU: every input kind, the round trip (text -> tokens ->
text), tokenizers and their BOS/EOS, chat spans, parallel and sharded output equal to serial,
kill -9 and resume, bad inputs. Run by tests/data/test_prepare_data.cpp (make test), or alone:
    python3 tests/data/prepare_tests.py [-v] [Test.name]
Cases that need pyarrow, zstandard, tokenizers or datasets skip with a message when it is absent
(scripts/install_deps.sh installs the first three; `datasets`, heavy, is left to the user: the
arrow-folder case writes the save_to_disk layout with pyarrow alone). Reads the .idx/.bin itself (FORMATS.md); the
C++ reader's side is in test_prepare_data.cpp and test_manifest.cpp."""
import concurrent.futures
import gzip
import importlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "prepare_data.py")


def load(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def load_json(path):
    return json.loads(load(path, "r"))


def dump_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


_IMPORT_ERRORS = {}


def have(module):
    """Whether `module` imports (a package present but broken, e.g. pyarrow beside an old NumPy,
    counts as absent, with its error kept for the skip message)."""
    if module not in _IMPORT_ERRORS:
        try:
            importlib.import_module(module)
            _IMPORT_ERRORS[module] = None
        except Exception as e:
            _IMPORT_ERRORS[module] = f"{type(e).__name__}: {e}"
    return _IMPORT_ERRORS[module] is None


def need(module):
    ok = have(module)
    why = "absent" if ok or "No module named" in (_IMPORT_ERRORS[module] or "") else _IMPORT_ERRORS[module]
    how = "pip install datasets: heavy, left out of CI" if module == "datasets" else "scripts/install_deps.sh installs it"
    return unittest.skipUnless(ok, f"needs the {module} package ({why}; {how})")


def read_dataset(prefix):
    """(documents as lists of ids, spans per document as [begin, end) lists or None, dtype)."""
    idx = load(prefix + ".idx")
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version = struct.unpack_from("<Q", idx, 9)[0]
    off = 17
    has_spans = False
    if version >= 2:
        has_spans = idx[off] == 1
        off += 1
    code = idx[off]
    n = struct.unpack_from("<Q", idx, off + 1)[0]
    off += 17
    sizes = struct.unpack_from(f"<{n}i", idx, off)
    off += 12 * n
    spans = None
    if has_spans:
        counts = struct.unpack_from(f"<{n}i", idx, off)
        off += 4 * n
        spans = []
        for c in counts:
            flat = struct.unpack_from(f"<{2 * c}i", idx, off)
            off += 8 * c
            spans.append([[flat[2 * i], flat[2 * i + 1] + 1] for i in range(c)])
    fmt = {8: "H", 4: "i"}[code]
    data = load(prefix + ".bin")
    tokens = struct.unpack(f"<{len(data) // struct.calcsize(fmt)}{fmt}", data)
    docs, at = [], 0
    for s in sizes:
        docs.append(list(tokens[at:at + s]))
        at += s
    return docs, spans, {8: "uint16", 4: "int32"}[code]


def read_output(out):
    """Documents (and spans) of an output through its manifest, shards concatenated."""
    m = load_json(out + ".manifest.json")
    assert m["complete"], m
    docs, spans = [], []
    for s in m["shards"]:
        d, sp, dtype = read_dataset(os.path.join(os.path.dirname(out), s["prefix"]))
        assert dtype == m["dtype"] and len(d) == s["documents"]
        docs += d
        spans += sp or []
    return docs, spans, m


def byte_text(doc):
    assert doc[-1] == 256, doc[-5:]
    return bytes(doc[:-1]).decode("utf-8")


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="prepare_tests.")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def write(self, name, data):
        p = self.path(name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        return p

    def prepare(self, *args, ok=True):
        r = subprocess.run([sys.executable, SCRIPT, *args, "--quiet"], capture_output=True, text=True)
        if ok:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        else:
            self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertNotIn("Traceback", r.stderr)
        return r

    def jsonl(self, name, texts, key="text"):
        return self.write(name, "".join(json.dumps({key: t}) + "\n" for t in texts))


TEXTS = ["alpha", "b\u00e9ta \u2603 line\nsecond line", "", "tab\tand \"quotes\" and emoji \U0001F600", "x" * 5000]


class Inputs(Base):
    def check_texts(self, out, texts):
        docs, _, _ = read_output(out)
        self.assertEqual([byte_text(d) for d in docs], texts)

    def test_txt(self):
        p = self.write("a.txt", "First paragraph,\nstill the first.\n\n\n   \nSecond: caf\u00e9.\r\n\r\nThird\n")
        self.prepare(p, "-o", self.path("out"))
        self.check_texts(self.path("out"), ["First paragraph,\nstill the first.", "Second: caf\u00e9.", "Third"])

    def test_jsonl_plain_gz_zst_and_a_folder(self):
        self.jsonl("in/a.jsonl", TEXTS[:2])
        with gzip.open(self.path("in/b.jsonl.gz"), "wt") as f:
            f.write("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[2:]))
        self.prepare(self.path("in"), "-o", self.path("out"))
        self.check_texts(self.path("out"), TEXTS)
        if not have("zstandard"):
            self.skipTest("the .zst part needs the zstandard package")
        import zstandard
        self.write("c.jsonl.zst", zstandard.ZstdCompressor().compress(
            "".join(json.dumps({"text": t}) + "\n" for t in TEXTS).encode()))
        self.prepare(self.path("c.jsonl.zst"), "-o", self.path("zst"))
        self.check_texts(self.path("zst"), TEXTS)

    @need("pyarrow")
    def test_parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"id": list(range(5)), "body": TEXTS}), self.path("t.parquet"), row_group_size=2)
        self.prepare(self.path("t.parquet"), "--field", "body", "-o", self.path("out"))
        self.check_texts(self.path("out"), TEXTS)

    @need("pyarrow")
    def test_arrow_dataset_folder(self):
        # The layout save_to_disk writes: IPC stream files listed in state.json.
        import pyarrow as pa
        os.makedirs(self.path("ds"))
        for i, part in enumerate((TEXTS[:3], TEXTS[3:])):
            with pa.OSFile(self.path(f"ds/data-{i:05d}-of-00002.arrow"), "wb") as sink:
                with pa.ipc.new_stream(sink, pa.schema([("text", pa.string())])) as w:
                    w.write_table(pa.table({"text": part}))
        dump_json(self.path("ds/state.json"), {"_data_files": [{"filename": f"data-{i:05d}-of-00002.arrow"}
                                                               for i in range(2)]})
        self.prepare(self.path("ds"), "-o", self.path("out"), "--chunk-mb", "0.000001")
        self.check_texts(self.path("out"), TEXTS)

    @need("datasets")
    def test_datasets_save_to_disk(self):
        import datasets
        datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(self.path("hf"))
        self.prepare(self.path("hf"), "-o", self.path("out"))
        self.check_texts(self.path("out"), TEXTS)


class Chat(Base):
    MESSAGES = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                 {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
                 {"role": "assistant", "content": "6"}],
                [{"role": "user", "content": "hi"}]]

    def test_spans_mask_the_prompt_parts(self):
        self.jsonl("chat.jsonl", self.MESSAGES, key="messages")
        self.prepare(self.path("chat.jsonl"), "--chat-field", "messages", "-o", self.path("out"))
        docs, spans, m = read_output(self.path("out"))
        self.assertTrue(m["loss_masking_spans"])
        text = byte_text(docs[0])
        self.assertEqual(text, "<|system|>\nBe brief.\n<|user|>\n2+2?\n<|assistant|>\n4\n<|user|>\nand 3+3?\n"
                               "<|assistant|>\n6\n")
        raw = text.encode()
        trained = [i for i in range(len(docs[0])) if not any(b <= i < e for b, e in spans[0])]
        # What trains: the assistant answers with their newline, and the EOS.
        self.assertEqual(bytes(docs[0][i] for i in trained if i < len(raw)), b"4\n6\n")
        self.assertEqual(trained[-1], len(docs[0]) - 1)
        self.assertEqual(spans[1], [[0, len("<|user|>\nhi\n")]])

    @need("tokenizers")
    def test_spans_with_a_tokenizer_fall_on_token_boundaries(self):
        tok = train_tokenizer(self.path("tok.json"), ["Be brief. 2+2? 4 and 3+3? 6 hi"] * 20)
        self.jsonl("chat.jsonl", self.MESSAGES, key="messages")
        self.prepare(self.path("chat.jsonl"), "--chat-field", "messages", "-o", self.path("out"),
                     "--tokenizer", self.path("tok.json"), "--eos", "<|endoftext|>")
        docs, spans, _ = read_output(self.path("out"))
        trained = [t for i, t in enumerate(docs[0][:-1]) if not any(b <= i < e for b, e in spans[0])]
        self.assertEqual(tok.decode(trained), "4\n6\n")


def train_tokenizer(path, texts, vocab=300, specials=("<|endoftext|>", "<s>")):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(specials),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.save(path)
    return tok


@need("tokenizers")
class Tokenizers(Base):
    def test_round_trip_tokenizer_json(self):
        tok = train_tokenizer(self.path("tok.json"), TEXTS * 10)
        self.jsonl("in.jsonl", TEXTS)
        self.prepare(self.path("in.jsonl"), "-o", self.path("out"), "--tokenizer", self.path("tok.json"),
                     "--eos", "<|endoftext|>")
        docs, _, m = read_output(self.path("out"))
        eos = tok.token_to_id("<|endoftext|>")
        self.assertEqual(m["tokenizer"]["eos"], eos)
        self.assertTrue(all(d[-1] == eos for d in docs))
        self.assertEqual([tok.decode(d[:-1]) for d in docs], TEXTS)

    def test_model_folder_bos_eos_from_its_config_and_overrides(self):
        os.makedirs(self.path("model"))
        tok = train_tokenizer(self.path("model/tokenizer.json"), TEXTS * 10, specials=("<s>", "</s>", "<pad>"))
        dump_json(self.path("model/tokenizer_config.json"),
                  {"add_bos_token": True, "bos_token": {"content": "<s>"}, "eos_token": "</s>"})
        self.jsonl("in.jsonl", TEXTS[:2])
        self.prepare(self.path("in.jsonl"), "-o", self.path("a"), "--tokenizer", self.path("model"))
        bos, eos, pad = (tok.token_to_id(t) for t in ("<s>", "</s>", "<pad>"))
        docs, _, _ = read_output(self.path("a"))
        self.assertEqual([(d[0], d[-1]) for d in docs], [(bos, eos)] * 2)
        self.assertEqual(tok.decode(docs[1][1:-1]), TEXTS[1])
        self.prepare(self.path("in.jsonl"), "-o", self.path("b"), "--tokenizer", self.path("model"), "--no-bos",
                     "--eos", "<pad>")
        docs, _, _ = read_output(self.path("b"))
        self.assertEqual([(d[0] != bos, d[-1]) for d in docs], [(True, pad)] * 2)
        # generation_config.json alone names the ids.
        os.remove(self.path("model/tokenizer_config.json"))
        dump_json(self.path("model/generation_config.json"), {"bos_token_id": bos, "eos_token_id": [eos, pad]})
        self.prepare(self.path("in.jsonl"), "-o", self.path("c"), "--tokenizer", self.path("model"))
        docs, _, _ = read_output(self.path("c"))
        self.assertEqual(docs[0][-1], eos)  # BOS: only where the config or the post-processor adds it
        self.assertNotEqual(docs[0][0], bos)

    def test_vocabulary_above_65535_gives_int32_tokens(self):
        from tokenizers import Tokenizer, models, pre_tokenizers
        vocab = {f"w{i}": i for i in range(70000)}
        vocab["[UNK]"] = 70000
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.save(self.path("big.json"))
        self.jsonl("in.jsonl", ["w1 w69999 w65536", "w0"])
        self.prepare(self.path("in.jsonl"), "-o", self.path("out"), "--tokenizer", self.path("big.json"),
                     "--eos", "[UNK]")
        docs, _, m = read_output(self.path("out"))
        self.assertEqual(m["dtype"], "int32")
        self.assertEqual(docs, [[1, 69999, 65536, 70000], [0, 70000]])


def corpus(n, seed=1):
    import random
    rng = random.Random(seed)
    words = ["lorem", "ipsum", "caf\u00e9", "\u2603", "dolor", "sit", "amet", "\n"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 200))) for _ in range(n)]


class Parallel(Base):
    def test_workers_and_shards_equal_one_serial_file(self):
        texts = corpus(3000)
        self.jsonl("in.jsonl", texts)
        self.prepare(self.path("in.jsonl"), "-o", self.path("serial"), "--workers", "1")
        self.prepare(self.path("in.jsonl"), "-o", self.path("par"), "--workers", "2", "--chunk-mb", "0.05",
                     "--shard-size", "100000")
        a, _, ma = read_output(self.path("serial"))
        b, _, mb = read_output(self.path("par"))
        self.assertEqual([byte_text(d) for d in a], texts)
        self.assertEqual(a, b)
        self.assertEqual(len(ma["shards"]), 1)
        self.assertGreater(len(mb["shards"]), 5)
        self.assertTrue(all(s["tokens"] >= 100000 for s in mb["shards"][:-1]))
        # A second run with the same arguments has nothing to do.
        r = subprocess.run([sys.executable, SCRIPT, self.path("in.jsonl"), "-o", self.path("par"), "--shard-size",
                            "100000", "--chunk-mb", "0.05"], capture_output=True, text=True)
        self.assertIn("nothing to do", r.stderr)

    def test_kill_9_then_resume_equals_an_uninterrupted_run(self):
        texts = corpus(2000, seed=2)
        self.jsonl("in.jsonl", texts)
        args = [self.path("in.jsonl"), "--shard-size", "40000", "--chunk-mb", "0.02", "--workers", "2"]
        self.prepare(*args, "-o", self.path("whole"))
        out = self.path("killed")
        proc = subprocess.Popen([sys.executable, SCRIPT, *args, "-o", out, "--quiet"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            try:
                if len(load_json(out + ".manifest.json")["shards"]) >= 3:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.002)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        m = load_json(out + ".manifest.json")
        self.assertFalse(m["complete"], "the run finished before the kill: make the corpus larger")
        r = self.prepare(*args, "-o", out)
        whole = sorted(os.listdir(self.dir))
        names = [n for n in whole if n.startswith("whole")]
        for n in names:
            k = "killed" + n[len("whole"):]
            a, b = load(self.path(n)), load(self.path(k))
            if n.endswith(".manifest.json"):
                a, b = a.replace(b"whole", b"killed"), b
            self.assertEqual(a, b, f"{n} and {k} differ")
        self.assertEqual(sorted(n.replace("whole", "") for n in names),
                         sorted(n.replace("killed", "") for n in whole if n.startswith("killed")))


class BadInput(Base):
    def test_messages_name_the_file_and_line(self):
        good = gzip.compress(b'{"text": "a"}\n' * 1000)
        cases = [  # file, content, expected message (PATH: the file), extra arguments
            ("u.txt", b"good\n\nbad \xff byte\n", "PATH:3: not UTF-8 (byte 0xff at column 5)"),
            ("u.jsonl", b'{"text": "ok"}\n{"text": "\xc3("}\n', "PATH:2: not UTF-8"),
            ("m.jsonl", '{"text": "ok"}\n\n{"body": "x"}\n', "PATH:3: no field 'text' (fields: body)"),
            ("t.jsonl", '{"text": 5}\n', "PATH:1: field 'text' is a int, expected a string"),
            ("j.jsonl", '{"text": "a"}\n{"text": \n', "PATH:2: invalid JSON"),
            ("o.jsonl", '["text"]\n', "PATH:1: expected a JSON object, got list"),
            ("s.jsonl", '{"text": "ok"}\n{"text": "a \\ud800"}\n', "PATH:2: text that is not valid Unicode"),
            ("e.jsonl", "", "PATH: empty file"),
            ("b.txt", "\n  \n\n", "PATH: no documents"),
            ("c.jsonl", '{"m": [{"role": "user"}]}\n', "PATH:1: message 0 is not an object", "--chat-field", "m"),
            ("c2.jsonl", '{"m": "hi"}\n', "PATH:1: the chat field is a str, expected a list", "--chat-field", "m"),
            ("g.jsonl.gz", good[: len(good) // 2], "PATH: corrupt compressed data"),
            ("x.jsonl.gz", b"not gzip at all", "PATH: corrupt compressed data"),
            ("p.parquet", b"PAR1 not parquet", "PATH: not a readable Parquet file" if have("pyarrow")
             else "PATH: reading Parquet files needs the pyarrow package"),
        ]
        if have("zstandard"):
            import zstandard
            z = zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 1000)
            cases.append(("z.jsonl.zst", z[:-8] + b"\x00" * 8, "PATH: corrupt zstd data"))
        if have("pyarrow"):
            import pyarrow as pa
            import pyarrow.parquet as pq
            pq.write_table(pa.table({"text": ["a", None, "b"]}), self.path("n.parquet"))
            cases.append(("n.parquet", None, "PATH: row 1: field 'text' is a NoneType, expected a string"))
            data = load(self.path("n.parquet"))
            cases.append(("cut.parquet", data[:12] + data[-12:], "PATH: not a readable Parquet file"))

        def run(case):  # each in its own folder, all at once
            name, content, message, *extra = case
            folder = self.path(name + ".d")
            os.makedirs(folder)
            p = os.path.join(folder, name)
            if content is None:
                shutil.copy(self.path(name), p)
            else:
                with open(p, "wb") as f:
                    f.write(content if isinstance(content, bytes) else content.encode())
            r = subprocess.run([sys.executable, SCRIPT, p, "-o", os.path.join(folder, "out"), *extra, "--quiet"],
                               capture_output=True, text=True)
            return case, p, folder, r

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for (name, _, message, *_), p, folder, r in pool.map(run, cases):
                with self.subTest(name):
                    self.assertNotEqual(r.returncode, 0, r.stdout + r.stderr)
                    self.assertNotIn("Traceback", r.stderr)
                    self.assertIn(message.replace("PATH", p), r.stderr)
                    self.assertEqual(os.listdir(folder), [name])  # no output, no temporary, no lock


if __name__ == "__main__":
    unittest.main()
