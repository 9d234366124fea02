#!/usr/bin/env bash
# The demo: builds the synthetic byte-level corpus, prepares it as a .bin/.idx dataset, trains
# the tiny Llama config on it (CPU when no GPU backend is available), prints samples of what it
# writes and plots its metrics.
#   scripts/demo.sh [config.toml] [section.key=value ...]      (make demo runs it with defaults)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
config=configs/tiny-llama.toml
if [[ $# -gt 0 && "$1" == *.toml ]]; then
  config=$1
  shift
fi
mkdir -p data/demo
if [[ ! -f data/demo/demo.idx ]]; then
  "$PYTHON" scripts/make_demo_corpus.py data/demo/corpus.jsonl
  "$PYTHON" scripts/prepare_data.py data/demo/corpus.jsonl --output data/demo/demo
fi
# The demo replaces its previous run (run.overwrite); a later argument can say otherwise. It prints
# what the model writes (a greedy continuation of "The ") half-way and at its end.
sample=(training.sample_every=100 'training.sample_prompt="The "' training.sample_tokens=64)
./train "$config" run.overwrite=true "${sample[@]}" "$@"
name=$(./train "$config" "${sample[@]}" "$@" --print-config | sed -n 's/^name = "\(.*\)"$/\1/p' | head -n 1)
out=$(./train "$config" "${sample[@]}" "$@" --print-config | sed -n 's/^output_dir = "\(.*\)"$/\1/p' | head -n 1)
run_dir=$out/$name
if "$PYTHON" -c "import matplotlib" >/dev/null 2>&1; then
  "$PYTHON" scripts/plot_metrics.py "$run_dir" -o "$run_dir/metrics.png"
else
  echo "(no matplotlib for $PYTHON: skipped the plot; metrics are in $run_dir/metrics.jsonl)"
fi
