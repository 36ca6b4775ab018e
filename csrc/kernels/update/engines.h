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
// With bf16 (--precision bf16 on the CPU) both engines run their products over bfloat16 pairs
// instead (pairs.h: micro_tile_pairs, operands rounded as they are packed); everything else
// stays as described here.
//
// Forward values, gate bits and input gradients do not depend on the thread count; the
// reductions over N (weight, bias and attention-vector gradients) are deterministic for a
// given thread count and differ across thread counts only by float rounding.
//
// This header holds the two engines (forward_row_block, backward_engine) and their work
// splits, internal to csrc/kernels/update/; the entry points (update.h) that drive them are
// sage.cpp, gat_projection.cpp and dropout.cpp.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "common.h"
#include "packing.h"
#include "pairs.h"
#include "prefetch.h"
#include "tiling.h"
#include "update.h"

namespace distmb {
namespace update_detail {

constexpr int64_t kRowBlock = 64;  // rows per forward work item
constexpr int64_t kBwdRowBlock = 128;  // rows per backward work item (weight-gradient depth)
constexpr int64_t kChunksPerThread = 4;  // backward work chunks per thread (load balance)
constexpr int64_t kFwdChunksPerThread = 16;  // forward work chunks per thread (load balance)

// A source of the forward product: X_s and its packed W_s^T.
struct FwdSource {
  const float* x;       // [n][c], or a table whose row rows[i] is row i
  const float* panels;  // pack of W^T: [c][kp] in panels
  int64_t c;
  const int64_t* rows;  // int64[n] or null
};

// The forward product of a row block: for every kMR x NR tile of rows [i0, i0 + rows) and
// columns [0, kp), sum the sources' X_s[row] . W_s^T (packed panels) and call
// epi(acc, row0, mr, j0, width). next (or null): the next block's inputs, a slice of them
// prefetched per register tile.
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

// A source of the forward product over bfloat16 pairs (pairs.h): X_s, converted a row block
// at a time, and its W_s^T packed in pair panels.
struct PairFwdSource {
  const float* x;         // [n][c], or a table whose row rows[i] is row i
  const uint32_t* panels;  // pack_pair_panels of W^T: [pair_count(c)][kp] in panels
  int64_t c;
  const int64_t* rows;  // int64[n] or null
};

// forward_row_block over bfloat16 pairs: each source's rows [i0, i0 + rows) are converted into
// scratch (kRowBlock * pair_count(c_s) words per source, in order), rows past the block's up
// to a whole register tile zero, then every kMR x NR tile's sums go to epi as in
// forward_row_block.
template <class Epilogue>
void forward_row_block_pairs(int64_t i0, int64_t rows, int64_t kp, const PairFwdSource* src,
                             int nsrc, NextRowsPrefetch* next, uint32_t* scratch,
                             Epilogue&& epi) {
  const int64_t tile_rows = (rows + kMR - 1) / kMR * kMR;
  uint32_t* xs[kMaxUpdateSources];
  uint32_t* at = scratch;
  for (int s = 0; s < nsrc; ++s) {
    const int64_t c = src[s].c, c2 = pair_count(c);
    xs[s] = at;
    at += kRowBlock * c2;
    const int64_t* ids = src[s].rows;
    if (ids != nullptr)
      prefetch_indexed_rows(src[s].x, ids, c, i0, i0 + std::min(rows, kPackPrefetchRows));
    for (int64_t r = 0; r < rows; ++r) {
      if (ids != nullptr && r + kPackPrefetchRows < rows)
        prefetch_indexed_rows(src[s].x, ids, c, i0 + r + kPackPrefetchRows,
                              i0 + r + kPackPrefetchRows + 1);
      row_to_pairs(src[s].x + (ids != nullptr ? ids[i0 + r] : i0 + r) * c, c, xs[s] + r * c2);
    }
    std::fill(xs[s] + rows * c2, xs[s] + tile_rows * c2, 0u);
  }
  const int64_t steps = num_tiles(kp) * (tile_rows / kMR);
  int64_t step = 0;
  for (int64_t j0 = 0; j0 < kp; j0 += tile_width(j0, kp)) {
    const int w = tile_width(j0, kp);
    for (int64_t r0 = 0; r0 < rows; r0 += kMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMR, rows - r0));
      if (next != nullptr) next->advance(step++, steps);
      PairOperand ops[kMaxUpdateSources];
      for (int s = 0; s < nsrc; ++s) {
        const int64_t c2 = pair_count(src[s].c);
        ops[s] = {xs[s] + r0 * c2, c2, src[s].panels + j0 * c2, w, c2};
      }
      if (w == kNR)
        micro_tile_pairs<kNR>(ops, nsrc,
                              [&](const float(&acc)[kMR][kNR]) { epi(acc, i0 + r0, mr, j0); });
      else
        micro_tile_pairs<kNRTail>(
            ops, nsrc, [&](const float(&acc)[kMR][kNRTail]) { epi(acc, i0 + r0, mr, j0); });
    }
  }
}

