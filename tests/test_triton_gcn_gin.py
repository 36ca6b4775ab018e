"""GCNConv and GINConv on the Triton path (``--kernels triton``): each layer's aggregation as
one autograd node (``distmb.nn.kernels.triton_layer.LinearAggregate``: symmetric factors and
self loops in the kernel, ``addmm`` / the kernel's addend for ``W`` and the bias;
``distmb.nn.kernels.triton_layer.GINAggregate``: ``(1 + eps) x_v`` in the kernel) against
test_gcn_gin's dense float64 references (values, and the gradients of the input and of every
parameter, ``eps`` included), and on padded blocks against the unpadded model; under
Triton's interpreter on CPU tensors here, compiled on a GPU under ``pytest -m cuda``."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import require_triton
from test_gcn_gin import ref_gcn, ref_gin
from test_nn import dense_adj, make_block
from test_padded_blocks import check_padded_equals_unpadded, random_blocks
from test_triton_sage import check_autocast_keeps_pytorchs_ops

from distmb.nn import GCNConv, GINConv
from distmb.nn.kernels import triton_layer
from distmb.pipeline.sample import Block

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
#: float32 against float64: a few hundred roundings of terms of order 1.
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture
def node_calls(monkeypatch) -> list[str]:
    """One entry per Triton node built (the tests would otherwise pass on the PyTorch-ops
    path as well)."""
    calls: list[str] = []
    for module, node in ((triton_layer, "LinearAggregate"), (triton_layer, "GINAggregate")):
        cls = getattr(module, node)
        apply = cls.apply
        monkeypatch.setattr(
            cls, "apply", lambda *args, _n=node, _a=apply: calls.append(_n) or _a(*args)
        )
    return calls


def layer_block(seed: int) -> Block:
    """14 destinations (four row tiles), 31 sources (5 of them halo leaves), with at least
    one destination without edges and one source without out-edges among the destinations
    and among the other sources."""
    block = make_block(14, 31, 5, max_deg=6, seed=seed)
    out_deg = torch.bincount(block.indices, minlength=block.n_src)
    assert (block.indptr[1:] == block.indptr[:-1]).any()
    assert (out_deg[:14] == 0).any() and (out_deg[14:] == 0).any()
    return block


def check_layer(conv: torch.nn.Module, ref, block: Block, x_grad: bool, device: str) -> None:
    """``conv`` (float32, on ``device``) against ``ref(conv64, adj, x64)``: the output and the
    gradients of the input (with ``x_grad``) and of every parameter for a random output
    gradient."""
    ref_conv = copy.deepcopy(conv).double()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(block.n_src, conv.in_dim, generator=gen)
    g = torch.randn(block.n_dst, conv.out_dim, generator=gen)
    conv = conv.to(device)
    x_dev = x.to(device).requires_grad_(x_grad)
    out = conv(block.to(device), x_dev)
    inputs = ([x_dev] if x_grad else []) + list(conv.parameters())
    grads = torch.autograd.grad(out, inputs, g.to(device))
    x64 = x.double().requires_grad_(x_grad)
    want = ref(ref_conv, dense_adj(block).double(), x64)
    ref_inputs = ([x64] if x_grad else []) + list(ref_conv.parameters())
    ref_grads = torch.autograd.grad(want, ref_inputs, g.double())
    torch.testing.assert_close(out.detach().cpu().double(), want.detach(), rtol=RTOL, atol=ATOL)
    for got, expected in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.cpu().double(), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("self_loops", [True, False])
@pytest.mark.parametrize("dims", [(5, 7), (9, 4)], ids=["aggregate-first", "project-first"])
@pytest.mark.parametrize("x_grad", [True, False])
def test_gcn_layer_matches_the_dense_reference(
    triton_kernels, node_calls, device, self_loops, dims, x_grad
):
    """Both orders (aggregate then ``addmm``; project, then the aggregation with the bias as
    the kernel's addend), with and without self loops (the degrees then differ at both ends:
    a destination's in-degree and every destination's out-degree as a source), with and
    without an input gradient."""
    require_triton(device)
    torch.manual_seed(0)
    conv = GCNConv(*dims, activation=True, self_loops=self_loops)
    with torch.no_grad():
        conv.bias.normal_()  # zero at init; a misplaced bias would hide
    check_layer(conv, ref_gcn, layer_block(dims[0]), x_grad, device)
    assert node_calls == ["LinearAggregate"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("eps", "train_eps"), [(0.0, False), (0.3, True), (-0.5, False)])
@pytest.mark.parametrize("x_grad", [True, False])
def test_gin_layer_matches_the_dense_reference(
    triton_kernels, node_calls, device, eps, train_eps, x_grad
):
    """A fixed and a learnable ``eps`` (whose gradient is the node's dot product), with and
    without an input gradient (a learnable ``eps`` still needs the node's backward)."""
    require_triton(device)
    torch.manual_seed(2)
    conv = GINConv(6, 5, eps=eps, train_eps=train_eps, activation=True)
    check_layer(conv, ref_gin, layer_block(7), x_grad, device)
    assert node_calls == ["GINAggregate"]


def test_gcn_normalises_by_block_degrees_by_hand(triton_kernels, node_calls):
    """test_gcn_gin's hand-computed block on the Triton path: dst 0 <- {1, 2}, dst 1 <- {2},
    self loops added: d_in = (3, 2), source out-degrees (1, 2, 2)."""
    block = Block(2, 3, 0, torch.tensor([0, 2, 3]), torch.tensor([1, 2, 2]), torch.arange(3))
    conv = GCNConv(1, 1, activation=False)
    with torch.no_grad():
        conv.fc.weight.fill_(1.0)
        conv.bias.zero_()
    x = torch.tensor([[1.0], [10.0], [100.0]])
    s = 2**-0.5
    want = torch.tensor([[(1 + 10 * s + 100 * s) / 3**0.5], [(100 * s + 10 * s) * s]])
    torch.testing.assert_close(conv(block, x), want)
    assert node_calls == ["LinearAggregate"]


@pytest.mark.parametrize("name", ["gcn", "gin"])
def test_padded_blocks_give_the_unpadded_rows(triton_kernels, node_calls, name):
    """Padded blocks (test_padded_blocks' check: every layer's real rows, the loss and every
    parameter gradient): no padded row enters a real row's value, nor, for GCN, a real
    source's out-degree read from the transposed CSR."""
    fanouts = (2, 2)
    blocks = random_blocks(3, fanouts, n_solid=10_000, seed=5)
    check_padded_equals_unpadded(name, blocks, fanouts, 10_000)
    assert node_calls and set(node_calls) == {
        "LinearAggregate" if name == "gcn" else "GINAggregate"
    }


@pytest.mark.parametrize("layer", ["gcn", "gin"])
def test_autocast_keeps_pytorchs_ops(triton_kernels, node_calls, layer):
    check_autocast_keeps_pytorchs_ops(
        GCNConv(5, 7) if layer == "gcn" else GINConv(5, 7), node_calls
    )
