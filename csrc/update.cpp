// Fused UPDATE kernels (DistGNN-MB section 3.3, "Operator Fusion", "Blocking",
// "Thread-Parallelization"): the dense part of a GraphSAGE / GAT layer in one pass over its
// output, on float32 row-major buffers.
//
// All products run through one register-tiled micro-kernel: a kMR x NR tile of the output
// (NR = 32 or 16 floats) is accumulated in registers over the whole inner dimension and then
// handed to an epilogue while it is still in registers. Rows are processed in blocks of
// kRowBlock per work item (the block's input rows stay in L2 while every column tile reads
// them); the right-hand operand is packed once per call into zero-padded column panels
// [inner][NR] that stay in L1.
//
// Forward epilogues: bias, optional pre-computed addend, ReLU, dropout (mask bits from a
// counter-based hash of (seed, row, column)), packed gate bits; GAT adds the per-head
// attention scores over the block while it is hot. Backward: one pass over row blocks builds
// the pre-activation gradient tile (gate bits or ReLU state applied, bias / attention-vector
// gradients accumulated), then the input gradients of that tile and the weight gradients,
// transposed (X^T . gp: the tile's rows are the product's right-hand operand as they are),
// into private accumulators (N split into contiguous chunks that the threads take
// dynamically, one accumulator per chunk), reduced once at the end in chunk order. All
// scratch buffers start on cache lines (AlignedFloats), so no vector load straddles two.
//
// Forward values, gate bits and input gradients do not depend on the thread count; the
// reductions over N (weight, bias and attention-vector gradients) are deterministic for a
// given thread count and differ across thread counts only by float rounding.
#include <omp.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "common.h"
#include "kernels.h"
#include "rng.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "update.cpp splits 64-bit dropout hashes into 32-bit halves assuming little-endian"
#endif

namespace distmb {

namespace {

constexpr int kMR = 8;              // rows of a register tile
constexpr int kNR = 32;             // columns of a full register tile (two 16-float vectors)
constexpr int kNRTail = 16;         // columns of the last tile when fewer than kNR remain
constexpr int64_t kPad = 16;        // column padding granularity of packed panels
constexpr int64_t kRowBlock = 64;   // rows per forward work item
constexpr int64_t kBwdRowBlock = 128;  // rows per backward work item (weight-gradient depth)
constexpr int kBitsPerByte = 8;
constexpr int kUnpack = 16;         // gate bits unpacked per step in the backward pass
constexpr int64_t kChunksPerThread = 4;  // backward work chunks per thread (load balance)
constexpr int64_t kFwdChunksPerThread = 16;  // forward work chunks per thread (load balance)
constexpr int64_t kPackPrefetchRows = 8;  // rows read through ids prefetched ahead in packing
// Multiplying 8 bytes that are each 0 or 1 by this constant gathers them, in order, into the
// top byte (byte i -> bit i): the gate-bit packing of 8 columns.
constexpr uint64_t kPackBitsMagic = 0x0102040810204080ull;

static_assert(kPad % kMR == 0 && kNR % kPad == 0 && kNRTail == kPad && kPad % kUnpack == 0,
              "padded widths must split into whole tiles");

inline int64_t pad_cols(int64_t k) { return (k + kPad - 1) / kPad * kPad; }

// Width of the column tile starting at j0 of a padded width: kNR, or kNRTail at the end.
inline int tile_width(int64_t j0, int64_t padded) {
  return padded - j0 >= kNR ? kNR : kNRTail;
}

// Column tiles of a padded width (kNR wide, the last one kNRTail when fewer remain).
inline int64_t num_tiles(int64_t padded) { return (padded + kNR - 1) / kNR; }

inline int64_t bytes_per_row(int64_t k) { return (k + kBitsPerByte - 1) / kBitsPerByte; }

// One summand of a tile product: B(l, j) = b[l * ldb + j] and either A(r, l) =
// a[min(r, mr - 1) * ars + l * als] (rows past the valid mr repeat the last valid row; their
// results are discarded) or, with packed, A(r, l) = a[l * kMR + r] (A packed kMR rows at a time;
// one base pointer, so the kMR broadcasts need no extra registers).
struct Operand {
  const float* a;
  int64_t ars, als;
  const float* b;
  int64_t ldb;
  int64_t len;  // inner dimension L
  bool packed = false;
  const int64_t* rows = nullptr;  // unpacked only: A(r, l) = a[rows[min(r, mr - 1)] * ars + ...]
};

// acc[r][j] = sum over the operands of sum_{l < L} A(r, l) * B(l, j), r < kMR, j < NR; then
// epi(acc). The accumulators live in registers (kMR * NR / 16 vectors).
template <int NR, class Epilogue>
inline void micro_tile(int mr, const Operand* ops, int nops, Epilogue&& epi) {
  float acc[kMR][NR];
  for (int r = 0; r < kMR; ++r)
#pragma omp simd
    for (int j = 0; j < NR; ++j) acc[r][j] = 0.0f;
  for (int s = 0; s < nops; ++s) {
    const Operand& op = ops[s];
    if (op.packed) {
      const float* a = op.a;
      const float* b = op.b;
      for (int64_t l = 0; l < op.len; ++l, a += kMR, b += op.ldb)
        for (int r = 0; r < kMR; ++r) {
          const float av = a[r];
#pragma omp simd
          for (int j = 0; j < NR; ++j) acc[r][j] += av * b[j];
        }
      continue;
    }
    if (op.rows == nullptr && op.als == 1 && mr == kMR) {
      // Rows at a constant stride: two row pointers and three byte offsets (rows r and r + 4
      // at p + {0, 1, 2, 3} * stride) instead of kMR pointers, which do not all fit in the
      // general registers next to the loop's own.
      static_assert(kMR == 8, "the strided rows are addressed as two groups of four");
      const char* p0 = reinterpret_cast<const char*>(op.a);
      const int64_t s1 = op.ars * static_cast<int64_t>(sizeof(float)), s2 = 2 * s1, s3 = 3 * s1;
      const char* p4 = p0 + 4 * s1;
      const float* b = op.b;
      for (int64_t l = 0; l < op.len; ++l, p0 += sizeof(float), p4 += sizeof(float)) {
        const float av[kMR] = {
            *reinterpret_cast<const float*>(p0), *reinterpret_cast<const float*>(p0 + s1),
            *reinterpret_cast<const float*>(p0 + s2), *reinterpret_cast<const float*>(p0 + s3),
            *reinterpret_cast<const float*>(p4), *reinterpret_cast<const float*>(p4 + s1),
            *reinterpret_cast<const float*>(p4 + s2), *reinterpret_cast<const float*>(p4 + s3)};
        for (int r = 0; r < kMR; ++r) {
#pragma omp simd
          for (int j = 0; j < NR; ++j) acc[r][j] += av[r] * b[j];
        }
        b += op.ldb;
      }
      continue;
    }
    const float* arow[kMR];
    for (int r = 0; r < kMR; ++r) {
      const int64_t i = std::min(r, mr - 1);
      arow[r] = op.a + (op.rows != nullptr ? op.rows[i] : i) * op.ars;
    }
    for (int64_t l = 0; l < op.len; ++l) {
      const float* b = op.b + l * op.ldb;
      const int64_t al = l * op.als;
      for (int r = 0; r < kMR; ++r) {
        const float av = arow[r][al];
#pragma omp simd
        for (int j = 0; j < NR; ++j) acc[r][j] += av * b[j];
      }
    }
  }
  epi(acc);
}

// Pack B(l, j) = src[l * sl + j * sj] (l < L, j < J) into panels for micro_tile: the panel of
// columns [j0, j0 + w) starts at dst + j0 * L and is laid out [L][w]; columns >= J are zero.
// dst holds L * pad_cols(J) floats.
void pack_panels(const float* src, int64_t sl, int64_t sj, int64_t L, int64_t J, float* dst) {
  const int64_t jp = pad_cols(J);
  for (int64_t j0 = 0; j0 < jp; j0 += tile_width(j0, jp)) {
    const int w = tile_width(j0, jp);
    float* panel = dst + j0 * L;
    for (int64_t l = 0; l < L; ++l)
      for (int j = 0; j < w; ++j)
        panel[l * w + j] = j0 + j < J ? src[l * sl + (j0 + j) * sj] : 0.0f;
  }
}

// The forward product of a row block: for every kMR x NR tile of rows [i0, i0 + rows) and
// columns [0, kp), sum the sources' X_s[row] . W_s^T (packed panels) and call
// epi(acc, row0, mr, j0, width).
struct FwdSource {
  const float* x;       // [n][c], or a table whose row rows[i] is row i
  const float* panels;  // pack of W^T: [c][kp] in panels
  int64_t c;
  const int64_t* rows;  // int64[n] or null
};

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

// next (or null): the next block's inputs, a slice of them prefetched per register tile.
template <class Epilogue>
void forward_row_block(int64_t i0, int64_t rows, int64_t kp, const FwdSource* src, int nsrc,
                       NextRowsPrefetch* next, Epilogue&& epi) {
  const int64_t steps = num_tiles(kp) * ((rows + kMR - 1) / kMR);
  int64_t step = 0;
  for (int64_t j0 = 0; j0 < kp; j0 += tile_width(j0, kp)) {
    const int w = tile_width(j0, kp);
    for (int64_t r0 = 0; r0 < rows; r0 += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - r0));
      if (next != nullptr) next->advance(step++, steps);
      // Rows read through ids are scattered over their table: on the first column tile,
      // fetch the next register tile's rows while this one computes (the block's first tile
      // fetches its own).
      if (j0 == 0)
        for (int s = 0; s < nsrc; ++s)
          if (src[s].rows != nullptr)
            prefetch_indexed_rows(src[s].x, src[s].rows, src[s].c, i0 + (r0 == 0 ? 0 : r0 + kMR),
                                  i0 + std::min(rows, r0 + 2 * kMR));
      Operand ops[2];
      for (int s = 0; s < nsrc; ++s) {
        const bool indexed = src[s].rows != nullptr;
        ops[s] = {src[s].x + (indexed ? 0 : (i0 + r0) * src[s].c), src[s].c, 1,
                  src[s].panels + j0 * src[s].c, w, src[s].c, false,
                  indexed ? src[s].rows + i0 + r0 : nullptr};
      }
      if (w == kNR)
        micro_tile<kNR>(mr, ops, nsrc,
                        [&](const float(&acc)[kMR][kNR]) { epi(acc, i0 + r0, mr, j0); });
      else
        micro_tile<kNRTail>(mr, ops, nsrc,
                            [&](const float(&acc)[kMR][kNRTail]) { epi(acc, i0 + r0, mr, j0); });
    }
  }
}

