// The counter-based dropout decisions of the fused UPDATE kernels (internal to
// csrc/kernels/update/): a unit is kept where 32 bits of a hash of (seed, row, column) are below
// a threshold, so the masks do not depend on the thread count or the tiling.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "rng.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the dropout hashes are split into 32-bit halves assuming little-endian"
#endif

namespace distmb {
namespace update_detail {

// Dropout decision of (row, col): the low or high 32 bits of mix64(row_key ^ (col / 2)) below
// threshold, row_key = hash_key(seed, row). Keep probability = threshold / 2^32.
inline uint64_t dropout_row_key(uint64_t seed, int64_t row) {
  return hash_key(seed, static_cast<uint64_t>(row));
}

inline bool dropout_keep(uint64_t row_key, int64_t col, uint64_t threshold) {
  const uint64_t h = mix64(row_key ^ static_cast<uint64_t>(col >> 1));
  const uint64_t u = (col & 1) ? (h >> 32) : (h & 0xFFFFFFFFull);
  return u < threshold;
}

// The dropout uniforms u[0 .. NR) of columns [j0, j0 + NR) of the row with key rk (j0 even):
// one 64-bit hash per column pair, whose low / high 32-bit halves (little-endian) are the
// even / odd column's, as in dropout_keep.
template <int NR>
inline void dropout_uniforms(uint64_t rk, int64_t j0, uint32_t (&u)[NR]) {
  const uint64_t pair0 = static_cast<uint64_t>(j0 >> 1);
  alignas(64) uint64_t hash[NR / 2];
#pragma omp simd
  for (int q = 0; q < NR / 2; ++q) hash[q] = mix64(rk ^ (pair0 + q));
  std::memcpy(u, hash, sizeof(u));
}

// 32-bit threshold of a keep probability in [0, 1].
inline uint64_t keep_threshold(double keep) {
  return static_cast<uint64_t>(std::llround(keep * 4294967296.0));
}

}  // namespace update_detail
}  // namespace distmb
