"""The engine's own tokenizer (csrc/tokenizer) behind --tokenizer-backend engine: ./tokenize (built
by `make`) run as a pipe server, one per process that encodes (a forked worker starts its own on
first use; the server exits when its stdin closes, so a killed worker takes it along).

The protocol is in csrc/train/main_tokenize.cpp: requests and replies of 32-bit little-endian
integers and bytes; each request is written whole and then its reply read whole (the server reads
a request completely before it writes, so this cannot deadlock on full pipes).
"""
import json
import os
import re
import struct
import subprocess
import sys
from array import array

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROGRAM = os.path.join(ROOT, "tokenize")


class EngineUnavailable(Exception):
    """Why the engine backend cannot take this tokenizer (the program is missing, or it refuses the
    tokenizer.json: a feature it does not implement)."""


class EngineError(Exception):
    """The server refused one text of a batch: .index is the text's position, str() the reason."""

    def __init__(self, index, message):
        super().__init__(message)
        self.index = index


def _shown(path):
    """A path as a command line would name it: relative to here, ./ for the current folder."""
    rel = os.path.relpath(path)
    return rel if os.sep in rel else "./" + rel


def _u32(n):
    return struct.pack("<I", n)


class EngineTokenizer:
    def __init__(self, file, program=PROGRAM):
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise EngineUnavailable(f"{_shown(program)} (the engine's tokenizer program) is missing: run make first")
        self.file, self.program = os.path.abspath(file), program
        self._proc = None
        self._pid = None
        try:
            info = json.loads(self._request(b"I").decode("utf-8"))
        except EngineError as e:
            raise EngineUnavailable(str(e))
        self.vocab_size = info["vocab_size"]
        self.template_bos = info["template_bos"]
        self.describe = info["describe"]

    def _server(self):
        if self._proc is None or self._pid != os.getpid():
            # A process forked from the one that started the server never writes to its pipes.
            self._proc = subprocess.Popen([self.program, self.file, "--serve"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            self._pid = os.getpid()
        return self._proc

    def _died(self):
        p = self._proc
        self._proc = None
        try:
            p.stdin.close()
        except OSError:
            pass
        err = p.stderr.read().decode("utf-8", "replace").strip()
        code = p.wait()
        # The server prints "tokenize: <file>: <what>"; keep what it says, one line.
        msg = err.splitlines()[-1] if err else f"{_shown(self.program)} exited with code {code}"
        msg = re.sub(r" at csrc/\S+:\d+$", "", msg)  # the C++ check's source position
        return EngineError(-1, msg[len("tokenize: "):] if msg.startswith("tokenize: ") else msg)

    def _read(self, n):
        data = self._proc.stdout.read(n)
        if len(data) != n:
            raise self._died()
        return data

    def _send(self, *parts):
        """Writes one request and reads its status; a refusal (status 1) raises EngineError."""
        p = self._server()
        try:
            for part in parts:
                p.stdin.write(part)
            p.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died()
        if struct.unpack("<i", self._read(4))[0] != 0:
            m = self._read_bytes().decode("utf-8", "replace")
            head, _, why = m.partition(" of the batch: ")  # encode: "text I of the batch: why"
            index = int(head[5:]) if head.startswith("text ") and head[5:].isdigit() else -1
            raise EngineError(index, why or m)

    def _read_u32(self):
        return struct.unpack("<I", self._read(4))[0]

    def _read_bytes(self):
        return self._read(self._read_u32())

    def _request(self, payload):
        self._send(payload)
        return self._read_bytes()

    def close(self):
        """Ends this process's server (the next request starts another)."""
        if self._proc is not None and self._pid == os.getpid():
            self._proc.stdin.close()
            self._proc.stdout.close()
            self._proc.stderr.close()
            self._proc.wait()
        self._proc = None

    def token_to_id(self, text):
        b = text.encode("utf-8")
        self._send(b"T" + _u32(len(b)) + b)
        tid = struct.unpack("<i", self._read(4))[0]
        return None if tid < 0 else tid

    def decode(self, ids):
        return self._request(b"D" + _u32(len(ids)) + array("i", ids).tobytes()).decode("utf-8")

    def encode_many(self, texts, raw=None):
        """Lists of ids, one per text (raw: the texts' UTF-8, when the caller has it)."""
        raw = raw if raw is not None else [t.encode("utf-8") for t in texts]
        for i, r in enumerate(raw):  # the protocol's lengths are 32-bit
            if len(r) >= 1 << 32:
                raise EngineError(i, f"a document of {len(r)} bytes: the engine's tokenizer takes documents "
                                     "under 4 GiB (split it, or --tokenizer-backend hf)")
        n = len(raw)
        lens = array("I", map(len, raw))
        if sys.byteorder != "little":
            lens.byteswap()
        self._send(b"E" + _u32(n) + lens.tobytes(), b"".join(raw))
        counts = array("I")
        counts.frombytes(self._read(4 * n))
        if sys.byteorder != "little":
            counts.byteswap()
        ids = array("i")
        ids.frombytes(self._read(4 * sum(counts)))
        if sys.byteorder != "little":
            ids.byteswap()
        flat = ids.tolist()
        out, k = [], 0
        for c in counts:
            out.append(flat[k:k + c])
            k += c
        return out
