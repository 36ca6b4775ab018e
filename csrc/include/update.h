// Fused UPDATE kernels, DistGNN-MB section 3.3, "Operator Fusion" (csrc/kernels/update/).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>

#include "aggregate.h"

namespace distmb {

// Common contract: float32 row-major buffers; n rows; a weight W is [k][c] (nn.Linear layout)
// and a source X_s is [n][c_s]; outputs are written, never read. Gate bits are uint8
// [n][ceil(k / 8)], column j -> bit j % 8 of byte j / 8, padding bits 0. With bf16, every
// matrix product of a kernel takes its operands rounded to bfloat16 (round to nearest even,
// float32 denormals as zeros) and sums in float32 (AVX512-BF16 where the build targets it:
// update_bf16_native); buffers, element-wise steps and reductions stay float32.

// Most sources (X_s, W_s) one UPDATE sums.
constexpr int kMaxUpdateSources = 2;

struct UpdateSource {
  const float* x;  // [n][c], or with rows a table [N][c] whose row rows[i] is row i
  const float* w;  // [k][c]
  int64_t c;
  const int64_t* rows = nullptr;  // int64[n] in [0, N), or null: X_s's rows read in place
                                  // (no gathered copy); the source then gets no grad_x
};

struct UpdateGrads {
  float* grad_x;  // [n][c] or null (not wanted)
  float* grad_w;  // [k][c] or null
};

// update_forward: pre = sum_s X_s . W_s^T + addend + bias (addend [n][k] or null, bias [k]);
// with relu, out = Dropout(ReLU(pre)): a unit is kept where the low/high 32 bits (column parity)
// of mix64(hash_key(seed, row) ^ (col / 2)) are below round((1 - p_drop) * 2^32), kept units
// are scaled by 1 / (1 - p_drop), and gate_bits (may be null) records ReLU-active AND kept;
// without relu, out = pre (p_drop ignored, gate_bits untouched). One pass over the output:
// register tiles of the products get bias, ReLU, dropout and bits before they are stored.
void update_forward(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                    const float* addend, const float* bias, bool relu, double p_drop,
                    uint64_t seed, float* out, uint8_t* gate_bits, bool bf16 = false);

// update_backward: grad_pre = grad_out * scale * gate (gate_bits null: grad_pre = grad_out);
// grad_x_s = grad_pre . W_s, grad_w_s = grad_pre^T . X_s, grad_bias = column sums of
// grad_pre, grad_addend = grad_pre (each output null when not wanted). One pass over row
// blocks; the reductions over n use one accumulator per chunk of rows (threads take chunks
// dynamically) and one final reduction in chunk order: deterministic for a thread count.
void update_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* gate_bits,
                     float scale, const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                     float* grad_bias, float* grad_addend, bool bf16 = false);

// update_backward_aggregated: update_backward whose grad_out rows are made on the fly as the
// next layer's aggregate_backward would make them (so that n x k gradient is never written):
// grad_out[u] = sum over u's transposed edges j of the next block (t_indptr / t_dst, ascending)
// of w[t_dst[j]] * grad_dst[t_dst[j]], then + addend[u] for u < n_addend; w[v] = 1 (sum) or
// 1 / deg(v), 0 without edges (mean), deg from next_indptr [n_next_dst + 1]; gcn is refused.
// grad_dst is [n_next_dst][k]; rows u < n of the next block's sources are this UPDATE's rows.
// Bit-identical to aggregate_backward followed by update_backward.
void update_backward_aggregated(int64_t n, int64_t k, const int64_t* next_indptr,
                                int64_t n_next_dst, const int64_t* t_indptr, const int64_t* t_dst,
                                AggKind kind, const float* grad_dst, const float* addend,
                                int64_t n_addend, const uint8_t* gate_bits, float scale,
                                const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                                float* grad_bias, bool bf16 = false);

// dropout_keep_mask: keep[n][k] (0/1 bytes), the dropout decisions update_forward makes for
// (seed, p_drop) (all 1 for p_drop = 0); for tests and diagnostics.
void dropout_keep_mask(uint64_t seed, int64_t n, int64_t k, double p_drop, uint8_t* keep);

// dropout_forward: out[n][k] = keep ? x * 1/(1-p) : 0 with the masks of dropout_keep_mask for
// seed (a standalone dropout with update_forward's counter-based masks), and the keep bits
// packed into bits[n][ceil(k/8)] (column j -> bit j % 8). out may alias x.
void dropout_forward(int64_t n, int64_t k, const float* x, double p_drop, uint64_t seed,
                     float* out, uint8_t* bits);
// dropout_backward: grad_in[n][k] = bit ? grad_out * scale : 0 (scale = 1/(1-p)); may alias.
void dropout_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* bits,
                      float scale, float* grad_in);

// gat_projection_forward: z = act(x . W^T + bias) [n][heads * d] (act = ReLU or identity),
// el[n][heads] = <attn_l[h], z[h]>, er[n][heads] = <attn_r[h], z[h]> (attn_* [heads][d]),
// the scores computed per row block while its z rows are in cache.
void gat_projection_forward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                            const float* w, const float* bias, const float* attn_l,
                            const float* attn_r, bool relu, float* z, float* el, float* er,
                            bool bf16 = false);

// gat_projection_backward: gradients of gat_projection_forward given z and the gradients of
// z, el and er (all required); grad_x may be null.
void gat_projection_backward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                             const float* w, const float* z, const float* attn_l,
                             const float* attn_r, bool relu, const float* grad_z,
                             const float* grad_el, const float* grad_er, float* grad_x,
                             float* grad_w, float* grad_bias, float* grad_attn_l,
                             float* grad_attn_r, bool bf16 = false);

// Whether this build's bf16 products run on AVX512-BF16 instructions (else portable C++, no
// faster than float32).
bool update_bf16_native();

// For tests: run the portable bf16 products even where the build has AVX512-BF16 (values
// within float32 rounding of the native ones).
void set_update_bf16_portable(bool portable);

}  // namespace distmb
