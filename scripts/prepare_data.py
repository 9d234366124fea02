#!/usr/bin/env python3
"""Tokenizes text or JSONL into a Megatron `.bin` + `.idx` (version 1) token dataset.

Inputs: `.txt` files (one document per blank-line-separated paragraph) or JSONL files (`.jsonl`,
`.json`; one object per line, the document in --field, default "text"). Output: OUTPUT.bin and
OUTPUT.idx in the format csrc/data/dataset_writer.cpp writes: tokens as uint16 when the
vocabulary has fewer than 65536 entries, else int32; written to temporary names, fsynced, then
renamed. A write that fails (full disk, size limit) is an error naming the file; the temporary
files are removed and an existing OUTPUT stays as it was.

Tokenizers:
  default      byte level: token = UTF-8 byte (0..255), end-of-document token 256 appended to
               every document, vocabulary 257 (set model.vocab_size >= 257). Standard library only.
  --tokenizer  a Hugging Face `tokenizer.json`, through the `tokenizers` package (imported only
               then); --eos (a token string or an id) is appended to every document.

The engine derives the validation split itself (data.valid_fraction).

    python3 scripts/prepare_data.py corpus.jsonl --output data/corpus
    python3 scripts/prepare_data.py a.txt b.txt --output data/ab --tokenizer tokenizer.json --eos "</s>"
"""
import argparse
import errno
import json
import os
import struct
import sys
from array import array

MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"H": 8, "i": 4}  # array typecode -> .idx dtype code (uint16, int32)
BYTE_EOS = 256
BYTE_VOCAB = 257


