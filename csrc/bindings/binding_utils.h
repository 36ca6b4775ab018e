// Shared helpers of the Python bindings (module distmb._C). The binding files are the only ones
// that include pybind11: csrc/bindings/<family>.cpp binds one kernel family (bind_<family>,
// declared below) and csrc/bindings/module.cpp defines the module and calls each. A binding
// checks buffers, releases the GIL around each kernel, and hands std::vector results to numpy
// without copying (the array owns the vector through a capsule).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "aggregate.h"

namespace distmb {

namespace py = pybind11;

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

inline bool is_c_contiguous(const py::array& a) {
  return (a.flags() & py::array::c_style) == py::array::c_style;
}

// Whether a is int32 (else int64); throws ValueError naming it unless it is a 1-D C-contiguous
// int32 or int64 array (and, with writable, a writable one). Kernels templated on the id type
// read it in place: no conversion copy of an id array ever happens in a binding.
inline bool require_id_array(const py::array& a, const char* name, bool writable = false) {
  const bool is32 = a.dtype().is(py::dtype::of<int32_t>());
  if (a.ndim() != 1 || !(is32 || a.dtype().is(py::dtype::of<int64_t>())) || !is_c_contiguous(a))
    throw py::value_error(std::string(name) + " must be a 1-D C-contiguous int32 or int64 " +
                          "array (got " + std::string(py::str(a.dtype())) + ", " +
                          std::to_string(a.ndim()) + "-D)");
  if (writable && !a.writeable()) throw py::value_error(std::string(name) + " must be writable");
  return is32;
}

// A writable 1-D C-contiguous int64 array (an output the kernel fills in place).
inline int64_t* require_int64_out(py::array& a, const char* name) {
  if (a.ndim() != 1 || !a.dtype().is(py::dtype::of<int64_t>()) || !is_c_contiguous(a) ||
      !a.writeable())
    throw py::value_error(std::string(name) + " must be a writable 1-D C-contiguous int64 array");
  return static_cast<int64_t*>(a.mutable_data());
}

// Registration of each family's functions, classes and constants on the module.
void bind_graph(py::module_& m);      // graph.cpp
void bind_partition(py::module_& m);  // partition.cpp
void bind_sampler(py::module_& m);    // sampler.cpp
void bind_hec(py::module_& m);        // hec.cpp
void bind_aggregate(py::module_& m);  // aggregate.cpp
void bind_update(py::module_& m);     // update.cpp
void bind_feature_cache(py::module_& m);  // feature_cache.cpp
void bind_rowfile(py::module_& m);    // rowfile.cpp
void bind_neighbor_file(py::module_& m);  // neighbor_file.cpp

// The aggregator named by kind ("sum", "mean" or "gcn").
inline AggKind agg_kind(const std::string& kind) {
  if (kind == "sum") return AggKind::kSum;
  if (kind == "mean") return AggKind::kMean;
  if (kind == "gcn") return AggKind::kGcn;
  throw py::value_error("unknown aggregator '" + kind + "'; expected sum, mean or gcn");
}

}  // namespace distmb
