// Declarations of the distmb C++ kernels. Kernels work on raw buffers and std::vector
// outputs and know nothing about Python: only the binding files (csrc/<family>_bindings.cpp,
// csrc/module.cpp, csrc/binding_utils.h) do.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace distmb {

// ---- graph.cpp: graph construction ---------------------------------------------------

// The in-edge CSR of COO edges src[e] -> dst[e] over [0, num_nodes) is built in three
// passes over chunks of the edges, in arrays the caller owns (distmb/data/csr.py):
//   counts = int64[num_nodes + 1] of zeros; csr_count_edges(chunk) for every chunk;
//   inclusive scan of counts (counts[v] = row v's start; counts[num_nodes] = total);
//   indices = I[total]; csr_scatter_edges(chunk) for every chunk (the same chunks again);
//   kept = csr_finish(counts, indices): counts is then indptr, indices[0 .. kept) the rows.
// S (the chunks' id type) and I (the index type) are int32_t or int64_t. The result is
// independent of the chunking and of the thread count.

// csr_count_edges: adds the in-degree contributions of one chunk to counts[1 .. num_nodes]:
// edge s -> d adds 1 to counts[d + 1], and to counts[s + 1] with symmetrize (d -> s too). With
// drop_self_loops, s -> s adds nothing. Returns the chunk's self-loops. Throws
// std::out_of_range naming edge first_edge + e, the chunk's first with an endpoint outside
// [0, num_nodes), before changing anything.
template <class S>
int64_t csr_count_edges(const S* src, const S* dst, int64_t m, int64_t num_nodes,
                        bool symmetrize, bool drop_self_loops, int64_t first_edge,
                        int64_t* counts);

// csr_scatter_edges: writes every source s of an edge s -> d at indices[cursor[d]++] (and d at
// indices[cursor[s]++] with symmetrize). cursor[v] starts as row v's first slot; indices has
// capacity entries. Throws std::out_of_range as csr_count_edges, and std::logic_error (after
// writing nothing outside indices) when the chunks hold more edges than were counted.
template <class S, class I>
void csr_scatter_edges(const S* src, const S* dst, int64_t m, int64_t num_nodes,
                       bool symmetrize, bool drop_self_loops, int64_t first_edge,
                       int64_t* cursor, I* indices, int64_t capacity);

// csr_finish: cursor[num_nodes + 1] as the scatter left it (cursor[v] = end of row v) becomes
// indptr in place; every row is sorted ascending, repeats are removed and the rows are
// compacted to the front of indices. Returns the entries kept (= the new indptr[num_nodes]).
// Throws std::logic_error when the scatter wrote fewer edges than were counted.
template <class I>
int64_t csr_finish(int64_t* cursor, int64_t num_nodes, I* indices);

// sparsify_symmetric: keep each undirected edge {u, v} of a symmetric in-edge CSR with
// probability keep_fraction, decided by a hash of (seed, min(u,v), max(u,v)), so both
// directions are kept or dropped together and the result is symmetric and deterministic.
// I: int32_t or int64_t; the output is int64 (METIS' idx_t).
template <class I>
void sparsify_symmetric(const int64_t* indptr, const I* indices, int64_t num_nodes,
                        double keep_fraction, uint64_t seed, std::vector<int64_t>& out_indptr,
                        std::vector<int64_t>& out_indices);

// ---- partition.cpp: per-part views of a partitioned graph ------------------------------

struct PartView {
  std::vector<int64_t> solid;     // VID_o of the part's solid vertices, ascending (VID_p order)
  std::vector<int64_t> halo;      // VID_o of its halo vertices, ascending
  std::vector<int64_t> indptr;    // [n_solid + 1]: in-edge CSR of the solid vertices
  // Sources as VID_p (solid in [0, n_solid), halo after): indices32 when n_local <= INT32_MAX,
  // else indices64 (the other one stays empty).
  std::vector<int32_t> indices32;
  std::vector<int64_t> indices64;
  bool wide = false;              // true: indices64 holds them
  int64_t cut_edges = 0;          // in-edges whose source lives in another part
};

// extract_part: given the whole graph's in-edge CSR (indptr[n+1], indices of type I: int32_t
// or int64_t) and part_of[n] (owner of every vertex), build part p's local view. scratch[n]
// must be all -1 on entry and is all -1 again on return (it maps VID_o -> VID_p while the
// kernel runs).
template <class I>
void extract_part(const int64_t* indptr, const I* indices, int64_t num_nodes,
                  const int32_t* part_of, int32_t part, int64_t* scratch, PartView& out);

// ---- sampler.cpp: thread-parallel multi-layer neighbour sampling -----------------------

// Fan-out meaning "every in-neighbour" (distmb.sampling.FANOUT_ALL).
constexpr int64_t kFanoutAll = -1;

// One block of a mini-batch (a bipartite graph sources -> destinations), local positions.
struct SampledBlock {
  int64_t n_dst = 0;              // destinations = src_ids[0 .. n_dst)
  int64_t n_halo = 0;             // the last n_halo sources are halo leaves
  std::vector<int64_t> indptr;    // [n_dst + 1]: CSR over destinations
  std::vector<int64_t> indices;   // [nnz]: source position in [0, n_src) of every edge
  std::vector<int64_t> src_ids;   // [n_src]: VID_p of the sources
};

