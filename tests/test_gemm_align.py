"""Linear layers' output widths padded for cuBLAS (:mod:`distmb.nn.kernels.gemm_align`): the
padded layer's values and gradients are the dense float64 reference's (test_nn's ``ref_sage``
and ``ref_gcn``)
with the padding forced on here (on CPU tensors, the PyTorch ops and the Triton node under
the interpreter), and on a GPU (``-m cuda``) where it is on by default."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import require_triton
from test_gcn_gin import ref_gcn
from test_nn import make_block, ref_sage
from test_triton_gcn_gin import check_layer, layer_block

from distmb.nn import GCNConv, SAGEConv
from distmb.nn.kernels import gemm_align
from distmb.nn.kernels.dispatch import get_kernels, set_kernels
from distmb.nn.kernels.gemm_align import gemm_width, pad_rows

RTOL, ATOL = 1e-5, 1e-5


def test_widths_round_up_on_cuda_only() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [gemm_width(w, cuda) for w in (1, 8, 47, 48, 256, 257)] == [8, 8, 48, 48, 256, 264]
    assert [gemm_width(w, cpu) for w in (1, 47, 257)] == [1, 47, 257]


def test_pad_rows_appends_zero_rows_and_drops_their_gradient() -> None:
    w = torch.randn(5, 3, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    pw, pb = pad_rows(w, 8), pad_rows(b, 8)
    assert pw.shape == (8, 3) and pb.shape == (8,)
    assert torch.equal(pw[:5], w) and not pw[5:].any() and not pb[5:].any()
    (pw.sum() * 2 + pb.sum()).backward()
    assert torch.equal(w.grad, torch.full((5, 3), 2.0)) and torch.equal(b.grad, torch.ones(5))
    assert pad_rows(w, 5) is w and pad_rows(None, 8) is None


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
)  # fmt: skip
@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("aggr", ["mean", "gcn"])
@pytest.mark.parametrize("dims", [(5, 7), (20, 3)], ids=["aggregate-first", "project-first"])
def test_padded_layer_matches_the_dense_reference(monkeypatch, device, kernels, aggr, dims):
    """A last layer (no activation) of 7 or 3 outputs computes 8 columns and returns a view
    of the first ones (its row stride says so); its output and the gradients of the input and
    every parameter are the float64 reference's; the parameters keep their shapes."""
    if kernels == "triton":
        require_triton(device)
    monkeypatch.setattr(gemm_align, "PADDED_DEVICE_TYPES", frozenset({"cpu", "cuda"}))
    before = get_kernels()
    set_kernels(kernels)
    try:
        torch.manual_seed(0)
        conv = SAGEConv(*dims, aggr=aggr, activation=False)
        with torch.no_grad():
            conv.bias.normal_()
        ref_conv = copy.deepcopy(conv).double()
        block = make_block(14, 31, 0, max_deg=7, seed=dims[0])
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(block.n_src, dims[0], generator=gen)
        g = torch.randn(block.n_dst, dims[1], generator=gen)
        conv = conv.to(device)
        x_dev = x.to(device).requires_grad_(True)
        out = conv(block.to(device), x_dev)
        assert out.shape == (block.n_dst, dims[1]) and out.stride(0) == 8
        assert conv.fc_neigh.weight.shape == (dims[1], dims[0]) and conv.bias.shape == (dims[1],)
        inputs = [x_dev, *conv.parameters()]
        grads = torch.autograd.grad(out, inputs, g.to(device))
        x64 = x.double().requires_grad_(True)
        ref = ref_sage(ref_conv, block, x64)
        ref_grads = torch.autograd.grad(ref, [x64, *ref_conv.parameters()], g.double())
    finally:
        set_kernels(before)
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=RTOL, atol=ATOL)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("dims", [(5, 7), (9, 4)], ids=["aggregate-first", "project-first"])
def test_padded_gcn_layer_matches_the_dense_reference(monkeypatch, kernels, dims):
    """GCNConv the same way (with self loops: the degrees differ at both ends)."""
    if kernels == "triton":
        require_triton("cpu")
    monkeypatch.setattr(gemm_align, "PADDED_DEVICE_TYPES", frozenset({"cpu"}))
    before = get_kernels()
    set_kernels(kernels)
    try:
        torch.manual_seed(0)
        conv = GCNConv(*dims, activation=False, self_loops=True)
        with torch.no_grad():
            conv.bias.normal_()
        block = layer_block(dims[0])
        assert conv(block, torch.randn(block.n_src, dims[0])).stride(0) == 8
        check_layer(conv, ref_gcn, block, True, "cpu")
    finally:
        set_kernels(before)
