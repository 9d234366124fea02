#include "data/dataset_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace engine {

namespace {

// A file written under a temporary name and renamed into place by commit().
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(temp_name(path_)) {
    f_ = std::fopen(tmp_.c_str(), "w+b");
    if (!f_) RAISE("cannot create ", tmp_, ": ", std::strerror(errno));
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~AtomicFile() {
    if (f_) std::fclose(f_);
    if (!renamed_) std::remove(tmp_.c_str());
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) RAISE("write to ", tmp_, " failed: ", std::strerror(errno));
  }
  void write(std::string_view s) { write(s.data(), s.size()); }
  template <typename T>
  void put(T v) { write(&v, sizeof(T)); }  // little-endian host
  template <typename T>
  void put_be(T v) {
    unsigned char b[sizeof(T)];
    for (size_t i = 0; i < sizeof(T); ++i) b[i] = static_cast<unsigned char>(v >> (8 * (sizeof(T) - 1 - i)));
    write(b, sizeof(T));
  }
  uint64_t tell() const {
    const long at = std::ftell(f_);
    if (at < 0) RAISE("ftell ", tmp_, ": ", std::strerror(errno));
    return static_cast<uint64_t>(at);
  }
  void seek(uint64_t off) {
    if (std::fseek(f_, static_cast<long>(off), SEEK_SET) != 0) RAISE("seek in ", tmp_, ": ", std::strerror(errno));
  }
  // Flushes and fsyncs; the rename happens in rename_into_place() so that several files can be
  // made durable before any of them appears.
  void sync() {
    if (std::fflush(f_) != 0) RAISE("flush ", tmp_, ": ", std::strerror(errno));
    fsync_file(fileno(f_), tmp_);
    if (std::fclose(f_) != 0) {
      f_ = nullptr;
      RAISE("close ", tmp_, ": ", std::strerror(errno));
    }
    f_ = nullptr;
  }
  void rename_into_place() {
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      int e = errno;
      std::remove(tmp_.c_str());
      RAISE("rename ", tmp_, " -> ", path_, ": ", std::strerror(e));
    }
    renamed_ = true;
    fsync_parent_dir(path_);
  }

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  bool renamed_ = false;
};

// Validation and encoding shared by both formats.
class WriterBase : public TokenDatasetWriter {
 protected:
  WriterBase(std::string path, int64_t vocab_size, bool with_spans)
      : path_(std::move(path)), vocab_(vocab_size), type_(token_type_for_vocab(vocab_size)),
        with_spans_(with_spans) {}

  void check_document(std::span<const int32_t> tokens, std::span<const TokenSpan> spans) {
    ENSURE(!finished_, path_, ": add_document after finish()");
    ENSURE(tokens.size() <= static_cast<size_t>(INT32_MAX), path_, ": document of ", tokens.size(),
           " tokens is too long");
    ENSURE(with_spans_ || spans.empty(), path_, ": this writer was created without loss-masking spans");
    for (size_t i = 0; i < tokens.size(); ++i)
      ENSURE(tokens[i] >= 0 && tokens[i] < vocab_, path_, ": document ", num_documents_, ", token ",
             i, ": id ", tokens[i], " outside [0, vocab_size = ", vocab_, ")");
    for (const TokenSpan& s : spans)
      ENSURE(s.begin >= 0 && s.begin <= s.end && s.end <= static_cast<int64_t>(tokens.size()), path_,
             ": document ", num_documents_, ": span [", s.begin, ", ", s.end, ") outside its ",
             tokens.size(), " tokens");
  }
  void write_tokens(AtomicFile& f, std::span<const int32_t> tokens) {
    if (type_ == TokenType::U16) {
      buf16_.assign(tokens.begin(), tokens.end());
      f.write(buf16_.data(), buf16_.size() * 2);
    } else {
      f.write(tokens.data(), tokens.size() * 4);
    }
  }

  std::string path_;
  int64_t vocab_;
  TokenType type_;
  bool with_spans_;
  bool finished_ = false;
  std::vector<uint16_t> buf16_;
};

class MemmapWriter final : public WriterBase {
 public:
  MemmapWriter(const std::string& prefix, int64_t vocab, bool with_spans)
      : WriterBase(prefix, vocab, with_spans), bin_(prefix + ".bin") {}

  void add_document(std::span<const int32_t> tokens, std::span<const TokenSpan> spans) override {
    check_document(tokens, spans);
    sizes_.push_back(static_cast<int32_t>(tokens.size()));
    write_tokens(bin_, tokens);
    int32_t count = 0;
    for (const TokenSpan& s : spans)
      if (s.end > s.begin) {
        spans_.push_back(static_cast<int32_t>(s.begin));
        spans_.push_back(static_cast<int32_t>(s.end - 1));  // inclusive end on disk
        ++count;
      }
    if (with_spans_) span_counts_.push_back(count);
    ++num_documents_;
    num_tokens_ += static_cast<int64_t>(tokens.size());
  }

