// The GraphSAGE UPDATE entry points (contracts in update.h): update_forward picks the forward
// engine's epilogue variant (ReLU, dropout) at compile time; update_backward and
// update_backward_aggregated give the backward engine the prologue that builds the
// pre-activation gradient rows (from grad_out, or aggregated from the next layer's gradient).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "aggregate.h"
#include "common.h"
#include "dropout_hash.h"
#include "elementwise.h"
#include "engines.h"
#include "gate_bits.h"
#include "packing.h"
#include "prefetch.h"
#include "tiling.h"
#include "update.h"

namespace distmb {

using namespace update_detail;

namespace {

template <bool kRelu, bool kDrop>
void update_forward_impl(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                         const float* addend, const float* bias, uint64_t seed,
                         uint64_t threshold, float scale, float* out, uint8_t* gate_bits,
                         bool bf16) {
  const int64_t kp = pad_cols(k);
  AlignedFloats bias_p(kp, 0.0f);
  std::copy(bias, bias + k, bias_p.begin());
  const ForwardProducts products(src, nsrc, k, bf16);
  // Contiguous chunks of row blocks taken dynamically: within a chunk the next block is
  // known, so its input rows are prefetched while the current one computes.
  const int64_t nblocks = (n + kRowBlock - 1) / kRowBlock;
  const int nt = num_work_threads(nblocks);
  const int64_t nchunks = std::min<int64_t>(nblocks, kFwdChunksPerThread * nt);
#pragma omp parallel num_threads(nt)
  {
    AlignedPairs scratch(products.scratch_words());
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < nchunks; ++chunk) {
      const int64_t end = (chunk + 1) * nblocks / nchunks;
      for (int64_t blk = chunk * nblocks / nchunks; blk < end; ++blk) {
        const int64_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, n - i0);
        NextRowsPrefetch next;
        if (blk + 1 < end) {
          const int64_t i1 = i0 + rows, rows1 = std::min(kRowBlock, n - i1);
          for (int s = 0; s < nsrc; ++s)
            if (src[s].rows == nullptr) next.add(src[s].x + i1 * src[s].c, rows1 * src[s].c);
          next.add(addend == nullptr ? nullptr : addend + i1 * k, rows1 * k);
        }
        uint64_t row_keys[kRowBlock];
        if (kDrop)
          for (int64_t r = 0; r < rows; ++r) row_keys[r] = dropout_row_key(seed, i0 + r);
        products.row_block(
            i0, rows, &next, scratch.data(),
            [&](const auto& acc, int64_t row0, int mr, int64_t j0) {
              sage_epilogue<std::extent<std::remove_reference_t<decltype(acc)>, 1>::value, kRelu,
                            kDrop>(acc, row0, mr, j0, k, bias_p.data(), addend,
                                   row_keys + (row0 - i0), threshold, scale, out, gate_bits);
            });
      }
    }
  }
}

}  // namespace

void update_forward(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                    const float* addend, const float* bias, bool relu, double p_drop,
                    uint64_t seed, float* out, uint8_t* gate_bits, bool bf16) {
  check_sources(k, src, nsrc);
  if (!(p_drop >= 0.0 && p_drop <= 1.0))
    throw std::invalid_argument("the dropout probability must be in [0, 1]");
  if (n <= 0) return;
  const uint64_t threshold = keep_threshold(1.0 - p_drop);
  // A keep threshold of 2^32 (p_drop below 2^-33) keeps every unit: no hashing needed.
  const bool drop = relu && p_drop > 0.0 && threshold < (uint64_t{1} << 32);
  const float scale = p_drop < 1.0 ? static_cast<float>(1.0 / (1.0 - p_drop)) : 0.0f;
  if (!relu)
    update_forward_impl<false, false>(n, k, src, nsrc, addend, bias, seed, threshold, 1.0f, out,
                                      nullptr, bf16);
  else if (drop)
    update_forward_impl<true, true>(n, k, src, nsrc, addend, bias, seed, threshold, scale, out,
                                    gate_bits, bf16);
  else
    update_forward_impl<true, false>(n, k, src, nsrc, addend, bias, seed, threshold, scale, out,
                                     gate_bits, bf16);
}

