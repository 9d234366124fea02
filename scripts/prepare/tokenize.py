"""Tokenizers, chat rendering and the worker's job: a chunk in, its documents' tokens out.

Tokenizers:
  byte level   token = UTF-8 byte (0..255), EOS 256 after every document, vocabulary 257
  tokenizer    a Hugging Face tokenizer.json, or a model folder holding one; BOS and EOS as the
               folder's tokenizer_config.json (add_bos_token, add_eos_token, bos_token,
               eos_token), then special_tokens_map.json, then generation_config.json
               (bos_token_id, eos_token_id) say. Without a setting, BOS is added when the
               tokenizer's own post-processor adds it, and EOS is appended to every document when
               one is known (a bare tokenizer.json names none: give --eos), whatever
               add_eos_token says (that is about prompts). --bos/--eos (a token or an id) and
               --no-bos/--no-eos override.
               Encoded by --tokenizer-backend: engine (the engine's C++ tokenizer, ./tokenize from
               `make`, several times faster), hf (the `tokenizers` package) or auto (engine when
               it implements everything the tokenizer.json uses, else hf, said in one line).
               Both give the same ids (tests/data/prepare_backend_tests.py compares them).
Texts are encoded without the tokenizer's own special tokens; BOS and EOS are then added here, so
the same rule holds for every tokenizer.

Chat documents (--chat-field): a list of {"role", "content"} messages, each rendered with the
template (default "<|{role}|>\\n{content}\\n"). Everything but the content and template suffix of
the training roles (default: assistant) is a loss-masking span. Each piece is tokenized on its own
so that span boundaries fall between tokens (as Fast-LLM does).
"""
import json
import os
import sys
from array import array

from . import InputError

BYTE_EOS = 256
BYTE_VOCAB = 257
DEFAULT_TEMPLATE = "<|{role}|>\n{content}\n"


class ByteTokenizer:
    name = "byte-level"
    vocab_size = BYTE_VOCAB
    bos, eos = None, BYTE_EOS

    def describe(self):
        return {"kind": "byte-level", "vocab_size": BYTE_VOCAB, "bos": None, "eos": BYTE_EOS}

    def close(self):
        pass


def _token_text(v):
    """A special token as the configs write it: a string or {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _load_json(path):
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            v = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not readable JSON: {e}")
    return v if isinstance(v, dict) else {}


BACKENDS = ("auto", "engine", "hf")


class _HFBackend:
    """The Hugging Face `tokenizers` package."""
    name = "hf"

    def __init__(self, json_text, file):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise InputError("--tokenizer needs the `tokenizers` package: pip install tokenizers "
                             "(or scripts/install_deps.sh; or --tokenizer-backend engine, after make)")
        try:
            self._tok = Tokenizer.from_str(json_text)
        except Exception as e:
            raise InputError(f"{file}: not a tokenizer.json the tokenizers package reads: {e}")
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1 if vocab else 0

    def token_to_id(self, text):
        return self._tok.token_to_id(text)

    def prepended(self):
        """The id the tokenizer's post-processor puts first, or None."""
        ids = self._tok.encode("a", add_special_tokens=True).ids
        return ids[0] if ids else None

    def encode_many(self, texts, raw):
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def close(self):
        pass


class _EngineBackend:
    """The engine's tokenizer (csrc/tokenizer) in ./tokenize, scripts/prepare/engine_tokenizer.py."""
    name = "engine"

    def __init__(self, file):
        from .engine_tokenizer import EngineTokenizer
        self._tok = EngineTokenizer(file)  # raises EngineUnavailable
        self.vocab_size = self._tok.vocab_size

    def token_to_id(self, text):
        return self._tok.token_to_id(text)

    def prepended(self):
        return self._tok.template_bos

    def encode_many(self, texts, raw):
        return self._tok.encode_many(texts, raw)

    def close(self):
        self._tok.close()


