// ./train run.toml [section.key=value ...] [--export-hf DIR | --export-peft DIR | --dump-logits TOKENS OUT | --generate PROMPT ...]
// Trains the model the config describes; see README.md for the config reference.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <new>
#include <string>
#include <vector>

#include "checkpoint/tools.h"
#include "comm/comm.h"
#include "comm/launch.h"
#include "config/config.h"
#include "core/log.h"
#include "parallel/schedule.h"
#include "train/generate.h"
#include "train/test_faults.h"
#include "train/trainer.h"

static void usage() {
  std::printf(
      "usage: train CONFIG.toml [section.key=value ...] [options]\n"
      "  Trains the model described by CONFIG.toml; every key can be overridden on the command\n"
      "  line, e.g. train configs/tiny-llama.toml training.steps=50 optimizer.lr=1e-3\n"
      "  --print-config            print the effective config (defaults and overrides applied) and exit\n"
      "  --print-schedule          print each pipeline rank's steps of one batch (F/B stage.micro-batch)\n"
      "                            for the config's layout over the ranks of this launch, and exit\n"
      "  --export-hf DIR           write the model as a Hugging Face folder (config.json + safetensors)\n"
      "                            and exit; the weights of training.resume when it is a path, else of\n"
      "                            the run's newest checkpoint, else of model.init_from or the init\n"
      "                            (a LoRA run: the merged model, W + alpha / rank B A)\n"
      "  --export-peft DIR         a LoRA run's adapter as a PEFT folder (adapter_config.json +\n"
      "                            adapter_model.safetensors), with the same weights, and exit\n"
      "  --export-dtype f32|bf16   dtype of the exported tensors (default f32)\n"
      "  --export-shard-mb N       above N MiB the export is split into model-0000i-of-0000n files\n"
      "                            with an index (default 5120)\n"
      "  --dump-logits TOKENS OUT  logits of the token sequences in TOKENS (one per line, ids\n"
      "                            separated by spaces) to OUT (safetensors), with the same weights\n"
      "                            (with model.prediction_heads, every head's: logits_head<j>.<i>)\n"
      "  --generate PROMPT         print PROMPT and the model's continuation, with the same weights, and\n"
      "                            exit (text in and out as data.tokenizer says; token ids: \"1,2,3\")\n"
      "  --max-new-tokens N        at most N new tokens (default 64; also stops at the end of document)\n"
      "  --temperature T           0: greedy; else sample from softmax(logits / T) (default 1)\n"
      "  --top-k K                 sample among the K most likely ids only (default 0: all)\n"
      "  --top-p P                 ... and among the fewest most likely ids reaching probability P (default 1)\n"
      "  --seed S                  the sampling seed (default run.seed): a seed gives the same text\n");
}

// Ends a run that trains nothing (help, a usage error, --print-config): under mpirun every rank
// finalizes MPI (a rank that exits without it fails the job) and only rank 0 prints.
static int finish(int code) {
  engine::launch_finalize();
  return code;
}

static bool rank0() { return engine::launch_info().rank == 0; }

