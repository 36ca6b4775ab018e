// Neighbour sampling kernels (DistGNN-MB section 3.3, "Thread-Parallel Minibatch Sampling"):
// multi-layer uniform sampling without replacement over a part's local in-edge CSR, with the
// frontier de-duplicated and relabelled in parallel passes (FastGL's "Fused-Map" idea: the
// first-appearance record is taken while sampling, so no separate hashing pass is needed).
// Deterministic for a given (seed, epoch, iteration) whatever the OpenMP thread count.
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "common.h"
#include "rng.h"
#include "sampler.h"

namespace distmb {

namespace {

// Scratch entry of a vertex not in the block being built. Entries of vertices that are in it
// are either an edge position e >= 0 (first appearance, while sampling) or ~local_id < 0
// (after relabelling); ~x = -x - 1 keeps both ranges disjoint. Entries are 32-bit, which
// halves the table's cache footprint and bounds a block to n_dst + edges < kUnset.
using Slot = NeighborSamplerCore::Slot;
constexpr Slot kUnset = std::numeric_limits<Slot>::max();

// Destinations per dynamic chunk while sampling: degrees follow a power law, so a static split
// would leave one thread with the hubs. A chunk's neighbour lines (~ chunk * fan-out * 64 B)
// must stay in L2 between the sweeps of pass 2.
constexpr int64_t kSampleChunk = 64;

// Classes of an edge in pass 3 (first_): not its source's first appearance, or the first
// appearance of a solid / halo source (kFirstHalo - is_solid).
constexpr uint8_t kNotFirst = 0, kFirstSolid = 1, kFirstHalo = 2;

// Minimum work per OpenMP thread: destinations sized in pass 1, edges sampled in pass 2,
// edges compacted / relabelled or scratch entries reset in passes 3-5 (about 0.1-0.3 ms each).
// Below it a pass runs on fewer threads: a fork/join costs microseconds, and much more when
// the cores are oversubscribed.
constexpr int64_t kGrainRows = 16384;
constexpr int64_t kGrainSample = 16384;
constexpr int64_t kGrainEdges = 65536;


// Choice of the without-replacement method for k of deg (see choose_positions): selection
// sampling costs deg draws, Floyd's algorithm k draws plus k^2/2 comparisons. Selection is
// used when deg <= kSelectionDegreeRatio * k, or when k > kFloydMaxK and k^2 > 8 deg.
constexpr int64_t kSelectionDegreeRatio = 2;
constexpr int64_t kFloydMaxK = 64;

// Floyd's draws are sorted by rank counting up to this fan-out, by std::sort above it.
constexpr int64_t kRankSortMaxK = 32;



// Counter-based stream of one destination: splitmix64 started at a hash of (seed, epoch,
// iteration, layer, VID_p), i.e. 64-bit word w is finalize64(state0 + (w + 1) * golden); bounded
// draws below 2^32 use one 32-bit half of a word each. No state is shared between
// destinations, so the draws do not depend on which thread samples which vertex.
struct Stream {
  uint64_t state;
  uint64_t spare = 0;      // the unused upper half of the last word, when have_spare
  bool have_spare = false;

  uint64_t next() {
    state += kSplitmixGolden;
    return finalize64(state);
  }

  uint32_t next32() {
    if (have_spare) {
      have_spare = false;
      return static_cast<uint32_t>(spare >> 32);
    }
    spare = next();
    have_spare = true;
    return static_cast<uint32_t>(spare);
  }

