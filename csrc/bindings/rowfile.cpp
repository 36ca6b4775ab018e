// Python bindings of the row-file reader (csrc/kernels/rowfile.cpp).
#include <memory>
#include <optional>
#include <string>

#include <pybind11/stl.h>

#include "binding_utils.h"
#include "direct_io.h"
#include "rowfile.h"

namespace distmb {

namespace {

// out: a writeable C-contiguous uint8 [n, row_bytes] or float32 [n, row_bytes / 4] array,
// checked without conversion (a converted copy would detach it from the caller's tensor).
uint8_t* row_buffer(py::array& out, int64_t n, int64_t row_bytes) {
  const bool ok_dtype =
      out.dtype().is(py::dtype::of<uint8_t>()) || out.dtype().is(py::dtype::of<float>());
  if (!ok_dtype || !is_c_contiguous(out) || !out.writeable() || out.ndim() != 2 ||
      out.shape(0) != n || out.shape(1) * out.itemsize() != row_bytes) {
    std::string shape;
    for (py::ssize_t d = 0; d < out.ndim(); ++d)
      shape += (d ? ", " : "") + std::to_string(out.shape(d));
    throw py::value_error("out must be a writeable C-contiguous uint8 [" + std::to_string(n) +
                          ", " + std::to_string(row_bytes) + "] or float32 [" +
                          std::to_string(n) + ", " + std::to_string(row_bytes / 4) +
                          "] array, got " + std::string(py::str(out.dtype())) + " [" + shape +
                          "]");
  }
  return static_cast<uint8_t*>(out.mutable_data());
}

void py_read_rows(RowFileReader& self, const carray<int64_t>& ids, py::array out,
                  std::optional<carray<int64_t>> positions) {
  require_1d(ids, "ids");
  if (!positions) {
    uint8_t* dst = row_buffer(out, ids.size(), self.row_bytes());
    py::gil_scoped_release nogil;
    self.read_rows(ids.data(), ids.size(), dst);
    return;
  }
  // Scattered: out has any number of rows; positions[k] is the out row of ids[k].
  require_1d(*positions, "positions");
  if (positions->size() != ids.size())
    throw py::value_error("positions must have one entry per id");
  const int64_t rows = out.ndim() == 2 ? out.shape(0) : -1;
  uint8_t* dst = row_buffer(out, rows, self.row_bytes());
  const int64_t* pos = positions->data();
  for (py::ssize_t k = 0; k < positions->size(); ++k)
    if (pos[k] < 0 || pos[k] >= rows)
      throw py::index_error("positions[" + std::to_string(k) + "] = " + std::to_string(pos[k]) +
                            " is outside the " + std::to_string(rows) + " rows of out");
  py::gil_scoped_release nogil;
  self.read_rows(ids.data(), ids.size(), dst, pos);
}

py::dict py_counters(const RowFileReader& self) {
  RowFileCounters c;
  {
    py::gil_scoped_release nogil;  // waits for a read in flight on another thread
    c = self.counters();
  }
  py::dict out;
  out["bytes_read"] = c.bytes_read;
  out["requests"] = c.requests;
  out["rows_read"] = c.rows_read;
  return out;
}

}  // namespace

void bind_rowfile(py::module_& m) {
  m.attr("DIRECT_IO_ALIGN") = kDirectIoAlign;
  m.attr("ROWFILE_MAX_REQUEST") = kMaxReadRequest;
  m.attr("READ_COALESCE_GAP") = kCoalesceGap;
  m.attr("DEFAULT_IO_DEPTH") = kDefaultIoDepth;
  m.def("get_io_depth", &io_depth, "Reads in flight per out-of-core read call.");
  m.def("get_coalesce_gap", &coalesce_gap, "Bytes an out-of-core read reads through.");
  m.def(
      "set_coalesce_gap",
      [](int64_t bytes) {
        try {
          set_coalesce_gap(bytes);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("bytes"),
      "Unrequested bytes a read request reads through to take in the next range (>= 0). "
      "Default: READ_COALESCE_GAP.");
  m.def(
      "set_io_depth",
      [](int depth) {
        try {
          set_io_depth(depth);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
      },
      py::arg("depth"),
      "Reads in flight per out-of-core read call (>= 1; at least the OpenMP thread count is "
      "used). Default: DEFAULT_IO_DEPTH.");
  py::class_<RowFileReader>(m, "RowFileReader",
                            "Rows of one row file read by id with concurrent positioned reads "
                            "(O_DIRECT unless refused); see distmb.data.rowfile. Calls on "
                            "one object are serialised.")
      .def(py::init([](const std::string& path, int64_t num_rows, int64_t row_bytes,
                       int64_t row_stride, int64_t align, bool direct) {
             py::gil_scoped_release nogil;
             return std::make_unique<RowFileReader>(path, num_rows, row_bytes, row_stride,
                                                    align, direct);
           }),
           py::arg("path"), py::arg("num_rows"), py::arg("row_bytes"), py::arg("row_stride"),
           py::arg("align"), py::arg("direct"),
           "Open path; with direct, O_DIRECT unless the open or a probe read fails with EINVAL "
           "(then buffered, and fallback_reason says why).")
      .def("read_rows", &py_read_rows, py::arg("ids"), py::arg("out"),
           py::arg("positions") = py::none(),
           "ids int64[n] (any order, duplicates allowed) -> out uint8[n, row_bytes] or "
           "float32[n, row_bytes / 4] (C-contiguous); with positions int64[n], row ids[k] "
           "goes to out row positions[k] (out may have any number of rows). IndexError for an "
           "id outside [0, num_rows) or a position outside out, RuntimeError for a failed or "
           "short read.")
      .def("evict_page_cache", &RowFileReader::evict_page_cache,
           py::call_guard<py::gil_scoped_release>(),
           "posix_fadvise(DONTNEED) over the file: drop its pages from the OS page cache.")
      .def("close", &RowFileReader::close, py::call_guard<py::gil_scoped_release>())
      .def("reset_counters", &RowFileReader::reset_counters,
           py::call_guard<py::gil_scoped_release>())
      .def("counters", &py_counters, "dict(bytes_read, requests, rows_read) since the last reset.")
      .def_property_readonly("path", &RowFileReader::path)
      .def_property_readonly("num_rows", &RowFileReader::num_rows)
      .def_property_readonly("row_bytes", &RowFileReader::row_bytes)
      .def_property_readonly("row_stride", &RowFileReader::row_stride)
      .def_property_readonly("align", &RowFileReader::align)
      .def_property_readonly("read_align", &RowFileReader::read_align)
      .def_property_readonly("max_request", &RowFileReader::max_request)
      .def_property_readonly("direct", &RowFileReader::direct)
      .def_property_readonly("closed", [](const RowFileReader& self) {
        py::gil_scoped_release nogil;
        return self.closed();
      })
      .def_property_readonly("fallback_reason", &RowFileReader::fallback_reason);
  m.def("drop_page_cache", &drop_page_cache, py::arg("path"),
        py::call_guard<py::gil_scoped_release>(),
        "posix_fadvise(DONTNEED) over the file at path: its pages leave the OS page cache.");
}

}  // namespace distmb
