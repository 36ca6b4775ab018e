// Graph construction kernels (csrc/kernels/graph.cpp): the in-edge CSR of COO edges and its
// symmetric sparsification.
// Kernels work on raw buffers and std::vector outputs and know nothing about Python (the
// bindings in csrc/bindings/ do).
#pragma once

#include <cstdint>
#include <vector>

namespace distmb {

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

}  // namespace distmb
