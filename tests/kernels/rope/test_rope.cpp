// GPU tests of cuda/rope against the f64 CPU reference (csrc/ref/rope.cpp): forward and backward
// in place on fresh random inputs, odd head counts and head dims, large positions (the angle
// reduction), heads past rotated_heads left bit for bit, forward then backward returning x.
// Tolerances: bf16 within twice the error of rounding the exact result to bf16, plus 1e-4 (the
// reference runs on the same bf16-rounded input; the kernel rotates in f32 and rounds once);
// f32 within 1e-5 (angles in double in both, cos and sin to double accuracy, the rotation f32
// in the kernel). Each scaling kind (none, linear, llama3, yarn with its output scale) runs.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/rope.h"
#include "tests/common/gpu_testing.h"

using namespace engine;
using namespace engine::testing;

namespace {

constexpr double kF32Tol = 1e-5;

using K = RopeScalingKind;

ops::RopeParams plain(double theta) { return ops::RopeParams{.theta = theta}; }
// The scaled kinds (ops/rope_params.h) at small pretraining contexts, so that their ramps fall
// inside the head dims.
const ops::RopeParams kLinear{.theta = 10000, .kind = K::Linear, .factor = 4};
const ops::RopeParams kLlama3{.theta = 500000, .kind = K::Llama3, .factor = 8, .low_freq_factor = 1,
                              .high_freq_factor = 4, .original_max_position_embeddings = 64};
const ops::RopeParams kYarn{.theta = 10000, .kind = K::Yarn, .factor = 4, .original_max_position_embeddings = 64,
                            .attention_factor = 1.1386294361119891};
const ops::RopeParams kYarnUntruncated{.theta = 1000000, .kind = K::Yarn, .factor = 16,
                                       .original_max_position_embeddings = 512, .beta_fast = 16,
                                       .beta_slow = 2, .truncate = false, .attention_factor = 1.3};

struct RopeCase {
  int64_t t, heads, d;
  int rotated;
  ops::RopeParams rope;
  int64_t max_pos;
  int64_t offset;  // 1: x starts one element past a 16-byte boundary (scalar kernel)
  std::string name() const {
    static const char* kinds[] = {"", " linear", " llama3", " yarn"};
    return "T" + std::to_string(t) + " NH" + std::to_string(heads) + " D" + std::to_string(d) +
           " rot" + std::to_string(rotated) + " theta" +
           std::to_string(static_cast<int64_t>(rope.theta)) + kinds[static_cast<int>(rope.kind)] +
           " pos<" + std::to_string(max_pos) + (offset ? " misaligned" : "");
  }
};
const std::vector<RopeCase> kCases = {
    {1, 6, 10, 4, plain(10000), 7, 0},         {7, 6, 10, 6, plain(10000), 4096, 0},
    {1000, 12, 128, 8, plain(10000), 4096, 0}, {1000, 12, 128, 12, plain(500000), 131072, 0},
    {37, 3, 64, 0, plain(10000), 100, 0},      {5, 2, 2048, 1, plain(10000), 1000000, 0},
    {300, 5, 96, 3, plain(1000000), 32768, 0}, {17, 5, 64, 5, plain(10000), 4096, 1},
    {9, 7, 30, 5, plain(10000), 2048, 0},
    {40, 6, 64, 4, kLinear, 4096, 0},          {40, 6, 128, 6, kLlama3, 4096, 0},
    {40, 6, 128, 5, kYarn, 4096, 0},           {23, 5, 64, 5, kYarnUntruncated, 8192, 1},
    {11, 3, 30, 2, kLlama3, 1000, 0}};

// Elements of heads [rotated, NH) of `a` and `b` (same shape, dtype) are bitwise equal.
bool unrotated_equal(const Tensor& a, const Tensor& b, int rotated) {
  Owned ha = to_host(a, a.dtype), hb = to_host(b, b.dtype);
  const int64_t rows = a.size(0), heads = a.size(1), d = a.size(2), es = dtype_size(a.dtype);
  const char *pa = static_cast<const char*>(ha.t.data), *pb = static_cast<const char*>(hb.t.data);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t off = (t * heads + rotated) * d * es, len = (heads - rotated) * d * es;
    if (std::memcmp(pa + off, pb + off, static_cast<size_t>(len)) != 0) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("cuda rope forward and backward match the f64 reference (bf16 and f32)" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const RopeCase& k : kCases) {
    SUBCASE(k.name().c_str()) {
      for (DType dt : {DType::BF16, DType::F32}) {
        INFO(dtype_name(dt));
        Owned x = randn({k.t, k.heads, k.d}, DType::F32, "rope.x");
        Owned pos = randint({k.t}, 0, k.max_pos, "rope.pos");
        DeviceTensor gpos = to_gpu(pos, DType::I32);
        for (bool forward : {true, false}) {
          INFO((forward ? "forward" : "backward"));
          auto [gx, ref] = device_input(x, dt, k.offset);
          DeviceTensor orig = to_gpu(x, dt, k.offset);
          if (forward) {
            ops::rope_forward(ref, pos, k.rotated, k.rope);
            ops::rope_forward(gx.t, gpos.t, k.rotated, k.rope);
          } else {
            ops::rope_backward(ref, pos, k.rotated, k.rope);
            ops::rope_backward(gx.t, gpos.t, k.rotated, k.rope);
          }
          CHECK_CLOSE(gx.t, ref.t, output_tol(dt, ref, kF32Tol));
          CHECK(unrotated_equal(gx.t, orig.t, k.rotated));
        }
      }
    }
  }
}

TEST_CASE("cuda rope backward undoes forward (times m^2) and is bitwise reproducible" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  for (const RopeCase& k : kCases) {
    SUBCASE(k.name().c_str()) {
      Owned x = randn({k.t, k.heads, k.d}, DType::F32, "rope.x");
      Owned pos = randint({k.t}, 0, k.max_pos, "rope.pos");
      DeviceTensor gpos = to_gpu(pos, DType::I32);
      DeviceTensor a = to_gpu(x, DType::F32, k.offset), b = to_gpu(x, DType::F32, k.offset);
      ops::rope_forward(a.t, gpos.t, k.rotated, k.rope);
      ops::rope_forward(b.t, gpos.t, k.rotated, k.rope);
      CHECK(bitwise_equal(a.t, b.t));
      ops::rope_backward(a.t, gpos.t, k.rotated, k.rope);
      // The transposed map of m R is m R^T: backward after forward scales rotated heads by m^2.
      const double m = ops::rope_output_scale(k.rope);
      Owned want = to_host(x.t, DType::F32);
      for (int64_t t = 0; t < k.t; ++t)
        for (int64_t j = 0; j < k.rotated * k.d; ++j) {
          const int64_t at = t * k.heads * k.d + j;
          set(want, at, m * m * get(want, at));
        }
      CHECK_CLOSE(a.t, want.t, 1e-6);
      DeviceTensor c = to_gpu(x, DType::BF16, k.offset), e = to_gpu(x, DType::BF16, k.offset);
      ops::rope_forward(c.t, gpos.t, k.rotated, k.rope);
      ops::rope_forward(e.t, gpos.t, k.rotated, k.rope);
      CHECK(bitwise_equal(c.t, e.t));
    }
  }
}

TEST_CASE("cuda rope launchers reject bad arguments" * doctest::test_suite("gpu")) {
  if (!gpu_available_or_skip()) return;
  Owned x = randn({3, 4, 8}, DType::F32, "rope.x");
  Owned pos = randint({3}, 0, 10, "rope.pos"), pos2 = randint({2}, 0, 10, "rope.pos2");
  DeviceTensor gx = to_gpu(x, DType::BF16), gpos = to_gpu(pos, DType::I32),
      gpos2 = to_gpu(pos2, DType::I32);
  DeviceTensor odd = to_gpu(randn({3, 4, 7}, DType::F32, "rope.odd"), DType::BF16);
  CHECK_THROWS_AS(ops::rope_forward(gx.t, gpos.t, 5, plain(10000)), Error);   // rotated > NH
  CHECK_THROWS_AS(ops::rope_forward(gx.t, gpos2.t, 4, plain(10000)), Error);  // positions (2)
  CHECK_THROWS_AS(ops::rope_forward(odd.t, gpos.t, 4, plain(10000)), Error);  // odd D
  CHECK_THROWS_AS(ops::rope_backward(gx.t, gpos.t, 4, plain(0)), Error);      // theta 0
  CHECK_THROWS_AS(ops::rope_forward(gx.t, pos, 4, plain(10000)), Error);      // positions on cpu
  ops::RopeParams no_context = kYarn;
  no_context.original_max_position_embeddings = 0;
  CHECK_THROWS_AS(ops::rope_forward(gx.t, gpos.t, 4, no_context), Error);     // yarn without L
}
