// Partition kernels: the local view (solid, halo, relabelled in-edge CSR) of one part of a
// partitioned graph, thread-parallel, O(num_nodes + edges of the part).
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "common.h"
#include "partition.h"

namespace distmb {

namespace {
constexpr int64_t kUnmapped = -1;    // scratch entry of a vertex not in this part's view
constexpr int64_t kHaloMark = -2;    // scratch entry of a foreign source seen in an in-edge

// Relabel the part's in-edges into out_indices (VID_p through scratch).
template <class I, class O>
void relabel_edges(const int64_t* indptr, const I* indices, const PartView& view,
                   const int64_t* scratch, std::vector<O>& out_indices) {
  const int64_t n_solid = static_cast<int64_t>(view.solid.size());
  out_indices.resize(view.indptr[n_solid]);
#pragma omp parallel for schedule(dynamic, 256)
  for (int64_t i = 0; i < n_solid; ++i) {
    const int64_t v = view.solid[i];
    int64_t w = view.indptr[i];
    for (int64_t k = indptr[v]; k < indptr[v + 1]; ++k)
      out_indices[w++] = static_cast<O>(scratch[indices[k]]);
  }
}
}  // namespace

template <class I>
void extract_part(const int64_t* indptr, const I* indices, int64_t num_nodes,
                  const int32_t* part_of, int32_t part, int64_t* scratch, PartView& out) {
  // Solid vertices in VID_o order; VID_p = position.
  out.solid = compact_where(num_nodes, [&](int64_t v) { return part_of[v] == part; });
  const int64_t n_solid = static_cast<int64_t>(out.solid.size());

  // Local in-degree -> local indptr.
  out.indptr.assign(n_solid + 1, 0);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_solid; ++i) {
    const int64_t v = out.solid[i];
    out.indptr[i] = indptr[v + 1] - indptr[v];
  }
  exclusive_scan_inplace(out.indptr.data(), n_solid + 1);

  // Mark foreign sources (all writers store the same value; relaxed atomics keep it defined).
  int64_t cut = 0;
#pragma omp parallel for schedule(dynamic, 256) reduction(+ : cut)
  for (int64_t i = 0; i < n_solid; ++i) {
    const int64_t v = out.solid[i];
    for (int64_t k = indptr[v]; k < indptr[v + 1]; ++k) {
      const int64_t u = indices[k];
      if (part_of[u] != part) {
        ++cut;
        __atomic_store_n(&scratch[u], kHaloMark, __ATOMIC_RELAXED);
      }
    }
  }
  out.cut_edges = cut;
  out.halo = compact_where(num_nodes, [&](int64_t v) { return scratch[v] == kHaloMark; });
  const int64_t n_halo = static_cast<int64_t>(out.halo.size());

  // VID_o -> VID_p in scratch, relabel the edges, then restore scratch.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_solid; ++i) scratch[out.solid[i]] = i;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n_halo; ++j) scratch[out.halo[j]] = n_solid + j;

  out.indices32.clear();
  out.indices64.clear();
  out.wide = n_solid + n_halo > std::numeric_limits<int32_t>::max();
  if (!out.wide)
    relabel_edges(indptr, indices, out, scratch, out.indices32);
  else
    relabel_edges(indptr, indices, out, scratch, out.indices64);

#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n_solid; ++i) scratch[out.solid[i]] = kUnmapped;
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < n_halo; ++j) scratch[out.halo[j]] = kUnmapped;
}

template void extract_part<int32_t>(const int64_t*, const int32_t*, int64_t, const int32_t*,
                                    int32_t, int64_t*, PartView&);
template void extract_part<int64_t>(const int64_t*, const int64_t*, int64_t, const int32_t*,
                                    int32_t, int64_t*, PartView&);

}  // namespace distmb
