// Fused AGG kernels over a block's CSR (DistGNN-MB section 3.3, "Broadcast Support for AGG"),
// the unweighted family: mean / sum / gcn aggregation forward and backward, and the block's
// transposed CSR (transpose_block) that every backward pass gathers over; float32 features,
// int64 CSR; also stream_copy, the copy-bandwidth reference of the AGG benchmarks. The GAT
// family (edge softmax, attention logits, weighted aggregation) is in aggregate_gat.cpp; the
// row scheduling and gathering both use are in aggregate_rows.h.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "aggregate.h"
#include "aggregate_rows.h"
#include "common.h"

namespace distmb {

using namespace aggregate_detail;

namespace {

// Bound on the per-thread source histograms of transpose_block (entries, 8 bytes each).
constexpr int64_t kTransposeHistEntries = int64_t{8} << 20;

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

namespace {

// aggregate_forward over source rows of type T (float, or two bytes a value).
template <class T>
void aggregate_rows_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                            int64_t n_src, const T* x, int64_t dim, AggKind kind, float* out) {
  const int64_t n_edges = n_dst > 0 ? indptr[n_dst] : 0;
  // Rows ahead to prefetch, by the rows' bytes (in floats).
  const int64_t ahead = prefetch_rows(std::max<int64_t>(1, dim * int64_t(sizeof(T)) / 4));
  const RowChunks rows(indptr, n_dst, dim * sizeof(T));
  const int64_t bad = for_rows(rows, [&](int64_t v) {
    if (!valid_row(indptr, indices, v, n_edges, n_src)) return false;
    const int64_t b = indptr[v], deg = indptr[v + 1] - b;
    RowsOf<T> nb{x, dim, indices + b, deg};
    nb.pf_cnt = n_edges - b;
    nb.pf_len = dim;
    nb.ahead = ahead;
    const T* self = kind == AggKind::kGcn ? x + v * dim : nullptr;
    gather_row(nb, 1, dim, self, 1.0f, agg_scale(kind, deg), out + v * dim);
    return true;
  });
  if (bad) throw_bad_csr(bad, n_src);
}

}  // namespace

void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const float* x, int64_t dim, AggKind kind, float* out) {
  aggregate_rows_forward(indptr, indices, n_dst, n_src, x, dim, kind, out);
}

void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const Bf16* x, int64_t dim, AggKind kind, float* out) {
  aggregate_rows_forward(indptr, indices, n_dst, n_src, x, dim, kind, out);
}

void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const Half* x, int64_t dim, AggKind kind, float* out) {
  aggregate_rows_forward(indptr, indices, n_dst, n_src, x, dim, kind, out);
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

// ---- memory bandwidth reference --------------------------------------------------------------

void stream_copy(const float* src, int64_t n, float* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

}  // namespace distmb
