// Declarations of the distmb C++ kernels. Kernels work on raw buffers and std::vector
// outputs; csrc/bindings.cpp is the only file that knows about Python.
#pragma once

#include <cstdint>
#include <mutex>
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

// sparsify_symmetric: keep each undirected edge {u, v} of a symmetric in-edge CSR with
// probability keep_fraction, decided by a hash of (seed, min(u,v), max(u,v)), so both
// directions are kept or dropped together and the result is symmetric and deterministic.
void sparsify_symmetric(const int64_t* indptr, const int64_t* indices, int64_t num_nodes,
                        double keep_fraction, uint64_t seed, std::vector<int64_t>& out_indptr,
                        std::vector<int64_t>& out_indices);

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

// ---- sampler.cpp: thread-parallel multi-layer neighbour sampling -----------------------

// Fan-out meaning "every in-neighbour" (distmb.sampling.FANOUT_ALL).
constexpr int64_t kFanoutAll = -1;

// One block of a mini-batch (a bipartite graph sources -> destinations), local positions.
struct SampledBlock {
  int64_t n_dst = 0;              // destinations = src_ids[0 .. n_dst)
  int64_t n_halo = 0;             // the last n_halo sources are halo leaves
  std::vector<int64_t> indptr;    // [n_dst + 1]: CSR over destinations
  std::vector<int64_t> indices;   // [nnz]: source position in [0, n_src) of every edge
  std::vector<int64_t> src_ids;   // [n_src]: VID_p of the sources
};

// NeighborSamplerCore: uniform neighbour sampling without replacement over a part's local
// in-edge CSR (indptr[n_solid + 1]; indices int32 or int64, VID_p in [0, n_local); halo
// vertices VID_p >= n_solid have no rows and are leaves). The graph buffers are borrowed,
// not copied, and must outlive the object; they are validated once in the constructor
// (std::invalid_argument). Holds an n_local-entry scratch table reused by every call.
//
// sample(seeds, fanouts, seed, epoch, iteration): fanouts[0..L) from the input layer to the
// output layer (kFanoutAll allowed); returns L blocks, [0] = input layer. Block L-1 has the
// seeds as destinations; in block l the sources are [destinations | new solid neighbours in
// order of first appearance in edge order | halo neighbours likewise], and the solid sources
// of block l are the destinations of block l-1. Every destination takes min(degree, fan-out)
// distinct in-neighbours, uniformly over subsets, listed in CSR order. Draws come from a
// counter-based hash of (seed, epoch, iteration, layer, destination VID_p), so the output is
// independent of the thread count. Throws std::invalid_argument for an empty or invalid
// fanouts list and for seeds that are halo, out of range or repeated. Calls on one object
// are serialised by a mutex (the scratch table is shared).
class NeighborSamplerCore {
 public:
  NeighborSamplerCore(const int64_t* indptr, const int32_t* indices32, const int64_t* indices64,
                      int64_t n_solid, int64_t n_local);

  std::vector<SampledBlock> sample(const int64_t* seeds, int64_t n_seeds,
                                   const std::vector<int64_t>& fanouts, uint64_t seed,
                                   uint64_t epoch, uint64_t iteration);

  using Slot = int32_t;  // scratch entry: edge position or ~local id within one block

  int64_t n_solid() const { return n_solid_; }
  int64_t n_local() const { return n_local_; }

 private:
  template <class Idx>
  void sample_layer(const Idx* indices, const int64_t* dst, int64_t n_dst, int64_t fanout,
                    uint64_t key, bool mark_destinations, bool input_layer,
                    SampledBlock& out);

  struct RowRef {
    int64_t begin, deg;  // CSR row of one destination
  };

  const int64_t* indptr_;
  const int32_t* indices32_;      // exactly one of indices32_ / indices64_ is non-null
  const int64_t* indices64_;
  int64_t n_solid_, n_local_;
  std::vector<Slot> scratch_;     // [n_local]: kUnset outside a call (see sampler.cpp)
  std::vector<int64_t> nbr_;      // sampled neighbours (VID_p) of the current layer, reused
  std::vector<RowRef> rows_;      // CSR rows of the current layer's destinations, reused
  std::mutex mutex_;
};

}  // namespace distmb
