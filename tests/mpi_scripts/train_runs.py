"""Several ``python -m distmb.train`` runs in one process (one launch), one after the other:
under ``mpiexec -n P`` (P ranks, one MPI launch for all the runs) or alone (one rank).

A run that stops with a :class:`~distmb.core.errors.DistmbError` (a refused configuration)
is recorded and the next one starts: the error is raised on every rank alike, by the flag
checks, or by a set-up step that all ranks agree on (``UsageExit``, which carries the
message that rank 0 printed). Anything else fails the launch.

Each run ends as ``python -m distmb.train`` ends (:func:`~distmb.cli.launch.run_on_ranks`):
its torch.distributed group, if any, is torn down, so the next run starts without one. Rank 0
prints ``run NAME: {...}`` after each run, after its own lines of that run (:data:`END_OF_RUN`;
``tests/test_distributed.py``'s ``launch_runs`` splits the output there).

argv: RUNS_JSON. The file holds a list of ``{"name": str, "argv": [str, ...]}``; rank 0
writes ``{name: {"ok": bool, "error": str | None}}`` to ``RUNS_JSON`` + ``.status``, where
``error`` is what the user would see on stderr (``distmb.train: error: ...``).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from distmb.cli.launch import is_multi_rank_launch, launch_communicator
from distmb.cli.train import build_parser, main_single, run_distributed
from distmb.cli.usage import UsageExit
from distmb.core.errors import DistmbError

#: The prefix of a refused run's line on stderr (``exit_on_user_error``).
PROG = "distmb.train"
#: The line rank 0 prints after each run (``.format(name=..., status=...)``).
END_OF_RUN = "run {name}: {status}"

runs_file = sys.argv[1]
with open(runs_file) as f:
    runs = json.load(f)

comm = launch_communicator() if is_multi_rank_launch() else None
status: dict[str, dict] = {}
for run in runs:
    if comm is not None:
        try:
            run_distributed(build_parser().parse_args(run["argv"]), comm)
            status[run["name"]] = {"ok": True, "error": None}
        except DistmbError as exc:
            status[run["name"]] = {"ok": False, "error": f"{PROG}: error: {exc}"}
        except UsageExit as exc:  # a set-up step refused on every rank (already printed)
            if exc.message is None:
                raise
            status[run["name"]] = {"ok": False, "error": f"{PROG}: error: {exc.message}"}
        comm.close_torch_distributed()
        comm.barrier()
    else:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                main_single(run["argv"])
            status[run["name"]] = {"ok": True, "error": None}
        except SystemExit as exc:
            if exc.code in (0, None):
                raise
            status[run["name"]] = {"ok": False, "error": err.getvalue().strip()}
    if comm is None or comm.rank == 0:
        print(END_OF_RUN.format(name=run["name"], status=status[run["name"]]), flush=True)

if comm is None or comm.rank == 0:
    with open(runs_file + ".status", "w") as f:
        json.dump(status, f)