  void finish() override {
    ENSURE(!finished_, path_, ": finish() called twice");
    finished_ = true;
    AtomicFile idx(path_ + ".idx");
    idx.write("MMIDIDX\x00\x00", 9);
    idx.put<uint64_t>(with_spans_ ? 2 : 1);
    if (with_spans_) idx.put<uint8_t>(1);
    idx.put<uint8_t>(type_ == TokenType::U16 ? 8 : 4);
    const uint64_t n = sizes_.size();
    idx.put<uint64_t>(n);
    idx.put<uint64_t>(n + 1);
    idx.write(sizes_.data(), n * 4);
    std::vector<int64_t> pointers(n);
    int64_t ptr = 0;
    for (uint64_t i = 0; i < n; ++i) {
      pointers[i] = ptr;
      ptr += static_cast<int64_t>(sizes_[i]) * token_type_size(type_);
    }
    idx.write(pointers.data(), n * 8);
    if (with_spans_) {
      idx.write(span_counts_.data(), n * 4);
      idx.write(spans_.data(), spans_.size() * 4);
    }
    for (uint64_t i = 0; i <= n; ++i) idx.put<int64_t>(static_cast<int64_t>(i));
    bin_.sync();
    idx.sync();
    bin_.rename_into_place();
    idx.rename_into_place();
  }

 private:
  AtomicFile bin_;
  std::vector<int32_t> sizes_, span_counts_, spans_;
};

class FastLLMWriter final : public WriterBase {
 public:
  FastLLMWriter(const std::string& path, int64_t vocab, bool with_spans)
      : WriterBase(path, vocab, with_spans), file_(path) {
    file_.write("fast_llm_prepared_dataset");
    file_.put<uint64_t>(0);  // config offset, written by finish()
    file_.write("lm begin");
    file_.write("token begin");
    cumsum_.push_back(0);
    if (with_spans) range_cumsum_.push_back(0);
  }

  void add_document(std::span<const int32_t> tokens, std::span<const TokenSpan> spans) override {
    check_document(tokens, spans);
    write_tokens(file_, tokens);
    for (const TokenSpan& s : spans)
      if (s.end > s.begin) {
        ranges_.push_back(static_cast<int32_t>(s.begin));
        ranges_.push_back(static_cast<int32_t>(s.end));
      }
    if (with_spans_) {
      ENSURE(ranges_.size() / 2 < static_cast<size_t>(INT32_MAX), path_, ": too many spans");
      range_cumsum_.push_back(static_cast<int32_t>(ranges_.size() / 2));
    }
    ++num_documents_;
    num_tokens_ += static_cast<int64_t>(tokens.size());
    cumsum_.push_back(num_tokens_);
  }

  void finish() override {
    using nlohmann::json;
    ENSURE(!finished_, path_, ": finish() called twice");
    finished_ = true;
    const uint64_t lm_begin = 33;
    file_.write(cumsum_.data(), cumsum_.size() * 8);
    file_.write("token end");
    json tokens = {{"type", "token"},
                   {"begin", lm_begin + 8},
                   {"end", file_.tell()},
                   {"num_documents", num_documents_},
                   {"num_tokens", num_tokens_},
                   {"data_type", token_type_name(type_)}};
    json spans = {{"type", "none"}};
    if (with_spans_) {
      uint64_t begin = file_.tell();
      file_.write("range begin");
      file_.write(ranges_.data(), ranges_.size() * 4);
      file_.write(range_cumsum_.data(), range_cumsum_.size() * 4);
      file_.write("range end");
      spans = {{"type", "range"},         {"begin", begin},
               {"end", file_.tell()},     {"num_documents", num_documents_},
               {"num_ranges", ranges_.size() / 2}};
    }
    file_.write("lm end");
    json config = {{"type", "language_model"},
                   {"begin", lm_begin},
                   {"end", file_.tell()},
                   {"tokens", tokens},
                   {"loss_masking_spans", spans},
                   {"chosen_spans", {{"type", "none"}}},
                   {"rejected_spans", {{"type", "none"}}},
                   {"image_patches", {{"type", "none"}}}};
    std::string text = config.dump();
    uint64_t config_offset = file_.tell();
    file_.put_be<uint32_t>(static_cast<uint32_t>(text.size()));
    file_.write(text);
    file_.seek(25);
    file_.put_be<uint64_t>(config_offset);
    file_.sync();
    file_.rename_into_place();
  }

 private:
  AtomicFile file_;
  std::vector<int64_t> cumsum_;
  std::vector<int32_t> ranges_, range_cumsum_;
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::unique_ptr<TokenDatasetWriter> make_token_dataset_writer(const std::string& path,
                                                              int64_t vocab_size,
                                                              bool with_loss_masking_spans) {
  if (ends_with(path, ".fast_llm_dataset"))
    return std::make_unique<FastLLMWriter>(path, vocab_size, with_loss_masking_spans);
  return std::make_unique<MemmapWriter>(path, vocab_size, with_loss_masking_spans);
}

void write_token_dataset(const std::string& path, const std::vector<std::vector<int32_t>>& documents,
                         int64_t vocab_size, const std::vector<std::vector<TokenSpan>>& spans) {
  ENSURE(spans.empty() || spans.size() == documents.size(), path, ": ", spans.size(),
         " span lists for ", documents.size(), " documents");
  auto w = make_token_dataset_writer(path, vocab_size, !spans.empty());
  for (size_t i = 0; i < documents.size(); ++i)
    w->add_document(documents[i], spans.empty() ? std::span<const TokenSpan>() : spans[i]);
  w->finish();
}

}  // namespace engine
