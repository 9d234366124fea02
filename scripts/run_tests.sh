#!/usr/bin/env bash
# Runs the test suites and ends with one summary line over all of them:
#   tests: N passed, N failed, N skipped
# usage: scripts/run_tests.sh fast|full|slow|gpu|gpu-slow [extra doctest args]
#   fast: the default tier (seconds); full: + the "full" suite and the multi-rank runs (make test,
#   CI); slow: full + the long "slow" sweeps (opt-in); gpu: the GPU cases alone (a GPU machine);
#   gpu-slow: the GPU's long sweeps (opt-in). Every tier lists its 15 slowest cases.
set -uo pipefail
cd "$(dirname "$0")/.."
tier=${1:-fast}
build=${BUILD:-build}  # the build folder of make BUILD=...
shift || true
export PYTHON=${PYTHON:-python3}
# Two OpenMP threads (CI's two cores), or every core for the GPU tier (its f64 references).
[[ $tier == gpu* ]] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
export TEST_SLOWEST=${TEST_SLOWEST:-15}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

passed=0 failed=0 skipped=0 status=0
run_suite() {  # name, command...
  local name=$1
  shift
  echo "== $name: $*"
  local log
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local line
  line=$(grep -E '^tests: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
  rm -f "$log"
  if [[ -z "$line" ]]; then
    echo "$name: no summary line (exit code $rc): counted as one failure"
    failed=$((failed + 1))
    status=1
    return
  fi
  read -r p f s <<<"$(echo "$line" | sed -E 's/^tests: ([0-9]+) passed, ([0-9]+) failed, ([0-9]+) skipped$/\1 \2 \3/')"
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  [[ $rc != 0 || $f != 0 ]] && status=1
}

args=()
case $tier in
  fast) ;;
  full) args+=(--all) ;;
  slow) args+=(--slow) ;;
  gpu) args+=(-ts=gpu) ;;
  gpu-slow) args+=(-ts=gpu-slow) ;;
  *) echo "unknown tier $tier (fast, full, slow, gpu or gpu-slow)"; exit 2 ;;
esac
start=$(date +%s)
run_suite "unit and model tests" "$build"/engine_tests "${args[@]}" "$@"

# Multi-rank suites (full and slow tiers): the same runner under mpirun, CPU and MPI backend, one
# rank per process with one OpenMP thread each, every case of a world size in one launch. A hung
# collective fails by the timeout, never blocks CI.
if [[ $tier == full || $tier == slow ]]; then
  if command -v mpirun >/dev/null 2>&1; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl_vader_single_copy_mechanism=none  # containers without ptrace/CMA
    mpi=(timeout 300 mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x TEST_SEED)
    export TEST_SEED=${TEST_SEED:-$(( $(date +%s) % 1000000007 ))}
    run_suite "2 ranks" "${mpi[@]}" -n 2 "$build"/dist_tests "${args[@]}" "$@"
    run_suite "3 ranks (collectives, dp3)" "${mpi[@]}" -n 3 "$build"/dist_tests "${args[@]}" "$@"
    run_suite "4 ranks" "${mpi[@]}" -n 4 "$build"/dist_tests "${args[@]}" "$@"
    # dp2 x tp2 x pp2: the 3-D layouts only (eight processes on a small machine).
    run_suite "8 ranks (dp2 x tp2 x pp2)" "${mpi[@]}" -n 8 "$build"/dist_tests -tc="*pipeline parallel*" "${args[@]}" "$@"
  else
    echo "== multi-rank suites: skipped (no mpirun; make deps installs OpenMPI)"
    skipped=$((skipped + 1))
  fi
fi
echo "== total time $(( $(date +%s) - start )) s"
echo "tests: $passed passed, $failed failed, $skipped skipped"
exit $status
