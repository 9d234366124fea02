#include "train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/launch.h"
#include "comm/nccl_comm.h"
#include "core/log.h"
#include "models/model.h"

#ifdef ENGINE_CUDA
#include "cuda/common/device.cuh"
#endif

namespace engine {

namespace {
std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop.store(true); }

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string rate(double tokens_per_s) {
  return tokens_per_s >= 1e6 ? fmt("%.2fM", tokens_per_s / 1e6)
                             : tokens_per_s >= 1e3 ? fmt("%.1fk", tokens_per_s / 1e3) : fmt("%.0f", tokens_per_s);
}
}  // namespace

void Trainer::request_stop() { g_stop.store(true); }

void Trainer::install_signal_handlers() {
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
}

Device resolve_device(DeviceChoice choice) {
#ifdef ENGINE_CUDA
  const int gpus = cuda::device_count();
#else
  const int gpus = 0;
#endif
  switch (choice) {
    case DeviceChoice::CPU: return Device::CPU;
    case DeviceChoice::CUDA:
#ifndef ENGINE_CUDA
      RAISE("run.device = \"cuda\": this build has no CUDA support (built without nvcc)");
#endif
      ENSURE(gpus > 0, "run.device = \"cuda\": no CUDA device is visible");
      return Device::CUDA;
    case DeviceChoice::Auto: return gpus > 0 ? Device::CUDA : Device::CPU;
  }
  return Device::CPU;
}

namespace {
// The device picked before anything touches it: each rank's GPU is its local rank.
Device pick_device(DeviceChoice choice) {
  const Device d = resolve_device(choice);
#ifdef ENGINE_CUDA
  if (d == Device::CUDA) cuda::set_device(launch_info().local_rank % cuda::device_count());
#endif
  return d;
}

// The data-parallel group's communicator: the one given, else the world (NCCL on GPUs).
std::unique_ptr<Comm> device_comm_for(Comm* given, Device device) {
  if (given || device != Device::CUDA || world().size() == 1) return nullptr;
  return make_nccl_comm(world());
}
}  // namespace

Trainer::Trainer(const Config& config, bool write_outputs, Comm* dp)
    : config_(config), device_comm_(device_comm_for(dp, pick_device(config.run.device))),
      dp_(dp ? *dp : device_comm_ ? *device_comm_ : world()), write_outputs_(write_outputs && world().rank() == 0),
      device_(resolve_device(config.run.device)) {
  if (config_.run.debug_level > 0) log_set_level(LogLevel::Debug);
#ifdef ENGINE_CUDA
  if (device_ == Device::CUDA) {
    const int gpu = launch_info().local_rank % cuda::device_count();
    log_info("GPU ", gpu, ": ", cuda::device_description(gpu), ", data-parallel backend ", dp_.backend());
  }
#endif
  const int dp_size = dp_.size();
  BatchConfig& b = config_.batch;
  if (b.global_batch_size % (b.micro_batch_size * dp_size) != 0)
    RAISE(config_.where("batch.global_batch_size"), "must be a multiple of micro_batch_size (", b.micro_batch_size,
          ") x data_parallel (", dp_size, " ranks) = ", b.micro_batch_size * dp_size, ", got ", b.global_batch_size);
  b.accumulation_steps = b.global_batch_size / (b.micro_batch_size * dp_size);
  const DType compute = device_ == Device::CPU ? DType::F32 : DType::BF16;
  // Pad the flat buffers so they split into equal, aligned shards over the dp ranks.
  const int64_t unit = 64 * int64_t{dp_size};
  const int64_t capacity = (model_param_table(config_.model).total_elements() + unit - 1) / unit * unit;
  model_ = make_model(config_.model, device_, compute, capacity);
  model_->params().init(config_.run.seed);
  const auto bucket = static_cast<int64_t>(config_.distributed.reduce_bucket_mb * (1 << 20) / 4);
  optimizer_ = std::make_unique<AdamW>(model_->params(), config_.optimizer, dp_, config_.distributed.zero_stage,
                                       config_.run.seed, bucket);
  const int64_t gb = config_.batch.global_batch_size;
  train_data_ = make_sample_source(config_, Split::Train, int64_t{config_.training.steps} * gb);
  if (!config_.data.valid.empty() || config_.data.valid_fraction > 0)
    valid_data_ = make_sample_source(config_, Split::Valid, int64_t{config_.training.eval_steps} * gb);

  if (write_outputs_) {
    run_dir_ = (std::filesystem::path(config_.run.output_dir) / config_.run.name).string();
    std::error_code ec;
    std::filesystem::create_directories(run_dir_, ec);
    ENSURE(!ec, "cannot create run directory ", run_dir_, ": ", ec.message());
    std::ofstream(run_dir_ + "/config.toml") << config_to_toml(config_);
    const std::string metrics_path = run_dir_ + "/metrics.jsonl";
    metrics_ = std::fopen(metrics_path.c_str(), "w");
    ENSURE(metrics_ != nullptr, "cannot write ", metrics_path);
  }
  const ParamTable& t = model_->params().table();
  log_info("model ", family_name(config_.model.family), ": ", t.num_parameters(), " parameters (",
           format_bytes(static_cast<double>(t.num_parameters()) * 4), " in f32), ",
           config_.model.num_layers, " layers, hidden ", config_.model.hidden_size, ", device ",
           device_name(device_));
  log_info("train data: ", train_data_->describe());
  if (valid_data_) log_info("valid data: ", valid_data_->describe());
  log_info("batch: ", gb, " sequences x ", config_.data.sequence_length, " tokens, ", dp_size,
           " data-parallel rank(s) x ", config_.batch.accumulation_steps, " micro-batches of ",
           config_.batch.micro_batch_size);
  log_info("optimizer state per rank: ", format_bytes(static_cast<double>(optimizer_->state_bytes())),
           " (ZeRO stage ", config_.distributed.zero_stage, " over ", dp_size, " rank(s))");
}

