"""``--device`` and ``--sampler``: which device a run trains on and whether it takes the
device path.

The *device path* (the "GPU path" of docs/cuda.md and of the messages) is the data path of
the PyTorch-ops sampler (:class:`~distmb.pipeline.sample.device.DeviceNeighborSampler`), the
device feature cache over host rows (:class:`~distmb.pipeline.features.device.DeviceFeatures`;
with ``--features ooc`` over the out-of-core host cache,
:class:`~distmb.pipeline.features.tiered.TieredFeatures`), optionally Match-Reorder, and the
model in PyTorch ops on the device. It is taken with ``--device cuda`` (``--sampler auto`` or
``device``), and on the CPU with ``--sampler device``: the same code on CPU tensors, which is
how CI trains through it without a GPU.

:func:`training_device` is the one place a run's device is resolved and checked.
"""

from __future__ import annotations

import os

import torch

from distmb.config.train import GROUP_CUDA, OPTIONS, TrainConfig, compile_problem
from distmb.core.errors import InputError
from distmb.core.host_reads import count_device_wait

#: How to get a CUDA build of torch (the README's "GPU nodes" section).
CUDA_BUILD_HINT = (
    "on a GPU node install torch's CUDA build (PyPI's Linux torch wheels are CUDA builds: "
    "make TORCH_SPEC=torch==2.13.0 where pip reaches PyPI; README, 'GPU nodes')"
)


def resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """The ``torch.device`` of ``--device`` ``spec`` (``cpu``, ``cuda``, ``cuda:N``, ``auto``).

    ``cuda`` (and ``auto`` on a GPU node) without an index takes GPU ``local_rank % count``
    of the GPUs this process sees: one rank per GPU when a node runs as many ranks as it has
    GPUs, several ranks per GPU when it runs more (testing), and GPU 0 when the launcher shows
    each rank its own GPU only (``CUDA_VISIBLE_DEVICES``, Slurm's ``--gpus-per-task``).
    ``cuda:N`` is GPU N on every rank.

    Args:
        spec: the flag's value.
        local_rank: this rank's index among the ranks on its node
            (:meth:`distmb.comm.RankGroup.local_rank`).

    Raises:
        InputError: ``cuda`` where torch sees no GPU (a CPU build, no driver, hidden
            devices), or a GPU index it does not have.
    """
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(spec)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        build = torch.version.cuda
        why = (
            f"this torch ({torch.__version__}) is a CPU build"
            if build is None
            else f"torch {torch.__version__} (CUDA {build}) sees no GPU (driver, "
            "CUDA_VISIBLE_DEVICES)"
        )
        raise InputError(f"--device {spec}: {why}; {CUDA_BUILD_HINT}")
    count = torch.cuda.device_count()
    index = local_rank % count if device.index is None else device.index
    if index >= count:
        raise InputError(f"--device {spec}: torch sees {count} GPU(s), indices 0 to {count - 1}")
    return torch.device("cuda", index)


def training_device(config: TrainConfig, local_rank: int = 0) -> torch.device:
    """The device a rank trains on (:func:`resolve_device` of ``--device``), checked against
    the run's other flags (:func:`check_device`).

    Args:
        local_rank: this rank's index among the ranks on its node
            (:meth:`distmb.comm.RankGroup.local_rank`).

    Raises:
        InputError: an unusable ``--device``, or flags that do not fit it.
    """
    device = resolve_device(config.device, local_rank)
    check_device(config, device)
    return device


def check_device(config: TrainConfig, device: torch.device) -> None:
    """Refuse the flags that do not fit training on ``device``: :func:`check_device_path`
    and :func:`check_kernels`.

    Raises:
        InputError: naming the flags.
    """
    check_device_path(config, device)
    check_kernels(config, device)


def uses_device_path(config: TrainConfig, device: torch.device) -> bool:
    """Whether the run takes the device path (the "GPU path"): a CUDA device with
    ``--sampler`` auto or device, or ``--sampler device`` on the CPU."""
    if config.sampler == "device":
        return True
    return device.type == "cuda" and config.sampler == "auto"


def check_device_path(config: TrainConfig, device: torch.device) -> None:
    """Refuse the combinations the device path does not support (yet), naming the flags.

    Raises:
        InputError: the GPU options outside the device path, ``--sampler cpp`` on a GPU,
            an out-of-core graph with the device path (out-of-core features are served:
            :class:`~distmb.pipeline.features.tiered.TieredFeatures`), ``--match-reorder``
            with ``--exact-remote``. Any number of ranks
            may take the path (one GPU each, or sharing GPUs; docs/cuda.md "Several GPUs").
    """
    device_path = uses_device_path(config, device)
    if device.type == "cuda" and config.sampler == "cpp":
        raise InputError(
            f"--device {config.device} --sampler cpp: the C++ sampler's blocks are host "
            "tensors; on a GPU use --sampler auto or device"
        )
    if not device_path:
        given = [
            o.flag
            for o in OPTIONS
            if o.spec.group == GROUP_CUDA and getattr(config, o.name) != o.default
        ]
        if given:
            raise InputError(
                f"{', '.join(given)} apply only to the GPU path (--device cuda, or --sampler "
                f"device); this run uses --device {device} with the C++ sampler"
            )
        return
    if config.graph_layout == "ooc":
        raise InputError(
            "--graph-layout ooc with the GPU path: the GPU sampler reads the CSR from device "
            "or pinned host memory (--graph-placement); use --graph-layout mmap"
        )
    if config.match_reorder and config.exact_remote:
        raise InputError(
            "--match-reorder with --exact-remote: the exact baseline fetches block 0's rows "
            "from their owners by VID_o, not through this rank's device cache, so there is "
            "nothing to reorder for; drop one of the two flags"
        )


