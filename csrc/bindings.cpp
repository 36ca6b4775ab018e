// Python bindings of the distmb kernels (module distmb._C). The only file that includes
// pybind11: it checks buffers, releases the GIL around each kernel, and hands std::vector
// results to numpy without copying (the array owns the vector through a capsule).
#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>

#include "kernels.h"

namespace py = pybind11;
using namespace distmb;

namespace {

template <class T>
using carray = py::array_t<T, py::array::c_style | py::array::forcecast>;

// Move a vector into a 1-D numpy array without copying.
template <class T>
py::array_t<T> to_numpy(std::vector<T>&& v) {
  auto* owned = new std::vector<T>(std::move(v));
  py::capsule free_when_done(owned, [](void* p) { delete static_cast<std::vector<T>*>(p); });
  return py::array_t<T>(static_cast<py::ssize_t>(owned->size()), owned->data(), free_when_done);
}

template <class T>
void require_1d(const carray<T>& a, const char* name) {
  if (a.ndim() != 1) throw py::value_error(std::string(name) + " must be a 1-D array");
}

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

py::dict py_extract_part(const carray<int64_t>& indptr, const carray<int64_t>& indices,
                         const carray<int32_t>& part_of, int32_t part,
                         py::array_t<int64_t, py::array::c_style> scratch) {
  require_1d(indptr, "indptr");
  require_1d(indices, "indices");
  require_1d(part_of, "part_of");
  const int64_t n = part_of.size();
  if (indptr.size() != n + 1) throw py::value_error("indptr must have num_nodes + 1 entries");
  if (scratch.ndim() != 1 || scratch.size() != n)
    throw py::value_error("scratch must be an int64 array of num_nodes entries, all -1");
  PartView view;
  {
    int64_t* scratch_ptr = scratch.mutable_data();
    py::gil_scoped_release nogil;
    extract_part(indptr.data(), indices.data(), n, part_of.data(), part, scratch_ptr, view);
  }
  py::dict out;
  out["solid"] = to_numpy(std::move(view.solid));
  out["halo"] = to_numpy(std::move(view.halo));
  out["indptr"] = to_numpy(std::move(view.indptr));
  out["indices"] = to_numpy(std::move(view.indices));
  out["cut_edges"] = view.cut_edges;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "distmb C++ kernels (OpenMP; numpy buffers in and out; no libtorch)";
  m.def("build_in_csr", &py_build_in_csr, py::arg("src"), py::arg("dst"), py::arg("num_nodes"),
        py::arg("symmetrize") = true, py::arg("drop_self_loops") = true,
        "COO edges -> in-edge CSR (indptr int64[n+1], indices int64[nnz]), sorted and "
        "de-duplicated rows. Returns (indptr, indices, self_loops, duplicates).");
  m.def("extract_part", &py_extract_part, py::arg("indptr"), py::arg("indices"),
        py::arg("part_of"), py::arg("part"), py::arg("scratch"),
        "Local view of one part: dict(solid, halo, indptr, indices, cut_edges). scratch is an "
        "int64[n] array of -1 that is restored on return.");
  m.def("get_num_threads", []() { return omp_get_max_threads(); },
        "OpenMP threads the kernels use.");
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw py::value_error("thread count must be >= 1");
    omp_set_num_threads(n);
  });
}
