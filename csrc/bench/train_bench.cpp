#include "bench/train_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "bench/kernel_profile.h"
#include "comm/comm.h"
#include "config/config.h"
#include "core/buffer.h"
#include "core/log.h"
#include "core/rng.h"
#include "models/model.h"
#include "data/dataset_writer.h"
#include "train/trainer.h"

namespace engine::bench {

namespace {

constexpr double kPeakDenseBf16Tflops = 989.0;  // H100/H200 SXM dense bf16 spec, as MFU is quoted

// Random tokens in long documents (attention segments then span whole sequences, as in the
// PyTorch reference, which trains on plain causal sequences).
std::string synthetic_dataset(int64_t vocab, int64_t tokens, int sequence_length) {
  const auto dir = std::filesystem::temp_directory_path() / ("engine_bench." + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string prefix = (dir / "synthetic").string();
  auto writer = make_token_dataset_writer(prefix, vocab);
  const int64_t doc_len = 64 * int64_t{sequence_length} + 7;
  PhiloxKey key = philox_key(1, "bench-tokens");
  std::vector<int32_t> doc(static_cast<size_t>(doc_len));
  for (int64_t done = 0, d = 0; done < tokens; done += doc_len, ++d) {
    for (int64_t i = 0; i < doc_len; ++i)
      doc[static_cast<size_t>(i)] = static_cast<int32_t>(philox_below(key, static_cast<uint64_t>(done + i), static_cast<uint64_t>(vocab)));
    writer->add_document(doc);
  }
  writer->finish();
  return prefix;
}

}  // namespace

int run_train_bench(const std::string& config_path, const std::vector<std::string>& args) {
  std::vector<std::string> o;
  bool profile = false;
  for (const std::string& a : args) {
    if (a == "--profile") profile = true;
    else if (a.rfind("--", 0) == 0) RAISE("bench train: unknown option ", a, " (options: --profile)");
    else o.push_back(a);
  }
  const int profile_steps = profile ? 2 : 0;
  o.push_back("optimizer.warmup_steps=1");  // the schedule is irrelevant to speed; steps may be few
  Config probe = load_config(config_path, o);
  const int warmup = 3;
  const int64_t tokens_needed = int64_t{probe.training.steps + warmup + profile_steps + 1} * probe.batch.global_batch_size *
                                (probe.data.sequence_length + 1);
  o.push_back("data.train=[{path=\"" + synthetic_dataset(probe.model.vocab_size, tokens_needed, probe.data.sequence_length) + "\"}]");
  o.push_back("data.valid=[]");
  o.push_back("data.valid_fraction=0");
  o.push_back("training.eval_every=0");
  o.push_back("training.steps=" + std::to_string(probe.training.steps + warmup + profile_steps));
  Config c = load_config(config_path, o);
  Trainer t(c, false);
  const Device dev = resolve_device(c.run.device);
  for (int i = 0; i < warmup; ++i) t.train_step();
  reset_peak_memory(dev);
  const int timed = probe.training.steps;
  double seconds = 0, loss = 0;
  int64_t tokens = 0;
  std::vector<double> step_seconds;
  for (int i = 0; i < timed; ++i) {
    StepResult r = t.train_step();
    seconds += r.seconds;
    tokens += r.tokens;
    loss = r.loss;
    step_seconds.push_back(r.seconds);
  }
  const ModelConfig& m = c.model;
  const double params = static_cast<double>(model_param_table(c.model).num_parameters());  // the whole model
  const double embed = static_cast<double>(m.vocab_size) * m.hidden_size;  // a lookup, not a matmul
  // Attention scores only in attention blocks (A, E); a token's MoE block multiplies by top-k of
  // the experts only; Mamba's scan and conv are element-wise (left out, like norms).
  const std::string layout = block_layout(m);
  const double attention_layers = static_cast<double>(std::count(layout.begin(), layout.end(), 'A') +
                                                      std::count(layout.begin(), layout.end(), 'E'));
  const double idle_experts = static_cast<double>(std::count(layout.begin(), layout.end(), 'E')) * 3.0 *
                              (m.num_experts - m.experts_per_token) *
                              (m.moe_ffn_hidden_size > 0 ? m.moe_ffn_hidden_size : m.ffn_hidden_size) * m.hidden_size;
  const double attn = 6.0 * attention_layers * c.data.sequence_length * m.num_heads * m.head_dim;  // causal
  const double flops_per_token = 6.0 * (params - embed - idle_experts) + attn;
  const double tps = tokens / seconds;
  const MemoryStats mem = memory_stats(dev);
  const int ranks = world().size();
  if (world().rank() == 0) {
    std::printf("train %s: %s x %d (%s%s), %.0f M parameters, %d x %d tokens per step, %d timed steps\n",
                c.run.name.c_str(), device_name(dev), ranks, t.mesh().describe().c_str(),
                c.distributed.sequence_parallel && t.mesh().tp_size() > 1 ? ", sequence parallel" : "",
                params / 1e6, c.batch.global_batch_size, c.data.sequence_length, timed);
    std::printf("  %.1f k tokens/s, %.3f s/step, MFU %.3f per GPU (of %.0f TFLOP/s), peak memory %s in use, %s reserved, loss %.4f\n",
                tps / 1e3, seconds / timed, tps / ranks * flops_per_token / (kPeakDenseBf16Tflops * 1e12),
                kPeakDenseBf16Tflops, format_bytes(static_cast<double>(mem.peak_in_use)).c_str(),
                format_bytes(static_cast<double>(mem.peak_reserved)).c_str(), loss);
    // The mean above counts one-time costs that land in the timed steps (cuDNN builds a plan the
    // first time a batch shape bucket appears, which the data decides); the median does not.
    if (!step_seconds.empty()) {
      std::vector<double> sorted = step_seconds;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted[sorted.size() / 2];
      std::printf("  step time: median %.1f ms (%.1f k tokens/s), fastest %.1f ms, slowest %.1f ms\n", median * 1e3,
                  static_cast<double>(tokens) / timed / median / 1e3, sorted.front() * 1e3, sorted.back() * 1e3);
    }
    if (ranks > 1) std::printf("  %d ranks: %.1f k tokens/s per rank (memory figures are rank 0's)\n", ranks, tps / ranks / 1e3);
  }
  if (profile) {  // after the timed steps, so the figures above are the unprofiled ones
    KernelProfile kp;
    std::string why;
    if (dev == Device::CPU) why = "the run is on the CPU";
    if (!why.empty() || !kp.start(&why)) {
      if (world().rank() == 0) std::printf("  --profile: not available: %s\n", why.c_str());
    } else {
      for (int i = 0; i < profile_steps; ++i) t.train_step();
      kp.stop();
      if (world().rank() == 0)
        std::printf("  kernel time, %d profiled steps (CUPTI; rank 0):\n%s", profile_steps,
                    kp.table(profile_steps).c_str());
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(std::filesystem::temp_directory_path() / ("engine_bench." + std::to_string(getpid())), ec);
  return 0;
}

}  // namespace engine::bench