def check_kernels(config: TrainConfig, device: torch.device) -> None:
    """Refuse ``--kernels`` where it cannot run on ``device``: ``triton`` where its kernels
    cannot (``auto`` picks Triton only where they can:
    :func:`~distmb.nn.kernels.dispatch.resolve_kernels`), and ``--compile`` with kernels that
    resolve to anything but ``triton`` there (:func:`~distmb.config.train.compile_problem`;
    the options alone cannot tell for ``--kernels auto`` before the device is known).

    Raises:
        InputError: Triton not installed, or a CPU device outside Triton's interpreter;
            ``--compile`` without the Triton layers on ``device``.
    """
    if config.kernels == "triton":
        from distmb.pipeline.sample.idmap_triton import usable

        ok, why = usable(device)
        if not ok:
            raise InputError(f"--kernels triton with --device {config.device}: {why}")
    problem = compile_problem(config, device) if config.compile else None
    if problem:
        raise InputError(problem)


def gpu_identity(device: torch.device) -> str:
    """Which physical GPU ``device`` is, the same string in every process that sees it
    (its UUID; with CUDA_VISIBLE_DEVICES, index 0 of two ranks may be two GPUs)."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        return str(uuid)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return f"{visible}:{device.index}"


def shares_gpu(identities: list[tuple[str, str]]) -> bool:
    """Whether two ranks train on one GPU, given every rank's ``(host, gpu_identity)``."""
    return len(set(identities)) < len(identities)


def check_comm_launch(spec: str, launcher: str) -> None:
    """Refuse ``--comm mpi`` in a job that was not started by an MPI launcher (torchrun).

    Args:
        spec: ``--comm``'s value.
        launcher: :attr:`distmb.comm.RankGroup.launcher` (``mpi`` or ``torchrun``).

    Raises:
        InputError: naming the flag, the launcher and the alternatives.
    """
    if spec == "mpi" and launcher != "mpi":
        raise InputError(
            f"--comm mpi: this job was started by {launcher}, without MPI; use --comm torch "
            "(or auto), or start it with mpiexec / srun to use MPI"
        )


def resolve_comm(
    spec: str, device: torch.device, shared_gpu: bool = False, launcher: str = "mpi"
) -> str:
    """The collectives' library of ``--comm`` ``spec`` on ``device``: ``auto`` is ``torch`` on
    a GPU (NCCL moves device tensors without a host copy) and ``mpi`` on the CPU, and ``mpi``
    when ranks share a GPU (NCCL refuses two ranks of one group on one GPU). Without MPI
    (``launcher`` torchrun) it is always ``torch``.

    Args:
        shared_gpu: whether some GPU trains more than one rank (:func:`shares_gpu`).
        launcher: what started the ranks (:attr:`distmb.comm.RankGroup.launcher`).

    Raises:
        InputError: ``--comm mpi`` without MPI (:func:`check_comm_launch`), or
            ``torch.distributed`` on GPUs shared by several ranks.
    """
    check_comm_launch(spec, launcher)
    if device.type == "cuda" and shared_gpu:
        if spec == "torch" or launcher != "mpi":
            raise InputError(
                f"--comm {spec}: several ranks train on one GPU, and NCCL allows one rank "
                "per GPU in a group; use one rank per GPU, or share GPUs in a job started by "
                "mpiexec / srun with --comm mpi (or auto)"
            )
        return "mpi"
    if launcher != "mpi":
        return "torch"
    if spec != "auto":
        return spec
    return "torch" if device.type == "cuda" else "mpi"


def torch_backend(device: torch.device) -> str:
    """The ``torch.distributed`` backend for tensors on ``device``: NCCL on a GPU, gloo on the
    CPU (:data:`~distmb.comm.TORCH_CPU_BACKEND`)."""
    from distmb.comm import TORCH_CPU_BACKEND, TORCH_CUDA_BACKEND

    return TORCH_CUDA_BACKEND if device.type == "cuda" else TORCH_CPU_BACKEND


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA): the phase timers' one wait per epoch, after
    which they read their CUDA events (:meth:`~distmb.engine.timers.PhaseTimer.resolve`);
    nothing on the CPU. Every call is counted (:func:`~distmb.core.host_reads.count_device_wait`),
    on the CPU too: the count is the proxy of a GPU run's waits."""
    count_device_wait()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
