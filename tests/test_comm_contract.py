"""The :class:`~distmb.comm.RankGroup` contract (``tests/mpi_scripts/comm_contract.py``) on
every implementation: :class:`~distmb.comm.SingleProcess` in this process; ``MpiGroup``,
``MpiGroup`` with ``--comm torch``'s group, and ``TorchGroup`` under a real ``mpiexec -n 2``
and ``-n 3`` (one job per rank count checks all three, one after the other)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import torch
from mpi_scripts.comm_contract import check_contract
from test_distributed import SCRIPTS, mpirun

from distmb.comm import SingleProcess

#: The implementations checked under mpiexec (the script's names).
IMPLEMENTATIONS = ["mpi", "mpi-torch", "torch"]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda ranks: f"{ranks}ranks")
def contract_job(request) -> tuple[int, subprocess.CompletedProcess]:
    """One job of ``ranks`` ranks that checks every implementation (run once per count)."""
    argv = [str(SCRIPTS / "comm_contract.py"), *IMPLEMENTATIONS]
    return request.param, mpirun(request.param, argv, 180)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_group_holds_the_contract(contract_job, impl: str) -> None:
    ranks, proc = contract_job
    assert f"contract holds: {impl} on {ranks} ranks" in proc.stdout, proc.stderr[-3000:]


def test_single_process_holds_the_contract() -> None:
    check_contract(SingleProcess())


def test_single_process_has_no_peers() -> None:
    """What one rank cannot do is refused, not silently ignored."""
    group = SingleProcess()
    with pytest.raises(ValueError, match="no rank 1"):
        group.bcast("x", root=1)
    with pytest.raises(ValueError, match="no peer"):
        group._send_host(np.zeros(2), dest=0, tag=0)
    with pytest.raises(ValueError, match=r"counts \[2\] for 3 rows"):
        group.alltoallv(np.array([2]), np.zeros(3))
    with pytest.raises(ValueError, match="receives"):
        group.alltoallv(np.array([3]), torch.zeros(3), recv_counts=np.array([1]))
    with pytest.raises(SystemExit):
        group.abort(3)
