// Shared helpers for the distmb kernels: OpenMP-parallel scans and order-preserving
// compaction. Header-only; every kernel file includes it.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace distmb {

// Bytes of a cache line: buffers that vector kernels load whole lines of start on one, so that
// no 64-byte load straddles two lines.
constexpr std::size_t kCacheLineBytes = 64;

// std::allocator on cache-line boundaries (the default one guarantees 16 bytes).
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kCacheLineBytes)));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete(p, std::align_val_t(kCacheLineBytes));
  }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

// A float buffer that starts on a cache line.
using AlignedFloats = std::vector<float, CacheLineAllocator<float>>;

// Random rows defeat the hardware prefetcher: kernels that read rows by index software-prefetch
// about this many bytes of rows ahead (the aggregations, and the UPDATE backward that builds
// its gradient rows by aggregating).
constexpr int64_t kPrefetchBytes = 8 << 10;
constexpr int64_t kPrefetchMinRows = 2, kPrefetchMaxRows = 32;
constexpr int64_t kLineFloats = kCacheLineBytes / sizeof(float);

// Rows to prefetch ahead for rows of row_floats floats.
inline int64_t prefetch_rows(int64_t row_floats) {
  const int64_t bytes = std::max<int64_t>(1, row_floats * static_cast<int64_t>(sizeof(float)));
  return std::clamp(kPrefetchBytes / bytes, kPrefetchMinRows, kPrefetchMaxRows);
}

// Prefetch every line of floats [p, p + n), n >= 1. always_inline: GCC deems a function that
// only prefetches free of side effects and deletes the calls to it unless it was inlined first.
[[gnu::always_inline]] inline void prefetch_row(const float* p, int64_t n) {
  for (int64_t f = 0; f < n; f += kLineFloats) __builtin_prefetch(p + f, 0, 3);
  __builtin_prefetch(p + n - 1, 0, 3);  // a row need not start on a line boundary
}

// Threads for a loop of `work` units when each thread should get at least `grain` of them:
// below that a fork/join (microseconds, far more on oversubscribed cores) is not worth it.
inline int threads_for(int64_t work, int64_t grain) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), work / grain + 1)));
}

// Exclusive prefix sum in place over a[0..n): a[i] <- a[0] + ... + a[i-1]; returns the total.
// Two passes over per-thread blocks, so the result is independent of the thread count.
inline int64_t exclusive_scan_inplace(int64_t* a, int64_t n) {
  if (n <= 0) return 0;
  const int nt = threads_for(n, 4096);
  std::vector<int64_t> block_sum(nt + 1, 0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    int64_t s = 0;
    for (int64_t i = lo; i < hi; ++i) s += a[i];
    block_sum[t + 1] = s;
#pragma omp barrier
#pragma omp single
    for (int k = 0; k < nt; ++k) block_sum[k + 1] += block_sum[k];
    int64_t run = block_sum[t];
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t v = a[i];
      a[i] = run;
      run += v;
    }
  }
  return block_sum[nt];
}

// The indices i in [0, n) with keep(i) true, in increasing order (parallel, deterministic).
template <class Pred>
std::vector<int64_t> compact_where(int64_t n, Pred keep) {
  const int nt = threads_for(n, 65536);
  std::vector<int64_t> count(nt + 1, 0);
  std::vector<int64_t> out;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    int64_t c = 0;
    for (int64_t i = lo; i < hi; ++i) c += keep(i) ? 1 : 0;
    count[t + 1] = c;
#pragma omp barrier
#pragma omp single
    {
      for (int k = 0; k < nt; ++k) count[k + 1] += count[k];
      out.resize(count[nt]);
    }
    int64_t w = count[t];
    for (int64_t i = lo; i < hi; ++i)
      if (keep(i)) out[w++] = i;
  }
  return out;
}

}  // namespace distmb