// The forward products of one call, in float32 or over bfloat16 pairs: the sources' weights
// packed once, and row_block, forward_row_block or forward_row_block_pairs for a block. Each
// thread passes its own scratch (scratch_words() words; none in float32).
class ForwardProducts {
 public:
  ForwardProducts(const UpdateSource* src, int nsrc, int64_t k, bool bf16)
      : nsrc_(nsrc), kp_(pad_cols(k)), bf16_(bf16) {
    if (!bf16) {
      packed_ = pack_forward(src, nsrc, k);
      for (int s = 0; s < nsrc; ++s)
        fsrc_[s] = {src[s].x, packed_[s].data(), src[s].c, src[s].rows};
      return;
    }
    pairs_.resize(nsrc);
    for (int s = 0; s < nsrc; ++s) {
      const int64_t c = src[s].c;
      pairs_[s].resize(pair_count(c) * kp_);
      pack_pair_panels(src[s].w, 1, c, c, k, pairs_[s].data());
      psrc_[s] = {src[s].x, pairs_[s].data(), c, src[s].rows};
      scratch_words_ += kRowBlock * pair_count(c);
    }
  }
  // The sources point into the packed weights this object owns.
  ForwardProducts(const ForwardProducts&) = delete;
  ForwardProducts& operator=(const ForwardProducts&) = delete;

  int64_t scratch_words() const { return scratch_words_; }

  // The products of rows [i0, i0 + rows) (rows <= kRowBlock) handed to epi(acc, row0, mr, j0).
  template <class Epilogue>
  void row_block(int64_t i0, int64_t rows, NextRowsPrefetch* next, uint32_t* scratch,
                 Epilogue&& epi) const {
    if (bf16_)
      forward_row_block_pairs(i0, rows, kp_, psrc_, nsrc_, next, scratch, epi);
    else
      forward_row_block(i0, rows, kp_, fsrc_, nsrc_, next, epi);
  }

 private:
  int nsrc_;
  int64_t kp_;
  bool bf16_;
  std::vector<AlignedFloats> packed_;
  std::vector<AlignedPairs> pairs_;
  FwdSource fsrc_[kMaxUpdateSources] = {};
  PairFwdSource psrc_[kMaxUpdateSources] = {};
  int64_t scratch_words_ = 0;
};

// Threads for work_items work items: the OpenMP maximum, at most one per item.
inline int num_work_threads(int64_t work_items) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(),
                                                                   work_items)));
}