// AdjacencyProvider: the in-neighbour lists of a part's solid vertices served from somewhere
// other than an in-memory indices array (NeighborFile: a file on disk behind a static cache).
// fetch(dst[n], starts, lists): the lists of dst[0..n) (VID_p in [0, n_solid()), any order,
// repeats allowed) packed into lists, entry j of bytes [j * index_bytes(), + index_bytes())
// (int32 or int64, VID_p in [0, n_local()), each list in CSR order), list i being entries
// [starts[i], starts[i+1]) (starts resized to n + 1, starts[0] = 0). Throws when a list cannot
// be served intact (std::runtime_error) or dst is out of range (std::out_of_range).
class AdjacencyProvider {
 public:
  virtual ~AdjacencyProvider() = default;
  virtual int64_t index_bytes() const = 0;
  virtual int64_t n_solid() const = 0;
  virtual int64_t n_local() const = 0;
  virtual int64_t num_entries() const = 0;
  virtual void fetch(const int64_t* dst, int64_t n, std::vector<int64_t>& starts,
                     std::vector<uint8_t>& lists) = 0;
};

// NeighborSamplerCore: uniform neighbour sampling without replacement over a part's local
// in-edge CSR (indptr[n_solid + 1]; indices int32 or int64, VID_p in [0, n_local); halo
// vertices VID_p >= n_solid have no rows and are leaves). The graph buffers are borrowed,
// not copied, and must outlive the object; they are validated once in the constructor
// (std::invalid_argument). Holds an n_local-entry scratch table reused by every call.
//
// sample(seeds, fanouts, seed, epoch, iteration): fanouts[0..L) from the input layer to the
// output layer (kFanoutAll allowed); returns L blocks, [0] = input layer. Block L-1 has the
// seeds as destinations; in block l the sources are [destinations | new solid neighbours in
// order of first appearance in edge order | halo neighbours likewise], and the solid sources
// of block l are the destinations of block l-1. Every destination takes min(degree, fan-out)
// distinct in-neighbours, uniformly over subsets, listed in CSR order. Draws come from a
// counter-based hash of (seed, epoch, iteration, layer, destination VID_p), so the output is
// independent of the thread count. Throws std::invalid_argument for an empty or invalid
// fanouts list and for seeds that are halo, out of range or repeated, std::length_error for
// a block with 2^31 - 1 or more destinations + edges (the scratch entries are 32-bit).
// Calls on one object are serialised by a mutex (the scratch table is shared).
//
// With an adjacency provider (indices32 and indices64 both null; borrowed, must outlive the
// object), every layer first fetches its destinations' lists from it into a compact buffer
// and samples positions within those lists: the blocks are identical to those of the
// in-memory sampler over the same CSR. The O(E) validation of indices is then the provider's
// (per fetch); indptr is still checked (O(n)).
class NeighborSamplerCore {
 public:
  NeighborSamplerCore(const int64_t* indptr, const int32_t* indices32, const int64_t* indices64,
                      int64_t n_solid, int64_t n_local, AdjacencyProvider* adjacency = nullptr);

  std::vector<SampledBlock> sample(const int64_t* seeds, int64_t n_seeds,
                                   const std::vector<int64_t>& fanouts, uint64_t seed,
                                   uint64_t epoch, uint64_t iteration);

  using Slot = int32_t;  // scratch entry: edge position or ~local id within one block

  int64_t n_solid() const { return n_solid_; }
  int64_t n_local() const { return n_local_; }

 private:
  template <class Idx>
  void sample_layer(const Idx* indices, const int64_t* list_starts, const int64_t* dst,
                    int64_t n_dst, int64_t fanout, uint64_t key, bool mark_destinations,
                    bool input_layer, SampledBlock& out);

  struct RowRef {
    int64_t begin, deg;  // CSR row of one destination
  };

  const int64_t* indptr_;
  const int32_t* indices32_;      // exactly one of indices32_ / indices64_ is non-null
  const int64_t* indices64_;
  AdjacencyProvider* adjacency_;  // non-null: lists come from it (indices32_/64_ null)
  int64_t n_solid_, n_local_;
  std::vector<Slot> scratch_;     // [n_local]: kUnset outside a call (see sampler.cpp)
  std::vector<int64_t> nbr_;      // sampled neighbours (VID_p) of the current layer, reused
  std::vector<RowRef> rows_;      // CSR rows of the current layer's destinations, reused
  std::vector<uint8_t> first_;    // [edges]: the current layer's first appearances, reused
  std::vector<int64_t> list_starts_;  // with adjacency_: the fetched lists of a layer, reused
  std::vector<uint8_t> list_bytes_;
  std::mutex mutex_;
};

// ---- hec.cpp: historical embedding cache (DistGNN-MB section 3.2) ---------------------

