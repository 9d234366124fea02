// The kernel table of `bench train --profile`: names shortened as printed, the table's totals
// and the idle time from overlapping intervals. CUPTI itself runs only on the GPU machine.
#include <doctest/doctest.h>

#include "bench/kernel_profile.h"

using engine::bench::short_kernel_name;

TEST_CASE("bench kernel profile: kernel names lose return type, arguments and engine namespaces") {
  CHECK(short_kernel_name("void engine::cuda::(anonymous namespace)::rmsnorm_fwd<128, true>(engine::bf16 const*, int)") ==
        "rmsnorm_fwd<128, true>");
  CHECK(short_kernel_name("void engine::cuda::flash::fwd_kernel<(anonymous namespace)::Cfg<64> >(Params)") ==
        "flash::fwd_kernel<(anonymous namespace)::Cfg<64> >");
  CHECK(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64") ==
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64");
  CHECK(short_kernel_name("void ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") ==
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  CHECK(short_kernel_name("") == "");
}

TEST_CASE("bench kernel profile: without a recording the table is empty and says so") {
  engine::bench::KernelProfile kp;
  const std::string t = kp.table(2);
  CHECK(t.find("kernel (per step)") != std::string::npos);
  CHECK(t.find("kernels 0.000 ms (sum)") != std::string::npos);
}

TEST_CASE("bench kernel profile: totals per step, overlapping records counted once in busy time") {
  using engine::bench::KernelRecord;
  // Two steps of 10 ms wall: a 4 ms GEMM and a 2 ms all-reduce overlapping it by 1 ms, and a
  // 1 ms norm; per step 7 ms of kernels, 6 ms busy, 4 ms idle.
  std::vector<KernelRecord> r;
  for (uint64_t step = 0; step < 2; ++step) {
    const uint64_t t = step * 10'000'000;
    r.push_back({"gemm", t, t + 4'000'000});
    r.push_back({"allreduce", t + 3'000'000, t + 5'000'000});
    r.push_back({"norm", t + 6'000'000, t + 7'000'000});
  }
  const std::string t = engine::bench::kernel_table(r, 0.020, 2, 2);
  INFO(t);
  CHECK(t.find("gemm") < t.find("allreduce"));          // by total time
  CHECK(t.find("(1 other kernels)") != std::string::npos);  // norm, beyond top 2
  CHECK(t.find("wall 10.000 ms, kernels 7.000 ms (sum), GPU busy 6.000 ms (union), GPU idle 4.000 ms (40.0%)") !=
        std::string::npos);
  CHECK(t.find("4.000   40.0    4000.0     1.500") != std::string::npos);  // gemm: ms, % of wall, us/call, idle
  // The 1 ms gap between the all-reduce's end (5 ms) and the norm (6 ms) is charged to the norm;
  // the step's first kernel (gemm) is charged the 3 ms between the previous norm and it, once.
  CHECK(t.find("idle ms per step before: gemm 1.500, norm 1.000") != std::string::npos);
  // The single gaps, longest first kept, printed in time order with their neighbours.
  CHECK(t.find("longest gaps") != std::string::npos);
  const size_t g1 = t.find("1.000 ms at     5.000: after allreduce, before norm");
  const size_t g2 = t.find("3.000 ms at     7.000: after norm, before gemm");
  const size_t g3 = t.find("1.000 ms at    15.000: after allreduce, before norm");
  CHECK(g1 != std::string::npos);
  CHECK(g2 != std::string::npos);
  CHECK(g3 != std::string::npos);
  CHECK((g1 < g2 && g2 < g3));
}
