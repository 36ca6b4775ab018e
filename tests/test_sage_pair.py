"""Two GraphSAGE layers as one autograd node (``distmb.nn.sage.fused_pair_forward``): the first
layer's output gradient is aggregated row by row inside its UPDATE backward
(``update_backward_aggregated``) instead of being written by the second layer's aggregation
backward. Values and gradients must be bit-identical to the two layers run one by one."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import make_block
from torch import Tensor

from distmb import _C
from distmb.nn import GraphSAGE
from distmb.nn.kernels import cpu_aggregate as fused_aggregate
from distmb.nn.kernels import cpu_update as fused_update
from distmb.nn.kernels.dispatch import set_kernels
from distmb.nn.sage import fusable_pair
from distmb.pipeline.rows import IndexedRows
from distmb.pipeline.sample import Block


@pytest.fixture(autouse=True)
def fused() -> Iterator[None]:
    set_kernels("fused")
    yield
    set_kernels("fused")


# ----------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("kind", ["mean", "sum"])
@pytest.mark.parametrize("with_addend, with_bits", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("n_next, n", [(70, 300), (400, 1200)], ids=str)
def test_update_backward_aggregated_equals_two_calls(
    threads: int, kind: str, with_addend: bool, with_bits: bool, n_next: int, n: int
) -> None:
    """Against aggregate_backward then update_backward, bit for bit (including input
    gradients, and a next block with more sources than this UPDATE's rows: halo leaves).
    1200 rows: several row blocks per work chunk, the next one prefetched while one computes,
    its addend rows ending within the block."""
    gen = torch.Generator().manual_seed(7)
    nxt = make_block(n_next, n + 30, 9, 1)
    k, c = 40, 21
    grad_dst = torch.randn(n_next, k, generator=gen)
    addend = torch.randn(n_next, k, generator=gen) if with_addend else None
    xs = [torch.randn(n, c, generator=gen), torch.randn(n, c + 5, generator=gen)]
    ws = [torch.randn(k, c, generator=gen), torch.randn(k, c + 5, generator=gen)]
    bits = torch.randint(0, 256, (n, 5), dtype=torch.uint8, generator=gen) if with_bits else None
    grad_out = fused_aggregate.aggregate_backward(nxt, kind, grad_dst, addend)[:n]
    want = fused_update.update_backward(
        grad_out, bits, 2.0, xs, ws, [True, False], [True, True], True, False
    )
    got = fused_update.update_backward_aggregated(
        nxt, kind, grad_dst, addend, bits, 2.0, xs, ws, [True, False], [True, True], True
    )
    assert torch.equal(got[0], want[1])
    assert torch.equal(got[1][0], want[2][0]) and got[1][1] is None
    for g, w in zip(got[2], want[3], strict=True):
        assert torch.equal(g, w)


def test_update_backward_aggregated_refusals() -> None:
    nxt = make_block(5, 12, 3, 2)
    grad_dst, w, x = torch.ones(5, 4), torch.ones(4, 3), torch.ones(12, 3)
    args = ([x], [w], [False], [True], False)
    with pytest.raises(ValueError, match="gcn aggregator is not supported"):
        fused_update.update_backward_aggregated(nxt, "gcn", grad_dst, None, None, 1.0, *args)
    with pytest.raises(ValueError, match="unknown aggregator 'max'"):
        fused_update.update_backward_aggregated(nxt, "max", grad_dst, None, None, 1.0, *args)
    with pytest.raises(ValueError, match=r"n = 13 must be in \[0, 12\]"):
        fused_update.update_backward_aggregated(
            nxt, "mean", grad_dst, None, None, 1.0, [torch.ones(13, 3)], [w], [False], [True],
            False,
        )  # fmt: skip
    t = fused_aggregate.block_transpose(nxt)
    bad_dst = t.dst.clone()
    bad_dst[0] = 5
    with pytest.raises(ValueError, match=r"t_dst\[0\] = 5 is outside the next block's 5"):
        _C.update_backward_aggregated(
            nxt.indptr.numpy(), t.indptr.numpy(), bad_dst.numpy(), "mean", grad_dst.numpy(),
            None, None, 1.0, 12, [x.numpy()], [w.numpy()], [None], [np.empty((4, 3), np.float32)],
            None,
        )  # fmt: skip
    with pytest.raises(ValueError, match="grad_dst must be a C-contiguous float32 array"):
        _C.update_backward_aggregated(
            nxt.indptr.numpy(), t.indptr.numpy(), t.dst.numpy(), "mean",
            grad_dst.double().numpy(), None, None, 1.0, 12, [x.numpy()], [w.numpy()], [None],
            [None], None,
        )  # fmt: skip


# ----------------------------------------------------------------------------- the model


def run_model(
    model: GraphSAGE, blocks: list[Block], x: Tensor | IndexedRows, pair: bool, **kw
) -> tuple[Tensor, list[Tensor], int]:
    """Logits, parameter gradients and how many pairs ran, with pairs allowed or not."""
    fused = model.fuses_pair
    pairs = []

    def choose(l: int, x_src: Tensor | IndexedRows) -> bool:
        pairs.append(pair and fused(l, x_src))
        return pairs[-1]

    model.fuses_pair = choose  # type: ignore[method-assign]
    try:
        torch.manual_seed(3)  # the same dropout seeds
        out = model(blocks, x, **kw)
        params = [p for p in model.parameters() if p.requires_grad]
        weights = torch.linspace(-1, 1, out.numel()).view_as(out)  # every logit its own gradient
        grads = torch.autograd.grad((out * weights).sum(), params)
    finally:
        del model.fuses_pair
    return out, list(grads), sum(pairs)


def model_and_blocks(
    in_dim: int, hidden: int, layers: int, aggr: str = "mean", halo: int = 0, classes: int = 5
) -> tuple[GraphSAGE, list[Block], Tensor]:
    torch.manual_seed(0)
    model = GraphSAGE(in_dim, hidden, classes, num_layers=layers, dropout=0.5, aggr=aggr)
    sizes = [300, 120, 40, 12][: layers + 1]
    blocks = []
    for l in range(layers):
        n_halo = halo if l > 0 else 0
        blocks.append(make_block(sizes[l + 1], sizes[l] + n_halo, 8, 10 + l, n_halo))
    x = torch.randn(sizes[0], in_dim, generator=torch.Generator().manual_seed(4))
    return model, blocks, x


@pytest.mark.parametrize(
    "layers, in_dim, hidden, classes",
    [(3, 12, 24, 5), (2, 6, 10, 16)],  # 2: the pair is all
)
@pytest.mark.parametrize("aggr", ["mean", "sum"])
def test_pair_equals_layers_one_by_one(
    threads: int, layers: int, in_dim: int, hidden: int, classes: int, aggr: str
) -> None:
    model, blocks, x = model_and_blocks(in_dim, hidden, layers, aggr, classes=classes)
    want, want_g, none = run_model(model, blocks, x, pair=False)
    got, got_g, pairs = run_model(model, blocks, x, pair=True)
    assert (none, pairs) == (0, 1)
    assert torch.equal(got, want)
    for g, w in zip(got_g, want_g, strict=True):
        assert torch.equal(g, w)


def test_pair_with_rows_in_place_and_halo_rows() -> None:
    """The hook between the layers appends halo rows (as a halo scheme does); the first
    layer reads its rows in place."""
    model, blocks, x = model_and_blocks(12, 24, 3, halo=9)
    halo = torch.randn(9, 24, generator=torch.Generator().manual_seed(5))
    table = torch.cat([torch.randn(50, 12), x])
    rows = IndexedRows(table, torch.arange(50, 50 + x.shape[0]))

    def layer_input(l: int, block: Block, h: Tensor) -> Tensor:
        return torch.cat([h, halo[: block.n_halo]]) if block.n_halo else h

    want, want_g, _ = run_model(model, blocks, x, pair=False, layer_input=layer_input)
    got, got_g, pairs = run_model(model, blocks, rows, pair=True, layer_input=layer_input)
    assert pairs == 1 and torch.equal(got, want)
    for g, w in zip(got_g, want_g, strict=True):
        assert torch.equal(g, w)


def test_pair_with_frozen_parameters() -> None:
    model, blocks, x = model_and_blocks(12, 24, 3)
    model.layers[0].bias.requires_grad_(False)
    model.layers[1].fc_self.weight.requires_grad_(False)
    want, want_g, _ = run_model(model, blocks, x, pair=False)
    got, got_g, pairs = run_model(model, blocks, x, pair=True)
    assert pairs == 1 and torch.equal(got, want)
    for g, w in zip(got_g, want_g, strict=True):
        assert torch.equal(g, w)


def test_when_pairs_apply() -> None:
    model, _, x = model_and_blocks(12, 24, 3)
    first, second = model.layers[0], model.layers[1]
    assert fusable_pair(first, second, x)
    assert not fusable_pair(first, second, x.clone().requires_grad_())  # needs an input grad
    with torch.no_grad():
        assert not fusable_pair(first, second, x)
    model.eval()
    assert not fusable_pair(first, second, x)
    model.train()
    set_kernels("torch")
    assert not fusable_pair(first, second, x)
    set_kernels("fused")
    assert not fusable_pair(first, second, x.double())
    projecting, _, xp = model_and_blocks(40, 24, 3)  # layer 0 projects first (40 -> 24)
    assert not fusable_pair(projecting.layers[0], projecting.layers[1], xp)
    gcn, _, xg = model_and_blocks(12, 24, 3, aggr="gcn")
    assert not fusable_pair(gcn.layers[0], gcn.layers[1], xg)
    two, _, x2 = model_and_blocks(12, 24, 2)  # the last layer (24 -> 5) projects first
    assert not fusable_pair(two.layers[0], two.layers[1], x2)
    seen = []
    handle = second.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    assert not fusable_pair(first, second, x)  # hooks run: the layers one by one
    handle.remove()
    assert fusable_pair(first, second, x)


def test_layer_hooks_still_run() -> None:
    model, blocks, x = model_and_blocks(12, 24, 3)
    seen = []
    model.layers[1].register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape)))
    model(blocks, x).sum().backward()
    assert seen == [(blocks[1].n_dst, 24)]
