// Fused AGG kernels over a block's CSR (DistGNN-MB section 3.3, "Broadcast Support for AGG"):
// mean / sum / gcn aggregation, GAT edge softmax (also fused with the attention logits) and the
// per-head weighted aggregation whose edge weight is broadcast over the D SIMD lanes of its
// head, each forward and backward; float32 features, int64 CSR.
//
// Every pass writes each output row from exactly one thread. Forward passes run over the
// destinations' CSR; backward passes that produce per-source rows gather over the block's
// transposed CSR (sources -> edges, built once per block by transpose_block), so no pass adds
// features atomically. Rows are split into chunks of about equal edges + rows (power-law
// degrees) that threads take dynamically. Sums run in CSR / transposed-CSR order, so results do
// not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>

#include "aggregate.h"
#include "common.h"

namespace distmb {

namespace {

// ---- scheduling ----------------------------------------------------------------------------

// Minimum bytes a pass moves per OpenMP thread (below it the pass uses fewer threads: a
// fork/join costs microseconds, far more when the cores are oversubscribed).
constexpr int64_t kGrainBytes = 256 << 10;
// Chunks per thread of a dynamically scheduled row pass: enough to even out power-law rows.
constexpr int64_t kChunksPerThread = 8;
// A row costs about this many edges' worth of work besides its edges (its output write).
constexpr int64_t kRowWork = 1;
// Bound on the per-thread source histograms of transpose_block (entries, 8 bytes each).
constexpr int64_t kTransposeHistEntries = int64_t{8} << 20;

// n_parts + 1 ascending row bounds splitting the rows of a CSR ptr[0..n_rows] into parts of
// about equal edges + kRowWork * rows (the first at 0, the last at n_rows). A malformed
// (decreasing) ptr still yields valid, ordered bounds.
std::vector<int64_t> balanced_bounds(const int64_t* ptr, int64_t n_rows, int64_t n_parts) {
  std::vector<int64_t> bounds(n_parts + 1, n_rows);
  bounds[0] = 0;
  const int64_t edges = n_rows > 0 ? std::max<int64_t>(0, ptr[n_rows] - ptr[0]) : 0;
  const int64_t work = edges + kRowWork * n_rows;
  for (int64_t c = 1; c < n_parts; ++c) {
    // Smallest row r >= bounds[c-1] with ptr[r] - ptr[0] + kRowWork * r >= c * work / n.
    const int64_t target = work / n_parts * c + work % n_parts * c / n_parts;
    int64_t lo = bounds[c - 1], hi = n_rows;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (ptr[mid] - ptr[0] + kRowWork * mid < target) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    bounds[c] = lo;
  }
  return bounds;
}

// Balanced chunks of a pass over the rows of a CSR ptr[0..n_rows]: chunk c is the rows
// [bounds[c], bounds[c+1]) (see balanced_bounds); bytes_per_edge sizes the thread count, and
// with several threads there are kChunksPerThread chunks per thread, taken dynamically.
struct RowChunks {
  std::vector<int64_t> bounds;
  int threads = 1;

  RowChunks(const int64_t* ptr, int64_t n_rows, int64_t bytes_per_edge) {
    const int64_t edges = n_rows > 0 ? std::max<int64_t>(0, ptr[n_rows] - ptr[0]) : 0;
    const int64_t bytes = (edges + kRowWork * n_rows) * std::max<int64_t>(1, bytes_per_edge);
    threads = threads_for(bytes, kGrainBytes);
    const int64_t n_chunks = std::max<int64_t>(
        1, std::min<int64_t>(n_rows, threads == 1 ? 1 : threads * kChunksPerThread));
    bounds = balanced_bounds(ptr, n_rows, n_chunks);
  }