int num_work_threads(int64_t work_items) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(),
                                                                   work_items)));
}

// Pack the sources' W^T for the forward product (W is [k][c], B(l = c, j = k) = W[j][l]).
std::vector<AlignedFloats> pack_forward(const UpdateSource* src, int nsrc, int64_t k) {
  std::vector<AlignedFloats> packed(nsrc);
  for (int s = 0; s < nsrc; ++s) {
    packed[s].resize(src[s].c * pad_cols(k));
    pack_panels(src[s].w, 1, src[s].c, src[s].c, k, packed[s].data());
  }
  return packed;
}

// Dropout decision of (row, col): the low or high 32 bits of mix64(row_key ^ (col / 2)) below
// threshold, row_key = hash_key(seed, row). Keep probability = threshold / 2^32.
inline uint64_t dropout_row_key(uint64_t seed, int64_t row) {
  return hash_key(seed, static_cast<uint64_t>(row));
}

inline bool dropout_keep(uint64_t row_key, int64_t col, uint64_t threshold) {
  const uint64_t h = mix64(row_key ^ static_cast<uint64_t>(col >> 1));
  const uint64_t u = (col & 1) ? (h >> 32) : (h & 0xFFFFFFFFull);
  return u < threshold;
}

// The dropout uniforms u[0 .. NR) of columns [j0, j0 + NR) of the row with key rk (j0 even):
// one 64-bit hash per column pair, whose low / high 32-bit halves (little-endian) are the
// even / odd column's, as in dropout_keep.
template <int NR>
inline void dropout_uniforms(uint64_t rk, int64_t j0, uint32_t (&u)[NR]) {
  const uint64_t pair0 = static_cast<uint64_t>(j0 >> 1);
  alignas(64) uint64_t hash[NR / 2];
#pragma omp simd
  for (int q = 0; q < NR / 2; ++q) hash[q] = mix64(rk ^ (pair0 + q));
  std::memcpy(u, hash, sizeof(u));
}

// 32-bit threshold of a keep probability in [0, 1].
uint64_t keep_threshold(double keep) {
  return static_cast<uint64_t>(std::llround(keep * 4294967296.0));
}

