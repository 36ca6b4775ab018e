// Fused AGG kernels over a block's CSR (DistGNN-MB section 3.3, "Broadcast Support for AGG"),
// the GAT family: edge softmax (also fused with the attention logits) and the per-head weighted
// aggregation whose edge weight is broadcast over the D SIMD lanes of its head, each forward
// and backward; float32 features and edge values, int64 CSR. Row scheduling and gathering
// (shared with the mean / sum / gcn kernels of aggregate.cpp) are in aggregate_rows.h.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "aggregate.h"
#include "aggregate_rows.h"
#include "common.h"

namespace distmb {

using namespace aggregate_detail;

namespace {

// ---- weighted-aggregation backward ----------------------------------------------------------

// Weighted-aggregation backward for one source u over its transposed edges k (edge e_k, u ->
// v_k), one pass over the rows grad_out[v_k] (nb.x = grad_out, nb.nbr = the v_k):
//   gx[h, :]     = sum_k w[e_k, h] * grad_out[v_k, h, :]      (kGx)
//   gw[e_k, h]   = <grad_out[v_k, h, :], xu[h, :]>            (kGw)
template <bool kGx, bool kGw>
inline void weighted_backward_row(const Neighbours& nb, const int64_t* edges, const float* w,
                                  int64_t heads, int64_t dim, const float* __restrict xu,
                                  float* __restrict gx, float* gw) {
  const int64_t n = heads * dim;
  if constexpr (kGx) {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) gx[f] = 0.0f;
  }
  for (int64_t k = 0; k < nb.cnt; ++k) {
    nb.prefetch(k);
    const float* __restrict r = nb.x + nb.nbr[k] * nb.ld;
    const int64_t e = edges[k] * heads;
    for (int64_t h = 0; h < heads; ++h) {
      const float* __restrict rh = r + h * dim;
      if constexpr (kGx && kGw) {
        const float wv = w[e + h];
        const float* __restrict xh = xu + h * dim;
        float* __restrict gh = gx + h * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; ++d) {
          gh[d] += wv * rh[d];
          dot += rh[d] * xh[d];
        }
        gw[e + h] = dot;
      } else if constexpr (kGx) {
        const float wv = w[e + h];
        float* __restrict gh = gx + h * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) gh[d] += wv * rh[d];
      } else {
        const float* __restrict xh = xu + h * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; ++d) dot += rh[d] * xh[d];
        gw[e + h] = dot;
      }
    }
  }
}

template <bool kGx, bool kGw>
void weighted_backward_rows(const int64_t* t_indptr, const int64_t* t_edges,
                            const int64_t* t_dst, int64_t n_src, const float* weights,
                            const float* x, const float* grad_out, int64_t heads, int64_t dim,
                            float* grad_x, float* grad_w) {
  const int64_t hd = heads * dim;
  const int64_t n_edges = t_indptr[n_src];
  const RowChunks srcs(t_indptr, n_src, hd * sizeof(float) * (kGx && kGw ? 2 : 1));
  for_rows(srcs, [&](int64_t u) {
    const int64_t b = t_indptr[u];
    Neighbours nb{grad_out, hd, t_dst + b, t_indptr[u + 1] - b};
    nb.pf_cnt = n_edges - b;
    nb.pf_len = hd;
    nb.ahead = prefetch_rows(hd);
    weighted_backward_row<kGx, kGw>(nb, t_edges + b, weights, heads, dim,
                                    kGw ? x + u * hd : nullptr,
                                    kGx ? grad_x + u * hd : nullptr, grad_w);
    return true;
  });
}

// ---- exp and softmax ------------------------------------------------------------------------

// exp(x) after Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial in r and
// 2^n from the exponent bits; n is rounded by adding 1.5 * 2^23 (std::floor would not vectorise
// without -fno-trapping-math). Branch-free, so `omp simd` loops vectorise it; relative error
// below 1e-7 on [-87, 88]. Inputs are clamped to [-87.3, 88] (exp(-inf) gives ~1e-38, not 0);
// softmax only passes x <= 0.
constexpr float kExpMin = -87.3f, kExpMax = 88.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: t + magic rounds t to an integer

#pragma omp declare simd notinbranch
inline float exp_simd(float x) {
  x = std::min(std::max(x, kExpMin), kExpMax);
  const float t = x * kLog2e + kRoundMagic;
  const float n = t - kRoundMagic;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // The low mantissa bits of t hold n; 2^n is the float with biased exponent n + 127.
  const int32_t n_int = __builtin_bit_cast(int32_t, t) - __builtin_bit_cast(int32_t, kRoundMagic);
  return p * __builtin_bit_cast(float, (n_int + 127) << 23);
}