// Slot that HecCore::search returns for an absent or expired tag (distmb.hec.HEC_MISS).
constexpr int64_t kHecMiss = -1;
// Life-span meaning "lines never expire" (distmb.hec.LIFESPAN_UNBOUNDED).
constexpr int64_t kLifespanUnbounded = -1;

struct HecCounters {
  int64_t lookups = 0;               // tags searched (search and lookup)
  int64_t hits = 0;                  // of those, found and unexpired
  int64_t stores = 0;                // rows stored
  int64_t evictions = 0;             // unexpired lines of another tag replaced (capacity)
  int64_t expired_replacements = 0;  // expired lines of another tag replaced
};

// HecCore: capacity lines of dim float32, tagged by VID_o (>= 0), with a clock counting
// training iterations; a line's age is clock - (clock when it was last stored).
// - search(tags[n]) -> slots[n]: the line holding the tag if its age <= lifespan (always when
//   lifespan == kLifespanUnbounded), else kHecMiss. Parallel, read-only on the lines.
// - load(slots[n]) -> out[n, dim]: parallel gather; every slot must hold a tag (a hit of a
//   search since the last store/clear), else std::invalid_argument.
// - lookup(tags[n]) -> hit[n], rows[n_hits, dim] in tag order: search + load under one lock.
// - lookup_into(tags[n], out[n, dim]) -> hit[n]: out[i] = the line of tags[i] on a hit, zeros
//   on a miss (no allocation: out may be the halo rows of a layer's input).
// - store(tags[m], rows[m, dim]): as if the rows were stored one at a time in order: a line
//   with the same tag is overwritten (also when expired); else a free line is taken (lowest
//   slot first); else the oldest line is replaced, ties between lines of equal age going to
//   the one written first. Stored lines get age 0, so a repeated tag keeps its last row.
//   Slot decisions are serial, row copies parallel: the state is independent of the thread
//   count. Throws std::invalid_argument (cache unchanged) for a negative tag.
// - advance(): every age + 1, O(1). clear(): drops every line (clock and counters kept).
// Every public call takes the object's mutex, so calls from several threads are serialised.
class HecCore {
 public:
  HecCore(int64_t capacity, int64_t dim, int64_t lifespan);

  int64_t search(const int64_t* tags, int64_t n, int64_t* slots);  // returns the hits
  void load(const int64_t* slots, int64_t n, float* out) const;
  std::unique_ptr<float[]> lookup(const int64_t* tags, int64_t n, bool* hit, int64_t& n_hits);
  int64_t lookup_into(const int64_t* tags, int64_t n, bool* hit, float* out);  // returns hits
  void store(const int64_t* tags, int64_t m, const float* rows);
  void advance();
  void clear();
  void reset_counters();
  HecCounters counters() const;

  int64_t capacity() const { return capacity_; }
  int64_t dim() const { return dim_; }
  int64_t lifespan() const { return lifespan_; }
  int64_t clock() const;
  int64_t occupied() const;    // lines holding a tag, expired or not
  int64_t live_lines() const;  // lines that would hit now, O(occupied)
  // tags[s] and ages[s] of the lines s in [0, occupied) (for tests and diagnostics).
  void snapshot(std::vector<int64_t>& tags, std::vector<int64_t>& ages) const;

 private:
  struct Entry {
    int64_t key;   // tag, or empty
    int64_t slot;
  };
  // Bookkeeping of one line, 32 bytes so that a line's fields share one cache line.
  struct alignas(32) Line {
    int64_t tag;         // VID_o held (valid for slots < used_)
    int64_t written_at;  // clock when last stored
    int64_t prev, next;  // write-order list
  };
  struct FreeFloats {
    void operator()(float* p) const;
  };

  bool live(int64_t s) const {
    return lifespan_ == kLifespanUnbounded || clock_ - lines_[s].written_at <= lifespan_;
  }
  int64_t find(int64_t tag) const;
  void insert(int64_t tag, int64_t slot);
  void erase(int64_t tag);
  void unlink(int64_t s);
  void push_back(int64_t s);
  void reset_lines();
  int64_t search_unlocked(const int64_t* tags, int64_t n, int64_t* slots) const;
  void gather(const int64_t* slots, int64_t n, float* out) const;

  int64_t capacity_, dim_, lifespan_;
  int64_t clock_ = 0;
  int64_t used_ = 0;                     // lines [0, used_) hold a tag
  int64_t head_ = -1, tail_ = -1;        // oldest / newest used line (write order)
  std::unique_ptr<float, FreeFloats> data_;  // [capacity * dim], uninitialised until stored
  std::vector<Line> lines_;              // [capacity]
  std::vector<int64_t> dest_row_;        // store(): last row of the call written to a line
  std::vector<Entry> table_;             // open addressing, power-of-two size
  uint64_t mask_ = 0;
  HecCounters counters_;
  mutable std::mutex mutex_;
};

// ---- end of hec.cpp section -------------------------------------------------------------

