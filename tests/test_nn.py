"""distmb.nn against an independent dense PyTorch reference.

Blocks are built by hand/randomly (no sampler). The reference uses a dense 0/1 (or count)
adjacency A[n_dst, n_src] built edge by edge from the CSR, and the layer equations written
densely; values and autograd gradients (inputs and every parameter) are compared in float64.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from distmb.nn import (
    AGGREGATORS,
    GAT,
    MODELS,
    GATConv,
    GraphSAGE,
    SAGEConv,
    add_self_loops,
    aggregate,
    build_model,
    edge_softmax,
    weighted_aggregate,
)
from distmb.pipeline.sample import Block

DTYPE = torch.float64
#: Tolerances of float64 comparisons against the dense reference.
ATOL, RTOL = 1e-10, 1e-8
#: Fraction of destinations forced to have no edges in random blocks.
ZERO_DEG_FRAC = 0.25


# --------------------------------------------------------------------------- blocks


def make_block(
    n_dst: int,
    n_src: int,
    n_halo: int = 0,
    max_deg: int = 4,
    seed: int = 0,
    zero_deg_frac: float = ZERO_DEG_FRAC,
) -> Block:
    """A random block: distinct sources per destination (sampling without replacement),
    repeated sources across destinations, some destinations without edges."""
    assert n_dst <= n_src - n_halo
    gen = torch.Generator().manual_seed(seed)
    indptr, indices = [0], []
    for _ in range(n_dst):
        if torch.rand(1, generator=gen).item() < zero_deg_frac:
            deg = 0
        else:
            deg = int(torch.randint(0, min(max_deg, n_src) + 1, (1,), generator=gen))
        indices += torch.randperm(n_src, generator=gen)[:deg].tolist()
        indptr.append(len(indices))
    src_ids = torch.randperm(10 * n_src + 10, generator=gen)[:n_src]
    return Block(
        n_dst,
        n_src,
        n_halo,
        torch.tensor(indptr, dtype=torch.int64),
        torch.tensor(indices, dtype=torch.int64),
        src_ids,
    )


def block_from_lists(n_src: int, neighbours: list[list[int]], n_halo: int = 0) -> Block:
    indptr = [0]
    for nb in neighbours:
        indptr.append(indptr[-1] + len(nb))
    flat = [u for nb in neighbours for u in nb]
    return Block(
        len(neighbours),
        n_src,
        n_halo,
        torch.tensor(indptr, dtype=torch.int64),
        torch.tensor(flat, dtype=torch.int64),
        torch.arange(n_src, dtype=torch.int64),
    )


def dense_adj(block: Block) -> Tensor:
    """A[n_dst, n_src]: number of edges u -> v, built edge by edge from the CSR."""
    adj = torch.zeros(block.n_dst, block.n_src, dtype=DTYPE)
    ptr, idx = block.indptr.tolist(), block.indices.tolist()
    for v in range(block.n_dst):
        for e in range(ptr[v], ptr[v + 1]):
            adj[v, idx[e]] += 1
    return adj


def edge_list(block: Block) -> list[tuple[int, int]]:
    """[(dst, src)] in CSR order."""
    ptr, idx = block.indptr.tolist(), block.indices.tolist()
    return [(v, idx[e]) for v in range(block.n_dst) for e in range(ptr[v], ptr[v + 1])]


# Awkward and ordinary shapes: (n_dst, n_src, n_halo, max_deg).
SHAPES = [
    (1, 1, 0, 1),  # one node, maybe a self edge
    (1, 5, 2, 4),  # n_dst = 1 with halos
    (6, 15, 4, 5),
    (20, 40, 10, 8),
]


def zero_edge_block(n_dst: int = 3, n_src: int = 5) -> Block:
    return block_from_lists(n_src, [[] for _ in range(n_dst)])


def rand(*shape: int, seed: int = 0, requires_grad: bool = True) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=DTYPE).requires_grad_(requires_grad)


def grads_of(out: Tensor, inputs: list[Tensor], seed: int = 123) -> list[Tensor]:
    """Gradients of <out, g> for a fixed random g (zeros for unused inputs)."""
    g = rand(*out.shape, seed=seed, requires_grad=False)
    got = torch.autograd.grad(out, inputs, grad_outputs=g, allow_unused=True)
    return [torch.zeros_like(t) if d is None else d for t, d in zip(inputs, got, strict=True)]


def assert_close(a: Tensor, b: Tensor) -> None:
    torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def check_against(
    impl: Callable[[], Tensor], ref: Callable[[], Tensor], inputs: list[Tensor]
) -> None:
    """Same values and the same gradients w.r.t. ``inputs``."""
    out, expected = impl(), ref()
    assert out.shape == expected.shape
    assert_close(out, expected)
    for got, want in zip(grads_of(out, inputs), grads_of(expected, inputs), strict=True):
        assert_close(got, want)


# --------------------------------------------------------------------------- references


def ref_aggregate(block: Block, x: Tensor, kind: str) -> Tensor:
    adj = dense_adj(block)
    flat = x.reshape(block.n_src, -1)
    total = adj @ flat
    deg = adj.sum(1, keepdim=True)
    if kind == "sum":
        out = total
    elif kind == "mean":
        out = torch.where(deg > 0, total / deg.clamp(min=1), torch.zeros_like(total))
    else:  # gcn
        out = (total + flat[: block.n_dst]) / (deg + 1)
    return out.reshape(block.n_dst, *x.shape[1:])


def ref_edge_softmax(block: Block, scores: Tensor) -> Tensor:
    """Dense masked softmax, read back per edge (requires distinct edges per destination)."""
    edges = edge_list(block)
    if not edges:
        return scores * 0
    v, u = (torch.tensor(c) for c in zip(*edges, strict=True))
    dense = torch.full((block.n_dst, block.n_src, scores.shape[1]), -1e30, dtype=DTYPE)
    dense = dense.index_put((v, u), scores)
    mask = torch.zeros(block.n_dst, block.n_src, 1, dtype=DTYPE)
    mask[v, u] = 1.0
    return (torch.softmax(dense, dim=1) * mask)[v, u]


def ref_weighted(block: Block, weights: Tensor, x: Tensor) -> Tensor:
    """out[v, h] = sum_u W[v, u, h] x[u, h] with a dense weight tensor."""
    dense = torch.zeros(block.n_dst, block.n_src, weights.shape[1], dtype=DTYPE)
    edges = edge_list(block)
    if edges:
        v, u = (torch.tensor(c) for c in zip(*edges, strict=True))
        dense = dense.index_put((v, u), weights, accumulate=True)
    return torch.einsum("vuh,uhd->vhd", dense, x)


def ref_sage(conv: SAGEConv, block: Block, x: Tensor) -> Tensor:
    """Equation 1 densely (for "gcn": DGL's, no self weight)."""
    agg = ref_aggregate(block, x, conv.aggr)
    h = agg @ conv.fc_neigh.weight.T + conv.bias
    if conv.fc_self is not None:
        h = h + x[: block.n_dst] @ conv.fc_self.weight.T
    return torch.relu(h) if conv.activation else h


def ref_gat(conv: GATConv, block: Block, x: Tensor) -> Tensor:
    """Equation 2 densely: masked softmax over A (plus the identity with self loops)."""
    heads, d = conv.heads, conv.out_dim
    z = x @ conv.fc.weight.T + conv.bias
    if conv.activation:
        z = torch.relu(z)
    z = z.reshape(-1, heads, d)
    adj = dense_adj(block)
    if conv.self_loops:
        adj[:, : block.n_dst] += torch.eye(block.n_dst, dtype=DTYPE)
    el = (z * conv.attn_l).sum(-1)  # [n_src, H]
    er = (z[: block.n_dst] * conv.attn_r).sum(-1)  # [n_dst, H]
    logits = F.leaky_relu(er[:, None, :] + el[None, :, :], conv.negative_slope)
    # Softmax over the edges, counting a repeated edge (an existing self edge plus the added
    # self loop) once per copy: alpha_vu = A_vu exp(s_vu) / sum_w A_vw exp(s_vw).
    counts = adj.unsqueeze(-1)
    masked = logits.masked_fill(counts == 0, -1e30)
    weights = counts * torch.exp(masked - masked.amax(1, keepdim=True).detach())
    denom = weights.sum(1, keepdim=True)
    alpha = weights / torch.where(denom > 0, denom, torch.ones_like(denom))
    out = torch.einsum("vuh,uhd->vhd", alpha, z)
    return out.reshape(block.n_dst, heads * d) if conv.concat else out.mean(1)


# --------------------------------------------------------------------------- aggregate


@pytest.mark.parametrize("kind", AGGREGATORS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("feat", [(1,), (7,), (3, 2)])
def test_aggregate_matches_dense(kind: str, shape: tuple[int, ...], feat: tuple[int, ...]) -> None:
    n_dst, n_src, n_halo, max_deg = shape
    block = make_block(n_dst, n_src, n_halo, max_deg, seed=n_src)
    x = rand(n_src, *feat, seed=1)
    check_against(lambda: aggregate(block, x, kind), lambda: ref_aggregate(block, x, kind), [x])


@pytest.mark.parametrize("kind", AGGREGATORS)
def test_aggregate_zero_edges_and_duplicates(kind: str) -> None:
    block = zero_edge_block()
    x = rand(5, 4)
    out = aggregate(block, x, kind)
    expected = x[:3] if kind == "gcn" else torch.zeros(3, 4, dtype=DTYPE)
    assert_close(out, expected)
    # Duplicate edges count with multiplicity (the dense reference uses counts).
    block = block_from_lists(4, [[1, 1, 3], [], [0, 2, 2, 2]])
    x = rand(4, 2)
    check_against(lambda: aggregate(block, x, kind), lambda: ref_aggregate(block, x, kind), [x])


def test_aggregate_by_hand() -> None:
    block = block_from_lists(4, [[1, 3], [], [0]])
    x = torch.tensor([[1.0], [2.0], [4.0], [8.0]], dtype=DTYPE)
    assert aggregate(block, x, "mean").flatten().tolist() == [5.0, 0.0, 1.0]
    assert aggregate(block, x, "sum").flatten().tolist() == [10.0, 0.0, 1.0]
    # gcn: (neighbours + self) / (deg + 1)
    assert aggregate(block, x, "gcn").flatten().tolist() == [11.0 / 3, 2.0, 5.0 / 2]


def test_aggregate_errors() -> None:
    assert AGGREGATORS == ("mean", "sum", "gcn")
    block = make_block(3, 6)
    with pytest.raises(ValueError, match="unknown aggregator"):
        aggregate(block, rand(6, 2), "max")
    with pytest.raises(ValueError, match="n_src=6"):
        aggregate(block, rand(5, 2), "mean")
    with pytest.raises(ValueError, match="unknown aggregator"):
        SAGEConv(2, 2, aggr="lstm")


def test_aggregate_float32() -> None:
    block = make_block(20, 40, 10, 8)
    x = torch.randn(40, 5)
    out = aggregate(block, x, "mean")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_aggregate(block, x.double(), "mean"))


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("heads", [1, 3])
def test_edge_softmax_matches_dense(shape: tuple[int, ...], heads: int) -> None:
    n_dst, n_src, n_halo, max_deg = shape
    block = make_block(n_dst, n_src, n_halo, max_deg, seed=heads + n_src)
    scores = rand(block.num_edges, heads, seed=2)
    check_against(
        lambda: edge_softmax(block, scores), lambda: ref_edge_softmax(block, scores), [scores]
    )


def test_edge_softmax_stable_and_normalised() -> None:
    block = make_block(20, 40, 10, 8, zero_deg_frac=0.0)
    scores = rand(block.num_edges, 2, requires_grad=False) * 1e4 + 5e4
    alpha = edge_softmax(block, scores)
    assert torch.isfinite(alpha).all()
    sums = torch.zeros(20, 2, dtype=DTYPE).index_add_(0, block.dst_of_edges(), alpha)
    has_edges = (block.indptr[1:] > block.indptr[:-1]).unsqueeze(1).expand(-1, 2)
    assert_close(sums[has_edges], torch.ones_like(sums[has_edges]))
    empty = edge_softmax(zero_edge_block(), rand(0, 2))
    assert empty.shape == (0, 2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("heads,d", [(1, 1), (3, 4)])
def test_weighted_aggregate_matches_dense(shape: tuple[int, ...], heads: int, d: int) -> None:
    n_dst, n_src, n_halo, max_deg = shape
    block = make_block(n_dst, n_src, n_halo, max_deg, seed=7 + n_src)
    w = rand(block.num_edges, heads, seed=3)
    x = rand(n_src, heads, d, seed=4)
    check_against(
        lambda: weighted_aggregate(block, w, x), lambda: ref_weighted(block, w, x), [w, x]
    )
    with pytest.raises(ValueError, match="expected weights"):
        weighted_aggregate(block, rand(block.num_edges, heads + 1), x)


def test_add_self_loops() -> None:
    block = make_block(6, 15, 4, 5)
    looped = add_self_loops(block)
    eye = torch.zeros(6, 15, dtype=DTYPE)
    eye[:, :6] = torch.eye(6, dtype=DTYPE)
    assert_close(dense_adj(looped), dense_adj(block) + eye)
    assert looped.num_edges == block.num_edges + 6
    assert (looped.n_dst, looped.n_src, looped.n_halo) == (6, 15, 4)


def _gradcheck_blocks() -> list[Block]:
    return [make_block(4, 7, 2, 3, seed=11), make_block(1, 2, 0, 2), zero_edge_block(2, 3)]


@pytest.mark.parametrize("kind", AGGREGATORS)
def test_gradcheck_aggregate(kind: str) -> None:
    for block in _gradcheck_blocks():
        x = rand(block.n_src, 3)
        assert torch.autograd.gradcheck(lambda t, b=block: aggregate(b, t, kind), (x,))


def test_gradcheck_edge_softmax_and_weighted() -> None:
    for block in _gradcheck_blocks():
        scores = rand(block.num_edges, 2, seed=5)
        w = rand(block.num_edges, 2, seed=6)
        x = rand(block.n_src, 2, 3, seed=7)
        assert torch.autograd.gradcheck(lambda s, b=block: edge_softmax(b, s), (scores,))
        assert torch.autograd.gradcheck(lambda a, t, b=block: weighted_aggregate(b, a, t), (w, x))


# --------------------------------------------------------------------------- layers


def params(module: torch.nn.Module) -> list[Tensor]:
    return list(module.parameters())


@pytest.mark.parametrize("aggr", AGGREGATORS)
@pytest.mark.parametrize("activation", [True, False])
@pytest.mark.parametrize("dims", [(5, 3), (3, 6), (1, 1)])
def test_sage_conv_matches_dense(aggr: str, activation: bool, dims: tuple[int, int]) -> None:
    torch.manual_seed(0)
    conv = SAGEConv(*dims, aggr=aggr, activation=activation).to(DTYPE)
    with torch.no_grad():
        conv.bias.normal_()  # zero at init; make it matter
    for shape in SHAPES:
        block = make_block(*shape, seed=sum(shape))
        x = rand(block.n_src, dims[0])
        check_against(
            lambda b=block, t=x: conv(b, t),
            lambda b=block, t=x: ref_sage(conv, b, t),
            [x, *params(conv)],
        )
    assert (conv.fc_self is None) == (aggr == "gcn")


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("concat,activation", [(True, True), (False, False), (False, True)])
@pytest.mark.parametrize("self_loops", [False, True])
def test_gat_conv_matches_dense(
    heads: int, concat: bool, activation: bool, self_loops: bool
) -> None:
    torch.manual_seed(1)
    conv = GATConv(4, 3, heads, activation=activation, concat=concat, self_loops=self_loops)
    conv = conv.to(DTYPE)
    with torch.no_grad():
        conv.bias.normal_()
    for shape in [*SHAPES, (3, 5, 0, 0)]:
        block = make_block(*shape, seed=sum(shape) + 1)
        x = rand(block.n_src, 4)
        out = conv(block, x)
        assert out.shape == (block.n_dst, heads * 3 if concat else 3)
        check_against(
            lambda b=block, t=x: conv(b, t),
            lambda b=block, t=x: ref_gat(conv, b, t),
            [x, *params(conv)],
        )


def test_gat_zero_in_degree_is_zero() -> None:
    conv = GATConv(4, 2, 2).to(DTYPE)
    block = block_from_lists(5, [[], [0, 4], []])
    out = conv(block, rand(5, 4))
    assert torch.all(out[[0, 2]] == 0)
    looped = GATConv(4, 2, 2, self_loops=True).to(DTYPE)
    assert looped(zero_edge_block(), rand(5, 4)).abs().sum() > 0


def test_sage_zero_edges_uses_self_and_bias() -> None:
    conv = SAGEConv(4, 2, activation=False).to(DTYPE)
    x = rand(5, 4)
    out = conv(zero_edge_block(), x)
    assert_close(out, x[:3] @ conv.fc_self.weight.T + conv.bias)


def test_gradcheck_layers() -> None:
    torch.manual_seed(2)
    block = make_block(4, 7, 2, 3, seed=3)
    x = rand(7, 3)
    for conv in [
        SAGEConv(3, 2, aggr="mean"),
        SAGEConv(3, 4, aggr="gcn", activation=False),
        GATConv(3, 2, heads=2),
        GATConv(3, 2, heads=1, concat=False, activation=False),
    ]:
        conv = conv.to(DTYPE)
        assert torch.autograd.gradcheck(lambda t, *p, c=conv: c(block, t), (x, *params(conv)))


# --------------------------------------------------------------------------- models


def make_blocks(
    sizes: list[int], halos: list[int], in_halo0: int = 0, seed: int = 0
) -> list[Block]:
    """Consistent blocks: block l has n_dst = sizes[l + 1], n_src = sizes[l] + halos[l]
    (block 0: sizes[0] + in_halo0); block l+1's computed sources are block l's dsts."""
    blocks = []
    for l in range(len(sizes) - 1):
        halo = in_halo0 if l == 0 else halos[l]
        blocks.append(make_block(sizes[l + 1], sizes[l] + halo, halo, 5, seed=seed + l))
    return blocks


IN_DIM, HIDDEN, CLASSES, HEADS = 6, 5, 3, 2


def models() -> list[tuple[str, torch.nn.Module, list[int]]]:
    torch.manual_seed(3)
    return [
        ("sage", build_model("sage", IN_DIM, HIDDEN, CLASSES, 3, HEADS, 0.5), [6, 5, 5]),
        ("gat", build_model("gat", IN_DIM, HIDDEN, CLASSES, 3, HEADS, 0.5), [6, 10, 10]),
    ]


@pytest.mark.parametrize("index", [0, 1])
def test_model_interface(index: int) -> None:
    name, model, dims = models()[index]
    assert model.num_layers == 3 and len(model.layers) == 3
    assert model.layer_dims() == dims
    model.eval()
    # Without halos (beyond block 0, whose x has every source).
    blocks = make_blocks([30, 14, 6, 2], [0, 0, 0], in_halo0=4)
    x = torch.randn(blocks[0].n_src, IN_DIM)
    out = model(blocks, x)
    assert out.shape == (2, CLASSES)
    # Same as chaining forward_layer by hand.
    h = x
    for l, block in enumerate(blocks):
        h = model.forward_layer(l, block, h)
    torch.testing.assert_close(out, h)

    # With halos: halo_inputs is called for layers 1 and 2 with their blocks.
    blocks = make_blocks([30, 14, 6, 2], [0, 3, 2], in_halo0=4, seed=9)
    calls: list[tuple[int, int]] = []

    def halo_inputs(l: int, block: Block) -> Tensor:
        calls.append((l, block.n_halo))
        assert block is blocks[l]
        return torch.randn(block.n_halo, model.layer_dims()[l])

    out = model(blocks, torch.randn(blocks[0].n_src, IN_DIM), halo_inputs)
    assert out.shape == (2, CLASSES)
    assert calls == [(1, 3), (2, 2)]
    # Manual chain with the halo rows concatenated.
    x = torch.randn(blocks[0].n_src, IN_DIM)
    halos = {l: torch.randn(blocks[l].n_halo, dims[l]) for l in (1, 2)}
    h = model.forward_layer(0, blocks[0], x)
    for l in (1, 2):
        h = model.forward_layer(l, blocks[l], torch.cat([h, halos[l]]))
    torch.testing.assert_close(model(blocks, x, lambda l, b: halos[l]), h)

    with pytest.raises(ValueError, match="halo"):
        model(blocks, x)
    with pytest.raises(ValueError, match="expected"):
        model(blocks, x, lambda l, b: torch.zeros(b.n_halo + 1, dims[l]))
    with pytest.raises(ValueError, match="expected"):
        model(blocks, x, lambda l, b: torch.zeros(b.n_halo, dims[l] + 1))
    with pytest.raises(ValueError, match="rows"):
        model(blocks, x[:-1], lambda l, b: halos[l])
    with pytest.raises(ValueError, match="blocks"):
        model(blocks[:2], x)
    bad = make_blocks([30, 14, 6, 2], [0, 0, 0], in_halo0=4)
    bad[1] = make_block(6, 13, 0, 3)  # 13 computed sources, layer 0 gives 14 rows
    with pytest.raises(ValueError, match="computed sources"):
        model(bad, torch.randn(bad[0].n_src, IN_DIM))


@pytest.mark.parametrize("index", [0, 1])
def test_model_dropout_train_vs_eval(index: int) -> None:
    _, model, _ = models()[index]
    blocks = make_blocks([40, 20, 10, 5], [0, 0, 0])
    x = torch.randn(40, IN_DIM)
    model.eval()
    assert torch.equal(model(blocks, x), model(blocks, x))
    model.train()
    torch.manual_seed(0)
    first = model(blocks, x)
    assert not torch.equal(first, model(blocks, x))
    assert first.requires_grad


def test_model_widths_and_factory() -> None:
    gat = GAT(IN_DIM, HIDDEN, CLASSES, num_layers=2, heads=4)
    assert gat.layer_dims() == [IN_DIM, HIDDEN * 4]
    assert gat.layers[0].concat and not gat.layers[1].concat
    assert not gat.layers[1].activation
    sage = GraphSAGE(IN_DIM, HIDDEN, CLASSES, num_layers=1)
    assert sage.layer_dims() == [IN_DIM]
    block = make_block(4, 9, 2, 3)
    assert sage([block], torch.randn(9, IN_DIM)).shape == (4, CLASSES)
    assert MODELS == ("sage", "gat", "gcn", "gin")
    assert isinstance(build_model("sage", 2, 2, 2, 2, 1, 0.0), GraphSAGE)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("gcnii", 2, 2, 2, 2, 1, 0.0)
    with pytest.raises(ValueError, match="num_layers"):
        GraphSAGE(2, 2, 2, num_layers=0)


@pytest.mark.parametrize("name", ["sage", "gat"])
@pytest.mark.parametrize("aggr", ["mean", "gcn"])
@pytest.mark.parametrize("layers", [1, 3])
def test_parameter_count_matches_the_built_model(name, aggr, layers):
    from distmb.nn.models import parameter_count

    model = build_model(name, 13, 8, 5, layers, heads=3, aggr=aggr)
    expected = sum(p.numel() for p in model.parameters())
    assert parameter_count(name, 13, 8, 5, layers, heads=3, aggr=aggr) == expected


def test_transposed_indptr_and_edge_destinations_against_a_brute_force():
    """The transposed CSR (sort + binary search, no bincount) and the CSR expanded to
    per-edge destinations, on random blocks with repeated, missing and last sources."""
    import numpy as np

    from distmb.pipeline.sample.blocks import transposed_indptr

    rng = np.random.default_rng(0)
    for n_dst, n_src, n_edges in [(1, 1, 0), (3, 5, 7), (10, 40, 200), (5, 9, 1)]:
        counts = rng.multinomial(n_edges, np.ones(n_dst) / n_dst)
        indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        indices = torch.from_numpy(rng.integers(0, n_src, n_edges).astype(np.int64))
        block = Block(n_dst=n_dst, n_src=n_src, n_halo=0, indptr=indptr, indices=indices,
                      src_ids=torch.arange(n_src))  # fmt: skip
        dst = block.dst_of_edges()
        assert dst.tolist() == [v for v in range(n_dst) for _ in range(counts[v])]
        t_indptr, order = transposed_indptr(indices, n_src)
        for u in range(n_src):
            edges = order[t_indptr[u] : t_indptr[u + 1]].tolist()
            assert edges == [e for e in range(n_edges) if indices[e] == u]  # CSR order
        assert t_indptr[-1] == n_edges