// Heads up to this many keep their per-row scratch on the stack.
constexpr int64_t kStackHeads = 64;

// Per-row scratch of 2 * heads floats.
struct HeadScratch {
  float stack[2 * kStackHeads];
  std::vector<float> heap;
  float* a;
  float* b;
  explicit HeadScratch(int64_t heads) : a(stack) {
    if (heads > kStackHeads) {
      heap.resize(2 * heads);
      a = heap.data();
    }
    b = a + heads;
  }
};

// Softmax over the cnt >= 1 edges of one destination, per head: s[k * H + h] -> a[k * H + h]
// (a may alias s). Subtracts the per-head maximum before exp.
inline void softmax_row(const float* s, int64_t cnt, int64_t heads, float* a, HeadScratch& tmp) {
  float* mx = tmp.a;
  float* sum = tmp.b;
  const int64_t n = cnt * heads;
  for (int64_t h = 0; h < heads; ++h) mx[h] = s[h];
  for (int64_t k = 1; k < cnt; ++k)
    for (int64_t h = 0; h < heads; ++h) mx[h] = std::max(mx[h], s[k * heads + h]);
  for (int64_t k = 0; k < cnt; ++k)
    for (int64_t h = 0; h < heads; ++h) a[k * heads + h] = s[k * heads + h] - mx[h];
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) a[i] = exp_simd(a[i]);
  for (int64_t h = 0; h < heads; ++h) sum[h] = 0.0f;
  for (int64_t k = 0; k < cnt; ++k)
    for (int64_t h = 0; h < heads; ++h) sum[h] += a[k * heads + h];
  for (int64_t h = 0; h < heads; ++h) sum[h] = 1.0f / sum[h];
  for (int64_t k = 0; k < cnt; ++k)
    for (int64_t h = 0; h < heads; ++h) a[k * heads + h] *= sum[h];
}

// Softmax backward over one destination's edges: gs = a * (g - sum_k a_k g_k), per head.
inline void softmax_backward_row(const float* a, const float* g, int64_t cnt, int64_t heads,
                                 float* gs, HeadScratch& tmp) {
  float* dot = tmp.a;
  for (int64_t h = 0; h < heads; ++h) dot[h] = 0.0f;
  for (int64_t k = 0; k < cnt; ++k)
    for (int64_t h = 0; h < heads; ++h) dot[h] += a[k * heads + h] * g[k * heads + h];
  for (int64_t k = 0; k < cnt; ++k)
    for (int64_t h = 0; h < heads; ++h)
      gs[k * heads + h] = a[k * heads + h] * (g[k * heads + h] - dot[h]);
}

}  // namespace

// ---- GAT: edge softmax, attention logits, weighted aggregation ---------------------------------

void edge_softmax_forward(const int64_t* indptr, int64_t n_dst, const float* scores,
                          int64_t heads, float* alpha) {
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  const RowChunks rows(indptr, n_dst, 2 * heads * sizeof(float));
  const int64_t bad = for_rows(rows, [&](int64_t v) {
    if (!valid_range(indptr, v, n_edges)) return false;
    const int64_t b = indptr[v], cnt = indptr[v + 1] - b;
    if (cnt > 0) {
      HeadScratch tmp(heads);
      softmax_row(scores + b * heads, cnt, heads, alpha + b * heads, tmp);
    }
    return true;
  });
  if (bad) throw_bad_csr(bad, -1);
}

void edge_softmax_backward(const int64_t* indptr, int64_t n_dst, const float* alpha,
                           const float* grad_alpha, int64_t heads, float* grad_scores) {
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  const RowChunks rows(indptr, n_dst, 3 * heads * sizeof(float));
  const int64_t bad = for_rows(rows, [&](int64_t v) {
    if (!valid_range(indptr, v, n_edges)) return false;
    const int64_t b = indptr[v], cnt = indptr[v + 1] - b;
    if (cnt > 0) {
      HeadScratch tmp(heads);
      softmax_backward_row(alpha + b * heads, grad_alpha + b * heads, cnt, heads,
                           grad_scores + b * heads, tmp);
    }
    return true;
  });
  if (bad) throw_bad_csr(bad, -1);
}

void gat_attention_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                           int64_t n_src, const float* el, const float* er, int64_t heads,
                           float negative_slope, float* alpha) {
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  const RowChunks rows(indptr, n_dst, 3 * heads * sizeof(float));
  const int64_t bad = for_rows(rows, [&](int64_t v) {
    if (!valid_row(indptr, indices, v, n_edges, n_src)) return false;
    const int64_t b = indptr[v], cnt = indptr[v + 1] - b;
    float* a = alpha + b * heads;
    const float* r = er + v * heads;
    for (int64_t k = 0; k < cnt; ++k) {
      const float* l = el + indices[b + k] * heads;
      for (int64_t h = 0; h < heads; ++h) {
        const float s = l[h] + r[h];
        a[k * heads + h] = s > 0.0f ? s : negative_slope * s;
      }
    }
    if (cnt > 0) {
      HeadScratch tmp(heads);
      softmax_row(a, cnt, heads, a, tmp);
    }
    return true;
  });
  if (bad) throw_bad_csr(bad, n_src);
}

