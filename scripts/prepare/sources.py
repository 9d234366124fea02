"""Inputs and their chunks.

An input is a file (.txt, .jsonl/.json, either plain, .gz or .zst; .parquet; .arrow) or a folder:
a Hugging Face `datasets` folder written by save_to_disk (state.json lists its .arrow files), or
any other folder, whose input files are taken recursively in name order.

The main process cuts every input into chunks of about `chunk_bytes` of text, in order; workers
turn a chunk into records (extract()). Chunks are deterministic given where reading starts, so a
resumed run re-reads the chunk a shard boundary fell in and gets the same documents:
  text    decompressed bytes [start, end), ending after a newline (JSONL) or after a blank line
          (.txt: documents are blank-line-separated paragraphs), first line number carried along
  parquet one row group
  arrow   a row range of the table
Each chunk has `raw_end`, how far the input file is read at its end (compressed bytes for .gz and
.zst), for the progress line's percentage and ETA.
"""
import gzip
import json
import os
import re
import zlib

from . import InputError

TEXT_EXT = (".txt", ".jsonl", ".json")
COMPRESSED = (".gz", ".zst")
_BLANK_LINE = re.compile(rb"\n[ \t\r\f\v]*\n")


def kind_of(path):
    """(format, compression) of an input file, or None when it is not one."""
    name = path.lower()
    comp = ""
    for c in COMPRESSED:
        if name.endswith(c):
            comp, name = c, name[: -len(c)]
    if name.endswith(".txt"):
        return "txt", comp
    if name.endswith((".jsonl", ".json")):
        return "jsonl", comp
    if not comp and name.endswith(".parquet"):
        return "parquet", ""
    if not comp and name.endswith(".arrow"):
        return "arrow", ""
    return None


