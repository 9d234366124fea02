// Benchmarks of the fused cross-entropy (cuda/loss/cross_entropy.cu, also with z-loss and label
// smoothing) and of the fused distillation losses (cuda/loss/distillation.cu): losses + gradient
// in place over bf16 logits (T, V), every token masked in, grad_scale = 1 / T.
// Bytes counted: the floor of an in-place fused kernel that holds the row on chip, one read and
// one write of the logits (+ labels, mask, losses), with_grad; one read without. The BlockRows
// variant reads the row twice, so its GB/s against this floor is what it achieves with 2/3 of
// its traffic counted. The logits are filled once (random, N(0, 2^2)); timed calls then run on
// the previous call's gradient, which costs the same (no data-dependent work but the rare
// rescale of a running max). Each call includes the bad-label flag's read-back (one stream
// synchronisation). Peers (PyTorch eager and torch.compile on the same shape): docs/PERF.md.
// Distillation: bytes counted are the cluster path's floor, one read of the logits and of the
// teacher's logits (bf16, N(0, 2^2) and N(0, 3^2)) and one write of the gradient; BlockRows
// (Auto at 128256: two such rows need an 8-block cluster, which measured slower) reads both
// twice; the forced Cluster runs time that 8-block cluster.
// The tuning table also times the cross-entropy's BlockRows path and every Cluster size, with
// the barrier and (C > 1) the push exchange.
// Every case also reports the device memory the calls took beyond their inputs (the allocator's
// peak over the timed calls less what was in use before): the bad-label flag, or nothing.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "core/buffer.h"
#include "core/rng.h"
#include "ops/loss.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#include "cuda/loss/cross_entropy.cuh"
#include "cuda/loss/distillation.cuh"
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

// warp-rows, block-rows, cluster4 (barrier exchange), cluster4-push.
std::string variant_name(const cuda::CrossEntropyPlan& plan) {
  const std::string push = plan.exchange == cuda::ClusterExchange::Push ? "-push" : "";
  switch (plan.path) {
    case cuda::CrossEntropyPath::WarpRows:
      return "warp-rows";
    case cuda::CrossEntropyPath::BlockRows:
      return "block-rows";
    case cuda::CrossEntropyPath::Cluster:
      return "cluster" + std::to_string(plan.cluster) + push;
    case cuda::CrossEntropyPath::Auto:
      break;
  }
  return "auto";
}

std::string distill_variant_name(const cuda::DistillPlan& plan) {
  switch (plan.path) {
    case cuda::DistillPath::WarpRows:
      return "warp-rows";
    case cuda::DistillPath::BlockRows:
      return "block-rows";
    case cuda::DistillPath::Cluster:
      return "cluster" + std::to_string(plan.cluster);
    case cuda::DistillPath::Auto:
      break;
  }
  return "auto";
}

struct Shape2 {
  int64_t t, v;
  bool variants;  // also time every forced path (the tuning table)
  const char* note;
};

// Times fn and notes the device memory it took beyond what was in use before.
Result timed(const std::string& name, double bytes, const std::function<void()>& fn,
             std::string note = "") {
  const size_t before = memory_stats(Device::CUDA).in_use;
  reset_peak_memory(Device::CUDA);
  Result res;
  res.name = name;
  res.ms = time_ms(fn);
  res.bytes = bytes;
  const size_t extra = memory_stats(Device::CUDA).peak_in_use - before;
  res.note = (note.empty() ? "" : note + "; ") + "extra memory " + std::to_string(extra) + " B";
  return res;
}
#endif

}  // namespace

