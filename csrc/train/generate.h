// Text generation: a model continues a prompt one token at a time, each new token one cached
// decode step (models/model.h decode_step: a KV cache for attention layers, a conv and scan state
// cache for Mamba layers). The prompt runs through the same steps, token by token (prefill by
// decode steps: the prompt's logits are those of the full forward, and no second path needs its
// caches filled from a forward).
//   ./train CONFIG --generate PROMPT [--max-new-tokens N --temperature T --top-k K --top-p P --seed S]
// takes the weights as --export-hf does (checkpoint::weight_source: training.resume, the run's
// newest checkpoint, model.init_from, else the init) onto one device (run.device; bf16 on a GPU),
// on rank 0 only under mpirun (the other ranks wait), and prints the prompt and its continuation.
// training.sample_every prints a greedy sample with the trainer's model (Trainer::run).
//
// Sampling (pick_token): temperature 0 is greedy (the largest logit, the lowest id among equals);
// otherwise the logits are divided by the temperature, only the top_k largest kept (0: all), then
// the smallest set of the most likely ids whose probability reaches top_p (ties broken by id),
// renormalised, and one id drawn by the uniform number u: the first id in that order whose
// cumulative probability exceeds u. u for the i-th new token is a pure function of (seed, i)
// (Philox), so a seed gives the same text on any run, and nothing is shared with training.
// Generation stops at the tokenizer's end-of-document id (not printed), after max_new_tokens, or
// when the sequence fills the model's context (model.max_position_embeddings, the trained
// positions; a longer prompt is an error).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace engine {

struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: every id
  double top_p = 1.0;        // in (0, 1]
  uint64_t seed = 0;
};
// Throws naming the option (--temperature, --top-k, --top-p, --max-new-tokens) that is out of range.
void check_sampling(const SamplingOptions& o);

// The distribution a draw picks from (temperature > 0): (id, probability) in the order of the
// draw (descending probability, ties by id), after top_k and top_p, summing to 1.
std::vector<std::pair<int32_t, double>> sampling_distribution(std::span<const float> logits, const SamplingOptions& o);
// The next id (see above); u in [0, 1) is used only when temperature > 0.
int32_t pick_token(std::span<const float> logits, const SamplingOptions& o, double u);
// A prompt of `tokens` ids must leave room for a new token in `context` positions (else an error).
void check_prompt_fits(int64_t tokens, int64_t context);
// The uniform number in [0, 1) of the index-th new token under `seed`.
double sampling_uniform(uint64_t seed, int64_t index);

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens (without the end-of-document id)
  bool stopped_at_eos = false;
  bool stopped_at_context = false;
  double seconds = 0;           // the whole call, prompt included
};
// prompt: at least one id below allowed_vocab; ids at or past allowed_vocab (the model's padded
// vocabulary beyond the tokenizer's) are never picked. stop: the ids that end the text (the
// tokenizer's end-of-document ids). context: positions the model may take.
Generation generate(Model& model, std::span<const int32_t> prompt, const SamplingOptions& o,
                    const std::vector<int32_t>& stop, int64_t context, int64_t allowed_vocab);

// Text <-> ids as data.tokenizer says (config.h). Without a tokenizer (token ids), a prompt is
// ids separated by commas or spaces ("1,2,3") and output is ids separated by spaces.
struct TextCodec {
  std::optional<Tokenizer> tokenizer;
  std::string description;
  int64_t vocab = 0;  // ids text can hold: the tokenizer's vocabulary, or the model's
  // The prompt's ids (with the tokenizer's BOS first when it adds one); throws naming the
  // problem (an empty prompt, an id outside the vocabulary).
  std::vector<int32_t> encode(const std::string& prompt) const;
  std::string decode(std::span<const int32_t> ids) const;
  std::vector<int32_t> stop_ids() const;  // the tokenizer's eos_ids() (none for token ids)
};
TextCodec make_text_codec(const Config& c);

// The greedy continuation (training.sample_tokens new tokens at most) of training.sample_prompt
// with `model`'s current weights, as text (the prompt included).
std::string sample_text(Model& model, const Config& c, const TextCodec& codec);

// ./train CONFIG --generate PROMPT: the weights of checkpoint::weight_source on `device`, the
// prompt's continuation printed to stdout (the log lines before it).
void generate_from_config(const Config& c, Device device, const std::string& prompt, const SamplingOptions& o);

}  // namespace engine
