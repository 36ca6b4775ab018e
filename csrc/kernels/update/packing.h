// Operand packing of the fused UPDATE kernels (internal to csrc/kernels/update/): weights into
// zero-padded column panels for micro_tile, input rows into kMR-column groups for the weight
// gradient.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "common.h"
#include "prefetch.h"
#include "tiling.h"
#include "update.h"

namespace distmb {
namespace update_detail {

constexpr int64_t kPackPrefetchRows = 8;  // rows read through ids prefetched ahead in packing

// Pack B(l, j) = src[l * sl + j * sj] (l < L, j < J) into panels for micro_tile: the panel of
// columns [j0, j0 + w) starts at dst + j0 * L and is laid out [L][w]; columns >= J are zero.
// dst holds L * pad_cols(J) floats.
inline void pack_panels(const float* src, int64_t sl, int64_t sj, int64_t L, int64_t J,
                        float* dst) {
  const int64_t jp = pad_cols(J);
  for (int64_t j0 = 0; j0 < jp; j0 += tile_width(j0, jp)) {
    const int w = tile_width(j0, jp);
    float* panel = dst + j0 * L;
    for (int64_t l = 0; l < L; ++l)
      for (int j = 0; j < w; ++j)
        panel[l * w + j] = j0 + j < J ? src[l * sl + (j0 + j) * sj] : 0.0f;
  }
}

// Pack the sources' W^T for the forward product (W is [k][c], B(l = c, j = k) = W[j][l]).
inline std::vector<AlignedFloats> pack_forward(const UpdateSource* src, int nsrc, int64_t k) {
  std::vector<AlignedFloats> packed(nsrc);
  for (int s = 0; s < nsrc; ++s) {
    packed[s].resize(src[s].c * pad_cols(k));
    pack_panels(src[s].w, 1, src[s].c, src[s].c, k, packed[s].data());
  }
  return packed;
}

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

}  // namespace update_detail
}  // namespace distmb
