"""The device path's data stages for one rank (:mod:`distmb.engine.device` says when it is
taken): the device sampler, the device feature cache (over the out-of-core host cache with
``--features ooc``), and Match-Reorder. They run on a GPU (``--device cuda``) or on CPU
tensors (``--sampler device``).

:func:`open_device_stages` builds them from the rank's :class:`~distmb.data.local.LocalGraph`
and the run's flags, so that the run hands them to its BatchLoader exactly as it does the C++
sampler and the host feature sources.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.engine.build.features import FeatureSources, stored_rows
from distmb.pipeline.features.cached import CachedFeatures
from distmb.pipeline.features.device import DeviceFeatures, build_device_features
from distmb.pipeline.features.memory import ArrayFeatures, PartFeatures
from distmb.pipeline.features.normalize import FeatureNormalization
from distmb.pipeline.features.reorder import MatchReorder
from distmb.pipeline.features.storage import STORAGE_DTYPES
from distmb.pipeline.features.tiered import TieredFeatures, build_tiered_features
from distmb.pipeline.features.zero_copy import HostRows
from distmb.pipeline.sample.device import DeviceNeighborSampler
from distmb.pipeline.sample.host import NeighborSampler


@dataclass
class DeviceStages:
    """The device path's stages.

    Attributes:
        sampler: samples on the training device; its blocks are tensors there.
        features: gathers block 0's input rows onto the device (``gather_device``): the
            device cache, or (``--features ooc``) the host and device caches together.
        note: one line for the run's header.
    """

    sampler: DeviceNeighborSampler
    features: DeviceFeatures | TieredFeatures
    note: str

    @property
    def device_cache(self) -> DeviceFeatures:
        """The device feature cache (of :attr:`features`)."""
        if isinstance(self.features, TieredFeatures):
            return self.features.device_cache
        return self.features


def open_device_stages(
    local: LocalGraph,
    config: TrainConfig,
    device: torch.device,
    adjacency: np.ndarray,
    normalization: FeatureNormalization | None,
    host_cache: CachedFeatures | None = None,
) -> DeviceStages:
    """The device sampler over ``adjacency`` (the rank's in-neighbour lists, in memory or
    memory-mapped) placed by ``--graph-placement``, and the device feature cache of
    ``--device-cache-mb`` filled by ``--device-cache-policy`` (``presc`` pre-samples
    ``--presample-epochs`` epochs with the C++ sampler and its own random stream) over the
    rank's rows (:func:`part_tables`), normalised once here when ``--normalize-features`` is
    set. With ``host_cache`` (``--features ooc``: the out-of-core cache of the same rows),
    the device cache reads its misses from it instead, normalised as read
    (:class:`~distmb.pipeline.features.tiered.TieredFeatures`). ``--feature-dtype`` is the
    dtype the host rows and the device cache store the (normalised) table in (with
    ``--features ooc``: the host cache's dtype, which the device cache takes).

    Raises:
        InputError: ``--feature-dtype float16`` with a table holding values beyond its
            range (:func:`~distmb.engine.build.features.stored_rows`; ``--features ooc``
            with float16 was refused by :func:`~distmb.engine.build.features.open_features`).
    """
    sampler = DeviceNeighborSampler(
        local.indptr,
        adjacency,
        local.n_solid,
        local.n_local,
        config.fanout,
        config.seed,
        device=device,
        placement=config.graph_placement,
        backend=kernel_backend(device),
        graphs=config.cuda_graphs,
    )
    if host_cache is None:
        parts = part_tables(local)
        if normalization is not None or config.feature_dtype != "float32":
            # The host copy the device reads holds normalised rows, rounded once, converted
            # part by part into it (no float32 concatenation first).
            table = stored_rows(parts, config.feature_dtype, normalization)
        else:
            table = parts[0] if len(parts) == 1 else np.concatenate([np.asarray(p) for p in parts])
        num_rows = int(table.shape[0])
    else:
        num_rows = host_cache.num_rows
    # In-degree in the part's CSR; halo rows have no in-edges there.
    degree = np.zeros(num_rows, dtype=np.int64)
    degree[: local.n_solid] = np.diff(np.asarray(local.indptr))[: local.n_solid]

    def make_sampler(seed: int) -> NeighborSampler:
        return NeighborSampler(
            local.indptr, adjacency, local.n_solid, local.n_local, config.fanout, seed
        )

    device_cache = dict(
        cache_mb=config.device_cache_mb,
        policy=config.device_cache_policy,
        degree=degree,
        make_sampler=make_sampler,
        train_idx=local.train_idx,
        batch_size=config.batch_size,
        presample_epochs=config.presample_epochs,
        seed=config.seed,
        reuse_previous=config.match_reorder,
        n_solid=local.n_solid,
    )
    if host_cache is None:
        device_cache["backend"] = kernel_backend(device)
        device_cache["dtype"] = STORAGE_DTYPES[config.feature_dtype]
        features = build_device_features(table, device, **device_cache)
    else:
        features = build_tiered_features(host_cache, device, normalization, **device_cache)
    stages = DeviceStages(sampler, features, note="")
    cache = stages.device_cache
    share = 100 * cache.capacity / max(cache.num_rows, 1)
    note = (
        f"GPU path on {device}: sampler {type(sampler).__name__} (graph placement "
        f"{config.graph_placement}), device feature cache {config.device_cache_policy} "
        f"{cache.capacity} rows ({share:.1f} % of the table, "
        f"{cache.memory_bytes / 2**20:.1f} MiB), rows stored as "
        f"{str(cache.host.dtype).removeprefix('torch.')}"
        + (", its misses from the out-of-core host cache" if host_cache is not None else "")
        + (", Match-Reorder" if config.match_reorder else "")
    )
    stages.note = note
    return stages


def reading_host_rows(
    sources: FeatureSources, stages: DeviceStages, n_solid: int
) -> FeatureSources:
    """``sources`` whose host readers (layer-wise evaluation, the halo exchange of exact
    inference, the exact baseline's remote rows) read the rows of the device cache's host
    table, where ``--feature-dtype`` stored them (two bytes a value, normalised first), rather
    than a copy of their own: one table in host memory, and what they read is what training
    reads. ``sources`` as they are where the rows stay float32 or come from the out-of-core
    cache (no host table)."""
    host = stages.device_cache.host
    if not isinstance(host, HostRows) or host.dtype == torch.float32:
        return sources
    rows = PartFeatures(ArrayFeatures(host.host[:, : host.dim]), n_solid=n_solid)
    note = f"{sources.note}; evaluation reads the GPU's host rows"
    return dataclasses.replace(sources, train=rows, note=note)


def kernel_backend(device: torch.device) -> str:
    """The back end of the device sampler's layer and Fused-Map kernels and of the device
    feature gather: ``"auto"`` (their Triton kernels where Triton runs) on CUDA, ``"torch"``
    on the CPU, where Triton could only run interpreted. The CPU tests of the GPU
    configuration replace it to return ``"triton"`` (under ``TRITON_INTERPRET=1``)."""
    return "auto" if device.type == "cuda" else "torch"


def part_tables(local: LocalGraph) -> list[np.ndarray | torch.Tensor]:
    """The tables of the rows the device feature source serves, by ``VID_p``: the solid rows
    float[n_solid, F], then the replicated halo rows float[n_halo, F] when the part holds them
    (``--replicate-halo-features``), as the host :class:`~distmb.pipeline.features.PartFeatures`
    serves them; block 0's halo leaves are then gathered with its other rows instead of being
    left to the halo scheme."""
    if local.halo_features is None:
        return [local.features]
    return [local.features, local.halo_features]


def match_reorder(loader, features: DeviceFeatures) -> MatchReorder:  # noqa: ANN001 - BatchLoader
    """The BatchLoader ``reorder`` policy of ``--match-reorder`` over ``features``' cache
    (rows it holds are not counted as shared)."""
    from distmb.pipeline.features.reorder import loader_inputs

    return MatchReorder(loader_inputs(loader), features.num_rows, features.resident())
