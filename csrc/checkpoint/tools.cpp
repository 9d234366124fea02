#include "checkpoint/tools.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "checkpoint/file_io.h"
#include "checkpoint/lora_export.h"
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
  const ParamTable table = model_param_table(c.model);
  const bool lora = c.model.lora.rank > 0;
  auto t = std::make_shared<ParamTable>(table);
  const uint64_t seed = c.run.seed;
  Fetch init = [t = t.get(), seed](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
    init_values(*t, seed, p.offset + lo, p.offset + hi, Tensor(out, DType::F32, Device::CPU, {hi - lo}), p.frozen);
  };
  const std::string init_text = str_cat("the random init (seed ", seed, "; no checkpoint under ", checkpoint_root(c), ")");
  std::shared_ptr<Reader> reader;
  std::shared_ptr<hf::HfWeights> hfw;
  Fetch trainable = init, frozen = init;
  std::string trainable_text = init_text, frozen_text = init_text;
  if (!dir.empty()) {
    reader = std::make_shared<Reader>(dir);
    check_compatible(reader->metadata(), table, dir);
    trainable_text = str_cat("checkpoint ", dir, " (step ", reader->metadata().state.step, ")");
    trainable = [r = reader.get()](const ParamSpec& p, int64_t lo, int64_t hi, float* out) { r->read(0, p.name, lo, hi, out); };
  }
  if (!c.model.init_from.empty() && (dir.empty() || lora)) {
    hfw = std::make_shared<hf::HfWeights>(c.model.init_from, c.model);
    frozen_text = "Hugging Face folder " + c.model.init_from;
    frozen = hfw->fetcher();
    if (dir.empty() && !lora) trainable = frozen, trainable_text = frozen_text;
  }
  WeightSource w;
  // LoRA: the adapters from the checkpoint (or their init), the frozen base from init_from (or
  // the seed's init), as a resumed run takes them (train/trainer.cpp).
  w.description = lora ? str_cat("LoRA adapters of ", trainable_text, " on the base weights of ", frozen_text) : trainable_text;
  w.fetch = [trainable, frozen](const ParamSpec& p, int64_t lo, int64_t hi, float* out) {
    (p.frozen ? frozen : trainable)(p, lo, hi, out);
  };
  w.keep_alive = std::make_shared<std::tuple<std::shared_ptr<ParamTable>, std::shared_ptr<Reader>,
                                             std::shared_ptr<hf::HfWeights>>>(t, reader, hfw);
  return w;
}

void export_hf_from_config(const Config& c, const std::string& out_dir, const hf::ExportOptions& options) {
  hf::architecture(c.model);  // fail before reading anything when the model is not representable
  WeightSource w = weight_source(c);
  log_info("exporting the weights of ", w.description);
  const ParamTable table = model_param_table(c.model);
  if (c.model.lora.rank == 0) return hf::export_hf(c.model, table, w.fetch, out_dir, options);
  // LoRA: the merged model, the base's own folder layout (checkpoint/lora_export.h).
  const ModelConfig base = lora_base_config(c.model);
  log_info("LoRA: writing the merged weights W + (lora.alpha / lora.rank) B A");
  hf::export_hf(base, model_param_table(base), merged_fetch(c.model, table, w.fetch), out_dir, options);
}

void export_peft_from_config(const Config& c, const std::string& out_dir) {
  if (c.model.lora.rank == 0) RAISE(c.where("lora.rank"), "--export-peft needs a LoRA run (lora.rank > 0)");
  WeightSource w = weight_source(c);
  log_info("exporting the LoRA adapter of ", w.description);
  export_peft(c.model, model_param_table(c.model), w.fetch, out_dir);
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
  const int heads = c.model.prediction_heads + 1;  // multi-token prediction: every head's logits
  std::vector<std::vector<float>> logits;          // sequence i's head h at i * heads + h
  for (const auto& s : seqs) {
    const auto T = static_cast<int64_t>(s.size());
    Sample sample;
    sample.tokens = s;
    sample.tokens.push_back(0);  // a label for the last position (unused)
    sample.loss_mask.assign(s.size(), 1);
    sample.doc_lengths = {static_cast<int32_t>(T)};
    MicroBatch mb = make_micro_batch({&sample}, static_cast<int>(T), false, device);
    for (int h = 0; h < heads; ++h) {
      Owned out = empty({T, V}, DType::F32, device);
      model->prediction_logits(mb, h, out);
      std::vector<float> host(static_cast<size_t>(T * V));
      copy_bytes(host.data(), Device::CPU, out.t.data, device, host.size() * 4);
      logits.push_back(std::move(host));
    }
  }
  SafetensorsWriter wr;
  wr.set_metadata({{"format", "pt"}, {"source", w.description}});
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto T = static_cast<int64_t>(seqs[i].size());
    wr.add("tokens." + std::to_string(i), "I32", {T},
           [&, i](OutFile& f) { f.write(seqs[i].data(), seqs[i].size() * 4); });
    for (int h = 0; h < heads; ++h) {
      const size_t k = i * static_cast<size_t>(heads) + static_cast<size_t>(h);
      wr.add((h == 0 ? std::string("logits.") : "logits_head" + std::to_string(h) + ".") + std::to_string(i), "F32",
             {T, V}, [&, k](OutFile& f) { f.write(logits[k].data(), logits[k].size() * 4); });
    }
  }
  // Written under a temporary name and renamed over OUT: a failed write leaves OUT as it was.
  replace_file(out_path, [&wr](const std::string& tmp) { wr.write(tmp); });
  log_info("wrote ", out_path);
}

}  // namespace engine::checkpoint
