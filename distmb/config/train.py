"""The configuration of ``python -m distmb.train``: :class:`TrainConfig`, validated, and what
is derived from its option declarations.

The options are declared once, in groups (:mod:`distmb.config.train_options`, with the machinery
of :mod:`distmb.config.options`); :class:`TrainConfig` inherits every group: one flat dataclass,
fields in the order of ``--help``, with typed frozen views per concern
(:mod:`distmb.config.settings`). Derived here:

- :func:`build_parser`: the argparse parser of ``python -m distmb.train``;
- :func:`config_from_args` and :func:`parse_config`: a validated :class:`TrainConfig` from
  the flags (every constraint is checked generically, the relations between options are
  written out in :meth:`TrainConfig.validate`);
- :data:`RESUME_MUST_MATCH` and :data:`RESUME_APPLIED`: the options a checkpoint must share with
  the run resuming it, and those a resume may change;
- :func:`flag_of`: the flag of a field, for messages.

``docs/flags.md`` is written by :mod:`distmb.config.flags_doc`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from distmb.config.constants import (
    DEFAULT_FANOUT,
    DEFAULT_LR,
    DEFAULT_SUPERBATCH,
    DEFAULT_USER_MODEL_LR,
    DESCRIPTION,
    DEVICE_PATTERN,
    GROUP_CUDA,
    MAX_FANOUT,
    PROG,
)
from distmb.config.options import (
    GROUP_MAIN,
    Option,
    check_exclusive,
    make_parser,
    options_of,
    plain_value,
    refuse_outside,
    values_from_args,
)
from distmb.config.settings import (
    CommSettings,
    DeviceSettings,
    ModelSettings,
    OptimizerSettings,
    PipelineSettings,
    view_of,
)
from distmb.config.train_options import (
    DataOptions,
    FeatureOptions,
    GpuPathOptions,
    LoadingOptions,
    ModelOptions,
    MultiRankOptions,
    RunOptions,
    SelectionOptions,
    TrainingOptions,
)
from distmb.core.errors import InputError
from distmb.halo.hec.scheme import HecSettings
from distmb.nn.kernels.dispatch import AUTO_KERNELS, resolve_kernels
from distmb.nn.models import MODELS
from distmb.nn.user import is_model_spec
from distmb.pipeline.features.cached import CACHE_POLICIES

__all__ = [
    "CACHE_POLICIES",
    "DEFAULT_FANOUT",
    "DEFAULT_LR",
    "DEFAULT_SUPERBATCH",
    "GROUP_CUDA",
    "GROUP_MAIN",
    "MODELS",
    "OPTIONS",
    "PROG",
    "RESUME_APPLIED",
    "RESUME_MUST_MATCH",
    "HaloScheme",
    "HecSettings",
    "TrainConfig",
    "build_parser",
    "compile_problem",
    "config_from_args",
    "cuda_graphs_problem",
    "flag_of",
    "parse_config",
    "precision_problem",
]

#: How halo (remote) leaves of a multi-rank mini-batch are handled, see
#: :attr:`TrainConfig.halo_scheme`.
HaloScheme = Literal["hec", "drop", "exact"]


@dataclass(kw_only=True)
class TrainConfig(
    # A dataclass takes its bases' fields last base first: DataOptions' fields lead, as in --help.
    MultiRankOptions,
    GpuPathOptions,
    FeatureOptions,
    LoadingOptions,
    SelectionOptions,
    RunOptions,
    TrainingOptions,
    ModelOptions,
    DataOptions,
):
    """Hyper-parameters and run options: the flags of ``python -m distmb.train``.

    One flat keyword-only dataclass (``TrainConfig(layers=2, fanout=(10, 10))``; checkpoints
    store its fields by name, :meth:`as_dict`) whose fields are declared in groups
    (:mod:`distmb.config.train_options`). Each concern has a frozen view of its fields:
    :attr:`model_settings`, :attr:`optimizer_settings`, :attr:`pipeline`,
    :attr:`device_settings`, :attr:`comm_settings`, :attr:`hec`.

    Built in Python, unset fields take the command line's defaults; ``lr=None`` (the
    default) becomes the model's :data:`DEFAULT_LR` at construction. Every construction is
    validated (:meth:`validate`): an invalid value raises an :class:`InputError` naming its
    flag. Fields assigned later are not re-validated (call :meth:`validate`), and ``lr`` is
    not re-resolved when ``model`` changes.
    """

    def __post_init__(self) -> None:
        if isinstance(self.fanout, list | tuple):
            self.fanout = tuple(plain_value(v) for v in self.fanout)
        for f in fields(self):  # numpy scalars -> Python values (JSON and weights-only loads)
            setattr(self, f.name, plain_value(getattr(self, f.name)))
        if self.lr is None and isinstance(self.model, str):
            self.lr = DEFAULT_LR.get(
                self.model, DEFAULT_USER_MODEL_LR if is_model_spec(self.model) else None
            )  # an unknown model is reported by validate()
        self.validate()

    def validate(self) -> None:
        """Check every option's constraints, then the relations between options.

        Raises:
            InputError: naming the flag, the constraint and the value.
        """
        for opt in OPTIONS:
            opt.check(getattr(self, opt.name))
        _check_fanout(self.fanout, self.layers)
        if self.model not in MODELS and not is_model_spec(self.model):
            raise InputError(
                f"--model must be one of {', '.join(MODELS)} or package.module:Class, "
                f"got {self.model!r}"
            )
        check_exclusive(self, OPTIONS)
        if self.exact_remote and self.no_hec:
            raise InputError(
                "--exact-remote and --no-hec exclude each other (pick one halo scheme)"
            )
        if self.resume and not self.checkpoint_dir:
            raise InputError("--resume needs --checkpoint-dir")
        if self.lr_schedule != "step":
            self._only_with(("lr_step_size", "lr_gamma"), "--lr-schedule step")
        if self.lr_schedule != "cosine":
            self._only_with(("lr_min",), "--lr-schedule cosine")
        elif self.lr is not None and self.lr_min >= self.lr:
            raise InputError(
                f"--lr-min {self.lr_min} must be below --lr {self.lr} (the cosine schedule "
                "decreases the lr from --lr to --lr-min)"
            )
        if self.graph_layout != "ooc":
            self._only_with(("neighbor_cache_mb", "neighbor_cache_order"), "--graph-layout ooc")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise InputError(
                f"--device must be cpu, cuda, cuda:N (a GPU index) or auto, got {self.device!r}"
            )
        if self.device == "cpu" and self.sampler != "device":
            self._only_with(
                tuple(f.name for f in fields(GpuPathOptions)),
                "the GPU path (--device cuda, or --sampler device)",
            )
        if self.device == "cpu":
            problem = precision_problem(self.precision, "cpu")
            if problem:
                raise InputError(problem)
        problem = cuda_graphs_problem(self) if self.cuda_graphs else None
        problem = problem or (compile_problem(self) if self.compile else None)
        if problem:
            raise InputError(problem)
        if self.features in ("memory", "mmap"):
            # --presample-epochs also ranks the device cache's rows (--device-cache-policy).
            device_path = self.device != "cpu" or self.sampler == "device"
            self._only_with(
                ("feature_cache_mb", "cache_policy")
                + (() if device_path else ("presample_epochs",)),
                f"--features ooc, not --features {self.features}",
            )

    def _only_with(self, names: tuple[str, ...], where: str) -> None:
        """Refuse the options ``names`` given (not at their defaults) outside ``where``."""
        refuse_outside(self, [o for o in OPTIONS if o.name in names], where)

    @property
    def model_settings(self) -> ModelSettings:
        """The model's architecture: ``--model``, ``--layers``, ``--hidden``, ``--heads``,
        ``--aggr``, ``--gin-eps``, ``--gin-train-eps``, ``--dropout``."""
        return view_of(ModelSettings, self)

    @property
    def optimizer_settings(self) -> OptimizerSettings:
        """``--lr``, ``--weight-decay``, the ``--lr-schedule`` flags and ``--epochs``."""
        return view_of(OptimizerSettings, self)

    @property
    def pipeline(self) -> PipelineSettings:
        """The mini-batch pipeline: ``--batch-size``, ``--fanout``, the data-loading flags and
        the input-features flags."""
        return view_of(PipelineSettings, self)

    @property
    def device_settings(self) -> DeviceSettings:
        """``--device``, ``--kernels``, ``--precision`` and the GPU path's flags."""
        return view_of(DeviceSettings, self)

    @property
    def comm_settings(self) -> CommSettings:
        """``--comm``, ``--grad-bucket-mb`` and ``--collective-timeout``."""
        return view_of(CommSettings, self)

    @property
    def hec(self) -> HecSettings:
        """The ``--hec-*`` and ``--no-hec`` flags."""
        return HecSettings(
            enabled=not self.no_hec,
            size=self.hec_size,
            nc=self.hec_nc,
            lifespan=self.hec_lifespan,
            delay=self.hec_delay,
        )

    @property
    def halo_scheme(self) -> HaloScheme:
        """``"exact"`` (``--exact-remote``), ``"drop"`` (``--no-hec``) or ``"hec"``."""
        if self.exact_remote:
            return "exact"
        return "drop" if self.no_hec else "hec"

    def as_dict(self) -> dict[str, Any]:
        """Every option by field name (tuples as lists): the JSON record's and the
        checkpoint's ``"args"``."""
        record = {}
        for f in fields(self):
            value = getattr(self, f.name)
            record[f.name] = list(value) if isinstance(value, tuple) else value
        return record


