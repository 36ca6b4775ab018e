// Python bindings of the graph construction kernels (csrc/graph.cpp).
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "kernels.h"

namespace distmb {

namespace {

py::tuple py_build_in_csr(const carray<int64_t>& src, const carray<int64_t>& dst,
                          int64_t num_nodes, bool symmetrize, bool drop_self_loops) {
  require_1d(src, "src");
  require_1d(dst, "dst");
  if (src.size() != dst.size())
    throw py::value_error("src and dst must have the same length (got " +
                          std::to_string(src.size()) + " and " + std::to_string(dst.size()) +
                          ")");
  std::vector<int64_t> indptr, indices;
  CsrBuildStats stats;
  {
    py::gil_scoped_release nogil;
    stats = build_in_csr(src.data(), dst.data(), src.size(), num_nodes, symmetrize,
                         drop_self_loops, indptr, indices);
  }
  return py::make_tuple(to_numpy(std::move(indptr)), to_numpy(std::move(indices)),
                        stats.self_loops, stats.duplicates);
}

py::tuple py_sparsify_symmetric(const carray<int64_t>& indptr, const carray<int64_t>& indices,
                                double keep_fraction, uint64_t seed) {
  require_1d(indptr, "indptr");
  require_1d(indices, "indices");
  if (indptr.size() < 1) throw py::value_error("indptr must have num_nodes + 1 >= 1 entries");
  if (!(keep_fraction > 0.0 && keep_fraction <= 1.0))
    throw py::value_error("keep_fraction must be in (0, 1]");
  std::vector<int64_t> out_indptr, out_indices;
  {
    py::gil_scoped_release nogil;
    sparsify_symmetric(indptr.data(), indices.data(), indptr.size() - 1, keep_fraction, seed,
                       out_indptr, out_indices);
  }
  return py::make_tuple(to_numpy(std::move(out_indptr)), to_numpy(std::move(out_indices)));
}

}  // namespace

void bind_graph(py::module_& m) {
  m.def("build_in_csr", &py_build_in_csr, py::arg("src"), py::arg("dst"), py::arg("num_nodes"),
        py::arg("symmetrize") = true, py::arg("drop_self_loops") = true,
        "COO edges -> in-edge CSR (indptr int64[n+1], indices int64[nnz]), sorted and "
        "de-duplicated rows. Returns (indptr, indices, self_loops, duplicates).");
  m.def("sparsify_symmetric", &py_sparsify_symmetric, py::arg("indptr"), py::arg("indices"),
        py::arg("keep_fraction"), py::arg("seed"),
        "Keep each undirected edge of a symmetric CSR with probability keep_fraction (hash of "
        "the edge and seed; both directions agree). Returns (indptr, indices).");
}

}  // namespace distmb
