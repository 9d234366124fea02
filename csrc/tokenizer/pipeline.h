// The text stages of a Hugging Face tokenizer.json around its model: the normalizer, the
// pre-tokenizer and the decoder, each a flat list of steps (a "Sequence" is flattened).
// Implemented (everything else is refused at load with the file and key):
//   normalizer     null, Sequence, Prepend, Replace (String pattern), NFC
//   pre_tokenizer  null, Sequence, ByteLevel (add_prefix_space, use_regex), Split (Regex or
//                  String pattern, any behavior, invert), Metaspace (prepend_scheme, split)
//   decoder        null, Sequence, ByteLevel, Metaspace, Replace (String pattern), ByteFallback,
//                  Fuse, Strip
// Semantics as tokenizers' (normalizers/, pre_tokenizers/, decoders/): e.g. ByteLevel maps every
// byte to one printable character (GPT-2's table), Metaspace's "first" prepends only to the text
// that starts the input, the Metaspace decoder drops every replacement character of the first
// token.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/regex.h"

namespace engine::tok {

struct NormalizerStep {
  enum Kind { Prepend, Replace, NFC } kind;
  std::string a, b;  // Prepend: a; Replace: a -> b
};

// A piece of text on its way to the model; at_origin: it starts at offset 0 of the input.
struct Piece {
  std::string text;
  bool at_origin;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };
enum class PrependScheme { First, Never, Always };

struct PreTokenizerStep {
  enum Kind { ByteLevel, Split, Metaspace } kind;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  std::shared_ptr<PretokRegex> regex;               // Split (Regex), ByteLevel (GPT-2's)
  std::string literal;                              // Split (String)
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  std::string replacement;                          // Metaspace (one character, UTF-8)
  PrependScheme prepend = PrependScheme::Always;
  bool split = true;
};

struct DecoderStep {
  enum Kind { ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip } kind;
  std::string a, b;            // Metaspace: a = replacement; Replace: a -> b; Strip: a = content
  PrependScheme prepend = PrependScheme::Always;
  size_t start = 0, stop = 0;  // Strip
};

// Readers of the three keys; `where` names the file for errors. A null or absent key gives an
// empty list.
std::vector<NormalizerStep> read_normalizer(const nlohmann::json* j, const std::string& where);
std::vector<PreTokenizerStep> read_pre_tokenizer(const nlohmann::json* j, const std::string& where);
std::vector<DecoderStep> read_decoder(const nlohmann::json* j, const std::string& where);

std::string normalize(const std::vector<NormalizerStep>& steps, std::string text);
std::vector<Piece> pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::vector<Piece> pieces);
// Without steps the tokens are joined with a space (as tokenizers does without a decoder).
std::string decode_tokens(const std::vector<DecoderStep>& steps, std::vector<std::string> tokens);

// GPT-2's byte -> character table of the ByteLevel pre-tokenizer and decoder.
const std::string& byte_to_char(uint8_t b);  // UTF-8 of the character
// The byte a character stands for, or -1.
int char_to_byte(char32_t c);

}  // namespace engine::tok