// ---- aggregate.cpp: fused AGG kernels (DistGNN-MB section 3.3, "Broadcast Support") ----
//
// Common contract: a block is a CSR over n_dst destinations, indptr[n_dst + 1] (indptr[0] = 0)
// and indices[E] source rows in [0, n_src); feature matrices are float32, row-major and
// contiguous; outputs are caller-allocated and fully written (no need to zero them). Forward
// kernels throw std::out_of_range for a decreasing indptr or a source outside [0, n_src).
// Results do not depend on the OpenMP thread count.

// Unweighted aggregators of distmb.nn.aggregate.aggregate.
enum class AggKind : int { kSum = 0, kMean = 1, kGcn = 2 };

// Per-destination factor of aggregate: 1 (sum), 1 / deg or 0 (mean), 1 / (deg + 1) (gcn).
inline float agg_scale(AggKind kind, int64_t deg) {
  switch (kind) {
    case AggKind::kMean:
      return deg > 0 ? 1.0f / static_cast<float>(deg) : 0.0f;
    case AggKind::kGcn:
      return 1.0f / static_cast<float>(deg + 1);
    case AggKind::kSum:
      break;
  }
  return 1.0f;
}

// Transposed CSR of a block (sources -> edges): edges[indptr[u] .. indptr[u+1]) are the ids of
// the edges whose source is u, ascending, and dst[k] is the destination of edges[k].
struct BlockTranspose {
  std::vector<int64_t> indptr;  // [n_src + 1]
  std::vector<int64_t> edges;   // [E]
  std::vector<int64_t> dst;     // [E]
};

// transpose_block: stable counting sort of the edges by source, thread-parallel without
// atomics (per-thread histograms over edge-balanced slices of the rows); validates the CSR.
void transpose_block(const int64_t* indptr, const int64_t* indices, int64_t n_dst, int64_t n_src,
                     BlockTranspose& out);

// aggregate_forward: out[v] = s_v * (sum_{e of v} x[indices[e]] (+ x[v] for gcn)), x [n_src,
// dim], out [n_dst, dim]; s_v = 1 (sum), 1/deg or 0 without edges (mean), 1/(deg+1) (gcn).
void aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                       int64_t n_src, const float* x, int64_t dim, AggKind kind, float* out);

// aggregate_backward: grad_x [n_src, dim] of aggregate_forward given grad_out [n_dst, dim],
// gathered over the transposed CSR (t_indptr, t_dst of transpose_block). Every row of grad_x
// is written (no zeroing needed). With addend [n_addend, dim] (n_addend <= n_src; may be
// null), rows u < n_addend get addend[u] added: the gradient of another use of the first
// rows (a layer's self term), summed in the same pass instead of a second full-size tensor.
void aggregate_backward(const int64_t* indptr, int64_t n_dst, const int64_t* t_indptr,
                        const int64_t* t_dst, int64_t n_src, const float* grad_out, int64_t dim,
                        AggKind kind, const float* addend, int64_t n_addend, float* grad_x);

// edge_softmax_forward: alpha[E, H] = softmax of scores[E, H] over each destination's edges,
// per head (the maximum is subtracted first). edge_softmax_backward: grad_scores[E, H] =
// alpha * (grad_alpha - sum_{edges of v} alpha * grad_alpha).
void edge_softmax_forward(const int64_t* indptr, int64_t n_dst, const float* scores,
                          int64_t heads, float* alpha);
void edge_softmax_backward(const int64_t* indptr, int64_t n_dst, const float* alpha,
                           const float* grad_alpha, int64_t heads, float* grad_scores);

// gat_attention_forward: alpha[E, H] = edge softmax of LeakyReLU(el[u_e, h] + er[v, h]) with
// el [n_src, H], er [n_dst, H]. gat_attention_backward: grad_el [n_src, H] (via the transposed
// CSR t_indptr / t_edges) and grad_er [n_dst, H] from grad_alpha [E, H]; either may be null.
void gat_attention_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                           int64_t n_src, const float* el, const float* er, int64_t heads,
                           float negative_slope, float* alpha);
void gat_attention_backward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                            const int64_t* t_indptr, const int64_t* t_edges, int64_t n_src,
                            const float* el, const float* er, const float* alpha,
                            const float* grad_alpha, int64_t heads, float negative_slope,
                            float* grad_el, float* grad_er);

// weighted_aggregate_forward: out[v, h, :] = sum_{e of v} weights[e, h] * x[indices[e], h, :]
// with weights [E, H], x [n_src, H, dim], out [n_dst, H, dim]; each weight is broadcast over
// the dim SIMD lanes of its head.
void weighted_aggregate_forward(const int64_t* indptr, const int64_t* indices, int64_t n_dst,
                                int64_t n_src, const float* weights, const float* x,
                                int64_t heads, int64_t dim, float* out);

// weighted_aggregate_backward: one pass over the sources of the transposed CSR computes
// grad_x[u, h, :] = sum_{e = (u -> v)} weights[e, h] * grad_out[v, h, :] and
// grad_w[e, h] = <grad_out[v, h, :], x[u, h, :]> (each output null when not wanted).
void weighted_aggregate_backward(const int64_t* t_indptr, const int64_t* t_edges,
                                 const int64_t* t_dst, int64_t n_src, const float* weights,
                                 const float* x, const float* grad_out, int64_t heads,
                                 int64_t dim, float* grad_x, float* grad_w);

