// Python bindings of the partition kernels (csrc/kernels/partition.cpp).
#include <utility>

#include "binding_utils.h"
#include "partition.h"

namespace distmb {

namespace {

py::dict py_extract_part(const carray<int64_t>& indptr, const py::array& indices,
                         const carray<int32_t>& part_of, int32_t part,
                         py::array_t<int64_t, py::array::c_style> scratch) {
  require_1d(indptr, "indptr");
  const bool idx32 = require_id_array(indices, "indices");
  require_1d(part_of, "part_of");
  const int64_t n = part_of.size();
  if (indptr.size() != n + 1) throw py::value_error("indptr must have num_nodes + 1 entries");
  if (indptr.data()[n] != indices.size())
    throw py::value_error("indptr[-1] must equal len(indices)");
  if (scratch.ndim() != 1 || scratch.size() != n)
    throw py::value_error("scratch must be an int64 array of num_nodes entries, all -1");
  PartView view;
  {
    int64_t* scratch_ptr = scratch.mutable_data();
    py::gil_scoped_release nogil;
    if (idx32)
      extract_part(indptr.data(), static_cast<const int32_t*>(indices.data()), n,
                   part_of.data(), part, scratch_ptr, view);
    else
      extract_part(indptr.data(), static_cast<const int64_t*>(indices.data()), n,
                   part_of.data(), part, scratch_ptr, view);
  }
  py::dict out;
  out["solid"] = to_numpy(std::move(view.solid));
  out["halo"] = to_numpy(std::move(view.halo));
  out["indptr"] = to_numpy(std::move(view.indptr));
  if (view.wide)
    out["indices"] = to_numpy(std::move(view.indices64));
  else
    out["indices"] = to_numpy(std::move(view.indices32));
  out["cut_edges"] = view.cut_edges;
  return out;
}

}  // namespace

void bind_partition(py::module_& m) {
  m.def("extract_part", &py_extract_part, py::arg("indptr"), py::arg("indices"),
        py::arg("part_of"), py::arg("part"), py::arg("scratch"),
        "Local view of one part: dict(solid, halo, indptr, indices, cut_edges); indices (int32 "
        "or int64 in) come out int32 when the part's n_local fits, else int64. scratch is an "
        "int64[n] array of -1 that is restored on return.");
}

}  // namespace distmb