// Pack gate[0 .. nbytes * 8) (each 0 or 1) into nbytes bytes, column j -> bit j % 8.
inline void pack_gate_bits(const uint8_t* gate, int nbytes, uint8_t* dst) {
  for (int b = 0; b < nbytes; ++b) {
    uint64_t x;
    std::memcpy(&x, gate + b * kBitsPerByte, sizeof(x));
    dst[b] = static_cast<uint8_t>((x * kPackBitsMagic) >> 56);
  }
}

// o[0 .. jv) = v[0 .. jv) (a full-width vector store when jv == NR).
template <int NR>
inline void store_cols(const float* v, int jv, float* o) {
  if (jv == NR) {
#pragma omp simd
    for (int j = 0; j < NR; ++j) o[j] = v[j];
  } else {
    std::memcpy(o, v, sizeof(float) * jv);
  }
}

// d[0 .. kUnpack) = bit j of word ? src[j] * scale : 0, reading only src[0 .. valid) (the
// other lanes are 0): kUnpack gate bits applied at once, full-width and branch-free (a
// branch per random bit mispredicts). Used by update_backward's prologue and
// dropout_backward.
inline void apply_gate_word(uint32_t word, const float* src, int valid, float scale,
                            float* d) {
  static_assert(kUnpack == 16, "one 16-bit gate word per step");
#if defined(__AVX512F__)
  const __mmask16 lanes = valid == kUnpack ? static_cast<__mmask16>(0xFFFF)
                                           : static_cast<__mmask16>((1u << valid) - 1u);
  _mm512_storeu_ps(d, _mm512_maskz_mul_ps(static_cast<__mmask16>(word) & lanes,
                                          _mm512_maskz_loadu_ps(lanes, src),
                                          _mm512_set1_ps(scale)));
#else
  float tail[kUnpack] = {};
  if (valid < kUnpack) {
    std::copy(src, src + valid, tail);
    src = tail;
  }
#pragma omp simd
  for (int j = 0; j < kUnpack; ++j) {
    const float scaled = src[j] * scale;
    d[j] = ((word >> j) & 1u) ? scaled : 0.0f;
  }
#endif
}

#if defined(__AVX512F__)
// The forward epilogue of one row of a register tile on AVX-512, 16 columns per vector: the
// ReLU / dropout gate is a mask register, which is also the row's packed gate bits (column
// j0 + j -> bit j of the little-endian 16-bit word at byte (j0) / 8). Same values and bits as
// the portable epilogue in sage_epilogue.
template <int NR, bool kRelu, bool kDrop>
inline void sage_epilogue_row_avx512(const float (&accr)[NR], int64_t row, int jv, int64_t j0,
                                     int64_t k, const float* bias_p, const float* addend,
                                     uint64_t row_key, uint64_t threshold, float scale, float* out,
                                     uint8_t* gate_bits) {
  static_assert(NR % 16 == 0, "AVX-512 epilogue works on whole 16-float vectors");
  const int64_t kb = bytes_per_row(k);
  alignas(64) uint32_t u[NR];
  if (kDrop) dropout_uniforms(row_key, j0, u);
  const __m512i thr = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(threshold)));
  const __m512 vscale = _mm512_set1_ps(scale);
  float* o = out + row * k + j0;
  for (int q = 0; q < NR / 16; ++q) {
    const int valid = std::max(0, std::min(16, jv - 16 * q));
    if (valid == 0) break;
    const __mmask16 lanes = valid == 16 ? static_cast<__mmask16>(0xFFFF)
                                        : static_cast<__mmask16>((1u << valid) - 1u);
    __m512 v = _mm512_add_ps(_mm512_loadu_ps(accr + 16 * q), _mm512_loadu_ps(bias_p + j0 + 16 * q));
    if (addend != nullptr)
      v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, addend + row * k + j0 + 16 * q));
    if (kRelu) {
      __mmask16 gate = _mm512_mask_cmp_ps_mask(lanes, v, _mm512_setzero_ps(), _CMP_GT_OQ);
      if (kDrop)
        gate &= _mm512_cmplt_epu32_mask(_mm512_load_si512(u + 16 * q), thr);
      v = _mm512_maskz_mul_ps(gate, v, vscale);
      if (gate_bits != nullptr) {
        const int64_t byte0 = (j0 + 16 * q) / kBitsPerByte;
        uint8_t* dst = gate_bits + row * kb + byte0;
        if (kb - byte0 >= 2)
          std::memcpy(dst, &gate, 2);
        else
          dst[0] = static_cast<uint8_t>(gate);
      }
    }
    _mm512_mask_storeu_ps(o + 16 * q, lanes, v);
  }
}
#endif

// The forward epilogue of update_forward for one register tile (template flags select the
// variant at compile time so that the tile loop carries no branches). row_keys[r]: the
// dropout_row_key of row row0 + r (read only with kDrop), computed once per row for all of the
// row's column tiles.
template <int NR, bool kRelu, bool kDrop>
inline void sage_epilogue(const float (&acc)[kMR][NR], int64_t row0, int mr, int64_t j0,
                          int64_t k, const float* bias_p, const float* addend,
                          const uint64_t* row_keys, uint64_t threshold, float scale, float* out,
                          uint8_t* gate_bits) {
  const int jv = static_cast<int>(std::min<int64_t>(NR, k - j0));
#if defined(__AVX512F__)
  for (int r = 0; r < mr; ++r)
    sage_epilogue_row_avx512<NR, kRelu, kDrop>(acc[r], row0 + r, jv, j0, k, bias_p, addend,
                                               kDrop ? row_keys[r] : 0, threshold, scale, out,
                                               gate_bits);
  return;
#endif
  const int64_t kb = bytes_per_row(k);
  for (int r = 0; r < mr; ++r) {
    const int64_t row = row0 + r;
    float v[NR];
#pragma omp simd
    for (int j = 0; j < NR; ++j) v[j] = acc[r][j] + bias_p[j0 + j];
    if (addend != nullptr) {
      const float* ad = addend + row * k + j0;
#pragma omp simd
      for (int j = 0; j < jv; ++j) v[j] += ad[j];
    }
    float* o = out + row * k + j0;
    if (!kRelu) {
      store_cols<NR>(v, jv, o);
      continue;
    }
    alignas(64) uint8_t gate[NR];
    if (kDrop) {
      const uint32_t threshold32 = static_cast<uint32_t>(threshold);  // < 2^32 with kDrop
      alignas(64) uint32_t u[NR];
      dropout_uniforms(row_keys[r], j0, u);
#pragma omp simd
      for (int j = 0; j < NR; ++j) gate[j] = (v[j] > 0.0f) & (u[j] < threshold32);
    } else {
#pragma omp simd
      for (int j = 0; j < NR; ++j) gate[j] = v[j] > 0.0f;
    }
    // Full-width, branch-free (the gates are random): a select per unit, then the store.
#pragma omp simd
    for (int j = 0; j < NR; ++j) {
      gate[j] &= static_cast<uint8_t>(j < jv);
      const float scaled = v[j] * scale;
      v[j] = gate[j] ? scaled : 0.0f;
    }
    store_cols<NR>(v, jv, o);
    if (gate_bits != nullptr) {
      const int nbytes =
          static_cast<int>(std::min<int64_t>(NR / kBitsPerByte, kb - j0 / kBitsPerByte));
      pack_gate_bits(gate, nbytes, gate_bits + row * kb + j0 / kBitsPerByte);
    }
  }
}

