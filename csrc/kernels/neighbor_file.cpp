// Out-of-core adjacency (Ginex, section 3.2): a part's CSR indices stay in their file on disk
// and the in-neighbour lists a sampling layer needs are read with coalesced, thread-parallel
// O_DIRECT reads (read_ranges, direct_io.cpp), except those of the vertices held in a
// static neighbour cache filled once before training. Only indptr, the cache and its address
// table live in memory.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common.h"
#include "neighbor_file.h"

namespace distmb {

namespace {

// Minimum lists per OpenMP thread for the per-destination passes of fetch and fill.
constexpr int64_t kGrainLists = 16384;
// Minimum entries per OpenMP thread for the range check of lists read from disk.
constexpr int64_t kGrainEntries = 65536;

int64_t load_index(const uint8_t* p, int64_t index_bytes) {
  if (index_bytes == 4) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

NeighborFile::NeighborFile(std::string path, int64_t data_offset, int64_t index_bytes,
                           int64_t num_entries, const int64_t* indptr, int64_t n_solid,
                           int64_t n_local, bool direct)
    : path_(std::move(path)),
      data_offset_(data_offset),
      index_bytes_(index_bytes),
      num_entries_(num_entries),
      indptr_(indptr),
      n_solid_(n_solid),
      n_local_(n_local) {
  const std::string where = "neighbour file " + path_ + ": ";
  if (index_bytes != 4 && index_bytes != 8)
    throw std::invalid_argument(where + "index_bytes must be 4 (int32) or 8 (int64), got " +
                                std::to_string(index_bytes));
  if (data_offset < 0 || num_entries < 0 || num_entries > (INT64_MAX - data_offset) / 8)
    throw std::invalid_argument(where + "need data_offset >= 0 and num_entries >= 0 (got " +
                                std::to_string(data_offset) + ", " +
                                std::to_string(num_entries) + ")");
  if (n_solid < 0 || n_local < n_solid)
    throw std::invalid_argument(where + "need 0 <= n_solid <= n_local (got n_solid=" +
                                std::to_string(n_solid) + ", n_local=" +
                                std::to_string(n_local) + ")");
  if (indptr[0] != 0 || indptr[n_solid] != num_entries)
    throw std::invalid_argument(where + "indptr must run from 0 to num_entries=" +
                                std::to_string(num_entries) + " (got " +
                                std::to_string(indptr[0]) + " .. " +
                                std::to_string(indptr[n_solid]) + ")");
  int64_t bad_row = n_solid;
#pragma omp parallel for reduction(min : bad_row) schedule(static)
  for (int64_t v = 0; v < n_solid; ++v)
    if (indptr[v + 1] < indptr[v]) bad_row = std::min(bad_row, v);
  if (bad_row < n_solid)
    throw std::invalid_argument(where + "indptr decreases at row " + std::to_string(bad_row));

  fd_ = open_for_reads(path_, "neighbour file", direct, kDirectIoAlign, direct_,
                       fallback_reason_);
  read_align_ = direct_ ? direct_io_alignment(fd_, kDirectIoAlign) : kDirectIoAlign;
  struct stat st {};
  const int64_t need = data_offset + num_entries * index_bytes;
  if (::fstat(fd_, &st) != 0 || st.st_size < need) {
    const int64_t size = st.st_size;
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("neighbour file " + path_ + " is truncated: " +
                             std::to_string(size) + " bytes, expected at least " +
                             std::to_string(need) + " (data offset " +
                             std::to_string(data_offset) + " + " +
                             std::to_string(num_entries) + " entries x " +
                             std::to_string(index_bytes) + " bytes)");
  }
}

NeighborFile::~NeighborFile() {
  if (fd_ >= 0) ::close(fd_);
}

int NeighborFile::require_open() const {
  if (fd_ < 0) throw std::runtime_error("neighbour file " + path_ + " is closed");
  return fd_;
}

bool NeighborFile::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fd_ < 0;
}

void NeighborFile::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// Lists of vertices[0..n) (non-empty ones only) -> dst + starts[i] * index_bytes_, one
// read_ranges call; then every entry is checked against [0, n_local) (first bad entry in list
// order is reported).
void NeighborFile::read_lists(int fd, const int64_t* vertices, const int64_t* starts,
                              int64_t n, uint8_t* dst, ReadRangesStats& stats) {
  offsets_.resize(n);
  lengths_.resize(n);
  dst_.resize(n);
  const int64_t* const indptr = indptr_;
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kGrainLists))
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = vertices[i];
    offsets_[i] = data_offset_ + indptr[v] * index_bytes_;
    lengths_[i] = (indptr[v + 1] - indptr[v]) * index_bytes_;
    dst_[i] = dst + starts[i] * index_bytes_;
  }
  read_ranges(fd, offsets_.data(), lengths_.data(), dst_.data(), n, read_align_,
              kMaxReadRequest, scratch_, stats, "neighbour file " + path_,
              data_offset_ + num_entries_ * index_bytes_);

  int64_t entries = 0;
  for (int64_t i = 0; i < n; ++i) entries += lengths_[i];
  entries /= index_bytes_;
  int64_t bad = n;  // first list holding an entry outside [0, n_local)
  const int64_t ib = index_bytes_, n_local = n_local_;
