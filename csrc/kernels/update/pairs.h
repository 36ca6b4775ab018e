// bfloat16 products of the fused UPDATE kernels (internal to csrc/kernels/update/), for
// --precision bf16 on the CPU: both operands of a product are rounded to bfloat16 (round to
// nearest even; float32 denormals read as signed zeros, as AVX512-BF16 reads them), and the
// products are summed in float32. Bias, ReLU, dropout, the gradients' reductions and every
// stored value stay float32.
//
// Operands are packed as pairs: one 32-bit word holds the bfloat16 values of inner indices
// 2 l2 (low half) and 2 l2 + 1 (high half; zero past an odd length), the layout AVX512-BF16's
// VDPBF16PS multiplies and sums two at a time. micro_tile_pairs is micro_tile's twin over such
// words: VDPBF16PS where the compiler targets AVX512-BF16 (-march=native on Zen 4, Cooper
// Lake, Sapphire Rapids), else the same sums in portable C++ (no faster than float32 there:
// each word is unpacked to two floats).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "packing.h"
#include "prefetch.h"
#include "tiling.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace distmb {
namespace update_detail {

// A buffer of bfloat16 pairs that starts on a cache line.
using AlignedPairs = std::vector<uint32_t, CacheLineAllocator<uint32_t>>;

// Words of pairs along an inner dimension of len values.
inline int64_t pair_count(int64_t len) { return (len + 1) / 2; }

// Whether this build multiplies pairs with AVX512-BF16 instructions.
constexpr bool kNativePairs =
#if defined(__AVX512BF16__)
    true;
#else
    false;
#endif

// Set by tests (set_portable_pairs) to run the portable pairs code on a CPU with AVX512-BF16.
inline bool& portable_pairs_flag() {
  static bool flag = false;
  return flag;
}

inline bool native_pairs() { return kNativePairs && !portable_pairs_flag(); }

// The bfloat16 bits of f: round to nearest even; a denormal reads as a signed zero and a NaN
// stays a (quiet) NaN, as VCVTNE2PS2BF16 converts.
inline uint32_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7F800000u) == 0) return (u >> 16) & 0x8000u;  // zero or denormal
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x0040u;  // NaN
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

inline float bf16_float(uint32_t bits16) {
  const uint32_t u = bits16 << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t pair_word(float even, float odd) { return bf16_bits(even) | bf16_bits(odd) << 16; }

// d[0 .. pair_count(len)) = the pairs of x[0 .. len) (the high half of an odd length's last
// word zero).
inline void row_to_pairs(const float* x, int64_t len, uint32_t* d) {
  int64_t l = 0;
#if defined(__AVX512BF16__)
  if (native_pairs())
    for (; l + 32 <= len; l += 32)
      _mm512_storeu_si512(d + l / 2, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                                         _mm512_loadu_ps(x + l + 16), _mm512_loadu_ps(x + l))));
#endif
  for (; l + 1 < len; l += 2) d[l / 2] = pair_word(x[l], x[l + 1]);
  if (l < len) d[l / 2] = pair_word(x[l], 0.0f);
}

// d[0 .. count) = pairs of two rows, column by column: d[j] = pair_word(even[j], odd[j])
// (odd null: zeros).
inline void interleave_rows(const float* even, const float* odd, int64_t count, uint32_t* d) {
  int64_t j = 0;
#if defined(__AVX512BF16__)
  if (native_pairs() && odd != nullptr) {
    // cvtne2ps gives [even 0..15 | odd 0..15] as 32 bfloat16 values; the permutation puts
    // them in pairs.
    const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                           9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                           17, 1, 16, 0);
    for (; j + 16 <= count; j += 16) {
      const __m512i both = reinterpret_cast<__m512i>(
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(odd + j), _mm512_loadu_ps(even + j)));
      _mm512_storeu_si512(d + j, _mm512_permutexvar_epi16(order, both));
    }
  }
