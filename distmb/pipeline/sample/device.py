"""The neighbour sampler on a torch device (PyTorch ops + Fused-Map).

Same interface and block contract as :class:`distmb.pipeline.sample.NeighborSampler` (see
:mod:`distmb.pipeline.sample.host`): DGL's fan-out order, destinations a prefix of the sources,
then the new solid sources, then the halo leaves, which are never expanded; uniform without
replacement, every neighbour when the degree is at most the fan-out or the fan-out is
:data:`~distmb.pipeline.sample.FANOUT_ALL`; each row's neighbours in CSR order. It does not make the
C++ sampler's random choices, only the same distribution: for a given ``(seed, epoch,
iteration)`` the blocks are the same on every call on the same device type and torch build.

One layer, all on the device, no loop over destinations, by one of two layer kernels
(``choose``):

- ``"torch"``: PyTorch ops, random words from a ``torch.Generator`` seeded with
  :func:`batch_seed`:

  1. degrees from ``indptr``; row sizes ``min(deg, fanout)``; their prefix sum is the
     block's ``indptr``;
  2. positions: vectorised Floyd (:mod:`distmb.pipeline.sample.choose`) for rows above the
     fan-out, the whole row otherwise, laid out by the bound ``n_dst x fanout`` (padding
     slots carry ``dst[0]``); neighbours gathered from ``indices``;

- ``"triton"``: steps 1-2 in one launch (:mod:`distmb.pipeline.sample.choose_triton`), with
  counter-based random words keyed by ``(batch_seed, layer, row, step)``; then the prefix
  sum of its row sizes;

then, on both paths,

3. Fused-Map (:func:`distmb.pipeline.sample.idmap.start_map`) of ``concat(dst, neighbours)``:
   the block's ``src_ids`` and every slot's source position; the valid slots are scattered
   to their CSR positions.

Both kernels sample the same distribution from different random words, so their blocks for
one triple differ. ``choose="auto"`` is Triton where it can run (CUDA, or CPU under
``TRITON_INTERPRET=1``); by default ``choose`` follows the Fused-Map ``backend`` (the engine
passes ``"torch"`` on the CPU, ``"auto"`` on CUDA).

**Host synchronisations** (:func:`distmb.core.host_reads.host_values`):

- **one per mini-batch** on the Triton path (the Triton layer kernel, the Triton Fused-Map,
  every fan-out bounded): every layer is sized by a bound known before any read, and the
  sizes and error counts of all layers are read together at the end
  (:mod:`distmb.pipeline.sample.device_batch`; the same blocks as reading once per layer).
  A batch whose bounds exceed
  :data:`~distmb.pipeline.sample.device_batch.MAX_ONE_READ_KEYS` keys in a layer, or with
  no seed, reads once per layer instead;
- **one per layer** otherwise (the torch layer kernel, whose random words depend on the row
  count; the torch Fused-Map, whose ``torch.unique`` reads its own size): the edge count,
  the seeds' range check and Fused-Map's counts together, the sizes of the layer's outputs,
  which the :class:`~distmb.pipeline.sample.Block` holds as ints; the next layer is sized
  by them. :data:`FANOUT_ALL` layers (exact evaluation) read the edge count first (twice a
  layer).

Launches of one bounded layer below the top, Triton Fused-Map, fan-out ``k``: ATen ops that
are not views (counted with a ``TorchDispatchMode`` on CPU tensors, the Triton
interpreter's own ops left out) plus one per Triton launch (``tests/test_choose_triton.py``,
``test_layer_launches``). The torch path takes 3 per Floyd step: 70 at ``k = 1``, 75 at
``k = 2``, then ``3k + 69`` (84 at 5, 99 at 10, 114 at 15); all ATen ops, views included,
``8k + 87`` (167 at 10). The Triton path takes 51 whatever ``k`` when it reads once per
layer, 2 of them Triton launches: the layer kernel and Fused-Map's insert. On a one-read
batch a layer is 5 Triton launches and no other op that launches (9 allocations): the layer
kernel, then :mod:`distmb.pipeline.sample.relabel_triton`'s insert, count, scan and relabel;
the batch adds 1 launch (every layer's hash table filled at once) and 2 allocations, and
nothing for its read. The top layer adds 5 ops on the per-layer paths: the seeds' range
check (4), and the clamp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from distmb import _C
from distmb.core.host_reads import host_values, to_device, to_host
from distmb.core.rng import GOLDEN, finalize64
from distmb.pipeline.sample.blocks import Block
from distmb.pipeline.sample.choose import choose_positions
from distmb.pipeline.sample.choose_triton import choose_layer, layer_key, resolve_choose
from distmb.pipeline.sample.device_batch import fits_one_read, sample_one_read
from distmb.pipeline.sample.graphed import SamplerGraphs
from distmb.pipeline.sample.host import (
    FANOUT_ALL,
    NeighborSampler,
    _check_counter,
    _index_array,
)
from distmb.pipeline.sample.idmap import (
    Backend,
    MappedIds,
    PendingMap,
    RepeatedDestinationError,
    resolve_backend,
    start_map,
)
from distmb.pipeline.sample.placement import Placement, place
from distmb.pipeline.sample.protocol import PartSampler


def batch_seed(seed: int, epoch: int, iteration: int) -> int:
    """The generator seed of one mini-batch: a splitmix64 hash of the triple, in
    ``[0, 2**63)``."""
    h = finalize64(seed + GOLDEN)
    h = finalize64(h ^ (epoch + 2 * GOLDEN))
    h = finalize64(h ^ (iteration + 3 * GOLDEN))
    return h >> 1


class DeviceNeighborSampler(PartSampler):
    """Uniform neighbour sampler over one part's local in-edge CSR, on a torch device.

    Args:
        indptr: int64[n_solid + 1], CSR row pointers of the solid vertices' in-edges
            (host array).
        indices: int32 or int64[indptr[-1]], sources as VID_p in ``[0, n_local)``; VID_p
            ``>= n_solid`` are halo leaves (host array).
        n_solid, n_local, fanouts, seed: as for :class:`~distmb.pipeline.sample.NeighborSampler`.
        device: where sampling runs and the blocks live (``cpu`` or ``cuda[:i]``).
        placement: ``"device"`` (CSR copied to the device) or ``"host"`` (read in place from
            pinned host memory, zero-copy; :mod:`distmb.pipeline.sample.placement`).
        backend: Fused-Map back end (``"auto"``: the Triton kernel where it can run).
        choose: the layer kernel (module docstring): ``"torch"``, ``"triton"`` or
            ``"auto"`` (Triton where it can run); ``None``: as ``backend``.
        graphs: replay one-read batches from CUDA graphs, one per batch shape
            (:mod:`distmb.pipeline.sample.graphed`; off CUDA, its eager stand-in). Batches
            that read once per layer are never graphed.

    Raises:
        ValueError: the C++ sampler's checks of the CSR and fan-outs (same messages), a bad
            placement or back end, ``choose="triton"`` where Triton cannot run.
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        n_solid: int,
        n_local: int,
        fanouts: Sequence[int],
        seed: int,
        device: torch.device | str = "cpu",
        placement: Placement = "device",
        backend: Backend = "auto",
        choose: Backend | None = None,
        graphs: bool = False,
    ) -> None:
        self.fanouts = NeighborSampler._check_fanouts(fanouts)
        self.seed = _check_counter(seed, "seed")
        indptr, indices = np.asarray(indptr), np.asarray(indices)
        if indptr.dtype != np.int64:
            raise ValueError(f"indptr must be int64 (got {indptr.dtype})")
        if indices.dtype not in (np.int32, np.int64):
            raise ValueError(f"indices must be int32 or int64 (got {indices.dtype})")
        # One-off O(n + E) validation by the C++ core (same checks and messages).
        _C.NeighborSamplerCore(
            np.ascontiguousarray(indptr), np.ascontiguousarray(indices), int(n_solid), int(n_local)
        )
        self.n_solid, self.n_local = int(n_solid), int(n_local)
        self.device = torch.device(device)
        self.placement = placement
        self.backend: Backend = backend
        #: The resolved layer kernel: ``"torch"`` or ``"triton"``.
        self.choose = resolve_choose(backend if choose is None else choose, self.device)
        self.indptr = place(np.ascontiguousarray(indptr), self.device, placement)
        self.indices = place(np.ascontiguousarray(indices), self.device, placement)
        #: The one-read batches' graphs (``graphs=True``), else None.
        self.graphs = (
            SamplerGraphs(self.indptr, self.indices, self.n_solid, backend) if graphs else None
        )

    def sample(self, seeds: torch.Tensor | np.ndarray, epoch: int, iteration: int) -> list[Block]:
        """The blocks of one mini-batch, on :attr:`device` (contract as
        :meth:`distmb.pipeline.sample.NeighborSampler.sample`).

        Raises:
            ValueError: a seed that is a halo vertex, out of range or repeated; bad counters.
        """
        return self._run(seeds, self.fanouts, epoch, iteration)

    def sample_hop(
        self, dst_ids: torch.Tensor | np.ndarray, fanout: int, epoch: int, iteration: int
    ) -> Block:
        """One block of up to ``fanout`` in-neighbours of every ``dst_ids`` entry."""
        return self._run(dst_ids, NeighborSampler._check_fanouts([fanout]), epoch, iteration)[0]

    def full_block(self, dst_ids: torch.Tensor | np.ndarray) -> Block:
        """One exact block: every in-neighbour of ``dst_ids`` (distinct solid VID_p)."""
        return self._run(dst_ids, [FANOUT_ALL], 0, 0)[0]

    def _seeds(self, seeds: torch.Tensor | np.ndarray) -> torch.Tensor:
        if isinstance(seeds, torch.Tensor):
            if seeds.dim() != 1:
                raise ValueError(f"seeds must be 1-D (got shape {list(seeds.shape)})")
            if seeds.is_floating_point() or seeds.is_complex() or seeds.dtype == torch.bool:
                raise ValueError(f"seeds must hold integers (got dtype {seeds.dtype})")
            return to_device(seeds, self.device, torch.int64)
        return to_device(_index_array(seeds, "seeds"), self.device)

    def reads_once(self, fanouts: Sequence[int], n_seeds: int) -> bool:
        """Whether a batch of ``n_seeds`` seeds and these ``fanouts`` is sampled with one host
        read (module docstring; :mod:`distmb.pipeline.sample.device_batch`), not one per
        layer.

        Raises:
            ValueError: a Fused-Map back end that cannot run here.
        """
        return (
            self.choose == "triton"
            and FANOUT_ALL not in fanouts
            and n_seeds > 0
            and self.indices.numel() > 0
            and resolve_backend(self.backend, self.device) == "triton"
            and fits_one_read(n_seeds, fanouts, self.n_solid)
        )

    def _run(
        self,
        seeds: torch.Tensor | np.ndarray,
        fanouts: list[int],
        epoch: int,
        iteration: int,
        one_read: bool = True,
    ) -> list[Block]:
        """The blocks; ``one_read=False`` forces one read per layer (the reference the
        tests hold the one-read path to)."""
        dst = self._seeds(seeds)
        batch = batch_seed(
            self.seed, _check_counter(epoch, "epoch"), _check_counter(iteration, "iteration")
        )
        if one_read and self.reads_once(fanouts, int(dst.shape[0])):
            try:
                if self.graphs is not None:
                    return self.graphs.sample(dst, fanouts, batch, self._raise_bad_seed)
                return sample_one_read(
                    self.indptr, self.indices, dst, fanouts, batch, self.n_solid,
                    self.backend, self._raise_bad_seed,
                )  # fmt: skip
            except RepeatedDestinationError as exc:  # only seeds can repeat
                raise _repeated_seed(exc) from None
        generator = None
        if self.choose == "torch":
            generator = torch.Generator(device=self.device)
            generator.manual_seed(batch)
        blocks: list[Block] = [None] * len(fanouts)  # type: ignore[list-item]
        top = len(fanouts) - 1
        for layer in range(top, -1, -1):
            draws = generator if generator is not None else layer_key(batch, layer)
            block = self._layer(dst, fanouts[layer], draws, check_seeds=layer == top)
            blocks[layer] = block
            dst = block.src_ids[: block.n_computed]
        return blocks

    def _layer(
        self, dst: torch.Tensor, fanout: int, draws: torch.Generator | int, check_seeds: bool
    ) -> Block:
        """One block for destinations ``dst`` (int64[n_dst] on the device, distinct solid
        VID_p; checked when ``check_seeds``). ``draws``: the batch's generator (torch
        kernel) or the layer's key (:func:`~distmb.pipeline.sample.choose_triton.layer_key`,
        Triton kernel)."""
        n_dst = int(dst.shape[0])
        if check_seeds and n_dst and self.n_solid == 0:
            self._raise_bad_seed(dst)
        # Out-of-range seeds are clamped for the reads below and reported at the layer's
        # sync, so that a bad seed never becomes an out-of-bounds device read.
        rows = dst.clamp(0, max(self.n_solid - 1, 0)) if check_seeds else dst
        exact = fanout == FANOUT_ALL or not self.indices.numel()
        if isinstance(draws, int) and not exact:
            return self._layer_triton(dst, rows, fanout, draws, check_seeds)
        start = self.indptr[rows]
        deg = self.indptr[rows + 1] - start
        if exact:
            return self._layer_exact(dst, start, deg, fanout, check_seeds)
        assert isinstance(draws, torch.Generator)  # the torch kernel's
        return self._layer_bounded(dst, start, deg, fanout, draws, check_seeds)

    def _n_bad(self, dst: torch.Tensor, indptr: torch.Tensor, check_seeds: bool) -> torch.Tensor:
        """int64 scalar on the device: seeds outside the solid range (unless checked:
        ``indptr[0]``, a zero that costs no op)."""
        if not check_seeds:
            return indptr[0]
        return ((dst < 0) | (dst >= self.n_solid)).sum()

    def _finish(
        self, pending: PendingMap, counts: list[int], n_bad: int, dst: torch.Tensor
    ) -> MappedIds:
        """The layer's ids from its one host read: bad seeds, then repeated seeds, raise."""
        if n_bad:
            self._raise_bad_seed(dst)
        try:
            return pending.finish(counts)
        except RepeatedDestinationError as exc:  # only seeds can repeat
            raise _repeated_seed(exc) from None

    def _layer_bounded(
        self,
        dst: torch.Tensor,
        start: torch.Tensor,
        deg: torch.Tensor,
        fanout: int,
        generator: torch.Generator,
        check_seeds: bool,
    ) -> Block:
        """A layer of ``fanout`` picks per row by the torch kernel, sized by its bound
        ``n_dst * fanout``: every row has ``fanout`` slots, the first ``min(deg, fanout)``
        valid (the same picks, in the same order, as the exact layout). Padding slots carry
        ``dst[0]``, which Fused-Map has seen at position 0 already, so they never become
        sources (then :meth:`_map_slots`)."""
        n_dst, device = int(dst.shape[0]), self.device
        count = torch.clamp(deg, max=fanout)
        indptr = torch.zeros(n_dst + 1, dtype=torch.int64, device=device)
        torch.cumsum(count, 0, out=indptr[1:])
        slot = torch.arange(fanout, dtype=torch.int64, device=device)
        picks = choose_positions(deg, fanout, generator)  # int64[n_dst, fanout]
        offset = torch.where((deg > fanout).unsqueeze(1), picks, slot)
        valid = (slot < count.unsqueeze(1)).flatten()  # bool[n_dst * fanout]
        # Padding slots past the last edge read the last edge instead (their value is unused).
        edge = (start.unsqueeze(1) + offset).flatten().clamp_(max=self.indices.numel() - 1)
        neighbours = self.indices[edge].to(device, torch.int64)
        keys = torch.cat([dst, torch.where(valid, neighbours, dst[:1])])
        return self._map_slots(dst, indptr, keys, valid, slot, check_seeds)

    def _layer_triton(
        self, dst: torch.Tensor, rows: torch.Tensor, fanout: int, key: int, check_seeds: bool
    ) -> Block:
        """A bounded layer by the Triton kernel (:func:`~distmb.pipeline.sample.choose_triton.
        choose_layer`: the slots, padding, row sizes and valid mask in one launch, ``rows``
        the clamped ``dst``), then the block's ``indptr`` and :meth:`_map_slots`."""
        n_dst, device = int(dst.shape[0]), self.device
        chosen = choose_layer(self.indptr, self.indices, rows, dst, fanout, key)
        assert chosen.valid is not None  # asked for
        indptr = torch.zeros(n_dst + 1, dtype=torch.int64, device=device)
        torch.cumsum(chosen.count, 0, out=indptr[1:])
        slot = torch.arange(fanout, dtype=torch.int64, device=device)
        return self._map_slots(dst, indptr, chosen.keys, chosen.valid, slot, check_seeds)

    def _map_slots(
        self,
        dst: torch.Tensor,
        indptr: torch.Tensor,
        keys: torch.Tensor,
        valid: torch.Tensor,
        slot: torch.Tensor,
        check_seeds: bool,
    ) -> Block:
        """The block of a bounded layer's slots: Fused-Map of ``keys`` (int64[n_dst + n_dst *
        fanout], ``dst`` then the slots, padding ``dst[0]``); the edge count rides on its
        sync (one host read per layer); the ``valid`` slots (bool[n_dst * fanout]) are
        scattered to their CSR positions (``indptr``: int64[n_dst + 1], the block's;
        ``slot``: ``arange(fanout)``)."""
        n_dst, device = int(dst.shape[0]), self.device
        pending = start_map(keys, n_dst, self.n_solid, self.backend)
        head = torch.stack([indptr[-1], self._n_bad(dst, indptr, check_seeds)])
        nnz, n_bad, *counts = host_values(torch.cat([head, pending.counts]))  # the layer's sync
        mapped = self._finish(pending, counts, n_bad, dst)
        position = torch.where(valid, (indptr[:-1].unsqueeze(1) + slot).flatten(), nnz)
        indices = torch.empty(nnz + 1, dtype=torch.int64, device=device)
        indices.scatter_(0, position, mapped.local[n_dst:])
        return Block(
            n_dst=n_dst,
            n_src=int(mapped.src_ids.shape[0]),
            n_halo=mapped.n_halo,
            indptr=indptr,
            indices=indices[:nnz],
            src_ids=mapped.src_ids,
        )

    def _layer_exact(
        self,
        dst: torch.Tensor,
        start: torch.Tensor,
        deg: torch.Tensor,
        fanout: int,
        check_seeds: bool,
    ) -> Block:
        """Every neighbour (``fanout`` is :data:`FANOUT_ALL`, or the graph has no edge):
        the edge count is read first (it sizes the layer's arrays), then Fused-Map's."""
        n_dst, device = int(dst.shape[0]), self.device
        indptr = torch.zeros(n_dst + 1, dtype=torch.int64, device=device)
        torch.cumsum(deg, 0, out=indptr[1:])
        nnz, n_bad = host_values(torch.stack([indptr[-1], self._n_bad(dst, indptr, check_seeds)]))
        if n_bad:
            self._raise_bad_seed(dst)
        row = torch.repeat_interleave(torch.arange(n_dst, device=device), deg, output_size=nnz)
        offset = torch.arange(nnz, device=device) - indptr[row]
        neighbours = self.indices[start[row] + offset]
        pending = start_map(
            torch.cat([dst, neighbours.to(device, torch.int64)]), n_dst, self.n_solid, self.backend
        )
        mapped = self._finish(pending, host_values(pending.counts), 0, dst)
        return Block(
            n_dst=n_dst,
            n_src=int(mapped.src_ids.shape[0]),
            n_halo=mapped.n_halo,
            indptr=indptr,
            indices=mapped.local[n_dst:],
            src_ids=mapped.src_ids,
        )

    def _raise_bad_seed(self, dst: torch.Tensor) -> None:
        """Raise the C++ sampler's error for the first seed outside the solid range."""
        host = to_host(dst)
        at = int(torch.nonzero((host < 0) | (host >= self.n_solid))[0, 0])
        s = int(host[at])
        if self.n_solid <= s < self.n_local:
            raise ValueError(
                f"seed VID_p {s} (position {at}) is a halo vertex (VID_p >= n_solid="
                f"{self.n_solid}); halo vertices have no local in-edges and cannot be seeds"
            )
        raise ValueError(
            f"seed VID_p {s} (position {at}) is outside the solid range [0, {self.n_solid})"
        )


def _repeated_seed(exc: RepeatedDestinationError) -> ValueError:
    """The sampler's error for a repeated seed (Fused-Map's repeated destination)."""
    return ValueError(f"seeds must be distinct; VID_p {exc.key} occurs more than once")