namespace {

// d[0 .. kp) = the pre-activation gradient of one row from its output gradient g[0 .. k) (d == g
// allowed): g * scale where the row's gate bit is set, else 0 (bits null: g as it is); columns
// >= k zero.
inline void gate_row(const float* g, const uint8_t* bits, int64_t k, int64_t kp, float scale,
                     float* d) {
  if (bits == nullptr) {
    if (d != g) std::copy(g, g + k, d);
  } else {
    // 16 columns per step from their two gate bytes as one 16-bit word (kp >= 16 * steps).
    const int64_t kb = bytes_per_row(k);
    for (int64_t j0 = 0; j0 < k; j0 += kUnpack) {
      const int64_t b0 = j0 / kBitsPerByte;
      const uint32_t word =
          bits[b0] | (b0 + 1 < kb ? static_cast<uint32_t>(bits[b0 + 1]) << 8 : 0u);
      apply_gate_word(word, g + j0, static_cast<int>(std::min<int64_t>(kUnpack, k - j0)), scale,
                      d + j0);
    }
  }
  std::fill(d + k, d + kp, 0.0f);
}

}  // namespace

void update_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* gate_bits,
                     float scale, const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                     float* grad_bias, float* grad_addend, bool bf16) {
  check_sources(k, src, nsrc, grads);
  const int64_t kb = bytes_per_row(k), kp = pad_cols(k), gs = gp_stride(kp);
  backward_engine(n, k, src, nsrc, grads, grad_bias, backward_split(n), bf16,
                  [&](int64_t, int64_t i0, int64_t rows, float* gp) {
                    for (int64_t row = i0; row < i0 + rows; ++row) {
                      float* d = gp + (row - i0) * gs;
                      gate_row(grad_out + row * k,
                               gate_bits == nullptr ? nullptr : gate_bits + row * kb, k, kp,
                               scale, d);
                      if (grad_addend != nullptr) std::copy(d, d + k, grad_addend + row * k);
                    }
                  },
                  [&](int64_t i0, int64_t rows, NextRowsPrefetch& next) {
                    next.add(grad_out + i0 * k, rows * k);
                    if (gate_bits != nullptr) next.add_bytes(gate_bits + i0 * kb, rows * kb);
                  });
}

void update_backward_aggregated(int64_t n, int64_t k, const int64_t* next_indptr,
                                int64_t n_next_dst, const int64_t* t_indptr, const int64_t* t_dst,
                                AggKind kind, const float* grad_dst, const float* addend,
                                int64_t n_addend, const uint8_t* gate_bits, float scale,
                                const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                                float* grad_bias, bool bf16) {
  check_sources(k, src, nsrc, grads);
  if (kind == AggKind::kGcn)
    throw std::invalid_argument("update_backward_aggregated: the gcn aggregator is not supported");
  const int64_t kb = bytes_per_row(k), kp = pad_cols(k), gs = gp_stride(kp);
  // Per destination weight of the next layer's aggregation (aggregate_backward's scale).
  std::vector<float> weight(n_next_dst);
  for (int64_t v = 0; v < n_next_dst; ++v)
    weight[v] = agg_scale(kind, next_indptr[v + 1] - next_indptr[v]);
  const float* w = weight.data();
  const int64_t ahead = prefetch_rows(k);
  backward_engine(n, k, src, nsrc, grads, grad_bias, backward_split(n), bf16,
                  [&](int64_t, int64_t i0, int64_t rows, float* gp) {
                    for (int64_t u = i0; u < i0 + rows; ++u) {
                      float* __restrict d = gp + (u - i0) * gs;
                      std::fill(d, d + k, 0.0f);
                      const int64_t end = t_indptr[u + 1];
                      for (int64_t j = t_indptr[u]; j < end; ++j) {
                        if (j + ahead < end) prefetch_row(grad_dst + t_dst[j + ahead] * k, k);
                        const float* __restrict r = grad_dst + t_dst[j] * k;
                        const float wv = w[t_dst[j]];
#pragma omp simd
                        for (int64_t f = 0; f < k; ++f) d[f] += wv * r[f];
                      }
                      if (u < n_addend) {
                        const float* __restrict a = addend + u * k;
#pragma omp simd
                        for (int64_t f = 0; f < k; ++f) d[f] += a[f];
                      }
                      gate_row(d, gate_bits == nullptr ? nullptr : gate_bits + u * kb, k, kp,
                               scale, d);
                    }
                  },
                  [&](int64_t i0, int64_t rows, NextRowsPrefetch& next) {
                    if (i0 < n_addend)
                      next.add(addend + i0 * k, (std::min(i0 + rows, n_addend) - i0) * k);
                    if (gate_bits != nullptr) next.add_bytes(gate_bits + i0 * kb, rows * kb);
                  });
}

bool update_bf16_native() { return kNativePairs; }

void set_update_bf16_portable(bool portable) { portable_pairs_flag() = portable; }

}  // namespace distmb