Trainer::~Trainer() {
  if (metrics_) std::fclose(metrics_);
}

double Trainer::run_batch(const SampleSource& source, int64_t first, int64_t count, bool with_grad,
                          int64_t* loss_tokens) {
  const int mbs = config_.batch.micro_batch_size;
  // This rank's contiguous part of the global batch.
  count /= dp_.size();
  first += count * dp_.rank();
  // The whole global batch is read first: its loss-token count normalises every micro-batch.
  std::vector<Sample> samples(static_cast<size_t>(count));
  int64_t tokens = 0;
  for (int64_t i = 0; i < count; ++i) {
    samples[static_cast<size_t>(i)] = source.get(first + i);
    for (uint8_t m : samples[static_cast<size_t>(i)].loss_mask) tokens += m != 0;
  }
  tokens = dp_.all_reduce_sum(tokens);  // the global batch's loss tokens normalise every rank
  *loss_tokens += tokens;
  const float grad_scale = tokens > 0 ? 1.f / static_cast<float>(tokens) : 0.f;
  double loss_sum = 0;
  auto saved = model_->new_saved();
  for (int64_t b = 0; b < count; b += mbs) {
    std::vector<const Sample*> seqs;
    for (int64_t i = b; i < std::min(count, b + mbs); ++i) seqs.push_back(&samples[static_cast<size_t>(i)]);
    MicroBatch mb = make_micro_batch(seqs, config_.data.sequence_length,
                                     config_.data.cross_document_attention, device_);
    const double mb_loss = model_->forward(mb, *saved, with_grad, grad_scale);
    const bool last = b + mbs >= count;
    // The last micro-batch's backward starts the gradient reduction bucket by bucket.
    if (with_grad)
      model_->backward(mb, *saved, last ? Model::GradsReady([this](int64_t at) { optimizer_->grads_ready(at); })
                                        : Model::GradsReady{});
    loss_sum += mb_loss;
    log_debug("samples [", first + b, ", ", first + b + static_cast<int64_t>(seqs.size()), "): ", mb.loss_tokens,
              " loss tokens, ", mb.cu_seqlens->numel() - 1, " segments (longest ", mb.max_seqlen,
              "), loss sum ", mb_loss);
  }
  return dp_.all_reduce_sum(loss_sum);
}

