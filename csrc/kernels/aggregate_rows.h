// Row scheduling, CSR validation and row gathering shared by the fused AGG kernels (internal to
// csrc/kernels/aggregate*.cpp; their contracts are in aggregate.h).
//
// Every pass writes each output row from exactly one thread. Forward passes run over the
// destinations' CSR; backward passes that produce per-source rows gather over the block's
// transposed CSR (sources -> edges, built once per block by transpose_block), so no pass adds
// features atomically. Rows are split into chunks of about equal edges + rows (power-law
// degrees) that threads take dynamically. Sums run in CSR / transposed-CSR order, so results do
// not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "aggregate.h"
#include "common.h"

namespace distmb {
namespace aggregate_detail {

// ---- scheduling ----------------------------------------------------------------------------

// Minimum bytes a pass moves per OpenMP thread (below it the pass uses fewer threads: a
// fork/join costs microseconds, far more when the cores are oversubscribed).
constexpr int64_t kGrainBytes = 256 << 10;
// Chunks per thread of a dynamically scheduled row pass: enough to even out power-law rows.
constexpr int64_t kChunksPerThread = 8;
// A row costs about this many edges' worth of work besides its edges (its output write).
constexpr int64_t kRowWork = 1;

// n_parts + 1 ascending row bounds splitting the rows of a CSR ptr[0..n_rows] into parts of
// about equal edges + kRowWork * rows (the first at 0, the last at n_rows). A malformed
// (decreasing) ptr still yields valid, ordered bounds.
inline std::vector<int64_t> balanced_bounds(const int64_t* ptr, int64_t n_rows, int64_t n_parts) {
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
[[noreturn]] inline void throw_bad_csr(int64_t bad_rows, int64_t n_src) {
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

// ---- stored values -> float32 (exact: every bfloat16 and half value is a float32 value) ---

inline float to_float(float v) { return v; }

// bfloat16 is float32's upper half.
inline float to_float(Bf16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE half: the exponent and significand moved into float32's fields (<< 13) and the
// exponent rebiased by a multiplication by 2^112 (2^(127 - 15)), which also normalises a
// subnormal half; infinities and NaNs (exponent all ones) get float32's all-ones exponent.
// Branch-free, so the row loops stay vectorised.
inline float to_float(Half v) {
  const uint32_t h = v.bits;
  const uint32_t magnitude = (h & 0x7fffu) << 13;
  float f;
  std::memcpy(&f, &magnitude, sizeof f);
  f *= 0x1p112f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = (h & 0x7c00u) == 0x7c00u ? (magnitude | 0x7f800000u) : u;
  u |= (h & 0x8000u) << 16;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The neighbours of one output row: row u of the source matrix (values of type T: float, or
// two bytes a value read through to_float) starts at x + u * ld; edge k
// reads row nbr[k] with, for head h, the weight w[(w_idx ? w_idx[k] : k) * w_stride + h]
// (1 when w is null). Prefetching looks at nbr[k] for k < pf_cnt (>= cnt: the entries after
// this row's), `ahead` entries ahead, and fetches the first pf_len values of those rows.
template <class T>
struct RowsOf {
  const T* x;
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
    if (k + ahead < pf_cnt) {
      // prefetch_row counts floats: the row's bytes in floats (at least one).
      const int64_t floats = std::max<int64_t>(1, pf_len * int64_t(sizeof(T)) / 4);
      prefetch_row(reinterpret_cast<const float*>(x + nbr[k + ahead] * ld), floats);
    }
  }
};
using Neighbours = RowsOf<float>;

// T itself, in a context where it is not deduced (C++20's std::type_identity_t): the rows
// decide T, and a null init needs no cast.
template <class T>
struct NotDeduced {
  using type = T;
};

// o[h * D + d] = scale * (init_scale * init[h * D + d] + sum_k weight(k, h) * row_k[h * D + d])
// for h < heads, d < dim (init optional, of the rows' type; o must not alias the source rows).
template <class T>
inline void gather_row(const RowsOf<T>& nb, int64_t heads, int64_t dim,
                       const typename NotDeduced<T>::type* init,
                       float init_scale, float scale, float* __restrict o) {
  const int64_t n = heads * dim;
  if (init) {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) o[f] = init_scale * to_float(init[f]);
  } else {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) o[f] = 0.0f;
  }
  for (int64_t k = 0; k < nb.cnt; ++k) {
    nb.prefetch(k);
    const T* __restrict r = nb.x + nb.nbr[k] * nb.ld;
    if (heads == 1) {
      const float w = nb.weight(k, 0);
#pragma omp simd
      for (int64_t f = 0; f < n; ++f) o[f] += w * to_float(r[f]);
    } else {
      for (int64_t h = 0; h < heads; ++h) {
        const float w = nb.weight(k, h);  // broadcast over the head's D lanes
        float* __restrict oh = o + h * dim;
        const T* __restrict rh = r + h * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) oh[d] += w * to_float(rh[d]);
      }
    }
  }
  if (scale != 1.0f) {
#pragma omp simd
    for (int64_t f = 0; f < n; ++f) o[f] *= scale;
  }
}

}  // namespace aggregate_detail
}  // namespace distmb
