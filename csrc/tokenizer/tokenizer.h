// Text <-> token ids for generation (./train CONFIG --generate "prompt").
//   byte_level()  the engine's default data format (scripts/prepare_data.py): id = UTF-8 byte
//                 0..255, 256 = end of document.
//   load(path)    a Hugging Face tokenizer.json (BPE model: byte-level BPE as GPT-2, Llama 3,
//                 Qwen2, Mistral-Nemo; SentencePiece-style BPE with byte fallback as Llama 2,
//                 Mistral 7B, TinyLlama), or a model folder holding one. BOS, EOS and add_bos come
//                 from tokenizer_config.json, special_tokens_map.json and generation_config.json
//                 beside it (first found wins, in that order), else from the post_processor.
// encode and decode agree with Hugging Face tokenizers' encode(text, add_special_tokens=False)
// and decode(ids, skip_special_tokens=False). A tokenizer.json with anything else (WordPiece,
// Unigram, normalizers, pre-tokenizers, decoders or options not implemented: tokenizer/pipeline.h)
// is refused with an error naming the file and the key.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace engine {

class Tokenizer {
 public:
  static Tokenizer byte_level();
  static Tokenizer load(const std::string& path);

  // The text's tokens, no BOS/EOS added; added tokens written in the text (special or not) are
  // recognised as tokenizers does. Text that is not valid UTF-8 is an error (byte_level() takes
  // any bytes).
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids outside the vocabulary are skipped (as tokenizers does); bytes that do not form UTF-8
  // come out as U+FFFD.
  std::string decode(std::span<const int32_t> ids) const;
  int64_t vocab_size() const;  // largest id + 1 over the model vocab and added tokens
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;  // generation stops here
  bool add_bos() const;                   // the tokenizer's config prepends BOS to a prompt
  // The id tokenizer.json's post_processor alone prepends to a sequence (whatever the configs say).
  std::optional<int32_t> template_bos_id() const;
  std::string describe() const;           // one line for the run log: kind, vocab, bos/eos

  // Every id generation stops at: eos_id() first, then the other ids of generation_config.json's
  // eos_token_id list (Llama 3 instruct models stop at several).
  std::vector<int32_t> eos_ids() const;
  // The id of a token string (an added token or a model vocab entry).
  std::optional<int32_t> token_to_id(std::string_view token) const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace engine
