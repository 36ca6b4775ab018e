// Python bindings of the feature-cache replacement policies (csrc/kernels/feature_cache.cpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "feature_cache.h"

namespace distmb {

namespace {

py::tuple py_belady_plan(BeladyPlanner& self, const carray<int64_t>& trace,
                         const carray<int64_t>& batch_ptr) {
  require_1d(trace, "trace");
  require_1d(batch_ptr, "batch_ptr");
  if (batch_ptr.size() < 1)
    throw py::value_error("batch_ptr must hold at least one entry (B + 1 for B gathers)");
  const int64_t n = trace.size();
  std::vector<int64_t> hit(n), fill(n);
  {
    py::gil_scoped_release nogil;
    self.plan(trace.data(), n, batch_ptr.data(), batch_ptr.size() - 1, hit.data(),
              fill.data());
  }
  return py::make_tuple(to_numpy(std::move(hit)), to_numpy(std::move(fill)));
}

py::tuple py_lru_access(LruCache& self, const carray<int64_t>& ids) {
  require_1d(ids, "ids");
  const int64_t n = ids.size();
  std::vector<int64_t> hit(n), fill(n);
  {
    py::gil_scoped_release nogil;
    self.access(ids.data(), n, hit.data(), fill.data());
  }
  return py::make_tuple(to_numpy(std::move(hit)), to_numpy(std::move(fill)));
}

template <class Cache>
py::array_t<int64_t> py_slot_ids(const Cache& self) {
  std::vector<int64_t> out(self.capacity());
  self.slot_ids(out.data());
  return to_numpy(std::move(out));
}

}  // namespace

void bind_feature_cache(py::module_& m) {
  py::class_<BeladyPlanner>(m, "BeladyPlanner",
                            "Directory of a feature cache planned superbatch by superbatch with "
                            "Belady's MIN decided gather by gather (bypass allowed); see "
                            "distmb.features.policy.")
      .def(py::init([](int64_t capacity, int64_t num_rows) {
             py::gil_scoped_release nogil;
             return std::make_unique<BeladyPlanner>(capacity, num_rows);
           }),
           py::arg("capacity"), py::arg("num_rows"),
           "capacity >= 0 slots over row ids [0, num_rows).")
      .def("plan", &py_belady_plan, py::arg("trace"), py::arg("batch_ptr"),
           "trace int64[T], batch_ptr int64[B + 1] -> (hit_slot int64[T], fill_slot int64[T]).")
      .def("slot_ids", &py_slot_ids<BeladyPlanner>,
           "int64[capacity]: the id held by every slot, CACHE_NO_SLOT when free.")
      .def("reset", &BeladyPlanner::reset, py::call_guard<py::gil_scoped_release>(),
           "Empty the cache.")
      .def_property_readonly("cached_count", &BeladyPlanner::cached_count)
      .def_property_readonly("capacity", &BeladyPlanner::capacity)
      .def_property_readonly("num_rows", &BeladyPlanner::num_rows);
  py::class_<LruCache>(m, "LruCache",
                       "Directory of a feature cache with least-recently-used replacement; see "
                       "distmb.features.policy.")
      .def(py::init([](int64_t capacity, int64_t num_rows) {
             py::gil_scoped_release nogil;
             return std::make_unique<LruCache>(capacity, num_rows);
           }),
           py::arg("capacity"), py::arg("num_rows"),
           "capacity >= 0 slots over row ids [0, num_rows).")
      .def("access", &py_lru_access, py::arg("ids"),
           "ids int64[n] (unique) -> (hit_slot int64[n], fill_slot int64[n]).")
      .def("slot_ids", &py_slot_ids<LruCache>,
           "int64[capacity]: the id held by every slot, CACHE_NO_SLOT when free.")
      .def("reset", &LruCache::reset, py::call_guard<py::gil_scoped_release>(),
           "Empty the cache.")
      .def_property_readonly("cached_count", &LruCache::cached_count)
      .def_property_readonly("capacity", &LruCache::capacity)
      .def_property_readonly("num_rows", &LruCache::num_rows);
  m.attr("CACHE_NO_SLOT") = kNoSlot;
}

}  // namespace distmb