#pragma omp parallel for reduction(min : bad) schedule(dynamic, 256) \
    num_threads(threads_for(entries, kGrainEntries))
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* p = dst_[i];
    const int64_t deg = lengths_[i] / ib;
    bool ok = true;
    if (ib == 4) {
      for (int64_t j = 0; j < deg; ++j) {
        int32_t u;
        std::memcpy(&u, p + j * 4, 4);
        ok &= u >= 0 && u < n_local;
      }
    } else {
      for (int64_t j = 0; j < deg; ++j) {
        int64_t u;
        std::memcpy(&u, p + j * 8, 8);
        ok &= u >= 0 && u < n_local;
      }
    }
    if (!ok) bad = std::min(bad, i);
  }
  if (bad < n) {
    const int64_t v = vertices[bad], deg = lengths_[bad] / ib;
    for (int64_t j = 0; j < deg; ++j) {
      const int64_t u = load_index(dst_[bad] + j * ib, ib);
      if (u < 0 || u >= n_local)
        throw std::runtime_error(
            "neighbour file " + path_ + " is corrupt: indices[" +
            std::to_string(indptr[v] + j) + "] = " + std::to_string(u) +
            " (in the list of VID_p " + std::to_string(v) + ", at byte " +
            std::to_string(offsets_[bad] + j * ib) + ") is outside [0, n_local=" +
            std::to_string(n_local) + ")");
    }
  }
}

int64_t NeighborFile::fill(const int64_t* vertices, int64_t n, int64_t capacity_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int fd = require_open();
  for (int64_t i = 0; i < n; ++i)
    if (vertices[i] < 0 || vertices[i] >= n_solid_)
      throw std::out_of_range("fill: VID_p " + std::to_string(vertices[i]) + " (position " +
                              std::to_string(i) + ") is outside the solid range [0, " +
                              std::to_string(n_solid_) + ") of neighbour file " + path_);
  cache_at_.clear();
  cache_at_.shrink_to_fit();
  cache_.clear();
  cache_.shrink_to_fit();
  cache_vertices_ = 0;
  fill_bytes_read_ = 0;
  if (n == 0 || capacity_bytes <= 0 || n_solid_ == 0) return 0;

  // Greedy prefix of the priority order within the budget (serial: O(n) and once).
  std::vector<int64_t> chosen, starts{0};
  cache_at_.assign(n_solid_, -1);
  int64_t used = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = vertices[i];
    if (cache_at_[v] >= 0) continue;
    const int64_t bytes = (indptr_[v + 1] - indptr_[v]) * index_bytes_;
    if (bytes > capacity_bytes - used) break;
    used += bytes;
    cache_at_[v] = starts.back();
    chosen.push_back(v);
    starts.push_back(starts.back() + bytes / index_bytes_);
  }
  cache_vertices_ = static_cast<int64_t>(chosen.size());
  if (cache_vertices_ == 0) {
    cache_at_.clear();
    cache_at_.shrink_to_fit();
    return 0;
  }
  cache_.resize(used);
  ReadRangesStats stats;
  try {
    read_lists(fd, chosen.data(), starts.data(), cache_vertices_, cache_.data(), stats);
  } catch (...) {
    cache_at_.clear();
    cache_at_.shrink_to_fit();
    cache_.clear();
    cache_.shrink_to_fit();
    cache_vertices_ = 0;
    throw;
  }
  fill_bytes_read_ = stats.bytes_read;
  return cache_vertices_;
}

