// Python bindings of the distmb kernels (module distmb._C). The only file that includes
// pybind11: it checks buffers, releases the GIL around each kernel, and hands std::vector
// results to numpy without copying (the array owns the vector through a capsule).
#include <omp.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// ---- NeighborSamplerCore ---------------------------------------------------------------

// The sampler plus the numpy arrays whose buffers it borrows (kept alive, never copied: a
// memory-mapped array from PartitionStore is read in place).
struct PySampler {
  py::array indptr;
  py::array indices;
  std::unique_ptr<NeighborSamplerCore> core;
};

bool is_c_contiguous(const py::array& a) {
  return (a.flags() & py::array::c_style) == py::array::c_style;
}

std::unique_ptr<PySampler> make_sampler(py::array indptr, py::array indices, int64_t n_solid,
                                        int64_t n_local) {
  if (indptr.ndim() != 1 || !indptr.dtype().is(py::dtype::of<int64_t>()) ||
      !is_c_contiguous(indptr))
    throw py::value_error("indptr must be a 1-D C-contiguous int64 array");
  const bool idx32 = indices.dtype().is(py::dtype::of<int32_t>());
  if (indices.ndim() != 1 || !(idx32 || indices.dtype().is(py::dtype::of<int64_t>())) ||
      !is_c_contiguous(indices))
    throw py::value_error("indices must be a 1-D C-contiguous int32 or int64 array (got " +
                          std::string(py::str(indices.dtype())) + ")");
  if (n_solid < 0 || n_local < n_solid)
    throw py::value_error("need 0 <= n_solid <= n_local (got n_solid=" +
                          std::to_string(n_solid) + ", n_local=" + std::to_string(n_local) +
                          ")");
  if (indptr.size() != n_solid + 1)
    throw py::value_error("indptr has " + std::to_string(indptr.size()) +
                          " entries, expected n_solid + 1 = " + std::to_string(n_solid + 1));
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  if (ip[n_solid] != indices.size())
    throw py::value_error("indptr[-1] = " + std::to_string(ip[n_solid]) +
                          " must equal len(indices) = " + std::to_string(indices.size()));
  auto out = std::make_unique<PySampler>();
  out->indptr = indptr;
  out->indices = indices;
  {
    py::gil_scoped_release nogil;
    out->core = std::make_unique<NeighborSamplerCore>(
        ip, idx32 ? static_cast<const int32_t*>(indices.data()) : nullptr,
        idx32 ? nullptr : static_cast<const int64_t*>(indices.data()), n_solid, n_local);
  }
  return out;
}

py::list py_sample(PySampler& self, const carray<int64_t>& seeds,
                   const carray<int64_t>& fanouts, uint64_t seed, uint64_t epoch,
                   uint64_t iteration) {
  require_1d(seeds, "seeds");
  require_1d(fanouts, "fanouts");
  const std::vector<int64_t> fanout_list(fanouts.data(), fanouts.data() + fanouts.size());
  std::vector<SampledBlock> blocks;
  {
    py::gil_scoped_release nogil;
    blocks = self.core->sample(seeds.data(), seeds.size(), fanout_list, seed, epoch, iteration);
  }
  py::list out;
  for (SampledBlock& b : blocks)
    out.append(py::make_tuple(b.n_dst, b.n_halo, to_numpy(std::move(b.indptr)),
                              to_numpy(std::move(b.indices)), to_numpy(std::move(b.src_ids))));
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "distmb C++ kernels (OpenMP; numpy buffers in and out; no libtorch)";
  m.def("build_in_csr", &py_build_in_csr, py::arg("src"), py::arg("dst"), py::arg("num_nodes"),
        py::arg("symmetrize") = true, py::arg("drop_self_loops") = true,
        "COO edges -> in-edge CSR (indptr int64[n+1], indices int64[nnz]), sorted and "
        "de-duplicated rows. Returns (indptr, indices, self_loops, duplicates).");
  m.def("sparsify_symmetric", &py_sparsify_symmetric, py::arg("indptr"), py::arg("indices"),
        py::arg("keep_fraction"), py::arg("seed"),
        "Keep each undirected edge of a symmetric CSR with probability keep_fraction (hash of "
        "the edge and seed; both directions agree). Returns (indptr, indices).");
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
  py::class_<PySampler>(m, "NeighborSamplerCore",
                        "Thread-parallel neighbour sampler over one part's local CSR; see "
                        "distmb.sampling.NeighborSampler. Calls on one object are serialised.")
      .def(py::init(&make_sampler), py::arg("indptr"), py::arg("indices"), py::arg("n_solid"),
           py::arg("n_local"),
           "Borrow indptr int64[n_solid+1] and indices int32|int64[nnz] (VID_p < n_local) "
           "without copying; validates them once (ValueError).")
      .def("sample", &py_sample, py::arg("seeds"), py::arg("fanouts"), py::arg("seed"),
           py::arg("epoch"), py::arg("iteration"),
           "Blocks from the input layer to the output layer, each a tuple (n_dst, n_halo, "
           "indptr int64[n_dst+1], indices int64[nnz], src_ids int64[n_src]).")
      .def_property_readonly("n_solid", [](const PySampler& s) { return s.core->n_solid(); })
      .def_property_readonly("n_local", [](const PySampler& s) { return s.core->n_local(); });
  m.attr("FANOUT_ALL") = kFanoutAll;
}
