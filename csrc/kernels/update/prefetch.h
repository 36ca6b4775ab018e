// Software prefetches of the fused UPDATE kernels (internal to csrc/kernels/update/): the next
// row block's inputs while the current one computes, and rows read through ids.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common.h"

namespace distmb {
namespace update_detail {

// The cache lines of the next row block's inputs (up to kMaxPrefetchRanges contiguous ranges),
// prefetched toward L2 a slice per register tile while the current block computes, so that
// the next block's first column tile finds its rows there instead of waiting on memory.
constexpr int kMaxPrefetchRanges = 4;
struct NextRowsPrefetch {
  const char* base[kMaxPrefetchRanges];
  int64_t lines[kMaxPrefetchRanges];
  int nranges = 0;
  int64_t total = 0;   // lines over all ranges
  int64_t issued = 0;  // lines prefetched so far
  int range = 0;       // range of the next line to prefetch
  int64_t offset = 0;  // its line within that range

  // Add floats [0, count) from p (nothing when p is null or count <= 0).
  void add(const float* p, int64_t count) {
    add_bytes(p, count * static_cast<int64_t>(sizeof(float)));
  }

  // Add bytes [0, count) from p (nothing when p is null or count <= 0).
  void add_bytes(const void* p, int64_t count) {
    if (p == nullptr || count <= 0 || nranges == kMaxPrefetchRanges) return;
    const auto first = reinterpret_cast<uintptr_t>(p) / kCacheLineBytes;
    const auto last = (reinterpret_cast<uintptr_t>(p) + count - 1) / kCacheLineBytes;
    base[nranges] = reinterpret_cast<const char*>(first * kCacheLineBytes);
    lines[nranges] = static_cast<int64_t>(last - first + 1);
    total += lines[nranges++];
  }

  // Prefetch the lines up to fraction (step + 1) / steps of the total.
  void advance(int64_t step, int64_t steps) {
    const int64_t upto = total * std::min(step + 1, steps) / steps;
    for (; issued < upto; ++issued) {
      while (offset == lines[range]) {
        ++range;
        offset = 0;
      }
      __builtin_prefetch(base[range] + offset++ * kCacheLineBytes, 0, 2);
    }
  }
};

// Prefetch rows [r_begin, r_end) of an indexed source (row i at x + ids[i] * c), every line.
inline void prefetch_indexed_rows(const float* x, const int64_t* ids, int64_t c, int64_t r_begin,
                                  int64_t r_end) {
  for (int64_t r = r_begin; r < r_end; ++r) prefetch_row(x + ids[r] * c, c);
}

}  // namespace update_detail
}  // namespace distmb
