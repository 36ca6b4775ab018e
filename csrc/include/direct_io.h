// Aligned, coalesced, thread-parallel byte-range reads with O_DIRECT
// (csrc/kernels/direct_io.cpp).
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace distmb {

// Alignment of offsets, lengths and buffers of direct reads
// (distmb.data.store.rowfile.DIRECT_IO_ALIGN).
constexpr int64_t kDirectIoAlign = 4096;
// Cap of one coalesced read request in bytes (a request holding a single larger range exceeds
// it).
constexpr int64_t kMaxReadRequest = int64_t{1} << 20;
// Unrequested bytes a request may read to take in the next range instead of issuing a request
// of its own: a request costs a device round trip (~20 us on an SSD at moderate queue depth),
// a few KiB more of a request cost ~1 us.
constexpr int64_t kCoalesceGap = 4096;
// Default reads in flight (threads issuing preads): SSDs need a queue depth of 8 or more to
// reach their throughput, whatever the number of cores (blocked readers use no CPU).
constexpr int kDefaultIoDepth = 16;

// io_depth / set_io_depth: reads in flight per read_ranges call, at least the caller's OpenMP
// thread count (set_io_depth(d), d >= 1; distmb.data.store.rowfile.set_io_depth).
int io_depth();
void set_io_depth(int depth);
// coalesce_gap / set_coalesce_gap: the gap read_ranges reads through (default kCoalesceGap;
// >= 0 bytes): a device with slow small reads and fast large ones wants more.
int64_t coalesce_gap();
void set_coalesce_gap(int64_t bytes);

// direct_io_alignment(fd, fallback): the offset alignment O_DIRECT reads of fd need (statx
// STATX_DIOALIGN: often the device's 512-byte logical block), when the kernel reports one that
// divides fallback; else fallback. Smaller alignment = fewer bytes read per small range.
int64_t direct_io_alignment(int fd, int64_t fallback);

// open_for_reads: open path read-only for positioned reads. With direct, O_DIRECT is tried
// and the first align bytes are read as a probe; if the open or the probe fails with EINVAL
// (the filesystem or the alignment is refused), the file is reopened buffered and
// fallback_reason says why (is_direct is then false). Other errors throw std::runtime_error
// "cannot open <what> <path>: <errno text>". Returns the descriptor.
int open_for_reads(const std::string& path, const std::string& what, bool direct, int64_t align,
                   bool& is_direct, std::string& fallback_reason);

struct ReadRangesStats {
  int64_t bytes_read = 0;  // sum of the lengths of the requests read from the file
  int64_t requests = 0;    // pread requests issued (after coalescing; retries not counted)
};

// Scratch of read_ranges reused across calls: per-thread aligned buffers (grown to the largest
// request of a call, released after a call whose largest request exceeded max_request) and
// the sort / request lists. Not thread-safe: its owner serialises.
class RangeReadScratch {
 public:
  RangeReadScratch() = default;
  RangeReadScratch(const RangeReadScratch&) = delete;
  RangeReadScratch& operator=(const RangeReadScratch&) = delete;

 private:
  friend void read_ranges(int, const int64_t*, const int64_t*, uint8_t* const*, int64_t,
                          int64_t, int64_t, RangeReadScratch&, ReadRangesStats&,
                          const std::string&, int64_t);
  struct FreeBytes {
    void operator()(uint8_t* p) const;
  };
  struct Request {
    int64_t offset, length;  // aligned byte range of the file
    int64_t first, last;     // entries [first, last) of order
    int64_t need_end;        // end of the last byte the ranges of the request need
  };
  uint8_t* buffer(int t, int64_t bytes, int64_t align);

  std::vector<std::unique_ptr<uint8_t, FreeBytes>> buffers_;  // [threads]
  std::vector<int64_t> buffer_bytes_;                          // [threads]
  std::vector<std::pair<int64_t, int64_t>> order_;            // (offset, range index)
  std::vector<Request> requests_;
};

// read_ranges: copy file bytes [offsets[k], offsets[k] + lengths[k]) to dst[k] for k in
// [0, n) (any order; ranges may repeat or overlap; zero lengths are skipped). The ranges are
// sorted by offset, each widened to the align-aligned byte range that holds it, and merged
// into requests: a range inside the current request joins it, one that overlaps or touches it
// joins while the request stays within max_request bytes (a single larger range is a request
// of its own). The requests are read with pread from an OpenMP loop (dynamic schedule, the
// caller's omp_get_max_threads()) into per-thread aligned buffers; a short read is continued,
// EINTR retried. The requests read are added to stats even when it throws. A request that
// stops before a range's last byte throws std::runtime_error "<what>: read of bytes [a, b)
// stopped at offset x" followed by "(end of file: the file has s bytes, the layout needs
// layout_bytes)" or the errno text. dst is complete only when no exception was thrown.
void read_ranges(int fd, const int64_t* offsets, const int64_t* lengths, uint8_t* const* dst,
                 int64_t n, int64_t align, int64_t max_request, RangeReadScratch& scratch,
                 ReadRangesStats& stats, const std::string& what, int64_t layout_bytes);

}  // namespace distmb
