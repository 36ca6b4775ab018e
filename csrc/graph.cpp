// Graph construction kernels: COO -> in-edge CSR with symmetrisation, self-loop removal and
// de-duplication, thread-parallel and deterministic (rows are sorted after the scatter).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "common.h"
#include "kernels.h"
#include "rng.h"

namespace distmb {

// build_in_csr compacts in place while duplicates are at most 1/kInPlaceCompactDivisor of the
// scattered entries (the slack it then keeps), else into a right-sized copy.
constexpr int64_t kInPlaceCompactDivisor = 8;

CsrBuildStats build_in_csr(const int64_t* src, const int64_t* dst, int64_t num_edges,
                           int64_t num_nodes, bool symmetrize, bool drop_self_loops,
                           std::vector<int64_t>& indptr, std::vector<int64_t>& indices) {
  if (num_nodes < 0) throw std::invalid_argument("num_nodes must be >= 0");
  CsrBuildStats stats;

  // 1. Validate endpoints; report the first offending edge.
  int64_t first_bad = num_edges;
#pragma omp parallel for reduction(min : first_bad) schedule(static)
  for (int64_t e = 0; e < num_edges; ++e) {
    if (src[e] < 0 || src[e] >= num_nodes || dst[e] < 0 || dst[e] >= num_nodes)
      first_bad = std::min(first_bad, e);
  }
  if (first_bad < num_edges) {
    throw std::out_of_range("edge " + std::to_string(first_bad) + " (" +
                            std::to_string(src[first_bad]) + " -> " +
                            std::to_string(dst[first_bad]) + ") has an endpoint outside [0, " +
                            std::to_string(num_nodes) + ")");
  }

  // 2. In-degree counts (before de-duplication).
  std::vector<int64_t> pos(num_nodes + 1, 0);
  int64_t self_loops = 0;
#pragma omp parallel for reduction(+ : self_loops) schedule(static)
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t s = src[e], d = dst[e];
    if (s == d) {
      ++self_loops;
      if (drop_self_loops) continue;
    }
#pragma omp atomic
    pos[d] += 1;
    if (symmetrize && s != d) {
#pragma omp atomic
      pos[s] += 1;
    }
  }
  stats.self_loops = self_loops;
  const int64_t total = exclusive_scan_inplace(pos.data(), num_nodes + 1);
  std::vector<int64_t> raw_ptr(pos);  // row starts of the un-deduplicated rows

  // 3. Scatter sources into their destination's row (order fixed by the sort below).
  std::vector<int64_t> raw(total);
#pragma omp parallel for schedule(static)
  for (int64_t e = 0; e < num_edges; ++e) {
    const int64_t s = src[e], d = dst[e];
    if (s == d && drop_self_loops) continue;
    int64_t p;
#pragma omp atomic capture
    p = pos[d]++;
    raw[p] = s;
    if (symmetrize && s != d) {
#pragma omp atomic capture
      p = pos[s]++;
      raw[p] = d;
    }
  }

  // 4. Sort and de-duplicate each row in place; keep the distinct count.
  std::vector<int64_t> distinct(num_nodes + 1, 0);
#pragma omp parallel for schedule(dynamic, 512)
  for (int64_t v = 0; v < num_nodes; ++v) {
    int64_t* b = raw.data() + raw_ptr[v];
    int64_t* e = raw.data() + raw_ptr[v + 1];
    std::sort(b, e);
    distinct[v] = std::unique(b, e) - b;
  }
  const int64_t kept = exclusive_scan_inplace(distinct.data(), num_nodes + 1);
  stats.duplicates = total - kept;

  // 5. Compact into the final arrays. With few duplicates, in place: row v moves left from
  //    raw_ptr[v] to distinct[v] <= raw_ptr[v], in ascending v, so every row lands on entries
  //    already read (sequential; only rows after the first duplicate move). The buffer keeps
  //    its capacity (the duplicates' slack) but no second copy of the edges is ever held.
  //    With many duplicates, a right-sized copy costs less memory from then on.
  if (stats.duplicates <= total / kInPlaceCompactDivisor) {
    int64_t v = 0;
    while (v < num_nodes && distinct[v + 1] == raw_ptr[v + 1]) ++v;  // rows already in place
    for (; v < num_nodes; ++v) {
      const int64_t n = distinct[v + 1] - distinct[v];
      if (distinct[v] != raw_ptr[v])  // dest < source: a forward copy is safe
        std::copy_n(raw.data() + raw_ptr[v], n, raw.data() + distinct[v]);
    }
    raw.resize(kept);
    indices.swap(raw);
  } else {
    indices.resize(kept);
#pragma omp parallel for schedule(dynamic, 512)
    for (int64_t v = 0; v < num_nodes; ++v) {
      const int64_t n = distinct[v + 1] - distinct[v];
      std::copy_n(raw.data() + raw_ptr[v], n, indices.data() + distinct[v]);
    }
  }
  indptr.swap(distinct);
  return stats;
}

void sparsify_symmetric(const int64_t* indptr, const int64_t* indices, int64_t num_nodes,
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

}  // namespace distmb