// stream_copy: dst[0..n) = src[0..n), OpenMP static split: the machine's copy bandwidth
// reference for benchmarks/kernels.py.
void stream_copy(const float* src, int64_t n, float* dst);

// ---- end of aggregate.cpp section -------------------------------------------------------

// ---- update.cpp: fused UPDATE kernels (DistGNN-MB section 3.3, "Operator Fusion") -----
//
// Common contract: float32 row-major buffers; n rows; a weight W is [k][c] (nn.Linear layout)
// and a source X_s is [n][c_s]; outputs are written, never read. Gate bits are uint8
// [n][ceil(k / 8)], column j -> bit j % 8 of byte j / 8, padding bits 0.

// Most sources (X_s, W_s) one UPDATE sums.
constexpr int kMaxUpdateSources = 2;

struct UpdateSource {
  const float* x;  // [n][c], or with rows a table [N][c] whose row rows[i] is row i
  const float* w;  // [k][c]
  int64_t c;
  const int64_t* rows = nullptr;  // int64[n] in [0, N), or null: X_s's rows read in place
                                  // (no gathered copy); the source then gets no grad_x
};

struct UpdateGrads {
  float* grad_x;  // [n][c] or null (not wanted)
  float* grad_w;  // [k][c] or null
};

// update_forward: pre = sum_s X_s . W_s^T + addend + bias (addend [n][k] or null, bias [k]);
// with relu, out = Dropout(ReLU(pre)): a unit is kept where the low/high 32 bits (column parity)
// of mix64(hash_key(seed, row) ^ (col / 2)) are below round((1 - p_drop) * 2^32), kept units
// are scaled by 1 / (1 - p_drop), and gate_bits (may be null) records ReLU-active AND kept;
// without relu, out = pre (p_drop ignored, gate_bits untouched). One pass over the output:
// register tiles of the products get bias, ReLU, dropout and bits before they are stored.
void update_forward(int64_t n, int64_t k, const UpdateSource* src, int nsrc,
                    const float* addend, const float* bias, bool relu, double p_drop,
                    uint64_t seed, float* out, uint8_t* gate_bits);

// update_backward: grad_pre = grad_out * scale * gate (gate_bits null: grad_pre = grad_out);
// grad_x_s = grad_pre . W_s, grad_w_s = grad_pre^T . X_s, grad_bias = column sums of
// grad_pre, grad_addend = grad_pre (each output null when not wanted). One pass over row
// blocks; the reductions over n use one accumulator per chunk of rows (threads take chunks
// dynamically) and one final reduction in chunk order: deterministic for a thread count.
void update_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* gate_bits,
                     float scale, const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                     float* grad_bias, float* grad_addend);

// update_backward_aggregated: update_backward whose grad_out rows are made on the fly as the
// next layer's aggregate_backward would make them (so that n x k gradient is never written):
// grad_out[u] = sum over u's transposed edges j of the next block (t_indptr / t_dst, ascending)
// of w[t_dst[j]] * grad_dst[t_dst[j]], then + addend[u] for u < n_addend; w[v] = 1 (sum) or
// 1 / deg(v), 0 without edges (mean), deg from next_indptr [n_next_dst + 1]; gcn is refused.
// grad_dst is [n_next_dst][k]; rows u < n of the next block's sources are this UPDATE's rows.
// Bit-identical to aggregate_backward followed by update_backward.
void update_backward_aggregated(int64_t n, int64_t k, const int64_t* next_indptr,
                                int64_t n_next_dst, const int64_t* t_indptr, const int64_t* t_dst,
                                AggKind kind, const float* grad_dst, const float* addend,
                                int64_t n_addend, const uint8_t* gate_bits, float scale,
                                const UpdateSource* src, int nsrc, const UpdateGrads* grads,
                                float* grad_bias);

// dropout_keep_mask: keep[n][k] (0/1 bytes), the dropout decisions update_forward makes for
// (seed, p_drop) (all 1 for p_drop = 0); for tests and diagnostics.
void dropout_keep_mask(uint64_t seed, int64_t n, int64_t k, double p_drop, uint8_t* keep);

// dropout_forward: out[n][k] = keep ? x * 1/(1-p) : 0 with the masks of dropout_keep_mask for
// seed (a standalone dropout with update_forward's counter-based masks), and the keep bits
// packed into bits[n][ceil(k/8)] (column j -> bit j % 8). out may alias x.
void dropout_forward(int64_t n, int64_t k, const float* x, double p_drop, uint64_t seed,
                     float* out, uint8_t* bits);
// dropout_backward: grad_in[n][k] = bit ? grad_out * scale : 0 (scale = 1/(1-p)); may alias.
void dropout_backward(int64_t n, int64_t k, const float* grad_out, const uint8_t* bits,
                      float scale, float* grad_in);