template <bool kRelu, bool kDrop>
void update_forward_impl(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                         const float* addend, const float* bias, uint64_t seed,
                         uint64_t threshold, float scale, float* out, uint8_t* gate_bits) {
  const int64_t kp = pad_cols(k);
  AlignedFloats bias_p(kp, 0.0f);
  std::copy(bias, bias + k, bias_p.begin());
  const auto packed = pack_forward(src, nsrc, k);
  FwdSource fsrc[2];
  for (int s = 0; s < nsrc; ++s) fsrc[s] = {src[s].x, packed[s].data(), src[s].c, src[s].rows};
  // Contiguous chunks of row blocks taken dynamically: within a chunk the next block is
  // known, so its input rows are prefetched while the current one computes.
  const int64_t nblocks = (n + kRowBlock - 1) / kRowBlock;
  const int nt = num_work_threads(nblocks);
  const int64_t nchunks = std::min<int64_t>(nblocks, kFwdChunksPerThread * nt);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t chunk = 0; chunk < nchunks; ++chunk) {
    const int64_t end = (chunk + 1) * nblocks / nchunks;
    for (int64_t blk = chunk * nblocks / nchunks; blk < end; ++blk) {
      const int64_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, n - i0);
      NextRowsPrefetch next;
      if (blk + 1 < end) {
        const int64_t i1 = i0 + rows, rows1 = std::min(kRowBlock, n - i1);
        for (int s = 0; s < nsrc; ++s)
          if (src[s].rows == nullptr) next.add(src[s].x + i1 * src[s].c, rows1 * src[s].c);
        next.add(addend == nullptr ? nullptr : addend + i1 * k, rows1 * k);
      }
      uint64_t row_keys[kRowBlock];
      if (kDrop)
        for (int64_t r = 0; r < rows; ++r) row_keys[r] = dropout_row_key(seed, i0 + r);
      forward_row_block(
          i0, rows, kp, fsrc, nsrc, &next,
          [&](const auto& acc, int64_t row0, int mr, int64_t j0) {
            sage_epilogue<std::extent<std::remove_reference_t<decltype(acc)>, 1>::value, kRelu,
                          kDrop>(acc, row0, mr, j0, k, bias_p.data(), addend,
                                 row_keys + (row0 - i0), threshold, scale, out, gate_bits);
          });
    }
  }
}

void check_sources(int64_t k, const UpdateSource* src, int nsrc,
                   const UpdateGrads* grads = nullptr) {
  if (k < 1) throw std::invalid_argument("the output width k must be >= 1");
  if (nsrc < 0 || nsrc > kMaxUpdateSources)
    throw std::invalid_argument("an UPDATE takes 0 to 2 sources");
  for (int s = 0; s < nsrc; ++s) {
    if (src[s].c < 1) throw std::invalid_argument("a source width c must be >= 1");
    if (grads != nullptr && src[s].rows != nullptr && grads[s].grad_x != nullptr)
      throw std::invalid_argument("a source read through row ids has no input gradient");
  }
}

// ---- backward engine ---------------------------------------------------------------------

// Per-thread scratch of the backward pass.
struct BwdScratch {
  AlignedFloats gp;  // [kBwdRowBlock][kp]: pre-activation gradient tile, zero-padded
  AlignedFloats xk;  // a source's rows repacked as [pad_rows(c) / kMR][rows][kMR], zero-padded
                     // (the weight gradient's operand A)
};

// Work split of the backward pass: the row blocks are cut into a fixed number of contiguous
// chunks (kChunksPerThread per thread, at most one per block), taken dynamically by the threads
// (a thread descheduled by other load does not hold the others up). Every chunk accumulates
// its own weight / bias / attention-vector gradients, summed in chunk order at the end, so the
// result is deterministic for a given thread count.
struct BwdSplit {
  int nt;           // threads
  int64_t nblocks;  // row blocks of kBwdRowBlock rows
  int64_t nchunks;
  int64_t chunk_begin(int64_t chunk) const { return chunk * nblocks / nchunks; }
};

BwdSplit backward_split(int64_t n) {
  const int64_t nblocks = (n + kBwdRowBlock - 1) / kBwdRowBlock;
  const int nt = num_work_threads(nblocks);
  return {nt, nblocks, std::max<int64_t>(1, std::min<int64_t>(nblocks, kChunksPerThread * nt))};
}

// out[i] = sum of parts[c * stride + i] over c < nparts, in order of c, for i < count.
inline void sum_parts(const float* parts, int64_t nparts, size_t stride, int64_t count,
                      float* out) {
  for (int64_t i = 0; i < count; ++i) {
    float sum = 0.0f;
    for (int64_t c = 0; c < nparts; ++c) sum += parts[c * stride + i];
    out[i] = sum;
  }
}

// c rounded up to whole kMR-row tiles: the rows of a weight gradient's transpose as the
// backward pass accumulates it.
inline int64_t pad_rows(int64_t c) { return (c + kMR - 1) / kMR * kMR; }

// Row stride of the backward's gradient tile gp (floats): one cache line more than its padded
// width. With a width of 256 floats the rows would be 1 KiB apart, and a column tile's 2 x 128
// lines (the weight gradient's operand B, read down the rows) would fall into 8 of L1's 64 sets
// and evict each other; the extra line spreads them over all sets.
inline int64_t gp_stride(int64_t kp) { return kp + kLineFloats; }

