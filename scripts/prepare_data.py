#!/usr/bin/env python3
"""Tokenizes text corpora into Megatron `.bin` + `.idx` token datasets, in parallel, sharded.

Inputs (files or folders, several allowed; see scripts/prepare/sources.py):
  .txt                 one document per blank-line-separated paragraph
  .jsonl / .json       one object per line, the document in --field (default "text")
  .gz / .zst of those  (gzip from the standard library; .zst needs the zstandard package)
  .parquet, .arrow     the --field column (needs pyarrow)
  a folder             a Hugging Face `datasets` folder from save_to_disk (its .arrow files), or
                       every input file below it in name order
With --chat-field, the field holds a list of {"role", "content"} messages: rendered with
--chat-template, the parts that are not --train-roles turns become loss-masking spans (the
shards are then .idx version 2), which training masks out of the loss.

Tokenizers (scripts/prepare/tokenize.py): byte level by default (bytes 0..255, EOS 256 after
every document, vocabulary 257: set model.vocab_size >= 257); --tokenizer a tokenizer.json or a
Hugging Face model folder (BOS/EOS from its configs; --bos/--eos/--no-bos/--no-eos override),
encoded by --tokenizer-backend: engine (the engine's C++ tokenizer, ./tokenize, built by `make`),
hf (the `tokenizers` package) or auto (default: engine when it implements the tokenizer.json and
./tokenize exists, else hf with a one-line note why). Both give the same tokens.
Tokens are uint16 when the vocabulary has fewer than 65536 entries, else int32.

Output: without --shard-size, OUTPUT.bin + OUTPUT.idx; with it, OUTPUT-00000.bin/.idx, ... each
closed once it holds at least that many tokens (or bytes: "2GB", "512MiB"). Always also
OUTPUT.manifest.json (shards, counts, dtype, tokenizer, sizes and sha256 of every file), which
data.train takes as one dataset. Files are written to temporary names, fsynced and renamed; the
manifest records every finished shard, so a killed run started again with the same arguments
resumes after the last finished shard (--restart starts over). A failed write is an error naming
the file. Bad input is an error naming the file and the line (or row).

Progress goes to stderr: documents, tokens, input MB, MB/s of text, percentage and ETA.

    python3 scripts/prepare_data.py corpus.jsonl --output data/corpus
    python3 scripts/prepare_data.py shards/ -o data/web --tokenizer models/llama --shard-size 1G
    python3 scripts/prepare_data.py chats.jsonl.zst -o data/sft --chat-field messages --tokenizer tok.json
"""
import argparse
import collections
import fcntl
import glob
import multiprocessing
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare import InputError  # noqa: E402
from prepare import sources, tokenize  # noqa: E402
from prepare.output import DTYPE_NAMES, Manifest, ShardWriter, WriteError  # noqa: E402