def expand_inputs(paths):
    """The input files, in order: files as given, folders expanded (see the module comment)."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            if os.path.exists(os.path.join(p, "dataset_dict.json")):
                with open(os.path.join(p, "dataset_dict.json")) as f:
                    splits = json.load(f).get("splits", [])
                raise InputError(f"{p}: a DatasetDict with splits {splits}: give one split's folder, e.g. "
                                 f"{os.path.join(p, splits[0] if splits else 'train')}")
            state = os.path.join(p, "state.json")
            if os.path.exists(state):
                try:
                    with open(state) as f:
                        files = [d["filename"] for d in json.load(f)["_data_files"]]
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise InputError(f"{state}: not a datasets state.json (no _data_files list): {e}")
                out += [os.path.join(p, name) for name in files]
                continue
            found = []
            for root, dirs, names in os.walk(p):
                dirs.sort()
                found += [os.path.join(root, n) for n in sorted(names) if kind_of(n)]
            if not found:
                raise InputError(f"{p}: no input files in the folder (.txt, .jsonl, .json, .gz/.zst of those, "
                                 ".parquet, .arrow)")
            out += found
        elif os.path.isfile(p):
            if not kind_of(p):
                raise InputError(f"{p}: unknown input kind: expected .txt, .jsonl, .json (optionally .gz or "
                                 ".zst), .parquet, .arrow or a folder")
            out.append(p)
        else:
            raise InputError(f"no such file or folder: {p}")
    return out


class Chunk:
    __slots__ = ("file_index", "path", "kind", "start", "line", "data", "raw_end", "rows")

    def __init__(self, file_index, path, kind, start, line, data=None, raw_end=0, rows=0):
        self.file_index, self.path, self.kind = file_index, path, kind
        self.start, self.line, self.data, self.raw_end, self.rows = start, line, data, raw_end, rows


def _open_text(path, comp):
    """A binary stream of the decompressed file, and the raw file under it (for its position)."""
    raw = open(path, "rb")
    if comp == ".gz":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if comp == ".zst":
        try:
            import zstandard
        except ImportError as e:
            raw.close()
            raise InputError(f"{path}: reading .zst needs the zstandard package ({e}): pip install zstandard "
                             "(or scripts/install_deps.sh)")
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True), raw
    return raw, raw


def _read(stream, n, path, offset, line):
    try:
        return stream.read(n)
    except (OSError, EOFError, zlib.error) as e:
        raise InputError(f"{path}: corrupt compressed data after decompressed byte {offset} (line {line}): {e}")
    except Exception as e:  # zstandard.ZstdError has no common base with the above
        if type(e).__name__ == "ZstdError":
            raise InputError(f"{path}: corrupt zstd data after decompressed byte {offset} (line {line}): {e}")
        raise


def text_chunks(file_index, path, fmt, comp, chunk_bytes, start=0, line=1):
    stream, raw = _open_text(path, comp)
    with stream, raw:
        pos = 0
        if start and not comp:
            raw.seek(start)
            pos = start
        while pos < start:  # a resumed compressed file: decompress up to the chunk to re-read
            got = _read(stream, min(1 << 24, start - pos), path, pos, line)
            if not got:
                raise InputError(f"{path}: ends at decompressed byte {pos}, before the resume point {start}: "
                                 "the file changed since the run being resumed")
            pos += len(got)
        buf, eof = b"", False
        while True:
            # The first boundary at or after chunk_bytes - 1 from `pos`, whatever the read sizes.
            cut, searched = -1, chunk_bytes - 1
            while True:
                if len(buf) >= chunk_bytes:
                    if fmt == "jsonl":
                        i = buf.find(b"\n", searched)
                        cut = i + 1 if i >= 0 else -1
                    else:
                        m = _BLANK_LINE.search(buf, searched)
                        cut = m.end() if m else -1
                    # A later search need not look before the last newline seen (a match starts at one).
                    searched = max(searched, buf.rfind(b"\n"), 0)
                if cut > 0 or eof:
                    break
                got = _read(stream, chunk_bytes, path, pos + len(buf), line)
                eof = not got
                buf += got
            if cut <= 0:
                cut = len(buf)
            if cut == 0:
                break
            data, buf = buf[:cut], buf[cut:]
            yield Chunk(file_index, path, fmt, pos, line, data, raw.tell() if comp else pos + len(data))
            pos += len(data)
            line += data.count(b"\n")


def _pyarrow(path, what):
    try:
        import pyarrow  # noqa: F401
    except ImportError as e:
        raise InputError(f"{path}: reading {what} needs the pyarrow package ({e}): pip install pyarrow "
                         "(or scripts/install_deps.sh)")
    import pyarrow.ipc
    import pyarrow.parquet
    return pyarrow


def _arrow_table(path):
    pa = _pyarrow(path, "Arrow files")
    try:
        source = pa.memory_map(path, "r")
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{path}: not a readable Arrow file (IPC stream or file): {e}")


def table_chunks(file_index, path, fmt, field, chunk_bytes, start=0, row=0):
    """Parquet: row groups from `start`; arrow: row ranges from row `start`."""
    pa = _pyarrow(path, "Parquet files" if fmt == "parquet" else "Arrow files")
    size = os.path.getsize(path)
    if fmt == "parquet":
        try:
            meta = pa.parquet.ParquetFile(path).metadata
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"{path}: not a readable Parquet file: {e}")
        if field not in meta.schema.names:
            raise InputError(f"{path}: no column {field!r} (columns: {', '.join(meta.schema.names)})")
        first = sum(meta.row_group(g).num_rows for g in range(start))
        for g in range(start, meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            yield Chunk(file_index, path, fmt, g, first, None, size * (g + 1) // meta.num_row_groups, rows)
            first += rows
        return
    table = _arrow_table(path)
    if field not in table.column_names:
        raise InputError(f"{path}: no column {field!r} (columns: {', '.join(table.column_names)})")
    n = table.num_rows
    per_row = max(1, table.column(field).nbytes // max(n, 1))
    step = max(1, chunk_bytes // per_row)
    for r in range(start, n, step):
        yield Chunk(file_index, path, fmt, r, r, None, size * min(r + step, n) // max(n, 1), min(step, n - r))


# Worker side ------------------------------------------------------------------------------

_TABLES = {}  # per worker process: path -> memory-mapped arrow table / open parquet file


def _decode(chunk):
    try:
        text = chunk.data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = chunk.line + chunk.data.count(b"\n", 0, e.start)
        col = e.start - (chunk.data.rfind(b"\n", 0, e.start) + 1) + 1
        raise InputError(f"{chunk.path}:{line}: not UTF-8 (byte {chunk.data[e.start]:#04x} at column {col}): {e.reason}")
    if "\r" in text:  # universal newlines, as text-mode reading gives
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def extract(chunk, field):
    """(where, value) pairs of a chunk: `where` names the file and line or row, `value` is the
    document's text (a str) or, for the JSON and table kinds, the field's value as stored."""
    if chunk.kind == "txt":
        out, para, first = [], [], chunk.line
        for i, line in enumerate(_decode(chunk).split("\n")):
            if line.strip():
                if not para:
                    first = chunk.line + i
                para.append(line)
            elif para:
                out.append((first, "\n".join(para)))
                para = []
        if para:
            out.append((first, "\n".join(para)))
        return [(f"{chunk.path}:{n}", t) for n, t in out]
    if chunk.kind == "jsonl":
        out = []
        for i, line in enumerate(_decode(chunk).split("\n")):
            if not line.strip():
                continue
            where = f"{chunk.path}:{chunk.line + i}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: invalid JSON: {e}")
            if not isinstance(obj, dict):
                raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            if field not in obj:
                raise InputError(f"{where}: no field {field!r} (fields: {', '.join(list(obj)[:10])})")
            out.append((where, obj[field]))
        return out
    pa = _pyarrow(chunk.path, chunk.kind)
    try:
        if chunk.kind == "parquet":
            pf = _TABLES.get(chunk.path)
            if pf is None:
                pf = _TABLES[chunk.path] = pa.parquet.ParquetFile(chunk.path)
            values = pf.read_row_group(chunk.start, columns=[field]).column(0).to_pylist()
        else:
            table = _TABLES.get(chunk.path)
            if table is None:
                table = _TABLES[chunk.path] = _arrow_table(chunk.path)
            values = table.column(field).slice(chunk.start, chunk.rows).to_pylist()
    except (pa.ArrowException, OSError) as e:
        what = f"row group {chunk.start}" if chunk.kind == "parquet" else f"rows {chunk.start}-"
        raise InputError(f"{chunk.path}: {what} (from row {chunk.line}): cannot read column {field!r}: {e}")
    return [(f"{chunk.path}: row {chunk.line + i}", v) for i, v in enumerate(values)]