StepResult Trainer::train_step() {
  ENSURE(step_ < config_.training.steps, "training already finished at step ", step_);
  const double t0 = now_seconds();
  const int64_t gb = config_.batch.global_batch_size;
  optimizer_->begin_step();
  model_->params().zero_grads();
  int64_t loss_tokens = 0;
  const double loss_sum = run_batch(*train_data_, int64_t{step_} * gb, gb, true, &loss_tokens);
  if (loss_tokens == 0) log_warn("step ", step_ + 1, ": the global batch has no loss tokens");
  ++step_;
  StepStats st = optimizer_->step(step_);
  StepResult r;
  r.step = step_;
  r.loss = loss_tokens ? loss_sum / static_cast<double>(loss_tokens) : 0.0;
  r.lr = st.lr;
  r.grad_norm = st.grad_norm;
  r.tokens = gb * config_.data.sequence_length;
  r.seconds = now_seconds() - t0;
  return r;
}

double Trainer::evaluate() {
  if (!valid_data_) return NAN;
  const int64_t gb = config_.batch.global_batch_size;
  optimizer_->begin_step();  // ZeRO-3: the weights are gathered only around a step
  double loss_sum = 0;
  int64_t loss_tokens = 0;
  for (int i = 0; i < config_.training.eval_steps; ++i)
    loss_sum += run_batch(*valid_data_, int64_t{i} * gb, gb, false, &loss_tokens);
  return loss_tokens ? loss_sum / static_cast<double>(loss_tokens) : NAN;
}

void Trainer::write_metrics(const std::string& line) {
  if (!metrics_) return;
  std::fputs(line.c_str(), metrics_);
  std::fputc('\n', metrics_);
  std::fflush(metrics_);
}

int Trainer::run() {
  // A stop requested before run() (or during a step) takes effect after the step in progress.
  const int total = config_.training.steps;
  log_info("training for ", total, " steps; run directory ", run_dir_.empty() ? "(none)" : run_dir_);
  int64_t tokens_seen = 0;
  while (step_ < total) {
    StepResult r = train_step();
    train_seconds_ += r.seconds;
    tokens_seen += r.tokens;
    const double tps = r.seconds > 0 ? r.tokens / r.seconds : 0;
    const size_t peak = memory_stats(device_).peak_in_use;
    nlohmann::json j = {{"step", r.step},           {"loss", r.loss},
                        {"lr", r.lr},               {"grad_norm", r.grad_norm},
                        {"tokens_per_s", tps},      {"tokens", tokens_seen},
                        {"step_seconds", r.seconds}, {"elapsed_s", train_seconds_},
                        {"peak_memory_bytes", peak}};
    write_metrics(j.dump());
    if (!std::isfinite(r.loss)) {
      log_error("step ", r.step, ": loss is ", r.loss, "; stopping");
      g_stop.store(false);
      return 1;
    }
    if (r.step % config_.run.log_every == 0 || r.step == total || r.step == 1) {
      const double eta = train_seconds_ / r.step * (total - r.step);
      log_info("step ", r.step, "/", total, " | loss ", fmt("%.4f", r.loss), " | lr ", fmt("%.3e", r.lr),
               " | grad_norm ", fmt("%.3f", r.grad_norm), " | ", rate(tps), " tok/s | elapsed ",
               format_duration(train_seconds_), " | eta ", format_duration(eta),
               r.step == 1 ? " | peak memory " + format_bytes(static_cast<double>(peak)) : "");
    }
    if (config_.training.eval_every > 0 && (r.step % config_.training.eval_every == 0 || r.step == total)) {
      const double vl = evaluate();
      log_info("step ", r.step, " | valid loss ", fmt("%.4f", vl));
      write_metrics(nlohmann::json{{"step", r.step}, {"valid_loss", vl}}.dump());
    }
    if (g_stop.load()) {
      log_info("stop requested: stopped cleanly after step ", step_, " of ", total);
      break;
    }
  }
  g_stop.store(false);
  log_info("done: ", step_, " steps in ", format_duration(train_seconds_), ", peak memory ",
           format_bytes(static_cast<double>(memory_stats(device_).peak_in_use)));
  return 0;
}

}  // namespace engine
