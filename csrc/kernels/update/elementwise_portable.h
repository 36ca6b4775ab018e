// The portable variants of the element-wise steps of the fused UPDATE kernels (internal to
// csrc/kernels/update/): OpenMP simd loops, full-width and branch-free (the gates are random, a
// branch per unit mispredicts). Used where AVX-512 is not available; elementwise.h picks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dropout_hash.h"
#include "gate_bits.h"
#include "tiling.h"

namespace distmb {
namespace update_detail {

// o[0 .. jv) = v[0 .. jv) (a full-width vector store when jv == NR).
template <int NR>
inline void store_cols(const float* v, int jv, float* o) {
  if (jv == NR) {
#pragma omp simd
    for (int j = 0; j < NR; ++j) o[j] = v[j];
  } else {
    std::memcpy(o, v, sizeof(float) * jv);
  }
}

// apply_gate_word, portable: the missing lanes of a short word read as 0.
inline void apply_gate_word_portable(uint32_t word, const float* src, int valid, float scale,
                                     float* d) {
  float tail[kUnpack] = {};
  if (valid < kUnpack) {
    std::copy(src, src + valid, tail);
    src = tail;
  }
#pragma omp simd
  for (int j = 0; j < kUnpack; ++j) {
    const float scaled = src[j] * scale;
    d[j] = ((word >> j) & 1u) ? scaled : 0.0f;
  }
}

// The forward epilogue of one row of a register tile, portable (sage_epilogue_row_avx512's
// twin): bias, addend, ReLU and dropout per unit, then the packed gate bits of the row's
// columns (j0 + j -> bit j % 8 of byte (j0 + j) / 8).
template <int NR, bool kRelu, bool kDrop>
inline void sage_epilogue_row_portable(const float (&accr)[NR], int64_t row, int jv, int64_t j0,
                                       int64_t k, const float* bias_p, const float* addend,
                                       uint64_t row_key, uint64_t threshold, float scale,
                                       float* out, uint8_t* gate_bits) {
  const int64_t kb = bytes_per_row(k);
  float v[NR];
#pragma omp simd
  for (int j = 0; j < NR; ++j) v[j] = accr[j] + bias_p[j0 + j];
  if (addend != nullptr) {
    const float* ad = addend + row * k + j0;
#pragma omp simd
    for (int j = 0; j < jv; ++j) v[j] += ad[j];
  }
  float* o = out + row * k + j0;
  if (!kRelu) {
    store_cols<NR>(v, jv, o);
    return;
  }
  alignas(64) uint8_t gate[NR];
  if (kDrop) {
    const uint32_t threshold32 = static_cast<uint32_t>(threshold);  // < 2^32 with kDrop
    alignas(64) uint32_t u[NR];
    dropout_uniforms(row_key, j0, u);
#pragma omp simd
    for (int j = 0; j < NR; ++j) gate[j] = (v[j] > 0.0f) & (u[j] < threshold32);
  } else {
#pragma omp simd
    for (int j = 0; j < NR; ++j) gate[j] = v[j] > 0.0f;
  }
  // Full-width, branch-free (the gates are random): a select per unit, then the store.
#pragma omp simd
  for (int j = 0; j < NR; ++j) {
    gate[j] &= static_cast<uint8_t>(j < jv);
    const float scaled = v[j] * scale;
    v[j] = gate[j] ? scaled : 0.0f;
  }
  store_cols<NR>(v, jv, o);
  if (gate_bits != nullptr) {
    const int nbytes =
        static_cast<int>(std::min<int64_t>(NR / kBitsPerByte, kb - j0 / kBitsPerByte));
    pack_gate_bits(gate, nbytes, gate_bits + row * kb + j0 / kBitsPerByte);
  }
}

// One full kNR-column tile of dropout_forward, portable (dropout_tile_avx512's twin).
inline void dropout_tile_portable(const uint32_t (&u)[kNR], bool keep_all, uint32_t threshold32,
                                  float scale, const float* x, float* o, uint8_t* bits) {
  alignas(64) uint8_t gate[kNR];
#pragma omp simd
  for (int j = 0; j < kNR; ++j) {
    gate[j] = keep_all | (u[j] < threshold32);
    o[j] = gate[j] ? x[j] * scale : 0.0f;
  }
  pack_gate_bits(gate, kNR / kBitsPerByte, bits);
}

}  // namespace update_detail
}  // namespace distmb
