// Benchmarks of the fused cross-entropy (cuda/loss/cross_entropy.cu): losses + gradient in
// place over bf16 logits (T, V), every token masked in, grad_scale = 1 / T.
// Bytes counted: the floor of an in-place fused kernel that holds the row on chip, one read and
// one write of the logits (+ labels, mask, losses), with_grad; one read without. The BlockRows
// variant reads the row twice, so its GB/s against this floor is what it achieves with 2/3 of
// its traffic counted. The logits are filled once (random, N(0, 2^2)); timed calls then run on
// the previous call's gradient, which costs the same (no data-dependent work but the rare
// rescale of a running max). Each call includes the bad-label flag's read-back (one stream
// synchronisation). Peers (one H200, ../shared/DEVICE.md): 16384 x 128256 fwd+bwd, PyTorch
// eager 29.8 ms (+27.4 GiB), torch.compile 8.3 ms.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "core/rng.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#include "cuda/loss/cross_entropy.cuh"
#endif

namespace engine::bench {
namespace {

#ifdef ENGINE_CUDA
// Random bf16 logits: a 16-row tile generated on the host, copied over the whole tensor.
void fill_logits(const Tensor& logits) {
  const int64_t t = logits.size(0), v = logits.size(1), tile_rows = std::min<int64_t>(16, t);
  Owned tile = empty({tile_rows, v}, DType::BF16, Device::CPU);
  const PhiloxKey key = philox_key(1234, "bench.loss.logits");
  for (int64_t i = 0; i < tile->numel(); ++i)
    tile.ptr<bf16>()[i] =
        bf16(static_cast<float>(2.0 * philox_normal(key, static_cast<uint64_t>(i))));
  Owned tile_dev = empty(tile->shape, DType::BF16, Device::CUDA);
  copy_tensor(tile_dev, tile);
  for (int64_t r = 0; r < t; r += tile_rows) {
    const int64_t n = std::min(tile_rows, t - r);
    copy_tensor(logits.slice(r, r + n), tile_dev.t.slice(0, n));
  }
}

std::string variant_name(const cuda::CrossEntropyPlan& plan) {
  switch (plan.path) {
    case cuda::CrossEntropyPath::WarpRows:
      return "warp-rows";
    case cuda::CrossEntropyPath::BlockRows:
      return "block-rows";
    case cuda::CrossEntropyPath::Cluster:
      return "cluster" + std::to_string(plan.cluster);
    case cuda::CrossEntropyPath::Auto:
      break;
  }
  return "auto";
}

struct Shape2 {
  int64_t t, v;
  bool variants;  // also time every forced path (the tuning table)
  const char* note;
};
#endif

}  // namespace

BENCH_CASES("loss") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  using cuda::CrossEntropyPath;
  if (cuda::device_count() == 0) return out;  // nothing to time without a GPU
  const Shape2 shapes[] = {
      {16384, 128256, true, "peer: torch eager 29.8 ms, torch.compile 8.3 ms"},
      {16384, 32000, true, ""},
      {32768, 50304, true, ""},
  };
  for (const Shape2& s : shapes) {
    Owned logits = empty({s.t, s.v}, DType::BF16, Device::CUDA);
    fill_logits(logits);
    Owned labels_host = empty({s.t}, DType::I32, Device::CPU),
          mask_host = empty({s.t}, DType::U8, Device::CPU);
    const PhiloxKey key = philox_key(1234, "bench.loss.labels");
    for (int64_t i = 0; i < s.t; ++i) {
      labels_host.ptr<int32_t>()[i] = static_cast<int32_t>(
          philox_u64(key, static_cast<uint64_t>(i)) % static_cast<uint64_t>(s.v));
      mask_host.ptr<uint8_t>()[i] = 1;
    }
    Owned labels = empty({s.t}, DType::I32, Device::CUDA),
          mask = empty({s.t}, DType::U8, Device::CUDA);
    copy_tensor(labels, labels_host);
    copy_tensor(mask, mask_host);
    Owned losses = empty({s.t}, DType::F32, Device::CUDA);
    const float scale = 1.f / static_cast<float>(s.t);
    const double row_bytes = static_cast<double>(s.v) * 2.0,
                 side = static_cast<double>(s.t) * (4 + 1 + 4);
    const std::string shape = std::to_string(s.t) + " x " + std::to_string(s.v) + " bf16";

    struct Run {
      CrossEntropyPath path;
      int cluster;
      bool with_grad;
    };
    std::vector<Run> runs = {{CrossEntropyPath::Auto, 0, true}, {CrossEntropyPath::Auto, 0, false}};
    if (s.variants)
      for (Run r :
           {Run{CrossEntropyPath::BlockRows, 0, true}, Run{CrossEntropyPath::Cluster, 1, true},
            Run{CrossEntropyPath::Cluster, 2, true}, Run{CrossEntropyPath::Cluster, 4, true},
            Run{CrossEntropyPath::Cluster, 8, true}})
        runs.push_back(r);
    for (const Run& r : runs) {
      const auto plan = cuda::cross_entropy_plan(s.v, DType::BF16, r.path, r.cluster);
      if (!plan) continue;  // e.g. one block cannot hold a 128256-logit row
      const double ms = time_ms([&] {
        cuda::cross_entropy(logits, labels, mask, losses, r.with_grad, scale, r.path, r.cluster);
      });
      Result res;
      res.name = "cross_entropy " + std::string(r.with_grad ? "fwd+grad " : "fwd ") + shape + " " +
                 (r.path == CrossEntropyPath::Auto ? "auto=" : "") + variant_name(*plan);
      res.ms = ms;
      res.bytes = static_cast<double>(s.t) * row_bytes * (r.with_grad ? 2 : 1) + side;
      if (r.path == CrossEntropyPath::Auto && r.with_grad) res.note = s.note;
      out.push_back(res);
    }
  }
  release_cached_memory(Device::CUDA);
#endif
  return out;
}

}  // namespace engine::bench
