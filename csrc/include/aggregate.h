// Fused AGG kernels, DistGNN-MB section 3.3, "Broadcast Support": csrc/kernels/aggregate.cpp
// (transpose_block, mean / sum / gcn, stream_copy) and csrc/kernels/aggregate_gat.cpp (edge
// softmax, GAT attention logits, weighted aggregation).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <vector>

namespace distmb {

// Common contract: a block is a CSR over n_dst destinations, indptr[n_dst + 1] (indptr[0] = 0)
// and indices[E] source rows in [0, n_src); feature matrices are float32, row-major and
// contiguous; outputs are caller-allocated and fully written (no need to zero them). Forward
// kernels throw std::out_of_range for a decreasing indptr or a source outside [0, n_src).
// Results do not depend on the OpenMP thread count.

// Unweighted aggregators of distmb.nn.aggregate.aggregate.
enum class AggKind : int { kSum = 0, kMean = 1, kGcn = 2 };

// Feature rows stored in two bytes a value (--feature-dtype): the bits of one bfloat16 or
// IEEE half-precision value. aggregate_forward reads such rows in place and sums in float32.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

// Per-destination factor of aggregate: 1 (sum), 1 / deg or 0 (mean), 1 / (deg + 1) (gcn).
inline float agg_scale(AggKind kind, int64_t deg) {
  switch (kind) {
    case AggKind::kMean:
      return deg > 0 ? 1.0f / static_cast<float>(deg) : 0.0f;
    case AggKind::kGcn:
      return 1.0f / static_cast<float>(deg + 1);
    case AggKind::kSum:
      break;
  }
  return 1.0f;
}

// Transposed CSR of a block (sources -> edges): edges[indptr[u] .. indptr[u+1]) are the ids of
// the edges whose source is u, ascending, and dst[k] is the destination of edges[k].
struct BlockTranspose {
  std::vector<int64_t> indptr;  // [n_src + 1]
  std::vector<int64_t> edges;   // [E]
  std::vector<int64_t> dst;     // [E]
};

// transpose_block: stable counting sort of the edges by source, thread-parallel without
// atomics (per-thread histograms over edge-balanced slices of the rows); validates the CSR.
void transpose_block(const int64_t* indptr, const int64_t* indices, int64_t n_dst, int64_t n_src,
                     BlockTranspose& out);

// aggregate_forward: out[v] = s_v * (sum_{e of v} x[indices[e]] (+ x[v] for gcn)), x [n_src,
// dim], out [n_dst, dim]; s_v = 1 (sum), 1/deg or 0 without edges (mean), 1/(deg+1) (gcn).
void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const float* x, int64_t dim, AggKind kind, float* out);
// The same over rows stored in two bytes a value (x bfloat16 or float16 [n_src, dim]), each
// value widened to float32 exactly as it is read; out float32.
void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const Bf16* x, int64_t dim, AggKind kind, float* out);
void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const Half* x, int64_t dim, AggKind kind, float* out);

// aggregate_backward: grad_x [n_src, dim] of aggregate_forward given grad_out [n_dst, dim],
// gathered over the transposed CSR (t_indptr, t_dst of transpose_block). Every row of grad_x
// is written (no zeroing needed). With addend [n_addend, dim] (n_addend <= n_src; may be
// null), rows u < n_addend get addend[u] added: the gradient of another use of the first
// rows (a layer's self term), summed in the same pass instead of a second full-size tensor.
void aggregate_backward(const int64_t* indptr, int64_t n_dst, const int64_t* t_indptr,
                        const int64_t* t_dst, int64_t n_src, const float* grad_out, int64_t dim,
                        AggKind kind, const float* addend, int64_t n_addend, float* grad_x);

// edge_softmax_forward: alpha[E, H] = softmax of scores[E, H] over each destination's edges,
// per head (the maximum is subtracted first). edge_softmax_backward: grad_scores[E, H] =
// alpha * (grad_alpha - sum_{edges of v} alpha * grad_alpha).
void edge_softmax_forward(const int64_t* indptr, int64_t n_dst, const float* scores,
                          int64_t heads, float* alpha);
void edge_softmax_backward(const int64_t* indptr, int64_t n_dst, const float* alpha,
                           const float* grad_alpha, int64_t heads, float* grad_scores);

// gat_attention_forward: alpha[E, H] = edge softmax of LeakyReLU(el[u_e, h] + er[v, h]) with
// el [n_src, H], er [n_dst, H]. gat_attention_backward: grad_el [n_src, H] (via the transposed
// CSR t_indptr / t_edges) and grad_er [n_dst, H] from grad_alpha [E, H]; either may be null.
void gat_attention_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                           int64_t n_src, const float* el, const float* er, int64_t heads,
                           float negative_slope, float* alpha);
void gat_attention_backward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                            const int64_t* t_indptr, const int64_t* t_edges, int64_t n_src,
                            const float* el, const float* er, const float* alpha,
                            const float* grad_alpha, int64_t heads, float negative_slope,
                            float* grad_el, float* grad_er);

// weighted_aggregate_forward: out[v, h, :] = sum_{e of v} weights[e, h] * x[indices[e], h, :]
// with weights [E, H], x [n_src, H, dim], out [n_dst, H, dim]; each weight is broadcast over
// the dim SIMD lanes of its head.
void weighted_aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                                int64_t n_src, const float* weights, const float* x,
                                int64_t heads, int64_t dim, float* out);

// weighted_aggregate_backward: one pass over the sources of the transposed CSR computes
// grad_x[u, h, :] = sum_{e = (u -> v)} weights[e, h] * grad_out[v, h, :] and
// grad_w[e, h] = <grad_out[v, h, :], x[u, h, :]> (each output null when not wanted).
void weighted_aggregate_backward(const int64_t* t_indptr, const int64_t* t_edges,
                                 const int64_t* t_dst, int64_t n_src, const float* weights,
                                 const float* x, const float* grad_out, int64_t heads,
                                 int64_t dim, float* grad_x, float* grad_w);

// stream_copy: dst[0..n) = src[0..n), OpenMP static split: the machine's copy bandwidth
// reference for benchmarks/kernels.py.
void stream_copy(const float* src, int64_t n, float* dst);

}  // namespace distmb
