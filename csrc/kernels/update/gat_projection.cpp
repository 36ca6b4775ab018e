// The GAT projection entry points (contracts in update.h): the forward engine with a
// bias / ReLU epilogue and the attention scores of each row block while it is in cache; the
// backward engine with a prologue that folds the scores' gradients into the pre-activation
// gradient and accumulates the attention vectors' gradients per chunk.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common.h"
#include "engines.h"
#include "packing.h"
#include "prefetch.h"
#include "tiling.h"
#include "update.h"

namespace distmb {

using namespace update_detail;

void gat_projection_forward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                            const float* w, const float* bias, const float* attn_l,
                            const float* attn_r, bool relu, float* z, float* el, float* er,
                            bool bf16) {
  const int64_t k = heads * d;
  const UpdateSource src{x, w, c};
  check_sources(k, &src, 1);
  if (n <= 0) return;
  const int64_t kp = pad_cols(k);
  AlignedFloats bias_p(kp, 0.0f);
  std::copy(bias, bias + k, bias_p.begin());
  const ForwardProducts products(&src, 1, k, bf16);
  const int64_t nblocks = (n + kRowBlock - 1) / kRowBlock;
#pragma omp parallel num_threads(num_work_threads(nblocks))
  {
    AlignedPairs scratch(products.scratch_words());
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, n - i0);
      products.row_block(
          i0, rows, nullptr, scratch.data(),
          [&](const auto& acc, int64_t row0, int mr, int64_t j0) {
            constexpr int NR = std::extent<std::remove_reference_t<decltype(acc)>, 1>::value;
            const int jv = static_cast<int>(std::min<int64_t>(NR, k - j0));
            for (int r = 0; r < mr; ++r) {
              float* o = z + (row0 + r) * k + j0;
#pragma omp simd
              for (int j = 0; j < jv; ++j) {
                const float v = acc[r][j] + bias_p[j0 + j];
                o[j] = relu ? std::max(v, 0.0f) : v;
              }
            }
          });
      // Attention scores of the block while its z rows are in cache.
      for (int64_t row = i0; row < i0 + rows; ++row) {
        const float* zr = z + row * k;
        for (int64_t h = 0; h < heads; ++h) {
          float sl = 0.0f, sr = 0.0f;
          const float* zh = zr + h * d;
          const float* al = attn_l + h * d;
          const float* ar = attn_r + h * d;
#pragma omp simd reduction(+ : sl, sr)
          for (int64_t j = 0; j < d; ++j) {
            sl += zh[j] * al[j];
            sr += zh[j] * ar[j];
          }
          el[row * heads + h] = sl;
          er[row * heads + h] = sr;
        }
      }
    }
  }
}

void gat_projection_backward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                             const float* w, const float* z, const float* attn_l,
                             const float* attn_r, bool relu, const float* grad_z,
                             const float* grad_el, const float* grad_er, float* grad_x,
                             float* grad_w, float* grad_bias, float* grad_attn_l,
                             float* grad_attn_r, bool bf16) {
  const int64_t k = heads * d, kp = pad_cols(k), gs = gp_stride(kp);
  const UpdateSource src{x, w, c};
  check_sources(k, &src, 1);
  const UpdateGrads grads{grad_x, grad_w};
  const BwdSplit split = backward_split(n);
  // Per-chunk gradients of attn_l and attn_r: [nchunks][kp] each.
  AlignedFloats al_part(static_cast<size_t>(split.nchunks) * kp, 0.0f), ar_part(al_part);
  backward_engine(n, k, &src, 1, &grads, grad_bias, split, bf16,
                  [&](int64_t chunk, int64_t i0, int64_t rows, float* gp) {
                    float* gal = al_part.data() + static_cast<size_t>(chunk) * kp;
                    float* gar = ar_part.data() + static_cast<size_t>(chunk) * kp;
                    for (int64_t r = 0; r < rows; ++r) {
                      const int64_t row = i0 + r;
                      const float* zr = z + row * k;
                      const float* gz = grad_z + row * k;
                      float* dst = gp + r * gs;
                      for (int64_t h = 0; h < heads; ++h) {
                        const float gl = grad_el[row * heads + h];
                        const float gr = grad_er[row * heads + h];
                        const int64_t o = h * d;
#pragma omp simd
                        for (int64_t j = o; j < o + d; ++j) {
                          const float dz = gz[j] + gl * attn_l[j] + gr * attn_r[j];
                          gal[j] += gl * zr[j];
                          gar[j] += gr * zr[j];
                          dst[j] = (!relu || zr[j] > 0.0f) ? dz : 0.0f;
                        }
                      }
                      std::fill(dst + k, dst + kp, 0.0f);
                    }
                  },
                  [&](int64_t i0, int64_t rows, NextRowsPrefetch& next) {
                    next.add(z + i0 * k, rows * k);
                    next.add(grad_z + i0 * k, rows * k);
                  });
  sum_parts(al_part.data(), split.nchunks, kp, k, grad_attn_l);
  sum_parts(ar_part.data(), split.nchunks, kp, k, grad_attn_r);
}

}  // namespace distmb