// gat_projection_forward: z = act(x . W^T + bias) [n][heads * d] (act = ReLU or identity),
// el[n][heads] = <attn_l[h], z[h]>, er[n][heads] = <attn_r[h], z[h]> (attn_* [heads][d]),
// the scores computed per row block while its z rows are in cache.
void gat_projection_forward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                            const float* w, const float* bias, const float* attn_l,
                            const float* attn_r, bool relu, float* z, float* el, float* er);

// gat_projection_backward: gradients of gat_projection_forward given z and the gradients of
// z, el and er (all required); grad_x may be null.
void gat_projection_backward(int64_t n, int64_t c, int64_t heads, int64_t d, const float* x,
                             const float* w, const float* z, const float* attn_l,
                             const float* attn_r, bool relu, const float* grad_z,
                             const float* grad_el, const float* grad_er, float* grad_x,
                             float* grad_w, float* grad_bias, float* grad_attn_l,
                             float* grad_attn_r);

// ---- end of update.cpp section ----------------------------------------------------------

// ---- feature_cache.cpp: replacement policies of an out-of-core feature cache (Ginex) ---
//
// The planners hold the *directory* of a cache of `capacity` row slots (which id is in which
// slot), not the rows. An executor applies a plan gather by gather: it copies the hit rows from
// their slots as they are at the start of the gather, reads the missed rows from disk, then
// writes each missed row whose fill slot is not kNoSlot into that slot, in access order. Ids
// are in [0, num_rows) and unique within one gather. Slots are filled lowest first and only
// replaced, never freed (except by reset()), so the occupied slots are [0, cached_count).
// Every public call takes the object's mutex.

// Miss in a hit-slot array, "not inserted" in a fill-slot array, free slot in slot_ids()
// (distmb.features.policy.NO_SLOT).
constexpr int64_t kNoSlot = -1;
// Next use of an id that does not occur again in the trace being planned.
constexpr int64_t kNeverUsed = INT64_MAX;

// BeladyPlanner: Ginex's superbatch cache (inspector): Belady's MIN with bypass decided gather
// by gather, optimal in misses for the planned trace among policies that change the cache
// between gathers (the executor copies a gather's hits before it writes any fill).
// - plan(trace[T], batch_ptr[B + 1]) -> hit_slot[T], fill_slot[T]: gather b is
//   trace[batch_ptr[b] .. batch_ptr[b+1]). The next use of access t is the first position
//   > t holding the same id (after t's gather, as ids are unique within one), or kNeverUsed.
//   Per gather, in order: (1) every id cached at its start hits, wherever it is in the
//   gather (hit_slot = its slot, fill_slot = kNoSlot), and takes its access's next use;
//   (2) the misses (hit_slot = kNoSlot), in gather order: a miss takes the lowest free
//   slot; with none free, it replaces the cached id whose next use F is farthest (an id this
//   gather hit or filled earlier included) if its own next use N < F, else it bypasses
//   (fill_slot = kNoSlot). Ties (only among ids never used again): the lowest slot is
//   replaced. A slot may be filled twice in one gather; the later fill holds. The directory
//   carries over to the next plan(), whose trace gives the cached ids their next uses.
//   Throws std::invalid_argument (directory unchanged) for a batch_ptr that does not go
//   from 0 to T without decreasing or for an id repeated within a gather, std::out_of_range
//   for an id outside [0, num_rows). O(T log capacity) time, O(T + capacity) scratch.
class BeladyPlanner {
 public:
  BeladyPlanner(int64_t capacity, int64_t num_rows);

  void plan(const int64_t* trace, int64_t n, const int64_t* batch_ptr, int64_t n_batches,
            int64_t* hit_slot, int64_t* fill_slot);
  void slot_ids(int64_t* out) const;  // out[capacity]: id held by every slot, or kNoSlot
  int64_t cached_count() const;
  void reset();

  int64_t capacity() const { return capacity_; }
  int64_t num_rows() const { return num_rows_; }

 private:
  struct HeapEntry {
    int64_t next_use;
    int64_t slot;
  };
  void rebuild_heap();

  int64_t capacity_, num_rows_;
  int64_t count_ = 0;                // slots [0, count_) hold an id
  std::vector<int32_t> slot_of_;     // [num_rows]: slot holding the id, or kNoSlot
  std::vector<int64_t> id_of_slot_;  // [capacity]: id held, or kNoSlot
  std::vector<int64_t> next_use_;    // [capacity]: next use of the id held (during plan())
  std::vector<int64_t> last_seen_;   // [num_rows]: kNeverUsed outside plan() (scratch)
  std::vector<int64_t> next_;        // [T]: next use of every access (scratch)
  std::vector<HeapEntry> heap_;      // max-heap by (next_use, -slot), lazily invalidated
  mutable std::mutex mutex_;
};

// LruCache: least-recently-used replacement, decided access by access.
// - access(ids[n]) -> hit_slot[n], fill_slot[n]: in order, a cached id hits and becomes the
//   most recently used; a miss takes the lowest free slot, else the slot of the least recently
//   used id, and is inserted as the most recently used (fill_slot = kNoSlot only when
//   capacity is 0). Throws std::out_of_range for an id outside [0, num_rows),
//   std::invalid_argument for an id repeated within the call (cache unchanged). O(1) per
//   access: a doubly-linked list over the slots in recency order.
class LruCache {
 public:
  LruCache(int64_t capacity, int64_t num_rows);