// Rows [i0, i0 + rows) of a row-major x[.][c] (row i at x + (ids ? ids[i] : i) * c) repacked
// kMR columns at a time: dst[(c0 / kMR) * rows * kMR + r * kMR + q] = X[i0 + r][c0 + q] (0 for
// c0 + q >= c).
inline void pack_column_groups(const float* x, const int64_t* ids, int64_t i0, int64_t rows,
                               int64_t c, float* dst) {
  const auto row = [&](int64_t r) { return x + (ids != nullptr ? ids[i0 + r] : i0 + r) * c; };
  const int64_t full = c / kMR * kMR;
  if (ids != nullptr) {  // scattered rows: each read whole, the next ones prefetched
    prefetch_indexed_rows(x, ids, c, i0, i0 + std::min(rows, kPackPrefetchRows));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t ahead = r + kPackPrefetchRows;
      if (ahead < rows) prefetch_indexed_rows(x, ids, c, i0 + ahead, i0 + ahead + 1);
      const float* xr = row(r);
      for (int64_t c0 = 0; c0 < full; c0 += kMR)
        std::memcpy(dst + c0 * rows + r * kMR, xr + c0, kMR * sizeof(float));
      for (int q = 0; full < c && q < kMR; ++q)
        dst[full * rows + r * kMR + q] = full + q < c ? xr[full + q] : 0.0f;
    }
    return;
  }
  for (int64_t c0 = 0; c0 < full; c0 += kMR) {
    float* d = dst + c0 * rows;
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + r * kMR, row(r) + c0, kMR * sizeof(float));
  }
  if (full < c) {
    float* d = dst + full * rows;
    for (int64_t r = 0; r < rows; ++r)
      for (int q = 0; q < kMR; ++q) d[r * kMR + q] = full + q < c ? row(r)[full + q] : 0.0f;
  }
}

// The shared backward pass. prologue(chunk, i0, rows, gp) fills gp[rows][kp] with the
// pre-activation gradient of rows [i0, i0 + rows) (columns >= k zero) and may accumulate the
// chunk's private reductions; then, per source, grad_x = gp . W and grad_w += gp^T . X, and
// grad_bias += column sums of gp. The weight gradient is accumulated transposed, X^T . gp,
// tiles over (c, k): gp's rows are operand B as they are (no repacking), and k (a multiple of
// 16, usually of 32) fills whole register tiles where c often does not. The caller sizes the
// prologue's per-chunk privates from split.nchunks and zeroes them. gp's rows are
// gp_stride(kp) floats apart. While a block computes, the next block of its chunk is fetched
// toward L2 a slice per tile (NextRowsPrefetch): the contiguous sources' rows and the ranges
// that prologue_inputs(i0, rows, next) adds for the prologue's inputs of rows [i0, i0 + rows).
template <class Prologue, class PrologueInputs>
void backward_engine(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                     const UpdateGrads* grads, float* grad_bias, const BwdSplit& split,
                     Prologue&& prologue, PrologueInputs&& prologue_inputs) {
  const int64_t kp = pad_cols(k);
  const int64_t nchunks = split.nchunks;
  std::vector<AlignedFloats> wpanels(nsrc);
  std::vector<AlignedFloats> wpart(nsrc);  // [nchunks][pad_rows(c)][kp] (transposed), zeroed
                                           // per chunk
  int64_t max_cr = 0;
  for (int s = 0; s < nsrc; ++s) {
    const int64_t cp = pad_cols(src[s].c);
    if (grads[s].grad_x != nullptr) {  // B(l = k, j = c) = W[l][j]
      wpanels[s].resize(k * cp);
      pack_panels(src[s].w, src[s].c, 1, k, src[s].c, wpanels[s].data());
    }
    if (grads[s].grad_w != nullptr) {
      wpart[s].resize(static_cast<size_t>(nchunks) * pad_rows(src[s].c) * kp);
      max_cr = std::max(max_cr, pad_rows(src[s].c));
    }
  }
  AlignedFloats bpart(static_cast<size_t>(nchunks) * kp, 0.0f);
  const int64_t gs = gp_stride(kp);

#pragma omp parallel num_threads(split.nt)
  {
    BwdScratch scratch;
    scratch.gp.assign(kBwdRowBlock * gs, 0.0f);
    scratch.xk.assign(kBwdRowBlock * max_cr, 0.0f);
    float* gp = scratch.gp.data();
#pragma omp for schedule(dynamic, 1)
    for (int64_t chunk = 0; chunk < nchunks; ++chunk) {
      float* db = bpart.data() + static_cast<size_t>(chunk) * kp;
      for (int s = 0; s < nsrc; ++s)
        if (!wpart[s].empty()) {
          const size_t size = static_cast<size_t>(kp) * pad_rows(src[s].c);
          std::fill_n(wpart[s].data() + chunk * size, size, 0.0f);
        }
      for (int64_t blk = split.chunk_begin(chunk); blk < split.chunk_begin(chunk + 1); ++blk) {
        const int64_t i0 = blk * kBwdRowBlock, rows = std::min(kBwdRowBlock, n - i0);
        // Sources read through ids: the next block's rows (scattered over their tables) are
        // fetched a row per weight-gradient tile while this block computes.
        const bool next_in_chunk = blk + 1 < split.chunk_begin(chunk + 1);
        const int64_t next_rows = next_in_chunk ? std::min(kBwdRowBlock, n - i0 - rows) : 0;
        NextRowsPrefetch next;
        if (next_rows > 0) {
          prologue_inputs(i0 + rows, next_rows, next);
          for (int s = 0; s < nsrc; ++s)
            if (src[s].rows == nullptr && grads[s].grad_w != nullptr)
              next.add(src[s].x + (i0 + rows) * src[s].c, next_rows * src[s].c);
        }
        int64_t steps = 0, step = 0;
        for (int s = 0; s < nsrc; ++s) {
          const int64_t cp = pad_cols(src[s].c);
          if (grads[s].grad_x != nullptr) steps += num_tiles(cp) * ((rows + kMR - 1) / kMR);
          if (grads[s].grad_w != nullptr) steps += num_tiles(kp) * (pad_rows(src[s].c) / kMR);
        }
        int64_t fetched = 0;
        const auto fetch_next_row = [&]() {
          if (fetched == next_rows) return;
          for (int s = 0; s < nsrc; ++s)
            if (src[s].rows != nullptr && grads[s].grad_w != nullptr)
              prefetch_indexed_rows(src[s].x, src[s].rows, src[s].c, i0 + rows + fetched,
                                    i0 + rows + fetched + 1);
          ++fetched;
        };
        prologue(chunk, i0, rows, gp);
        for (int64_t r = 0; r < rows; ++r) {
          const float* g = gp + r * gs;
#pragma omp simd
          for (int64_t j = 0; j < kp; ++j) db[j] += g[j];
        }
        for (int s = 0; s < nsrc; ++s) {
          const int64_t c = src[s].c, cp = pad_cols(c);
          // Input gradient: grad_x[rows] = gp . W, tiles over (rows, c).
          if (float* gx = grads[s].grad_x) {
            for (int64_t j0 = 0; j0 < cp; j0 += tile_width(j0, cp)) {
              const int w = tile_width(j0, cp);
              const int jv = static_cast<int>(std::min<int64_t>(w, c - j0));
              for (int64_t r0 = 0; r0 < rows; r0 += kMR) {
                const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - r0));
                next.advance(step++, steps);
                const Operand op{gp + r0 * gs, gs, 1, wpanels[s].data() + j0 * k, w, k};
                auto store = [&](const auto& acc) {
                  for (int r = 0; r < mr; ++r) {
                    float* o = gx + (i0 + r0 + r) * c + j0;
#pragma omp simd
                    for (int j = 0; j < jv; ++j) o[j] = acc[r][j];
                  }
                };
                if (w == kNR)
                  micro_tile<kNR>(mr, &op, 1, store);
                else
                  micro_tile<kNRTail>(mr, &op, 1, store);
              }
            }
          }
          // Weight gradient, transposed: wpriv[t]^T += X[rows]^T . gp, tiles over (c, k),
          // depth = rows: X's rows repacked kMR columns at a time (operand A, broadcast);
          // gp's rows as they are (operand B; a column tile's lines stay in L1 while the c
          // tiles pass).
          if (grads[s].grad_w != nullptr) {
            float* xk = scratch.xk.data();
            pack_column_groups(src[s].x, src[s].rows, i0, rows, c, xk);
            const int64_t cr = pad_rows(c);
            float* acc_w = wpart[s].data() + static_cast<size_t>(chunk) * cr * kp;
            for (int64_t j0 = 0; j0 < kp; j0 += tile_width(j0, kp)) {
              const int w = tile_width(j0, kp);
              for (int64_t c0 = 0; c0 < cr; c0 += kMR) {
                fetch_next_row();
                next.advance(step++, steps);
                const Operand op{xk + c0 * rows, 0, 0, gp + j0, gs, rows, true};
                auto add = [&](const auto& acc) {
                  constexpr int NR = std::extent<std::remove_reference_t<decltype(acc)>, 1>::value;
                  for (int r = 0; r < kMR; ++r) {
                    float* o = acc_w + (c0 + r) * kp + j0;
#pragma omp simd
                    for (int j = 0; j < NR; ++j) o[j] += acc[r][j];
                  }
                };
                if (w == kNR)
                  micro_tile<kNR>(kMR, &op, 1, add);
                else
                  micro_tile<kNRTail>(kMR, &op, 1, add);
              }
            }
          }
        }
      }
    }
  }

  // Reduction of the per-chunk accumulators in chunk order (parallel over rows of the
  // transpose), written back transposed: grad_w[kk][cc] = sum over chunks of part[cc][kk].
  for (int s = 0; s < nsrc; ++s) {
    float* gw = grads[s].grad_w;
    if (gw == nullptr) continue;
    const int64_t c = src[s].c;
    const size_t stride = static_cast<size_t>(pad_rows(c)) * kp;
    const float* part = wpart[s].data();
#pragma omp parallel num_threads(split.nt)
    {
      AlignedFloats row(k);
#pragma omp for schedule(static)
      for (int64_t cc = 0; cc < c; ++cc) {
        sum_parts(part + cc * kp, nchunks, stride, k, row.data());
        for (int64_t kk = 0; kk < k; ++kk) gw[kk * c + cc] = row[kk];
      }
    }
  }
  if (grad_bias != nullptr) sum_parts(bpart.data(), nchunks, kp, k, grad_bias);
}


}  // namespace