#endif
  for (; j < count; ++j) d[j] = pair_word(even[j], odd != nullptr ? odd[j] : 0.0f);
}

// Pack B(l, j) = src[l * sl + j * sj] (l < L, j < J) into pair panels for micro_tile_pairs: the
// panel of columns [j0, j0 + w) starts at dst + j0 * pair_count(L) and is laid out
// [pair_count(L)][w]; columns >= J are zero. dst holds pair_count(L) * pad_cols(J) words.
inline void pack_pair_panels(const float* src, int64_t sl, int64_t sj, int64_t L, int64_t J,
                             uint32_t* dst) {
  const int64_t jp = pad_cols(J), l2n = pair_count(L);
  for (int64_t j0 = 0; j0 < jp; j0 += tile_width(j0, jp)) {
    const int w = tile_width(j0, jp);
    uint32_t* panel = dst + j0 * l2n;
    for (int64_t l2 = 0; l2 < l2n; ++l2)
      for (int j = 0; j < w; ++j) {
        const int64_t col = j0 + j, l = 2 * l2;
        panel[l2 * w + j] =
            col < J ? pair_word(src[l * sl + col * sj], l + 1 < L ? src[(l + 1) * sl + col * sj]
                                                                  : 0.0f)
                    : 0u;
      }
  }
}

// Rows [i0, i0 + rows) of x[.][c] (row i at x + (ids ? ids[i] : i) * c) as the weight
// gradient's operand A in pairs: group g of kMR columns at dst + g * pair_count(rows) * kMR,
// laid out [pair_count(rows)][kMR]: word (l2, q) pairs rows i0 + 2 l2 and i0 + 2 l2 + 1 of
// column g * kMR + q (zero past c or past the rows).
inline void pack_column_group_pairs(const float* x, const int64_t* ids, int64_t i0, int64_t rows,
                                    int64_t c, uint32_t* dst) {
  const auto row = [&](int64_t r) { return x + (ids != nullptr ? ids[i0 + r] : i0 + r) * c; };
  const int64_t r2n = pair_count(rows), groups = (c + kMR - 1) / kMR;
  const int64_t group_words = r2n * kMR;
  const int64_t full = c / kMR * kMR;
  if (ids != nullptr)
    prefetch_indexed_rows(x, ids, c, i0, i0 + std::min(rows, kPackPrefetchRows));
  uint32_t line[2 * kMR];
  for (int64_t l2 = 0; l2 < r2n; ++l2) {
    if (ids != nullptr) {
      const int64_t ahead = 2 * l2 + kPackPrefetchRows;
      if (ahead < rows)
        prefetch_indexed_rows(x, ids, c, i0 + ahead, i0 + std::min(ahead + 2, rows));
    }
    const float* even = row(2 * l2);
    const float* odd = 2 * l2 + 1 < rows ? row(2 * l2 + 1) : nullptr;
    int64_t c0 = 0;
    for (; c0 + 2 * kMR <= full; c0 += 2 * kMR) {  // two groups per interleave
      interleave_rows(even + c0, odd == nullptr ? nullptr : odd + c0, 2 * kMR, line);
      std::memcpy(dst + (c0 / kMR) * group_words + l2 * kMR, line, kMR * sizeof(uint32_t));
      std::memcpy(dst + (c0 / kMR + 1) * group_words + l2 * kMR, line + kMR,
                  kMR * sizeof(uint32_t));
    }
    for (; c0 < groups * kMR; c0 += kMR)
      for (int q = 0; q < kMR; ++q) {
        const int64_t col = c0 + q;
        dst[(c0 / kMR) * group_words + l2 * kMR + q] =
            col < c ? pair_word(even[col], odd != nullptr ? odd[col] : 0.0f) : 0u;
      }
  }
}