  int64_t size() const { return static_cast<int64_t>(bounds.size()) - 1; }
};

// Runs body(row) for every row, chunks taken dynamically by the threads; returns the number of
// rows for which body returned false (a malformed row). First, in the same parallel region
// (a region start is costly on a loaded machine), runs prologue(i) for i < n_prologue, split
// statically, and waits for all of it.
template <class Body, class Prologue>
int64_t for_rows(const RowChunks& chunks, Body body, int64_t n_prologue, Prologue prologue) {
  int64_t failed = 0;
  const int64_t n_chunks = chunks.size();
  const int64_t* bounds = chunks.bounds.data();
#pragma omp parallel num_threads(chunks.threads) reduction(+ : failed)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_prologue; ++i) prologue(i);
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < n_chunks; ++c)
      for (int64_t r = bounds[c]; r < bounds[c + 1]; ++r) failed += body(r) ? 0 : 1;
  }
  return failed;
}

template <class Body>
int64_t for_rows(const RowChunks& chunks, Body body) {
  return for_rows(chunks, body, 0, [](int64_t) {});
}

// n_src < 0: the kernel reads no source indices.
[[noreturn]] void throw_bad_csr(int64_t bad_rows, int64_t n_src) {
  std::string what = std::to_string(bad_rows) +
                     " destination row(s) have a decreasing indptr or an edge range outside "
                     "[0, len(indices))";
  if (n_src >= 0) what += " or a source index outside [0, n_src=" + std::to_string(n_src) + ")";
  throw std::out_of_range(what);
}

inline bool in_range(int64_t u, int64_t n) {
  return static_cast<uint64_t>(u) < static_cast<uint64_t>(n);
}

// Row v's edge range lies in [0, n_edges) and is not reversed (checked before it is read).
inline bool valid_range(const int64_t* indptr, int64_t v, int64_t n_edges) {
  return 0 <= indptr[v] && indptr[v] <= indptr[v + 1] && indptr[v + 1] <= n_edges;
}

// A valid CSR row whose sources lie in [0, n_src) (checked before the row is written).
inline bool valid_row(const int64_t* indptr, const int64_t* indices, int64_t v, int64_t n_edges,
                      int64_t n_src) {
  if (!valid_range(indptr, v, n_edges)) return false;
  const int64_t b = indptr[v], e = indptr[v + 1];
  bool ok = true;
  for (int64_t k = b; k < e; ++k) ok &= in_range(indices[k], n_src);
  return ok;
}

// ---- gathering rows (SIMD over the feature dimension) ----------------------------------------
//
// An output row is accumulated in place (it stays in L1 while its neighbour rows stream
// through once each, every row read front to back). A row of H heads x D features takes one
// weight per (edge, head), broadcast over the head's D SIMD lanes: the paper's "broadcast
// support" (H = 1 and weight 1 for plain sums).

// The neighbours of one output row: row u of the source matrix starts at x + u * ld; edge k
// reads row nbr[k] with, for head h, the weight w[(w_idx ? w_idx[k] : k) * w_stride + h]
// (1 when w is null). Prefetching looks at nbr[k] for k < pf_cnt (>= cnt: the entries after
// this row's), `ahead` entries ahead, and fetches the first pf_len floats of those rows.
struct Neighbours {
  const float* x;
  int64_t ld;
  const int64_t* nbr;
  int64_t cnt;
  int64_t pf_cnt = 0;
  int64_t pf_len = 0;
  int64_t ahead = 0;
  const float* w = nullptr;
  const int64_t* w_idx = nullptr;
  int64_t w_stride = 1;

  float weight(int64_t k, int64_t h) const {
    return w ? w[(w_idx ? w_idx[k] : k) * w_stride + h] : 1.0f;
  }
  [[gnu::always_inline]] void prefetch(int64_t k) const {
    if (k + ahead < pf_cnt) prefetch_row(x + nbr[k + ahead] * ld, pf_len);
  }
};

