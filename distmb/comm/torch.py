"""The workers of ``torchrun``, without MPI: :class:`TorchGroup`; and the setup of a
``torch.distributed`` process group every group uses (:func:`init_process_group`).

A gloo group from ``env://`` carries the small collectives, the gathering of outputs and, on
the CPU, the bulk operations; on a GPU the bulk operations go over an NCCL group on device
tensors.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from distmb.comm.group import TORCH_CPU_BACKEND, RankGroup, host_tensor
from distmb.comm.mpienv import local_rank_from_env
from distmb.comm.watchdog import TORCHRUN_TIMEOUT_S

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def init_process_group(**kwargs: Any) -> None:
    """``torch.distributed.init_process_group(**kwargs)``, after importing the torch module
    whose functions take the default group as a default argument
    (``torch.distributed.nn.functional``: ``group=group.WORLD``, read when it is imported).

    Imported after the group exists (torch's optimizers import it through ``torch._dynamo``),
    those defaults keep the group alive past ``destroy_process_group``: its gloo worker
    threads then outlive the interpreter, and one that frees a finished collective holding
    Python tensors during finalization aborts the process at exit ("terminate called
    without an active exception"). Imported first, the defaults hold no group.
    """
    import torch.distributed as dist
    import torch.distributed.nn.functional  # noqa: F401 (imported for its defaults)

    dist.init_process_group(**kwargs)


class TorchGroup(RankGroup):
    """The workers of ``torchrun`` (``python -m torch.distributed.run``), without MPI.

    A gloo process group from ``env://`` (torchrun's ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``) is made at once: :attr:`host_group`, which carries the
    small collectives (host tensors, Python objects), the gathering of outputs and, until
    :meth:`use_torch_distributed` picks NCCL on a GPU, the bulk operations too
    (:attr:`torch_group` is the same group on the CPU).

    A failing rank ends its process (:meth:`abort`); torchrun's agent sees the exit and
    stops the other workers. There is no collective watchdog (it heartbeats over MPI): a
    rank that stops without dying fails its peers' collectives after
    :data:`TORCHRUN_TIMEOUT_S`.

    Raises:
        RuntimeError: torch.distributed is unavailable.
    """

    launcher = "torchrun"

    def __init__(self, timeout_s: float = TORCHRUN_TIMEOUT_S) -> None:
        import torch.distributed as dist

        if not dist.is_available():
            raise RuntimeError("torchrun: this torch build has no torch.distributed")
        init_process_group(
            backend=TORCH_CPU_BACKEND,
            init_method="env://",
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        super().__init__(dist.get_rank(), dist.get_world_size())
        #: The gloo group of every rank (host tensors).
        self.host_group: ProcessGroup | None = dist.group.WORLD
        self.torch_group = self.host_group

    def local_rank(self) -> int:
        """``LOCAL_RANK`` (torchrun sets it; :func:`distmb.comm.mpienv.local_rank_from_env`),
        else this rank's index among the ranks on its host (a collective of every rank)."""
        if self._local_rank is None:
            found = local_rank_from_env()
            if found is None:
                hosts = self.allgather(socket.gethostname())
                found = hosts[: self.rank].count(hosts[self.rank])
            self._local_rank = found
        return self._local_rank

    def use_torch_distributed(
        self, backend: str = TORCH_CPU_BACKEND, device: torch.device | str = "cpu"
    ) -> None:
        """The bulk operations over ``backend`` on ``device``: the gloo group itself on the
        CPU, a new NCCL group of every rank on a GPU (set the rank's GPU with
        ``torch.cuda.set_device`` first).

        Raises:
            RuntimeError: a second group was asked for.
        """
        import torch.distributed as dist

        if self.torch_group is not self.host_group:
            raise RuntimeError("--comm torch: a torch.distributed group is already set up")
        if backend != TORCH_CPU_BACKEND:
            with self.watched("torch.distributed rendezvous"):
                self.torch_group = dist.new_group(backend=backend)
        self.torch_device = torch.device(device)

    def close_torch_distributed(self) -> None:
        super().close_torch_distributed()  # destroys the NCCL group and the gloo group
        self.host_group = None

    # -- small collectives -----------------------------------------------------------------
    def _reduce_scalar(self, value: float, op) -> float:
        import torch.distributed as dist

        exact = isinstance(value, int | np.integer)
        tensor = torch.tensor([value], dtype=torch.int64 if exact else torch.float64)
        dist.all_reduce(tensor, op=op, group=self.host_group)
        return int(tensor.item()) if exact else float(tensor.item())

    def allreduce_max(self, value: float) -> float:
        import torch.distributed as dist

        with self.watched("allreduce (max)"):
            return self._reduce_scalar(value, dist.ReduceOp.MAX)

    def allreduce_min(self, value: float) -> float:
        import torch.distributed as dist

        with self.watched("allreduce (min)"):
            return self._reduce_scalar(value, dist.ReduceOp.MIN)

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        import torch.distributed as dist

        tensor = torch.from_numpy(np.array(values, copy=True))
        with self.watched("allreduce (sum)"):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.host_group)
        return tensor.numpy()

    def allgather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        with self.watched("allgather"):
            dist.all_gather_object(out, obj, group=self.host_group)
        return out

    def bcast(self, obj: Any, root: int = 0) -> Any:
        import torch.distributed as dist

        box = [obj]
        with self.watched("bcast"):
            dist.broadcast_object_list(box, src=root, group=self.host_group)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist

        with self.watched("barrier"):
            dist.barrier(group=self.host_group)

    def abort(self, code: int) -> None:
        """End this process at once with ``code`` (after flushing what it wrote): torchrun's
        agent sees a worker fail and stops the others. No teardown: a collective still in
        flight would wait for the peers."""
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _send_host(self, array: np.ndarray, dest: int, tag: int) -> None:
        import torch.distributed as dist

        dist.send(host_tensor(array), dst=dest, group=self.host_group, tag=tag)

    def _recv_host(self, array: np.ndarray, source: int, tag: int) -> None:
        import torch.distributed as dist

        dist.recv(torch.from_numpy(array), src=source, group=self.host_group, tag=tag)
