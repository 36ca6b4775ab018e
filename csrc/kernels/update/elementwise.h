// The element-wise steps of the fused UPDATE kernels around their products (internal to
// csrc/kernels/update/): the forward epilogue of a register tile, the gate bits applied to a
// gradient, a dropout tile. Each takes its AVX-512 variant (elementwise_avx512.h) where the
// compiler targets AVX-512, else its portable one (elementwise_portable.h); both give the same
// values and bits.
#pragma once

#include <algorithm>
#include <cstdint>

#include "elementwise_avx512.h"
#include "elementwise_portable.h"
#include "gate_bits.h"
#include "tiling.h"

namespace distmb {
namespace update_detail {

// d[0 .. kUnpack) = bit j of word ? src[j] * scale : 0, reading only src[0 .. valid) (the
// other lanes are 0): kUnpack gate bits applied at once, full-width and branch-free (a
// branch per random bit mispredicts). Used by update_backward's prologue and
// dropout_backward.
inline void apply_gate_word(uint32_t word, const float* src, int valid, float scale,
                            float* d) {
  static_assert(kUnpack == 16, "one 16-bit gate word per step");
#if defined(__AVX512F__)
  apply_gate_word_avx512(word, src, valid, scale, d);
#else
  apply_gate_word_portable(word, src, valid, scale, d);
#endif
}

// The forward epilogue of update_forward for one register tile (template flags select the
// variant at compile time so that the tile loop carries no branches). row_keys[r]: the
// dropout_row_key of row row0 + r (read only with kDrop), computed once per row for all of the
// row's column tiles.
template <int NR, bool kRelu, bool kDrop>
inline void sage_epilogue(const float (&acc)[kMR][NR], int64_t row0, int mr, int64_t j0,
                          int64_t k, const float* bias_p, const float* addend,
                          const uint64_t* row_keys, uint64_t threshold, float scale, float* out,
                          uint8_t* gate_bits) {
  const int jv = static_cast<int>(std::min<int64_t>(NR, k - j0));
  for (int r = 0; r < mr; ++r)
#if defined(__AVX512F__)
    sage_epilogue_row_avx512<NR, kRelu, kDrop>(acc[r], row0 + r, jv, j0, k, bias_p, addend,
                                               kDrop ? row_keys[r] : 0, threshold, scale, out,
                                               gate_bits);
#else
    sage_epilogue_row_portable<NR, kRelu, kDrop>(acc[r], row0 + r, jv, j0, k, bias_p, addend,
                                                 kDrop ? row_keys[r] : 0, threshold, scale, out,
                                                 gate_bits);
#endif
}

// One full kNR-column tile of dropout_forward: o[j] = keep ? x[j] * scale : 0 for j < kNR,
// keep = keep_all or u[j] < threshold32 (u: the tile's dropout_uniforms), and the keep bits
// packed into bits[0 .. kNR / 8).
inline void dropout_tile(const uint32_t (&u)[kNR], bool keep_all, uint32_t threshold32,
                         float scale, const float* x, float* o, uint8_t* bits) {
#if defined(__AVX512F__)
  dropout_tile_avx512(u, keep_all, threshold32, scale, x, o, bits);
#else
  dropout_tile_portable(u, keep_all, threshold32, scale, x, o, bits);
#endif
}

}  // namespace update_detail
}  // namespace distmb