def parse_size(text, itemsize):
    """--shard-size in tokens ("500M") or bytes of the .bin ("2GB", "512MiB") -> tokens."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--shard-size {text!r}: expected a count like 500M (tokens) or 2GB (bytes)")
    scale = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}[m.group(2).lower()]
    base = 1024 if m.group(3) and m.group(3).lower() == "ib" else 1000
    n = int(float(m.group(1)) * base ** scale)
    if m.group(3):
        n //= itemsize
    if n < 1:
        raise argparse.ArgumentTypeError(f"--shard-size {text!r} is less than one token")
    return n


class Progress:
    def __init__(self, total_raw, start_raw, quiet):
        self.total, self.start_raw, self.quiet = total_raw, start_raw, quiet
        self.t0 = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.docs = self.tokens = self.text = 0
        self.raw = start_raw

    def line(self):
        dt = max(time.monotonic() - self.t0, 1e-9)
        s = (f"prepare: {self.docs:,} documents, {self.tokens:,} tokens, {self.text / 1e6:,.1f} MB of text, "
             f"{self.text / 1e6 / dt:.2f} MB/s")
        if self.total > 0:
            frac = min(self.raw / self.total, 1.0)
            done = self.raw - self.start_raw
            eta = dt * (self.total - self.raw) / done if done > 0 else float("nan")
            s += f", {100 * frac:.1f}%"
            if eta == eta:
                s += f", ETA {int(eta) // 3600}:{int(eta) % 3600 // 60:02d}:{int(eta) % 60:02d}"
        return s

    def update(self, docs, tokens, text, raw):
        self.docs += docs
        self.tokens += tokens
        self.text += text
        self.raw = raw
        now = time.monotonic()
        if not self.quiet and now - self.last >= (0.5 if self.tty else 10.0):
            self.last = now
            sys.stderr.write(("\r" + self.line() + "\x1b[K") if self.tty else self.line() + "\n")
            sys.stderr.flush()

    def finish(self):
        if not self.quiet:
            sys.stderr.write(("\r" + self.line() + "\x1b[K\n") if self.tty else self.line() + "\n")


_ENCODER = None


def _work(chunk):
    return _ENCODER.run(chunk)


def results(chunks, workers):
    """(chunk, result) in input order; at most 2 x workers chunks in flight."""
    if workers <= 1:
        for c in chunks:
            yield c, _ENCODER.run(c)
        return
    pool = multiprocessing.get_context("fork").Pool(workers)
    try:
        window = collections.deque()
        for c in chunks:
            window.append((c, pool.apply_async(_work, (c,))))
            if len(window) >= 2 * workers:
                c0, r = window.popleft()
                yield c0, r.get()
        while window:
            c0, r = window.popleft()
            yield c0, r.get()
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def chunk_stream(files, field, chunk_bytes, resume):
    """Every input's chunks from the resume position on; an input with none is an error."""
    first = resume[0] if resume else 0
    for i in range(first, len(files)):
        path = files[i]
        fmt, comp = sources.kind_of(path)
        start, line = (resume[1], resume[2]) if resume and i == first else (0, 1 if fmt in ("txt", "jsonl") else 0)
        if os.path.getsize(path) == 0:
            raise InputError(f"{path}: empty file")
        if fmt in ("txt", "jsonl"):
            gen = sources.text_chunks(i, path, fmt, comp, chunk_bytes, start, line)
        else:
            gen = sources.table_chunks(i, path, fmt, field, chunk_bytes, start, line)
        n = 0
        for c in gen:
            n += 1
            yield c
        if n == 0 and start == 0:
            raise InputError(f"{path}: no data (empty after decompression)" if comp else f"{path}: empty file")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="input files or folders")
    p.add_argument("--output", "-o", required=True, help="output prefix (OUTPUT.bin/.idx or OUTPUT-NNNNN.*)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--field", default="text", help="the text field or column (default: text)")
    g.add_argument("--chat-field", help="a field of {role, content} messages; non-training turns are masked")
    p.add_argument("--chat-template", default=tokenize.DEFAULT_TEMPLATE,
                   help="one message as text, with {role} and {content} (default: %(default)r)")
    p.add_argument("--train-roles", default="assistant", help="comma-separated roles whose turns train")
    p.add_argument("--tokenizer", help="a tokenizer.json or a Hugging Face model folder (default: byte level)")
    p.add_argument("--tokenizer-backend", choices=tokenize.BACKENDS, default="auto",
                   help="engine (./tokenize, from make), hf (the tokenizers package) or auto "
                        "(engine when it takes the tokenizer.json, else hf; default)")
    p.add_argument("--bos", help="BOS token (string or id) to put before every document")
    p.add_argument("--eos", help="EOS token (string or id) to append to every document")
    p.add_argument("--no-bos", action="store_true", help="no BOS, whatever the tokenizer's config says")
    p.add_argument("--no-eos", action="store_true", help="no EOS after the documents")
    p.add_argument("--shard-size", help="tokens (500M) or bytes (2GB, 512MiB) per shard; default: one file")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="processes (default: every core)")
    p.add_argument("--chunk-mb", type=float, default=4.0, help="MB of input text per work item (default: 4)")
    p.add_argument("--restart", action="store_true", help="ignore a resumable earlier run of the same output")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress line")
    args = p.parse_args()
    if args.tokenizer is None and (args.bos or args.eos or args.no_bos or args.no_eos):
        p.error("--bos/--eos/--no-bos/--no-eos need --tokenizer (the byte-level tokenizer always appends 256)")
    if args.tokenizer is None and args.tokenizer_backend != "auto":
        p.error("--tokenizer-backend needs --tokenizer (the byte-level tokenizer has no backends)")
    if args.chat_field and args.chat_template.count("{content}") != 1:
        p.error("--chat-template must hold {content} exactly once")
    if args.workers < 1:
        p.error("--workers must be >= 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker
    try:
        return run(args)
    except (InputError, WriteError) as e:
        msg = str(e)
        print(msg if msg.startswith("error:") else f"error: {msg}", file=sys.stderr)
        return 1


def run(args):
    global _ENCODER
    files = sources.expand_inputs(args.inputs)
    tok = tokenize.HFTokenizer(args.tokenizer, args.bos, args.eos, args.no_bos, args.no_eos,
                               args.tokenizer_backend) if args.tokenizer else tokenize.ByteTokenizer()
    typecode = "H" if tok.vocab_size < 65536 else "i"
    itemsize = 2 if typecode == "H" else 4
    try:
        shard_tokens = parse_size(args.shard_size, itemsize) if args.shard_size else None
    except argparse.ArgumentTypeError as e:
        raise InputError(str(e))
    chunk_bytes = max(1, int(args.chunk_mb * 1e6))
    field = args.chat_field or args.field
    out = args.output
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    stats = [os.stat(f) for f in files]
    header = {
        "format": "engine-token-manifest", "version": 1, "dtype": DTYPE_NAMES[typecode],
        "vocab_size": tok.vocab_size, "loss_masking_spans": bool(args.chat_field), "tokenizer": tok.describe(),
        "options": {"field": field, "chat": bool(args.chat_field),
                    "chat_template": args.chat_template if args.chat_field else None,
                    "train_roles": args.train_roles if args.chat_field else None,
                    "shard_tokens": shard_tokens, "chunk_bytes": chunk_bytes},
        "inputs": [{"path": os.path.abspath(f), "bytes": s.st_size, "mtime_ns": s.st_mtime_ns}
                   for f, s in zip(files, stats)],
    }
    manifest = Manifest(out + ".manifest.json", header)
    lock_path = out + ".lock"
    lock = open(lock_path, "w")
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise InputError(f"{out}: another prepare_data.py is writing this output ({lock_path} is locked)")
        return prepare(args, files, stats, tok, typecode, shard_tokens, chunk_bytes, field, manifest)
    finally:
        tok.close()
        os.remove(lock_path)
        lock.close()


def prepare(args, files, stats, tok, typecode, shard_tokens, chunk_bytes, field, manifest):
    global _ENCODER
    out = args.output
    log = (lambda m: None) if args.quiet else (lambda m: print(f"prepare: {m}", file=sys.stderr))
    resume = None if args.restart else manifest.load_resumable(log)
    if resume == "done":
        log(f"{manifest.path} is complete for these inputs and settings: nothing to do")
        return summary(manifest, tok, typecode)
    # Temporaries of killed runs (this run holds the lock, so no other writes them).
    for tmp in glob.glob(glob.escape(out) + "*.tmp.*"):
        os.remove(tmp)
    if resume:
        log(f"resuming after shard {len(manifest.shards) - 1} ({files[resume[0]]}, line/row {resume[2]})")
    elif not shard_tokens and manifest.shards:
        manifest.shards = []
    _ENCODER = tokenize.Encoder(tok, field, bool(args.chat_field), args.chat_template,
                                args.train_roles.split(","), typecode)
    offsets = [0]
    for s in stats:
        offsets.append(offsets[-1] + s.st_size)
    start_raw = offsets[resume[0]] if resume else 0
    progress = Progress(offsets[-1], start_raw, args.quiet)
    writer = None
    docs_of_file = collections.Counter()
    itemsize = 2 if typecode == "H" else 4

    def shard_prefix():
        return out if not shard_tokens else f"{out}-{len(manifest.shards):05d}"

    try:
        skip = resume[3] if resume else 0
        for chunk, (data, sizes, spans, text_bytes) in results(chunk_stream(files, field, chunk_bytes, resume),
                                                                args.workers):
            n = len(sizes)
            progress.update(n, len(data) // itemsize, text_bytes, offsets[chunk.file_index] + chunk.raw_end)
            docs_of_file[chunk.file_index] += n
            d, byte = skip, sum(sizes[:skip]) * itemsize
            skip = 0
            while d < n:
                if writer is None:
                    writer = ShardWriter(shard_prefix(), typecode, bool(args.chat_field))
                # The documents [d, e) that fill this shard up to shard_tokens (all when unsharded).
                e, t = d, writer.tokens
                while e < n and (shard_tokens is None or t < shard_tokens):
                    t += sizes[e]
                    e += 1
                end = byte + (t - writer.tokens) * itemsize
                writer.add(data[byte:end], sizes[d:e], spans[d:e] if spans is not None else None)
                d, byte = e, end
                if shard_tokens is not None and writer.tokens >= shard_tokens:
                    entry = writer.close()
                    writer = None
                    entry["next"] = [chunk.file_index, chunk.start, chunk.line, d]
                    manifest.shards.append(entry)
                    manifest.save(complete=False)
        for i in range(resume[0] + 1 if resume else 0, len(files)):
            if docs_of_file[i] == 0:
                raise InputError(f"{files[i]}: no documents (only blank lines)")
        if writer is not None:
            entry = writer.close()
            writer = None
            entry["next"] = [len(files), 0, 0, 0]
            manifest.shards.append(entry)
        if not manifest.shards:
            raise InputError("the inputs hold no documents")
        manifest.save(complete=True)
    finally:
        if writer is not None:
            writer.abort()
    progress.finish()
    return summary(manifest, tok, typecode)


def summary(manifest, tok, typecode):
    docs = sum(s["documents"] for s in manifest.shards)
    tokens = sum(s["tokens"] for s in manifest.shards)
    print(f"documents: {docs}")
    print(f"tokens: {tokens}")
    backend = f", {tok.backend} tokenizer backend" if isinstance(tok, tokenize.HFTokenizer) else ""
    print(f"vocab: {tok.vocab_size} ({tok.name}, {DTYPE_NAMES[typecode]} tokens{backend})")
    names = [s["prefix"] for s in manifest.shards]
    print(f"wrote: {len(names)} shard(s) {names[0]}{' .. ' + names[-1] if len(names) > 1 else ''}, {manifest.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
