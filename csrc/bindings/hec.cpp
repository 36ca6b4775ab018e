// Python bindings of the historical embedding cache (csrc/kernels/hec.cpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "hec.h"

namespace distmb {

namespace {

// A float32 C-contiguous array of shape [rows, dim], checked without conversion (a converted
// copy would silently detach an output buffer from the caller's tensor).
const float* hec_rows(const py::array& a, int64_t rows, int64_t dim, const char* name) {
  if (!a.dtype().is(py::dtype::of<float>()) || !is_c_contiguous(a) || a.ndim() != 2 ||
      a.shape(0) != rows || a.shape(1) != dim)
    throw py::value_error(std::string(name) + " must be a C-contiguous float32 array of shape [" +
                          std::to_string(rows) + ", " + std::to_string(dim) + "]");
  return static_cast<const float*>(a.data());
}

py::array_t<int64_t> py_hec_search(HecCore& self, const carray<int64_t>& tags) {
  require_1d(tags, "tags");
  py::array_t<int64_t> slots(tags.size());
  int64_t* out = slots.mutable_data();
  {
    py::gil_scoped_release nogil;
    self.search(tags.data(), tags.size(), out);
  }
  return slots;
}

void py_hec_load(const HecCore& self, const carray<int64_t>& slots, py::array out) {
  require_1d(slots, "slots");
  if (!out.writeable()) throw py::value_error("out must be writeable");
  float* dst = const_cast<float*>(hec_rows(out, slots.size(), self.dim(), "out"));
  py::gil_scoped_release nogil;
  self.load(slots.data(), slots.size(), dst);
}

py::tuple py_hec_lookup(HecCore& self, const carray<int64_t>& tags) {
  require_1d(tags, "tags");
  py::array_t<bool> hit(tags.size());
  bool* hit_ptr = hit.mutable_data();
  std::unique_ptr<float[]> rows;
  int64_t n_hits = 0;
  {
    py::gil_scoped_release nogil;
    rows = self.lookup(tags.data(), tags.size(), hit_ptr, n_hits);
  }
  float* raw = rows.release();
  py::capsule free_when_done(raw, [](void* p) { delete[] static_cast<float*>(p); });
  return py::make_tuple(hit, py::array_t<float>({static_cast<py::ssize_t>(n_hits),
                                                 static_cast<py::ssize_t>(self.dim())},
                                                raw, free_when_done));
}

py::array_t<bool> py_hec_lookup_into(HecCore& self, const carray<int64_t>& tags, py::array out) {
  require_1d(tags, "tags");
  if (!out.writeable()) throw py::value_error("out must be writeable");
  float* dst = const_cast<float*>(hec_rows(out, tags.size(), self.dim(), "out"));
  py::array_t<bool> hit(tags.size());
  bool* hit_ptr = hit.mutable_data();
  {
    py::gil_scoped_release nogil;
    self.lookup_into(tags.data(), tags.size(), hit_ptr, dst);
  }
  return hit;
}

void py_hec_store(HecCore& self, const carray<int64_t>& tags, const py::array& rows) {
  require_1d(tags, "tags");
  const float* src = hec_rows(rows, tags.size(), self.dim(), "rows");
  py::gil_scoped_release nogil;
  self.store(tags.data(), tags.size(), src);
}

py::dict py_hec_counters(const HecCore& self) {
  const HecCounters c = self.counters();
  py::dict out;
  out["lookups"] = c.lookups;
  out["hits"] = c.hits;
  out["stores"] = c.stores;
  out["evictions"] = c.evictions;
  out["expired_replacements"] = c.expired_replacements;
  return out;
}

py::tuple py_hec_snapshot(const HecCore& self) {
  std::vector<int64_t> tags, ages;
  self.snapshot(tags, ages);
  return py::make_tuple(to_numpy(std::move(tags)), to_numpy(std::move(ages)));
}

}  // namespace

void bind_hec(py::module_& m) {
  py::class_<HecCore>(m, "HecCore",
                      "Historical embedding cache of one layer; see distmb.hec. Calls on one "
                      "object are serialised.")
      .def(py::init([](int64_t capacity, int64_t dim, int64_t lifespan) {
             py::gil_scoped_release nogil;
             return std::make_unique<HecCore>(capacity, dim, lifespan);
           }),
           py::arg("capacity"), py::arg("dim"), py::arg("lifespan"),
           "capacity >= 1 lines of dim >= 1 float32; lifespan >= 0 or LIFESPAN_UNBOUNDED.")
      .def("search", &py_hec_search, py::arg("tags"),
           "tags int64[n] (VID_o >= 0) -> slots int64[n], HEC_MISS for absent or expired.")
      .def("load", &py_hec_load, py::arg("slots"), py::arg("out"),
           "Gather the lines slots int64[n] into out float32[n, dim] (C-contiguous).")
      .def("lookup", &py_hec_lookup, py::arg("tags"),
           "tags int64[n] -> (hit bool[n], rows float32[n_hits, dim]) under one lock.")
      .def("lookup_into", &py_hec_lookup_into, py::arg("tags"), py::arg("out"),
           "tags int64[n] -> hit bool[n]; out float32[n, dim] gets the line of each hit and "
           "zeros for each miss.")
      .def("store", &py_hec_store, py::arg("tags"), py::arg("rows"),
           "Store rows float32[m, dim] (C-contiguous) under tags int64[m]; last row wins.")
      .def("advance", &HecCore::advance, py::call_guard<py::gil_scoped_release>(),
           "One training iteration passed: every age + 1.")
      .def("clear", &HecCore::clear, py::call_guard<py::gil_scoped_release>())
      .def("reset_counters", &HecCore::reset_counters)
      .def("counters", &py_hec_counters)
      .def("snapshot", &py_hec_snapshot,
           "(tags int64[occupied], ages int64[occupied]) of the lines in slot order.")
      .def_property_readonly("capacity", &HecCore::capacity)
      .def_property_readonly("dim", &HecCore::dim)
      .def_property_readonly("lifespan", &HecCore::lifespan)
      .def_property_readonly("clock", &HecCore::clock)
      .def_property_readonly("occupied", &HecCore::occupied)
      .def_property_readonly("live_lines", &HecCore::live_lines);
  m.attr("HEC_MISS") = kHecMiss;
  m.attr("LIFESPAN_UNBOUNDED") = kLifespanUnbounded;
}

}  // namespace distmb
