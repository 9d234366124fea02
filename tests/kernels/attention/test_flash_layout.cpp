// CPU check of the flash-attention index math (cuda/attention/flash_layout.h), which the GPU
// kernels use for every shared-memory access: ldmatrix.x4 (plain and .trans) and
// mma.sync.m16n8k16 are emulated per lane from their PTX definitions, the warp GEMM loop of
// flash_common.cuh is replayed on swizzled tiles for each warp layout the kernels use, and the
// result must equal the plain matrix product. Also checks that every ldmatrix phase is free of
// bank conflicts and that P in the S accumulators forms the A fragments of O += P V; and the
// backward's dQ accumulator layout (a permutation of each row; its staging stores free of bank
// conflicts) and launch order (a bijection, key tiles in order inside a section).
// Runs without a GPU (CI), unlike the kernel tests in test_flash.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <vector>

#include "cuda/attention/flash_layout.h"

using namespace engine::cuda::flash;

namespace {

using Regs = std::array<std::array<float, 2>, 4>;  // 4 registers of 2 halves, one lane
using Warp = std::array<Regs, 32>;

// A shared tile of rows x kCols values, stored swizzled (element index = byte offset / 2).
template <int kCols>
struct Tile {
  int rows;
  std::vector<float> mem;
  explicit Tile(int r) : rows(r), mem(static_cast<size_t>(r) * kCols, 0.f) {}
  float& at(int r, int c) { return mem[swizzle_elem<kCols>(r, c) / 2]; }
  void fill(int seed) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < kCols; ++c) at(r, c) = static_cast<float>((r * 7 + c * 3 + seed) % 11 - 5);
  }
};

// ldmatrix.x4 from per-lane byte addresses: lanes 8q .. 8q+7 address the rows of matrix q.
Warp ldmatrix(const std::vector<float>& mem, const std::array<uint32_t, 32>& addr, bool trans) {
  Warp out{};
  for (int q = 0; q < 4; ++q) {
    // Bank groups of the 8 row addresses of one matrix must differ (one conflict-free phase).
    std::set<uint32_t> banks;
    for (int r = 0; r < 8; ++r) banks.insert((addr[8 * q + r] / 16) % 8);
    CHECK(banks.size() == 8);
    auto m = [&](int r, int c) { return mem.at(addr[8 * q + r] / 2 + c); };
    for (int l = 0; l < 32; ++l)
      for (int x = 0; x < 2; ++x)
        out[l][q][x] = trans ? m(2 * (l % 4) + x, l / 4) : m(l / 4, 2 * (l % 4) + x);
  }
  return out;
}

// d[lane][e] += A (16 x 16, fragments a) * B (16 x 8, fragments b0, b1), per the PTX layouts.
void mma(std::array<std::array<float, 4>, 32>& d, const Warp& a, const Warp& b, int b_reg0) {
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int x = 0; x < 2; ++x) {
      A[g][2 * t + x] = a[l][0][x];
      A[g + 8][2 * t + x] = a[l][1][x];
      A[g][2 * t + 8 + x] = a[l][2][x];
      A[g + 8][2 * t + 8 + x] = a[l][3][x];
      B[2 * t + x][g] = b[l][b_reg0][x];
      B[2 * t + 8 + x][g] = b[l][b_reg0 + 1][x];
    }
  }
  for (int l = 0; l < 32; ++l)
    for (int e = 0; e < 4; ++e) {
      const int r = frag_row(l, e), c = frag_col(l, e);
      for (int k = 0; k < 16; ++k) d[l][e] += A[r][k] * B[k][c];
    }
}

