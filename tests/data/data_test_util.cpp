#include "tests/data/data_test_util.h"

#include <unistd.h>

#include <fstream>
#include <iterator>

#include "core/check.h"
#include "tests/common/testing.h"

namespace engine::data_testing {

namespace {

struct TempRoot {
  std::string path = "/tmp/engine_data_tests." + std::to_string(::getpid());
  ~TempRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

std::string data_test_dir(const std::string& name) {
  static TempRoot root;
  std::string dir = root.path + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ENSURE(f.good(), "cannot read ", path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  // Unlink first: ext4 flushes a file truncated and rewritten in place on close (auto_da_alloc),
  // which makes hundreds of small rewrites slow on a busy disk.
  std::filesystem::remove(path);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ENSURE(f.good(), "cannot write ", path);
}

int dtype_code_size(uint8_t code) {
  switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: case 6: return 4;
    default: return 8;
  }
}

void write_raw_index(const std::string& prefix, const RawIndex& r) {
  const int item = dtype_code_size(r.dtype_code);
  std::vector<unsigned char> bin, idx;
  std::vector<int64_t> pointers;
  for (const auto& d : r.docs) {
    pointers.push_back(static_cast<int64_t>(bin.size()));
    for (int64_t t : d) {
      unsigned char tmp[8];
      std::memcpy(tmp, &t, 8);  // little-endian: the low bytes are the narrow value
      bin.insert(bin.end(), tmp, tmp + item);
    }
  }
  if (!r.pointers.empty()) pointers = r.pointers;
  const uint64_t n = r.docs.size();
  idx.insert(idx.end(), {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0});
  append<uint64_t>(idx, r.version);
  if (r.version >= 2) append<uint8_t>(idx, r.has_spans);
  if (r.version >= 3) append<uint8_t>(idx, r.has_preference);
  append<uint8_t>(idx, r.dtype_code);
  std::vector<int64_t> doc_idx = r.doc_idx;
  if (doc_idx.empty())
    for (uint64_t i = 0; i <= n; ++i) doc_idx.push_back(static_cast<int64_t>(i));
  append<uint64_t>(idx, n);
  append<uint64_t>(idx, doc_idx.size());
  for (const auto& d : r.docs) append<int32_t>(idx, static_cast<int32_t>(d.size()));
  for (int64_t p : pointers) append<int64_t>(idx, p);
  if (r.has_spans) {
    for (uint64_t i = 0; i < n; ++i) append<int32_t>(idx, i < r.spans.size() ? static_cast<int32_t>(r.spans[i].size()) : 0);
    for (const auto& ds : r.spans)
      for (auto [b, e] : ds) {
        append<int32_t>(idx, b);
        append<int32_t>(idx, e);
      }
  }
  if (r.has_preference) {
    for (auto [b, e] : r.chosen) {
      append<int32_t>(idx, b);
      append<int32_t>(idx, e);
    }
    for (auto [b, e] : r.rejected) {
      append<int32_t>(idx, b);
      append<int32_t>(idx, e);
    }
  }
  for (int64_t v : doc_idx) append<int64_t>(idx, v);
  write_bytes(prefix + ".bin", bin);
  write_bytes(prefix + ".idx", idx);
}

std::vector<std::vector<int32_t>> random_documents(const std::string& name, int count, int min_len,
                                                   int max_len, int vocab) {
  PhiloxKey key = testing::test_key(name);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(count));
  uint64_t c = 0;
  for (auto& d : docs) {
    d.resize(static_cast<size_t>(min_len) + philox_below(key, c++, static_cast<uint64_t>(max_len - min_len + 1)));
    for (auto& t : d) t = static_cast<int32_t>(philox_below(key, c++, static_cast<uint64_t>(vocab)));
  }
  return docs;
}

Config data_config(const std::vector<std::string>& paths, int sequence_length, int vocab_size,
                   bool truncate_documents, const std::vector<double>& weights) {
  Config c;
  c.run.seed = testing::test_seed();
  c.model.vocab_size = vocab_size;
  c.data.sequence_length = sequence_length;
  c.data.truncate_documents = truncate_documents;
  for (size_t i = 0; i < paths.size(); ++i)
    c.data.train.push_back({paths[i], weights.empty() ? 1.0 : weights[i], 0});
  return c;
}

}  // namespace engine::data_testing
