// The AVX-512 variants of the element-wise steps of the fused UPDATE kernels (internal to
// csrc/kernels/update/; compiled only where __AVX512F__ is defined, e.g. -march=native on such a
// CPU): a gate (ReLU / dropout) is a mask register, which is also 16 columns' packed gate bits.
// Same values and bits as their portable twins in elementwise_portable.h; elementwise.h picks.
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dropout_hash.h"
#include "gate_bits.h"
#include "tiling.h"

namespace distmb {
namespace update_detail {

// apply_gate_word on AVX-512: the gate word is the store's mask.
inline void apply_gate_word_avx512(uint32_t word, const float* src, int valid, float scale,
                                   float* d) {
  const __mmask16 lanes = valid == kUnpack ? static_cast<__mmask16>(0xFFFF)
                                           : static_cast<__mmask16>((1u << valid) - 1u);
  _mm512_storeu_ps(d, _mm512_maskz_mul_ps(static_cast<__mmask16>(word) & lanes,
                                          _mm512_maskz_loadu_ps(lanes, src),
                                          _mm512_set1_ps(scale)));
}

// The forward epilogue of one row of a register tile on AVX-512, 16 columns per vector: the
// ReLU / dropout gate is a mask register, which is also the row's packed gate bits (column
// j0 + j -> bit j of the little-endian 16-bit word at byte (j0) / 8). Same values and bits as
// sage_epilogue_row_portable.
template <int NR, bool kRelu, bool kDrop>
inline void sage_epilogue_row_avx512(const float (&accr)[NR], int64_t row, int jv, int64_t j0,
                                     int64_t k, const float* bias_p, const float* addend,
                                     uint64_t row_key, uint64_t threshold, float scale, float* out,
                                     uint8_t* gate_bits) {
  static_assert(NR % 16 == 0, "AVX-512 epilogue works on whole 16-float vectors");
  const int64_t kb = bytes_per_row(k);
  alignas(64) uint32_t u[NR];
  if (kDrop) dropout_uniforms(row_key, j0, u);
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(threshold)));
  const __m512 vscale = _mm512_set1_ps(scale);
  float* o = out + row * k + j0;
  for (int q = 0; q < NR / 16; ++q) {
    const int valid = std::max(0, std::min(16, jv - 16 * q));
    if (valid == 0) break;
    const __mmask16 lanes = valid == 16 ? static_cast<__mmask16>(0xFFFF)
                                        : static_cast<__mmask16>((1u << valid) - 1u);
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(accr + 16 * q), _mm512_loadu_ps(bias_p + j0 + 16 * q));
    if (addend != nullptr)
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, addend + row * k + j0 + 16 * q));
    if (kRelu) {
      __mmask16 gate = _mm512_mask_cmp_ps_mask(lanes, v, _mm512_setzero_ps(), _CMP_GT_OQ);
      if (kDrop)
        gate &= _mm512_cmplt_epu32_mask(_mm512_load_si512(u + 16 * q), thr);
      v = _mm512_maskz_mul_ps(gate, v, vscale);
      if (gate_bits != nullptr) {
        const int64_t byte0 = (j0 + 16 * q) / kBitsPerByte;
        uint8_t* dst = gate_bits + row * kb + byte0;
        if (kb - byte0 >= 2)
          std::memcpy(dst, &gate, 2);
        else
          dst[0] = static_cast<uint8_t>(gate);
      }
    }
    _mm512_mask_storeu_ps(o + 16 * q, lanes, v);
  }
}

// One full kNR-column tile of dropout_forward on AVX-512: o[j] = keep ? x[j] * scale : 0 with
// keep = keep_all or u[j] < threshold32, the keep bits stored at bits[0 .. kNR / 8). The keep
// mask of 16 columns is a mask register, stored as their two gate bytes.
inline void dropout_tile_avx512(const uint32_t (&u)[kNR], bool keep_all, uint32_t threshold32,
                                float scale, const float* x, float* o, uint8_t* bits) {
  for (int q = 0; q < kNR / 16; ++q) {
    const __mmask16 keep =
        keep_all ? static_cast<__mmask16>(0xFFFF)
                 : _mm512_cmplt_epu32_mask(_mm512_load_si512(u + 16 * q),
                                           _mm512_set1_epi32(static_cast<int>(threshold32)));
    _mm512_storeu_ps(o + 16 * q,
                     _mm512_maskz_mul_ps(keep, _mm512_loadu_ps(x + 16 * q), _mm512_set1_ps(scale)));
    std::memcpy(bits + 16 * q / kBitsPerByte, &keep, 2);
  }
}

}  // namespace update_detail
}  // namespace distmb

#endif  // __AVX512F__
