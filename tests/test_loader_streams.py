"""The BatchLoader's device stage on its own CUDA stream (:mod:`distmb.pipeline.streams`).

Everywhere: a prefetched loader yields bitwise the synchronous loader's batches (blocks,
rows, halo rows, labels); on the CPU no stream or event is created. On a GPU
(``cuda``-marked): the same with the device path's stages, the producer's work is launched
on the loader's own stream (made once), the consumer's stream is the default one, and every
CUDA tensor of a yielded batch was marked as used on the consumer's stream.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import random_graph

from distmb.config.train import TrainConfig
from distmb.data.datasets import load_dataset
from distmb.data.local import LocalGraph
from distmb.engine import Trainer
from distmb.pipeline import BatchLoader, MiniBatch
from distmb.pipeline.features import PartFeatures
from distmb.pipeline.sample import Block, NeighborSampler
from distmb.pipeline.streams import DeviceStage, EventClock

GRAPH = "synthetic:nodes=1200,feat_dim=8,train_fraction=0.3,test_fraction=0.5"


def _same_batch(a: MiniBatch, b: MiniBatch) -> None:
    assert (a.epoch, a.index) == (b.epoch, b.index)
    np.testing.assert_array_equal(a.seeds, b.seeds)
    assert torch.equal(a.labels, b.labels)
    assert torch.equal(a.input_rows(), b.input_rows())
    assert (a.x_halo is None) == (b.x_halo is None)
    if a.x_halo is not None:
        assert torch.equal(a.x_halo, b.x_halo)
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.n_dst, x.n_src, x.n_halo) == (y.n_dst, y.n_src, y.n_halo)
        for name in ("indptr", "indices", "src_ids"):
            assert torch.equal(getattr(x, name), getattr(y, name))


def _epoch(loader: BatchLoader, batches: list[np.ndarray], epoch: int) -> list[MiniBatch]:
    return list(loader(loader.plan(epoch, batches)))


# ---- the CPU: host stages with halo rows ------------------------------------------------------


def test_prefetched_host_batches_with_halo_rows_equal_the_synchronous_ones():
    local = LocalGraph.from_graph(random_graph(n=500, m=3500, feat_dim=5, classes=3, seed=2))
    # A part: the last 60 vertices are halo leaves (no adjacency, replicated rows).
    n_solid = local.n_local - 60
    indptr = local.indptr[: n_solid + 1]
    indices = local.indices[: indptr[-1]]
    features = PartFeatures(local.features[:n_solid], local.features[n_solid:])

    def loader(prefetch: int) -> BatchLoader:
        sampler = NeighborSampler(indptr, indices, n_solid, local.n_local, [3, 4], seed=5)
        return BatchLoader(sampler, features, local.labels, prefetch=prefetch, device="cpu")

    seeds = np.random.default_rng(1).permutation(np.arange(n_solid))[:240]
    batches = np.array_split(seeds, 6)
    sync, ahead = loader(0), loader(2)
    for epoch in (0, 1):
        want, got = _epoch(sync, batches, epoch), _epoch(ahead, batches, epoch)
        assert any(b.x_halo is not None and b.x_halo.shape[0] for b in got)
        for a, b in zip(want, got, strict=True):
            _same_batch(a, b)
        assert all(b.sample_span is None and b.gather_span is None for b in got)
    assert ahead.device_stage.stream is None  # no CUDA stream on the CPU


def test_the_cpu_stage_and_clock_create_nothing():
    stage, clock = DeviceStage(torch.device("cpu")), EventClock("cpu")
    stage.begin()
    with stage.producing():
        made = stage.made()
    stage.hand_over(made, [torch.zeros(2)])
    assert (made, stage.stream, stage.device) == (None, None, None)
    assert not clock.enabled and clock.mark() is None and clock.span(None) is None
    assert DeviceStage(None).stream is None


def test_minibatch_lists_every_tensor_it_holds():
    blocks = [
        Block(2, 4, 1, torch.tensor([0, 2, 3]), torch.tensor([1, 2, 3]), torch.arange(4)),
        Block(1, 2, 0, torch.tensor([0, 1]), torch.tensor([1]), torch.arange(2)),
    ]
    batch = MiniBatch(
        epoch=0, index=0, seeds=np.array([0]), blocks=blocks, labels=torch.tensor([1]),
        x=torch.ones(3, 2), x_halo=torch.ones(1, 2), halo_rows=[torch.zeros(1, 2)],
        buffer=torch.empty(8),
    )  # fmt: skip
    # Independently: every tensor reachable from the dataclass fields, but the buffer.
    expected: list[torch.Tensor] = []
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if f.name == "buffer":
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, torch.Tensor):
                expected.append(item)
            elif isinstance(item, Block):
                expected.extend(v for v in vars(item).values() if isinstance(v, torch.Tensor))
    assert sorted(map(id, batch.tensors())) == sorted(map(id, expected))
    assert len(expected) == 2 * 3 + 4


# ---- the device path: CPU tensors, and a GPU ---------------------------------------------------


def _device_loaders(device: str) -> tuple[Trainer, BatchLoader, BatchLoader]:
    config = TrainConfig(
        layers=2, fanout=(4, 6), hidden=16, batch_size=60, epochs=1, progress=False,
        sampler="device" if device == "cpu" else "auto", kernels="torch", threads=1,
        device=device,
    )  # fmt: skip
    trainer = Trainer(LocalGraph.from_graph(load_dataset(GRAPH)), config, log=lambda _: None)
    stages = trainer.loader
    sync, ahead = (
        BatchLoader(stages.sampler, stages.features, stages.labels, prefetch=prefetch,
                    device=trainer.device)
        for prefetch in (0, 2)
    )  # fmt: skip
    return trainer, sync, ahead


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_prefetched_device_path_batches_are_bitwise_the_synchronous_ones(device):
    trainer, sync, ahead = _device_loaders(device)
    assert not ahead.synchronous
    for epoch in (0, 1):
        batches = trainer.epoch_batches(epoch)
        want, got = _epoch(sync, batches, epoch), _epoch(ahead, batches, epoch)
        for a, b in zip(want, got, strict=True):
            _same_batch(a, b)
            assert b.labels.device.type == device and b.blocks[0].device.type == device
        on_cuda = device == "cuda"
        assert all((b.sample_span is not None) == on_cuda for b in got)
        assert all((b.gather_span is not None) == on_cuda for b in got)


@pytest.mark.cuda
def test_the_producer_launches_on_the_loaders_own_stream(monkeypatch):
    trainer, _, ahead = _device_loaders("cuda")
    device = trainer.device
    producer_streams: list[int] = []
    for name in ("sample_batch", "gather_batch"):
        stage = getattr(ahead, name)

        def on_stream(*args, _stage=stage):  # noqa: ANN002, ANN202
            producer_streams.append(torch.cuda.current_stream(device).cuda_stream)
            return _stage(*args)

        monkeypatch.setattr(ahead, name, on_stream)
    marked: list[tuple[int, int]] = []
    record_stream = torch.Tensor.record_stream

    def recording(tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        marked.append((id(tensor), stream.cuda_stream))
        record_stream(tensor, stream)

    monkeypatch.setattr(torch.Tensor, "record_stream", recording)
    default = torch.cuda.default_stream(device).cuda_stream
    side = None
    for epoch in (0, 1):
        batches = trainer.epoch_batches(epoch)
        for batch in ahead(ahead.plan(epoch, batches)):
            consumer = torch.cuda.current_stream(device).cuda_stream
            assert consumer == default
            held = {id(t) for t in batch.tensors() if t.is_cuda}
            assert held and held <= {t for t, s in marked if s == consumer}
            marked.clear()
        stream = ahead.device_stage.stream
        assert stream is not None and stream.device == device
        assert side is None or stream is side  # made once per loader
        side = stream
    assert len(producer_streams) == 2 * sum(len(trainer.epoch_batches(e)) for e in (0, 1))
    assert set(producer_streams) == {side.cuda_stream} and side.cuda_stream != default
    # The stages' events were recorded and resolve to device time after a synchronize.
    torch.cuda.synchronize(device)
    assert batch.sample_span.seconds() >= 0 and batch.gather_span.seconds() >= 0
