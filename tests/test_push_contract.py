"""The embedding-push contract (``tests/mpi_scripts/push_contract.py``) on both transports,
the MPI one and the torch.distributed one (gloo), under a real ``mpiexec -n 2`` and ``-n 3``
(one job per rank count checks both, at two queue depths each)."""

from __future__ import annotations

import subprocess

import pytest
from test_distributed import SCRIPTS, mpirun

#: The transports checked (the script's names) and the queue depths it checks.
TRANSPORTS = ["mpi", "torch"]
DELAYS = [1, 2]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda ranks: f"{ranks}ranks")
def push_job(request) -> tuple[int, subprocess.CompletedProcess]:
    """One job of ``ranks`` ranks that checks both transports (run once per count)."""
    argv = [str(SCRIPTS / "push_contract.py"), "cpu", *TRANSPORTS]
    return request.param, mpirun(request.param, argv, 180)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_transport_holds_the_contract(push_job, transport: str) -> None:
    ranks, proc = push_job
    for delay in DELAYS:
        line = f"push contract holds: {transport}, delay {delay}, on {ranks} ranks"
        assert line in proc.stdout, proc.stderr[-3000:]