// ---- GraphSAGE UPDATE ----------------------------------------------------------------------

void update_forward(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                    const float* addend, const float* bias, bool relu, double p_drop,
                    uint64_t seed, float* out, uint8_t* gate_bits) {
  check_sources(k, src, nsrc);
  if (!(p_drop >= 0.0 && p_drop <= 1.0))
    throw std::invalid_argument("the dropout probability must be in [0, 1]");
  if (n <= 0) return;
  const uint64_t threshold = keep_threshold(1.0 - p_drop);
  // A keep threshold of 2^32 (p_drop below 2^-33) keeps every unit: no hashing needed.
  const bool drop = relu && p_drop > 0.0 && threshold < (uint64_t{1} << 32);
  const float scale = p_drop < 1.0 ? static_cast<float>(1.0 / (1.0 - p_drop)) : 0.0f;
  if (!relu)
    update_forward_impl<false, false>(n, k, src, nsrc, addend, bias, seed, threshold, 1.0f, out,
                                      nullptr);
  else if (drop)
    update_forward_impl<true, true>(n, k, src, nsrc, addend, bias, seed, threshold, scale, out,
                                    gate_bits);
  else
    update_forward_impl<true, false>(n, k, src, nsrc, addend, bias, seed, threshold, scale, out,
                                     gate_bits);
}

namespace {

// d[0 .. kp) = the pre-activation gradient of one row from its output gradient g[0 .. k) (d == g
// allowed): g * scale where the row's gate bit is set, else 0 (bits null: g as it is); columns
// >= k zero.
inline void gate_row(const float* g, const uint8_t* bits, int64_t k, int64_t kp, float scale,
                     float* d) {
  if (bits == nullptr) {
    if (d != g) std::copy(g, g + k, d);
  } else {
    // 16 columns per step from their two gate bytes as one 16-bit word (kp >= 16 * steps).
    const int64_t kb = bytes_per_row(k);
    for (int64_t j0 = 0; j0 < k; j0 += kUnpack) {
      const int64_t b0 = j0 / kBitsPerByte;
      const uint32_t word =
          bits[b0] | (b0 + 1 < kb ? static_cast<uint32_t>(bits[b0 + 1]) << 8 : 0u);
      apply_gate_word(word, g + j0, static_cast<int>(std::min<int64_t>(kUnpack, k - j0)), scale,
                      d + j0);
    }
  }
  std::fill(d + k, d + kp, 0.0f);
}

}  // namespace

