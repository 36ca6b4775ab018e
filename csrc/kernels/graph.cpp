// Graph construction kernels: COO edges -> in-edge CSR, built chunk by chunk in arrays the
// caller owns (count, scatter, finish; distmb/data/csr.py drives them), thread-parallel and
// deterministic (rows are sorted after the scatter); and the edge sampling of METIS' input.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common.h"
#include "graph.h"
#include "rng.h"

namespace distmb {

namespace {

// The first edge of src/dst[0..m) with an endpoint outside [0, num_nodes), or m.
template <class S>
int64_t first_edge_out_of_range(const S* src, const S* dst, int64_t m, int64_t num_nodes) {
  int64_t first_bad = m;
#pragma omp parallel for reduction(min : first_bad) schedule(static)
  for (int64_t e = 0; e < m; ++e) {
    const int64_t s = src[e], d = dst[e];
    if (s < 0 || s >= num_nodes || d < 0 || d >= num_nodes) first_bad = std::min(first_bad, e);
  }
  return first_bad;
}

template <class S>
void throw_out_of_range(const S* src, const S* dst, int64_t e, int64_t first_edge,
                        int64_t num_nodes) {
  throw std::out_of_range("edge " + std::to_string(first_edge + e) + " (" +
                          std::to_string(static_cast<int64_t>(src[e])) + " -> " +
                          std::to_string(static_cast<int64_t>(dst[e])) +
                          ") has an endpoint outside [0, " + std::to_string(num_nodes) + ")");
}

}  // namespace

template <class S>
int64_t csr_count_edges(const S* src, const S* dst, int64_t m, int64_t num_nodes,
                        bool symmetrize, bool drop_self_loops, int64_t first_edge,
                        int64_t* counts) {
  const int64_t bad = first_edge_out_of_range(src, dst, m, num_nodes);
  if (bad < m) throw_out_of_range(src, dst, bad, first_edge, num_nodes);
  int64_t self_loops = 0;
#pragma omp parallel for reduction(+ : self_loops) schedule(static)
  for (int64_t e = 0; e < m; ++e) {
    const int64_t s = src[e], d = dst[e];
    if (s == d) {
      ++self_loops;
      if (drop_self_loops) continue;
    }
#pragma omp atomic
    counts[d + 1] += 1;
    if (symmetrize && s != d) {
#pragma omp atomic
      counts[s + 1] += 1;
    }
  }
  return self_loops;
}

template <class S, class I>
void csr_scatter_edges(const S* src, const S* dst, int64_t m, int64_t num_nodes,
                       bool symmetrize, bool drop_self_loops, int64_t first_edge,
                       int64_t* cursor, I* indices, int64_t capacity) {
  const int64_t bad = first_edge_out_of_range(src, dst, m, num_nodes);
  if (bad < m) throw_out_of_range(src, dst, bad, first_edge, num_nodes);
  int64_t overflow = 0;
#pragma omp parallel for reduction(+ : overflow) schedule(static)
  for (int64_t e = 0; e < m; ++e) {
    const int64_t s = src[e], d = dst[e];
    if (s == d && drop_self_loops) continue;
    int64_t p;
#pragma omp atomic capture
    p = cursor[d]++;
    if (p < capacity) indices[p] = static_cast<I>(s); else ++overflow;
    if (symmetrize && s != d) {
#pragma omp atomic capture
      p = cursor[s]++;
      if (p < capacity) indices[p] = static_cast<I>(d); else ++overflow;
    }
  }
  if (overflow)
    throw std::logic_error("csr_scatter_edges: the chunks hold more edges than were counted");
}

template <class I>
int64_t csr_finish(int64_t* cursor, int64_t num_nodes, I* indices) {
  // After the scatter cursor[v] is the end of row v; shift it into row starts.
  const int64_t total = cursor[num_nodes];
  std::memmove(cursor + 1, cursor, sizeof(int64_t) * num_nodes);
  cursor[0] = 0;
  if (cursor[num_nodes] != total)
    throw std::logic_error("csr_finish: the chunks hold fewer edges than were counted");
  std::vector<int64_t> distinct(num_nodes + 1, 0);
#pragma omp parallel for schedule(dynamic, 512)
  for (int64_t v = 0; v < num_nodes; ++v) {
    I* b = indices + cursor[v];
    I* e = indices + cursor[v + 1];
    std::sort(b, e);
    distinct[v] = std::unique(b, e) - b;
  }
  const int64_t kept = exclusive_scan_inplace(distinct.data(), num_nodes + 1);
  if (kept < total) {
    // Rows move towards the front, in order, so no row is overwritten before it moved.
    for (int64_t v = 0; v < num_nodes; ++v) {
      const int64_t n = distinct[v + 1] - distinct[v];
      if (distinct[v] != cursor[v])
        std::memmove(indices + distinct[v], indices + cursor[v], sizeof(I) * n);
    }
  }
  std::copy(distinct.begin(), distinct.end(), cursor);
  return kept;
}

template <class I>
void sparsify_symmetric(const int64_t* indptr, const I* indices, int64_t num_nodes,
                        double keep_fraction, uint64_t seed, std::vector<int64_t>& out_indptr,
                        std::vector<int64_t>& out_indices) {
  auto keep = [&](int64_t u, int64_t v) {
    const int64_t lo = u < v ? u : v, hi = u < v ? v : u;
    return to_unit(hash_key(seed, static_cast<uint64_t>(lo), static_cast<uint64_t>(hi))) <
           keep_fraction;
  };
  out_indptr.assign(num_nodes + 1, 0);
#pragma omp parallel for schedule(dynamic, 1024)
  for (int64_t v = 0; v < num_nodes; ++v) {
    int64_t c = 0;
    for (int64_t k = indptr[v]; k < indptr[v + 1]; ++k) c += keep(indices[k], v) ? 1 : 0;
    out_indptr[v] = c;
  }
  const int64_t total = exclusive_scan_inplace(out_indptr.data(), num_nodes + 1);
  out_indices.resize(total);
#pragma omp parallel for schedule(dynamic, 1024)
  for (int64_t v = 0; v < num_nodes; ++v) {
    int64_t w = out_indptr[v];
    for (int64_t k = indptr[v]; k < indptr[v + 1]; ++k)
      if (keep(indices[k], v)) out_indices[w++] = indices[k];
  }
}

#define DISTMB_CSR_COUNT(S)                                                                   \
  template int64_t csr_count_edges<S>(const S*, const S*, int64_t, int64_t, bool, bool,     \
                                      int64_t, int64_t*);
DISTMB_CSR_COUNT(int32_t)
DISTMB_CSR_COUNT(int64_t)
#undef DISTMB_CSR_COUNT
#define DISTMB_CSR_SCATTER(S, I)                                                              \
  template void csr_scatter_edges<S, I>(const S*, const S*, int64_t, int64_t, bool, bool,    \
                                        int64_t, int64_t*, I*, int64_t);
DISTMB_CSR_SCATTER(int32_t, int32_t)
DISTMB_CSR_SCATTER(int32_t, int64_t)
DISTMB_CSR_SCATTER(int64_t, int32_t)
DISTMB_CSR_SCATTER(int64_t, int64_t)
#undef DISTMB_CSR_SCATTER
template int64_t csr_finish<int32_t>(int64_t*, int64_t, int32_t*);
template int64_t csr_finish<int64_t>(int64_t*, int64_t, int64_t*);
template void sparsify_symmetric<int32_t>(const int64_t*, const int32_t*, int64_t, double,
                                          uint64_t, std::vector<int64_t>&,
                                          std::vector<int64_t>&);
template void sparsify_symmetric<int64_t>(const int64_t*, const int64_t*, int64_t, double,
                                          uint64_t, std::vector<int64_t>&,
                                          std::vector<int64_t>&);

}  // namespace distmb
