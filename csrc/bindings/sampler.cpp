// Python bindings of the neighbour sampler (csrc/kernels/sampler.cpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "neighbor_file.h"
#include "sampler.h"

namespace distmb {

namespace {

// The sampler plus the objects whose buffers it borrows (kept alive, never copied: a
// memory-mapped array from PartitionStore is read in place): indices is a numpy array, or the
// NeighborFileCore the lists come from.
struct PySampler {
  py::array indptr;
  py::object indices;
  std::unique_ptr<NeighborSamplerCore> core;
};

std::unique_ptr<PySampler> make_sampler(py::array indptr, py::object indices, int64_t n_solid,
                                        int64_t n_local) {
  if (indptr.ndim() != 1 || !indptr.dtype().is(py::dtype::of<int64_t>()) ||
      !is_c_contiguous(indptr))
    throw py::value_error("indptr must be a 1-D C-contiguous int64 array");
  if (n_solid < 0 || n_local < n_solid)
    throw py::value_error("need 0 <= n_solid <= n_local (got n_solid=" +
                          std::to_string(n_solid) + ", n_local=" + std::to_string(n_local) +
                          ")");
  if (indptr.size() != n_solid + 1)
    throw py::value_error("indptr has " + std::to_string(indptr.size()) +
                          " entries, expected n_solid + 1 = " + std::to_string(n_solid + 1));
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  auto out = std::make_unique<PySampler>();
  out->indptr = indptr;
  out->indices = indices;
  if (py::isinstance<NeighborFile>(indices)) {
    NeighborFile* file = indices.cast<NeighborFile*>();
    if (ip[n_solid] != file->num_entries())
      throw py::value_error("indptr[-1] = " + std::to_string(ip[n_solid]) +
                            " must equal the neighbour file's " +
                            std::to_string(file->num_entries()) + " entries (" + file->path() +
                            ")");
    if (file->n_solid() != n_solid || file->n_local() != n_local)
      throw py::value_error("neighbour file " + file->path() + " has n_solid=" +
                            std::to_string(file->n_solid()) + ", n_local=" +
                            std::to_string(file->n_local()) + ", expected " +
                            std::to_string(n_solid) + ", " + std::to_string(n_local));
    py::gil_scoped_release nogil;
    out->core =
        std::make_unique<NeighborSamplerCore>(ip, nullptr, nullptr, n_solid, n_local, file);
    return out;
  }
  if (!py::isinstance<py::array>(indices))
    throw py::value_error("indices must be a numpy array or a NeighborFileCore");
  py::array arr = indices.cast<py::array>();
  const bool idx32 = arr.dtype().is(py::dtype::of<int32_t>());
  if (arr.ndim() != 1 || !(idx32 || arr.dtype().is(py::dtype::of<int64_t>())) ||
      !is_c_contiguous(arr))
    throw py::value_error("indices must be a 1-D C-contiguous int32 or int64 array (got " +
                          std::string(py::str(arr.dtype())) + ")");
  if (ip[n_solid] != arr.size())
    throw py::value_error("indptr[-1] = " + std::to_string(ip[n_solid]) +
                          " must equal len(indices) = " + std::to_string(arr.size()));
  {
    py::gil_scoped_release nogil;
    out->core = std::make_unique<NeighborSamplerCore>(
        ip, idx32 ? static_cast<const int32_t*>(arr.data()) : nullptr,
        idx32 ? nullptr : static_cast<const int64_t*>(arr.data()), n_solid, n_local);
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
           "without copying; validates them once (ValueError). indices may instead be a "
           "NeighborFileCore over the same CSR: lists are then fetched from it per layer "
           "(checked per fetch) and the blocks are the same.")
      .def("sample", &py_sample, py::arg("seeds"), py::arg("fanouts"), py::arg("seed"),
           py::arg("epoch"), py::arg("iteration"),
           "Blocks from the input layer to the output layer, each a tuple (n_dst, n_halo, "
           "indptr int64[n_dst+1], indices int64[nnz], src_ids int64[n_src]).")
      .def_property_readonly("n_solid", [](const PySampler& s) { return s.core->n_solid(); })
      .def_property_readonly("n_local", [](const PySampler& s) { return s.core->n_local(); });
  m.attr("FANOUT_ALL") = kFanoutAll;
}

}  // namespace distmb
