// Out-of-core feature rows: one raw file per table (layout in rowfile.h and
// distmb/data/store/rowfile.py), rows read by id with many concurrent positioned reads that
// bypass the page cache (O_DIRECT), falling back to buffered reads where the filesystem
// refuses direct I/O.
//
// A call turns every requested row into its byte range and hands them to read_ranges
// (direct_io.cpp), which sorts them, widens each to the aligned blocks that hold it,
// merges rows sharing a block or in consecutive blocks into requests of at most max_request_
// bytes, and reads the requests in parallel, copying every row to each output position that
// asked for it.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // O_DIRECT
#endif
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "common.h"
#include "rowfile.h"

namespace distmb {

namespace {

// Minimum ids per OpenMP thread for the range check and the (id, position) fill.
constexpr int64_t kGrainIds = 65536;

bool is_power_of_two(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

std::string errno_text(int err) { return std::string(std::strerror(err)); }

// Index of the first id outside [0, num_rows), or n when all are in range.
int64_t first_out_of_range(const int64_t* ids, int64_t n, int64_t num_rows) {
  int64_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static) \
    num_threads(threads_for(n, kGrainIds))
  for (int64_t i = 0; i < n; ++i)
    if (static_cast<uint64_t>(ids[i]) >= static_cast<uint64_t>(num_rows)) bad = std::min(bad, i);
  return bad;
}

}  // namespace

RowFileReader::RowFileReader(std::string path, int64_t num_rows, int64_t row_bytes,
                             int64_t row_stride, int64_t align, bool direct)
    : path_(std::move(path)),
      num_rows_(num_rows),
      row_bytes_(row_bytes),
      row_stride_(row_stride),
      align_(align) {
  const std::string where = "row file " + path_ + ": ";
  if (num_rows < 0) throw std::invalid_argument(where + "num_rows must be >= 0");
  if (row_bytes < 1) throw std::invalid_argument(where + "row_bytes must be >= 1");
  if (!is_power_of_two(align))
    throw std::invalid_argument(where + "align must be a power of two, got " +
                                std::to_string(align));
  if (row_stride < row_bytes ||
      !((row_stride <= align && is_power_of_two(row_stride)) || row_stride % align == 0))
    throw std::invalid_argument(
        where + "row_stride " + std::to_string(row_stride) + " must be >= row_bytes " +
        std::to_string(row_bytes) + " and a power of two <= align or a multiple of align " +
        std::to_string(align));
  if (num_rows > 0 && row_stride > (INT64_MAX - align) / num_rows)
    throw std::invalid_argument(where + "num_rows * row_stride overflows");
  max_request_ = std::max(round_up(kMaxReadRequest, align), round_up(row_bytes, align));

  fd_ = open_for_reads(path_, "row file", direct, align, direct_, fallback_reason_);
  read_align_ = direct_ ? direct_io_alignment(fd_, align) : align;
}

RowFileReader::~RowFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

int RowFileReader::require_open() const {
  if (fd_ < 0) throw std::runtime_error("row file " + path_ + " is closed");
  return fd_;
}

bool RowFileReader::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fd_ < 0;
}

void RowFileReader::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void RowFileReader::read_rows(const int64_t* ids, int64_t n, uint8_t* out,
                              const int64_t* positions) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int fd = require_open();
  const int64_t bad = first_out_of_range(ids, n, num_rows_);
  if (bad < n)
    throw std::out_of_range("id " + std::to_string(ids[bad]) + " (position " +
                            std::to_string(bad) + ") is outside [0, " +
                            std::to_string(num_rows_) + ") of row file " + path_);
  if (n == 0) return;

  offsets_.resize(n);
  lengths_.resize(n);
  dst_.resize(n);
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kGrainIds))
  for (int64_t k = 0; k < n; ++k) {
    offsets_[k] = ids[k] * row_stride_;
    lengths_[k] = row_bytes_;
    dst_[k] = out + (positions ? positions[k] : k) * row_bytes_;
  }
  ReadRangesStats stats;
  try {
    read_ranges(fd, offsets_.data(), lengths_.data(), dst_.data(), n, read_align_, max_request_,
                scratch_, stats, "row file " + path_, num_rows_ * row_stride_);
  } catch (...) {
    counters_.bytes_read += stats.bytes_read;
    counters_.requests += stats.requests;
    throw;
  }
  counters_.bytes_read += stats.bytes_read;
  counters_.requests += stats.requests;
  counters_.rows_read += n;
}

void RowFileReader::evict_page_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int err = ::posix_fadvise(require_open(), 0, 0, POSIX_FADV_DONTNEED);
  if (err != 0)
    throw std::runtime_error("posix_fadvise(DONTNEED) on row file " + path_ + " failed: " +
                             errno_text(err));
}

void RowFileReader::reset_counters() {
  std::lock_guard<std::mutex> lock(mutex_);
  counters_ = RowFileCounters{};
}

RowFileCounters RowFileReader::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

void drop_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw std::runtime_error("cannot open " + path + ": " + errno_text(err));
  }
  const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (err != 0)
    throw std::runtime_error("posix_fadvise(DONTNEED) on " + path + " failed: " +
                             errno_text(err));
}

}  // namespace distmb
