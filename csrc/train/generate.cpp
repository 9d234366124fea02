// Text generation (train/generate.h): the sampling rules, the token loop over cached decode steps,
// the text codecs of data.tokenizer, the training samples and the --generate tool.
#include "train/generate.h"

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "checkpoint/tools.h"
#include "core/log.h"
#include "core/rng.h"
#include "layers/embedding.h"

namespace engine {

void check_sampling(const SamplingOptions& o) {
  if (o.max_new_tokens < 1) RAISE("--max-new-tokens must be >= 1, got ", o.max_new_tokens);
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    RAISE("--temperature must be >= 0 (0: greedy), got ", o.temperature);
  if (o.top_k < 0) RAISE("--top-k must be >= 0 (0: every id), got ", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1)) RAISE("--top-p must be in (0, 1], got ", o.top_p);
}

std::vector<std::pair<int32_t, double>> sampling_distribution(std::span<const float> logits, const SamplingOptions& o) {
  ENSURE(o.temperature > 0, "sampling_distribution: temperature must be > 0 (0 is greedy)");
  ENSURE(!logits.empty(), "sampling_distribution: no logits");
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Descending logit, ties by id (pick_token refused NaN logits, which have no order).
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < order.size()) order.resize(static_cast<size_t>(o.top_k));
  const double top = logits[static_cast<size_t>(order[0])] / o.temperature;
  std::vector<std::pair<int32_t, double>> p;
  p.reserve(order.size());
  double sum = 0;
  for (int32_t id : order) {
    const double e = std::exp(logits[static_cast<size_t>(id)] / o.temperature - top);
    p.emplace_back(id, e);
    sum += e;
  }
  // The smallest prefix reaching top_p (at least one id).
  double cum = 0;
  size_t keep = 0;
  while (keep < p.size()) {
    cum += p[keep].second / sum;
    ++keep;
    if (cum >= o.top_p) break;
  }
  p.resize(keep);
  double kept = 0;
  for (const auto& e : p) kept += e.second;
  for (auto& e : p) e.second /= kept;
  return p;
}

int32_t pick_token(std::span<const float> logits, const SamplingOptions& o, double u) {
  for (float v : logits)
    if (std::isnan(v)) RAISE("sampling: a NaN logit (the weights are not finite?)");
  if (o.temperature == 0) {
    size_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  const auto p = sampling_distribution(logits, o);
  double cum = 0;
  for (const auto& [id, prob] : p) {
    cum += prob;
    if (u < cum) return id;
  }
  return p.back().first;  // u within rounding of 1
}

void check_prompt_fits(int64_t tokens, int64_t context) {
  if (tokens >= context)
    RAISE("the prompt has ", tokens, " tokens and the model's context is ", context,
          " positions (model.max_position_embeddings): no room for a new token");
}

double sampling_uniform(uint64_t seed, int64_t index) {
  static constexpr std::string_view kPurpose = "generate";
  return static_cast<double>(philox_u64(philox_key(seed, kPurpose), static_cast<uint64_t>(index)) >> 11) * 0x1p-53;
}

Generation generate(Model& model, std::span<const int32_t> prompt, const SamplingOptions& o,
                    const std::vector<int32_t>& stop, int64_t context, int64_t allowed_vocab) {
  check_sampling(o);
  const auto start = std::chrono::steady_clock::now();
  if (prompt.empty()) RAISE("generate: an empty prompt (the model needs at least one token to continue)");
  check_prompt_fits(static_cast<int64_t>(prompt.size()), context);
  const int64_t V = model.params().table().get(layers::Embedding::kTokens).shape[0];
  ENSURE(allowed_vocab >= 1 && allowed_vocab <= V, "generate: ", allowed_vocab, " ids allowed of the model's ", V);
  for (int32_t t : prompt)
    ENSURE(t >= 0 && t < allowed_vocab, "prompt token ", t, " is not an id in [0, ", allowed_vocab, ")");
  const Device device = model.params().weights_flat().device;
  auto cache = model.new_decode_cache(std::min<int64_t>(context, static_cast<int64_t>(prompt.size()) + o.max_new_tokens));
  Owned logits_dev = empty({1, V}, DType::F32, device);
  std::vector<float> logits(static_cast<size_t>(V));
  auto run = [&](int32_t token) {
    model.decode_step(*cache, token, logits_dev);
    copy_bytes(logits.data(), Device::CPU, logits_dev.t.data, device, logits.size() * sizeof(float));
  };
  for (int32_t t : prompt) run(t);  // prefill: the prompt's tokens, one step each
  const std::span<const float> allowed(logits.data(), static_cast<size_t>(allowed_vocab));
  Generation g;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const int32_t next = pick_token(allowed, o, o.temperature > 0 ? sampling_uniform(o.seed, i) : 0.0);
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) {
      g.stopped_at_eos = true;
      break;
    }
    g.tokens.push_back(next);
    if (i + 1 == o.max_new_tokens) break;
    if (cache->position == context) {
      g.stopped_at_context = true;
      break;
    }
    run(next);
  }
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return g;
}

