// Positioned reads of many byte ranges of one file, bypassing the page cache (O_DIRECT) where
// the filesystem allows it: the shared I/O path of the row files (rowfile.cpp) and the
// out-of-core neighbour lists (neighbor_file.cpp).
//
// A call sorts the ranges by offset, turns each into the align-aligned byte range that holds
// it, merges ranges that overlap, touch or lie within kCoalesceGap bytes into requests of at
// most max_request bytes, and reads the requests with io_depth() reads in flight, each thread
// into its own aligned buffer, copying every range a request holds to its destination.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // O_DIRECT
#endif
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

#include "common.h"
#include "direct_io.h"

namespace distmb {

namespace {

// Minimum ranges per OpenMP thread for the (offset, index) fill.
constexpr int64_t kGrainRanges = 65536;

int64_t round_up(int64_t x, int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

std::string errno_text(int err) { return std::string(std::strerror(err)); }

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

std::atomic<int> g_io_depth{kDefaultIoDepth};
std::atomic<int64_t> g_coalesce_gap{kCoalesceGap};

}  // namespace

int io_depth() { return g_io_depth.load(std::memory_order_relaxed); }

void set_io_depth(int depth) {
  if (depth < 1) throw std::invalid_argument("io depth must be >= 1, got " + std::to_string(depth));
  g_io_depth.store(depth, std::memory_order_relaxed);
}

int64_t coalesce_gap() { return g_coalesce_gap.load(std::memory_order_relaxed); }

void set_coalesce_gap(int64_t bytes) {
  if (bytes < 0)
    throw std::invalid_argument("coalesce gap must be >= 0 bytes, got " + std::to_string(bytes));
  g_coalesce_gap.store(bytes, std::memory_order_relaxed);
}

int64_t direct_io_alignment(int fd, int64_t fallback) {
#if defined(STATX_DIOALIGN)
  struct statx stx;
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN)) {
    const int64_t a = static_cast<int64_t>(stx.stx_dio_offset_align);
    if (a > 0 && (a & (a - 1)) == 0 && a <= fallback && fallback % a == 0) return a;
  }
#else
  (void)fd;
#endif
  return fallback;
}

void RangeReadScratch::FreeBytes::operator()(uint8_t* p) const { std::free(p); }

uint8_t* RangeReadScratch::buffer(int t, int64_t bytes, int64_t align) {
  if (static_cast<int>(buffers_.size()) <= t) {
    buffers_.resize(t + 1);
    buffer_bytes_.resize(t + 1, 0);
  }
  if (!buffers_[t] || buffer_bytes_[t] < bytes) {
    buffers_[t].reset();
    buffers_[t].reset(aligned_buffer(bytes, align));
    buffer_bytes_[t] = bytes;
  }
  return buffers_[t].get();
}

int open_for_reads(const std::string& path, const std::string& what, bool direct, int64_t align,
                   bool& is_direct, std::string& fallback_reason) {
  is_direct = false;
  fallback_reason.clear();
  int fd = -1;
  if (direct) {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0 && errno == EINVAL) {
      fallback_reason = "open(O_DIRECT) failed: " + errno_text(EINVAL) +
                        " (the filesystem refuses direct I/O)";
    } else if (fd >= 0) {
      // Probe: the smallest request a read issues (align bytes at offset 0).
      uint8_t* probe = aligned_buffer(align, align);
      int err = 0;
      pread_full(fd, probe, align, 0, err);
      std::free(probe);
      if (err == EINVAL) {
        fallback_reason = "pread(O_DIRECT) of " + std::to_string(align) +
                          " bytes at offset 0 failed: " + errno_text(EINVAL) +
                          " (the filesystem refuses direct I/O at this alignment)";
        ::close(fd);
        fd = -1;
      } else {
        is_direct = true;
      }
    }
  }
  if (!is_direct) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      throw std::runtime_error("cannot open " + what + " " + path + ": " + errno_text(err));
    }
  }
  return fd;
}