def read_documents(path: str, field: str):
    """Yields the documents of one input file."""
    if path.endswith((".jsonl", ".json")):
        with open(path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{line_number}: invalid JSON: {e}")
                if not isinstance(obj, dict) or field not in obj:
                    raise SystemExit(f"{path}:{line_number}: no field {field!r}")
                text = obj[field]
                if not isinstance(text, str):
                    raise SystemExit(f"{path}:{line_number}: field {field!r} is not a string")
                yield text
        return
    with open(path, encoding="utf-8") as f:
        paragraph = []
        for line in f:
            if line.strip():
                paragraph.append(line.rstrip("\n"))
            elif paragraph:
                yield "\n".join(paragraph)
                paragraph = []
        if paragraph:
            yield "\n".join(paragraph)


class ByteTokenizer:
    vocab_size = BYTE_VOCAB

    def encode(self, text: str):
        return list(text.encode("utf-8")) + [BYTE_EOS]


class HFTokenizer:
    def __init__(self, path: str, eos):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise SystemExit("--tokenizer needs the `tokenizers` package: pip install tokenizers")
        self._tok = Tokenizer.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._eos = None
        if eos is not None:
            self._eos = int(eos) if eos.isdigit() else self._tok.token_to_id(eos)
            if self._eos is None or not 0 <= self._eos < self.vocab_size:
                raise SystemExit(f"--eos {eos!r} is not a token of {path}")

    def encode(self, text: str):
        ids = self._tok.encode(text).ids
        if self._eos is not None:
            ids.append(self._eos)
        return ids


def write_error(path: str, e: OSError) -> SystemExit:
    """A failed write (full disk, size limit, I/O error) as an error naming the file and the reason."""
    return SystemExit(f"error: cannot write {path}: {e.strerror or e}")


class IndexedWriter:
    """Streams documents into OUTPUT.bin; writes OUTPUT.idx (version 1) on close. Every write is
    checked: a failure is an error naming the file, and abort() removes the temporary files."""

    def __init__(self, prefix: str, vocab_size: int):
        self.prefix = prefix
        self.typecode = "H" if vocab_size < 65536 else "i"
        self.itemsize = array(self.typecode).itemsize
        self.vocab_size = vocab_size
        self.sizes = []
        self.tokens = 0
        self._tmp_bin = f"{prefix}.bin.tmp.{os.getpid()}"
        self._tmp_idx = f"{prefix}.idx.tmp.{os.getpid()}"
        self._bin = None
        try:
            self._bin = open(self._tmp_bin, "wb")
        except OSError as e:
            raise write_error(self._tmp_bin, e) from None

    def add(self, ids):
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            raise SystemExit(f"token id outside [0, {self.vocab_size}) in document {len(self.sizes)}")
        a = array(self.typecode, ids)
        if sys.byteorder != "little":
            a.byteswap()
        try:
            self._bin.write(a.tobytes())
        except OSError as e:
            raise write_error(self._tmp_bin, e) from None
        self.sizes.append(len(ids))
        self.tokens += len(ids)

    def close(self):
        n = len(self.sizes)
        try:
            self._bin.flush()
            os.fsync(self._bin.fileno())
            self._bin.close()
        except OSError as e:
            raise write_error(self._tmp_bin, e) from None
        pointers, offset = array("q"), 0
        for size in self.sizes:
            pointers.append(offset)
            offset += size * self.itemsize
        arrays = [array("i", self.sizes), pointers, array("q", range(n + 1))]
        try:
            with open(self._tmp_idx, "wb") as f:
                f.write(MAGIC)
                f.write(struct.pack("<Q", 1))
                f.write(struct.pack("<B", DTYPE_CODES[self.typecode]))
                f.write(struct.pack("<QQ", n, n + 1))
                for a in arrays:
                    if sys.byteorder != "little":
                        a.byteswap()
                    f.write(a.tobytes())
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise write_error(self._tmp_idx, e) from None
        for tmp, final in ((self._tmp_bin, self.prefix + ".bin"), (self._tmp_idx, self.prefix + ".idx")):
            try:
                os.replace(tmp, final)
            except OSError as e:
                raise SystemExit(f"error: cannot rename {tmp} to {final}: {e.strerror or e}") from None
        # The renames are durable once the folder is synchronised (where folders can be).
        folder = os.path.dirname(os.path.abspath(self.prefix))
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise SystemExit(f"error: cannot fsync the folder {folder}: {e.strerror or e}") from None
        finally:
            os.close(fd)

    def abort(self):
        if self._bin is not None:
            try:
                self._bin.close()  # flushes what is buffered: fails again on a full disk
            except OSError:
                pass
        for p in (self._tmp_bin, self._tmp_idx):
            if os.path.exists(p):
                os.remove(p)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help=".txt or .jsonl files")
    parser.add_argument("--output", "-o", required=True, help="output prefix: writes OUTPUT.bin and OUTPUT.idx")
    parser.add_argument("--field", default="text", help="JSONL field holding the text (default: text)")
    parser.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (needs the tokenizers package)")
    parser.add_argument("--eos", help="with --tokenizer: end-of-document token (string or id) to append")
    args = parser.parse_args()
    if args.eos is not None and args.tokenizer is None:
        parser.error("--eos needs --tokenizer (the byte-level tokenizer always appends 256)")
    for path in args.inputs:
        if not os.path.isfile(path):
            parser.error(f"no such file: {path}")
    tokenizer = HFTokenizer(args.tokenizer, args.eos) if args.tokenizer else ByteTokenizer()
    folder = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(folder, exist_ok=True)
    writer = IndexedWriter(args.output, tokenizer.vocab_size)
    try:
        for path in args.inputs:
            for text in read_documents(path, args.field):
                writer.add(tokenizer.encode(text))
        writer.close()
    except BaseException:
        writer.abort()
        raise
    kind = "uint16" if writer.typecode == "H" else "int32"
    print(f"documents: {len(writer.sizes)}")
    print(f"tokens: {writer.tokens}")
    print(f"vocab: {tokenizer.vocab_size} ({'byte-level' if not args.tokenizer else args.tokenizer}, {kind} tokens)")
    print(f"wrote: {args.output}.bin {args.output}.idx")
    return 0


if __name__ == "__main__":
    sys.exit(main())