void gat_attention_backward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                            const int64_t* t_indptr, const int64_t* t_edges, int64_t n_src,
                            const float* el, const float* er, const float* alpha,
                            const float* grad_alpha, int64_t heads, float negative_slope,
                            float* grad_el, float* grad_er) {
  // 1. Per destination (static split): the logits' gradient (softmax, then LeakyReLU
  //    backward) into a per-edge buffer; grad_er[v] is its sum over v's edges.
  // 2. Per source (balanced chunks, same parallel region): grad_el[u] = sum of the logit
  //    gradients of u's edges (transposed CSR).
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  std::vector<float> grad_logit(n_edges * heads);
  float* gl_all = grad_logit.data();
  const auto logits = [&](int64_t v) {
    const int64_t b = indptr[v], cnt = indptr[v + 1] - b;
    float* gr = grad_er ? grad_er + v * heads : nullptr;
    if (gr) std::fill(gr, gr + heads, 0.0f);
    if (cnt <= 0) return;
    HeadScratch tmp(heads);
    float* gl = gl_all + b * heads;
    softmax_backward_row(alpha + b * heads, grad_alpha + b * heads, cnt, heads, gl, tmp);
    const float* r = er + v * heads;
    for (int64_t k = 0; k < cnt; ++k) {
      const float* l = el + indices[b + k] * heads;
      for (int64_t h = 0; h < heads; ++h) {
        if (l[h] + r[h] <= 0.0f) gl[k * heads + h] *= negative_slope;
        if (gr) gr[h] += gl[k * heads + h];
      }
    }
  };
  const auto sources = [&](int64_t u) {
    if (!grad_el) return true;
    float* o = grad_el + u * heads;
    std::fill(o, o + heads, 0.0f);
    for (int64_t k = t_indptr[u]; k < t_indptr[u + 1]; ++k) {
      const float* gl = gl_all + t_edges[k] * heads;
      for (int64_t h = 0; h < heads; ++h) o[h] += gl[h];
    }
    return true;
  };
  // Without grad_el the (empty) row pass runs over the destinations, to size the team.
  const RowChunks chunks = grad_el ? RowChunks(t_indptr, n_src, 6 * heads * sizeof(float))
                                   : RowChunks(indptr, n_dst, 4 * heads * sizeof(float));
  for_rows(chunks, sources, n_dst, logits);
}

void weighted_aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                                int64_t n_src, const float* weights, const float* x,
                                int64_t heads, int64_t dim, float* out) {
  const int64_t hd = heads * dim;
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  const int64_t ahead = prefetch_rows(hd);
  const RowChunks rows(indptr, n_dst, hd * sizeof(float));
  const int64_t bad = for_rows(rows, [&](int64_t v) {
    if (!valid_row(indptr, indices, v, n_edges, n_src)) return false;
    const int64_t b = indptr[v];
    Neighbours nb{x, hd, indices + b, indptr[v + 1] - b};
    nb.pf_cnt = n_edges - b;
    nb.pf_len = hd;
    nb.ahead = ahead;
    nb.w = weights + b * heads;  // edge k, head h: weights[(b + k) * H + h]
    nb.w_stride = heads;
    gather_row(nb, heads, dim, nullptr, 0.0f, 1.0f, out + v * hd);
    return true;
  });
  if (bad) throw_bad_csr(bad, n_src);
}

void weighted_aggregate_backward(const int64_t* t_indptr, const int64_t* t_edges,
                                 const int64_t* t_dst, int64_t n_src, const float* weights,
                                 const float* x, const float* grad_out, int64_t heads,
                                 int64_t dim, float* grad_x, float* grad_w) {
  if (grad_x && grad_w) {
    weighted_backward_rows<true, true>(t_indptr, t_edges, t_dst, n_src, weights, x, grad_out,
                                       heads, dim, grad_x, grad_w);
  } else if (grad_x) {
    weighted_backward_rows<true, false>(t_indptr, t_edges, t_dst, n_src, weights, x, grad_out,
                                        heads, dim, grad_x, nullptr);
  } else if (grad_w) {
    weighted_backward_rows<false, true>(t_indptr, t_edges, t_dst, n_src, weights, x, grad_out,
                                        heads, dim, nullptr, grad_w);
  }
}

}  // namespace distmb
