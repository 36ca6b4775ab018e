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

// ---- HecCore (historical embedding cache; csrc/hec.cpp) ------------------------------------

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

void register_hec(py::module_& m) {
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

// ---- end of HecCore section ------------------------------------------------------------------

// ---- fused AGG kernels (csrc/aggregate.cpp) ----------------------------------------------

// The data of a C-contiguous array of dtype T with `size` elements, checked without conversion:
// outputs must be the caller's own buffer, and distmb.nn.fused_aggregate makes inputs
// contiguous float32 / int64 before calling, so a conversion here would only hide a copy.
template <class T>
T* agg_data(const py::array& a, int64_t size, const char* name, bool output = false) {
  if (!a.dtype().is(py::dtype::of<T>()) || !is_c_contiguous(a) || a.size() != size ||
      (output && !a.writeable()))
    throw py::value_error(std::string(name) + " must be a C-contiguous " +
                          (output ? "writeable " : "") + std::string(py::str(py::dtype::of<T>())) +
                          " array of " + std::to_string(size) + " elements (got " +
                          std::string(py::str(a.dtype())) + ", " + std::to_string(a.size()) +
                          " elements)");
  return static_cast<T*>(const_cast<void*>(a.data()));
}

// Optional output: null for None.
template <class T>
T* agg_optional(const py::object& a, int64_t size, const char* name) {
  return a.is_none() ? nullptr : agg_data<T>(a.cast<py::array>(), size, name, true);
}

// A block CSR: indptr int64[n_dst + 1] from 0 to len(indices); returns n_dst.
int64_t agg_csr(const py::array& indptr, const py::array& indices, const char* what) {
  if (indptr.ndim() != 1 || indptr.size() < 1 || indices.ndim() != 1)
    throw py::value_error(std::string(what) + ": indptr and indices must be 1-D, indptr non-empty");
  const int64_t* ip = agg_data<int64_t>(indptr, indptr.size(), "indptr");
  agg_data<int64_t>(indices, indices.size(), "indices");
  const int64_t n = indptr.size() - 1;
  if (ip[0] != 0 || ip[n] != indices.size())
    throw py::value_error(std::string(what) +
                          ": indptr must start at 0 and end at len(indices) = " +
                          std::to_string(indices.size()) + " (got " + std::to_string(ip[0]) +
                          " .. " + std::to_string(ip[n]) + ")");
  return n;
}

// A transposed block CSR (block_transpose): t_indptr int64[n_src + 1] from 0 to the block's
// edge count `n_edges`; returns n_src.
int64_t agg_transposed(const py::array& t_indptr, int64_t n_edges, const char* what) {
  if (t_indptr.ndim() != 1 || t_indptr.size() < 1)
    throw py::value_error(std::string(what) + ": t_indptr must be 1-D and non-empty");
  const int64_t* tp = agg_data<int64_t>(t_indptr, t_indptr.size(), "t_indptr");
  const int64_t n = t_indptr.size() - 1;
  if (tp[0] != 0 || tp[n] != n_edges)
    throw py::value_error(std::string(what) + ": t_indptr must start at 0 and end at the " +
                          "block's edge count " + std::to_string(n_edges) + " (got " +
                          std::to_string(tp[0]) + " .. " + std::to_string(tp[n]) + ")");
  return n;
}

AggKind agg_kind(const std::string& kind) {
  if (kind == "sum") return AggKind::kSum;
  if (kind == "mean") return AggKind::kMean;
  if (kind == "gcn") return AggKind::kGcn;
  throw py::value_error("unknown aggregator '" + kind + "'; expected sum, mean or gcn");
}

void agg_nonnegative(int64_t value, const char* name) {
  if (value < 0) throw py::value_error(std::string(name) + " must be >= 0");
}

py::tuple py_block_transpose(const py::array& indptr, const py::array& indices, int64_t n_src) {
  const int64_t n_dst = agg_csr(indptr, indices, "block_transpose");
  agg_nonnegative(n_src, "n_src");
  BlockTranspose t;
  {
    const auto* ip = static_cast<const int64_t*>(indptr.data());
    const auto* ix = static_cast<const int64_t*>(indices.data());
    py::gil_scoped_release nogil;
    transpose_block(ip, ix, n_dst, n_src, t);
  }
  return py::make_tuple(to_numpy(std::move(t.indptr)), to_numpy(std::move(t.edges)),
                        to_numpy(std::move(t.dst)));
}

void py_aggregate_forward(const py::array& indptr, const py::array& indices, int64_t n_src,
                          const py::array& x, int64_t dim, const std::string& kind,
                          const py::array& out) {
  const int64_t n_dst = agg_csr(indptr, indices, "aggregate_forward");
  agg_nonnegative(n_src, "n_src");
  agg_nonnegative(dim, "dim");
  const AggKind k = agg_kind(kind);
  const float* xp = agg_data<float>(x, n_src * dim, "x");
  float* op = agg_data<float>(out, n_dst * dim, "out", true);
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  const auto* ix = static_cast<const int64_t*>(indices.data());
  py::gil_scoped_release nogil;
  aggregate_forward(ip, ix, n_dst, n_src, xp, dim, k, op);
}

void py_aggregate_backward(const py::array& indptr, const py::array& t_indptr,
                           const py::array& t_dst, const py::array& grad_out, int64_t dim,
                           const std::string& kind, const py::array& grad_x) {
  agg_nonnegative(dim, "dim");
  const AggKind k = agg_kind(kind);
  const int64_t n_dst = indptr.size() - 1;
  if (n_dst < 0) throw py::value_error("aggregate_backward: indptr must be non-empty");
  const int64_t* ip = agg_data<int64_t>(indptr, n_dst + 1, "indptr");
  const int64_t n_src = agg_transposed(t_indptr, ip[n_dst], "aggregate_backward");
  const auto* tp = static_cast<const int64_t*>(t_indptr.data());
  const int64_t* td = agg_data<int64_t>(t_dst, ip[n_dst], "t_dst");
  const float* g = agg_data<float>(grad_out, n_dst * dim, "grad_out");
  float* gx = agg_data<float>(grad_x, n_src * dim, "grad_x", true);
  py::gil_scoped_release nogil;
  aggregate_backward(ip, n_dst, tp, td, n_src, g, dim, k, gx);
}

void py_edge_softmax_forward(const py::array& indptr, const py::array& scores, int64_t heads,
                             const py::array& alpha) {
  agg_nonnegative(heads, "heads");
  const int64_t n_dst = indptr.size() - 1;
  if (n_dst < 0) throw py::value_error("indptr must be non-empty");
  const int64_t* ip = agg_data<int64_t>(indptr, n_dst + 1, "indptr");
  if (ip[0] != 0) throw py::value_error("indptr must start at 0");
  const float* s = agg_data<float>(scores, ip[n_dst] * heads, "scores");
  float* a = agg_data<float>(alpha, ip[n_dst] * heads, "alpha", true);
  py::gil_scoped_release nogil;
  edge_softmax_forward(ip, n_dst, s, heads, a);
}

void py_edge_softmax_backward(const py::array& indptr, const py::array& alpha,
                              const py::array& grad_alpha, int64_t heads,
                              const py::array& grad_scores) {
  agg_nonnegative(heads, "heads");
  const int64_t n_dst = indptr.size() - 1;
  if (n_dst < 0) throw py::value_error("indptr must be non-empty");
  const int64_t* ip = agg_data<int64_t>(indptr, n_dst + 1, "indptr");
  if (ip[0] != 0) throw py::value_error("indptr must start at 0");
  const int64_t n = ip[n_dst] * heads;
  const float* a = agg_data<float>(alpha, n, "alpha");
  const float* g = agg_data<float>(grad_alpha, n, "grad_alpha");
  float* gs = agg_data<float>(grad_scores, n, "grad_scores", true);
  py::gil_scoped_release nogil;
  edge_softmax_backward(ip, n_dst, a, g, heads, gs);
}

void py_gat_attention_forward(const py::array& indptr, const py::array& indices, int64_t n_src,
                              const py::array& el, const py::array& er, int64_t heads,
                              float negative_slope, const py::array& alpha) {
  const int64_t n_dst = agg_csr(indptr, indices, "gat_attention_forward");
  agg_nonnegative(n_src, "n_src");
  agg_nonnegative(heads, "heads");
  const float* l = agg_data<float>(el, n_src * heads, "el");
  const float* r = agg_data<float>(er, n_dst * heads, "er");
  float* a = agg_data<float>(alpha, indices.size() * heads, "alpha", true);
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  const auto* ix = static_cast<const int64_t*>(indices.data());
  py::gil_scoped_release nogil;
  gat_attention_forward(ip, ix, n_dst, n_src, l, r, heads, negative_slope, a);
}

void py_gat_attention_backward(const py::array& indptr, const py::array& indices,
                               const py::array& t_indptr, const py::array& t_edges,
                               const py::array& el, const py::array& er, const py::array& alpha,
                               const py::array& grad_alpha, int64_t heads, float negative_slope,
                               const py::object& grad_el, const py::object& grad_er) {
  const int64_t n_dst = agg_csr(indptr, indices, "gat_attention_backward");
  agg_nonnegative(heads, "heads");
  const int64_t n_edges = indices.size();
  const int64_t n_src = agg_transposed(t_indptr, n_edges, "gat_attention_backward");
  const auto* tp = static_cast<const int64_t*>(t_indptr.data());
  const int64_t* te = agg_data<int64_t>(t_edges, n_edges, "t_edges");
  const float* l = agg_data<float>(el, n_src * heads, "el");
  const float* r = agg_data<float>(er, n_dst * heads, "er");
  const float* a = agg_data<float>(alpha, n_edges * heads, "alpha");
  const float* g = agg_data<float>(grad_alpha, n_edges * heads, "grad_alpha");
  float* gl = agg_optional<float>(grad_el, n_src * heads, "grad_el");
  float* gr = agg_optional<float>(grad_er, n_dst * heads, "grad_er");
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  const auto* ix = static_cast<const int64_t*>(indices.data());
  py::gil_scoped_release nogil;
  gat_attention_backward(ip, ix, n_dst, tp, te, n_src, l, r, a, g, heads, negative_slope, gl, gr);
}

void py_weighted_aggregate_forward(const py::array& indptr, const py::array& indices,
                                   int64_t n_src, const py::array& weights, const py::array& x,
                                   int64_t heads, int64_t dim, const py::array& out) {
  const int64_t n_dst = agg_csr(indptr, indices, "weighted_aggregate_forward");
  agg_nonnegative(n_src, "n_src");
  agg_nonnegative(heads, "heads");
  agg_nonnegative(dim, "dim");
  const float* w = agg_data<float>(weights, indices.size() * heads, "weights");
  const float* xp = agg_data<float>(x, n_src * heads * dim, "x");
  float* op = agg_data<float>(out, n_dst * heads * dim, "out", true);
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  const auto* ix = static_cast<const int64_t*>(indices.data());
  py::gil_scoped_release nogil;
  weighted_aggregate_forward(ip, ix, n_dst, n_src, w, xp, heads, dim, op);
}

void py_weighted_aggregate_backward(const py::array& t_indptr, const py::array& t_edges,
                                    const py::array& t_dst, const py::array& weights,
                                    const py::array& x, const py::array& grad_out, int64_t n_dst,
                                    int64_t heads, int64_t dim, const py::object& grad_x,
                                    const py::object& grad_w) {
  agg_nonnegative(n_dst, "n_dst");
  agg_nonnegative(heads, "heads");
  agg_nonnegative(dim, "dim");
  const int64_t n_edges = t_edges.size();
  const int64_t n_src = agg_transposed(t_indptr, n_edges, "weighted_aggregate_backward");
  const auto* tp = static_cast<const int64_t*>(t_indptr.data());
  const int64_t* te = agg_data<int64_t>(t_edges, n_edges, "t_edges");
  const int64_t* td = agg_data<int64_t>(t_dst, n_edges, "t_dst");
  const float* w = agg_data<float>(weights, n_edges * heads, "weights");
  const float* xp = agg_data<float>(x, n_src * heads * dim, "x");
  const float* g = agg_data<float>(grad_out, n_dst * heads * dim, "grad_out");
  float* gx = agg_optional<float>(grad_x, n_src * heads * dim, "grad_x");
  float* gw = agg_optional<float>(grad_w, n_edges * heads, "grad_w");
  py::gil_scoped_release nogil;
  weighted_aggregate_backward(tp, te, td, n_src, w, xp, g, heads, dim, gx, gw);
}

void py_stream_copy(const py::array& src, const py::array& dst) {
  const float* s = agg_data<float>(src, src.size(), "src");
  float* d = agg_data<float>(dst, src.size(), "dst", true);
  py::gil_scoped_release nogil;
  stream_copy(s, src.size(), d);
}

void register_aggregate(py::module_& m) {
  m.def("block_transpose", &py_block_transpose, py::arg("indptr"), py::arg("indices"),
        py::arg("n_src"),
        "Transposed CSR of a block: (t_indptr int64[n_src+1], t_edges int64[E], t_dst int64[E]),"
        " edge ids ascending within each source.");
  m.def("aggregate_forward", &py_aggregate_forward, py::arg("indptr"), py::arg("indices"),
        py::arg("n_src"), py::arg("x"), py::arg("dim"), py::arg("kind"), py::arg("out"),
        "out float32[n_dst, dim] = sum | mean | gcn of x float32[n_src, dim] over the CSR.");
  m.def("aggregate_backward", &py_aggregate_backward, py::arg("indptr"), py::arg("t_indptr"),
        py::arg("t_dst"), py::arg("grad_out"), py::arg("dim"), py::arg("kind"),
        py::arg("grad_x"), "grad_x float32[n_src, dim] of aggregate_forward (transposed CSR).");
  m.def("edge_softmax_forward", &py_edge_softmax_forward, py::arg("indptr"), py::arg("scores"),
        py::arg("heads"), py::arg("alpha"),
        "alpha float32[E, H] = per-destination softmax of scores float32[E, H].");
  m.def("edge_softmax_backward", &py_edge_softmax_backward, py::arg("indptr"), py::arg("alpha"),
        py::arg("grad_alpha"), py::arg("heads"), py::arg("grad_scores"),
        "grad_scores float32[E, H] of edge_softmax_forward.");
  m.def("gat_attention_forward", &py_gat_attention_forward, py::arg("indptr"),
        py::arg("indices"), py::arg("n_src"), py::arg("el"), py::arg("er"), py::arg("heads"),
        py::arg("negative_slope"), py::arg("alpha"),
        "alpha float32[E, H] = edge softmax of LeakyReLU(el[src] + er[dst]).");
  m.def("gat_attention_backward", &py_gat_attention_backward, py::arg("indptr"),
        py::arg("indices"), py::arg("t_indptr"), py::arg("t_edges"), py::arg("el"),
        py::arg("er"), py::arg("alpha"), py::arg("grad_alpha"), py::arg("heads"),
        py::arg("negative_slope"), py::arg("grad_el"), py::arg("grad_er"),
        "grad_el float32[n_src, H] and grad_er float32[n_dst, H] (None: skipped).");
  m.def("weighted_aggregate_forward", &py_weighted_aggregate_forward, py::arg("indptr"),
        py::arg("indices"), py::arg("n_src"), py::arg("weights"), py::arg("x"),
        py::arg("heads"), py::arg("dim"), py::arg("out"),
        "out float32[n_dst, H, D] = sum_e weights[e, h] * x[src_e, h, :].");
  m.def("weighted_aggregate_backward", &py_weighted_aggregate_backward, py::arg("t_indptr"),
        py::arg("t_edges"), py::arg("t_dst"), py::arg("weights"), py::arg("x"),
        py::arg("grad_out"), py::arg("n_dst"), py::arg("heads"), py::arg("dim"),
        py::arg("grad_x"), py::arg("grad_w"),
        "grad_x float32[n_src, H, D] and grad_w float32[E, H] in one pass (None: skipped).");
  m.def("stream_copy", &py_stream_copy, py::arg("src"), py::arg("dst"),
        "dst[:] = src (float32, OpenMP): copy-bandwidth reference.");
}

// ---- end of fused AGG section ------------------------------------------------------------

// ---- fused UPDATE kernels (csrc/update.cpp) ----------------------------------------------

// The data of a C-contiguous array of dtype T and the given shape, checked without conversion
// (distmb.nn.fused_update passes contiguous float32 tensors; outputs must be the caller's own
// buffer, so a converted copy would silently lose the result).
template <class T>
T* upd_data(const py::array& a, std::initializer_list<int64_t> shape, const char* name,
            bool output = false) {
  bool ok = a.dtype().is(py::dtype::of<T>()) && is_c_contiguous(a) &&
            a.ndim() == static_cast<py::ssize_t>(shape.size()) && (!output || a.writeable());
  std::string want;
  int dim = 0;
  for (int64_t s : shape) {
    if (ok && a.shape(dim) != s) ok = false;
    want += (dim++ ? ", " : "") + std::to_string(s);
  }
  if (!ok) {
    std::string got;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) got += (i ? ", " : "") + std::to_string(a.shape(i));
    throw py::value_error(std::string(name) + " must be a C-contiguous " +
                          (output ? "writeable " : "") + std::string(py::str(py::dtype::of<T>())) +
                          " array of shape [" + want + "] (got " + std::string(py::str(a.dtype())) +
                          " [" + got + "])");
  }
  return static_cast<T*>(const_cast<void*>(a.data()));
}