int main(int argc, char** argv) {
  engine::launch_init(&argc, &argv);
  engine::install_test_faults_from_env();
  std::vector<std::string> overrides;
  std::string path, export_dir, peft_dir, tokens_path, logits_path;
  engine::hf::ExportOptions export_options;
  bool print_config = false, print_schedule = false;
  std::optional<std::string> prompt;
  engine::SamplingOptions sampling;
  std::optional<uint64_t> seed;
  std::vector<std::string> sampling_flags;  // given without --generate: an error
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      if (rank0()) std::fprintf(stderr, "error: %s needs a value (see --help)\n", argv[i]);
      std::exit(finish(2));
    }
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      if (rank0()) usage();
      return finish(0);
    }
    if (!std::strcmp(argv[i], "--print-config")) {
      print_config = true;
    } else if (!std::strcmp(argv[i], "--print-schedule")) {
      print_schedule = true;
    } else if (!std::strcmp(argv[i], "--export-hf")) {
      export_dir = value(i);
    } else if (!std::strcmp(argv[i], "--export-peft")) {
      peft_dir = value(i);
    } else if (!std::strcmp(argv[i], "--export-dtype")) {
      const std::string d = value(i);
      if (d != "f32" && d != "bf16") {
        if (rank0()) std::fprintf(stderr, "error: --export-dtype must be f32 or bf16, got %s\n", d.c_str());
        return finish(2);
      }
      export_options.dtype = d == "f32" ? "F32" : "BF16";
    } else if (!std::strcmp(argv[i], "--export-shard-mb")) {
      const std::string v = value(i);
      char* end = nullptr;
      const double mb = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(mb > 0)) {
        if (rank0()) std::fprintf(stderr, "error: --export-shard-mb must be a positive number, got %s\n", v.c_str());
        return finish(2);
      }
      export_options.shard_bytes = static_cast<uint64_t>(mb * 1024 * 1024);
    } else if (!std::strcmp(argv[i], "--dump-logits")) {
      tokens_path = value(i);
      logits_path = value(i);
    } else if (!std::strcmp(argv[i], "--generate")) {
      prompt = value(i);
    } else if (!std::strcmp(argv[i], "--max-new-tokens") || !std::strcmp(argv[i], "--top-k") ||
               !std::strcmp(argv[i], "--seed")) {
      const std::string flag = argv[i], v = value(i);
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || errno != 0 || n < 0 || (flag != "--seed" && n > INT32_MAX)) {
        if (rank0()) std::fprintf(stderr, "error: %s must be a non-negative integer, got %s\n", flag.c_str(), v.c_str());
        return finish(2);
      }
      if (flag == "--max-new-tokens") sampling.max_new_tokens = static_cast<int>(n);
      if (flag == "--top-k") sampling.top_k = static_cast<int>(n);
      if (flag == "--seed") seed = static_cast<uint64_t>(n);
      sampling_flags.push_back(flag);
    } else if (!std::strcmp(argv[i], "--temperature") || !std::strcmp(argv[i], "--top-p")) {
      const std::string flag = argv[i], v = value(i);
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0') {
        if (rank0()) std::fprintf(stderr, "error: %s must be a number, got %s\n", flag.c_str(), v.c_str());
        return finish(2);
      }
      (flag == "--temperature" ? sampling.temperature : sampling.top_p) = x;
      sampling_flags.push_back(flag);
    } else if (path.empty() && std::strchr(argv[i], '=') == nullptr && argv[i][0] != '-') {
      path = argv[i];
    } else if (argv[i][0] == '-') {
      if (rank0()) std::fprintf(stderr, "error: unknown option %s (see --help)\n", argv[i]);
      return finish(2);
    } else {
      overrides.emplace_back(argv[i]);
    }
  }
  if (path.empty()) {
    if (rank0()) usage();
    return finish(2);
  }
  if (!prompt && !sampling_flags.empty()) {
    if (rank0()) std::fprintf(stderr, "error: %s needs --generate (see --help)\n", sampling_flags[0].c_str());
    return finish(2);
  }
  if (prompt) {
    try {
      engine::check_sampling(sampling);
    } catch (const std::exception& e) {
      if (rank0()) std::fprintf(stderr, "error: %s\n", e.what());
      return finish(2);
    }
  }
  engine::Trainer::install_signal_handlers();
  // A file grown past the size limit (ulimit -f) makes the write fail with EFBIG, reported with
  // the file's name like any failed write, instead of killing the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    engine::Config config = engine::load_config(path, overrides);
    if (print_config) {
      if (rank0()) std::fputs(engine::config_to_toml(config).c_str(), stdout);
      engine::check_log_output();
      return finish(0);
    }
    if (print_schedule) {
      const engine::DistributedConfig& d = config.distributed;
      const int64_t model_ranks = int64_t{d.tensor_parallel} * d.pipeline_parallel;
      const int dp = static_cast<int>(std::max<int64_t>(1, engine::world().size() / model_ranks));
      const int micro = engine::micro_batches_per_rank(config, dp);
      const engine::PipelineLayout layout{d.pipeline_parallel * d.stages_per_rank, d.pipeline_parallel};
      const int msl = config.batch.micro_sequence_length;
      // (micro_batches_per_rank checked that micro x chunks fits an int)
      const int chunks = msl > 0 ? static_cast<int>(int64_t{config.batch.micro_batch_size} * config.data.sequence_length / msl) : 1;
      if (engine::world().rank() == 0)
        std::printf("%d stages over %d pipeline rank(s), %d micro-batches per data-parallel rank (%d)%s:\n%s",
                    layout.stages, layout.ranks, micro, dp,
                    chunks > 1 ? engine::str_cat(", ", chunks, " micro-sequences each").c_str() : "",
                    engine::describe_schedule(
                        engine::build_schedule(layout, micro * chunks, d.pipeline_schedule, true, chunks), layout,
                        chunks)
                        .c_str());
      engine::check_log_output();
      engine::launch_finalize();
      return 0;
    }
    if (!export_dir.empty() || !peft_dir.empty() || !tokens_path.empty() || prompt) {
      // Tools run on one process (rank 0 under mpirun; the others wait).
      if (engine::world().rank() == 0) {
        if (prompt) {
          sampling.seed = seed.value_or(config.run.seed);
          engine::generate_from_config(config, engine::resolve_device(config.run.device), *prompt, sampling);
        }
        if (!export_dir.empty()) engine::checkpoint::export_hf_from_config(config, export_dir, export_options);
        if (!peft_dir.empty()) engine::checkpoint::export_peft_from_config(config, peft_dir);
        if (!tokens_path.empty())
          engine::checkpoint::dump_logits(config, engine::resolve_device(config.run.device), tokens_path, logits_path);
      }
      engine::check_log_output();
      engine::world().barrier();
      engine::launch_finalize();
      return 0;
    }
    int code = 0;
    {
      engine::Trainer trainer(config);
      code = trainer.run();
    }
    engine::check_log_output();
    engine::launch_finalize();
    return code;
  } catch (const std::bad_alloc&) {
    engine::fatal_error(
        "out of host memory: a host allocation failed (std::bad_alloc); the memory check at start counts a lower "
        "bound of what the run needs (README.md, Failure behaviour)");
  } catch (const std::exception& e) {
    // Ends every rank (MPI_Abort) so none waits in a collective for this one.
    engine::fatal_error(e.what());
  }
}
