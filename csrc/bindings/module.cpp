// The Python module distmb._C: its docstring, the module-level OpenMP helpers, and one
// bind_<family> call per kernel family (bindings/<family>.cpp).
#include <omp.h>

#include "binding_utils.h"

using namespace distmb;

PYBIND11_MODULE(_C, m) {
  m.doc() = "distmb C++ kernels (OpenMP; numpy buffers in and out; no libtorch)";
  m.def("get_num_threads", []() { return omp_get_max_threads(); },
        "OpenMP threads the kernels use.");
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw py::value_error("thread count must be >= 1");
    omp_set_num_threads(n);
  });
  bind_graph(m);
  bind_partition(m);
  bind_sampler(m);
  bind_hec(m);
  bind_aggregate(m);
  bind_update(m);
  bind_feature_cache(m);
  bind_rowfile(m);
  bind_neighbor_file(m);
}