template <class T>
T* upd_optional(const py::object& a, std::initializer_list<int64_t> shape, const char* name,
                bool output = false) {
  return a.is_none() ? nullptr : upd_data<T>(a.cast<py::array>(), shape, name, output);
}

// The UPDATE sources from parallel lists xs[s] [n, c_s] and ws[s] [k, c_s].
std::vector<UpdateSource> upd_sources(const py::list& xs, const py::list& ws, int64_t n,
                                      int64_t k) {
  if (xs.size() != ws.size() || xs.size() > static_cast<size_t>(kMaxUpdateSources))
    throw py::value_error("xs and ws must be lists of the same length <= 2");
  std::vector<UpdateSource> src;
  for (size_t s = 0; s < xs.size(); ++s) {
    const auto w = ws[s].cast<py::array>();
    if (w.ndim() != 2) throw py::value_error("every weight must be 2-D [k, c]");
    const int64_t c = w.shape(1);
    src.push_back({upd_data<float>(xs[s].cast<py::array>(), {n, c}, "x"),
                   upd_data<float>(w, {k, c}, "w"), c});
  }
  return src;
}

int64_t upd_bytes_per_row(int64_t k) { return (k + 7) / 8; }

void py_update_forward(const py::list& xs, const py::list& ws, const py::object& addend,
                       const py::array& bias, bool relu, double p_drop, uint64_t seed,
                       const py::array& out, const py::object& gate_bits) {
  if (out.ndim() != 2) throw py::value_error("out must be 2-D [n, k]");
  const int64_t n = out.shape(0), k = out.shape(1);
  const auto src = upd_sources(xs, ws, n, k);
  const float* ad = upd_optional<float>(addend, {n, k}, "addend");
  const float* b = upd_data<float>(bias, {k}, "bias");
  float* o = upd_data<float>(out, {n, k}, "out", true);
  uint8_t* bits = upd_optional<uint8_t>(gate_bits, {n, upd_bytes_per_row(k)}, "gate_bits", true);
  py::gil_scoped_release nogil;
  update_forward(n, k, src.data(), static_cast<int>(src.size()), ad, b, relu, p_drop, seed, o,
                 bits);
}