  void access(const int64_t* ids, int64_t n, int64_t* hit_slot, int64_t* fill_slot);
  void slot_ids(int64_t* out) const;  // out[capacity]
  int64_t cached_count() const;
  void reset();

  int64_t capacity() const { return capacity_; }
  int64_t num_rows() const { return num_rows_; }

 private:
  void unlink(int64_t s);
  void push_back(int64_t s);

  int64_t capacity_, num_rows_;
  int64_t count_ = 0;                // slots [0, count_) hold an id
  int64_t head_ = kNoSlot;           // least recently used slot
  int64_t tail_ = kNoSlot;           // most recently used slot
  std::vector<int32_t> slot_of_;     // [num_rows]: slot holding the id, or kNoSlot
  std::vector<int64_t> id_of_slot_;  // [capacity]
  std::vector<int64_t> prev_, next_;  // [capacity]: recency list
  std::vector<uint8_t> seen_;        // [num_rows]: all 0 outside access() (scratch)
  mutable std::mutex mutex_;
};

// ---- end of feature_cache.cpp section ---------------------------------------------------
// ---- direct_io.cpp: aligned, coalesced, thread-parallel byte-range reads (O_DIRECT) ------

// Alignment of offsets, lengths and buffers of direct reads (distmb.data.rowfile.DIRECT_IO_ALIGN).
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
// thread count (set_io_depth(d), d >= 1; distmb.data.rowfile.set_io_depth).
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

// ---- end of direct_io.cpp section -------------------------------------------------------

// ---- rowfile.cpp: out-of-core feature rows, one raw file per table (O_DIRECT) ----------
//
// Layout (distmb/data/rowfile.py): row i of row_bytes bytes starts at byte i * row_stride;
// row_stride is a power of two <= align (a row never straddles an align boundary) or a
// multiple of align; padding is zero and the file size is num_rows * row_stride rounded up to
// a multiple of align. No header.

struct RowFileCounters {
  int64_t bytes_read = 0;  // sum of the lengths of the requests read from the file
  int64_t requests = 0;    // pread requests issued (after coalescing; retries not counted)
  int64_t rows_read = 0;   // positions served (duplicates count once per position)
};

// RowFileReader: positioned reads of rows of one row file by id.
// - The constructor opens path with open_for_reads (O_DIRECT when direct, unless refused:
//   then buffered, direct() false and fallback_reason() says why). Other errors throw
//   std::runtime_error naming the path; bad geometry throws std::invalid_argument.
// - read_rows(ids[n], out[n * row_bytes]): out row k = file row ids[k] (any order,
//   duplicates allowed). Throws std::out_of_range naming the first id outside
//   [0, num_rows). The rows are read with read_ranges (row k: bytes [ids[k] * row_stride,
//   + row_bytes) to out + k * row_bytes; max_request() caps a coalesced request), so the
//   distinct aligned blocks are read once each; a request that ends before a row's last byte
//   (truncated file) throws std::runtime_error naming the path and the offset. out is
//   complete only when no exception was thrown.
// - evict_page_cache(): posix_fadvise(DONTNEED) over the whole file.
// Calls on one object are serialised by a mutex (the buffers and counters are shared).
class RowFileReader {
 public:
  RowFileReader(std::string path, int64_t num_rows, int64_t row_bytes, int64_t row_stride,
                int64_t align, bool direct);
  ~RowFileReader();
  RowFileReader(const RowFileReader&) = delete;
  RowFileReader& operator=(const RowFileReader&) = delete;

  // With positions (int64[n], each in [0, out_rows), checked by the caller), row ids[k] goes
  // to out row positions[k] instead of k: a gather's misses land in their final places.
  void read_rows(const int64_t* ids, int64_t n, uint8_t* out,
                 const int64_t* positions = nullptr);
  void evict_page_cache();
  void close();
  void reset_counters();
  RowFileCounters counters() const;

  const std::string& path() const { return path_; }
  int64_t num_rows() const { return num_rows_; }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t row_stride() const { return row_stride_; }
  int64_t align() const { return align_; }
  // Alignment of the reads: the file's O_DIRECT alignment when it divides align (e.g. 512
  // bytes), else align.
  int64_t read_align() const { return read_align_; }
  int64_t max_request() const { return max_request_; }
  bool direct() const { return direct_; }
  bool closed() const;
  const std::string& fallback_reason() const { return fallback_reason_; }

 private:
  int require_open() const;

  std::string path_;
  int64_t num_rows_, row_bytes_, row_stride_, align_, max_request_;
  int64_t read_align_ = 0;
  int fd_ = -1;
  bool direct_ = false;
  std::string fallback_reason_;
  RangeReadScratch scratch_;
  std::vector<int64_t> offsets_, lengths_;  // per requested row, reused across calls
  std::vector<uint8_t*> dst_;               // per requested row, reused across calls
  RowFileCounters counters_;
  mutable std::mutex mutex_;
};

