// Python bindings of the fused UPDATE kernels (csrc/kernels/update/).
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "binding_utils.h"
#include "update.h"

namespace distmb {

namespace {

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

// The UPDATE sources from parallel lists xs[s] and ws[s] [k, c_s]: xs[s] is x [n, c_s], or a
// pair (table [N, c_s], rows int64[n]) whose row rows[i] is the source's row i (every rows[i]
// checked to lie in [0, N)).
std::vector<UpdateSource> upd_sources(const py::list& xs, const py::list& ws, int64_t n,
                                      int64_t k) {
  if (xs.size() != ws.size() || xs.size() > static_cast<size_t>(kMaxUpdateSources))
    throw py::value_error("xs and ws must be lists of the same length <= 2");
  std::vector<UpdateSource> src;
  for (size_t s = 0; s < xs.size(); ++s) {
    const auto w = ws[s].cast<py::array>();
    if (w.ndim() != 2) throw py::value_error("every weight must be 2-D [k, c]");
    const int64_t c = w.shape(1);
    const float* wp = upd_data<float>(w, {k, c}, "w");
    if (!py::isinstance<py::tuple>(xs[s])) {
      src.push_back({upd_data<float>(xs[s].cast<py::array>(), {n, c}, "x"), wp, c});
      continue;
    }
    const auto pair = xs[s].cast<py::tuple>();
    if (pair.size() != 2) throw py::value_error("an indexed source is a pair (table, rows)");
    const auto table = pair[0].cast<py::array>();
    if (table.ndim() != 2) throw py::value_error("an indexed source's table must be 2-D [N, c]");
    const int64_t num_rows = table.shape(0);
    const float* tp = upd_data<float>(table, {num_rows, c}, "table");
    const int64_t* rows = upd_data<int64_t>(pair[1].cast<py::array>(), {n}, "rows");
    for (int64_t i = 0; i < n; ++i)
      if (rows[i] < 0 || rows[i] >= num_rows)
        throw py::value_error("rows[" + std::to_string(i) + "] = " + std::to_string(rows[i]) +
                              " is outside the table's " + std::to_string(num_rows) + " rows");
    src.push_back({tp, wp, c, rows});
  }
  return src;
}

// The gradient buffers of the sources: grad_xs[s] [n, c_s] and grad_ws[s] [k, c_s], each an
// array or None (not wanted).
std::vector<UpdateGrads> upd_grads(const py::list& grad_xs, const py::list& grad_ws,
                                   const std::vector<UpdateSource>& src, int64_t n, int64_t k) {
  if (grad_xs.size() != src.size() || grad_ws.size() != src.size())
    throw py::value_error("grad_xs and grad_ws need one entry (array or None) per source");
  std::vector<UpdateGrads> grads;
  for (size_t s = 0; s < src.size(); ++s)
    grads.push_back({upd_optional<float>(grad_xs[s], {n, src[s].c}, "grad_x", true),
                     upd_optional<float>(grad_ws[s], {k, src[s].c}, "grad_w", true)});
  return grads;
}

int64_t upd_bytes_per_row(int64_t k) { return (k + 7) / 8; }

void py_update_forward(const py::list& xs, const py::list& ws, const py::object& addend,
                       const py::array& bias, bool relu, double p_drop, uint64_t seed,
                       const py::array& out, const py::object& gate_bits, bool bf16) {
  if (out.ndim() != 2) throw py::value_error("out must be 2-D [n, k]");
  const int64_t n = out.shape(0), k = out.shape(1);
  const auto src = upd_sources(xs, ws, n, k);
  const float* ad = upd_optional<float>(addend, {n, k}, "addend");
  const float* b = upd_data<float>(bias, {k}, "bias");
  float* o = upd_data<float>(out, {n, k}, "out", true);
  uint8_t* bits = upd_optional<uint8_t>(gate_bits, {n, upd_bytes_per_row(k)}, "gate_bits", true);
  py::gil_scoped_release nogil;
  update_forward(n, k, src.data(), static_cast<int>(src.size()), ad, b, relu, p_drop, seed, o,
                 bits, bf16);
}

void py_update_backward(const py::array& grad_out, const py::object& gate_bits, float scale,
                        const py::list& xs, const py::list& ws, const py::list& grad_xs,
                        const py::list& grad_ws, const py::object& grad_bias,
                        const py::object& grad_addend, bool bf16) {
  if (grad_out.ndim() != 2) throw py::value_error("grad_out must be 2-D [n, k]");
  const int64_t n = grad_out.shape(0), k = grad_out.shape(1);
  const float* g = upd_data<float>(grad_out, {n, k}, "grad_out");
  const uint8_t* bits = upd_optional<uint8_t>(gate_bits, {n, upd_bytes_per_row(k)}, "gate_bits");
  const auto src = upd_sources(xs, ws, n, k);
  const auto grads = upd_grads(grad_xs, grad_ws, src, n, k);
  float* gb = upd_optional<float>(grad_bias, {k}, "grad_bias", true);
  float* ga = upd_optional<float>(grad_addend, {n, k}, "grad_addend", true);
  py::gil_scoped_release nogil;
  update_backward(n, k, g, bits, scale, src.data(), static_cast<int>(src.size()), grads.data(),
                  gb, ga, bf16);
}

// The next block's CSR (indptr [n_next_dst + 1]) and its transpose (t_indptr [n_src + 1],
// t_dst [edges], as block_transpose makes them); grad_dst [n_next_dst, k]; addend
// [n_addend, k] or None; this UPDATE's n = xs' rows <= n_src. The t_dst entries of rows < n
// are checked to lie in [0, n_next_dst).
void py_update_backward_aggregated(const py::array& next_indptr, const py::array& t_indptr,
                                   const py::array& t_dst, const std::string& kind,
                                   const py::array& grad_dst, const py::object& addend,
                                   const py::object& gate_bits, float scale, int64_t n,
                                   const py::list& xs, const py::list& ws,
                                   const py::list& grad_xs, const py::list& grad_ws,
                                   const py::object& grad_bias, bool bf16) {
  const AggKind agg = agg_kind(kind);
  if (next_indptr.ndim() != 1 || next_indptr.shape(0) < 1 || t_indptr.ndim() != 1 ||
      t_indptr.shape(0) < 1 || t_dst.ndim() != 1 || grad_dst.ndim() != 2)
    throw py::value_error("next_indptr, t_indptr and t_dst must be 1-D, grad_dst 2-D");
  const int64_t n_next_dst = next_indptr.shape(0) - 1, n_src = t_indptr.shape(0) - 1;
  const int64_t k = grad_dst.shape(1), n_edges = t_dst.shape(0);
  if (n < 0 || n > n_src)
    throw py::value_error("n = " + std::to_string(n) + " must be in [0, " +
                          std::to_string(n_src) + "], the next block's sources");
  const int64_t* ip = upd_data<int64_t>(next_indptr, {n_next_dst + 1}, "next_indptr");
  const int64_t* tp = upd_data<int64_t>(t_indptr, {n_src + 1}, "t_indptr");
  const int64_t* td = upd_data<int64_t>(t_dst, {n_edges}, "t_dst");
  const float* g = upd_data<float>(grad_dst, {n_next_dst, k}, "grad_dst");
  const int64_t n_addend = addend.is_none() ? 0 : addend.cast<py::array>().shape(0);
  const float* ad = upd_optional<float>(addend, {n_addend, k}, "addend");
  const uint8_t* bits = upd_optional<uint8_t>(gate_bits, {n, upd_bytes_per_row(k)}, "gate_bits");
  if (tp[0] < 0 || tp[n] > n_edges)
    throw py::value_error("t_indptr's rows < n must lie within t_dst's " +
                          std::to_string(n_edges) + " entries");
  for (int64_t u = 0; u < n; ++u)
    if (tp[u + 1] < tp[u]) throw py::value_error("t_indptr must be non-decreasing");
  for (int64_t j = tp[0]; j < tp[n]; ++j)
    if (td[j] < 0 || td[j] >= n_next_dst)
      throw py::value_error("t_dst[" + std::to_string(j) + "] = " + std::to_string(td[j]) +
                            " is outside the next block's " + std::to_string(n_next_dst) +
                            " destinations");
  const auto src = upd_sources(xs, ws, n, k);
  const auto grads = upd_grads(grad_xs, grad_ws, src, n, k);
  float* gb = upd_optional<float>(grad_bias, {k}, "grad_bias", true);
  py::gil_scoped_release nogil;
  update_backward_aggregated(n, k, ip, n_next_dst, tp, td, agg, g, ad, n_addend, bits, scale,
                             src.data(), static_cast<int>(src.size()), grads.data(), gb, bf16);
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

void py_dropout_forward(const py::array& x, double p_drop, uint64_t seed, const py::array& out,
                        const py::array& bits) {
  if (x.ndim() != 2) throw py::value_error("x must be [n, k]");
  const int64_t n = x.shape(0), k = x.shape(1);
  const float* xp = upd_data<float>(x, {n, k}, "x");
  float* op = upd_data<float>(out, {n, k}, "out", true);
  uint8_t* bp = upd_data<uint8_t>(bits, {n, (k + 7) / 8}, "bits", true);
  py::gil_scoped_release nogil;
  dropout_forward(n, k, xp, p_drop, seed, op, bp);
}

void py_dropout_backward(const py::array& grad_out, const py::array& bits, float scale,
                         const py::array& grad_in) {
  if (grad_out.ndim() != 2) throw py::value_error("grad_out must be [n, k]");
  const int64_t n = grad_out.shape(0), k = grad_out.shape(1);
  const float* gp = upd_data<float>(grad_out, {n, k}, "grad_out");
  const uint8_t* bp = upd_data<uint8_t>(bits, {n, (k + 7) / 8}, "bits");
  float* dp = upd_data<float>(grad_in, {n, k}, "grad_in", true);
  py::gil_scoped_release nogil;
  dropout_backward(n, k, gp, bp, scale, dp);
}

// GAT shapes from attn_l [heads, d] and x [n, c].
void py_gat_projection_forward(const py::array& x, const py::array& w, const py::array& bias,
                               const py::array& attn_l, const py::array& attn_r, bool relu,
                               const py::array& z, const py::array& el, const py::array& er,
                               bool bf16) {
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
  gat_projection_forward(n, c, heads, d, xp, wp, bp, al, ar, relu, zp, elp, erp, bf16);
}

void py_gat_projection_backward(const py::array& x, const py::array& w, const py::array& z,
                                const py::array& attn_l, const py::array& attn_r, bool relu,
                                const py::array& grad_z, const py::array& grad_el,
                                const py::array& grad_er, const py::object& grad_x,
                                const py::array& grad_w, const py::array& grad_bias,
                                const py::array& grad_attn_l, const py::array& grad_attn_r,
                                bool bf16) {
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
                          gar, bf16);
}

}  // namespace

void bind_update(py::module_& m) {
  m.def("update_forward", &py_update_forward, py::arg("xs"), py::arg("ws"), py::arg("addend"),
        py::arg("bias"), py::arg("relu"), py::arg("p_drop"), py::arg("seed"), py::arg("out"),
        py::arg("gate_bits"), py::arg("bf16") = false,
        "out float32[n, k] = Dropout(ReLU(sum_s xs[s] @ ws[s].T + addend + bias)) (relu) or "
        "the linear sum; gate_bits uint8[n, ceil(k/8)] (or None) = ReLU-active and kept. bf16: "
        "the products' operands rounded to bfloat16, summed in float32.");
  m.def("update_backward", &py_update_backward, py::arg("grad_out"), py::arg("gate_bits"),
        py::arg("scale"), py::arg("xs"), py::arg("ws"), py::arg("grad_xs"), py::arg("grad_ws"),
        py::arg("grad_bias"), py::arg("grad_addend"), py::arg("bf16") = false,
        "Gradients of update_forward from the gate bits (None: linear) into the given buffers "
        "(None entries: skipped).");
  m.def("update_backward_aggregated", &py_update_backward_aggregated, py::arg("next_indptr"),
        py::arg("t_indptr"), py::arg("t_dst"), py::arg("kind"), py::arg("grad_dst"),
        py::arg("addend"), py::arg("gate_bits"), py::arg("scale"), py::arg("n"), py::arg("xs"),
        py::arg("ws"), py::arg("grad_xs"), py::arg("grad_ws"), py::arg("grad_bias"),
        py::arg("bf16") = false,
        "update_backward with its output gradient aggregated on the fly from the next layer's "
        "destination gradients over the next block's transposed CSR (never written).");
  m.def("dropout_keep_mask", &py_dropout_keep_mask, py::arg("seed"), py::arg("n"), py::arg("k"),
        py::arg("p_drop"),
        "uint8[n * k] (row-major, 0/1): the dropout decisions update_forward makes for seed.");
  m.def("dropout_forward", &py_dropout_forward, py::arg("x"), py::arg("p_drop"), py::arg("seed"),
        py::arg("out"), py::arg("bits"),
        "out float32[n, k] = x * keep / (1 - p) with dropout_keep_mask's masks for seed; keep "
        "bits packed into bits uint8[n, ceil(k / 8)].");
  m.def("dropout_backward", &py_dropout_backward, py::arg("grad_out"), py::arg("bits"),
        py::arg("scale"), py::arg("grad_in"),
        "grad_in float32[n, k] = grad_out * scale where the packed keep bit is set, else 0.");
  m.def("gat_projection_forward", &py_gat_projection_forward, py::arg("x"), py::arg("w"),
        py::arg("bias"), py::arg("attn_l"), py::arg("attn_r"), py::arg("relu"), py::arg("z"),
        py::arg("el"), py::arg("er"), py::arg("bf16") = false,
        "z float32[n, H*D] = act(x @ w.T + bias), el/er float32[n, H] per-head scores.");
  m.def("gat_projection_backward", &py_gat_projection_backward, py::arg("x"), py::arg("w"),
        py::arg("z"), py::arg("attn_l"), py::arg("attn_r"), py::arg("relu"), py::arg("grad_z"),
        py::arg("grad_el"), py::arg("grad_er"), py::arg("grad_x"), py::arg("grad_w"),
        py::arg("grad_bias"), py::arg("grad_attn_l"), py::arg("grad_attn_r"),
        py::arg("bf16") = false,
        "Gradients of gat_projection_forward into the given buffers (grad_x may be None).");
  m.def("update_bf16_native", &update_bf16_native,
        "Whether the bf16 products run on AVX512-BF16 instructions in this build (else in "
        "portable C++, no faster than float32).");
  m.def("set_update_bf16_portable", &set_update_bf16_portable, py::arg("portable"),
        "For tests: run the portable bf16 products even where the build has AVX512-BF16.");
}

}  // namespace distmb