void py_update_backward(const py::array& grad_out, const py::object& gate_bits, float scale,
                        const py::list& xs, const py::list& ws, const py::list& grad_xs,
                        const py::list& grad_ws, const py::object& grad_bias,
                        const py::object& grad_addend) {
  if (grad_out.ndim() != 2) throw py::value_error("grad_out must be 2-D [n, k]");
  const int64_t n = grad_out.shape(0), k = grad_out.shape(1);
  const float* g = upd_data<float>(grad_out, {n, k}, "grad_out");
  const uint8_t* bits = upd_optional<uint8_t>(gate_bits, {n, upd_bytes_per_row(k)}, "gate_bits");
  const auto src = upd_sources(xs, ws, n, k);
  if (grad_xs.size() != src.size() || grad_ws.size() != src.size())
    throw py::value_error("grad_xs and grad_ws need one entry (array or None) per source");
  std::vector<UpdateGrads> grads;
  for (size_t s = 0; s < src.size(); ++s)
    grads.push_back({upd_optional<float>(grad_xs[s], {n, src[s].c}, "grad_x", true),
                     upd_optional<float>(grad_ws[s], {k, src[s].c}, "grad_w", true)});
  float* gb = upd_optional<float>(grad_bias, {k}, "grad_bias", true);
  float* ga = upd_optional<float>(grad_addend, {n, k}, "grad_addend", true);
  py::gil_scoped_release nogil;
  update_backward(n, k, g, bits, scale, src.data(), static_cast<int>(src.size()), grads.data(),
                  gb, ga);
}