  // Exactly uniform integer in [0, n), n >= 1: Lemire's multiply-shift with rejection of the
  // 2^w mod n low values that would bias it.
  uint64_t below(uint64_t n) {
    if (n <= UINT32_MAX) {
      const uint32_t n32 = static_cast<uint32_t>(n);
      uint64_t m = static_cast<uint64_t>(next32()) * n32;
      if (static_cast<uint32_t>(m) < n32) {
        const uint32_t threshold = (0u - n32) % n32;  // 2^32 mod n
        while (static_cast<uint32_t>(m) < threshold) m = static_cast<uint64_t>(next32()) * n32;
      }
      return m >> 32;
    }
    __uint128_t m = static_cast<__uint128_t>(next()) * n;
    if (static_cast<uint64_t>(m) < n) {
      const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
      while (static_cast<uint64_t>(m) < threshold) m = static_cast<__uint128_t>(next()) * n;
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

inline uint64_t layer_key(uint64_t seed, uint64_t epoch, uint64_t iteration, uint64_t layer) {
  uint64_t h = finalize64(seed + kSplitmixGolden);
  h = finalize64(h ^ (epoch + 2 * kSplitmixGolden));
  h = finalize64(h ^ (iteration + 3 * kSplitmixGolden));
  return finalize64(h ^ (layer + 4 * kSplitmixGolden));
}

inline void atomic_min(Slot* p, Slot v) {
  Slot cur = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < cur &&
         !__atomic_compare_exchange_n(p, &cur, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

// k distinct positions of [0, deg), uniformly over the C(deg, k) subsets, ascending, into
// out[0..k). Requires 0 < k < deg. Both methods are exact given exact uniform draws.
void choose_positions(Stream& rng, int64_t deg, int64_t k, int64_t* out) {
  if (deg <= kSelectionDegreeRatio * k || (k > kFloydMaxK && k > 8 * deg / k)) {
    // Selection sampling (Knuth's Algorithm S): keep position t with probability
    // (still needed) / (still available); ascending by construction. Branch-free: the
    // keep/skip decision is a coin toss for the predictor (out[taken] is in bounds while
    // taken < k).
    int64_t taken = 0;
    for (int64_t t = 0; t < deg && taken < k; ++t) {
      out[taken] = t;
      taken += static_cast<int64_t>(rng.below(static_cast<uint64_t>(deg - t))) < k - taken;
    }
    return;
  }
  // Floyd's algorithm: for j = deg-k .. deg-1 draw t in [0, j]; take t, or j if t is taken.
  int64_t m = 0;
  for (int64_t j = deg - k; j < deg; ++j) {
    const int64_t t = static_cast<int64_t>(rng.below(static_cast<uint64_t>(j + 1)));
    bool seen = false;
    for (int64_t q = 0; q < m; ++q) seen |= (out[q] == t);
    out[m++] = seen ? j : t;
  }
  if (k > kRankSortMaxK) {
    std::sort(out, out + k);
    return;
  }
  // Small k: sort by rank (k^2 branch-free comparisons; the values are distinct).
  int64_t drawn[kRankSortMaxK];
  std::copy(out, out + k, drawn);
  for (int64_t a = 0; a < k; ++a) {
    int64_t rank = 0;
    for (int64_t b = 0; b < k; ++b) rank += drawn[b] < drawn[a];
    out[rank] = drawn[a];
  }
}

}  // namespace

NeighborSamplerCore::NeighborSamplerCore(const int64_t* indptr, const int32_t* indices32,
                                         const int64_t* indices64, int64_t n_solid,
                                         int64_t n_local, AdjacencyProvider* adjacency)
    : indptr_(indptr), indices32_(indices32), indices64_(indices64), adjacency_(adjacency),
      n_solid_(n_solid), n_local_(n_local) {
  const int given = (indices32 != nullptr) + (indices64 != nullptr) + (adjacency != nullptr);
  if (given != 1)
    throw std::invalid_argument(
        "exactly one of the int32 / int64 index arrays or an adjacency provider must be given");
  if (adjacency &&
      (adjacency->n_solid() != n_solid || adjacency->n_local() != n_local ||
       (adjacency->index_bytes() != 4 && adjacency->index_bytes() != 8)))
    throw std::invalid_argument(
        "the adjacency provider has n_solid=" + std::to_string(adjacency->n_solid()) +
        ", n_local=" + std::to_string(adjacency->n_local()) + " and " +
        std::to_string(adjacency->index_bytes()) + "-byte indices; the sampler has n_solid=" +
        std::to_string(n_solid) + ", n_local=" + std::to_string(n_local));
  if (n_solid < 0 || n_local < n_solid)
    throw std::invalid_argument("need 0 <= n_solid <= n_local (got n_solid=" +
                                std::to_string(n_solid) + ", n_local=" +
                                std::to_string(n_local) + ")");
  if (indptr[0] != 0)
    throw std::invalid_argument("indptr[0] must be 0 (got " + std::to_string(indptr[0]) + ")");

  // One-off O(n + E) validation: an index outside [0, n_local) would address the scratch
  // table out of bounds on every later call.
  int64_t bad_row = n_solid;
#pragma omp parallel for reduction(min : bad_row) schedule(static)
  for (int64_t v = 0; v < n_solid; ++v)
    if (indptr[v + 1] < indptr[v]) bad_row = std::min(bad_row, v);
  if (bad_row < n_solid)
    throw std::invalid_argument("indptr decreases at row " + std::to_string(bad_row));
  const int64_t nnz = indptr[n_solid];
  if (adjacency && nnz != adjacency->num_entries())
    throw std::invalid_argument("indptr[n_solid] = " + std::to_string(nnz) +
                                " differs from the adjacency provider's " +
                                std::to_string(adjacency->num_entries()) + " entries");
  // With a provider the lists are checked as they are fetched.
  if (adjacency) {
    scratch_.assign(n_local, kUnset);
    return;
  }
  int64_t bad_edge = nnz;
#pragma omp parallel for reduction(min : bad_edge) schedule(static)
  for (int64_t e = 0; e < nnz; ++e) {
    const int64_t u = indices32 ? indices32[e] : indices64[e];
    if (u < 0 || u >= n_local) bad_edge = std::min(bad_edge, e);
  }
  if (bad_edge < nnz) {
    const int64_t u = indices32 ? indices32[bad_edge] : indices64[bad_edge];
    throw std::invalid_argument("indices[" + std::to_string(bad_edge) + "] = " +
                                std::to_string(u) + " is outside [0, n_local=" +
                                std::to_string(n_local) + ")");
  }
  scratch_.assign(n_local, kUnset);
}

std::vector<SampledBlock> NeighborSamplerCore::sample(const int64_t* seeds, int64_t n_seeds,
                                                      const std::vector<int64_t>& fanouts,
                                                      uint64_t seed, uint64_t epoch,
                                                      uint64_t iteration) {
  if (fanouts.empty()) throw std::invalid_argument("fanouts must list at least one layer");
  for (const int64_t f : fanouts)
    if (f == 0 || f < kFanoutAll)
      throw std::invalid_argument("fan-out " + std::to_string(f) +
                                  " is invalid: use a positive count or -1 (all)");
  for (int64_t i = 0; i < n_seeds; ++i) {
    const int64_t s = seeds[i];
    if (s >= n_solid_ && s < n_local_)
      throw std::invalid_argument("seed VID_p " + std::to_string(s) + " (position " +
                                  std::to_string(i) + ") is a halo vertex (VID_p >= n_solid=" +
                                  std::to_string(n_solid_) +
                                  "); halo vertices have no local in-edges and cannot be seeds");
    if (s < 0 || s >= n_local_)
      throw std::invalid_argument("seed VID_p " + std::to_string(s) + " (position " +
                                  std::to_string(i) + ") is outside the solid range [0, " +
                                  std::to_string(n_solid_) + ")");
  }

  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t num_layers = static_cast<int64_t>(fanouts.size());
  std::vector<SampledBlock> blocks(num_layers);
  try {
    const int64_t* dst = seeds;
    int64_t n_dst = n_seeds;
    for (int64_t l = num_layers - 1; l >= 0; --l) {
      const uint64_t key = layer_key(seed, epoch, iteration, static_cast<uint64_t>(l));
      // Only the seeds need marking (and can repeat); a lower layer's destinations are the
      // previous block's solid sources, whose scratch entries already hold ~position.
      const bool seeds_layer = l == num_layers - 1, input_layer = l == 0;
      if (adjacency_) {
        // The destinations' lists, packed: row i is [list_starts_[i], list_starts_[i+1]).
        adjacency_->fetch(dst, n_dst, list_starts_, list_bytes_);
        const void* lists = list_bytes_.data();
        if (adjacency_->index_bytes() == 4)
          sample_layer(static_cast<const int32_t*>(lists), list_starts_.data(), dst, n_dst,
                       fanouts[l], key, seeds_layer, input_layer, blocks[l]);
        else
          sample_layer(static_cast<const int64_t*>(lists), list_starts_.data(), dst, n_dst,
                       fanouts[l], key, seeds_layer, input_layer, blocks[l]);
      } else if (indices32_) {
        sample_layer(indices32_, nullptr, dst, n_dst, fanouts[l], key, seeds_layer,
                     input_layer, blocks[l]);
      } else {
        sample_layer(indices64_, nullptr, dst, n_dst, fanouts[l], key, seeds_layer,
                     input_layer, blocks[l]);
      }
      dst = blocks[l].src_ids.data();
      n_dst = static_cast<int64_t>(blocks[l].src_ids.size()) - blocks[l].n_halo;
    }
  } catch (...) {
    // Duplicate seeds, an oversized block or bad_alloc: restore the scratch table wholesale
    // (rare, O(n_local)) so that the sampler stays usable.
    std::fill(scratch_.begin(), scratch_.end(), kUnset);
    throw;
  }
  return blocks;
}

// One block: destinations dst[0..n_dst) (solid, distinct; checked when mark_destinations).
// Row i is indices[indptr[dst[i]] ..) of the CSR, or, when list_starts is given (adjacency
// provider), indices[list_starts[i] .. list_starts[i+1]) of the fetched lists: the same
// entries in the same order, so the blocks are the same.
// Passes:
//  1. size every row (and with mark_destinations set scratch[dst[i]] = ~i); scan -> indptr;
//  2. sample every row into nbr_ (ascending CSR position) and atomic-min each neighbour's
//     scratch entry with its edge position (first appearance in edge order);
//  3. order-preserving two-way compaction of the first appearances (solid, then halo): the
//     vertex first seen at edge e gets the next local id of its class, scratch = ~local;
//  4. indices[e] = ~scratch[nbr[e]];
//  5. reset the scratch entries of the halo sources, or of all sources in the input layer:
//     the solid sources keep ~local, which is exactly their mark as the next destinations.
//
// The scratch is a direct-mapped table over VID_p (n_local entries): local ids are dense, so
// it is the degenerate perfect hash. Unlike a hash map it needs no probing, no locks and no
// rehashing, lookups are one load, concurrent inserts are one atomic-min, and it is reset in
// O(n_src) by walking the sources, so its O(n_local) allocation is paid once per sampler.
template <class Idx>
void NeighborSamplerCore::sample_layer(const Idx* indices, const int64_t* list_starts,
                                       const int64_t* dst, int64_t n_dst, int64_t fanout,
                                       uint64_t key, bool mark_destinations, bool input_layer,
                                       SampledBlock& out) {
  Slot* const scratch = scratch_.data();
  const int64_t* const indptr = indptr_;

  // 1. Row sizes. Row starts and degrees are kept so that pass 2 reads them sequentially
  //    instead of chasing indptr again.
  out.n_dst = n_dst;
  out.indptr.resize(n_dst + 1);
  rows_.resize(n_dst);
  RowRef* const rows = rows_.data();
  int64_t duplicate = -1;
#pragma omp parallel for schedule(static) num_threads(threads_for(n_dst, kGrainRows))
  for (int64_t i = 0; i < n_dst; ++i) {
    const int64_t v = dst[i];
    const int64_t begin = list_starts ? list_starts[i] : indptr[v];
    const int64_t deg = (list_starts ? list_starts[i + 1] : indptr[v + 1]) - begin;
    rows[i] = {begin, deg};
    out.indptr[i] = (fanout == kFanoutAll || deg <= fanout) ? deg : fanout;
    if (mark_destinations &&
        __atomic_exchange_n(&scratch[v], static_cast<Slot>(~i), __ATOMIC_RELAXED) != kUnset)
      __atomic_store_n(&duplicate, v, __ATOMIC_RELAXED);
  }
  if (duplicate >= 0)
    throw std::invalid_argument("seeds must be distinct; VID_p " + std::to_string(duplicate) +
                                " occurs more than once");
  out.indptr[n_dst] = 0;
  const int64_t nnz = exclusive_scan_inplace(out.indptr.data(), n_dst + 1);
  if (n_dst + nnz >= kUnset)
    throw std::length_error("a block of " + std::to_string(n_dst) + " destinations and " +
                            std::to_string(nnz) + " edges exceeds the sampler's limit of 2^31 - 1 "
                            "destinations + edges; use smaller batches or fan-outs");

  // 2. Sample, fused with the first-appearance record. Work goes in chunks of destinations,
  //    each in three sweeps so that the cache misses of a sweep overlap (group prefetching):
  //    a. draw positions and prefetch the neighbours they name; b. gather the neighbours'
  //    VID_p and prefetch their scratch entries; c. atomic-min the scratch entries.
  nbr_.resize(nnz);
  int64_t* const nbr = nbr_.data();
  const int64_t* const row = out.indptr.data();
  const int64_t n_chunks = (n_dst + kSampleChunk - 1) / kSampleChunk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(nnz, kGrainSample))
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t lo = c * kSampleChunk, hi = std::min(n_dst, lo + kSampleChunk);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t o = row[i], k = row[i + 1] - o;
      const RowRef r = rows[i];
      int64_t* const slot = nbr + o;
      if (k == r.deg) {
        for (int64_t q = 0; q < k; ++q) slot[q] = q;
      } else {
        Stream rng{finalize64(key ^ (static_cast<uint64_t>(dst[i]) + kSplitmixGolden))};
        choose_positions(rng, r.deg, k, slot);
      }
      for (int64_t q = 0; q < k; ++q) __builtin_prefetch(indices + r.begin + slot[q]);
    }
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t begin = rows[i].begin;
      for (int64_t e = row[i]; e < row[i + 1]; ++e) {
        const int64_t u = indices[begin + nbr[e]];
        nbr[e] = u;
        __builtin_prefetch(scratch + u, 1);
      }
    }
    for (int64_t e = row[lo]; e < row[hi]; ++e)
      atomic_min(&scratch[nbr[e]], static_cast<Slot>(e));
  }

