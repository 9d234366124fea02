// safetensors files (FORMATS.md): u64 little-endian header size N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "string", ...}}
// then the data section; offsets are relative to its first byte.
// The reader is strict, as the format's own implementation is: the header size must fit the
// file (and 100 MB), the header must be a JSON object (no duplicate names), every entry must
// have exactly dtype / shape / data_offsets with a known dtype, a shape whose byte size equals
// end - begin, and the offsets sorted by begin must start at 0, be contiguous and end at the
// end of the file: no gap, no overlap, no trailing bytes. Every error names the file and the
// tensor. The file is memory-mapped; reads convert F32 / BF16 / F16 / F64 to f32.
// The writer lays tensors out in the order they were added, pads the header with spaces to a
// multiple of 8 bytes (so the data is aligned, as the reference writer does), streams the data
// through OutFile (size and checksum on the fly) and fsyncs.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/file_io.h"
#include "data/mapped_file.h"

namespace engine::checkpoint {

// Bytes per element of a safetensors dtype name, or 0 when the name is unknown.
size_t safetensors_dtype_size(const std::string& dtype);

struct StTensor {
  std::string name;
  std::string dtype;           // "F32", "BF16", ... as in the file
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<StTensor>& tensors() const { return tensors_; }  // sorted by offset
  const StTensor* find(const std::string& name) const;
  const StTensor& at(const std::string& name) const;  // error naming the file when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute offset of the data section
  uint64_t file_size() const { return file_.size(); }
  const unsigned char* data(const StTensor& t) const { return file_.data() + data_offset_ + t.begin; }
  // Elements [begin, end) of `t` (flat, row-major) as f32; F32, BF16, F16 and F64 convert.
  void read_f32(const StTensor& t, int64_t begin, int64_t end, float* out) const;

 private:
  [[noreturn]] void fail(const std::string& what) const;
  MappedFile file_;
  std::vector<StTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_offset_ = 0;
};

class SafetensorsWriter {
 public:
  // Writes exactly the tensor's bytes (numel * dtype size) to the file.
  using Producer = std::function<void(OutFile&)>;
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape, Producer write);
  void set_metadata(std::map<std::string, std::string> metadata) { metadata_ = std::move(metadata); }
  uint64_t data_bytes() const { return data_bytes_; }
  size_t size() const { return entries_.size(); }
  // Creates `path` (which must not exist), writes header and data, fsyncs and closes it.
  FileDigest write(const std::string& path) const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t bytes = 0;
    Producer write;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

// f32 -> the bytes of `dtype` ("F32" or "BF16", round to nearest even) appended to `out`.
void encode_f32(const float* src, int64_t n, const std::string& dtype, std::vector<unsigned char>* out);

}  // namespace engine::checkpoint
