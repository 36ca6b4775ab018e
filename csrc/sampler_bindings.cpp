// Python bindings of the neighbour sampler (csrc/sampler.cpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "kernels.h"

namespace distmb {

namespace {

// The sampler plus the numpy arrays whose buffers it borrows (kept alive, never copied: a
// memory-mapped array from PartitionStore is read in place).
struct PySampler {
  py::array indptr;
  py::array indices;
  std::unique_ptr<NeighborSamplerCore> core;
};

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

void bind_sampler(py::module_& m) {
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

}  // namespace distmb
