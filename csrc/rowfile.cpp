// Out-of-core feature rows: one raw file per table (layout in csrc/kernels.h and
// distmb/data/rowfile.py), rows read by id with many concurrent positioned reads that
// bypass the page cache (O_DIRECT), falling back to buffered reads where the filesystem
// refuses direct I/O.
//
// A call sorts the requested (id, position) pairs by id, turns every distinct row into the
// align-aligned byte range that holds it, merges ranges that overlap (rows sharing a block) or
// touch (consecutive blocks) into requests of at most max_request_ bytes, and reads the
// requests in parallel, each thread into its own aligned buffer, copying every row it holds
// to all the output positions that asked for it.
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
#include "kernels.h"

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

// pread of length bytes at offset into buf: continues short reads, retries EINTR; stops at the
// end of the file (returns the bytes read so far) or at an error (err = errno).
int64_t pread_full(int fd, uint8_t* buf, int64_t length, int64_t offset, int& err) {
  int64_t got = 0;
  err = 0;
  while (got < length) {
    const ssize_t k = ::pread(fd, buf + got, static_cast<size_t>(length - got),
                              static_cast<off_t>(offset + got));
    if (k > 0) {
      got += k;
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else {
      if (k < 0) err = errno;
      break;  // k == 0: end of file
    }
  }
  return got;
}

uint8_t* aligned_buffer(int64_t bytes, int64_t align) {
  void* p = nullptr;
  const size_t a = static_cast<size_t>(std::max<int64_t>(align, kDirectIoAlign));
  if (posix_memalign(&p, a, static_cast<size_t>(round_up(bytes, static_cast<int64_t>(a)))) != 0)
    throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}

}  // namespace

void RowFileReader::FreeBytes::operator()(uint8_t* p) const { std::free(p); }

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

  if (direct) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0 && errno == EINVAL) {
      fallback_reason_ = "open(O_DIRECT) failed: " + errno_text(EINVAL) +
                         " (the filesystem refuses direct I/O)";
    } else if (fd_ >= 0) {
      // Probe: the smallest request a read_rows call issues (align bytes at offset 0).
      std::unique_ptr<uint8_t, FreeBytes> probe(aligned_buffer(align, align));
      int err = 0;
      pread_full(fd_, probe.get(), align, 0, err);
      if (err == EINVAL) {
        fallback_reason_ = "pread(O_DIRECT) of " + std::to_string(align) +
                           " bytes at offset 0 failed: " + errno_text(EINVAL) +
                           " (the filesystem refuses direct I/O at this alignment)";
        ::close(fd_);
        fd_ = -1;
      } else {
        direct_ = true;
      }
    }
  }
  if (!direct_) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      const int err = errno;
      throw std::runtime_error("cannot open row file " + path_ + ": " + errno_text(err));
    }
  }
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

uint8_t* RowFileReader::thread_buffer(int t) {
  if (static_cast<int>(buffers_.size()) <= t) buffers_.resize(t + 1);
  if (!buffers_[t]) buffers_[t].reset(aligned_buffer(max_request_, align_));
  return buffers_[t].get();
}

void RowFileReader::read_rows(const int64_t* ids, int64_t n, uint8_t* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int fd = require_open();
  const int64_t bad = first_out_of_range(ids, n, num_rows_);
  if (bad < n)
    throw std::out_of_range("id " + std::to_string(ids[bad]) + " (position " +
                            std::to_string(bad) + ") is outside [0, " +
                            std::to_string(num_rows_) + ") of row file " + path_);
  if (n == 0) return;

  // (id, position) sorted by id: rows in file order, duplicates adjacent.
  order_.resize(n);
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kGrainIds))
  for (int64_t k = 0; k < n; ++k) order_[k] = {ids[k], k};
  if (!std::is_sorted(order_.begin(), order_.end())) std::sort(order_.begin(), order_.end());

  // Coalesce the aligned ranges of the distinct rows into requests.
  const int64_t block_mask = ~(align_ - 1);
  requests_.clear();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t id = order_[k].first;
    if (k > 0 && id == order_[k - 1].first) continue;  // same row, same request
    const int64_t start = id * row_stride_;
    const int64_t lo = start & block_mask;
    const int64_t hi = round_up(start + row_bytes_, align_);
    if (!requests_.empty()) {
      Request& r = requests_.back();
      const int64_t end = r.offset + r.length;
      // Overlap (a block the request holds) always merges; touching merges up to the cap.
      if (lo < end || (lo == end && hi - r.offset <= max_request_)) {
        r.length = std::max(end, hi) - r.offset;
        continue;
      }
      r.last = k;
    }
    requests_.push_back(Request{lo, hi - lo, k, n});
  }

  const int64_t n_req = static_cast<int64_t>(requests_.size());
  const int nt = static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n_req));
  for (int t = 0; t < nt; ++t) thread_buffer(t);

  int64_t bytes = 0;
  int64_t fail_at = INT64_MAX;  // file offset where the first failing request stopped
  int64_t fail_req = -1;
  int fail_err = 0;
#pragma omp parallel num_threads(nt) reduction(+ : bytes)
  {
    uint8_t* buf = buffers_[omp_get_thread_num()].get();
#pragma omp for schedule(dynamic, 1)
    for (int64_t q = 0; q < n_req; ++q) {
      const Request& r = requests_[q];
      int err = 0;
      const int64_t got = pread_full(fd, buf, r.length, r.offset, err);
      bytes += got;
      // Bytes of the request the rows need: up to the end of its last row.
      const int64_t need = order_[r.last - 1].first * row_stride_ + row_bytes_ - r.offset;
      if (got < need) {
#pragma omp critical(distmb_rowfile_fail)
        if (r.offset + got < fail_at) {
          fail_at = r.offset + got;
          fail_req = q;
          fail_err = err;
        }
        continue;
      }
      for (int64_t k = r.first; k < r.last; ++k) {
        const int64_t src = order_[k].first * row_stride_ - r.offset;
        std::memcpy(out + order_[k].second * row_bytes_, buf + src,
                    static_cast<size_t>(row_bytes_));
      }
    }
  }
  counters_.bytes_read += bytes;
  counters_.requests += n_req;
  if (fail_req >= 0) {
    // A read that ends inside the file failed (errno); one that ends at its end means the file
    // is shorter than the layout (with O_DIRECT a read continued at an unaligned end of file
    // fails with EINVAL rather than returning 0, so the size decides, not the errno).
    struct stat st;
    const bool at_eof = ::fstat(fd, &st) == 0 && st.st_size <= fail_at;
    const Request& r = requests_[fail_req];
    std::string what = "row file " + path_ + ": read of bytes [" + std::to_string(r.offset) +
                       ", " + std::to_string(r.offset + r.length) + ") stopped at offset " +
                       std::to_string(fail_at);
    if (at_eof)
      what += " (end of file: the file has " + std::to_string(st.st_size) +
              " bytes, the layout needs " + std::to_string(num_rows_ * row_stride_) + ")";
    else
      what += ": " + errno_text(fail_err ? fail_err : EIO);
    throw std::runtime_error(what);
  }
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