py::array_t<uint8_t> py_dropout_keep_mask(uint64_t seed, int64_t n, int64_t k, double p_drop) {
  if (n < 0 || k < 0) throw py::value_error("n and k must be >= 0");
  std::vector<uint8_t> keep(static_cast<size_t>(n * k));
  {
    py::gil_scoped_release nogil;
    dropout_keep_mask(seed, n, k, p_drop, keep.data());
  }
  return to_numpy(std::move(keep));
}

// GAT shapes from attn_l [heads, d] and x [n, c].
void py_gat_projection_forward(const py::array& x, const py::array& w, const py::array& bias,
                               const py::array& attn_l, const py::array& attn_r, bool relu,
                               const py::array& z, const py::array& el, const py::array& er) {
  if (x.ndim() != 2 || attn_l.ndim() != 2)
    throw py::value_error("x must be [n, c] and attn_l [heads, d]");
  const int64_t n = x.shape(0), c = x.shape(1), heads = attn_l.shape(0), d = attn_l.shape(1);
  const int64_t k = heads * d;
  const float* xp = upd_data<float>(x, {n, c}, "x");
  const float* wp = upd_data<float>(w, {k, c}, "w");
  const float* bp = upd_data<float>(bias, {k}, "bias");
  const float* al = upd_data<float>(attn_l, {heads, d}, "attn_l");
  const float* ar = upd_data<float>(attn_r, {heads, d}, "attn_r");
  float* zp = upd_data<float>(z, {n, k}, "z", true);
  float* elp = upd_data<float>(el, {n, heads}, "el", true);
  float* erp = upd_data<float>(er, {n, heads}, "er", true);
  py::gil_scoped_release nogil;
  gat_projection_forward(n, c, heads, d, xp, wp, bp, al, ar, relu, zp, elp, erp);
}

