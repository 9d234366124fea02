// Element types and devices. bf16 is stored as raw uint16 bits on the host (struct bf16) so
// host code can hold, convert and compare it without CUDA headers.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace engine {

enum class DType : uint8_t { F32, F64, BF16, I32, I64, U16, U8 };
enum class Device : uint8_t { CPU, CUDA };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::U16: return 2;
    case DType::U8: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U16: return "u16";
    case DType::U8: return "u8";
  }
  return "?";
}

inline bool is_float(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16; }
inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

// Host-side bfloat16: the upper 16 bits of an IEEE float, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
      bits = static_cast<uint16_t>((u >> 16) | 0x40);
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<bf16>() { return DType::BF16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }

}  // namespace engine