def precision_problem(precision: str, device_type: str) -> str | None:
    """Why ``--precision`` cannot run on a ``device_type`` device
    (``"cpu"`` or ``"cuda"``), or None when it can."""
    if precision == "fp16" and device_type != "cuda":
        return (
            "--precision fp16 needs a GPU (--device cuda): float16 autocast with a gradient "
            "scaler is a CUDA feature; on the CPU use --precision bf16"
        )
    if precision == "tf32" and device_type != "cuda":
        return (
            "--precision tf32 needs a GPU (--device cuda): TF32 is the tensor-core format of "
            "NVIDIA GPUs' float32 matrix products; on the CPU use --precision fp32 or bf16"
        )
    return None


def kernels_text(kernels: str, device: torch.device) -> str:
    """``--kernels kernels`` on ``device`` for messages, with what ``auto`` picks there
    (:func:`~distmb.nn.kernels.dispatch.resolve_kernels`): ``--kernels fused on the CPU``,
    ``--kernels auto, which is --kernels fused on cuda:0``."""
    where = "the CPU" if device.type == "cpu" else str(device)
    resolved = resolve_kernels(kernels, device)
    if resolved == kernels:
        return f"--kernels {kernels} on {where}"
    return f"--kernels {kernels}, which is --kernels {resolved} on {where}"


