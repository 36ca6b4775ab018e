"""Vertex -> part assignment: METIS with multi-constraint weights, KaMinPar, or balanced random.

All return ``part_of: int32[num_nodes]``; :func:`assign_parts` is the one dispatch point.
METIS balances vertices and training vertices (two constraints, like DistDGL's
``balance_ntypes``; a third, in-degree, with ``balance_edges``). KaMinPar
(:mod:`distmb.partition.kaminpar`) balances one vertex weight, ``1 + w * is_train``. Both
meet the balance only approximately (METIS' k-way multi-constraint mode can miss the vertex
constraint by 20 %, one weight cannot pin two counts, and one training vertex is a large
share when a part holds few), so :func:`rebalance_train_and_vertices` then moves boundary
vertices between parts until both are within tolerance.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from distmb.core.errors import InputError
from distmb.data.graph import Graph, csr_row_positions, undirected_csr
from distmb.partition.kaminpar import import_kaminpar, kaminpar_parts
from distmb.partition.spill import release_pages, resident_nbytes

#: ``parmetis`` is computed by an MPI job (:mod:`distmb.partition.distributed`), then handed
#: to :func:`~distmb.partition.pipeline.partition_graph` as ``part_of``.
METHODS = ("metis", "kaminpar", "random", "parmetis")
#: Recorded as ``method`` when the assignment was read from a file (``--assignment``).
ASSIGNMENT_METHOD = "assignment"
#: The methods whose assignment is given to :func:`~distmb.partition.pipeline.partition_graph`
#: as ``part_of`` rather than computed there.
GIVEN_METHODS = ("parmetis", ASSIGNMENT_METHOD)
#: The methods that run a partitioning engine on a copy of the adjacency.
ENGINES = ("metis", "kaminpar")

#: METIS imbalance tolerance, in thousandths over perfect balance (METIS' ufactor).
METIS_UFACTOR = 30

#: Bytes METIS (pymetis, 64-bit idx_t) needs per adjacency entry it is given, the int64 copy
#: of the entries handed to it included (unit edge weights plus a coarsening hierarchy that
#: shrinks slowly on skewed degrees). With the two constants below, fitted to the process'
#: high-water mark (``VmHWM``) on power-law graphs of average degree 50: 1M vertices with
#: 12.5M and 25M sampled entries at P = 4, and 2.5M vertices with 30M sampled entries at
#: P = 4 and P = 64 (benchmarks/partition.py --budget-bytes-per-edge); rounded up.
METIS_BYTES_PER_ENTRY = 128

#: Bytes METIS needs per vertex besides (its vertex arrays over the coarsening levels, the
#: vertex weights, the membership list pymetis returns).
METIS_BYTES_PER_VERTEX = 176

#: Bytes per vertex and per distinct part among its neighbours, which the k-way refinement
#: keeps for boundary vertices (METIS' neighbour pool): at most ``min(P, degree)`` of them.
METIS_BYTES_PER_NEIGHBOUR_PART = 12

#: Resident set of a partitioner process besides the graph and the engine: interpreter,
#: numpy, the extension, pymetis, and what the allocator keeps of the loaders' freed
#: temporaries. 320 MiB: METIS runs budgeted by the model with 160 MiB here peaked 0.11 GiB
#: above their budget (2.5M vertices, P = 4 and 64), with 256 MiB 7 MB above it (P = 4).
PROCESS_BASELINE_BYTES = 320 << 20

#: In-edges per block when counting the parts of candidate vertices' neighbours during the
#: rebalancing (bounds its per-edge temporaries to a few hundred MiB).
NEIGHBOUR_COUNT_CHUNK = 1 << 23

#: Bisection steps of :func:`metis_edge_fraction` (the fraction to ~1e-15).
_FRACTION_BISECTIONS = 50

#: Smallest share of edges METIS may be given before a memory budget is declared too small.
MIN_METIS_EDGE_FRACTION = 0.1


def assign_parts(
    graph: Graph,
    parts: int,
    *,
    method: str,
    seed: int,
    balance_edges: bool = False,
    metis_edge_fraction: float = 1.0,
) -> np.ndarray:
    """Assign every vertex to one of ``parts`` parts; returns int32[num_nodes].

    ``method``: ``"metis"`` (:func:`metis_parts`), ``"kaminpar"``
    (:func:`distmb.partition.kaminpar.kaminpar_parts`, with the OpenMP thread count of
    ``--threads``) or ``"random"`` (:func:`random_parts`).
    """
    if parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int32)
    if method == "metis":
        return metis_parts(
            graph, parts, seed=seed, balance_edges=balance_edges, edge_fraction=metis_edge_fraction
        )
    if method == "kaminpar":
        check_method_options(method, balance_edges=balance_edges)
        return kaminpar_parts(graph, parts, seed=seed)
    if method == "random":
        return random_parts(graph, parts, seed=seed)
    if method == "parmetis":
        raise InputError(
            "--method parmetis assigns vertices in an MPI job: run distmb-partition under "
            "mpiexec (docs/partitioning-at-scale.md)"
        )
    raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")


def check_method_options(method: str, *, balance_edges: bool) -> None:
    """Reject, before any expensive work, a method that cannot run here or cannot honour
    the options: ``kaminpar`` needs its package and has no in-degree constraint.

    Raises:
        InputError: naming the flag and what to do instead.
    """
    if method != "kaminpar":
        return
    if balance_edges:
        raise InputError(
            "--balance-edges needs --method metis: KaMinPar balances a single vertex weight "
            "(vertices and training vertices), not in-degree as a further constraint"
        )
    import_kaminpar()


def train_mask(graph: Graph) -> np.ndarray:
    """bool[num_nodes]: True for training vertices."""
    mask = np.zeros(graph.num_nodes, dtype=bool)
    mask[graph.train_idx] = True
    return mask


def metis_memory_bytes(graph: Graph, edge_fraction: float, parts: int) -> int:
    """Peak bytes of the process while METIS partitions ``graph`` into ``parts`` parts with
    ``edge_fraction`` of its edges: the process baseline, the graph's arrays held in memory
    (:func:`~distmb.partition.spill.resident_nbytes`: features included unless they are a
    memory map), the symmetrised copy of a directed graph, and
    METIS with its input: :data:`METIS_BYTES_PER_ENTRY` per entry given,
    :data:`METIS_BYTES_PER_VERTEX` per vertex, :data:`METIS_BYTES_PER_NEIGHBOUR_PART` per
    vertex and neighbouring part (``min(parts, sampled average degree)`` of them)."""
    n = graph.num_nodes
    entries = graph.num_edges if graph.symmetric else 2 * graph.num_edges  # at most
    symmetrised = 0 if graph.symmetric else 8 * n + graph.indices.itemsize * entries
    sampled = edge_fraction * entries
    neighbour_parts = min(float(parts), sampled / max(n, 1))
    return int(
        PROCESS_BASELINE_BYTES
        + resident_nbytes(graph)
        + symmetrised
        + n * (METIS_BYTES_PER_VERTEX + METIS_BYTES_PER_NEIGHBOUR_PART * neighbour_parts)
        + METIS_BYTES_PER_ENTRY * sampled
    )


def metis_edge_fraction(graph: Graph, budget_bytes: float, parts: int) -> float:
    """Share of edges METIS can be given so that the process stays within ``budget_bytes``
    (the largest fraction whose :func:`metis_memory_bytes` fits, found by bisection).

    1.0 when the whole graph fits. Below 1, METIS partitions a uniform edge sample (cut
    sparsification: every cut shrinks by the same factor in expectation, so the min-cut
    structure is kept; Karger 1994); the vertex weights, and so the balance, are exact.

    Raises:
        InputError: when even :data:`MIN_METIS_EDGE_FRACTION` of the edges would not fit.
    """
    if metis_memory_bytes(graph, 1.0, parts) <= budget_bytes:
        return 1.0
    need = metis_memory_bytes(graph, MIN_METIS_EDGE_FRACTION, parts)
    if need > budget_bytes:
        raise InputError(
            f"--memory-budget {budget_bytes / 2**30:.1f} GiB: METIS needs at least "
            f"{need / 2**30:.1f} GiB for this graph; raise the budget or use --method kaminpar "
            "or random"
        )
    lo, hi = MIN_METIS_EDGE_FRACTION, 1.0  # memory is increasing in the fraction
    for _ in range(_FRACTION_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if metis_memory_bytes(graph, mid, parts) <= budget_bytes:
            lo = mid
        else:
            hi = mid
    return lo


def metis_parts(
    graph: Graph, parts: int, *, seed: int, balance_edges: bool, edge_fraction: float = 1.0
) -> np.ndarray:
    """METIS k-way partition minimising the edge cut under per-part balance constraints.

    METIS needs a symmetric adjacency without self-loops; a graph loaded with
    ``symmetrize=False`` is symmetrised here for METIS only. With ``edge_fraction < 1``
    METIS sees a uniform sample of the undirected edges (see :func:`metis_edge_fraction`).
    """
    import pymetis

    from distmb import _C

    indptr, indices = undirected_csr(graph)
    if edge_fraction < 1.0:
        indptr, indices = _C.sparsify_symmetric(indptr, indices, edge_fraction, seed)
    else:
        indices = np.array(indices, dtype=np.int64)  # METIS' idx_t (pymetis would copy)
    release_pages(graph)  # METIS has its input: what was read through the maps goes
    constraints = [np.ones(graph.num_nodes, dtype=np.int64)]
    is_train = train_mask(graph)
    if 0 < graph.train_idx.size < graph.num_nodes:
        constraints.append(is_train.astype(np.int64))
    if balance_edges:
        constraints.append(np.maximum(np.diff(graph.indptr), 1))
    vweights = np.stack(constraints, axis=1).reshape(-1)
    options = pymetis.Options()
    options.seed = seed
    options.ufactor = METIS_UFACTOR
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _, membership = pymetis.part_graph(
            parts,
            adjacency=pymetis.CSRAdjacency(indptr, indices),
            vweights=vweights,
            options=options,
        )
    return np.asarray(membership, dtype=np.int32)


def random_parts(graph: Graph, parts: int, *, seed: int) -> np.ndarray:
    """Balanced random assignment (for graphs METIS cannot hold): training and other
    vertices are each dealt round-robin after a seeded shuffle, so both counts differ by at
    most one between parts."""
    rng = np.random.default_rng(seed)
    part_of = np.empty(graph.num_nodes, dtype=np.int32)
    is_train = train_mask(graph)
    offset = 0
    for group in (np.flatnonzero(is_train), np.flatnonzero(~is_train)):
        shuffled = group[rng.permutation(group.size)]
        part_of[shuffled] = (np.arange(group.size) + offset) % parts
        offset += group.size
    return part_of


#: ``neighbour_counts(vertices)`` -> int64[len(vertices), parts]: how many in-neighbours of
#: each of the ascending ``vertices`` lie in each part under the current assignment.
NeighbourCounts = Callable[[np.ndarray], np.ndarray]


def rebalance(
    part_of: np.ndarray,
    parts: int,
    *,
    counted: np.ndarray,
    movable: np.ndarray,
    tolerance: float,
    neighbour_counts: NeighbourCounts,
) -> int:
    """Move vertices from over-full to under-full parts, in place, until no part holds more
    than ``cap = max(ceil(mean), floor(mean * (1 + tolerance)))`` of the ``counted``
    vertices (``mean`` = their average per part).

    Only ``movable`` vertices (a subset of ``counted``, ascending int64 ids) move. Those with
    the most neighbours in the receiving part relative to their own go first (boundary
    vertices, so the edge cut grows least; ``neighbour_counts`` of the candidates, see
    :data:`NeighbourCounts`); ties go to the lower vertex id. Returns how many moved; fewer
    than needed only when an over-full part runs out of movable vertices.
    """
    if counted.size == 0 or parts == 1:
        return 0
    counts = np.bincount(part_of[counted], minlength=parts)
    mean = counted.size / parts
    cap = max(int(np.ceil(mean)), int(np.floor(mean * (1.0 + tolerance))))
    over = [p for p in np.argsort(-counts, kind="stable") if counts[p] > cap]
    moved = 0
    for p in over:
        cand = movable[part_of[movable] == p]
        gain = neighbour_counts(cand)
        gain -= gain[:, [p]]
        used = np.zeros(cand.size, dtype=bool)
        need = int(counts[p] - cap)
        for q in np.argsort(counts, kind="stable"):
            room = int(cap - counts[q])
            if q == p or room <= 0:
                continue
            take = min(room, need, int((~used).sum()))
            if take == 0:
                break
            # Unused first, then highest gain, then lowest vertex id.
            order = np.lexsort((cand, -gain[:, q], used))[:take]
            part_of[cand[order]] = q
            used[order] = True
            counts[q] += take
            counts[p] -= take
            need -= take
            moved += take
    return moved


def rebalance_train_and_vertices(
    graph: Graph,
    part_of: np.ndarray,
    parts: int,
    *,
    train_tolerance: float,
    vertex_tolerance: float,
) -> tuple[int, int]:
    """Balance training vertices (moving training vertices), then all vertices (moving
    only the others, so the training balance holds). Returns the two move counts."""
    return rebalance_assignment(
        part_of,
        parts,
        train_idx=graph.train_idx,
        train_tolerance=train_tolerance,
        vertex_tolerance=vertex_tolerance,
        neighbour_counts=lambda cand: neighbour_part_counts(
            graph.indptr, graph.indices, part_of, cand, parts
        ),
    )


def rebalance_assignment(
    part_of: np.ndarray,
    parts: int,
    *,
    train_idx: np.ndarray,
    train_tolerance: float,
    vertex_tolerance: float,
    neighbour_counts: NeighbourCounts,
) -> tuple[int, int]:
    """:func:`rebalance_train_and_vertices` given only the assignment (int32[num_nodes],
    changed in place), the training vertices and a way to count candidates' neighbour parts
    (the distributed writer gathers them from the ranks holding the in-edges)."""
    is_train = np.zeros(part_of.shape[0], dtype=bool)
    is_train[train_idx] = True
    train = np.flatnonzero(is_train)
    moved_train = rebalance(
        part_of,
        parts,
        counted=train,
        movable=train,
        tolerance=train_tolerance,
        neighbour_counts=neighbour_counts,
    )
    everyone = np.arange(part_of.shape[0], dtype=np.int64)
    moved_other = rebalance(
        part_of,
        parts,
        counted=everyone,
        movable=np.flatnonzero(~is_train),
        tolerance=vertex_tolerance,
        neighbour_counts=neighbour_counts,
    )
    return moved_train, moved_other


def neighbour_part_counts(
    indptr: np.ndarray, indices: np.ndarray, part_of: np.ndarray, vertices: np.ndarray, parts: int
) -> np.ndarray:
    """int64[len(vertices), parts]: how many in-neighbours of each vertex lie in each part.

    Args:
        indptr: int64[num_nodes + 1]; indices: int32|int64[]: an in-edge CSR holding (at
            least) the rows of ``vertices``.

    Counted over blocks of vertices with about :data:`NEIGHBOUR_COUNT_CHUNK` in-edges each,
    so the per-edge temporaries stay bounded whatever the part's size."""
    counts = np.zeros((vertices.size, parts), dtype=np.int64)
    deg = indptr[vertices + 1] - indptr[vertices]
    ends = np.cumsum(deg)
    lo = 0
    while lo < vertices.size:
        done = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, done + NEIGHBOUR_COUNT_CHUNK, side="right")))
        hi = min(hi, vertices.size)
        block_deg = deg[lo:hi]
        row = np.repeat(np.arange(hi - lo, dtype=np.int64), block_deg)
        row *= parts
        row += part_of[indices[csr_row_positions(indptr[vertices[lo:hi]], block_deg)]]
        counts[lo:hi] = np.bincount(row, minlength=(hi - lo) * parts).reshape(hi - lo, parts)
        lo = hi
    return counts
