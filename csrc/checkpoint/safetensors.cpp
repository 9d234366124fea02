#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/dtype.h"

namespace engine::checkpoint {

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit

struct DTypeInfo {
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {{"BOOL", 1}, {"U8", 1},   {"I8", 1},   {"F8_E5M2", 1}, {"F8_E4M3", 1},
                                 {"I16", 2},  {"U16", 2},  {"F16", 2},  {"BF16", 2},    {"I32", 4},
                                 {"U32", 4},  {"F32", 4},  {"F64", 8},  {"I64", 8},     {"U64", 8}};

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

size_t safetensors_dtype_size(const std::string& dtype) {
  for (const auto& d : kDTypes)
    if (dtype == d.name) return d.size;
  return 0;
}

void SafetensorsFile::fail(const std::string& what) const { RAISE(path(), ": safetensors: ", what); }

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  if (file_.size() < 8) fail(str_cat("file of ", file_.size(), " bytes is shorter than the 8-byte header size"));
  const uint64_t n = file_.le<uint64_t>(0, "header size");
  if (n > kMaxHeader) fail(str_cat("header size ", n, " is larger than the limit of ", kMaxHeader, " bytes"));
  if (n > file_.size() - 8)
    fail(str_cat("header size ", n, " does not fit the file of ", file_.size(), " bytes (truncated?)"));
  data_offset_ = 8 + n;
  const char* h = reinterpret_cast<const char*>(file_.data() + 8);
  if (n == 0 || h[0] != '{') fail("the header is not a JSON object (it must start with '{')");

