// The seam between the sampler and the stores of in-neighbour lists it can read from
// (NeighborFile implements it).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <vector>

namespace distmb {

// AdjacencyProvider: the in-neighbour lists of a part's solid vertices served from somewhere
// other than an in-memory indices array (NeighborFile: a file on disk behind a static cache).
// fetch(dst[n], starts, lists): the lists of dst[0..n) (VID_p in [0, n_solid()), any order,
// repeats allowed) packed into lists, entry j of bytes [j * index_bytes(), + index_bytes())
// (int32 or int64, VID_p in [0, n_local()), each list in CSR order), list i being entries
// [starts[i], starts[i+1]) (starts resized to n + 1, starts[0] = 0). Throws when a list cannot
// be served intact (std::runtime_error) or dst is out of range (std::out_of_range).
class AdjacencyProvider {
 public:
  virtual ~AdjacencyProvider() = default;
  virtual int64_t index_bytes() const = 0;
  virtual int64_t n_solid() const = 0;
  virtual int64_t n_local() const = 0;
  virtual int64_t num_entries() const = 0;
  virtual void fetch(const int64_t* dst, int64_t n, std::vector<int64_t>& starts,
                     std::vector<uint8_t>& lists) = 0;
};

}  // namespace distmb