// Replays warp_gemm (flash_common.cuh) and compares with the product of the operands as
// flash_layout.h defines them.
template <int MI, int NI, int K, Operand kAOp, int kACols, Operand kBOp, int kBCols>
void check_warp_gemm(int a_rows, int m0, int b_rows, int n0) {
  Tile<kACols> ta(a_rows);
  Tile<kBCols> tb(b_rows);
  ta.fill(1);
  tb.fill(4);
  auto A = [&](int m, int k) {
    return kAOp == Operand::kA ? ta.at(m0 + m, k) : ta.at(k, m0 + m);
  };
  auto B = [&](int k, int n) {
    return kBOp == Operand::kB ? tb.at(n0 + n, k) : tb.at(k, n0 + n);
  };
  std::vector<std::array<std::array<float, 4>, 32>> acc(MI * NI);
  for (auto& a : acc)
    for (auto& l : a) l.fill(0.f);
  for (int kk = 0; kk < K / 16; ++kk) {
    std::vector<Warp> a(MI);
    for (int mi = 0; mi < MI; ++mi) {
      std::array<uint32_t, 32> addr;
      for (int l = 0; l < 32; ++l)
        addr[l] = operand_offset<kAOp, kACols>(lane_offset<kAOp, kACols>(m0, l), mi, kk);
      a[mi] = ldmatrix(ta.mem, addr, kAOp == Operand::kATrans);
    }
    for (int nj = 0; nj < NI / 2; ++nj) {
      std::array<uint32_t, 32> addr;
      for (int l = 0; l < 32; ++l)
        addr[l] = operand_offset<kBOp, kBCols>(lane_offset<kBOp, kBCols>(n0, l), nj, kk);
      const Warp b = ldmatrix(tb.mem, addr, kBOp == Operand::kBTrans);
      for (int mi = 0; mi < MI; ++mi) {
        mma(acc[mi * NI + 2 * nj], a[mi], b, 0);
        mma(acc[mi * NI + 2 * nj + 1], a[mi], b, 2);
      }
    }
  }
  int bad = 0;
  for (int mi = 0; mi < MI; ++mi)
    for (int ni = 0; ni < NI; ++ni)
      for (int l = 0; l < 32; ++l)
        for (int e = 0; e < 4; ++e) {
          const int m = mi * 16 + frag_row(l, e), n = ni * 8 + frag_col(l, e);
          float want = 0.f;
          for (int k = 0; k < K; ++k) want += A(m, k) * B(k, n);
          bad += acc[mi * NI + ni][l][e] != want;
        }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("flash layout: swizzled tiles hold every element once") {
  for (int row = 0; row < 16; ++row) {
    std::set<uint32_t> seen;
    for (int col = 0; col < 128; ++col) seen.insert(swizzle_elem<128>(row, col));
    CHECK(seen.size() == 128);
    CHECK(*seen.begin() == static_cast<uint32_t>(row * 256));
    CHECK(*seen.rbegin() == static_cast<uint32_t>(row * 256 + 254));
  }
}

TEST_CASE("flash layout: warp GEMMs of the kernels equal the plain product (emulated mma)") {
  // Forward (D = 128 and 64): S = Q K^T, warps at rows 0 and 96 of a 128-row Q tile.
  for (int m0 : {0, 96}) {
    INFO("forward S, m0 = " << m0);
    check_warp_gemm<2, 8, 128, Operand::kA, 128, Operand::kB, 128>(128, m0, 64, 0);
    check_warp_gemm<2, 16, 64, Operand::kA, 64, Operand::kB, 64>(128, m0, 128, 0);
  }
  // Forward P V's B operand (V, transposed), D = 128 and 64: checked with an A from smem.
  check_warp_gemm<2, 16, 64, Operand::kA, 64, Operand::kBTrans, 128>(128, 32, 64, 0);
  check_warp_gemm<2, 8, 128, Operand::kA, 128, Operand::kBTrans, 64>(128, 64, 128, 0);
  // Backward: S, dP (2 x 4 warps of 32 x 32), dQ = dS K (2 x 4 warps of 32 x D/4),
  // dV = P^T dO and dK = dS^T Q (4 x 2 warps of 32 x D/2).
  for (int w = 0; w < 8; ++w) {
    const int wm = w >> 2, wn = w & 3, wk = w >> 1, wd = w & 1;
    INFO("backward warp " << w);
    check_warp_gemm<2, 4, 128, Operand::kA, 128, Operand::kB, 128>(64, wm * 32, 128, wn * 32);
    check_warp_gemm<2, 4, 64, Operand::kA, 64, Operand::kB, 64>(64, wm * 32, 128, wn * 32);
    check_warp_gemm<2, 4, 128, Operand::kA, 128, Operand::kBTrans, 128>(64, wm * 32, 128, wn * 32);
    check_warp_gemm<2, 2, 128, Operand::kA, 128, Operand::kBTrans, 64>(64, wm * 32, 128, wn * 16);
    check_warp_gemm<2, 8, 64, Operand::kATrans, 128, Operand::kBTrans, 128>(64, wk * 32, 64,
                                                                            wd * 64);
    check_warp_gemm<2, 4, 64, Operand::kATrans, 128, Operand::kBTrans, 64>(64, wk * 32, 64,
                                                                           wd * 32);
  }
}

TEST_CASE("flash layout: S accumulators of two n8 tiles form the A fragment of P V") {
  // flash_fwd.cuh packs a = {s[2kk][0..1], s[2kk][2..3], s[2kk+1][0..1], s[2kk+1][2..3]}.
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int x = 0; x < 2; ++x) {
      // (row, key) of the accumulators packed into a0..a3, half x; keys relative to 16 kk.
      const int rows[4] = {frag_row(l, x), frag_row(l, 2 + x), frag_row(l, x), frag_row(l, 2 + x)};
      const int keys[4] = {frag_col(l, x), frag_col(l, 2 + x), 8 + frag_col(l, x),
                           8 + frag_col(l, 2 + x)};
      // The A layout wants (g, 2t + x), (g + 8, 2t + x), (g, 2t + 8 + x), (g + 8, 2t + 8 + x).
      CHECK(rows[0] == g);
      CHECK(keys[0] == 2 * t + x);
      CHECK(rows[1] == g + 8);
      CHECK(keys[1] == 2 * t + x);
      CHECK(rows[2] == g);
      CHECK(keys[2] == 2 * t + 8 + x);
      CHECK(rows[3] == g + 8);
      CHECK(keys[3] == 2 * t + 8 + x);
    }
  }
}