// Contract in direct_io.h. Requests are built serially (one pass over the sorted ranges), read
// in parallel; each request's ranges are copied by the thread that read it.
void read_ranges(int fd, const int64_t* offsets, const int64_t* lengths, uint8_t* const* dst,
                 int64_t n, int64_t align, int64_t max_request, RangeReadScratch& scratch,
                 ReadRangesStats& stats, const std::string& what, int64_t layout_bytes) {
  if (n <= 0) return;
  // (offset, index) sorted by offset: ranges in file order, repeats adjacent.
  auto& order = scratch.order_;
  order.resize(n);
#pragma omp parallel for schedule(static) num_threads(threads_for(n, kGrainRanges))
  for (int64_t k = 0; k < n; ++k) order[k] = {offsets[k], k};
  if (!std::is_sorted(order.begin(), order.end())) std::sort(order.begin(), order.end());

  // Coalesce the aligned extents into requests.
  using Request = RangeReadScratch::Request;
  auto& requests = scratch.requests_;
  requests.clear();
  const int64_t block_mask = ~(align - 1);
  const int64_t gap = coalesce_gap();
  int64_t largest = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t length = lengths[order[k].second];
    if (length <= 0) continue;
    const int64_t start = order[k].first, stop = start + length;
    const int64_t lo = start & block_mask;
    const int64_t hi = round_up(stop, align);
    if (!requests.empty()) {
      Request& r = requests.back();
      const int64_t end = r.offset + r.length;
      // Inside the request always joins; overlapping, touching or within the coalesce gap of
      // its end joins up to the cap (reading the gap costs less than another request).
      if (hi <= end || (lo <= end + gap && hi - r.offset <= max_request)) {
        r.length = std::max(end, hi) - r.offset;
        r.last = k + 1;
        r.need_end = std::max(r.need_end, stop);
        largest = std::max(largest, r.length);
        continue;
      }
    }
    requests.push_back(Request{lo, hi - lo, k, k + 1, stop});
    largest = std::max(largest, hi - lo);
  }

  const int64_t n_req = static_cast<int64_t>(requests.size());
  if (n_req == 0) return;
  // Reads in flight: the io depth, not the core count (a blocked pread uses no CPU).
  const int nt =
      static_cast<int>(std::min<int64_t>(std::max(omp_get_max_threads(), io_depth()), n_req));
  for (int t = 0; t < nt; ++t) scratch.buffer(t, largest, align);

  int64_t bytes = 0;
  int64_t fail_at = INT64_MAX;  // file offset where the first failing request stopped
  int64_t fail_req = -1;
  int fail_err = 0;
#pragma omp parallel num_threads(nt) reduction(+ : bytes)
  {
    uint8_t* buf = scratch.buffers_[omp_get_thread_num()].get();
#pragma omp for schedule(dynamic, 1)
    for (int64_t q = 0; q < n_req; ++q) {
      const Request& r = requests[q];
      int err = 0;
      const int64_t got = pread_full(fd, buf, r.length, r.offset, err);
      bytes += got;
      if (got < r.need_end - r.offset) {
#pragma omp critical(distmb_read_ranges_fail)
        if (r.offset + got < fail_at) {
          fail_at = r.offset + got;
          fail_req = q;
          fail_err = err;
        }
        continue;
      }
      for (int64_t k = r.first; k < r.last; ++k) {
        const int64_t i = order[k].second;
        if (lengths[i] <= 0) continue;
        std::memcpy(dst[i], buf + (order[k].first - r.offset), static_cast<size_t>(lengths[i]));
      }
    }
  }
  stats.bytes_read += bytes;
  stats.requests += n_req;
  // Buffers grown past the cap for one large range are not kept: what persists between calls
  // is bounded by threads x max_request, not by the largest range ever read.
  if (largest > max_request)
    for (int t = 0; t < nt; ++t) {
      scratch.buffers_[t].reset();
      scratch.buffer_bytes_[t] = 0;
    }
  if (fail_req >= 0) {
    // A read that ends inside the file failed (errno); one that ends at its end means the file
    // is shorter than the layout (with O_DIRECT a read continued at an unaligned end of file
    // fails with EINVAL rather than returning 0, so the size decides, not the errno).
    struct stat st;
    const bool at_eof = ::fstat(fd, &st) == 0 && st.st_size <= fail_at;
    const Request& r = requests[fail_req];
    std::string text = what + ": read of bytes [" + std::to_string(r.offset) + ", " +
                       std::to_string(r.offset + r.length) + ") stopped at offset " +
                       std::to_string(fail_at);
    if (at_eof)
      text += " (end of file: the file has " + std::to_string(st.st_size) +
              " bytes, the layout needs " + std::to_string(layout_bytes) + ")";
    else
      text += ": " + errno_text(fail_err ? fail_err : EIO);
    throw std::runtime_error(text);
  }
}

}  // namespace distmb
