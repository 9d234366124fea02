// XXH64 (Yann Collet's xxHash, 64-bit variant), streaming: the checksum of every checkpoint file.
// Chosen over CRC32 because it runs at memory speed (~10 GB/s on one core) and 64 bits make an
// accidental match of a corrupted file negligible. Output equals the reference implementation
// (xxhsum -H64) for the same seed; tests/checkpoint checks published test vectors.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace engine::checkpoint {

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;  // of everything so far; update() may continue afterwards

 private:
  uint64_t v_[4];
  uint64_t seed_;
  uint64_t total_ = 0;
  unsigned char buf_[32];
  size_t buffered_ = 0;
};

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed = 0);
// 16 lowercase hex digits, and back (false on anything else).
std::string hex64(uint64_t v);
bool parse_hex64(const std::string& s, uint64_t* out);

}  // namespace engine::checkpoint