// One summand of a tile product over pairs: B pair (l2, j) = b[l2 * ldb + j] and A pair
// (r, l2) = a[r * ars + l2] (kMR rows present, rows past the valid ones zero or repeated) or,
// with packed, a[l2 * kMR + r].
struct PairOperand {
  const uint32_t* a;
  int64_t ars;
  const uint32_t* b;
  int64_t ldb;
  int64_t len2;  // pairs along the inner dimension
  bool packed = false;
};

// The portable sums of micro_tile_pairs: acc[r][j] += A(r, 2 l2 + 1) * B(2 l2 + 1, j), then
// += A(r, 2 l2) * B(2 l2, j), in the order of VDPBF16PS.
template <int NR>
inline void pair_sums_portable(const PairOperand& op, float (&acc)[kMR][NR]) {
  for (int64_t l2 = 0; l2 < op.len2; ++l2) {
    const uint32_t* b = op.b + l2 * op.ldb;
    float blo[NR], bhi[NR];
    for (int j = 0; j < NR; ++j) {
      blo[j] = bf16_float(b[j] & 0xFFFFu);
      bhi[j] = bf16_float(b[j] >> 16);
    }
    for (int r = 0; r < kMR; ++r) {
      const uint32_t a = op.packed ? op.a[l2 * kMR + r] : op.a[r * op.ars + l2];
      const float alo = bf16_float(a & 0xFFFFu), ahi = bf16_float(a >> 16);
#pragma omp simd
      for (int j = 0; j < NR; ++j) {
        acc[r][j] += ahi * bhi[j];
        acc[r][j] += alo * blo[j];
      }
    }
  }
}

// acc[r][j] = sum over the operands of sum_{l} A(r, l) * B(l, j) over bfloat16 pairs, r < kMR,
// j < NR; then epi(acc) with acc float[kMR][NR].
template <int NR, class Epilogue>
inline void micro_tile_pairs(const PairOperand* ops, int nops, Epilogue&& epi) {
  alignas(kCacheLineBytes) float acc[kMR][NR];
#if defined(__AVX512BF16__)
  if (native_pairs()) {
    constexpr int NV = NR / 16;
    __m512 vacc[kMR][NV];
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < NV; ++v) vacc[r][v] = _mm512_setzero_ps();
    for (int s = 0; s < nops; ++s) {
      const PairOperand& op = ops[s];
      const uint32_t* b = op.b;
      if (op.packed) {
        const uint32_t* a = op.a;
        for (int64_t l2 = 0; l2 < op.len2; ++l2, a += kMR, b += op.ldb) {
          __m512bh bv[NV];
          for (int v = 0; v < NV; ++v)
            bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 16 * v));
          for (int r = 0; r < kMR; ++r) {
            const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(a[r]));
            for (int v = 0; v < NV; ++v) vacc[r][v] = _mm512_dpbf16_ps(vacc[r][v], av, bv[v]);
          }
        }
        continue;
      }
      const uint32_t* a = op.a;
      const int64_t ars = op.ars;
      for (int64_t l2 = 0; l2 < op.len2; ++l2, ++a, b += op.ldb) {
        __m512bh bv[NV];
        for (int v = 0; v < NV; ++v)
          bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + 16 * v));
        for (int r = 0; r < kMR; ++r) {
          const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(a[r * ars]));
          for (int v = 0; v < NV; ++v) vacc[r][v] = _mm512_dpbf16_ps(vacc[r][v], av, bv[v]);
        }
      }
    }
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < NV; ++v) _mm512_store_ps(&acc[r][16 * v], vacc[r][v]);
    epi(acc);
    return;
  }
#endif
  for (int r = 0; r < kMR; ++r)
#pragma omp simd
    for (int j = 0; j < NR; ++j) acc[r][j] = 0.0f;
  for (int s = 0; s < nops; ++s) pair_sums_portable<NR>(ops[s], acc);
  epi(acc);
}

}  // namespace update_detail
}  // namespace distmb