TEST_CASE("flash layout: the dQ accumulator layout and its staging stores") {
  for (int D : {64, 128}) {
    // A permutation of each row, for every token phase; rows of one head contiguous.
    for (int64_t t = 0; t < 16; ++t) {
      std::set<int> seen;
      for (int d = 0; d < D; ++d) seen.insert(dq_row_offset(t, d));
      CHECK(seen.size() == static_cast<size_t>(D));
      CHECK(*seen.begin() == 0);
      CHECK(*seen.rbegin() == D - 1);
      CHECK(dq_accum_index(3, t, 5, 100, D) == (3 * 100 + t) * D + dq_row_offset(t, 5));
    }
    // The backward's fragment stores (st.shared.v2.f32 of c0, c1 or c2, c3 of a 16 x 8 tile)
    // into the staging tile (row r of the tile = token tok0 + r, any tok0): for every warp
    // (2 x 4 warps of 32 rows x D / 4), m16 tile, half and n8 tile, the 8-byte stores of each
    // half-warp use every bank once (two conflict-free wavefronts for the warp).
    int bad = 0;
    for (int tok0 = 0; tok0 < 8; ++tok0)
      for (int w = 0; w < 8; ++w)
        for (int mi = 0; mi < 2; ++mi)
          for (int hf = 0; hf < 2; ++hf)
            for (int ni = 0; ni < D / 32; ++ni)
              for (int half = 0; half < 2; ++half) {
                int per_bank[32] = {};
                for (int l = 16 * half; l < 16 * half + 16; ++l) {
                  const int r = (w >> 2) * 32 + mi * 16 + frag_row(l, 2 * hf);
                  const int col = (w & 3) * (D / 4) + ni * 8 + frag_col(l, 0);
                  const int byte = 4 * (r * D + dq_row_offset(tok0 + r, col));
                  bad += byte % 8 != 0;
                  ++per_bank[(byte / 4) % 32];
                  ++per_bank[(byte / 4 + 1) % 32];
                }
                for (int b = 0; b < 32; ++b) bad += per_bank[b] != 1;
              }
    CHECK(bad == 0);
  }
}

TEST_CASE("flash layout: the backward's launch order covers every block once, long tiles first") {
  for (int n_tiles : {1, 3, 64})
    for (int pairs : {1, 5, 64})
      for (int section : {1, 2, 4, 8, 128})
        for (int tail : {1, 2, 4}) {
          INFO("n_tiles " << n_tiles << " pairs " << pairs << " section " << section << " tail " << tail);
          // Sections of `section` pairs, the last `tail` of them (the short one included) merged.
          const int sections = (pairs + section - 1) / section;
          const int regular = sections > tail ? sections - tail : 0;
          std::set<std::pair<int, int64_t>> seen;
          int last_section = 0, last_n = 0;
          bool ordered = true, sections_in_order = true;
          int outside = 0;
          for (int64_t lin = 0; lin < int64_t{n_tiles} * pairs; ++lin) {
            const BwdBlock b = bwd_block(lin, n_tiles, pairs, section, tail);
            outside += b.n_block < 0 || b.n_block >= n_tiles || b.pair < 0 || b.pair >= pairs;
            seen.insert({b.n_block, b.pair});
            // Inside a section key tiles never go back; sections come one after another.
            const int sec = std::min(static_cast<int>(b.pair / section), regular);
            if (sec == last_section && b.n_block < last_n) ordered = false;
            if (sec < last_section) sections_in_order = false;
            last_section = sec, last_n = b.n_block;
          }
          CHECK(outside == 0);
          CHECK(seen.size() == static_cast<size_t>(n_tiles) * pairs);
          CHECK(ordered);
          CHECK(sections_in_order);
        }
}
