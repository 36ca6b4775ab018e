// Out-of-core feature rows, one raw file per table, read with O_DIRECT
// (csrc/kernels/rowfile.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "direct_io.h"

namespace distmb {

// Layout (distmb/data/store/rowfile.py): row i of row_bytes bytes starts at byte i * row_stride;
// row_stride is a power of two <= align (a row never straddles an align boundary) or a
// multiple of align; padding is zero and the file size is num_rows * row_stride rounded up to
// a multiple of align. No header.

struct RowFileCounters {
  int64_t bytes_read = 0;  // sum of the lengths of the requests read from the file
  int64_t requests = 0;    // pread requests issued (after coalescing; retries not counted)
  int64_t rows_read = 0;   // positions served (duplicates count once per position)
};

// RowFileReader: positioned reads of rows of one row file by id.
// - The constructor opens path with open_for_reads (O_DIRECT when direct, unless refused:
//   then buffered, direct() false and fallback_reason() says why). Other errors throw
//   std::runtime_error naming the path; bad geometry throws std::invalid_argument.
// - read_rows(ids[n], out[n * row_bytes]): out row k = file row ids[k] (any order,
//   duplicates allowed). Throws std::out_of_range naming the first id outside
//   [0, num_rows). The rows are read with read_ranges (row k: bytes [ids[k] * row_stride,
//   + row_bytes) to out + k * row_bytes; max_request() caps a coalesced request), so the
//   distinct aligned blocks are read once each; a request that ends before a row's last byte
//   (truncated file) throws std::runtime_error naming the path and the offset. out is
//   complete only when no exception was thrown.
// - evict_page_cache(): posix_fadvise(DONTNEED) over the whole file.
// Calls on one object are serialised by a mutex (the buffers and counters are shared).
class RowFileReader {
 public:
  RowFileReader(std::string path, int64_t num_rows, int64_t row_bytes, int64_t row_stride,
                int64_t align, bool direct);
  ~RowFileReader();
  RowFileReader(const RowFileReader&) = delete;
  RowFileReader& operator=(const RowFileReader&) = delete;

  // With positions (int64[n], each in [0, out_rows), checked by the caller), row ids[k] goes
  // to out row positions[k] instead of k: a gather's misses land in their final places.
  void read_rows(const int64_t* ids, int64_t n, uint8_t* out,
                 const int64_t* positions = nullptr);
  void evict_page_cache();
  void close();
  void reset_counters();
  RowFileCounters counters() const;

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return num_rows_; }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t row_stride() const { return row_stride_; }
  int64_t align() const { return align_; }
  // Alignment of the reads: the file's O_DIRECT alignment when it divides align (e.g. 512
  // bytes), else align.
  int64_t read_align() const { return read_align_; }
  int64_t max_request() const { return max_request_; }
  bool direct() const { return direct_; }
  bool closed() const;
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  int require_open() const;

  std::string path_;
  int64_t num_rows_, row_bytes_, row_stride_, align_, max_request_;
  int64_t read_align_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  std::string fallback_reason_;
  RangeReadScratch scratch_;
  std::vector<int64_t> offsets_, lengths_;  // per requested row, reused across calls
  std::vector<uint8_t*> dst_;               // per requested row, reused across calls
  RowFileCounters counters_;
  mutable std::mutex mutex_;
};

// drop_page_cache: posix_fadvise(DONTNEED) over the file at path (its clean pages leave the
// OS page cache, so the next reads, mmap ones included, come from the device). Throws
// std::runtime_error naming the path.
void drop_page_cache(const std::string& path);

}  // namespace distmb
