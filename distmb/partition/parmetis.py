"""A ctypes binding of ``ParMETIS_V3_PartKway`` (ParMETIS 4, or a library with its interface
such as PT-Scotch's ``libptscotchparmetisv3``), called with mpi4py's communicator.

The library is not a dependency of distmb: it must be built against the same MPI library as
mpi4py (docs/partitioning-at-scale.md). It is found through the environment:

- ``DISTMB_PARMETIS_LIB``: path of ``libparmetis.so`` (else ``ctypes.util.find_library``).
  Libraries it needs from its own directory (``libmetis.so``) are loaded from there first.
- the width of ``idx_t`` is probed: ``METIS_SetDefaultOptions`` (ParMETIS links METIS) fills
  :data:`METIS_NOPTIONS` entries of -1, whose byte count gives the width; else
  ``SCOTCH_numSizeof()``; else ``DISTMB_PARMETIS_IDX_BITS`` (32 or 64) must say it.
- the width of ``real_t`` cannot be probed: ``DISTMB_PARMETIS_REAL_BITS`` (default 32, the
  ParMETIS and METIS default ``REALTYPEWIDTH``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distmb.core.errors import InputError

LIB_ENV = "DISTMB_PARMETIS_LIB"
IDX_BITS_ENV = "DISTMB_PARMETIS_IDX_BITS"
REAL_BITS_ENV = "DISTMB_PARMETIS_REAL_BITS"
#: Entries METIS_SetDefaultOptions writes (METIS 5: METIS_NOPTIONS in metis.h).
METIS_NOPTIONS = 40
#: ParMETIS return codes (metis.h's rstatus_et).
METIS_OK = 1
#: ``wgtflag``: vertex weights given, no edge weights.
WGTFLAG_VERTEX_WEIGHTS = 2
#: ``options``: [use the options that follow, debug level, random seed].
_OPTIONS_GIVEN, _DEBUG_LEVEL = 1, 0
#: Libraries a ParMETIS build loads from its own directory when the loader cannot find them.
_SIBLINGS = ("libGKlib.so", "libmetis.so")

_INSTALL_HINT = (
    f"set {LIB_ENV} to a libparmetis.so (ParMETIS 4) or PT-Scotch's libptscotchparmetisv3.so "
    "built against the MPI library of mpi4py (docs/partitioning-at-scale.md)"
)


@dataclass
class ParMetis:
    """The loaded library and its integer and real types."""

    path: str
    lib: Any
    idx: np.dtype
    real: np.dtype

    def part_kway(
        self,
        comm: Any,
        vtxdist: np.ndarray,
        xadj: np.ndarray,
        adjncy: np.ndarray,
        vwgt: np.ndarray,
        nparts: int,
        imbalance: float,
        seed: int,
    ) -> tuple[int, np.ndarray]:
        """``ParMETIS_V3_PartKway`` on this rank's rows of the distributed graph.

        Args:
            comm: an mpi4py communicator (its C handle is passed).
            vtxdist: int[ranks + 1], rank r owns vertices ``[vtxdist[r], vtxdist[r+1])``.
            xadj: int[n_local + 1]; adjncy: int[xadj[-1]] global neighbour ids (symmetric
                graph, no self-loops).
            vwgt: int[n_local, ncon] vertex weights (one column per balance constraint).
            nparts: number of parts; imbalance: allowed max/mean per constraint (e.g. 1.05).

        Returns:
            (edge cut, int64[n_local] part of every local vertex).
        """
        idx, real = self.idx, self.real
        ncon = int(vwgt.shape[1])
        arrays = [np.ascontiguousarray(a, dtype=idx) for a in (vtxdist, xadj, adjncy, vwgt)]
        tpwgts = np.full(ncon * nparts, 1.0 / nparts, dtype=real)
        ubvec = np.full(ncon, imbalance, dtype=real)
        options = np.array([_OPTIONS_GIVEN, _DEBUG_LEVEL, seed], dtype=idx)
        scalars = {
            name: np.array([value], dtype=idx)
            for name, value in (
                ("wgtflag", WGTFLAG_VERTEX_WEIGHTS),
                ("numflag", 0),
                ("ncon", ncon),
                ("nparts", nparts),
                ("edgecut", 0),
            )
        }
        part = np.zeros(xadj.shape[0] - 1, dtype=idx)
        handle = comm_handle(comm)
        status = self.lib.ParMETIS_V3_PartKway(
            *(a.ctypes.data for a in arrays[:4]),
            None,  # adjwgt
            scalars["wgtflag"].ctypes.data,
            scalars["numflag"].ctypes.data,
            scalars["ncon"].ctypes.data,
            scalars["nparts"].ctypes.data,
            tpwgts.ctypes.data,
            ubvec.ctypes.data,
            options.ctypes.data,
            scalars["edgecut"].ctypes.data,
            part.ctypes.data,
            ctypes.byref(handle),
        )
        if status != METIS_OK:
            raise RuntimeError(f"{self.path}: ParMETIS_V3_PartKway returned {status}")
        return int(scalars["edgecut"][0]), part.astype(np.int64)


def comm_handle(comm: Any) -> ctypes.c_int | ctypes.c_void_p:
    """The C ``MPI_Comm`` of an mpi4py communicator (an int in MPICH, a pointer in Open MPI)."""
    from mpi4py import MPI

    kind = ctypes.c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(ctypes.c_int) else ctypes.c_void_p
    return kind.from_address(MPI._addressof(comm))


def find_library() -> str:
    """The ParMETIS library's path; :class:`InputError` saying how to give one."""
    path = os.environ.get(LIB_ENV)
    if path:
        if not Path(path).is_file():
            raise InputError(f"{LIB_ENV}={path}: no such file; {_INSTALL_HINT}")
        return path
    found = ctypes.util.find_library("parmetis")
    if found is None:
        raise InputError(f"no ParMETIS library found; {_INSTALL_HINT}")
    return found


