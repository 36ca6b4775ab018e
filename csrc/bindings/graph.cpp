// Python bindings of the graph construction kernels (csrc/kernels/graph.cpp).
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "graph.h"

namespace distmb {

namespace {

// src and dst of one chunk: the same id type, the same length; returns whether int32.
bool check_chunk(const py::array& src, const py::array& dst) {
  const bool is32 = require_id_array(src, "src");
  if (require_id_array(dst, "dst") != is32)
    throw py::value_error("src and dst must have the same dtype (got " +
                          std::string(py::str(src.dtype())) + " and " +
                          std::string(py::str(dst.dtype())) + ")");
  if (src.size() != dst.size())
    throw py::value_error("src and dst must have the same length (got " +
                          std::to_string(src.size()) + " and " + std::to_string(dst.size()) +
                          ")");
  return is32;
}

int64_t py_csr_count(const py::array& src, const py::array& dst, int64_t num_nodes,
                     bool symmetrize, bool drop_self_loops, int64_t first_edge,
                     py::array counts) {
  const bool is32 = check_chunk(src, dst);
  if (num_nodes < 0) throw py::value_error("num_nodes must be >= 0");
  int64_t* c = require_int64_out(counts, "counts");
  if (counts.size() != num_nodes + 1)
    throw py::value_error("counts must have num_nodes + 1 entries");
  const int64_t m = src.size();
  py::gil_scoped_release nogil;
  if (is32)
    return csr_count_edges(static_cast<const int32_t*>(src.data()),
                           static_cast<const int32_t*>(dst.data()), m, num_nodes, symmetrize,
                           drop_self_loops, first_edge, c);
  return csr_count_edges(static_cast<const int64_t*>(src.data()),
                         static_cast<const int64_t*>(dst.data()), m, num_nodes, symmetrize,
                         drop_self_loops, first_edge, c);
}

template <class S>
void scatter_as(const py::array& src, const py::array& dst, int64_t num_nodes, bool symmetrize,
                bool drop_self_loops, int64_t first_edge, int64_t* cursor, py::array& indices,
                bool idx32) {
  const auto* s = static_cast<const S*>(src.data());
  const auto* d = static_cast<const S*>(dst.data());
  const int64_t m = src.size(), cap = indices.size();
  void* out = indices.mutable_data();
  py::gil_scoped_release nogil;
  if (idx32)
    csr_scatter_edges(s, d, m, num_nodes, symmetrize, drop_self_loops, first_edge, cursor,
                      static_cast<int32_t*>(out), cap);
  else
    csr_scatter_edges(s, d, m, num_nodes, symmetrize, drop_self_loops, first_edge, cursor,
                      static_cast<int64_t*>(out), cap);
}

void py_csr_scatter(const py::array& src, const py::array& dst, bool symmetrize,
                    bool drop_self_loops, int64_t first_edge, py::array cursor,
                    py::array indices) {
  const bool is32 = check_chunk(src, dst);
  int64_t* c = require_int64_out(cursor, "cursor");
  const bool idx32 = require_id_array(indices, "indices", true);
  const int64_t num_nodes = cursor.size() - 1;
  if (num_nodes < 0) throw py::value_error("cursor must have num_nodes + 1 >= 1 entries");
  if (is32)
    scatter_as<int32_t>(src, dst, num_nodes, symmetrize, drop_self_loops, first_edge, c,
                        indices, idx32);
  else
    scatter_as<int64_t>(src, dst, num_nodes, symmetrize, drop_self_loops, first_edge, c,
                        indices, idx32);
}

int64_t py_csr_finish(py::array cursor, py::array indices) {
  int64_t* c = require_int64_out(cursor, "cursor");
  const bool idx32 = require_id_array(indices, "indices", true);
  const int64_t num_nodes = cursor.size() - 1;
  if (num_nodes < 0) throw py::value_error("cursor must have num_nodes + 1 >= 1 entries");
  if (c[num_nodes] != indices.size())
    throw py::value_error("cursor[-1] must equal len(indices) (the counted total)");
  void* out = indices.mutable_data();
  py::gil_scoped_release nogil;
  if (idx32) return csr_finish(c, num_nodes, static_cast<int32_t*>(out));
  return csr_finish(c, num_nodes, static_cast<int64_t*>(out));
}

py::tuple py_sparsify_symmetric(const carray<int64_t>& indptr, const py::array& indices,
                                double keep_fraction, uint64_t seed) {
  require_1d(indptr, "indptr");
  const bool idx32 = require_id_array(indices, "indices");
  if (indptr.size() < 1) throw py::value_error("indptr must have num_nodes + 1 >= 1 entries");
  if (indptr.data()[indptr.size() - 1] != indices.size())
    throw py::value_error("indptr[-1] must equal len(indices)");
  if (!(keep_fraction > 0.0 && keep_fraction <= 1.0))
    throw py::value_error("keep_fraction must be in (0, 1]");
  std::vector<int64_t> out_indptr, out_indices;
  {
    py::gil_scoped_release nogil;
    if (idx32)
      sparsify_symmetric(indptr.data(), static_cast<const int32_t*>(indices.data()),
                         indptr.size() - 1, keep_fraction, seed, out_indptr, out_indices);
    else
      sparsify_symmetric(indptr.data(), static_cast<const int64_t*>(indices.data()),
                         indptr.size() - 1, keep_fraction, seed, out_indptr, out_indices);
  }
  return py::make_tuple(to_numpy(std::move(out_indptr)), to_numpy(std::move(out_indices)));
}

}  // namespace

void bind_graph(py::module_& m) {
  m.def("csr_count", &py_csr_count, py::arg("src"), py::arg("dst"), py::arg("num_nodes"),
        py::arg("symmetrize"), py::arg("drop_self_loops"), py::arg("first_edge"),
        py::arg("counts"),
        "Pass 1 of the chunked CSR build: add one chunk's in-degrees (src, dst: int32 or int64, "
        "same dtype) to counts int64[num_nodes + 1] in place. Returns the chunk's self-loops; "
        "IndexError names edge first_edge + e when an endpoint is outside [0, num_nodes).");
  m.def("csr_scatter", &py_csr_scatter, py::arg("src"), py::arg("dst"), py::arg("symmetrize"),
        py::arg("drop_self_loops"), py::arg("first_edge"), py::arg("cursor"),
        py::arg("indices"),
        "Pass 2: write one chunk's sources into indices (int32 or int64) at cursor (int64, the "
        "row starts, advanced in place).");
  m.def("csr_finish", &py_csr_finish, py::arg("cursor"), py::arg("indices"),
        "Pass 3: cursor becomes indptr in place; rows are sorted, de-duplicated and compacted "
        "to the front of indices. Returns the number of entries kept.");
  m.def("sparsify_symmetric", &py_sparsify_symmetric, py::arg("indptr"), py::arg("indices"),
        py::arg("keep_fraction"), py::arg("seed"),
        "Keep each undirected edge of a symmetric CSR (indices int32 or int64) with probability "
        "keep_fraction (hash of the edge and seed; both directions agree). Returns (indptr, "
        "indices), both int64.");
}

}  // namespace distmb