// o[h * D + d] = scale * (init_scale * init[h * D + d] + sum_k weight(k, h) * row_k[h * D + d])
// for h < heads, d < dim (init optional; o must not alias the source rows).
inline void gather_row(const Neighbours& nb, int64_t heads, int64_t dim, const float* init,
                       float init_scale, float scale, float* __restrict o) {
  const int64_t n = heads * dim;
  if (init) {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) o[f] = init_scale * init[f];
  } else {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) o[f] = 0.0f;
  }
  for (int64_t k = 0; k < nb.cnt; ++k) {
    nb.prefetch(k);
    const float* __restrict r = nb.x + nb.nbr[k] * nb.ld;
    if (heads == 1) {
      const float w = nb.weight(k, 0);
#pragma omp simd
      for (int64_t f = 0; f < n; ++f) o[f] += w * r[f];
    } else {
      for (int64_t h = 0; h < heads; ++h) {
        const float w = nb.weight(k, h);  // broadcast over the head's D lanes
        float* __restrict oh = o + h * dim;
        const float* __restrict rh = r + h * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) oh[d] += w * rh[d];
      }
    }
  }
  if (scale != 1.0f) {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) o[f] *= scale;
  }
}

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

// ---- transposed CSR -------------------------------------------------------------------------

void transpose_block(const int64_t* indptr, const int64_t* indices, int64_t n_dst, int64_t n_src,
                     BlockTranspose& out) {
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  out.indptr.assign(n_src + 1, 0);
  out.edges.resize(n_edges);
  out.dst.resize(n_edges);
  int64_t* ptr = out.indptr.data();
  int64_t* t_edges = out.edges.data();
  int64_t* t_dst = out.dst.data();

  // A stable counting sort of the edges by source, atomic-free (locked increments would
  // serialise the cache misses of the random counter updates). The destination rows are cut
  // into `slices` consecutive ranges of about equal edges, one per thread; each slice counts
  // its sources in a private histogram, the histograms become per-slice write cursors, and
  // each slice scatters its edges in order, so every segment lists its edges in ascending
  // order whatever the thread count. The histograms cost slices * n_src entries, capped by
  // kTransposeHistEntries. One parallel region: on a loaded machine every region start waits
  // for the scheduler to run a sleeping worker.
  const RowChunks rows(indptr, n_dst, 4 * sizeof(int64_t));
  const int64_t slices = std::max<int64_t>(
      1, std::min<int64_t>(rows.threads, kTransposeHistEntries / std::max<int64_t>(1, n_src)));
  const std::vector<int64_t> cut = balanced_bounds(indptr, n_dst, slices);
  // Slice s's counts, then cursors (uninitialised: each slice zeroes its own, in parallel).
  std::unique_ptr<int64_t[]> hist(new int64_t[slices * n_src]);
  std::vector<int64_t> block_sum(slices + 1, 0);  // the parallel scan's per-thread totals
  int64_t bad = 0;  // malformed rows (shared)

#pragma omp parallel num_threads(static_cast<int>(slices))
  {
    // Slices go round-robin to the threads the runtime grants (normally one each).
    const int64_t tid = omp_get_thread_num(), nt = omp_get_num_threads();
    // 1. Count the sources of each slice's edges, validating the CSR.
    int64_t my_bad = 0;
    for (int64_t t = tid; t < slices; t += nt) {
      int64_t* h = hist.get() + t * n_src;
      std::fill(h, h + n_src, 0);
      for (int64_t v = cut[t]; v < cut[t + 1]; ++v) {
        if (!valid_row(indptr, indices, v, n_edges, n_src)) {
          ++my_bad;
          continue;
        }
        for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) ++h[indices[e]];
      }
    }
    if (my_bad) {
#pragma omp atomic
      bad += my_bad;
    }
#pragma omp barrier
    // 2. Per source: counts -> cursors relative to the segment start; ptr[u] = the total.
    //    Then an exclusive scan of ptr over static blocks (one per thread).
    const int64_t lo = n_src * tid / nt, hi = n_src * (tid + 1) / nt;
    int64_t total = 0;
    for (int64_t u = lo; u < hi; ++u) {
      int64_t run = 0;
      for (int64_t s = 0; s < slices; ++s) {
        const int64_t c = hist[s * n_src + u];
        hist[s * n_src + u] = run;
        run += c;
      }
      ptr[u] = run;
      total += run;
    }
    block_sum[tid + 1] = total;
#pragma omp barrier
#pragma omp single
    for (int64_t t = 0; t < nt; ++t) block_sum[t + 1] += block_sum[t];
    int64_t run = block_sum[tid];
    for (int64_t u = lo; u < hi; ++u) {
      const int64_t c = ptr[u];
      ptr[u] = run;
      run += c;
    }
#pragma omp barrier
    // 3. Scatter (edge, destination) pairs in edge order through each slice's cursors (skipped
    //    for a malformed CSR: the counts of its bad rows are missing).
    if (bad == 0) {
      for (int64_t t = tid; t < slices; t += nt) {
        int64_t* cursor = hist.get() + t * n_src;
        for (int64_t u = 0; u < n_src; ++u) cursor[u] += ptr[u];  // relative -> absolute
        for (int64_t v = cut[t]; v < cut[t + 1]; ++v) {
          for (int64_t e = indptr[v]; e < indptr[v + 1]; ++e) {
            const int64_t p = cursor[indices[e]]++;
            t_edges[p] = e;
            t_dst[p] = v;
          }
        }
      }
    }
  }
  ptr[n_src] = n_edges;
  if (bad) throw_bad_csr(bad, n_src);
}