void py_gat_projection_backward(const py::array& x, const py::array& w, const py::array& z,
                                const py::array& attn_l, const py::array& attn_r, bool relu,
                                const py::array& grad_z, const py::array& grad_el,
                                const py::array& grad_er, const py::object& grad_x,
                                const py::array& grad_w, const py::array& grad_bias,
                                const py::array& grad_attn_l, const py::array& grad_attn_r) {
  if (x.ndim() != 2 || attn_l.ndim() != 2)
    throw py::value_error("x must be [n, c] and attn_l [heads, d]");
  const int64_t n = x.shape(0), c = x.shape(1), heads = attn_l.shape(0), d = attn_l.shape(1);
  const int64_t k = heads * d;
  const float* xp = upd_data<float>(x, {n, c}, "x");
  const float* wp = upd_data<float>(w, {k, c}, "w");
  const float* zp = upd_data<float>(z, {n, k}, "z");
  const float* al = upd_data<float>(attn_l, {heads, d}, "attn_l");
  const float* ar = upd_data<float>(attn_r, {heads, d}, "attn_r");
  const float* gz = upd_data<float>(grad_z, {n, k}, "grad_z");
  const float* gel = upd_data<float>(grad_el, {n, heads}, "grad_el");
  const float* ger = upd_data<float>(grad_er, {n, heads}, "grad_er");
  float* gx = upd_optional<float>(grad_x, {n, c}, "grad_x", true);
  float* gw = upd_data<float>(grad_w, {k, c}, "grad_w", true);
  float* gb = upd_data<float>(grad_bias, {k}, "grad_bias", true);
  float* gal = upd_data<float>(grad_attn_l, {heads, d}, "grad_attn_l", true);
  float* gar = upd_data<float>(grad_attn_r, {heads, d}, "grad_attn_r", true);
  py::gil_scoped_release nogil;
  gat_projection_backward(n, c, heads, d, xp, wp, zp, al, ar, relu, gz, gel, ger, gx, gw, gb, gal,
                          gar);
}