  // 3. New sources in order of first appearance, solid ones then halo ones: count per
  //    thread range (recording each edge's class in first_: the write sweep then reads one
  //    byte per edge instead of chasing nbr[e]'s scratch entry again), scan, write. The count
  //    is branch-free (whether an edge is a first appearance is a coin toss for the branch
  //    predictor).
  const int nt = threads_for(nnz, kGrainEdges);
  std::vector<int64_t> solid_at(nt + 1, 0), halo_at(nt + 1, 0);
  const int64_t n_solid = n_solid_;
  first_.resize(nnz);
  uint8_t* const first_of = first_.data();
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    const int64_t lo = nnz * t / nt, hi = nnz * (t + 1) / nt;
    int64_t n_s = 0, n_h = 0;
    for (int64_t e = lo; e < hi; ++e) {
      const int64_t u = nbr[e];
      const int64_t first = __atomic_load_n(&scratch[u], __ATOMIC_RELAXED) == e;
      const int64_t solid = u < n_solid;
      n_s += first & solid;
      n_h += first & (1 - solid);
      first_of[e] = static_cast<uint8_t>(first * (kFirstHalo - solid));
    }
    solid_at[t + 1] = n_s;
    halo_at[t + 1] = n_h;
#pragma omp barrier
#pragma omp single
    {
      for (int k = 0; k < nt; ++k) solid_at[k + 1] += solid_at[k];
      for (int k = 0; k < nt; ++k) halo_at[k + 1] += halo_at[k];
      out.n_halo = halo_at[nt];
      out.src_ids.resize(n_dst + solid_at[nt] + halo_at[nt]);
    }
    int64_t* const src = out.src_ids.data();
    int64_t next_s = n_dst + solid_at[t], next_h = n_dst + solid_at[nt] + halo_at[t];
    for (int64_t e = lo; e < hi; ++e) {
      const uint8_t cls = first_of[e];
      if (cls == kNotFirst) continue;
      const int64_t u = nbr[e];
      const int64_t local = cls == kFirstSolid ? next_s++ : next_h++;
      src[local] = u;
      __atomic_store_n(&scratch[u], static_cast<Slot>(~local), __ATOMIC_RELAXED);
    }
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < n_dst; ++i) src[i] = dst[i];
  }

  // 4. Relabel the edges.
  out.indices.resize(nnz);
  int64_t* const idx = out.indices.data();
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t e = 0; e < nnz; ++e) idx[e] = ~static_cast<int64_t>(scratch[nbr[e]]);

  // 5. Restore the scratch entries the next layer must not see.
  const int64_t n_src = static_cast<int64_t>(out.src_ids.size());
  const int64_t keep = input_layer ? 0 : n_src - out.n_halo;
  const int64_t* const src = out.src_ids.data();
#pragma omp parallel for schedule(static) num_threads(threads_for(n_src - keep, kGrainEdges))
  for (int64_t j = keep; j < n_src; ++j) scratch[src[j]] = kUnset;
}

}  // namespace distmb