// ---- mean / sum / gcn --------------------------------------------------------------------------

void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const float* x, int64_t dim, AggKind kind, float* out) {
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  const int64_t ahead = prefetch_rows(dim);
  const RowChunks rows(indptr, n_dst, dim * sizeof(float));
  const int64_t bad = for_rows(rows, [&](int64_t v) {
    if (!valid_row(indptr, indices, v, n_edges, n_src)) return false;
    const int64_t b = indptr[v], deg = indptr[v + 1] - b;
    Neighbours nb{x, dim, indices + b, deg};
    nb.pf_cnt = n_edges - b;
    nb.pf_len = dim;
    nb.ahead = ahead;
    const float* self = kind == AggKind::kGcn ? x + v * dim : nullptr;
    gather_row(nb, 1, dim, self, 1.0f, agg_scale(kind, deg), out + v * dim);
    return true;
  });
  if (bad) throw_bad_csr(bad, n_src);
}

void aggregate_backward(const int64_t* indptr, int64_t n_dst, const int64_t* t_indptr,
                        const int64_t* t_dst, int64_t n_src, const float* grad_out, int64_t dim,
                        AggKind kind, const float* addend, int64_t n_addend, float* grad_x) {
  // grad_x[u] = sum_{edges u -> v} scale[v] * grad_out[v]  (+ scale[u] * grad_out[u], gcn)
  //             (+ addend[u], u < n_addend).
  std::vector<float> scale(n_dst);
  const int64_t ahead = prefetch_rows(dim);
  const RowChunks srcs(t_indptr, n_src, dim * sizeof(float));
  const auto set_scale = [&](int64_t v) {
    scale[v] = agg_scale(kind, indptr[v + 1] - indptr[v]);
  };
  const auto gather = [&](int64_t u) {
    const int64_t b = t_indptr[u];
    Neighbours nb{grad_out, dim, t_dst + b, t_indptr[u + 1] - b};
    nb.pf_cnt = t_indptr[n_src] - b;
    nb.pf_len = dim;
    nb.ahead = ahead;
    if (kind != AggKind::kSum) {
      nb.w = scale.data();
      nb.w_idx = t_dst + b;
    }
    const bool self = kind == AggKind::kGcn && u < n_dst;
    float* __restrict o = grad_x + u * dim;
    gather_row(nb, 1, dim, self ? grad_out + u * dim : nullptr, self ? scale[u] : 0.0f, 1.0f, o);
    if (u < n_addend) {
      const float* __restrict a = addend + u * dim;
#pragma omp simd
      for (int64_t f = 0; f < dim; ++f) o[f] += a[f];
    }
    return true;
  };
  for_rows(srcs, gather, kind == AggKind::kSum ? 0 : n_dst, set_scale);
}

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

// ---- memory bandwidth reference --------------------------------------------------------------

void stream_copy(const float* src, int64_t n, float* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace distmb
