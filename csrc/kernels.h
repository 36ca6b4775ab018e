// Declarations of the distmb C++ kernels. Kernels work on raw buffers and std::vector
// outputs; csrc/bindings.cpp is the only file that knows about Python.
#pragma once

#include <cstdint>
#include <vector>

namespace distmb {

// ---- graph.cpp: graph construction ---------------------------------------------------

struct CsrBuildStats {
  int64_t self_loops = 0;   // input edges with src == dst that were dropped
  int64_t duplicates = 0;   // CSR entries merged because the same (src, dst) occurred again
};

// build_in_csr: COO edges src[e] -> dst[e] over vertices [0, num_nodes) to the CSR of
// in-edges: indices[indptr[v] .. indptr[v+1]) are the distinct sources of v, ascending.
// With symmetrize every edge also yields dst -> src. With drop_self_loops, v -> v is dropped.
// Throws std::out_of_range naming the first edge whose endpoint is outside [0, num_nodes).
// Output is independent of the thread count.
CsrBuildStats build_in_csr(const int64_t* src, const int64_t* dst, int64_t num_edges,
                           int64_t num_nodes, bool symmetrize, bool drop_self_loops,
                           std::vector<int64_t>& indptr, std::vector<int64_t>& indices);

// ---- partition.cpp: per-part views of a partitioned graph ------------------------------

struct PartView {
  std::vector<int64_t> solid;     // VID_o of the part's solid vertices, ascending (VID_p order)
  std::vector<int64_t> halo;      // VID_o of its halo vertices, ascending
  std::vector<int64_t> indptr;    // [n_solid + 1]: in-edge CSR of the solid vertices
  std::vector<int64_t> indices;   // sources as VID_p: solid in [0, n_solid), halo after
  int64_t cut_edges = 0;          // in-edges whose source lives in another part
};

// extract_part: given the whole graph's in-edge CSR (indptr[n+1], indices) and part_of[n]
// (owner of every vertex), build part p's local view. scratch[n] must be all -1 on entry and
// is all -1 again on return (it maps VID_o -> VID_p while the kernel runs).
void extract_part(const int64_t* indptr, const int64_t* indices, int64_t num_nodes,
                  const int32_t* part_of, int32_t part, int64_t* scratch, PartView& out);

}  // namespace distmb
