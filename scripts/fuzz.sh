#!/usr/bin/env bash
# Builds the libFuzzer targets (`make fuzz`: clang, ASan + UBSan, no CUDA, build-fuzz/) and runs
# each for SECONDS (default 600), FUZZ_JOBS of them at a time (default 2, under nice -n 10).
#   scripts/fuzz.sh [seconds] [target ...]     targets: config memmap_dataset fast_llm_dataset manifest
#                                              safetensors hf_index hf_config metadata metrics
#                                              token_cache tokenizer (default all)
# Each target starts from its checked-in seeds (tests/fuzz/corpus/<target>/, read-only) and a
# working corpus build-fuzz/corpus/<target>/; it runs in libFuzzer's fork mode with crashes,
# timeouts and OOMs ignored, so one finding does not end the run: every finding is written to
# build-fuzz/artifacts/<target>/ (crash-*, timeout-*, leak-*, oom-*; replay one with
# build-fuzz/fuzz_<target> <file>). Prints per target the seconds, executions and findings, and
# exits non-zero when any target found something. Logs: build-fuzz/logs/<target>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-600}
shift || true
ALL=(config memmap_dataset fast_llm_dataset manifest safetensors hf_index hf_config metadata metrics token_cache tokenizer)
TARGETS=("$@")
[ ${#TARGETS[@]} -eq 0 ] && TARGETS=("${ALL[@]}")
JOBS=${FUZZ_JOBS:-2}
B=${FUZZ_BUILD:-build-fuzz}

max_len() {
  case $1 in
#   scripts/fuzz.sh [seconds] [target ...]     targets: config memmap_dataset fast_llm_dataset manifest
#                                              safetensors hf_index hf_config metadata metrics
#                                              token_cache tokenizer (default all)
  esac
}

mkdir -p "$B"
make --no-print-directory fuzz FUZZ_BUILD="$B" -j"$JOBS" >"$B/make.log" 2>&1 || { cat "$B/make.log"; echo "fuzz.sh: make fuzz failed"; exit 1; }
mkdir -p "$B/logs"

run_one() {
  local t=$1
  local art="$B/artifacts/$t/"
  mkdir -p "$B/corpus/$t" "$art"
  rm -f "$art"/crash-* "$art"/timeout-* "$art"/leak-* "$art"/oom-* 2>/dev/null
  local start=$(date +%s)
  nice -n 10 "$B/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$SECONDS_EACH" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art" "$B/corpus/$t" "tests/fuzz/corpus/$t" >"$B/logs/$t.log" 2>&1
  local rc=$? end=$(date +%s)
  echo "$t $((end - start)) $rc" >"$B/logs/$t.time"
}

pids=()
for t in "${TARGETS[@]}"; do
  [ -x "$B/fuzz_$t" ] || { echo "fuzz.sh: no target $t"; exit 1; }
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$JOBS" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
wait

status=0
printf '%-18s %8s %14s %8s  %s\n' target seconds executions corpus findings
for t in "${TARGETS[@]}"; do
  log="$B/logs/$t.log"
  secs=$(awk '{print $2}' "$B/logs/$t.time")
  # Fork mode: "#<execs>: cov: ... corp: <n> ..."; plain mode: "#<execs> ... corp: <n>/...".
  execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
  corp=$(ls "$B/corpus/$t" | wc -l)
  art="$B/artifacts/$t"
  c=$(ls "$art" | grep -c '^crash-'); h=$(ls "$art" | grep -c '^timeout-')
  l=$(ls "$art" | grep -c '^leak-'); o=$(ls "$art" | grep -c '^oom-')
  found="crash $c, hang $h, leak $l, oom $o"
  if [ $((c + h + l + o)) -gt 0 ]; then status=1; found="$found  -> $art"; fi
  printf '%-18s %8s %14s %8s  %s\n' "$t" "$secs" "${execs:-?}" "$corp" "$found"
done
exit $status
