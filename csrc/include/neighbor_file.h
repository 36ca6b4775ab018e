// A part's in-neighbour lists on disk behind a static cache
// (csrc/kernels/neighbor_file.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "adjacency.h"
#include "direct_io.h"

namespace distmb {

// The file holds indices (int32 or int64, native byte order) of the part's in-edge CSR from
// byte data_offset on (a .npy file is read in place: data_offset is its header length);
// entry e of the CSR is at data_offset + e * index_bytes. indptr stays in memory.

struct NeighborFileCounters {
  int64_t lists_requested = 0;  // destinations asked for by fetch (repeats counted)
  int64_t cache_hits = 0;       // of those, served from the cache (the rest came from disk)
  int64_t lists_read = 0;       // lists read from disk (misses with at least one entry)
  int64_t entries_read = 0;     // entries of those lists
  int64_t bytes_read = 0;       // bytes of the coalesced requests read from the file
  int64_t requests = 0;         // pread requests issued
  double read_seconds = 0;      // wall time in read_ranges, seconds
};

// NeighborFile: in-neighbour lists of a part's solid vertices read from a file (O_DIRECT
// unless refused, as RowFileReader) behind a static neighbour cache (Ginex, section 3.2):
// the full lists of a chosen set of vertices in one compact in-memory array, addressed by a
// direct table over VID_p.
// - The constructor borrows indptr[n_solid + 1] (must outlive the object), checks that it is
//   non-decreasing from 0 to num_entries (std::invalid_argument) and that the file holds
//   data_offset + num_entries * index_bytes bytes (std::runtime_error naming the file).
// - fill(vertices[n], capacity_bytes): replaces the cache with the lists of vertices[0..),
//   taken in that order while the next list (deg * index_bytes bytes) still fits in
//   capacity_bytes (repeats are skipped); reads them with one read_ranges call and checks
//   their entries. Returns the number of vertices cached. The address table (8 bytes per
//   solid vertex) is allocated when the cache is not empty and is not charged to the budget.
// - fetch (AdjacencyProvider): cached lists are copied from the cache; all the other
//   non-empty lists are read with one read_ranges call straight into their place in lists.
//   Every entry read from disk is checked against [0, n_local): a corrupt file throws
//   std::runtime_error naming the file, the entry and the bound; a short file likewise.
// Calls on one object are serialised by a mutex.
class NeighborFile : public AdjacencyProvider {
 public:
  NeighborFile(std::string path, int64_t data_offset, int64_t index_bytes, int64_t num_entries,
               const int64_t* indptr, int64_t n_solid, int64_t n_local, bool direct);
  ~NeighborFile() override;
  NeighborFile(const NeighborFile&) = delete;
  NeighborFile& operator=(const NeighborFile&) = delete;

  int64_t fill(const int64_t* vertices, int64_t n, int64_t capacity_bytes);
  void fetch(const int64_t* dst, int64_t n, std::vector<int64_t>& starts,
             std::vector<uint8_t>& lists) override;
  void close();
  void reset_counters();
  NeighborFileCounters counters() const;

  int64_t index_bytes() const override { return index_bytes_; }
  int64_t n_solid() const override { return n_solid_; }
  int64_t n_local() const override { return n_local_; }
  int64_t num_entries() const override { return num_entries_; }
  const int64_t* indptr() const { return indptr_; }
  const std::string& path() const { return path_; }
  int64_t data_offset() const { return data_offset_; }
  bool direct() const { return direct_; }
  bool closed() const;
  const std::string& fallback_reason() const { return fallback_reason_; }
  int64_t cache_vertices() const;
  int64_t cache_entries() const;
  int64_t cache_bytes() const;       // cached lists + address table, bytes
  int64_t fill_bytes_read() const;   // bytes the last fill read from the file

 private:
  int require_open() const;
  // Read the non-empty lists of vertices[0..n) to dst + starts[i] * index_bytes_ and check
  // their entries (caller holds the mutex).
  void read_lists(int fd, const int64_t* vertices, const int64_t* starts, int64_t n,
                  uint8_t* dst, ReadRangesStats& stats);

  std::string path_;
  int64_t data_offset_, index_bytes_, num_entries_;
  const int64_t* indptr_;
  int64_t n_solid_, n_local_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t read_align_ = kDirectIoAlign;  // the file's O_DIRECT alignment (direct_io_alignment)
  std::string fallback_reason_;
  RangeReadScratch scratch_;
  std::vector<int64_t> cache_at_;   // [n_solid] or empty: first cache entry of a list, or -1
  std::vector<uint8_t> cache_;      // cached lists, index_bytes_ per entry
  int64_t cache_vertices_ = 0, fill_bytes_read_ = 0;
  std::vector<int64_t> offsets_, lengths_;
  std::vector<uint8_t*> dst_;
  NeighborFileCounters counters_;
  mutable std::mutex mutex_;
};

}  // namespace distmb
