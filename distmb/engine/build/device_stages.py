"""The device path's data stages for one rank (:mod:`distmb.engine.device` says when it is
taken): the device sampler, the device feature cache, and Match-Reorder. They run on a GPU
(``--device cuda``) or on CPU tensors (``--sampler device``).

:func:`open_device_stages` builds them from the rank's :class:`~distmb.data.local.LocalGraph`
and the run's flags, so that the run hands them to its BatchLoader exactly as it does the C++
sampler and the host feature sources.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distmb.config.train import TrainConfig
from distmb.data.local import LocalGraph
from distmb.pipeline.features.device import DeviceFeatures, build_device_features
from distmb.pipeline.features.normalize import FeatureNormalization
from distmb.pipeline.features.reorder import MatchReorder
from distmb.pipeline.sample.device import DeviceNeighborSampler
from distmb.pipeline.sample.host import NeighborSampler


@dataclass
class DeviceStages:
    """The device path's stages.

    Attributes:
        sampler: samples on the training device; its blocks are tensors there.
        features: gathers block 0's input rows onto the device (``gather_device``).
        note: one line for the run's header.
    """

    sampler: DeviceNeighborSampler
    features: DeviceFeatures
    note: str


def open_device_stages(
    local: LocalGraph,
    config: TrainConfig,
    device: torch.device,
    adjacency: np.ndarray,
    normalization: FeatureNormalization | None,
) -> DeviceStages:
    """The device sampler over ``adjacency`` (the rank's in-neighbour lists, in memory or
    memory-mapped) placed by ``--graph-placement``, and the device feature cache of
    ``--device-cache-mb`` filled by ``--device-cache-policy`` (``presc`` pre-samples
    ``--presample-epochs`` epochs with the C++ sampler and its own random stream) over the
    rank's solid rows, normalised once here when ``--normalize-features`` is set."""
    sampler = DeviceNeighborSampler(
        local.indptr,
        adjacency,
        local.n_solid,
        local.n_local,
        config.fanout,
        config.seed,
        device=device,
        placement=config.graph_placement,
        # On the CPU the Triton kernel could only run interpreted (tests): torch ops there.
        backend="auto" if device.type == "cuda" else "torch",
    )
    table: np.ndarray | torch.Tensor = local.features
    if normalization is not None:  # the host copy the device reads holds normalised rows
        table = normalization.apply_(torch.from_numpy(np.array(table, dtype=np.float32)))
    degree = np.diff(np.asarray(local.indptr)).astype(np.int64)[: local.n_solid]

    def make_sampler(seed: int) -> NeighborSampler:
        return NeighborSampler(
            local.indptr, adjacency, local.n_solid, local.n_local, config.fanout, seed
        )

    features = build_device_features(
        table,
        device,
        config.device_cache_mb,
        config.device_cache_policy,
        degree=degree,
        make_sampler=make_sampler,
        train_idx=local.train_idx,
        batch_size=config.batch_size,
        presample_epochs=config.presample_epochs,
        seed=config.seed,
        reuse_previous=config.match_reorder,
    )
    share = 100 * features.capacity / max(features.num_rows, 1)
    note = (
        f"GPU path on {device}: sampler {type(sampler).__name__} (graph placement "
        f"{config.graph_placement}), device feature cache {config.device_cache_policy} "
        f"{features.capacity} rows ({share:.1f} % of the table, "
        f"{features.memory_bytes / 2**20:.1f} MiB)"
        + (", Match-Reorder" if config.match_reorder else "")
    )
    return DeviceStages(sampler, features, note)


def match_reorder(loader, features: DeviceFeatures) -> MatchReorder:  # noqa: ANN001 - BatchLoader
    """The BatchLoader ``reorder`` policy of ``--match-reorder`` over ``features``' cache
    (rows it holds are not counted as shared)."""
    from distmb.pipeline.features.reorder import loader_inputs

    return MatchReorder(loader_inputs(loader), features.num_rows, features.resident())
