#!/usr/bin/env bash
# Throughput of scripts/prepare_data.py, self-contained: builds a JSONL corpus from the Python
# sources under site-packages (one document per .py file, up to MB megabytes), trains a 50k BPE
# tokenizer.json on part of it with the `tokenizers` package (installed when missing), then times
# prepare_data.py with the byte-level tokenizer and with that tokenizer.json, WORKERS processes,
# through the tokenizer backend(s) BACKEND (engine: ./tokenize, run make first; hf: tokenizers;
# both: each in turn, the default, and their outputs compared byte for byte).
#   scripts/bench_prepare.sh [MB (default 120)] [WORKERS (default: every core)] [BACKEND (engine|hf|auto|both)]
# Env: BENCH_DIR (default /tmp/bench_prepare; reused: corpus and tokenizer are built once),
#      PYTHON (default python3). Prints one line per tokenizer: MB of text, seconds, MB/s.
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-120}
WORKERS=${2:-$(nproc)}
BACKEND=${3:-both}
case $BACKEND in
  engine|hf|auto) BACKENDS=$BACKEND ;;
  both) BACKENDS="engine hf" ;;
  *) echo "bench_prepare.sh: BACKEND $BACKEND: expected engine, hf, auto or both" >&2; exit 2 ;;
esac
if [[ $BACKENDS == *engine* && ! -x ./tokenize ]]; then
  echo "bench_prepare.sh: the engine backend needs ./tokenize: run make first" >&2
  exit 2
fi
PY=${PYTHON:-python3}
DIR=${BENCH_DIR:-/tmp/bench_prepare}
mkdir -p "$DIR"
$PY -c "import tokenizers" 2>/dev/null || $PY -m pip install --quiet --user tokenizers

CORPUS="$DIR/corpus-${MB}MB.jsonl"
if [[ ! -s "$CORPUS" ]]; then
  $PY - "$CORPUS" "$MB" <<'PYEOF'
import json, os, site, sys, sysconfig
out, limit = sys.argv[1], int(float(sys.argv[2]) * 1e6)
roots = sorted(set(site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_paths()["stdlib"]]))
total = docs = 0
with open(out + ".tmp", "w", encoding="utf-8") as f:
    # Passes over the sources until the size is reached (a small site-packages repeats).
    while total < limit:
        before = total
        for root in roots:
            for d, dirs, names in os.walk(root):
                dirs.sort()
                for n in sorted(names):
                    if not n.endswith(".py") or total >= limit:
                        continue
                    try:
                        text = open(os.path.join(d, n), encoding="utf-8").read()
                    except (OSError, UnicodeDecodeError):
                        continue
                    if text.strip():
                        f.write(json.dumps({"text": text}) + "\n")
                        total += len(text.encode())
                        docs += 1
        if total == before:
            sys.exit("no Python sources found under " + ", ".join(roots))
os.replace(out + ".tmp", out)
print(f"corpus: {out}: {docs} documents, {total / 1e6:.1f} MB of text")
PYEOF
fi

TOK="$DIR/bpe50k.json"
if [[ ! -s "$TOK" ]]; then
  $PY - "$CORPUS" "$TOK" <<'PYEOF'
import itertools, json, sys, time
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
corpus, out = sys.argv[1], sys.argv[2]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=50000, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
def texts(limit=30_000_000):  # the first 30 MB train it
    seen = 0
    for line in open(corpus, encoding="utf-8"):
        t = json.loads(line)["text"]
        seen += len(t)
        if seen > limit:
            return
        yield t
t0 = time.time()
tok.train_from_iterator(texts(), trainer)
tok.save(out)
print(f"tokenizer: {out}: vocab {tok.get_vocab_size()}, trained in {time.time() - t0:.0f} s")
PYEOF
fi

TEXT_MB=$($PY -c "import json,sys; print(sum(len(json.loads(l)['text'].encode()) for l in open(sys.argv[1], encoding='utf-8')) / 1e6)" "$CORPUS")
echo "prepare_data.py, $WORKERS workers, $(nproc) cores, corpus $TEXT_MB MB of text ($(basename "$CORPUS")):"
run() {  # name, extra args...
  local name=$1
  shift
  local t0 t1
  t0=$(date +%s.%N)
  $PY scripts/prepare_data.py "$CORPUS" -o "$DIR/out-$name" --workers "$WORKERS" --restart --quiet "$@" >"$DIR/$name.log"
  t1=$(date +%s.%N)
  $PY -c "import sys; mb, s = float(sys.argv[2]), float(sys.argv[4]) - float(sys.argv[3]); print(f'  {sys.argv[1]:<15} {mb:8.1f} MB {s:8.1f} s {mb / s:8.2f} MB/s  ' + open(sys.argv[5]).read().split(chr(10))[1])" \
    "$name" "$TEXT_MB" "$t0" "$t1" "$DIR/$name.log"
}
run byte-level
for b in $BACKENDS; do
  run "bpe50k-$b" --tokenizer "$TOK" --eos "<|endoftext|>" --tokenizer-backend "$b"
done
if [[ $BACKEND == both ]]; then
  for ext in bin idx; do
    cmp -s "$DIR/out-bpe50k-engine.$ext" "$DIR/out-bpe50k-hf.$ext" || { echo "  the engine and hf outputs differ (.$ext)"; exit 1; }
  done
  echo "  engine and hf outputs: equal"
fi