// Throws std::invalid_argument unless k >= 1, 0 <= nsrc <= kMaxUpdateSources, every source
// width is >= 1 and no source read through row ids asks for an input gradient (grads may be
// null: no gradients).
inline void check_sources(int64_t k, const UpdateSource* src, int nsrc,
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

// Per-thread scratch of the backward pass.
struct BwdScratch {
  AlignedFloats gp;  // [kBwdRowBlock][kp]: pre-activation gradient tile, zero-padded
  AlignedFloats xk;  // a source's rows repacked as [pad_rows(c) / kMR][rows][kMR], zero-padded
                     // (the weight gradient's operand A)
  // Over bfloat16 pairs (pairs.h) instead of xk:
  AlignedPairs gp_rows;  // gp's rows in pairs [whole register tiles][kp / 2] (input gradient's A)
  AlignedPairs gp_cols;  // gp's row pairs column by column [pair_count(rows)][kp] (weight
                         // gradient's B)
  AlignedPairs xk_pairs;  // pack_column_group_pairs of a source's rows (weight gradient's A)
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

inline BwdSplit backward_split(int64_t n) {
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
// With bf16, both products run over bfloat16 pairs (pairs.h): gp is rounded after the bias
// gradient took its float32 sums, and W and X as they are packed.
template <class Prologue, class PrologueInputs>
void backward_engine(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                     const UpdateGrads* grads, float* grad_bias, const BwdSplit& split, bool bf16,
                     Prologue&& prologue, PrologueInputs&& prologue_inputs) {
  const int64_t kp = pad_cols(k), kp2 = kp / 2, k2 = pair_count(k);
  const int64_t nchunks = split.nchunks;
  std::vector<AlignedFloats> wpanels(nsrc);
  std::vector<AlignedPairs> wpairs(nsrc);
  bool any_grad_x = false, any_grad_w = false;
  std::vector<AlignedFloats> wpart(nsrc);  // [nchunks][pad_rows(c)][kp] (transposed), zeroed
                                           // per chunk
  int64_t max_cr = 0;
  for (int s = 0; s < nsrc; ++s) {
    const int64_t cp = pad_cols(src[s].c);
    if (grads[s].grad_x != nullptr) {  // B(l = k, j = c) = W[l][j]
      any_grad_x = true;
      if (bf16) {
        wpairs[s].resize(k2 * cp);
        pack_pair_panels(src[s].w, src[s].c, 1, k, src[s].c, wpairs[s].data());
      } else {
        wpanels[s].resize(k * cp);
        pack_panels(src[s].w, src[s].c, 1, k, src[s].c, wpanels[s].data());
      }
    }
    if (grads[s].grad_w != nullptr) {
      any_grad_w = true;
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
    if (!bf16) {
      scratch.xk.assign(kBwdRowBlock * max_cr, 0.0f);
    } else {
      if (any_grad_x) scratch.gp_rows.assign((kBwdRowBlock + kMR) * kp2, 0u);
      if (any_grad_w) {
        scratch.gp_cols.assign(pair_count(kBwdRowBlock) * kp, 0u);
        scratch.xk_pairs.assign(pair_count(kBwdRowBlock) * max_cr, 0u);
      }
    }
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
        const int64_t r2n = pair_count(rows);
        if (bf16 && any_grad_x) {
          uint32_t* d = scratch.gp_rows.data();
          for (int64_t r = 0; r < rows; ++r) row_to_pairs(gp + r * gs, kp, d + r * kp2);
          std::fill(d + rows * kp2, d + (rows + kMR - 1) / kMR * kMR * kp2, 0u);
        }
        if (bf16 && any_grad_w)
          for (int64_t l2 = 0; l2 < r2n; ++l2)
            interleave_rows(gp + 2 * l2 * gs, 2 * l2 + 1 < rows ? gp + (2 * l2 + 1) * gs : nullptr,
                            kp, scratch.gp_cols.data() + l2 * kp);
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
                auto store = [&](const auto& acc) {
                  for (int r = 0; r < mr; ++r) {
                    float* o = gx + (i0 + r0 + r) * c + j0;
#pragma omp simd
                    for (int j = 0; j < jv; ++j) o[j] = acc[r][j];
                  }
                };
                if (bf16) {
                  const PairOperand op{scratch.gp_rows.data() + r0 * kp2, kp2,
                                       wpairs[s].data() + j0 * k2, w, k2};
                  if (w == kNR)
                    micro_tile_pairs<kNR>(&op, 1, store);
                  else
                    micro_tile_pairs<kNRTail>(&op, 1, store);
                  continue;
                }
                const Operand op{gp + r0 * gs, gs, 1, wpanels[s].data() + j0 * k, w, k};
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
            uint32_t* xkp = scratch.xk_pairs.data();
            if (bf16)
              pack_column_group_pairs(src[s].x, src[s].rows, i0, rows, c, xkp);
            else
              pack_column_groups(src[s].x, src[s].rows, i0, rows, c, xk);
            const int64_t cr = pad_rows(c);
            float* acc_w = wpart[s].data() + static_cast<size_t>(chunk) * cr * kp;
            for (int64_t j0 = 0; j0 < kp; j0 += tile_width(j0, kp)) {
              const int w = tile_width(j0, kp);
              for (int64_t c0 = 0; c0 < cr; c0 += kMR) {
                fetch_next_row();
                next.advance(step++, steps);
                auto add = [&](const auto& acc) {
                  constexpr int NR = std::extent<std::remove_reference_t<decltype(acc)>, 1>::value;
                  for (int r = 0; r < kMR; ++r) {
                    float* o = acc_w + (c0 + r) * kp + j0;
#pragma omp simd
                    for (int j = 0; j < NR; ++j) o[j] += acc[r][j];
                  }
                };
                if (bf16) {
                  const PairOperand op{xkp + c0 * r2n, 0, scratch.gp_cols.data() + j0, kp, r2n,
                                       true};
                  if (w == kNR)
                    micro_tile_pairs<kNR>(&op, 1, add);
                  else
                    micro_tile_pairs<kNRTail>(&op, 1, add);
                  continue;
                }
                const Operand op{xk + c0 * rows, 0, 0, gp + j0, gs, rows, true};
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

}  // namespace update_detail
}  // namespace distmb
