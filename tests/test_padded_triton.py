"""distmb.pipeline.sample.padded_triton: the padded batch's refill in Triton kernels fills
every buffer exactly as the torch ops do (the reference: :class:`PaddedBatch` with
``backend="torch"``, itself checked against the unpadded model by
``tests/test_padded_blocks.py``). Under the interpreter on CPU tensors; on a GPU
(``pytest -m cuda``) with programs running at once, before a replayed graph."""

from __future__ import annotations

import pytest
import torch
from conftest import require_triton
from test_padded_blocks import random_blocks

from distmb.pipeline.sample import Block
from distmb.pipeline.sample.padded import PaddedBatch, padded_layout
from distmb.pipeline.sample.padded_triton import MAX_BLOCK_F

N_SOLID = 10_000


def buffers(padded: PaddedBatch) -> dict[str, torch.Tensor]:
    """Every buffer of ``padded``, by name."""
    named = {
        "positions": padded.positions, "x": padded.x, "labels": padded.labels,
        "src_ids": padded.src_ids,
    }  # fmt: skip
    for layer in range(padded.layout.num_layers):
        named[f"indptr[{layer}]"] = padded.indptr[layer]
        named[f"indices[{layer}]"] = padded.indices[layer]
    return named


def assert_same_buffers(got: PaddedBatch, expected: PaddedBatch, where: str) -> None:
    want = buffers(expected)
    for name, tensor in buffers(got).items():
        assert torch.equal(tensor, want[name]), f"{where}: {name}\n{tensor}\n{want[name]}"


def edgeless_blocks(n_seeds: int, num_layers: int) -> list[Block]:
    """Blocks of no edge and no new source (every layer's real part is the seeds)."""
    indptr, indices = torch.zeros(n_seeds + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    return [
        Block(n_seeds, n_seeds, 0, indptr, indices, torch.arange(n_seeds))
        for _ in range(num_layers)
    ]


def refill_pair(n_seeds: int, fanouts: tuple[int, ...], feat: int) -> list[PaddedBatch]:
    """The Triton refill's buffers and the torch ops' of one layout."""
    layout = padded_layout(n_seeds, fanouts, N_SOLID)
    cpu = torch.device("cpu")
    return [PaddedBatch(layout, feat, torch.float32, cpu, backend=b) for b in ("triton", "torch")]


@pytest.mark.parametrize(
    ("n_seeds", "fanouts", "feat", "sinks"),
    [
        (7, (3, 2), 5, (2, 1)),  # the top layer has one sink, the input layer two
        (20, (2, 3, 2), 3, (15, 4, 2)),  # every layer several
        (3, (2, 2), MAX_BLOCK_F + 3, (1, 1)),  # one sink each; two column tiles of rows
    ],
)
def test_the_triton_refill_fills_what_the_torch_ops_fill(n_seeds, fanouts, feat, sinks):
    """Several batches of one size refilled in turn (at the bounds, random, without any
    edge): after each, every buffer equals the torch ops' bit for bit, the stale rows and
    positions of a bigger batch included."""
    require_triton("cpu")
    triton_fill, torch_fill = refill_pair(n_seeds, fanouts, feat)
    assert triton_fill.backend == "triton" and torch_fill.backend == "torch"
    assert triton_fill.layout.sinks == sinks
    batches = [
        random_blocks(n_seeds, fanouts, N_SOLID, seed=0, full=True),
        random_blocks(n_seeds, fanouts, N_SOLID, seed=1),
        edgeless_blocks(n_seeds, len(fanouts)),
        random_blocks(n_seeds, fanouts, N_SOLID, seed=2),
    ]
    gen = torch.Generator().manual_seed(0)
    for number, blocks in enumerate(batches):
        # Input rows read through strides (a column slice), labels through a step.
        wide = torch.randn(blocks[0].n_src, 2 * feat, generator=gen)
        x = wide[:, ::2]
        labels = torch.randint(0, 9, (2 * n_seeds,), generator=gen)[::2]
        for padded in (triton_fill, torch_fill):
            padded.fill(blocks, x, labels)
        assert_same_buffers(triton_fill, torch_fill, f"batch {number}")


def test_the_triton_refill_takes_a_block_of_stride_one_only():
    require_triton("cpu")
    triton_fill, _ = refill_pair(4, (2, 2), 3)
    blocks = random_blocks(4, (2, 2), N_SOLID, seed=0, full=True)
    spread = torch.zeros(2 * blocks[0].num_edges, dtype=torch.int64)
    spread[::2] = blocks[0].indices
    b = blocks[0]
    blocks[0] = Block(b.n_dst, b.n_src, 0, b.indptr, spread[::2], b.src_ids)
    x, labels = torch.randn(b.n_src, 3), torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ValueError, match="indices must be a 1-d tensor of stride 1"):
        triton_fill.fill(blocks, x, labels)