void NeighborFile::fetch(const int64_t* dst, int64_t n, std::vector<int64_t>& starts,
                         std::vector<uint8_t>& lists) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int fd = require_open();
  const int64_t* const indptr = indptr_;
  const int nt = threads_for(n, kGrainLists);

  // 1. Range check and list sizes; scan -> starts.
  starts.resize(n + 1);
  int64_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = dst[i];
    if (static_cast<uint64_t>(v) >= static_cast<uint64_t>(n_solid_)) {
      bad = std::min(bad, i);
      starts[i] = 0;
    } else {
      starts[i] = indptr[v + 1] - indptr[v];
    }
  }
  if (bad < n)
    throw std::out_of_range("VID_p " + std::to_string(dst[bad]) + " (position " +
                            std::to_string(bad) + ") is outside the solid range [0, " +
                            std::to_string(n_solid_) + ") of neighbour file " + path_);
  starts[n] = 0;
  const int64_t total = exclusive_scan_inplace(starts.data(), n + 1);
  lists.resize(total * index_bytes_);

  // 2. Cached lists are copied; the others are listed for one batch of reads.
  const int64_t* const at = cache_at_.empty() ? nullptr : cache_at_.data();
  const int64_t ib = index_bytes_;
  int64_t hits = 0;
#pragma omp parallel for reduction(+ : hits) schedule(static) num_threads(nt)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = at ? at[dst[i]] : -1;
    if (c < 0) continue;
    ++hits;
    std::memcpy(lists.data() + starts[i] * ib, cache_.data() + c * ib,
                static_cast<size_t>((starts[i + 1] - starts[i]) * ib));
  }
  const int64_t* const s = starts.data();
  std::vector<int64_t> miss =
      compact_where(n, [&](int64_t i) { return (!at || at[dst[i]] < 0) && s[i + 1] > s[i]; });
  const int64_t n_miss = static_cast<int64_t>(miss.size());
  std::vector<int64_t> miss_vertex(n_miss), miss_start(n_miss);
#pragma omp parallel for schedule(static) num_threads(threads_for(n_miss, kGrainLists))
  for (int64_t k = 0; k < n_miss; ++k) {
    miss_vertex[k] = dst[miss[k]];
    miss_start[k] = starts[miss[k]];
  }

  // 3. One coalesced batch of reads for all the misses, checked.
  ReadRangesStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    read_lists(fd, miss_vertex.data(), miss_start.data(), n_miss, lists.data(), stats);
  } catch (...) {
    counters_.bytes_read += stats.bytes_read;
    counters_.requests += stats.requests;
    throw;
  }
  const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  int64_t entries = 0;
  for (int64_t k = 0; k < n_miss; ++k) entries += lengths_[k];
  counters_.lists_requested += n;
  counters_.cache_hits += hits;
  counters_.lists_read += n_miss;
  counters_.entries_read += entries / ib;
  counters_.bytes_read += stats.bytes_read;
  counters_.requests += stats.requests;
  counters_.read_seconds += dt.count();
}

void NeighborFile::reset_counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_ = NeighborFileCounters{};
}

NeighborFileCounters NeighborFile::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

int64_t NeighborFile::cache_vertices() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_vertices_;
}

int64_t NeighborFile::cache_entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cache_.size()) / index_bytes_;
}

int64_t NeighborFile::cache_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(cache_.size() + cache_at_.size() * sizeof(int64_t));
}

int64_t NeighborFile::fill_bytes_read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fill_bytes_read_;
}

}  // namespace distmb
