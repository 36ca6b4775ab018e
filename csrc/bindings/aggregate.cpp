// Python bindings of the fused AGG kernels (csrc/kernels/aggregate.cpp, aggregate_gat.cpp).
#include <string>
#include <utility>

#include "aggregate.h"
#include "binding_utils.h"

namespace distmb {

namespace {

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

// x_dtype: "float32" (x float32), or "bfloat16" / "float16" (x int16: the values' bits).
void py_aggregate_forward(const py::array& indptr, const py::array& indices, int64_t n_src,
                          const py::array& x, int64_t dim, const std::string& kind,
                          const py::array& out, const std::string& x_dtype) {
  const int64_t n_dst = agg_csr(indptr, indices, "aggregate_forward");
  agg_nonnegative(n_src, "n_src");
  agg_nonnegative(dim, "dim");
  const AggKind k = agg_kind(kind);
  float* op = agg_data<float>(out, n_dst * dim, "out", true);
  const auto* ip = static_cast<const int64_t*>(indptr.data());
  const auto* ix = static_cast<const int64_t*>(indices.data());
  if (x_dtype == "float32") {
    const float* xp = agg_data<float>(x, n_src * dim, "x");
    py::gil_scoped_release nogil;
    aggregate_forward(ip, ix, n_dst, n_src, xp, dim, k, op);
  } else if (x_dtype == "bfloat16" || x_dtype == "float16") {
    const void* bits = agg_data<int16_t>(x, n_src * dim, "x (the values' bits)");
    py::gil_scoped_release nogil;
    if (x_dtype == "bfloat16") {
      aggregate_forward(ip, ix, n_dst, n_src, static_cast<const Bf16*>(bits), dim, k, op);
    } else {
      aggregate_forward(ip, ix, n_dst, n_src, static_cast<const Half*>(bits), dim, k, op);
    }
  } else {
    throw py::value_error("aggregate_forward: x_dtype must be float32, bfloat16 or float16, got '" +
                          x_dtype + "'");
  }
}

void py_aggregate_backward(const py::array& indptr, const py::array& t_indptr,
                           const py::array& t_dst, const py::array& grad_out, int64_t dim,
                           const std::string& kind, const py::array& grad_x,
                           const py::object& addend) {
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
  const float* add = nullptr;
  int64_t n_add = 0;
  if (!addend.is_none()) {
    const auto a = addend.cast<py::array>();
    if (a.ndim() != 2 || a.shape(1) != dim || a.shape(0) > n_src)
      throw py::value_error("aggregate_backward: addend must be [n_addend <= " +
                            std::to_string(n_src) + ", " + std::to_string(dim) + "]");
    n_add = a.shape(0);
    add = agg_data<float>(a, n_add * dim, "addend");
  }
  py::gil_scoped_release nogil;
  aggregate_backward(ip, n_dst, tp, td, n_src, g, dim, k, add, n_add, gx);
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

}  // namespace

void bind_aggregate(py::module_& m) {
  m.def("block_transpose", &py_block_transpose, py::arg("indptr"), py::arg("indices"),
        py::arg("n_src"),
        "Transposed CSR of a block: (t_indptr int64[n_src+1], t_edges int64[E], t_dst int64[E]),"
        " edge ids ascending within each source.");
  m.def("aggregate_forward", &py_aggregate_forward, py::arg("indptr"), py::arg("indices"),
        py::arg("n_src"), py::arg("x"), py::arg("dim"), py::arg("kind"), py::arg("out"),
        py::arg("x_dtype") = "float32",
        "out float32[n_dst, dim] = sum | mean | gcn of x [n_src, dim] over the CSR; x float32, "
        "or with x_dtype bfloat16 / float16 the values' bits as int16 (summed in float32).");
  m.def("aggregate_backward", &py_aggregate_backward, py::arg("indptr"), py::arg("t_indptr"),
        py::arg("t_dst"), py::arg("grad_out"), py::arg("dim"), py::arg("kind"),
        py::arg("grad_x"), py::arg("addend") = py::none(),
        "grad_x float32[n_src, dim] of aggregate_forward (transposed CSR), plus addend "
        "float32[n_addend, dim] on its first rows when given.");
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

}  // namespace distmb