void update_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* gate_bits,
                     float scale, const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                     float* grad_bias, float* grad_addend) {
  check_sources(k, src, nsrc, grads);
  const int64_t kb = bytes_per_row(k), kp = pad_cols(k), gs = gp_stride(kp);
  backward_engine(n, k, src, nsrc, grads, grad_bias, backward_split(n),
                  [&](int64_t, int64_t i0, int64_t rows, float* gp) {
                    for (int64_t row = i0; row < i0 + rows; ++row) {
                      float* d = gp + (row - i0) * gs;
                      gate_row(grad_out + row * k,
                               gate_bits == nullptr ? nullptr : gate_bits + row * kb, k, kp,
                               scale, d);
                      if (grad_addend != nullptr) std::copy(d, d + k, grad_addend + row * k);
                    }
                  },
                  [&](int64_t i0, int64_t rows, NextRowsPrefetch& next) {
                    next.add(grad_out + i0 * k, rows * k);
                    if (gate_bits != nullptr) next.add_bytes(gate_bits + i0 * kb, rows * kb);
                  });
}

void update_backward_aggregated(int64_t n, int64_t k, const int64_t* next_indptr,
                                int64_t n_next_dst, const int64_t* t_indptr, const int64_t* t_dst,
                                AggKind kind, const float* grad_dst, const float* addend,
                                int64_t n_addend, const uint8_t* gate_bits, float scale,
                                const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                                float* grad_bias) {
  check_sources(k, src, nsrc, grads);
  if (kind == AggKind::kGcn)
    throw std::invalid_argument("update_backward_aggregated: the gcn aggregator is not supported");
  const int64_t kb = bytes_per_row(k), kp = pad_cols(k), gs = gp_stride(kp);
  // Per destination weight of the next layer's aggregation (aggregate_backward's scale).
  std::vector<float> weight(n_next_dst);
  for (int64_t v = 0; v < n_next_dst; ++v)
    weight[v] = agg_scale(kind, next_indptr[v + 1] - next_indptr[v]);
  const float* w = weight.data();
  const int64_t ahead = prefetch_rows(k);
  backward_engine(n, k, src, nsrc, grads, grad_bias, backward_split(n),
                  [&](int64_t, int64_t i0, int64_t rows, float* gp) {
                    for (int64_t u = i0; u < i0 + rows; ++u) {
                      float* __restrict d = gp + (u - i0) * gs;
                      std::fill(d, d + k, 0.0f);
                      const int64_t end = t_indptr[u + 1];
                      for (int64_t j = t_indptr[u]; j < end; ++j) {
                        if (j + ahead < end) prefetch_row(grad_dst + t_dst[j + ahead] * k, k);
                        const float* __restrict r = grad_dst + t_dst[j] * k;
                        const float wv = w[t_dst[j]];
#pragma omp simd
                        for (int64_t f = 0; f < k; ++f) d[f] += wv * r[f];
                      }
                      if (u < n_addend) {
                        const float* __restrict a = addend + u * k;
#pragma omp simd
                        for (int64_t f = 0; f < k; ++f) d[f] += a[f];
                      }
                      gate_row(d, gate_bits == nullptr ? nullptr : gate_bits + u * kb, k, kp,
                               scale, d);
                    }
                  },
                  [&](int64_t i0, int64_t rows, NextRowsPrefetch& next) {
                    if (i0 < n_addend)
                      next.add(addend + i0 * k, (std::min(i0 + rows, n_addend) - i0) * k);
                    if (gate_bits != nullptr) next.add_bytes(gate_bits + i0 * kb, rows * kb);
                  });
}

void dropout_keep_mask(uint64_t seed, int64_t n, int64_t k, double p_drop, uint8_t* keep) {
  if (!(p_drop >= 0.0 && p_drop <= 1.0))
    throw std::invalid_argument("the dropout probability must be in [0, 1]");
  const uint64_t threshold = keep_threshold(1.0 - p_drop);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const uint64_t rk = dropout_row_key(seed, row);
    for (int64_t col = 0; col < k; ++col)
      keep[row * k + col] = p_drop > 0.0 ? dropout_keep(rk, col, threshold) : 1;
  }
}

// ---- standalone dropout ------------------------------------------------------------------------

// Contract: dropout_forward / dropout_backward in kernels.h. Rows in parallel; per row, kNR
// columns at a time: their uniforms (dropout_uniforms, as sage_epilogue), a select per unit,
// the keep bits packed 8 columns per byte; the last k % kNR columns one by one.
void dropout_forward(int64_t n, int64_t k, const float* x, double p_drop, uint64_t seed,
                     float* out, uint8_t* bits) {
  if (!(p_drop >= 0.0 && p_drop <= 1.0))
    throw std::invalid_argument("the dropout probability must be in [0, 1]");
  const uint64_t threshold = keep_threshold(1.0 - p_drop);
  const float scale = p_drop < 1.0 ? static_cast<float>(1.0 / (1.0 - p_drop)) : 0.0f;
  const int64_t kb = bytes_per_row(k);
  const int64_t full = k / kNR * kNR;
  // A keep threshold of 2^32 (p_drop below 2^-33) keeps every unit.
  const bool keep_all = threshold >= (uint64_t{1} << 32);
  const uint32_t threshold32 = keep_all ? 0u : static_cast<uint32_t>(threshold);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const uint64_t rk = dropout_row_key(seed, row);
    const float* xr = x + row * k;
    float* o = out + row * k;
    uint8_t* br = bits + row * kb;
    std::fill(br, br + kb, uint8_t{0});
    for (int64_t j0 = 0; j0 < full; j0 += kNR) {
      alignas(64) uint32_t u[kNR];
      dropout_uniforms(rk, j0, u);
#if defined(__AVX512F__)
      // The keep mask of 16 columns is a mask register, stored as their two gate bytes.
      for (int q = 0; q < kNR / 16; ++q) {
        const __mmask16 keep =
            keep_all ? static_cast<__mmask16>(0xFFFF)
                     : _mm512_cmplt_epu32_mask(_mm512_load_si512(u + 16 * q),
                                               _mm512_set1_epi32(static_cast<int>(threshold32)));
        _mm512_storeu_ps(o + j0 + 16 * q,
                         _mm512_maskz_mul_ps(keep, _mm512_loadu_ps(xr + j0 + 16 * q),
                                             _mm512_set1_ps(scale)));
        std::memcpy(br + (j0 + 16 * q) / kBitsPerByte, &keep, 2);
      }
      continue;
#endif
      alignas(64) uint8_t gate[kNR];
#pragma omp simd
      for (int j = 0; j < kNR; ++j) {
        gate[j] = keep_all | (u[j] < threshold32);
        o[j0 + j] = gate[j] ? xr[j0 + j] * scale : 0.0f;
      }
      pack_gate_bits(gate, kNR / kBitsPerByte, br + j0 / kBitsPerByte);
    }
    for (int64_t col = full; col < k; ++col) {
      const bool keep = dropout_keep(rk, col, threshold);
      o[col] = keep ? xr[col] * scale : 0.0f;
      br[col / kBitsPerByte] |= static_cast<uint8_t>(keep) << (col % kBitsPerByte);
    }
  }
}