def cuda_graphs_problem(config: TrainConfig) -> str | None:
    """Why ``--cuda-graphs`` cannot run with the rest of ``config``'s options, or None: every
    rule the options decide, whether or not the flag is on (:meth:`TrainConfig.validate` asks
    when it is; :class:`~distmb.engine.graphed_step.GraphedStep` asks again for a Trainer's
    config, then adds what only the built run knows: its ranks, the sampler it built, a model
    object given in code, the optimizer)."""
    if config.precision == "fp16":
        return (
            "--cuda-graphs with --precision fp16: the gradient scaler skips steps and updates "
            "its scale on the host, which a replayed graph cannot do; use --precision bf16"
        )
    if config.sampler == "cpp":
        return "--cuda-graphs needs the device path's sampler (--sampler device or auto), not cpp"
    if any(f < 1 for f in config.fanout):
        return (
            f"--cuda-graphs with --fanout {','.join(map(str, config.fanout))}: a layer of all "
            "neighbours (-1) has no size bound, so its blocks cannot be padded to one shape"
        )
    if config.model not in MODELS:
        return (
            f"--cuda-graphs with --model {config.model}: the built-in models only (the padded "
            "blocks are checked against their layers)"
        )
    return None


def compile_problem(config: TrainConfig, device: torch.device | None = None) -> str | None:
    """Why ``--compile`` cannot run with the rest of ``config``'s options on ``device``, or
    None (:meth:`TrainConfig.validate` asks when the flag is on, before the device is known;
    :func:`distmb.engine.device.check_kernels` asks again on the training device;
    :mod:`distmb.engine.compiled` adds what only the built run knows: its ranks, a model
    object given in code).

    Args:
        device: the training device; None: ``--device``'s, where it names one (``auto`` does
            not: ``--kernels auto`` is then checked once the device is known).
    """
    if config.cuda_graphs:
        return (
            "--compile with --cuda-graphs: pick one (the graphed step replays eager kernels "
            "over padded buffers; a compiled forward would be captured in it untested)"
        )
    if device is None and config.device != "auto":
        device = torch.device(config.device)
    if device is not None:
        kernels = resolve_kernels(config.kernels, device)
        given = kernels_text(config.kernels, device)
    else:  # --device auto: --kernels auto is checked on the device, once it is known
        kernels, given = config.kernels, f"--kernels {config.kernels}"
    if kernels not in ("triton", AUTO_KERNELS):
        return (
            f"--compile with {given}: the Triton layers only (their nodes are custom operators "
            "the compiler traces; the fused C++ kernels and the PyTorch-ops aggregation's "
            "sparse CSR product break the graph); add --kernels triton"
        )
    if config.precision in ("bf16", "fp16"):
        return (
            f"--compile with --precision {config.precision}: under autocast the layers take "
            "the PyTorch-ops path, which does not trace; use --precision fp32 or tf32"
        )
    if config.model not in MODELS:
        return (
            f"--compile with --model {config.model}: the built-in models only (their Triton "
            "layers are the operators the compiler traces)"
        )
    return None