def test_the_torch_ops_refill_where_triton_does_not_run(monkeypatch):
    """``"auto"`` takes the torch ops on CPU tensors outside the interpreter, and
    ``"triton"`` is refused there, as an unknown back end is everywhere."""
    layout, cpu = padded_layout(4, (2, 2), N_SOLID), torch.device("cpu")
    with pytest.raises(ValueError, match="refill back end 'cuda'"):
        PaddedBatch(layout, 3, torch.float32, cpu, backend="cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert PaddedBatch(layout, 3, torch.float32, cpu).backend == "torch"
    with pytest.raises(ValueError, match="refill back end 'triton' cannot run on cpu"):
        PaddedBatch(layout, 3, torch.float32, cpu, backend="triton")


# -- on a GPU --------------------------------------------------------------------------------
@pytest.mark.cuda
def test_on_a_gpu_the_triton_refill_feeds_the_next_replay():
    """On a GPU, with about a hundred programs at once: each refill (on the current stream, no
    host synchronisation) fills what the torch ops fill, and a graph captured over the
    buffers, replayed after it on the same stream, reads the new batch."""
    require_triton("cuda")
    cuda = torch.device("cuda")
    n_seeds, fanouts, feat = 600, (10, 15), 40
    layout = padded_layout(n_seeds, fanouts, 1_000_000)
    triton_fill = PaddedBatch(layout, feat, torch.float32, cuda, backend="triton")
    torch_fill = PaddedBatch(layout, feat, torch.float32, cuda, backend="torch")
    assert triton_fill.backend == "triton"

    def batch(seed: int) -> tuple[list[Block], torch.Tensor, torch.Tensor]:
        """Seed 0 at the bounds, the last without an edge, the others random."""
        if seed == 4:
            blocks = edgeless_blocks(n_seeds, len(fanouts))
        else:
            blocks = random_blocks(n_seeds, fanouts, 1_000_000, seed=seed, full=seed == 0)
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(blocks[0].n_src, feat, generator=gen)
        labels = torch.randint(0, 7, (n_seeds,), generator=gen)
        return [b.to(cuda) for b in blocks], x.to(cuda), labels.to(cuda)

    def snapshot() -> list[torch.Tensor]:  # what a captured step reads: every buffer
        return [t.clone() for t in buffers(triton_fill).values()]

    first = batch(0)
    triton_fill.fill(*first)  # compiles the kernels outside any capture
    torch_fill.fill(*first)  # the stale positions and rows of the next batches: batch 0's
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        snapshot()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = snapshot()
    for seed in range(1, 5):
        blocks, x, labels = batch(seed)
        torch.cuda.set_sync_debug_mode("error")
        try:
            triton_fill.fill(blocks, x, labels)
            graph.replay()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch_fill.fill(blocks, x, labels)
        assert_same_buffers(triton_fill, torch_fill, f"batch {seed}")
        for got, want in zip(captured, buffers(torch_fill).values(), strict=True):
            assert torch.equal(got, want), f"batch {seed}: the replay read stale buffers"