// drop_page_cache: posix_fadvise(DONTNEED) over the file at path (its clean pages leave the
// OS page cache, so the next reads, mmap ones included, come from the device). Throws
// std::runtime_error naming the path.
void drop_page_cache(const std::string& path);

// ---- end of rowfile.cpp section ---------------------------------------------------------

// ---- neighbor_file.cpp: a part's in-neighbour lists on disk behind a static cache ------
//
// The file holds indices (int32 or int64, native byte order) of the part's in-edge CSR from
// byte data_offset on (a .npy file is read in place: data_offset is its header length);
// entry e of the CSR is at data_offset + e * index_bytes. indptr stays in memory.

struct NeighborFileCounters {
  int64_t lists_requested = 0;  // destinations asked for by fetch (repeats counted)
  int64_t cache_hits = 0;       // of those, served from the cache (the rest came from disk)
  int64_t lists_read = 0;       // lists read from disk (misses with at least one entry)
  int64_t entries_read = 0;     // entries of those lists
  int64_t bytes_read = 0;       // bytes of the coalesced requests read from the file
  int64_t requests = 0;         // pread requests issued
  double read_seconds = 0;      // wall time in read_ranges, seconds
};

// NeighborFile: in-neighbour lists of a part's solid vertices read from a file (O_DIRECT
// unless refused, as RowFileReader) behind a static neighbour cache (Ginex, section 3.2):
// the full lists of a chosen set of vertices in one compact in-memory array, addressed by a
// direct table over VID_p.
// - The constructor borrows indptr[n_solid + 1] (must outlive the object), checks that it is
//   non-decreasing from 0 to num_entries (std::invalid_argument) and that the file holds
//   data_offset + num_entries * index_bytes bytes (std::runtime_error naming the file).
// - fill(vertices[n], capacity_bytes): replaces the cache with the lists of vertices[0..),
//   taken in that order while the next list (deg * index_bytes bytes) still fits in
//   capacity_bytes (repeats are skipped); reads them with one read_ranges call and checks
//   their entries. Returns the number of vertices cached. The address table (8 bytes per
//   solid vertex) is allocated when the cache is not empty and is not charged to the budget.
// - fetch (AdjacencyProvider): cached lists are copied from the cache; all the other
//   non-empty lists are read with one read_ranges call straight into their place in lists.
//   Every entry read from disk is checked against [0, n_local): a corrupt file throws
//   std::runtime_error naming the file, the entry and the bound; a short file likewise.
// Calls on one object are serialised by a mutex.
class NeighborFile : public AdjacencyProvider {
 public:
  NeighborFile(std::string path, int64_t data_offset, int64_t index_bytes, int64_t num_entries,
               const int64_t* indptr, int64_t n_solid, int64_t n_local, bool direct);
  ~NeighborFile() override;
  NeighborFile(const NeighborFile&) = delete;
  NeighborFile& operator=(const NeighborFile&) = delete;

  int64_t fill(const int64_t* vertices, int64_t n, int64_t capacity_bytes);
  void fetch(const int64_t* dst, int64_t n, std::vector<int64_t>& starts,
             std::vector<uint8_t>& lists) override;
  void close();
  void reset_counters();
  NeighborFileCounters counters() const;

  int64_t index_bytes() const override { return index_bytes_; }
  int64_t n_solid() const override { return n_solid_; }
  int64_t n_local() const override { return n_local_; }
  int64_t num_entries() const override { return num_entries_; }
  const int64_t* indptr() const { return indptr_; }
  const std::string& path() const { return path_; }
  int64_t data_offset() const { return data_offset_; }
  bool direct() const { return direct_; }
  bool closed() const;
  const std::string& fallback_reason() const { return fallback_reason_; }
  int64_t cache_vertices() const;
  int64_t cache_entries() const;
  int64_t cache_bytes() const;       // cached lists + address table, bytes
  int64_t fill_bytes_read() const;   // bytes the last fill read from the file

 private:
  int require_open() const;
  // Read the non-empty lists of vertices[0..n) to dst + starts[i] * index_bytes_ and check
  // their entries (caller holds the mutex).
  void read_lists(int fd, const int64_t* vertices, const int64_t* starts, int64_t n,
                  uint8_t* dst, ReadRangesStats& stats);

  std::string path_;
  int64_t data_offset_, index_bytes_, num_entries_;
  const int64_t* indptr_;
  int64_t n_solid_, n_local_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t read_align_ = kDirectIoAlign;  // the file's O_DIRECT alignment (direct_io_alignment)
  std::string fallback_reason_;
  RangeReadScratch scratch_;
  std::vector<int64_t> cache_at_;   // [n_solid] or empty: first cache entry of a list, or -1
  std::vector<uint8_t> cache_;      // cached lists, index_bytes_ per entry
  int64_t cache_vertices_ = 0, fill_bytes_read_ = 0;
  std::vector<int64_t> offsets_, lengths_;
  std::vector<uint8_t*> dst_;
  NeighborFileCounters counters_;
  mutable std::mutex mutex_;
};

// ---- end of neighbor_file.cpp section ---------------------------------------------------

}  // namespace distmb
