#!/usr/bin/env bash
# What runs on the GPU machine: build, the full test suite (GPU cases run there), kernel and
# end-to-end training benchmarks, and the PyTorch reference for the same shapes. Every step
# writes its log under $OUT (the device tool's output folder) or ./gpu-logs.
# usage: scripts/gpu_check.sh [build] [test] [bench] [train] [dp] [tp] [pp] [torch] [families]
#                            [portable | portable-build portable-test portable-train]
#   (default: build test bench train); dp, tp and pp need two GPUs (nvidia-h200-x2)
#   portable: the portable kernels on this GPU: an SM=80 build into build-sm80/ (sm_80 code and
#   its PTX, which the driver compiles for the GPU at load: no sm_90a code, so every op takes its
#   portable kernel), its GPU test tier and the two end-to-end benchmarks. It leaves ./train and
#   ./bench linked from build-sm80/ (the next plain make links build/'s again). Each of its
#   three parts fits one 10-minute device command.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-logs}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
steps=("$@")
[[ ${#steps[@]} == 0 ]] && steps=(build test bench train)
for step in "${steps[@]}"; do
  echo "=== $step ($(date +%T))"
  case $step in
    build)
      nvidia-smi >"$out/nvidia-smi.txt" 2>&1
      make -j16 >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
      grep -E "warning" "$out/build.log" | head -20
      ;;
    test)
      timeout 500 scripts/run_tests.sh full >"$out/tests.log" 2>&1
      grep -E "FAILED|ERROR|skipped:|^tests:|slowest|^ +[0-9.]+ s " "$out/tests.log" | head -80
      ;;
    bench)
      timeout 400 ./bench ${BENCH_AREAS:-} >"$out/bench.log" 2>&1
      cat "$out/bench.log"
      ;;
    train)
      for c in configs/bench-gpt2-162m.toml configs/bench-llama-0.9b.toml; do
        timeout 300 ./bench train "$c" 2>&1 | grep -v "^\[" | tee -a "$out/train.log"
      done
      ;;
    dp)  # needs 2 GPUs: the NCCL test cases under mpirun, collective bandwidth, data-parallel throughput
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      mpi=(timeout 300 mpirun -n 2 --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS=4)
      "${mpi[@]}" build/dist_tests -ts=gpu 2>&1 | tee "$out/dp.log" | grep -E "FAILED|ERROR|skipped:|^tests:|^\[doctest\] (test cases|assertions)"
      "${mpi[@]}" ./bench comm 2>&1 | tee -a "$out/dp.log"
      timeout 300 ./bench train configs/bench-llama-0.9b.toml 2>&1 | grep -v "^\[" | tee -a "$out/dp.log"
      for z in 0 1 2 3; do
        "${mpi[@]}" ./bench train configs/bench-llama-0.9b.toml batch.global_batch_size=8 \
          distributed.zero_stage=$z 2>&1 | grep -v "^\[" | tee -a "$out/dp.log"
      done
      ;;
    tp)  # needs 2 GPUs: tensor parallelism (overlap on and off) beside data parallelism on the 0.9B config (run dp first for the tests)
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      mpi=(timeout 300 mpirun -n 2 --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS=4)
      for layout in "batch.global_batch_size=8" \
                    "batch.global_batch_size=4 distributed.tensor_parallel=2" \
                    "batch.global_batch_size=4 distributed.tensor_parallel=2 distributed.tp_overlap=false" \
                    "batch.global_batch_size=4 distributed.tensor_parallel=2 distributed.sequence_parallel=true" \
                    "batch.global_batch_size=4 distributed.tensor_parallel=2 distributed.sequence_parallel=true distributed.tp_overlap=false"; do
        "${mpi[@]}" ./bench train configs/bench-llama-0.9b.toml training.steps=6 $layout 2>&1 | grep -v "^\[" | tee -a "$out/tp.log"
      done
      ;;
    pp)  # needs 2 GPUs: pipeline parallelism (4 micro-batches) beside one GPU and dp2
      export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
      mpi=(timeout 300 mpirun -n 2 --bind-to none -x NCCL_NVLS_ENABLE -x OMP_NUM_THREADS=4)
      timeout 300 ./bench train configs/bench-llama-0.9b.toml training.steps=6 2>&1 | grep -v "^\[" | tee -a "$out/pp.log"
      for layout in "batch.global_batch_size=16 distributed.pipeline_parallel=2" \
                    "batch.global_batch_size=16 distributed.pipeline_parallel=2 distributed.stages_per_rank=2"; do
        "${mpi[@]}" ./bench train configs/bench-llama-0.9b.toml training.steps=6 $layout 2>&1 | grep -v "^\[" | tee -a "$out/pp.log"
      done
      ;;
    torch)
      timeout 500 python3 scripts/bench_torch.py ${TORCH_WHAT:-} 2>&1 | tee "$out/torch.log"
      ;;
    families)  # mixture of experts and Mamba: kernels beside PyTorch, end-to-end hybrid and Mixtral
      timeout 200 ./bench moe 2>&1 | tee "$out/moe.log"
      timeout 200 python3 scripts/bench_torch_moe.py 2>&1 | tee -a "$out/moe.log"
      timeout 200 ./bench mamba 2>&1 | tee "$out/mamba.log"
      timeout 200 python3 scripts/bench_torch_mamba.py 2>&1 | tee -a "$out/mamba.log"
      timeout 200 ./bench gdn 2>&1 | tee "$out/gdn.log"
      timeout 200 python3 scripts/bench_torch_gdn.py 2>&1 | tee -a "$out/gdn.log"
      for c in configs/bench-hybrid-1b.toml configs/bench-linear-hybrid-1b.toml configs/bench-mixtral-small.toml; do
        timeout 300 ./bench train "$c" training.steps=6 2>&1 | grep -v "^\[" | tee -a "$out/train_families.log"
      done
      ;;
    portable | portable-build | portable-test | portable-train)
      b=build-sm80
      # The driver's cache of the PTX it compiled: big enough for every kernel, so the test
      # suite's ./train runs and the benchmarks reuse what the first process compiled.
      export CUDA_CACHE_MAXSIZE=4294967296
      if [[ $step == portable || $step == portable-build ]]; then
        make -j16 BUILD=$b SM=80 train bench $b/engine_tests >"$out/portable_build.log" 2>&1 ||
          { tail -40 "$out/portable_build.log"; exit 1; }
        grep -E "warning" "$out/portable_build.log" | head -20
      fi
      if [[ $step == portable || $step == portable-test ]]; then
        # What the capability layer sees (sm_90 device, sm_80 code compiled by the driver) first.
        $b/engine_tests -tc='capability layer*' -s 2>&1 | grep -E "kernels:|device, sm_|^tests:" | tee "$out/portable_tests.log"
        BUILD=$b timeout 560 scripts/run_tests.sh gpu >>"$out/portable_tests.log" 2>&1
        grep -E "FAILED|ERROR|skipped:|^tests:|slowest|^ +[0-9.]+ s " "$out/portable_tests.log" | head -80
      fi
      if [[ $step == portable || $step == portable-train ]]; then
        for c in configs/bench-gpt2-162m.toml configs/bench-llama-0.9b.toml; do
          timeout 280 ./bench train "$c" >>"$out/portable_train.log" 2>&1
        done
        # The run log's kernel line (which kernels the runs used), then the results.
        grep -E "kernels:" "$out/portable_train.log" | head -1
        grep -E -v "^\[" "$out/portable_train.log"
      fi
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