void dropout_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* bits,
                      float scale, float* grad_in) {
  const int64_t kb = bytes_per_row(k);
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* br = bits + row * kb;
    const float* g = grad_out + row * k;
    float* d = grad_in + row * k;
    // kUnpack columns per step from their two bytes as one 16-bit word (apply_gate_word);
    // the last k % kUnpack columns one by one.
    const int64_t full = k / kUnpack * kUnpack;
    for (int64_t j0 = 0; j0 < full; j0 += kUnpack) {
      const int64_t b0 = j0 / kBitsPerByte;
      const uint32_t word = br[b0] | static_cast<uint32_t>(br[b0 + 1]) << 8;
      apply_gate_word(word, g + j0, kUnpack, scale, d + j0);
    }
    for (int64_t col = full; col < k; ++col) {
      const bool keep = (br[col / kBitsPerByte] >> (col % kBitsPerByte)) & 1;
      d[col] = keep ? g[col] * scale : 0.0f;
    }
  }
}

// ---- GAT projection --------------------------------------------------------------------------

void gat_projection_forward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                            const float* w, const float* bias, const float* attn_l,
                            const float* attn_r, bool relu, float* z, float* el, float* er) {
  const int64_t k = heads * d;
  const UpdateSource src{x, w, c};
  check_sources(k, &src, 1);
  if (n <= 0) return;
  const int64_t kp = pad_cols(k);
  AlignedFloats bias_p(kp, 0.0f);
  std::copy(bias, bias + k, bias_p.begin());
  const auto packed = pack_forward(&src, 1, k);
  const FwdSource fsrc{x, packed[0].data(), c, nullptr};
  const int64_t nblocks = (n + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_work_threads(nblocks))
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t i0 = blk * kRowBlock, rows = std::min(kRowBlock, n - i0);
    forward_row_block(i0, rows, kp, &fsrc, 1, nullptr,
                      [&](const auto& acc, int64_t row0, int mr, int64_t j0) {
                        constexpr int NR =
                            std::extent<std::remove_reference_t<decltype(acc)>, 1>::value;
                        const int jv = static_cast<int>(std::min<int64_t>(NR, k - j0));
                        for (int r = 0; r < mr; ++r) {
                          float* o = z + (row0 + r) * k + j0;
#pragma omp simd
                          for (int j = 0; j < jv; ++j) {
                            const float v = acc[r][j] + bias_p[j0 + j];
                            o[j] = relu ? std::max(v, 0.0f) : v;
                          }
                        }
                      });
    // Attention scores of the block while its z rows are in cache.
    for (int64_t row = i0; row < i0 + rows; ++row) {
      const float* zr = z + row * k;
      for (int64_t h = 0; h < heads; ++h) {
        float sl = 0.0f, sr = 0.0f;
        const float* zh = zr + h * d;
        const float* al = attn_l + h * d;
        const float* ar = attn_r + h * d;
#pragma omp simd reduction(+ : sl, sr)
        for (int64_t j = 0; j < d; ++j) {
          sl += zh[j] * al[j];
          sr += zh[j] * ar[j];
        }
        el[row * heads + h] = sl;
        er[row * heads + h] = sr;
      }
    }
  }
}

void gat_projection_backward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                             const float* w, const float* z, const float* attn_l,
                             const float* attn_r, bool relu, const float* grad_z,
                             const float* grad_el, const float* grad_er, float* grad_x,
                             float* grad_w, float* grad_bias, float* grad_attn_l,
                             float* grad_attn_r) {
  const int64_t k = heads * d, kp = pad_cols(k), gs = gp_stride(kp);
  const UpdateSource src{x, w, c};
  check_sources(k, &src, 1);
  const UpdateGrads grads{grad_x, grad_w};
  const BwdSplit split = backward_split(n);
  // Per-chunk gradients of attn_l and attn_r: [nchunks][kp] each.
  AlignedFloats al_part(static_cast<size_t>(split.nchunks) * kp, 0.0f), ar_part(al_part);
  backward_engine(n, k, &src, 1, &grads, grad_bias, split,
                  [&](int64_t chunk, int64_t i0, int64_t rows, float* gp) {
                    float* gal = al_part.data() + static_cast<size_t>(chunk) * kp;
                    float* gar = ar_part.data() + static_cast<size_t>(chunk) * kp;
                    for (int64_t r = 0; r < rows; ++r) {
                      const int64_t row = i0 + r;
                      const float* zr = z + row * k;
                      const float* gz = grad_z + row * k;
                      float* dst = gp + r * gs;
                      for (int64_t h = 0; h < heads; ++h) {
                        const float gl = grad_el[row * heads + h];
                        const float gr = grad_er[row * heads + h];
                        const int64_t o = h * d;
#pragma omp simd
                        for (int64_t j = o; j < o + d; ++j) {
                          const float dz = gz[j] + gl * attn_l[j] + gr * attn_r[j];
                          gal[j] += gl * zr[j];
                          gar[j] += gr * zr[j];
                          dst[j] = (!relu || zr[j] > 0.0f) ? dz : 0.0f;
                        }
                      }
                      std::fill(dst + k, dst + kp, 0.0f);
                    }
                  },
                  [&](int64_t i0, int64_t rows, NextRowsPrefetch& next) {
                    next.add(z + i0 * k, rows * k);
                    next.add(grad_z + i0 * k, rows * k);
                  });
  sum_parts(al_part.data(), split.nchunks, kp, k, grad_attn_l);
  sum_parts(ar_part.data(), split.nchunks, kp, k, grad_attn_r);
}

}  // namespace distmb
