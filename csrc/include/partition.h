// Per-part views of a partitioned graph (csrc/kernels/partition.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <vector>

namespace distmb {

struct PartView {
  std::vector<int64_t> solid;     // VID_o of the part's solid vertices, ascending (VID_p order)
  std::vector<int64_t> halo;      // VID_o of its halo vertices, ascending
  std::vector<int64_t> indptr;    // [n_solid + 1]: in-edge CSR of the solid vertices
  // Sources as VID_p (solid in [0, n_solid), halo after): indices32 when n_local <= INT32_MAX,
  // else indices64 (the other one stays empty).
  std::vector<int32_t> indices32;
  std::vector<int64_t> indices64;
  bool wide = false;              // true: indices64 holds them
  int64_t cut_edges = 0;          // in-edges whose source lives in another part
};

// extract_part: given the whole graph's in-edge CSR (indptr[n+1], indices of type I: int32_t
// or int64_t) and part_of[n] (owner of every vertex), build part p's local view. scratch[n]
// must be all -1 on entry and is all -1 again on return (it maps VID_o -> VID_p while the
// kernel runs).
template <class I>
void extract_part(const int64_t* indptr, const I* indices, int64_t num_nodes,
                  const int32_t* part_of, int32_t part, int64_t* scratch, PartView& out);

}  // namespace distmb
