// Thread-parallel multi-layer neighbour sampling (csrc/kernels/sampler.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "adjacency.h"

namespace distmb {

// Fan-out meaning "every in-neighbour" (distmb.pipeline.sample.host.FANOUT_ALL).
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
// fanouts list and for seeds that are halo, out of range or repeated, std::length_error for
// a block with 2^31 - 1 or more destinations + edges (the scratch entries are 32-bit).
// Calls on one object are serialised by a mutex (the scratch table is shared).
//
// With an adjacency provider (indices32 and indices64 both null; borrowed, must outlive the
// object), every layer first fetches its destinations' lists from it into a compact buffer
// and samples positions within those lists: the blocks are identical to those of the
// in-memory sampler over the same CSR. The O(E) validation of indices is then the provider's
// (per fetch); indptr is still checked (O(n)).
class NeighborSamplerCore {
 public:
  NeighborSamplerCore(const int64_t* indptr, const int32_t* indices32, const int64_t* indices64,
                      int64_t n_solid, int64_t n_local, AdjacencyProvider* adjacency = nullptr);

  std::vector<SampledBlock> sample(const int64_t* seeds, int64_t n_seeds,
                                   const std::vector<int64_t>& fanouts, uint64_t seed,
                                   uint64_t epoch, uint64_t iteration);

  using Slot = int32_t;  // scratch entry: edge position or ~local id within one block

  int64_t n_solid() const { return n_solid_; }
  int64_t n_local() const { return n_local_; }

 private:
  template <class Idx>
  void sample_layer(const Idx* indices, const int64_t* list_starts, const int64_t* dst,
                    int64_t n_dst, int64_t fanout, uint64_t key, bool mark_destinations,
                    bool input_layer, SampledBlock& out);

  struct RowRef {
    int64_t begin, deg;  // CSR row of one destination
  };

  const int64_t* indptr_;
  const int32_t* indices32_;      // exactly one of indices32_ / indices64_ is non-null
  const int64_t* indices64_;
  AdjacencyProvider* adjacency_;  // non-null: lists come from it (indices32_/64_ null)
  int64_t n_solid_, n_local_;
  std::vector<Slot> scratch_;     // [n_local]: kUnset outside a call (see sampler.cpp)
  std::vector<int64_t> nbr_;      // sampled neighbours (VID_p) of the current layer, reused
  std::vector<RowRef> rows_;      // CSR rows of the current layer's destinations, reused
  std::vector<uint8_t> first_;    // [edges]: the current layer's first appearances, reused
  std::vector<int64_t> list_starts_;  // with adjacency_: the fetched lists of a layer, reused
  std::vector<uint8_t> list_bytes_;
  std::mutex mutex_;
};

}  // namespace distmb
