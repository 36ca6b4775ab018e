"""SAGEConv on the Triton path (``--kernels triton``): its aggregation and linear part as one
autograd node (``distmb.nn.kernels.triton_layer.LinearAggregate``: ``addmm`` chains, the
kernel's addend, the self term's gradient summed in the aggregation's backward) against
test_nn's dense float64 reference (values, and the gradients of the input and of every
parameter); under Triton's interpreter on CPU tensors here, compiled on a GPU under ``pytest
-m cuda``."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import require_triton
from test_nn import make_block, ref_sage

from distmb.nn import AGGREGATORS, SAGEConv
from distmb.nn.kernels import triton_layer
from distmb.nn.kernels.dispatch import set_kernels

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
#: float32 against float64: a few hundred roundings of terms of order 1.
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture
def node_calls(monkeypatch) -> list[int]:
    """One entry per ``LinearAggregate`` node built (the test would otherwise pass on the
    PyTorch-ops path as well)."""
    calls: list[int] = []
    apply = triton_layer.LinearAggregate.apply
    monkeypatch.setattr(
        triton_layer.LinearAggregate, "apply", lambda *args: calls.append(1) or apply(*args)
    )
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("aggr", AGGREGATORS)
@pytest.mark.parametrize("dims", [(5, 7), (9, 4)], ids=["aggregate-first", "project-first"])
@pytest.mark.parametrize("x_grad", [True, False])
def test_layer_matches_the_dense_reference(triton_kernels, node_calls, device, aggr, dims, x_grad):
    """Every aggregator, both orders (aggregate then project, project then aggregate with
    the self term and bias as the kernel's addend), with and without an input gradient (a
    first layer's features: the node computes none, nor the transposed CSR for it)."""
    require_triton(device)
    torch.manual_seed(0)
    conv = SAGEConv(*dims, aggr=aggr, activation=True)
    with torch.no_grad():
        conv.bias.normal_()  # zero at init; make it matter
    ref_conv = copy.deepcopy(conv).double()
    block = make_block(14, 31, 0, max_deg=7, seed=dims[0])
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(block.n_src, dims[0], generator=gen)
    g = torch.randn(block.n_dst, dims[1], generator=gen)
    conv = conv.to(device)
    x_dev = x.to(device).requires_grad_(x_grad)
    out = conv(block.to(device), x_dev)
    assert node_calls == [1]
    inputs = ([x_dev] if x_grad else []) + list(conv.parameters())
    grads = torch.autograd.grad(out, inputs, g.to(device))
    x64 = x.double().requires_grad_(x_grad)
    ref = ref_sage(ref_conv, block, x64)
    ref_inputs = ([x64] if x_grad else []) + list(ref_conv.parameters())
    ref_grads = torch.autograd.grad(ref, ref_inputs, g.double())
    torch.testing.assert_close(out.detach().cpu().double(), ref.detach(), rtol=RTOL, atol=ATOL)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=RTOL, atol=ATOL)


def test_layer_without_edges_is_self_term_and_bias(triton_kernels, node_calls):
    """A block without edges: the transposed CSR is empty, the output ``x W_s^T + b`` and
    the input gradient the self term's alone."""
    require_triton("cpu")
    conv = SAGEConv(6, 3, activation=False)
    block = make_block(4, 9, 0, max_deg=0, seed=2)
    assert block.num_edges == 0
    x = torch.randn(9, 6, requires_grad=True)
    out = conv(block, x)
    (grad,) = torch.autograd.grad(out.sum(), x)
    w_self = conv.fc_self.weight.detach()
    torch.testing.assert_close(out, x[:4] @ w_self.T + conv.bias, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad[:4], w_self.sum(0).expand(4, -1), rtol=1e-6, atol=1e-6)
    assert torch.equal(grad[4:], torch.zeros(5, 6))
    assert node_calls == [1]


def check_autocast_keeps_pytorchs_ops(conv: torch.nn.Module, node_calls: list) -> None:
    """Under bf16 autocast, ``conv`` (5 -> 7 features) with ``--kernels triton`` builds no
    Triton node (it would not reproduce autocast's casts and output dtypes): its output has
    the dtype and values of the PyTorch-ops layer's."""
    require_triton("cpu")
    block = make_block(6, 13, 0, max_deg=4, seed=3)
    x = torch.randn(13, 5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(block, x)
        set_kernels("torch")
        expected = conv(block, x)
    assert node_calls == []
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


def test_autocast_keeps_pytorchs_ops(triton_kernels, node_calls):
    check_autocast_keeps_pytorchs_ops(SAGEConv(5, 7), node_calls)
