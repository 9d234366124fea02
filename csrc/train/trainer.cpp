#include "train/trainer.h"

#include "train/generate.h"
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/trace.h"
#include "checkpoint/file_io.h"
#include "checkpoint/hf.h"
#include "checkpoint/tools.h"
#include "comm/launch.h"
#include "comm/watchdog.h"
#include "core/faults.h"
#include "core/log.h"
#include "models/model.h"
#include "optim/lr_scale.h"
#include "train/agreement.h"
#include "train/generate.h"
#include "train/metrics_file.h"

namespace engine {

namespace {
std::atomic<bool> g_stop{false};
// When the first SIGINT/SIGTERM came (CLOCK_MONOTONIC ns; -1: none since the handlers were installed).
std::atomic<int64_t> g_first_signal_ns{-1};
bool g_say_stop = true;  // this process prints the first signal's note (rank 0)
// A signal this soon after the first is the same request delivered twice, not a second one:
// timeout(1) signals the process and then its whole process group, so `timeout -s TERM` alone
// delivers SIGTERM twice back to back (and a clean stop must still write its checkpoint).
constexpr int64_t kRepeatNs = 500'000'000;

int64_t monotonic_ns() {  // clock_gettime is async-signal-safe
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Only async-signal-safe calls here (clock_gettime, write, _exit). The first signal asks for a
// clean stop after the current step; a second one, at any point (setup, a step, a stuck
// collective, a checkpoint), ends the process at once: nothing this process does can defer it.
void on_signal(int sig) {
  const int64_t now = monotonic_ns();
  const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  auto say = [](const char* text) {
    for (size_t n = std::strlen(text); n > 0;) {
      const ssize_t w = ::write(STDERR_FILENO, text, n);
      if (w <= 0) return;
      text += w, n -= static_cast<size_t>(w);
    }
  };
  int64_t first = -1;
  if (!g_first_signal_ns.compare_exchange_strong(first, now)) {
    if (now - first < kRepeatNs) return;
    say("\nerror: ");
    say(name);
    say(" again: exiting at once (no checkpoint is written)\n");
    ::_exit(128 + sig);
  }
  g_stop.store(true);
  if (g_say_stop) {
    say("\n");
    say(name);
    say(": stopping after the current step (a second SIGINT or SIGTERM exits at once)\n");
  }
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The ranks' agreement comes first: the plan's communicators already depend on the config.
const Config& agreed(const Config& config, Comm* group) {
  check_ranks_agree(config, group ? *group : world());
  return config;
}

// The files an earlier run left in run_dir that a fresh run would overwrite, as a list for a
// message ("" when there are none: an empty metrics.jsonl is a run that never trained a step).
std::string earlier_run_files(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string out;
  for (const char* f : {"metrics.jsonl", "debug_stats.jsonl"})
    if (const fs::path p = fs::path(run_dir) / f; fs::is_regular_file(p, ec) && fs::file_size(p, ec) > 0)
      out += std::string(out.empty() ? "" : ", ") + f;
  if (const fs::path p = fs::path(run_dir) / "checkpoints"; fs::is_directory(p, ec) && !fs::is_empty(p, ec))
    out += std::string(out.empty() ? "" : ", ") + "checkpoints/";
  return out;
}

std::string rate(double tokens_per_s) {
  return tokens_per_s >= 1e6 ? fmt("%.2fM", tokens_per_s / 1e6)
                             : tokens_per_s >= 1e3 ? fmt("%.1fk", tokens_per_s / 1e3) : fmt("%.0f", tokens_per_s);
}
}  // namespace

void Trainer::request_stop() { g_stop.store(true); }

void Trainer::install_signal_handlers() {
  g_say_stop = launch_info().rank == 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a clean stop lets interrupted system calls carry on
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

Trainer::Trainer(const Config& config, bool write_outputs, Comm* group)
    : config_(agreed(config, group)), plan_(make_run_plan(config, group)), mesh_(plan_.mesh.get()), dp_(mesh_->dp()),
      write_outputs_(write_outputs && world().rank() == 0), device_(plan_.device) {
  if (write_outputs) checkpoint::agree(mesh_->all(), [&] { check_run_dir(); });
  if (config_.run.debug_level > 0) log_set_level(LogLevel::Debug);
  if (config_.run.debug_level >= 2) {
    stats_ = std::make_unique<StatsRecorder>(config_.model.num_layers);
    debug_steps_ = parse_step_list(config_.run.debug_steps);
  }
  const int dp_size = dp_.size();
  BatchConfig& b = config_.batch;
  b.accumulation_steps = micro_batches_per_rank(config_, dp_size);
  const DistributedConfig& dist = config_.distributed;
  if (config_.training.sample_every > 0 && mesh_->all().rank() == 0)  // the tokenizer, before any work
    sample_codec_ = std::make_unique<TextCodec>(make_text_codec(config_));
  check_lr_scale_patterns(config_, model_param_table(config_.model));  // against every stage's names
  model_ = make_model(config_.model, device_, plan_.compute, 0, plan_.layout);
  model_->params().init(config_.run.seed);
  pipeline_ = std::make_unique<Pipeline>(*model_, mesh_->pp(), dist.pipeline_schedule);
  parallel_ = std::make_unique<DataParallel>(model_->params(), dp_, dist.zero_stage, plan_.bucket_elements,
                                             plan_.parallel_groups(*model_));
  optimizer_ = std::make_unique<AdamW>(config_.optimizer, *parallel_, config_.run.seed);
  init_teacher(plan_.layout, plan_.compute);
  resume_or_init();
  const int64_t gb = config_.batch.global_batch_size;
  // Enough samples for the remaining steps from the data position (which a resumed run takes
  // from its checkpoint, even if the global batch size changed).
  const int64_t samples = std::max(int64_t{config_.training.steps} * gb,
                                   consumed_ + int64_t{std::max(0, config_.training.steps - step_)} * gb);
  faults::at(faults::Point::TrainData, {world().rank(), step_, &config_.data.train[0].path});
  train_data_ = make_sample_source(config_, Split::Train, samples);
  if (!config_.data.valid.empty() || config_.data.valid_fraction > 0)
    valid_data_ = make_sample_source(config_, Split::Valid, int64_t{config_.training.eval_steps} * gb);
  check_data();

  if (write_outputs_) {
    run_dir_ = (std::filesystem::path(config_.run.output_dir) / config_.run.name).string();
    std::error_code ec;
    if (resumed_from_.empty() && config_.training.resume == "none" && config_.run.overwrite) {
      if (const std::string old = earlier_run_files(run_dir_); !old.empty()) {
        for (const char* f : {"metrics.jsonl", "debug_stats.jsonl", "checkpoints"})
          std::filesystem::remove_all(std::filesystem::path(run_dir_) / f, ec);
        log_warn("run.overwrite = true: removed the earlier run's ", old, " from ", run_dir_);
      }
    }
    std::filesystem::create_directories(run_dir_, ec);
    ENSURE(!ec, "cannot create run directory ", run_dir_, ": ", ec.message());
    checkpoint::replace_file(run_dir_ + "/config.toml", config_to_toml(config_));
    open_metrics();
  }
  const ParamTable& t = model_->params().table();
  log_info("model ", family_name(config_.model.family), ": ", t.num_full_parameters(), " parameters (",
           format_bytes(static_cast<double>(t.num_full_parameters()) * 4), " in f32",
           mesh_->tp_size() > 1 ? str_cat("; ", t.num_parameters(), " on each tensor-parallel rank") : "", "), ",
           config_.model.num_layers, " layers, hidden ", config_.model.hidden_size, ", device ",
           device_name(device_));
  log_info("train data: ", train_data_->describe());
  if (valid_data_) log_info("valid data: ", valid_data_->describe());
  log_info("batch: ", gb, " sequences x ", config_.data.sequence_length, " tokens, ", mesh_->describe(),
           config_.distributed.sequence_parallel && mesh_->tp_size() > 1 ? " (sequence parallel)" : "", ", ",
           config_.batch.accumulation_steps, " micro-batches of ", config_.batch.micro_batch_size);
  log_info("optimizer state per rank: ", format_bytes(static_cast<double>(optimizer_->state_bytes())),
           " (ZeRO stage ", config_.distributed.zero_stage, " over ", dp_size, " rank(s))");
}

// metrics_ closes with the trainer; run() fsyncs it (checked) before it returns.
Trainer::~Trainer() = default;

void Trainer::check_run_dir() const {
  if (world().rank() != 0 || config_.training.resume != "none" || config_.run.overwrite) return;
  const std::string dir = (std::filesystem::path(config_.run.output_dir) / config_.run.name).string();
  const std::string old = earlier_run_files(dir);
  if (!old.empty())
    RAISE(config_.where("run.name"), "the run directory ", dir, " already holds an earlier run's ", old,
          ", which a fresh run would overwrite: set training.resume = \"auto\" to continue that run, or "
          "run.overwrite = true to replace it (or choose another run.name)");
}

void Trainer::check_data() const {
  // One token-id scan for the run: rank 0 scans (or reads its cache, data/token_scan.h) and every
  // rank checks its files against that range. The ranks' data files agree (train/agreement.h),
  // and a rank that finds an id out of range locates it in its own files.
  std::vector<TokenScan> train_scans, valid_scans;
  // {"train": [[min, max, cache file], ...], "valid": [...]}, one entry a part of a dataset.
  nlohmann::json ranges = {{"train", nlohmann::json::array()}, {"valid", nlohmann::json::array()}};
  checkpoint::agree(mesh_->all(), [&] {
    if (mesh_->all().rank() != 0) return;
    train_scans = train_data_->scan_token_ids();
    if (valid_data_) valid_scans = valid_data_->scan_token_ids();
    for (const TokenScan& s : train_scans) ranges["train"].push_back({s.range.min, s.range.max, s.cache_file});
    for (const TokenScan& s : valid_scans) ranges["valid"].push_back({s.range.min, s.range.max, s.cache_file});
  });
  if (mesh_->all().size() > 1) {
    ranges = nlohmann::json::parse(all_gather_strings(mesh_->all(), ranges.dump())[0]);
    auto read = [&](const nlohmann::json& list, std::vector<TokenScan>& scans) {
      scans.clear();
      for (const auto& e : list) {
        TokenScan s;
        s.range = {e[0].get<int64_t>(), e[1].get<int64_t>()};
        s.cache_file = e[2].get<std::string>();
        s.from_cache = !s.cache_file.empty();
        scans.push_back(s);
      }
    };
    read(ranges["train"], train_scans);
    read(ranges["valid"], valid_scans);
  }
  checkpoint::agree(mesh_->all(), [&] {
    train_data_->check_token_ids(train_scans);
    if (valid_data_) valid_data_->check_token_ids(valid_scans);
  });
  const int max = config_.data.max_epochs;
  for (const DatasetUse& u : train_data_->usage()) {
    if (u.epochs <= 1) continue;
    const std::string what =
        str_cat(u.where, u.path, ": the run takes ", u.samples, " samples of ", config_.data.sequence_length + 1,
                " tokens from its ", u.tokens, " tokens (", u.documents, " documents): ", fmt("%.1f", u.epochs),
                " epochs");
    if (max > 0 && u.epochs > max)
      RAISE(what, ", more than data.max_epochs = ", max, " (a dataset shorter than a sequence, or the wrong file?): ",
            "use more data, fewer training.steps, or data.max_epochs = 0 to allow it");
    if (mesh_->all().rank() == 0) log_warn(what, ": the data repeats");
  }
}

void Trainer::init_teacher(const ModelLayout& student, DType compute) {
  const DistillationConfig& d = config_.distillation;
  if (d.teacher.empty()) return;
  // Only the ranks of the student's last stage compute losses: they hold the teacher, split over
  // the same tensor-parallel group (its logits line up with the student's vocabulary columns).
  const bool needed = model_->has_stage(model_->num_stages() - 1);
  std::string description;
  checkpoint::agree(mesh_->all(), [&] {
    if (!needed) return;
    namespace fs = std::filesystem;
    const bool hf_folder = fs::exists(fs::path(d.teacher) / "config.json");
    const ModelConfig tc = checkpoint::folder_model_config(d.teacher);
    std::unique_ptr<checkpoint::Reader> reader;
    if (!hf_folder) reader = std::make_unique<checkpoint::Reader>(d.teacher);
    if (tc.lora.rank > 0)  // its checkpoint holds the adapters only (core/params.h)
      RAISE(config_.where("distillation.teacher"), d.teacher, ": a LoRA run's checkpoint is no teacher; export it "
            "merged (./train CONFIG --export-hf DIR) and name that folder");
    if (config_.batch.micro_sequence_length > 0 && block_layout(tc).find_first_of("MSG") != std::string::npos)
      RAISE(config_.where("distillation.teacher"), d.teacher, ": a teacher with Mamba, Mamba-2 or Gated DeltaNet blocks cannot run on ",
            "micro-sequences (batch.micro_sequence_length = ", config_.batch.micro_sequence_length,
            "): its scan state would have to pass from chunk to chunk");
    if (tc.vocab_size != config_.model.vocab_size)
      RAISE(config_.where("distillation.teacher"), d.teacher, ": the teacher's vocabulary (", tc.vocab_size,
            ") differs from model.vocab_size (", config_.model.vocab_size, ")");
    ModelLayout layout;
    layout.tp = student.tp;
    layout.sequence_parallel = student.sequence_parallel;
    layout.tp_overlap = student.tp_overlap;
    teacher_ = make_model(tc, device_, compute, 0, layout);
    std::unique_ptr<hf::HfWeights> weights;
    checkpoint::Fetch fetch;
    if (hf_folder) {
      weights = std::make_unique<hf::HfWeights>(d.teacher, tc);
      fetch = weights->fetcher();
    } else {
      fetch = [r = reader.get(), &d](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
        r->read(0, p.name, lo, hi, out);
        checkpoint::require_finite(out, hi - lo, lo, p.name, str_cat("distillation.teacher ", d.teacher));
      };
    }
    checkpoint::fill_weights(teacher_->params(), fetch);
    description = str_cat(family_name(tc.family), " teacher (", tc.num_layers, " layers, hidden ", tc.hidden_size,
                          ") from ", d.teacher);
  });
  if (!needed) return;
  Model* teacher = teacher_.get();
  model_->set_teacher([teacher](const MicroBatch& mb, const Tensor& out) { teacher->vocab_logits(mb, out); }, d);
  if (mesh_->tp_rank() == 0) log_info("distillation: ", description);
}

namespace {
// LoRA: the frozen base weights are no state of a checkpoint (core/params.h); every start, a
// resume included, takes them from model.init_from, or keeps the seed's init already in the store.
void load_frozen_base(const Config& c, Model& model, Comm& all) {
  if (c.model.init_from.empty() || model.params().table().frozen_elements() == 0) return;
  checkpoint::agree(all, [&] {
    hf::HfWeights weights(c.model.init_from, c.model);
    checkpoint::fill_frozen(model.params(), weights.fetcher());
  });
  log_info("frozen base weights from the Hugging Face folder ", c.model.init_from);
}
}  // namespace

void Trainer::resume_or_init() {
  load_frozen_base(config_, *model_, mesh_->all());
  checkpoint_root_ = checkpoint::checkpoint_root(config_);
  resumed_from_ = checkpoint::resolve_resume(config_.training.resume, checkpoint_root_, mesh_->all());
  if (!resumed_from_.empty()) {
    const checkpoint::TrainerState st = checkpoint::load(resumed_from_, *optimizer_, &mesh_->all());
    step_ = st.step;
    consumed_ = st.consumed_samples;
    tokens_seen_ = st.tokens_seen;
    train_seconds_ = st.train_seconds;
    last_checkpoint_step_ = step_;
    log_info("resumed from ", resumed_from_, ": step ", step_, ", ", consumed_, " samples consumed");
    // Settings that changed since the save: layout and bookkeeping keys may (re-sharding is
    // what checkpoints do); others are allowed too (e.g. more steps) but then the run is not the
    // one that would have continued, so they are a warning.
    const auto saved = config_entries(checkpoint::read_metadata(resumed_from_).config_toml);
    const auto current = config_entries(config_to_toml(config_));
    const std::map<std::string, std::string> before(saved.begin(), saved.end()), now(current.begin(), current.end());
    std::string changes, notes;
    for (const auto& [k, v] : now) {
      auto it = before.find(k);
      if (k == "training.resume" || (it != before.end() && it->second == v)) continue;
      const bool benign = k.rfind("run.", 0) == 0 || k.rfind("distributed.", 0) == 0 ||
                          k == "training.checkpoint_every" || k == "training.keep_checkpoints" ||
                          k == "training.eval_every" || k == "training.eval_steps" || k == "data.max_epochs";
      (benign ? notes : changes) += "\n  " + k + ": " + (it == before.end() ? std::string("(unset)") : it->second) +
                                    " -> " + v;
    }
    if (mesh_->all().rank() == 0) {
      if (!notes.empty()) log_info("layout and run settings changed since the checkpoint:", notes);
      if (!changes.empty()) log_warn("the config differs from the one the checkpoint was saved with:", changes);
    }
    return;
  }
  if (config_.training.resume == "auto") log_info("no checkpoint under ", checkpoint_root_, ": starting from step 0");
  if (!config_.model.init_from.empty() && config_.model.lora.rank == 0) {
    std::unique_ptr<hf::HfWeights> weights;
    checkpoint::agree(mesh_->all(), [&] {
      weights = std::make_unique<hf::HfWeights>(config_.model.init_from, config_.model);
      checkpoint::fill_shard(*optimizer_, 0, weights->fetcher());
    });
    optimizer_->weights_from_master();
    log_info("weights from the Hugging Face folder ", config_.model.init_from);
  }
}

void Trainer::open_metrics() {
  const std::string path = run_dir_ + "/metrics.jsonl";
  // On resume: the lines up to the resumed step (the steps after it are trained again), damaged
  // lines reported and dropped.
  if (!resumed_from_.empty()) trim_metrics_for_resume(path, step_);
  using Mode = checkpoint::OutFile::Mode;
  metrics_ = std::make_unique<checkpoint::OutFile>(path, resumed_from_.empty() ? Mode::Truncate : Mode::Append);
}

std::string Trainer::save_checkpoint() {
  checkpoint::SaveOptions o;
  o.root = checkpoint_root_;
  o.keep = config_.training.keep_checkpoints;
  o.config_toml = config_to_toml(config_);
  o.state = {step_, consumed_, tokens_seen_, train_seconds_};
  const double t0 = now_seconds();
  WatchdogScope watchdog(str_cat("the checkpoint of step ", step_), config_.distributed.timeout_s);
  faults::at(faults::Point::CheckpointWrite, {world().rank(), step_});
  if (metrics_) metrics_->sync();  // the metrics up to the checkpoint's step are on disk with it
  const std::string dir = checkpoint::save(o, *optimizer_, &mesh_->all());
  last_checkpoint_step_ = step_;
  log_info("checkpoint ", dir, " written in ", format_duration(now_seconds() - t0));
  return dir;
}

bool Trainer::stop_requested() {
  const bool mine = g_stop.load();
  Comm& all = mesh_->all();
  return all.size() > 1 ? all.all_reduce_max(mine ? 1.0 : 0.0) > 0 : mine;
}

StepResult Trainer::train_step() {
  ENSURE(step_ < config_.training.steps, "training already finished at step ", step_);
  faults::at(faults::Point::StepStart, {world().rank(), step_ + 1});
  const double t0 = now_seconds();
  const int64_t gb = config_.batch.global_batch_size;
  optimizer_->begin_step();
  model_->params().zero_grads();
  int64_t loss_tokens = 0;
  const size_t heads = static_cast<size_t>(config_.model.prediction_heads);
  std::vector<double> head_sums(heads, 0.0);
  std::vector<int64_t> head_tokens(heads, 0);
  const bool stats = stats_ && debug_steps_.count(step_ + 1);
  if (stats) {
    stats_->clear();
    model_->set_stats(stats_.get());
  }
  double loss_sum;
  {
    const TraceRange trace("step " + std::to_string(step_ + 1) + " forward and backward");
    loss_sum = run_batch(*train_data_, consumed_, gb, true, &loss_tokens, &head_sums, &head_tokens);
  }
  if (stats) {
    model_->set_stats(nullptr);
    write_stats(step_ + 1);
  }
  consumed_ += gb;
  if (loss_tokens == 0) log_warn("step ", step_ + 1, ": the global batch has no loss tokens");
  ++step_;
  faults::at(faults::Point::StepEnd, {world().rank(), step_});
  const double loss = loss_tokens ? loss_sum / static_cast<double>(loss_tokens) : 0.0;
  const std::vector<double> head_losses = head_means(head_sums, head_tokens, 0.0);
  bool finite = std::isfinite(loss);
  for (double l : head_losses) finite = finite && std::isfinite(l);
  StepStats st;
  {
    const TraceRange trace("optimizer step");
    st = optimizer_->step(step_, !finite);
  }
  StepResult r;
  r.step = step_;
  r.loss = loss;
  r.head_losses = head_losses;
  r.skipped = st.skipped;
  r.lr = st.lr;
  r.grad_norm = st.grad_norm;
  r.tokens = gb * config_.data.sequence_length;
  r.seconds = now_seconds() - t0;
  return r;
}

void Trainer::write_stats(int step) {
  stats_->merge(mesh_->all());
  if (!write_outputs_) return;
  std::string lines;
  int order = 0;
  for (const std::string& n : stats_->names()) {
    const TensorStats& t = stats_->at(n);
    lines += nlohmann::json{{"step", step}, {"order", order++}, {"tensor", n}, {"count", t.count},
                            {"mean", t.mean()}, {"std", t.std()}, {"max_abs", t.max_abs}, {"nan", t.nan}}
                 .dump() +
             "\n";
  }
  checkpoint::OutFile out(run_dir_ + "/debug_stats.jsonl", checkpoint::OutFile::Mode::Append);
  out.write(lines);
  out.sync_and_close();
}

void Trainer::print_sample(int step) {
  // Greedy (no random numbers) on the current weights, which decoding only reads: the run's
  // training is the same with and without samples.
  const std::string text = sample_text(*model_, config_, *sample_codec_);
  std::string line;
  for (char ch : text) line += ch == '\n' ? std::string("\\n") : std::string(1, ch);
  log_info("step ", step, " | sample: ", line);
}

void Trainer::write_metrics(const std::string& line) {
  if (metrics_) metrics_->write(line + "\n");  // one write: whole lines for a reader
}

void Trainer::sync_outputs() {
  if (metrics_) metrics_->sync();
  check_log_output();
}

int Trainer::run() {
  // A stop requested before run() (or during a step) takes effect after the step in progress.
  const int total = config_.training.steps;
  log_info("training for ", total, " steps", step_ > 0 ? str_cat(" from step ", step_) : "", "; run directory ",
           run_dir_.empty() ? "(none)" : run_dir_);
  const int every = config_.training.checkpoint_every;
  if (step_ >= total) log_info("nothing to train: the run is at step ", step_, " of ", total);
  int bad_in_a_row = 0;
  while (step_ < total) {
    StepResult r;
    {
      WatchdogScope watchdog(str_cat("step ", step_ + 1), config_.distributed.timeout_s);
      r = train_step();
    }
    train_seconds_ += r.seconds;
    tokens_seen_ += r.tokens;
    const double tps = r.seconds > 0 ? r.tokens / r.seconds : 0;
    const size_t peak = memory_stats(device_).peak_in_use;
    nlohmann::json j = {{"step", r.step},           {"loss", r.loss},
                        {"lr", r.lr},               {"grad_norm", r.grad_norm},
                        {"tokens_per_s", tps},      {"tokens", tokens_seen_},
                        {"step_seconds", r.seconds}, {"elapsed_s", train_seconds_},
                        {"peak_memory_bytes", peak}};
    for (size_t h = 0; h < r.head_losses.size(); ++h) j["loss_head" + std::to_string(h + 1)] = r.head_losses[h];
    if (r.skipped) j["skipped"] = true;
    write_metrics(j.dump());
    check_log_output();  // a log that cannot be written ends the run, as the metrics do
    bad_in_a_row = r.skipped ? bad_in_a_row + 1 : 0;
    if (r.skipped) {
      log_warn("step ", r.step, ": loss ", r.loss, ", gradient norm ", r.grad_norm, " (not finite): update skipped, ",
               bad_in_a_row, " such step(s) in a row (training.max_bad_steps = ", config_.training.max_bad_steps, ")");
      if (bad_in_a_row > config_.training.max_bad_steps) {
        // Skipped steps make no update and imported or resumed weights are finite, so the newest
        // checkpoint holds the weights of the last step that trained.
        const int kept = std::min(r.step - bad_in_a_row, last_checkpoint_step_);
        log_error("stopping at step ", r.step, ": ", bad_in_a_row,
                  " consecutive steps with a non-finite loss or gradients (training.max_bad_steps = ",
                  config_.training.max_bad_steps, "); ",
                  last_checkpoint_step_ >= 0
                      ? str_cat("the newest checkpoint (step ", last_checkpoint_step_, ", under ", checkpoint_root_,
                                ") holds the weights after step ", kept, kept > 0 ? "" : " (the initial weights)")
                      : std::string("no checkpoint was written or loaded"));
        g_stop.store(false);
        sync_outputs();
        return 1;
      }
    }
    if (r.step % config_.run.log_every == 0 || r.step == total || r.step == 1) {
      const double eta = train_seconds_ / r.step * (total - r.step);  // (includes pre-resume steps)
      log_info("step ", r.step, "/", total, " | loss ", fmt("%.4f", r.loss), " | lr ", fmt("%.3e", r.lr),
               head_loss_text(r.head_losses), " | grad_norm ", fmt("%.3f", r.grad_norm), " | ", rate(tps), " tok/s | elapsed ",
               format_duration(train_seconds_), " | eta ", format_duration(eta),
               r.step == 1 ? " | peak memory " + format_bytes(static_cast<double>(peak)) : "");
    }
    if (sample_codec_ && (r.step % config_.training.sample_every == 0 || r.step == total)) print_sample(r.step);
    if (config_.training.eval_every > 0 && (r.step % config_.training.eval_every == 0 || r.step == total)) {
      double vl;
      {
        WatchdogScope watchdog(str_cat("validation after step ", r.step), config_.distributed.timeout_s);
        vl = evaluate();
      }
      nlohmann::json vj = {{"step", r.step}, {"valid_loss", vl}};
      for (size_t h = 0; h < valid_head_losses_.size(); ++h)
        vj["valid_loss_head" + std::to_string(h + 1)] = valid_head_losses_[h];
      log_info("step ", r.step, " | valid loss ", fmt("%.4f", vl), head_loss_text(valid_head_losses_));
      write_metrics(vj.dump());
    }
    const bool stop = stop_requested();
    if (every > 0 && (r.step % every == 0 || stop)) save_checkpoint();
    if (stop) {
      log_info("stop requested: stopped cleanly after step ", step_, " of ", total);
      break;
    }
  }
  g_stop.store(false);
  if (every > 0 && last_checkpoint_step_ != step_) save_checkpoint();  // the end of the run
  log_info("done: ", step_, " steps in ", format_duration(train_seconds_), ", peak memory ",
           format_bytes(static_cast<double>(memory_stats(device_).peak_in_use)));
  sync_outputs();
  return 0;
}

}  // namespace engine
