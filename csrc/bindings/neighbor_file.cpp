// Python bindings of the out-of-core neighbour lists (csrc/kernels/neighbor_file.cpp).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "neighbor_file.h"

namespace distmb {

namespace {

// indptr: the caller's int64[n_solid + 1] array itself (not a converted copy: the object
// borrows its buffer, and keep_alive ties the array's lifetime to the object's).
std::unique_ptr<NeighborFile> make_neighbor_file(py::array indptr, int64_t n_local,
                                                 const std::string& path, int64_t data_offset,
                                                 int64_t index_bytes, int64_t num_entries,
                                                 bool direct) {
  if (indptr.ndim() != 1 || !indptr.dtype().is(py::dtype::of<int64_t>()) ||
      !is_c_contiguous(indptr) || indptr.size() < 1)
    throw py::value_error("neighbour file " + path +
                          ": indptr must be a non-empty 1-D C-contiguous int64 array (got " +
                          std::string(py::str(indptr.dtype())) + ")");
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  const int64_t n_solid = indptr.size() - 1;
  py::gil_scoped_release nogil;
  return std::make_unique<NeighborFile>(path, data_offset, index_bytes, num_entries, ip,
                                        n_solid, n_local, direct);
}

int64_t py_fill(NeighborFile& self, const carray<int64_t>& vertices, int64_t capacity_bytes) {
  require_1d(vertices, "vertices");
  py::gil_scoped_release nogil;
  return self.fill(vertices.data(), vertices.size(), capacity_bytes);
}

py::tuple py_fetch(NeighborFile& self, const carray<int64_t>& dst) {
  require_1d(dst, "dst");
  std::vector<int64_t> starts;
  std::vector<uint8_t> lists;
  {
    py::gil_scoped_release nogil;
    self.fetch(dst.data(), dst.size(), starts, lists);
  }
  return py::make_tuple(to_numpy(std::move(starts)), to_numpy(std::move(lists)));
}

py::dict py_counters(const NeighborFile& self) {
  NeighborFileCounters c;
  {
    py::gil_scoped_release nogil;  // waits for a fetch in flight on another thread
    c = self.counters();
  }
  py::dict out;
  out["lists_requested"] = c.lists_requested;
  out["cache_hits"] = c.cache_hits;
  out["lists_read"] = c.lists_read;
  out["entries_read"] = c.entries_read;
  out["bytes_read"] = c.bytes_read;
  out["requests"] = c.requests;
  out["read_seconds"] = c.read_seconds;
  return out;
}

template <class F>
auto released(F f) {
  return [f](const NeighborFile& self) {
    py::gil_scoped_release nogil;
    return (self.*f)();
  };
}

}  // namespace

void bind_neighbor_file(py::module_& m) {
  py::class_<NeighborFile>(m, "NeighborFileCore",
                           "In-neighbour lists of one part read from its indices file "
                           "(O_DIRECT unless refused) behind a static cache; see "
                           "distmb.data.neighborfile. Calls on one object are serialised.")
      .def(py::init(&make_neighbor_file), py::arg("indptr"), py::arg("n_local"),
           py::arg("path"), py::arg("data_offset"), py::arg("index_bytes"),
           py::arg("num_entries"), py::arg("direct"), py::keep_alive<1, 2>(),
           "Borrow indptr int64[n_solid+1] (kept alive, never copied) and open path; entry e "
           "is at data_offset + e * index_bytes (4: int32, 8: int64). ValueError for a bad "
           "indptr, RuntimeError for a missing or short file.")
      .def("fill", &py_fill, py::arg("vertices"), py::arg("capacity_bytes"),
           "Replace the cache with the lists of vertices int64[n] taken in order while they "
           "fit in capacity_bytes; returns how many were cached.")
      .def("fetch", &py_fetch, py::arg("dst"),
           "dst int64[n] -> (starts int64[n+1], lists uint8[starts[n] * index_bytes]): list i "
           "is entries [starts[i], starts[i+1]). IndexError for dst outside [0, n_solid), "
           "RuntimeError for a short read or an entry outside [0, n_local).")
      .def("close", &NeighborFile::close, py::call_guard<py::gil_scoped_release>())
      .def("reset_counters", &NeighborFile::reset_counters,
           py::call_guard<py::gil_scoped_release>())
      .def("counters", &py_counters,
           "dict(lists_requested, cache_hits, lists_read, entries_read, bytes_read, requests, "
           "read_seconds) since the last reset.")
      .def_property_readonly("path", &NeighborFile::path)
      .def_property_readonly("data_offset", &NeighborFile::data_offset)
      .def_property_readonly("index_bytes", &NeighborFile::index_bytes)
      .def_property_readonly("num_entries", &NeighborFile::num_entries)
      .def_property_readonly("n_solid", &NeighborFile::n_solid)
      .def_property_readonly("n_local", &NeighborFile::n_local)
      .def_property_readonly("direct", &NeighborFile::direct)
      .def_property_readonly("fallback_reason", &NeighborFile::fallback_reason)
      .def_property_readonly("closed", released(&NeighborFile::closed))
      .def_property_readonly("cache_vertices", released(&NeighborFile::cache_vertices))
      .def_property_readonly("cache_entries", released(&NeighborFile::cache_entries))
      .def_property_readonly("cache_bytes", released(&NeighborFile::cache_bytes))
      .def_property_readonly("fill_bytes_read", released(&NeighborFile::fill_bytes_read));
}

}  // namespace distmb