def _backend(which, json_text, file, note):
    """--tokenizer-backend: engine, hf, or auto (the engine when it takes the file, else hf, said
    in one line through note)."""
    if which not in BACKENDS:
        raise InputError(f"--tokenizer-backend {which!r}: expected one of {', '.join(BACKENDS)}")
    if which == "hf":
        return _HFBackend(json_text, file)
    from .engine_tokenizer import EngineUnavailable
    try:
        return _EngineBackend(file)
    except EngineUnavailable as e:
        if which == "engine":
            raise InputError(f"--tokenizer-backend engine: {e}")
        note(f"tokenizer backend hf (the tokenizers package), not the engine's: {e}")
        return _HFBackend(json_text, file)


def _stderr_note(msg):
    print(f"prepare: {msg}", file=sys.stderr)


class HFTokenizer:
    """A tokenizer.json (or a model folder holding one), encoded by the backend `backend` picks."""

    def __init__(self, path, bos=None, eos=None, no_bos=False, no_eos=False, backend="auto", note=_stderr_note):
        folder = path if os.path.isdir(path) else None
        file = os.path.join(path, "tokenizer.json") if folder else path
        if not os.path.isfile(file):
            raise InputError(f"{path}: no tokenizer.json" + (" in the folder" if folder else ""))
        with open(file, encoding="utf-8") as f:
            self.json_text = f.read()
        self._tok = _backend(backend, self.json_text, file, note)
        self.backend = self._tok.name
        self.name = file
        self.vocab_size = self._tok.vocab_size
        cfg, smap, gen = {}, {}, {}
        if folder:
            cfg = _load_json(os.path.join(folder, "tokenizer_config.json"))
            smap = _load_json(os.path.join(folder, "special_tokens_map.json"))
            gen = _load_json(os.path.join(folder, "generation_config.json"))
        self.bos = self._special("bos", bos, cfg, smap, gen, file)
        self.eos = self._special("eos", eos, cfg, smap, gen, file)
        if no_bos or self.bos is None:
            add_bos = False
        elif bos is not None:
            add_bos = True
        elif isinstance(cfg.get("add_bos_token"), bool):
            add_bos = cfg["add_bos_token"]
        else:  # what the tokenizer's post-processor does on its own
            add_bos = self._tok.prepended() == self.bos
        # EOS separates documents: appended whenever one is known (a config's add_eos_token says
        # what encode() adds to a prompt, not where a training document ends).
        add_eos = not no_eos and self.eos is not None
        self.bos = self.bos if add_bos else None
        self.eos = self.eos if add_eos else None
        # The engine's server ends here: forked workers start their own on first use.
        self._tok.close()

    def _special(self, which, override, cfg, smap, gen, file):
        if override is not None:
            tid = int(override) if override.isdigit() else self._tok.token_to_id(override)
            if tid is None or not 0 <= tid < self.vocab_size:
                raise InputError(f"--{which} {override!r} is not a token of {file}")
            return tid
        for source in (cfg, smap):
            text = _token_text(source.get(f"{which}_token"))
            if text is not None:
                tid = self._tok.token_to_id(text)
                if tid is None:
                    raise InputError(f"{file}: the configured {which}_token {text!r} is not in the vocabulary")
                return tid
        v = gen.get(f"{which}_token_id")
        if isinstance(v, list):
            v = v[0] if v else None
        return v if isinstance(v, int) and 0 <= v < self.vocab_size else None

    def describe(self):
        import hashlib
        return {"kind": "tokenizer.json", "path": os.path.abspath(self.name), "vocab_size": self.vocab_size,
                "bos": self.bos, "eos": self.eos, "sha256": hashlib.sha256(self.json_text.encode()).hexdigest()}

    def encode_many(self, texts, raw):
        """Lists of ids, one per text (raw: the texts' UTF-8), without BOS/EOS."""
        return self._tok.encode_many(texts, raw)

    def close(self):
        """Ends this process's engine server, if any (the next encode starts another)."""
        self._tok.close()