std::vector<int32_t> TextCodec::encode(const std::string& prompt) const {
  std::vector<int32_t> ids;
  if (tokenizer) {
    if (tokenizer->add_bos() && tokenizer->bos_id()) ids.push_back(*tokenizer->bos_id());
    const std::vector<int32_t> text = tokenizer->encode(prompt);
    ids.insert(ids.end(), text.begin(), text.end());
  } else {  // token ids, separated by commas or spaces
    std::string word;
    auto flush = [&] {
      if (word.empty()) return;
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(word.c_str(), &end, 10);
      if (*end != '\0' || errno != 0 || v < 0 || v >= vocab)
        RAISE("prompt: '", word, "' is not a token id in [0, ", vocab, ") (", description, ")");
      ids.push_back(static_cast<int32_t>(v));
      word.clear();
    };
    for (char ch : prompt) {
      if (ch == ',' || std::isspace(static_cast<unsigned char>(ch)))
        flush();
      else
        word.push_back(ch);
    }
    flush();
  }
  if (ids.empty()) RAISE("the prompt is empty (", description, "): the model needs at least one token to continue");
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) RAISE("prompt: token ", id, " is not an id in [0, ", vocab, ")");
  return ids;
}

std::string TextCodec::decode(std::span<const int32_t> ids) const {
  if (tokenizer) return tokenizer->decode(ids);
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

std::vector<int32_t> TextCodec::stop_ids() const { return tokenizer ? tokenizer->eos_ids() : std::vector<int32_t>{}; }

TextCodec make_text_codec(const Config& c) {
  namespace fs = std::filesystem;
  const int64_t V = c.model.vocab_size;
  std::string spec = c.data.tokenizer;
  std::string why = "data.tokenizer";
  if (spec.empty()) {
    std::error_code ec;
    if (!c.model.init_from.empty() && fs::exists(fs::path(c.model.init_from) / "tokenizer.json", ec)) {
      spec = c.model.init_from;
      why = "model.init_from's tokenizer.json";
    } else {
      spec = V == 257 ? "bytes" : "ids";
      why = V == 257 ? "vocab_size 257" : "no tokenizer.json in model.init_from and vocab_size not 257";
    }
  }
  TextCodec codec;
  if (spec == "ids") {
    codec.vocab = V;
    codec.description = "token ids (" + why + ")";
    return codec;
  }
  Tokenizer t = spec == "bytes" ? Tokenizer::byte_level() : Tokenizer::load(spec);
  ENSURE(t.vocab_size() <= V, c.where("data.tokenizer"), "the tokenizer (", t.describe(), ") has ", t.vocab_size(),
         " ids, more than model.vocab_size (", V, ")");
  codec.vocab = t.vocab_size();
  codec.description = t.describe() + " (" + why + ")";
  codec.tokenizer = std::move(t);
  return codec;
}

std::string sample_text(Model& model, const Config& c, const TextCodec& codec) {
  SamplingOptions o;
  o.temperature = 0;
  o.max_new_tokens = c.training.sample_tokens;
  const std::vector<int32_t> prompt = codec.encode(c.training.sample_prompt);
  const Generation g = generate(model, prompt, o, codec.stop_ids(), c.model.max_position_embeddings, codec.vocab);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end());
  return codec.decode(all);
}

void generate_from_config(const Config& c, Device device, const std::string& prompt, const SamplingOptions& o) {
  check_sampling(o);
  const TextCodec codec = make_text_codec(c);
  const std::vector<int32_t> ids = codec.encode(prompt);
  const int64_t context = c.model.max_position_embeddings;
  check_prompt_fits(static_cast<int64_t>(ids.size()), context);
  checkpoint::WeightSource w = checkpoint::weight_source(c);
  log_info("generating with the weights of ", w.description, " on ", device_name(device), "; text: ", codec.description);
  if (o.temperature == 0)
    log_info("greedy, at most ", o.max_new_tokens, " new tokens");
  else
    log_info("temperature ", o.temperature, ", top-k ", o.top_k, ", top-p ", o.top_p, ", seed ", o.seed, ", at most ",
             o.max_new_tokens, " new tokens");
  auto model = make_model(c.model, device, device == Device::CPU ? DType::F32 : DType::BF16);
  checkpoint::fill_weights(model->params(), w.fetch);
  const Generation g = generate(*model, ids, o, codec.stop_ids(), context, codec.vocab);
  char rate[64];
  std::snprintf(rate, sizeof(rate), "%.2f s, %.1f", g.seconds,
                static_cast<double>(ids.size() + g.tokens.size()) / std::max(g.seconds, 1e-9));
  log_info(g.tokens.size(), " new tokens after a prompt of ", ids.size(), " in ", rate, " steps/s; ",
           g.stopped_at_eos       ? "stopped at the end-of-document token"
           : g.stopped_at_context ? str_cat("stopped at the context (", context, " positions)")
                                  : str_cat("max_new_tokens (", o.max_new_tokens, ")"));
  std::vector<int32_t> all = ids;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end());
  const std::string text = codec.decode(all);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace engine
