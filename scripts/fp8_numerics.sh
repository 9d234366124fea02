#!/usr/bin/env bash
# FP8 numerics on real text: one model trained STEPS steps on the same data in bf16 and in each
# training.fp8 recipe, then the runs compared (held-out loss, finite losses, spikes) and the
# curves plotted. The corpus is the Python sources under site-packages with a 50k BPE
# tokenizer.json trained on them (both built by scripts/bench_prepare.sh, reused when present).
#   scripts/fp8_numerics.sh [gpt2|llama|tiny] [STEPS (default 2000)] [MB of corpus (default 120)]
#   gpt2:  GPT-2 124M shape (d 768, 12 layers, 12 heads), sequence 1024, 16 sequences a step
#   llama: the 0.89B Llama shape of configs/bench-llama-0.9b.toml, sequence 4096, 4 a step
#   tiny:  d 128, 2 layers, sequence 128, 8 a step (a check of the script itself, CPU-sized)
# Env: FP8_DIR (default /tmp/fp8_numerics), RECIPES (default "off tensorwise rowwise"; the first
#      is the baseline the others are held to), DEVICE (run.device, default auto), PYTHON.
# Writes FP8_DIR/runs/<model>-<recipe>/metrics.jsonl, FP8_DIR/<model>.png, and prints per run:
# final held-out loss and its difference to bf16's, non-finite steps, the largest spike (a
# step's loss above the median of the 20 before it, after the warm-up). Exit status 1 when an FP8
# run's held-out loss is more than 1% above bf16's, a loss is not finite, or its largest spike
# exceeds bf16's by more than 0.1 nats.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-gpt2}
STEPS=${2:-2000}
MB=${3:-120}
RECIPES=${RECIPES:-off tensorwise rowwise}
PY=${PYTHON:-python3}
DIR=${FP8_DIR:-/tmp/fp8_numerics}
[[ -x ./train && -x ./tokenize ]] || { echo "fp8_numerics.sh: run make first (./train, ./tokenize)" >&2; exit 2; }
mkdir -p "$DIR/runs"
DATA="$DIR/out-bpe50k-engine"
[[ -s "$DATA.bin" ]] || BENCH_DIR="$DIR" scripts/bench_prepare.sh "$MB" "$(nproc)" engine

case $MODEL in
  gpt2)
    MODEL_KEYS=$'family = "gpt2"\nhidden_size = 768\nnum_layers = 12\nnum_heads = 12\nffn_hidden_size = 3072\ntie_embeddings = true'
    SEQ=1024 MBS=16 LR=6e-4 ;;
  llama)
    MODEL_KEYS=$'family = "llama"\nhidden_size = 2048\nnum_layers = 16\nnum_heads = 16\nnum_kv_heads = 8\nffn_hidden_size = 5632\nrope_theta = 500000.0'
    SEQ=4096 MBS=4 LR=3e-4 ;;
  tiny)
    MODEL_KEYS=$'family = "llama"\nhidden_size = 128\nnum_layers = 2\nnum_heads = 4\nffn_hidden_size = 256'
    SEQ=128 MBS=8 LR=3e-3 ;;
  *) echo "fp8_numerics.sh: model $MODEL: expected gpt2, llama or tiny" >&2; exit 2 ;;
esac
WARMUP=$((STEPS / 20))
EVAL_EVERY=$((STEPS / 10 > 0 ? STEPS / 10 : 1))

for r in $RECIPES; do
  cat >"$DIR/$MODEL-$r.toml" <<EOF
[run]
name = "$MODEL-$r"
output_dir = "$DIR/runs"
seed = 1
device = "${DEVICE:-auto}"
log_every = 50
[model]
vocab_size = 50048
$MODEL_KEYS
[data]
train = [{ path = "$DATA" }]
valid_fraction = 0.005
sequence_length = $SEQ
[batch]
micro_batch_size = $MBS
global_batch_size = $MBS
[optimizer]
lr = $LR
min_lr = $(awk "BEGIN { print $LR / 10 }")
warmup_steps = $WARMUP
decay = "cosine"
weight_decay = 0.1
grad_clip = 1.0
[training]
steps = $STEPS
eval_every = $EVAL_EVERY
eval_steps = 8
fp8 = "$r"
EOF
  rm -rf "$DIR/runs/$MODEL-$r"
  echo "=== $MODEL $r ($(date +%T))"
  ./train "$DIR/$MODEL-$r.toml" >"$DIR/$MODEL-$r.log" 2>&1 || { tail -5 "$DIR/$MODEL-$r.log"; exit 1; }
  tail -2 "$DIR/$MODEL-$r.log"
done

runs=()
for r in $RECIPES; do runs+=("$DIR/runs/$MODEL-$r"); done
$PY scripts/plot_metrics.py "${runs[@]}" -o "$DIR/$MODEL.png" || true
$PY - "$WARMUP" "${runs[@]}" <<'PYEOF'
import json, math, os, statistics, sys
warmup, runs = int(sys.argv[1]), sys.argv[2:]
def read(run):
    train, valid = [], []
    for line in open(os.path.join(run, "metrics.jsonl")):
        rec = json.loads(line)
        (valid if "valid_loss" in rec else train).append(rec)
    return train, valid
def spike(losses):
    worst = 0.0
    for i in range(max(warmup, 20), len(losses)):
        if math.isfinite(losses[i]):
            worst = max(worst, losses[i] - statistics.median(losses[i - 20:i]))
    return worst
base = None
ok = True
for run in runs:
    train, valid = read(run)
    losses = [r["loss"] for r in train]
    bad = sum(not math.isfinite(v) for v in losses)
    final = valid[-1]["valid_loss"] if valid else float("nan")
    s = spike(losses)
    name = os.path.basename(run)
    if base is None:
        base = (final, s)
        print(f"{name}: held-out {final:.4f}, {len(losses)} steps, non-finite {bad}, largest spike {s:.3f}")
        continue
    rel = final / base[0] - 1
    verdict = rel <= 0.01 and bad == 0 and s <= base[1] + 0.1
    ok = ok and verdict
    print(f"{name}: held-out {final:.4f} ({100 * rel:+.2f}% of bf16's), non-finite {bad}, largest spike {s:.3f}"
          f" (bf16 {base[1]:.3f}): {'pass' if verdict else 'FAIL'}")
sys.exit(0 if ok else 1)
PYEOF
