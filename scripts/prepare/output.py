"""Shards and the manifest.

A shard is a Megatron .bin + .idx pair (FORMATS.md): version 1, or version 2 with loss-masking
spans (stored with inclusive ends). Each is written to temporary names (<file>.tmp.<pid>),
fsynced and renamed into place, then recorded in OUTPUT.manifest.json, which is itself replaced
atomically after every shard: "complete": false with a "resume" position while the preparation
runs, "complete": true (and no "resume") at the end. The engine refuses an incomplete manifest.
A shard that is renamed but not yet recorded (a kill between the two) is written again by the
resumed run; a temporary file is never mistaken for a shard. Every write is checked: a failure is
an error naming the file and the reason.
"""
import errno
import hashlib
import json
import os
import struct
import sys
from array import array

MAGIC = b"MMIDIDX\x00\x00"
DTYPE_CODES = {"H": 8, "i": 4}  # array typecode -> .idx dtype code (uint16, int32)
DTYPE_NAMES = {"H": "uint16", "i": "int32"}


class WriteError(Exception):
    pass


def write_error(path, e):
    return WriteError(f"error: cannot write {path}: {e.strerror or e}")


def fsync_folder(path):
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise WriteError(f"error: cannot fsync the folder {folder}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def write_atomic(path, data):
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise write_error(tmp, e) from None
    fsync_folder(path)


class ShardWriter:
    """Streams documents into PREFIX.bin; writes PREFIX.idx on close()."""

    def __init__(self, prefix, typecode, with_spans):
        self.prefix, self.typecode, self.with_spans = prefix, typecode, with_spans
        self.itemsize = array(typecode).itemsize
        self.sizes = array("i")
        self.span_counts, self.spans = array("i"), array("i")
        self.tokens = 0
        self._hash = hashlib.sha256()
        self._tmp_bin = f"{prefix}.bin.tmp.{os.getpid()}"
        self._tmp_idx = f"{prefix}.idx.tmp.{os.getpid()}"
        try:
            self._bin = open(self._tmp_bin, "wb")
        except OSError as e:
            self._bin = None
            raise write_error(self._tmp_bin, e) from None

    def add(self, data, sizes, spans):
        """`data`: the documents' tokens (little-endian bytes); `sizes`: tokens per document;
        `spans`: per document a list of [begin, end) (with spans) or None."""
        try:
            self._bin.write(data)
        except OSError as e:
            raise write_error(self._tmp_bin, e) from None
        self._hash.update(data)
        self.sizes.extend(sizes)
        self.tokens += len(data) // self.itemsize
        if self.with_spans:
            for doc in spans:
                self.span_counts.append(len(doc))
                for b, e in doc:
                    self.spans.extend((b, e - 1))

    def close(self):
        """Completes the shard; returns its manifest entry."""
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
        head = MAGIC + struct.pack("<Q", 2 if self.with_spans else 1)
        if self.with_spans:
            head += struct.pack("<B", 1)
        head += struct.pack("<BQQ", DTYPE_CODES[self.typecode], n, n + 1)
        arrays = [self.sizes, pointers] + ([self.span_counts, self.spans] if self.with_spans else [])
        arrays.append(array("q", range(n + 1)))
        if sys.byteorder != "little":
            for a in arrays:
                a.byteswap()
        idx = head + b"".join(a.tobytes() for a in arrays)
        try:
            with open(self._tmp_idx, "wb") as f:
                f.write(idx)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise write_error(self._tmp_idx, e) from None
        # The .idx goes last: a .bin/.idx pair under final names is always complete.
        for tmp, final in ((self._tmp_bin, self.prefix + ".bin"), (self._tmp_idx, self.prefix + ".idx")):
            try:
                os.replace(tmp, final)
            except OSError as e:
                raise WriteError(f"error: cannot rename {tmp} to {final}: {e.strerror or e}") from None
        fsync_folder(self.prefix)
        return {"prefix": os.path.basename(self.prefix), "documents": n, "tokens": self.tokens,
                "bin_bytes": offset, "idx_bytes": len(idx), "bin_sha256": self._hash.hexdigest(),
                "idx_sha256": hashlib.sha256(idx).hexdigest()}

    def abort(self):
        if self._bin is not None:
            try:
                self._bin.close()  # flushes what is buffered: fails again on a full disk
            except OSError:
                pass
        for p in (self._tmp_bin, self._tmp_idx):
            if os.path.exists(p):
                os.remove(p)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 24)
            if not b:
                return h.hexdigest()
            h.update(b)


def shard_ok(folder, entry):
    """Whether a recorded shard's files are there with the recorded sizes and contents."""
    for ext in ("bin", "idx"):
        path = os.path.join(folder, entry["prefix"] + "." + ext)
        try:
            if os.path.getsize(path) != entry[ext + "_bytes"] or file_sha256(path) != entry[ext + "_sha256"]:
                return False
        except OSError:
            return False
    return True


class Manifest:
    """OUTPUT.manifest.json: the settings, the inputs, the finished shards and the resume point."""

    def __init__(self, path, header):
        self.path, self.header = path, header  # header: format .. inputs (what must match to resume)
        self.shards, self.resume = [], None

    def load_resumable(self, log):
        """Takes over the finished shards of an earlier run with the same header; returns the
        resume position (or "done" when that run completed), None to start from the beginning."""
        if not os.path.exists(self.path):
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                old = json.load(f)
        except (OSError, ValueError) as e:
            log(f"{self.path}: unreadable ({e}): starting over")
            return None
        same = all(old.get(k) == v for k, v in self.header.items())
        if not same:
            log(f"{self.path}: written with other inputs or settings: starting over")
            return None
        folder = os.path.dirname(os.path.abspath(self.path))
        shards = old.get("shards", [])
        for i, entry in enumerate(shards):
            if not shard_ok(folder, entry):
                log(f"{entry.get('prefix')}: missing or changed: resuming from there")
                shards = shards[:i]
                break
        if old.get("complete") and len(shards) == len(old.get("shards", [])):
            self.shards = shards
            return "done"
        self.shards = shards
        if not shards:
            return None
        # The position after the last good shard: recorded with it.
        return shards[-1].get("next")

    def save(self, complete):
        m = dict(self.header)
        m["complete"] = complete
        shards = [{k: v for k, v in s.items() if k != "next"} if complete else s for s in self.shards]
        m["documents"] = sum(s["documents"] for s in shards)
        m["tokens"] = sum(s["tokens"] for s in shards)
        m["shards"] = shards
        write_atomic(self.path, (json.dumps(m, indent=1) + "\n").encode())
