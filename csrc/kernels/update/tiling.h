// The register-tiled micro-kernel of the fused UPDATE kernels (internal to csrc/kernels/update/):
// a kMR x NR tile of a product (NR = 32 or 16 floats) accumulated in registers over the whole
// inner dimension, then handed to an epilogue while it is still in registers. Portable C++
// (OpenMP simd): with -march=native the compiler emits AVX-512 FMAs where the CPU has them.
#pragma once

#include <algorithm>
#include <cstdint>

namespace distmb {
namespace update_detail {

constexpr int kMR = 8;              // rows of a register tile
constexpr int kNR = 32;             // columns of a full register tile (two 16-float vectors)
constexpr int kNRTail = 16;         // columns of the last tile when fewer than kNR remain
constexpr int64_t kPad = 16;        // column padding granularity of packed panels

static_assert(kPad % kMR == 0 && kNR % kPad == 0 && kNRTail == kPad,
              "padded widths must split into whole tiles");

inline int64_t pad_cols(int64_t k) { return (k + kPad - 1) / kPad * kPad; }

// Width of the column tile starting at j0 of a padded width: kNR, or kNRTail at the end.
inline int tile_width(int64_t j0, int64_t padded) {
  return padded - j0 >= kNR ? kNR : kNRTail;
}

// Column tiles of a padded width (kNR wide, the last one kNRTail when fewer remain).
inline int64_t num_tiles(int64_t padded) { return (padded + kNR - 1) / kNR; }

// One summand of a tile product: B(l, j) = b[l * ldb + j] and either A(r, l) =
// a[min(r, mr - 1) * ars + l * als] (rows past the valid mr repeat the last valid row; their
// results are discarded) or, with packed, A(r, l) = a[l * kMR + r] (A packed kMR rows at a time;
// one base pointer, so the kMR broadcasts need no extra registers).
struct Operand {
  const float* a;
  int64_t ars, als;
  const float* b;
  int64_t ldb;
  int64_t len;  // inner dimension L
  bool packed = false;
  const int64_t* rows = nullptr;  // unpacked only: A(r, l) = a[rows[min(r, mr - 1)] * ars + ...]
};

// acc[r][j] = sum over the operands of sum_{l < L} A(r, l) * B(l, j), r < kMR, j < NR; then
// epi(acc). The accumulators live in registers (kMR * NR / 16 vectors).
template <int NR, class Epilogue>
inline void micro_tile(int mr, const Operand* ops, int nops, Epilogue&& epi) {
  float acc[kMR][NR];
  for (int r = 0; r < kMR; ++r)
#pragma omp simd
    for (int j = 0; j < NR; ++j) acc[r][j] = 0.0f;
  for (int s = 0; s < nops; ++s) {
    const Operand& op = ops[s];
    if (op.packed) {
      const float* a = op.a;
      const float* b = op.b;
      for (int64_t l = 0; l < op.len; ++l, a += kMR, b += op.ldb)
        for (int r = 0; r < kMR; ++r) {
          const float av = a[r];
#pragma omp simd
          for (int j = 0; j < NR; ++j) acc[r][j] += av * b[j];
        }
      continue;
    }
    if (op.rows == nullptr && op.als == 1 && mr == kMR) {
      // Rows at a constant stride: two row pointers and three byte offsets (rows r and r + 4
      // at p + {0, 1, 2, 3} * stride) instead of kMR pointers, which do not all fit in the
      // general registers next to the loop's own.
      static_assert(kMR == 8, "the strided rows are addressed as two groups of four");
      const char* p0 = reinterpret_cast<const char*>(op.a);
      const int64_t s1 = op.ars * static_cast<int64_t>(sizeof(float)), s2 = 2 * s1, s3 = 3 * s1;
      const char* p4 = p0 + 4 * s1;
      const float* b = op.b;
      for (int64_t l = 0; l < op.len; ++l, p0 += sizeof(float), p4 += sizeof(float)) {
        const float av[kMR] = {
            *reinterpret_cast<const float*>(p0), *reinterpret_cast<const float*>(p0 + s1),
            *reinterpret_cast<const float*>(p0 + s2), *reinterpret_cast<const float*>(p0 + s3),
            *reinterpret_cast<const float*>(p4), *reinterpret_cast<const float*>(p4 + s1),
            *reinterpret_cast<const float*>(p4 + s2), *reinterpret_cast<const float*>(p4 + s3)};
        for (int r = 0; r < kMR; ++r) {
#pragma omp simd
          for (int j = 0; j < NR; ++j) acc[r][j] += av[r] * b[j];
        }
        b += op.ldb;
      }
      continue;
    }
    const float* arow[kMR];
    for (int r = 0; r < kMR; ++r) {
      const int64_t i = std::min(r, mr - 1);
      arow[r] = op.a + (op.rows != nullptr ? op.rows[i] : i) * op.ars;
    }
    for (int64_t l = 0; l < op.len; ++l) {
      const float* b = op.b + l * op.ldb;
      const int64_t al = l * op.als;
      for (int r = 0; r < kMR; ++r) {
        const float av = arow[r][al];
#pragma omp simd
        for (int j = 0; j < NR; ++j) acc[r][j] += av * b[j];
      }
    }
  }
  epi(acc);
}

}  // namespace update_detail
}  // namespace distmb