BENCH_CASES("loss") {
  std::vector<Result> out;
#ifdef ENGINE_CUDA
  using cuda::CrossEntropyPath;
  if (device::count() == 0) return out;  // nothing to time without a GPU
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
      cuda::CrossEntropyChoice choice;
      bool with_grad;
    };
    using cuda::ClusterExchange;
    std::vector<Run> runs = {{{CrossEntropyPath::Auto}, true}, {{CrossEntropyPath::Auto}, false}};
    if (s.variants) {
      for (Run r : {Run{{CrossEntropyPath::BlockRows}, true}, Run{{CrossEntropyPath::Cluster, 1}, true},
                    Run{{CrossEntropyPath::Cluster, 2}, true}, Run{{CrossEntropyPath::Cluster, 4}, true},
                    Run{{CrossEntropyPath::Cluster, 8}, true}})
        runs.push_back(r);
      for (int c : {2, 4, 8})
        runs.push_back({{CrossEntropyPath::Cluster, c, ClusterExchange::Push}, true});
    }
    for (const Run& r : runs) {
      const auto plan = cuda::cross_entropy_plan(s.v, DType::BF16, r.choice);
      if (!plan) continue;  // e.g. one block cannot hold a 128256-logit row
      const double ms = time_ms([&] {
        cuda::cross_entropy(logits, labels, mask, losses, r.with_grad, scale, r.choice);
      });
      Result res;
      const bool automatic = r.choice.path == CrossEntropyPath::Auto;
      res.name = "cross_entropy " + std::string(r.with_grad ? "fwd+grad " : "fwd ") + shape + " " +
                 (automatic ? "auto=" : "") + variant_name(*plan);
      res.ms = ms;
      res.bytes = static_cast<double>(s.t) * row_bytes * (r.with_grad ? 2 : 1) + side;
      if (automatic && r.with_grad) res.note = s.note;
      out.push_back(res);
    }
    if (s.v != 128256) continue;

    // Cross-entropy with z-loss (and label smoothing): the same kernels, a few more flops.
    const double ce_bytes = static_cast<double>(s.t) * row_bytes * 2 + side;
    out.push_back(timed(
        "cross_entropy+z fwd+grad " + shape + " z 1e-4", ce_bytes,
        [&] { ops::cross_entropy(logits, labels, mask, losses, true, scale, 1e-4f, 0.f, 0); },
        "goal <= 2.5 ms"));
    out.push_back(timed("cross_entropy+z+ls fwd+grad " + shape + " z 1e-4 eps 0.1", ce_bytes, [&] {
      ops::cross_entropy(logits, labels, mask, losses, true, scale, 1e-4f, 0.1f, 0);
    }));

    // Distillation against a teacher's logits of the same shape.
    Owned teacher = empty({s.t, s.v}, DType::BF16, Device::CUDA);
    fill_random(teacher, "bench.loss.teacher", 3.0);
    Owned distill = empty({s.t}, DType::F32, Device::CUDA);
    const double d_bytes = static_cast<double>(s.t) * row_bytes * 3 + side + s.t * 4.0;
    struct DRun {
      ops::DistillParams p;
      cuda::DistillPath path;
    };
    using ops::DistillKind;
    const std::vector<DRun> druns = {
        {{DistillKind::ForwardKL, 2.f, 0.f, 1.f, 0.f}, cuda::DistillPath::Auto},
        {{DistillKind::ReverseKL, 2.f, 0.f, 1.f, 0.f}, cuda::DistillPath::Auto},
        {{DistillKind::SoftCE, 2.f, 0.f, 1.f, 0.f}, cuda::DistillPath::Auto},
        {{DistillKind::ForwardKL, 1.f, 0.f, 1.f, 0.f}, cuda::DistillPath::Auto},
        {{DistillKind::ForwardKL, 2.f, 0.5f, 0.5f, 1e-4f}, cuda::DistillPath::Auto},
        {{DistillKind::ReverseKL, 2.f, 0.5f, 0.5f, 1e-4f}, cuda::DistillPath::Auto},
        {{DistillKind::ForwardKL, 2.f, 0.f, 1.f, 0.f}, cuda::DistillPath::Cluster},
        {{DistillKind::ReverseKL, 2.f, 0.f, 1.f, 0.f}, cuda::DistillPath::Cluster},
    };
    for (const DRun& d : druns) {
      const auto plan = cuda::distillation_plan(s.v, DType::BF16, true, d.path);
      if (!plan) continue;
      const std::string name =
          std::string("distill ") + ops::distill_kind_name(d.p.kind) + " tau " +
          std::to_string(static_cast<int>(d.p.temperature * 10) / 10) + "." +
          std::to_string(static_cast<int>(d.p.temperature * 10) % 10) +
          (d.p.label_weight != 0 ? " +label+z" : "") + " fwd+grad " + shape + " " +
          (d.path == cuda::DistillPath::Auto ? "auto=" : "") + distill_variant_name(*plan);
      out.push_back(timed(name, d_bytes, [&] {
        cuda::distillation_loss(logits, teacher, d.p.label_weight != 0 ? labels.t : Tensor{}, mask,
                                d.p, losses, distill, true, scale, d.path);
      }));
    }
  }
  release_cached_memory(Device::CUDA);
#endif
  return out;
}

}  // namespace engine::bench