def _check_fanout(fanout: tuple[int, ...], layers: int) -> None:
    """One fan-out per layer, each >= 1 or -1 (all neighbours)."""
    text = ",".join(map(str, fanout))
    if len(fanout) != layers:
        raise InputError(
            f"--fanout {text!r} lists {len(fanout)} values but --layers is {layers}; "
            "give one fan-out per layer"
        )
    if any(f == 0 or f < -1 for f in fanout):
        raise InputError(f"--fanout {text!r}: each value must be >= 1 (or -1 for all)")
    if any(f > MAX_FANOUT for f in fanout):
        raise InputError(
            f"--fanout {text!r}: each value must be <= {MAX_FANOUT} (or -1 for all neighbours)"
        )


#: Every option, in the order of ``--help``.
OPTIONS: tuple[Option, ...] = options_of(TrainConfig)
#: Options a checkpoint must share with the run that resumes it (they shape the model or
#: the sampled data).
RESUME_MUST_MATCH: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.spec.resume_must_match)
#: Options a resume may change: the new value is applied and logged.
RESUME_APPLIED: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.spec.resume_applied)

_FLAGS: dict[str, str] = {o.name: o.flag for o in OPTIONS}


def flag_of(name: str) -> str:
    """The command-line flag of the option (field) ``name``, e.g. ``batch_size`` ->
    ``--batch-size``, ``progress`` -> ``--no-progress``.

    Raises:
        KeyError: ``name`` is not an option.
    """
    return _FLAGS[name]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m distmb.train``: one flag per option of :data:`OPTIONS`."""
    return make_parser(PROG, DESCRIPTION, OPTIONS)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Validate the parsed flags and turn them into a :class:`TrainConfig`.

    Args:
        args: the namespace of :func:`build_parser`.

    Raises:
        InputError: naming the flag and what was expected.
    """
    return TrainConfig(**values_from_args(OPTIONS, args))


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse and validate the flags of ``python -m distmb.train``.

    Args:
        argv: the arguments after the program name; ``None``: ``sys.argv[1:]``.

    Raises:
        SystemExit: argparse's errors (unknown flag, bad type or choice) and ``--help``.
        InputError: a value outside its constraints, or options that do not fit together.
    """
    return config_from_args(build_parser().parse_args(argv))
