#include "checkpoint/tools.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/file_io.h"
#include "comm/mpi_comm.h"
#include "core/log.h"
#include "models/model.h"

namespace engine::checkpoint {

std::string checkpoint_root(const Config& c) {
  return (std::filesystem::path(c.run.output_dir) / c.run.name / "checkpoints").string();
}

ModelConfig folder_model_config(const std::string& folder) {
  const std::filesystem::path config_json = std::filesystem::path(folder) / "config.json";
  if (std::filesystem::exists(config_json)) return hf::model_from_hf_config(config_json.string());
  return parse_config(read_metadata(folder).config_toml, folder + "/metadata.json").model;
}

WeightSource weight_source(const Config& c) {
  SelfComm self;
  const std::string& spec = c.training.resume;
  const std::string dir = resolve_resume(spec == "none" ? "auto" : spec, checkpoint_root(c), self);
  WeightSource w;
  const ParamTable table = model_param_table(c.model);
  if (!dir.empty()) {
    auto reader = std::make_shared<Reader>(dir);
    check_compatible(reader->metadata(), table, dir);
    w.description = str_cat("checkpoint ", dir, " (step ", reader->metadata().state.step, ")");
    w.fetch = [r = reader.get()](const ParamSpec& p, int64_t lo, int64_t hi, float* out) { r->read(0, p.name, lo, hi, out); };
    w.keep_alive = reader;
  } else if (!c.model.init_from.empty()) {
    auto hfw = std::make_shared<hf::HfWeights>(c.model.init_from, c.model);
    w.description = "Hugging Face folder " + c.model.init_from;
    w.fetch = hfw->fetcher();
    w.keep_alive = hfw;
  } else {
    auto t = std::make_shared<ParamTable>(table);
    const uint64_t seed = c.run.seed;
    w.description = str_cat("the random init (seed ", seed, "; no checkpoint under ", checkpoint_root(c), ")");
    w.fetch = [t = t.get(), seed](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
      init_values(*t, seed, p.offset + lo, p.offset + hi, Tensor(out, DType::F32, Device::CPU, {hi - lo}));
    };
    w.keep_alive = t;
  }
  return w;
}

void export_hf_from_config(const Config& c, const std::string& out_dir, const hf::ExportOptions& options) {
  hf::architecture(c.model);  // fail before reading anything when the model is not representable
  WeightSource w = weight_source(c);
  log_info("exporting the weights of ", w.description);
  const ParamTable table = model_param_table(c.model);
  hf::export_hf(c.model, table, w.fetch, out_dir, options);
}

void dump_logits(const Config& c, Device device, const std::string& tokens_path, const std::string& out_path) {
  std::ifstream in(tokens_path);
  if (!in) RAISE("cannot open ", tokens_path);
  std::vector<std::vector<int32_t>> seqs;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    std::istringstream ls(line);
    std::vector<int32_t> s;
    for (std::string tok; ls >> tok;) {
      char* end = nullptr;
      const long v = std::strtol(tok.c_str(), &end, 10);
      if (*end != '\0' || v < 0 || v >= c.model.vocab_size)
        RAISE(tokens_path, ":", n, ": token '", tok, "' is not an id in [0, ", c.model.vocab_size, ")");
      s.push_back(static_cast<int32_t>(v));
    }
    if (s.empty()) continue;
    if (c.model.positions == PositionKind::Learned && static_cast<int>(s.size()) > c.model.max_position_embeddings)
      RAISE(tokens_path, ":", n, ": ", s.size(), " tokens, more than max_position_embeddings (",
            c.model.max_position_embeddings, ")");
    seqs.push_back(std::move(s));
  }
  if (seqs.empty()) RAISE(tokens_path, ": no token sequences");

  WeightSource w = weight_source(c);
  log_info("logits of ", seqs.size(), " sequence(s) with the weights of ", w.description, " on ", device_name(device));
  auto model = make_model(c.model, device, device == Device::CPU ? DType::F32 : DType::BF16);
  fill_weights(model->params(), w.fetch);

  const int64_t V = c.model.vocab_size;
  std::vector<std::vector<float>> logits;
  for (const auto& s : seqs) {
    const auto T = static_cast<int64_t>(s.size());
    Sample sample;
    sample.tokens = s;
    sample.tokens.push_back(0);  // a label for the last position (unused)
    sample.loss_mask.assign(s.size(), 1);
    sample.doc_lengths = {static_cast<int32_t>(T)};
    MicroBatch mb = make_micro_batch({&sample}, static_cast<int>(T), false, device);
    Owned out = empty({T, V}, DType::F32, device);
    model->logits(mb, out);
    std::vector<float> host(static_cast<size_t>(T * V));
    copy_bytes(host.data(), Device::CPU, out.t.data, device, host.size() * 4);
    logits.push_back(std::move(host));
  }
  SafetensorsWriter wr;
  wr.set_metadata({{"format", "pt"}, {"source", w.description}});
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto T = static_cast<int64_t>(seqs[i].size());
    wr.add("tokens." + std::to_string(i), "I32", {T},
           [&, i](OutFile& f) { f.write(seqs[i].data(), seqs[i].size() * 4); });
    wr.add("logits." + std::to_string(i), "F32", {T, V},
           [&, i](OutFile& f) { f.write(logits[i].data(), logits[i].size() * 4); });
  }
  // Written under a temporary name and renamed over OUT: a failed write leaves OUT as it was.
  replace_file(out_path, [&wr](const std::string& tmp) { wr.write(tmp); });
  log_info("wrote ", out_path);
}

}  // namespace engine::checkpoint