def render_chat(where, messages, template, train_roles):
    """The pieces of a chat document: [(text, trains)], in order."""
    if not isinstance(messages, list):
        raise InputError(f"{where}: the chat field is a {type(messages).__name__}, expected a list of messages")
    before, after = template.split("{content}")
    pieces = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InputError(f"{where}: message {i} is not an object with string \"role\" and \"content\": "
                             f"{json.dumps(m)[:80]}")
        trains = m["role"] in train_roles
        pieces.append((before.replace("{role}", m["role"]), False))
        pieces.append((m["content"] + after.replace("{role}", m["role"]), trains))
    return pieces


class Encoder:
    """The worker's state: the tokenizer and the field settings (built once per process)."""

    def __init__(self, tokenizer, field, chat, template, train_roles, typecode):
        self.tok, self.field, self.chat = tokenizer, field, chat
        self.template, self.train_roles, self.typecode = template, set(train_roles), typecode

    def run(self, chunk):
        """(tokens bytes (little-endian), sizes array('i'), spans per document or None, text bytes)."""
        from .sources import extract
        records = extract(chunk, self.field)
        texts, shape, wheres = [], [], []  # shape: per document, its pieces' (trains) flags
        for where, value in records:
            if self.chat:
                pieces = render_chat(where, value, self.template, self.train_roles)
                texts += [p for p, _ in pieces]
                wheres += [where] * len(pieces)
                shape.append([t for _, t in pieces])
            else:
                if not isinstance(value, str):
                    raise InputError(f"{where}: field {self.field!r} is a {type(value).__name__}, expected a string")
                texts.append(value)
                wheres.append(where)
        try:
            raw = [t.encode("utf-8") for t in texts]
        except UnicodeEncodeError:  # lone surrogates, from JSON "\ud800" escapes
            for t, where in zip(texts, wheres):
                try:
                    t.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise InputError(f"{where}: text that is not valid Unicode (a lone surrogate "
                                     f"{t[e.start]!r} at character {e.start})")
        text_bytes = sum(map(len, raw))
        encoded = raw if isinstance(self.tok, ByteTokenizer) else self._encode(texts, raw, wheres)
        if isinstance(self.tok, ByteTokenizer) and not self.chat:
            return self._bytes(encoded) + (None, text_bytes)
        return self._ids(encoded, shape) + (text_bytes,)

    def _encode(self, texts, raw, wheres):
        from .engine_tokenizer import EngineError
        try:
            return self.tok.encode_many(texts, raw)
        except EngineError as e:
            where = wheres[e.index] if 0 <= e.index < len(wheres) else "the engine tokenizer"
            raise InputError(f"{where}: {e} (--tokenizer-backend hf encodes with the tokenizers package)")

    def _bytes(self, docs):
        # Byte level, no spans: uint16 little-endian = each byte then 0x00, EOS (256) = 00 01.
        joined = b"\x00".join(docs) + b"\x00"
        out = bytearray(2 * len(joined))
        out[0::2] = joined
        sizes = array("i", (len(d) + 1 for d in docs))
        end = 0
        for s in sizes:
            end += s
            out[2 * end - 1] = 1
        return bytes(out), sizes

    def _ids(self, encoded, shape):
        # Token ids (and, for chat, spans: [begin, end) of the pieces that do not train, BOS
        # included when the first piece does not train; adjacent ones merged).
        tokens, sizes, spans = array(self.typecode), array("i"), []
        bos, eos = self.tok.bos, self.tok.eos
        k = 0
        for d in range(len(shape) if self.chat else len(encoded)):
            start = len(tokens)
            doc_spans = []
            if bos is not None:
                tokens.append(bos)
            for trains in shape[d] if self.chat else (True,):
                b = len(tokens) - start
                tokens.extend(encoded[k])
                k += 1
                e = len(tokens) - start
                if trains or e == b:
                    continue
                if b == 1 and bos is not None:
                    b = 0
                if doc_spans and doc_spans[-1][1] == b:
                    doc_spans[-1] = (doc_spans[-1][0], e)
                else:
                    doc_spans.append((b, e))
            if eos is not None:
                tokens.append(eos)
            sizes.append(len(tokens) - start)
            spans.append(doc_spans)
        if sys.byteorder != "little":
            tokens.byteswap()
        return tokens.tobytes(), sizes, spans if self.chat else None
