"""KaMinPar engine (``--method kaminpar``): a shared-memory multilevel partitioner.

KaMinPar (Sanders & Seemaier et al., ESA 2021; the PyPI ``kaminpar`` bindings) minimises the
edge cut under one vertex-weight constraint, not METIS' several. Every vertex weighs
``1 + train_weight * is_train``, so the training vertices are spread with the vertices, and
the same :func:`~distmb.partition.assign.rebalance_train_and_vertices` pass as after METIS
then brings both counts within ``--train-tolerance`` / ``--vertex-tolerance``.

The bindings (3.7) build a graph only from a file, so the adjacency goes through a
temporary ParHIP binary file (``TMPDIR``; :func:`write_parhip`): written in chunks straight
from the int64 CSR (32-bit ids when they fit), never a Python list, and for a symmetric
graph without a symmetrised copy. KaMinPar copies it into its own 64-bit CSR on load.
The partition comes back as a Python list of ``num_nodes`` ints (the bindings' only
output; 8 bytes a vertex while P <= 256, whose ints Python caches), converted to int32 at
once.

Determinism: with one thread (``--threads 1``) the result is a function of the graph and
the seed, byte-identical across runs. With more threads KaMinPar's parallel label
propagation and refinement depend on thread timing, so two runs with the same seed and
thread count can return different (equally good) partitions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

from distmb.core.errors import InputError
from distmb.data.graph import Graph, undirected_csr
from distmb.partition.spill import release_pages

#: How to install what ``--method kaminpar`` needs.
KAMINPAR_INSTALL = "pip install 'distmb[kaminpar]'"

#: KaMinPar's allowed imbalance of the vertex weight per block (max/mean - 1); the same 3 %
#: as METIS' ``ufactor`` 30.
KAMINPAR_EPSILON = 0.03

#: Extra vertex weight of a training vertex (each vertex weighs ``1 + this * is_train``).
#: Measured after rebalancing (``benchmarks/partition.py --train-weights``, results/README):
#: where training vertices gather in a few communities (``clustered-train:``, P=4), 2 cuts
#: 2 points fewer edges than 0 (23.8 % vs 25.5-26.0 % in two runs; 0 leaves them in their
#: communities and the rebalancing drags them out one by one); on Cora at P=4 it cuts 0.2-0.3
#: points fewer; elsewhere 0, 2 and 4 are within the run-to-run spread. From 4 up the
#: vertex counts drift further (max/mean up to 1.43 before rebalancing) and more move.
KAMINPAR_TRAIN_WEIGHT = 2

#: KaMinPar preset (``kaminpar.context_by_name``). ``default`` is its fast setting; on the
#: 500k-vertex synthetic graph (2 threads, 3 seeds, once, outside the benchmark) ``eco`` cut
#: 45.4 % at P=4 (default 49-51 %, METIS 45.4 %) and 61.8-62.5 % at P=16 (default 65.5-66 %,
#: METIS 67.3 %), but took 72-170 s against 4-9 s.
KAMINPAR_PRESET = "default"

#: Entries converted and written per chunk (bounds the temporaries to ~32 MiB).
_WRITE_CHUNK = 1 << 22

#: ParHIP header: version flags, number of vertices, number of directed edges (uint64 each).
_PARHIP_HEADER_BYTES = 24

#: ParHIP version bits, each set when the feature is ABSENT (or 32-bit instead of 64-bit).
_PARHIP_NO_EDGE_WEIGHTS = 1 << 0
_PARHIP_NO_NODE_WEIGHTS = 1 << 1
_PARHIP_EDGE_ID_32 = 1 << 2
_PARHIP_NODE_ID_32 = 1 << 3
_PARHIP_NODE_WEIGHT_32 = 1 << 4
_PARHIP_EDGE_WEIGHT_32 = 1 << 5

_UINT32_MAX = np.iinfo(np.uint32).max


def import_kaminpar() -> ModuleType:
    """The ``kaminpar`` module.

    Raises:
        InputError: naming ``--method kaminpar`` and the pip command when it is missing, or
            the loader's error when it is installed but does not load.
    """
    try:
        import kaminpar
    except ModuleNotFoundError:
        raise InputError(
            f"--method kaminpar needs the kaminpar package: {KAMINPAR_INSTALL}"
        ) from None
    except ImportError as exc:  # installed, but e.g. its bundled TBB does not load
        raise InputError(
            f"--method kaminpar: the kaminpar package does not load ({exc}); reinstall it: "
            f"{KAMINPAR_INSTALL}"
        ) from None
    return kaminpar


def vertex_weights(graph: Graph, train_weight: int) -> np.ndarray:
    """int64[num_nodes]: ``1 + train_weight`` for training vertices, 1 for the others."""
    if train_weight < 0:
        raise InputError(f"KaMinPar training-vertex weight must be >= 0, got {train_weight}")
    weights = np.ones(graph.num_nodes, dtype=np.int64)
    weights[graph.train_idx] += train_weight
    return weights


def parhip_nbytes(num_nodes: int, num_edges: int) -> int:
    """Size in bytes of the file :func:`write_parhip` writes (32-bit ids and weights,
    64-bit offsets)."""
    return _PARHIP_HEADER_BYTES + 8 * (num_nodes + 1) + 4 * num_edges + 4 * num_nodes


def write_parhip(
    path: str | os.PathLike[str],
    indptr: np.ndarray,
    indices: np.ndarray,
    weights: np.ndarray,
    *,
    offsets_64bit: bool = True,
) -> None:
    """Write a CSR as a ParHIP binary graph file (KaMinPar's / KaHIP's binary format).

    Layout: uint64 ``[version, n, m]``; ``n + 1`` edge offsets, stored as the **byte**
    position of each row's first neighbour in the file (uint64, or uint32 with
    ``offsets_64bit=False``); ``m`` neighbour ids (uint32); ``n`` vertex weights (uint32).
    No edge weights. Written in chunks of :data:`_WRITE_CHUNK` entries, so the temporaries
    stay small whatever the graph's size.

    Args:
        indptr: int64[n + 1], CSR row pointers of a symmetric adjacency without self-loops.
        indices: int64[m], neighbour ids in ``[0, n)``.
        weights: int64[n], vertex weights in ``[1, 2**32)``.
        offsets_64bit: False for a KaMinPar built with 32-bit ids (``kaminpar.__64bit__``).

    Raises:
        InputError: when ids, weights or (32-bit) offsets do not fit the format.
    """
    n, m = indptr.shape[0] - 1, indices.shape[0]
    edges_at = _PARHIP_HEADER_BYTES + (n + 1) * (8 if offsets_64bit else 4)
    if n > _UINT32_MAX:
        raise InputError(f"KaMinPar input: {n} vertices do not fit 32-bit ids")
    if not offsets_64bit and edges_at + 4 * m > _UINT32_MAX:
        raise InputError(
            f"--method kaminpar: {m} directed edges exceed this kaminpar build's 32-bit edge "
            "ids; install the 64-bit build (the PyPI wheel) or use --method metis"
        )
    if weights.size and (int(weights.min()) < 1 or int(weights.max()) > _UINT32_MAX):
        raise InputError("KaMinPar input: vertex weights must lie in [1, 2**32)")
    version = (
        _PARHIP_NO_EDGE_WEIGHTS
        | _PARHIP_NODE_ID_32
        | _PARHIP_NODE_WEIGHT_32
        | _PARHIP_EDGE_WEIGHT_32
        | (0 if offsets_64bit else _PARHIP_EDGE_ID_32)
    )
    offset_type = np.uint64 if offsets_64bit else np.uint32
    with open(path, "wb") as f:
        np.array([version, n, m], dtype=np.uint64).tofile(f)
        for lo in range(0, n + 1, _WRITE_CHUNK):
            chunk = indptr[lo : lo + _WRITE_CHUNK]
            (edges_at + 4 * chunk).astype(offset_type).tofile(f)
        for lo in range(0, m, _WRITE_CHUNK):
            indices[lo : lo + _WRITE_CHUNK].astype(np.uint32).tofile(f)
        for lo in range(0, n, _WRITE_CHUNK):
            weights[lo : lo + _WRITE_CHUNK].astype(np.uint32).tofile(f)


def kaminpar_parts(
    graph: Graph,
    parts: int,
    *,
    seed: int,
    threads: int | None = None,
    train_weight: int = KAMINPAR_TRAIN_WEIGHT,
    preset: str = KAMINPAR_PRESET,
) -> np.ndarray:
    """KaMinPar k-way partition minimising the edge cut; returns int32[num_nodes].

    Vertex ``v`` weighs ``1 + train_weight * is_train[v]`` and every part may hold at most
    ``(1 + KAMINPAR_EPSILON)`` times the mean weight. A directed graph is symmetrised for
    KaMinPar only (:func:`~distmb.data.graph.undirected_csr`).

    Args:
        seed: KaMinPar's random seed (``kaminpar.reseed``).
        threads: KaMinPar's threads (default: the OpenMP thread count, ``--threads``). The
            result is byte-identical for a seed only with one thread (module docstring).
        train_weight: extra weight of a training vertex (:data:`KAMINPAR_TRAIN_WEIGHT`).
        preset: KaMinPar context name (:data:`KAMINPAR_PRESET`).

    Raises:
        InputError: kaminpar missing, or no room in ``TMPDIR`` for the graph file.
    """
    from distmb import _C

    kaminpar = import_kaminpar()
    threads = int(_C.get_num_threads()) if threads is None else threads
    if threads < 1:
        raise InputError(f"KaMinPar threads must be >= 1, got {threads}")
    weights = vertex_weights(graph, train_weight)
    indptr, indices = undirected_csr(graph)
    tmp_root = Path(tempfile.gettempdir())
    need = parhip_nbytes(graph.num_nodes, indices.shape[0])
    free = shutil.disk_usage(tmp_root).free
    if need > free:
        raise InputError(
            f"--method kaminpar writes the graph to a {need / 2**30:.1f} GiB temporary file, "
            f"but {tmp_root} has {free / 2**30:.1f} GiB free; point TMPDIR at a larger disk"
        )
    with tempfile.TemporaryDirectory(prefix="distmb-kaminpar-") as tmp:
        path = Path(tmp) / "graph.parhip"
        write_parhip(path, indptr, indices, weights, offsets_64bit=bool(kaminpar.__64bit__))
        del indptr, indices, weights
        release_pages(graph)  # the file holds the input now (distmb.partition.spill)
        kgraph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP)
    kaminpar.reseed(seed)
    solver = kaminpar.KaMinPar(threads, kaminpar.context_by_name(preset))
    blocks = solver.compute_partition(kgraph, parts, KAMINPAR_EPSILON)
    del kgraph, solver
    return np.fromiter(blocks, dtype=np.int32, count=graph.num_nodes)