  // Parse, rejecting duplicate names at the top level (JSON parsers keep the last silently).
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(
        h, h + n,
        [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
          if (depth == 1 && ev == nlohmann::json::parse_event_t::key) {
            const std::string k = parsed.get<std::string>();
            if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    fail(str_cat("the header is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) fail(str_cat("tensor '", duplicate, "' appears twice in the header"));
  if (!j.is_object()) fail("the header is not a JSON object");

  const uint64_t data_size = file_.size() - data_offset_;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(str_cat("__metadata__ value of '", m.key(), "' is not a string"));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string at = str_cat("tensor '", name, "': ");
    if (!v.is_object()) fail(at + "entry is not an object");
    for (auto f = v.begin(); f != v.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        fail(str_cat(at, "unknown field '", f.key(), "' (expected dtype, shape, data_offsets)"));
    StTensor t;
    t.name = name;
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(at + "missing or non-string dtype");
    t.dtype = v["dtype"].get<std::string>();
    const size_t esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) fail(str_cat(at, "unknown dtype \"", t.dtype, "\""));
    if (!v.contains("shape") || !v["shape"].is_array()) fail(at + "missing shape (an array of sizes)");
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned()) fail(str_cat(at, "shape ", v["shape"].dump(), " has a non-integer or negative size"));
      const uint64_t s = d.get<uint64_t>();
      if (s > (uint64_t{1} << 62) || __builtin_mul_overflow(numel, s, &numel) || numel > (uint64_t{1} << 62))
        fail(str_cat(at, "shape ", v["shape"].dump(), " overflows"));
      t.shape.push_back(static_cast<int64_t>(s));
    }
    t.numel = static_cast<int64_t>(numel);
    const nlohmann::json* off = v.contains("data_offsets") ? &v["data_offsets"] : nullptr;
    if (!off || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail(at + "data_offsets must be [begin, end], two non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.end < t.begin) fail(str_cat(at, "data_offsets [", t.begin, ", ", t.end, "] end before they begin"));
    if (t.end > data_size)
      fail(str_cat(at, "data_offsets [", t.begin, ", ", t.end, "] run past the data section of ", data_size,
                   " bytes (truncated file?)"));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(esize), &bytes) || bytes != t.end - t.begin)
      fail(str_cat(at, "shape ", v["shape"].dump(), " of ", t.dtype, " needs ", numel, " x ", esize,
                   " bytes, data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const StTensor& a, const StTensor& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  uint64_t expect = 0;
  for (const StTensor& t : tensors_) {
    if (t.begin != expect)
      fail(str_cat("tensor '", t.name, "': data_offsets [", t.begin, ", ", t.end, "] ",
                   t.begin < expect ? "overlap the previous tensor" : "leave a gap after the previous tensor",
                   " (expected it to begin at ", expect, ")"));
    expect = t.end;
  }
  if (expect != data_size)
    fail(str_cat("the tensors cover ", expect, " bytes of data but the file holds ", data_size,
                 " after the header (trailing bytes)"));
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const StTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const StTensor& SafetensorsFile::at(const std::string& name) const {
  const StTensor* t = find(name);
  if (!t) fail(str_cat("no tensor named '", name, "'"));
  return *t;
}

void SafetensorsFile::read_f32(const StTensor& t, int64_t begin, int64_t end, float* out) const {
  if (begin < 0 || begin > end || end > t.numel)
    fail(str_cat("tensor '", t.name, "': elements [", begin, ", ", end, ") out of range of ", t.numel));
  const unsigned char* p = data(t);
  const int64_t n = end - begin;
  if (t.dtype == "F32") {
    std::memcpy(out, p + begin * 4, static_cast<size_t>(n) * 4);
  } else if (t.dtype == "BF16") {
    for (int64_t i = 0; i < n; ++i) {
      bf16 b;
      std::memcpy(&b.bits, p + (begin + i) * 2, 2);
      out[i] = static_cast<float>(b);
    }
  } else if (t.dtype == "F16") {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + (begin + i) * 2, 2);
      out[i] = half_to_float(h);
    }
  } else if (t.dtype == "F64") {
    for (int64_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, p + (begin + i) * 8, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    fail(str_cat("tensor '", t.name, "': dtype ", t.dtype, " is not a floating-point type this reader converts"));
  }
}

void SafetensorsWriter::add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                            Producer write) {
  const size_t esize = safetensors_dtype_size(dtype);
  ENSURE(esize > 0, "safetensors: unknown dtype ", dtype, " for ", name);
  ENSURE(name != "__metadata__", "safetensors: a tensor cannot be named __metadata__");
  for (const Entry& e : entries_) ENSURE(e.name != name, "safetensors: tensor ", name, " added twice");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    ENSURE(d >= 0, "safetensors: negative size in the shape of ", name);
    numel *= static_cast<uint64_t>(d);
  }
  Entry e{name, dtype, std::move(shape), numel * esize, std::move(write)};
  data_bytes_ += e.bytes;
  entries_.push_back(std::move(e));
}

FileDigest SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t off = 0;
  for (const Entry& e : entries_) {
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes}}};
    off += e.bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  OutFile f(path);
  f.write(&n, 8);
  f.write(header.data(), header.size());
  for (const Entry& e : entries_) {
    const uint64_t before = f.written();
    e.write(f);
    ENSURE(f.written() - before == e.bytes, "safetensors: ", path, ": tensor ", e.name, " wrote ",
           f.written() - before, " bytes, expected ", e.bytes);
  }
  return f.sync_and_close();
}

void encode_f32(const float* src, int64_t n, const std::string& dtype, std::vector<unsigned char>* out) {
  const size_t at = out->size();
  if (dtype == "F32") {
    out->resize(at + static_cast<size_t>(n) * 4);
    std::memcpy(out->data() + at, src, static_cast<size_t>(n) * 4);
  } else if (dtype == "BF16") {
    out->resize(at + static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const bf16 b(src[i]);
      std::memcpy(out->data() + at + static_cast<size_t>(i) * 2, &b.bits, 2);
    }
  } else {
    RAISE("encode_f32: unsupported dtype ", dtype, " (F32 or BF16)");
  }
}

}  // namespace engine::checkpoint