def load(path: str | None = None) -> ParMetis:
    """Load the library (:func:`find_library` by default) and find its ``idx_t``/``real_t``."""
    path = path or find_library()
    try:
        lib = _dlopen(path)
        function = lib.ParMETIS_V3_PartKway
    except (OSError, AttributeError) as exc:
        raise InputError(
            f"{path}: not a usable ParMETIS library ({exc}); {_INSTALL_HINT}"
        ) from None
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 15
    return ParMetis(path=path, lib=lib, idx=_idx_dtype(lib, path), real=_real_dtype())


def _dlopen(path: str) -> ctypes.CDLL:
    """``path`` loaded globally; on a missing dependency, its siblings are loaded first."""
    try:
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        directory = Path(path).parent
        for name in _SIBLINGS:
            if (directory / name).is_file():
                ctypes.CDLL(str(directory / name), mode=ctypes.RTLD_GLOBAL)
        return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _idx_dtype(lib: ctypes.CDLL, path: str) -> np.dtype:
    """The width of ``idx_t``: probed, or from :data:`IDX_BITS_ENV`."""
    given = os.environ.get(IDX_BITS_ENV)
    if given:
        if given not in ("32", "64"):
            raise InputError(f"{IDX_BITS_ENV}={given}: expected 32 or 64")
        return np.dtype(np.int32 if given == "32" else np.int64)
    set_defaults = getattr(lib, "METIS_SetDefaultOptions", None)
    if set_defaults is not None:
        sentinel = 0x5A
        buf = np.full(METIS_NOPTIONS * 8, sentinel, dtype=np.uint8)
        set_defaults.restype = ctypes.c_int
        set_defaults.argtypes = [ctypes.c_void_p]
        set_defaults(buf.ctypes.data)
        written = int(np.argmax(buf == sentinel)) if (buf == sentinel).any() else buf.size
        if written == METIS_NOPTIONS * 4:
            return np.dtype(np.int32)
        if written == METIS_NOPTIONS * 8:
            return np.dtype(np.int64)
    num_sizeof = getattr(lib, "SCOTCH_numSizeof", None)
    if num_sizeof is not None:
        num_sizeof.restype = ctypes.c_int
        size = int(num_sizeof())
        if size in (4, 8):
            return np.dtype(np.int32 if size == 4 else np.int64)
    raise InputError(f"{path}: cannot tell the width of idx_t; set {IDX_BITS_ENV}=32 or 64")


def _real_dtype() -> np.dtype:
    given = os.environ.get(REAL_BITS_ENV, "32")
    if given not in ("32", "64"):
        raise InputError(f"{REAL_BITS_ENV}={given}: expected 32 or 64")
    return np.dtype(np.float32 if given == "32" else np.float64)