void register_update(py::module_& m) {
  m.def("update_forward", &py_update_forward, py::arg("xs"), py::arg("ws"), py::arg("addend"),
        py::arg("bias"), py::arg("relu"), py::arg("p_drop"), py::arg("seed"), py::arg("out"),
        py::arg("gate_bits"),
        "out float32[n, k] = Dropout(ReLU(sum_s xs[s] @ ws[s].T + addend + bias)) (relu) or "
        "the linear sum; gate_bits uint8[n, ceil(k/8)] (or None) = ReLU-active and kept.");
  m.def("update_backward", &py_update_backward, py::arg("grad_out"), py::arg("gate_bits"),
        py::arg("scale"), py::arg("xs"), py::arg("ws"), py::arg("grad_xs"), py::arg("grad_ws"),
        py::arg("grad_bias"), py::arg("grad_addend"),
        "Gradients of update_forward from the gate bits (None: linear) into the given buffers "
        "(None entries: skipped).");
  m.def("dropout_keep_mask", &py_dropout_keep_mask, py::arg("seed"), py::arg("n"), py::arg("k"),
        py::arg("p_drop"),
        "uint8[n * k] (row-major, 0/1): the dropout decisions update_forward makes for seed.");
  m.def("gat_projection_forward", &py_gat_projection_forward, py::arg("x"), py::arg("w"),
        py::arg("bias"), py::arg("attn_l"), py::arg("attn_r"), py::arg("relu"), py::arg("z"),
        py::arg("el"), py::arg("er"),
        "z float32[n, H*D] = act(x @ w.T + bias), el/er float32[n, H] per-head scores.");
  m.def("gat_projection_backward", &py_gat_projection_backward, py::arg("x"), py::arg("w"),
        py::arg("z"), py::arg("attn_l"), py::arg("attn_r"), py::arg("relu"), py::arg("grad_z"),
        py::arg("grad_el"), py::arg("grad_er"), py::arg("grad_x"), py::arg("grad_w"),
        py::arg("grad_bias"), py::arg("grad_attn_l"), py::arg("grad_attn_r"),
        "Gradients of gat_projection_forward into the given buffers (grad_x may be None).");
}

// ---- end of fused UPDATE section ---------------------------------------------------------

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
  register_hec(m);  // csrc/hec.cpp
  register_aggregate(m);  // csrc/aggregate.cpp
  register_update(m);  // csrc/update.cpp
}
