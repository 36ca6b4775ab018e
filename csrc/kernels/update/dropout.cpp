// The standalone dropout of the fused UPDATE kernels (contracts in update.h): the same
// counter-based masks as update_forward's dropout epilogue (dropout_hash.h), and their
// backward from the packed keep bits.
#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "dropout_hash.h"
#include "elementwise.h"
#include "gate_bits.h"
#include "tiling.h"
#include "update.h"

namespace distmb {

using namespace update_detail;

void dropout_keep_mask(uint64_t seed, int64_t n, int64_t k, double p_drop, uint8_t* keep) {
  if (!(p_drop >= 0.0 && p_drop <= 1.0))
    throw std::invalid_argument("the dropout probability must be in [0, 1]");
  const uint64_t threshold = keep_threshold(1.0 - p_drop);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const uint64_t rk = dropout_row_key(seed, row);
    for (int64_t col = 0; col < k; ++col)
      keep[row * k + col] = p_drop > 0.0 ? dropout_keep(rk, col, threshold) : 1;
  }
}

// Contract: dropout_forward / dropout_backward in update.h. Rows in parallel; per row, kNR
// columns at a time: their uniforms (dropout_uniforms, as sage_epilogue), a select per unit,
// the keep bits packed 8 columns per byte; the last k % kNR columns one by one.
void dropout_forward(int64_t n, int64_t k, const float* x, double p_drop, uint64_t seed,
                     float* out, uint8_t* bits) {
  if (!(p_drop >= 0.0 && p_drop <= 1.0))
    throw std::invalid_argument("the dropout probability must be in [0, 1]");
  const uint64_t threshold = keep_threshold(1.0 - p_drop);
  const float scale = p_drop < 1.0 ? static_cast<float>(1.0 / (1.0 - p_drop)) : 0.0f;
  const int64_t kb = bytes_per_row(k);
  const int64_t full = k / kNR * kNR;
  // A keep threshold of 2^32 (p_drop below 2^-33) keeps every unit.
  const bool keep_all = threshold >= (uint64_t{1} << 32);
  const uint32_t threshold32 = keep_all ? 0u : static_cast<uint32_t>(threshold);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const uint64_t rk = dropout_row_key(seed, row);
    const float* xr = x + row * k;
    float* o = out + row * k;
    uint8_t* br = bits + row * kb;
    std::fill(br, br + kb, uint8_t{0});
    for (int64_t j0 = 0; j0 < full; j0 += kNR) {
      alignas(64) uint32_t u[kNR];
      dropout_uniforms(rk, j0, u);
      dropout_tile(u, keep_all, threshold32, scale, xr + j0, o + j0, br + j0 / kBitsPerByte);
    }
    for (int64_t col = full; col < k; ++col) {
      const bool keep = dropout_keep(rk, col, threshold);
      o[col] = keep ? xr[col] * scale : 0.0f;
      br[col / kBitsPerByte] |= static_cast<uint8_t>(keep) << (col % kBitsPerByte);
    }
  }
}

void dropout_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* bits,
                      float scale, float* grad_in) {
  const int64_t kb = bytes_per_row(k);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* br = bits + row * kb;
    const float* g = grad_out + row * k;
    float* d = grad_in + row * k;
    // kUnpack columns per step from their two bytes as one 16-bit word (apply_gate_word);
    // the last k % kUnpack columns one by one.
    const int64_t full = k / kUnpack * kUnpack;
    for (int64_t j0 = 0; j0 < full; j0 += kUnpack) {
      const int64_t b0 = j0 / kBitsPerByte;
      const uint32_t word = br[b0] | static_cast<uint32_t>(br[b0 + 1]) << 8;
      apply_gate_word(word, g + j0, kUnpack, scale, d + j0);
    }
    for (int64_t col = full; col < k; ++col) {
      const bool keep = (br[col / kBitsPerByte] >> (col % kBitsPerByte)) & 1;
      d[col] = keep ? g[col] * scale : 0.0f;
    }
  }
}

}  // namespace distmb
