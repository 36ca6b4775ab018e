// Python bindings of the partition kernels (csrc/partition.cpp).
#include <utility>

#include "binding_utils.h"
#include "kernels.h"

namespace distmb {

namespace {

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

void bind_partition(py::module_& m) {
  m.def("extract_part", &py_extract_part, py::arg("indptr"), py::arg("indices"),
        py::arg("part_of"), py::arg("part"), py::arg("scratch"),
        "Local view of one part: dict(solid, halo, indptr, indices, cut_edges). scratch is an "
        "int64[n] array of -1 that is restored on return.");
}

}  // namespace distmb
