#!/usr/bin/env bash
# Shows that a change leaves training bitwise unchanged on the CPU backend: trains every tiny
# config with two train binaries (before and after the change) in four layouts, and compares
# each step's losses and gradient norms and the final checkpoint's weight and optimizer files
# byte for byte.
#   scripts/check_bitwise.sh OLD_TRAIN NEW_TRAIN [steps (default 6)]
# Layouts: one rank; dp2 with ZeRO 3; tp2 with sequence parallelism; pp2 with 2 stages a rank
# (the last three under mpirun -n 2). Ends with "bitwise: N identical, N differ, N refused"; a
# layout that both binaries refuse alike (the family does not take it) counts as refused, and
# the exit status is non-zero when any case differs.
set -uo pipefail
cd "$(dirname "$0")/.."
old=$(realpath "${1:?usage: scripts/check_bitwise.sh OLD_TRAIN NEW_TRAIN [steps]}")
new=$(realpath "${2:?usage: scripts/check_bitwise.sh OLD_TRAIN NEW_TRAIN [steps]}")
steps=${3:-6}
PYTHON=${PYTHON:-python3}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
if [[ ! -f data/demo/demo.idx ]]; then
  mkdir -p data/demo
  "$PYTHON" scripts/make_demo_corpus.py data/demo/corpus.jsonl
  "$PYTHON" scripts/prepare_data.py data/demo/corpus.jsonl --output data/demo/demo
fi
work=$(mktemp -d /tmp/bitwise.XXXXXX)
mpi=(mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -n 2)
layouts=(
  "1rank|"
  "dp2-z3|distributed.zero_stage=3 batch.micro_batch_size=4"
  "tp2-sp|distributed.tensor_parallel=2 distributed.sequence_parallel=true model.vocab_size=258"
  "pp2x2|distributed.pipeline_parallel=2 distributed.stages_per_rank=2 batch.micro_batch_size=4"
)
same=0 differ=0 refused=0
for config in configs/tiny-*.toml; do
  name=$(basename "$config" .toml)
  for layout in "${layouts[@]}"; do
    tag=${layout%%|*}
    read -r -a extra <<<"${layout#*|}"
    rcs=()
    for side in old new; do
      bin=$old
      [[ $side == new ]] && bin=$new
      launch=()
      [[ $tag != 1rank ]] && launch=("${mpi[@]}")
      "${launch[@]}" "$bin" "$config" run.device=cpu run.output_dir="$work/$side" run.name="$name-$tag" \
        training.steps="$steps" optimizer.warmup_steps=$((steps / 3)) training.checkpoint_every="$steps" training.eval_every="$steps" \
        "${extra[@]}" >"$work/$side-$name-$tag.log" 2>&1
      rcs+=($?)
    done
    if [[ ${rcs[0]} != 0 && ${rcs[1]} != 0 ]]; then
      if [[ "$(grep -m1 error "$work/old-$name-$tag.log")" == "$(grep -m1 error "$work/new-$name-$tag.log")" ]]; then
        echo "$name $tag: refused by both: $(grep -m1 error "$work/new-$name-$tag.log")"
        refused=$((refused + 1))
      else
        echo "$name $tag: DIFFER (both failed, with different errors; logs in $work)"
        differ=$((differ + 1))
      fi
      continue
    fi
    if [[ ${rcs[0]} != 0 || ${rcs[1]} != 0 ]]; then
      echo "$name $tag: DIFFER (exit codes ${rcs[0]} / ${rcs[1]}; logs in $work)"
      differ=$((differ + 1))
      continue
    fi
    if "$PYTHON" - "$work/old/$name-$tag" "$work/new/$name-$tag" <<'PY'
import json, pathlib, sys
a, b = map(pathlib.Path, sys.argv[1:3])
keys = ("step", "loss", "grad_norm", "lr", "valid_loss", "tokens", "loss_tokens")
def rows(d):
    out = []
    for line in (d / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out.append({k: r[k] for k in sorted(r) if k in keys or k.startswith("loss") or k.startswith("valid")})
    return out
ra, rb = rows(a), rows(b)
if ra != rb:
    for x, y in zip(ra, rb):
        if x != y:
            print(f"  metrics differ: {x} against {y}")
            break
    sys.exit(1)
def files(d):
    return {p.relative_to(d): p for p in d.rglob("*") if p.is_file() and p.suffix in (".bin", ".safetensors", ".dat")}
fa, fb = files(a), files(b)
if not fa or fa.keys() != fb.keys():
    print(f"  checkpoint files differ: {sorted(map(str, fa))} against {sorted(map(str, fb))}")
    sys.exit(1)
for k in fa:
    if fa[k].read_bytes() != fb[k].read_bytes():
        print(f"  {k} differs")
        sys.exit(1)
print(f"  {len(ra)} metrics rows, {len(fa)} checkpoint files identical")
PY
    then
      echo "$name $tag: identical"
      same=$((same + 1))
    else
      echo "$name $tag: DIFFER (runs in $work)"
      differ=$((differ + 1))
    fi
  done
done
echo "bitwise: $same identical, $differ differ, $refused refused"
[[ $differ == 0 ]] && rm -rf "$work"
[[ $differ == 0 ]]
