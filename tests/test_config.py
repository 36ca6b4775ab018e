"""distmb.config: one declaration per option, and the parser, defaults, validation,
checkpoint list, per-concern views and docs table derived from it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import typing
from pathlib import Path

import pytest

from distmb.config.flags_doc import flag_table_markdown, main
from distmb.config.options import (
    check_exclusive,
    make_parser,
    option,
    option_group,
    options_of,
    refuse_outside,
    values_from_args,
)
from distmb.config.train import (
    DEFAULT_LR,
    OPTIONS,
    RESUME_APPLIED,
    RESUME_MUST_MATCH,
    HecSettings,
    TrainConfig,
    build_parser,
    config_from_args,
    parse_config,
)
from distmb.core.errors import InputError

DOCS = Path(__file__).resolve().parents[1] / "docs" / "flags.md"

#: Every flag of ``python -m distmb.train`` and the TrainConfig field it sets, written out
#: independently of the declarations.
FLAG_FIELDS = {
    "--dataset": "dataset",
    "--part-dir": "part_dir",
    "--model": "model",
    "--layers": "layers",
    "--hidden": "hidden",
    "--heads": "heads",
    "--fanout": "fanout",
    "--gin-eps": "gin_eps",
    "--gin-train-eps": "gin_train_eps",
    "--aggr": "aggr",
    "--batch-size": "batch_size",
    "--lr": "lr",
    "--weight-decay": "weight_decay",
    "--dropout": "dropout",
    "--epochs": "epochs",
    "--seed": "seed",
    "--threads": "threads",
    "--malloc": "malloc",
    "--device": "device",
    "--eval-every": "eval_every",
    "--eval-batch-size": "eval_batch_size",
    "--checkpoint-dir": "checkpoint_dir",
    "--resume": "resume",
    "--overwrite-checkpoint": "overwrite_checkpoint",
    "--results": "results",
    "--no-progress": "progress",
    "--progress-every": "progress_every",
    "--tensorboard": "tensorboard",
    "--no-verify": "verify",
    "--kernels": "kernels",
    "--precision": "precision",
    "--early-stop": "early_stop",
    "--lr-schedule": "lr_schedule",
    "--lr-step-size": "lr_step_size",
    "--lr-gamma": "lr_gamma",
    "--lr-min": "lr_min",
    "--normalize-features": "normalize_features",
    "--prefetch": "prefetch",
    "--no-gather-in-place": "gather_in_place",
    "--sampler": "sampler",
    "--loader-threads": "loader_threads",
    "--features": "features",
    "--feature-cache-mb": "feature_cache_mb",
    "--cache-policy": "cache_policy",
    "--superbatch": "superbatch",
    "--presample-epochs": "presample_epochs",
    "--graph-layout": "graph_layout",
    "--neighbor-cache-mb": "neighbor_cache_mb",
    "--neighbor-cache-order": "neighbor_cache_order",
    "--graph-placement": "graph_placement",
    "--device-cache-mb": "device_cache_mb",
    "--device-cache-policy": "device_cache_policy",
    "--feature-dtype": "feature_dtype",
    "--match-reorder": "match_reorder",
    "--cuda-graphs": "cuda_graphs",
    "--compile": "compile",
    "--hec-size": "hec_size",
    "--hec-nc": "hec_nc",
    "--hec-lifespan": "hec_lifespan",
    "--hec-delay": "hec_delay",
    "--no-hec": "no_hec",
    "--exact-remote": "exact_remote",
    "--partition-cache": "partition_cache",
    "--comm": "comm",
    "--grad-bucket-mb": "grad_bucket_mb",
    "--collective-timeout": "collective_timeout",
}

#: A value each constrained flag must refuse, and the message naming it.
BAD_VALUES = [
    ("--layers", "0", "--layers must be >= 1, got 0"),
    ("--hidden", "0", "--hidden must be >= 1, got 0"),
    ("--heads", "0", "--heads must be >= 1, got 0"),
    ("--batch-size", "-5", "--batch-size must be >= 1, got -5"),
    ("--lr", "0", "--lr must be > 0, got 0.0"),
    ("--lr", "nan", "--lr must be > 0, got nan"),
    ("--weight-decay", "-0.1", "--weight-decay must be >= 0, got -0.1"),
    ("--dropout", "1.0", "--dropout must be in [0, 1), got 1.0"),
    ("--dropout", "-0.5", "--dropout must be in [0, 1), got -0.5"),
    ("--epochs", "0", "--epochs must be >= 1, got 0"),
    ("--threads", "0", "--threads must be in [1, 4096], got 0"),
    ("--seed", "-1", "--seed must be in [0, 9223372036854775807], got -1"),
    ("--eval-every", "0", "--eval-every must be >= 1, got 0"),
    ("--eval-batch-size", "0", "--eval-batch-size must be >= 1, got 0"),
    ("--aggr", "max", "--aggr must be one of mean, sum, gcn, got 'max'"),
    ("--early-stop", "-1", "--early-stop must be >= 0, got -1"),
    ("--lr-step-size", "0", "--lr-step-size must be >= 1, got 0"),
    ("--lr-gamma", "1.5", "--lr-gamma must be in (0, 1], got 1.5"),
    ("--lr-min", "-1", "--lr-min must be >= 0, got -1.0"),
    ("--prefetch", "-1", "--prefetch must be >= 0, got -1"),
    ("--loader-threads", "0", "--loader-threads must be in [1, 4096], got 0"),
    ("--collective-timeout", "-1", "--collective-timeout must be >= 0, got -1.0"),
    ("--grad-bucket-mb", "-1", "--grad-bucket-mb must be >= 0, got -1.0"),
    ("--feature-cache-mb", "-1", "--feature-cache-mb must be >= 0, got -1.0"),
    ("--progress-every", "-1", "--progress-every must be >= 0, got -1.0"),
    ("--superbatch", "0", "--superbatch must be >= 1, got 0"),
    ("--presample-epochs", "0", "--presample-epochs must be >= 1, got 0"),
    ("--device-cache-mb", "-1", "--device-cache-mb must be >= 0, got -1.0"),
    ("--neighbor-cache-mb", "-1", "--neighbor-cache-mb must be >= 0, got -1.0"),
    ("--hec-size", "0", "--hec-size must be >= 1, got 0"),
    ("--hec-nc", "0", "--hec-nc must be >= 1, got 0"),
    ("--hec-lifespan", "-1", "--hec-lifespan must be >= 0, got -1"),
    ("--hec-delay", "0", "--hec-delay must be >= 1, got 0"),
]


#: Fields a probe of ``test_every_flag_maps_to_one_field_and_back`` changes beside its own.
ALSO_CHANGED = {
    "--resume": {"checkpoint_dir"},
    "--layers": {"fanout"},
    "--model": {"lr"},
    "--precision": {"kernels"},
    "--neighbor-cache-mb": {"graph_layout"},
    "--neighbor-cache-order": {"graph_layout"},
    "--lr-step-size": {"lr_schedule"},
    "--lr-gamma": {"lr_schedule"},
    "--lr-min": {"lr_schedule"},
    # The GPU path's options apply with --sampler device (or --device cuda).
    "--graph-placement": {"sampler"},
    "--device-cache-mb": {"sampler"},
    "--device-cache-policy": {"sampler"},
    "--match-reorder": {"sampler"},
    "--cuda-graphs": {"sampler"},
    "--compile": {"sampler", "kernels"},
}


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def test_every_flag_maps_to_one_field_and_back():
    parser = build_parser()
    flags = [s for a in _actions(parser) for s in a.option_strings]
    assert sorted(flags) == sorted(FLAG_FIELDS)  # one spelling per flag, no more, no fewer
    field_names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert sorted(field_names) == sorted(FLAG_FIELDS.values())
    assert {o.flag: o.name for o in OPTIONS} == FLAG_FIELDS
    # Each flag sets its own field: a non-default value for it changes that field only.
    default = TrainConfig().as_dict()
    probes = {
        "--dataset": ["cora"],
        "--part-dir": ["parts"],
        "--model": ["gat"],
        "--fanout": ["1,2,3"],
        "--aggr": ["sum"],
        "--lr": ["0.5"],
        "--weight-decay": ["0.1"],
        "--dropout": ["0.25"],
        "--threads": ["3"],
        "--malloc": ["system"],
        "--loader-threads": ["3"],
        "--checkpoint-dir": ["ck"],
        "--resume": ["--checkpoint-dir", "ck"],
        "--layers": ["1", "--fanout", "4"],
        "--results": ["r.jsonl"],
        "--tensorboard": ["tb"],
        "--kernels": ["torch"],
        "--precision": ["bf16", "--kernels", "torch"],
        "--partition-cache": ["pc"],
        "--features": ["memory"],
        "--cache-policy": ["lru"],
        "--graph-layout": ["ooc"],
        "--neighbor-cache-mb": ["5", "--graph-layout", "ooc"],
        "--neighbor-cache-order": ["ratio", "--graph-layout", "ooc"],
        "--lr-schedule": ["cosine"],
        "--lr-step-size": ["5", "--lr-schedule", "step"],
        "--lr-gamma": ["0.5", "--lr-schedule", "step"],
        "--lr-min": ["0.001", "--lr-schedule", "cosine"],
        "--normalize-features": ["row"],
        "--device-cache-policy": ["degree", "--sampler", "device"],
        "--device-cache-mb": ["10", "--sampler", "device"],
        "--feature-dtype": ["float16"],
        "--graph-placement": ["host", "--sampler", "device"],
        "--match-reorder": ["--sampler", "device"],
        "--cuda-graphs": ["--sampler", "device"],
        "--compile": ["--sampler", "device", "--kernels", "triton"],
        "--device": ["auto"],
        "--sampler": ["device"],
        "--comm": ["torch"],
        "--grad-bucket-mb": ["0"],
    }
    for flag, name in FLAG_FIELDS.items():
        action = next(a for a in _actions(parser) if flag in a.option_strings)
        if flag in probes:
            value = probes[flag]
        else:  # a flag, or a number
            value = [] if action.nargs == 0 else [str(action.default + 7)]
        changed = {k for k, v in parse_config([flag, *value]).as_dict().items() if v != default[k]}
        assert changed == {name} | ALSO_CHANGED.get(flag, set()), flag


def test_parser_shape():
    parser = build_parser()
    assert parser.prog == "python -m distmb.train"
    assert parser.formatter_class is argparse.ArgumentDefaultsHelpFormatter
    titles = [g.title for g in parser._action_groups]
    assert titles[-4:] == [
        "data loading",
        "input features: in memory, memory-mapped or out of core",
        "GPU path (--device cuda; or --sampler device on the CPU): graph placement, device "
        "feature cache, Match-Reorder",
        "multi-rank (mpirun -np P): historical embedding cache",
    ]
    [exclusive] = parser._mutually_exclusive_groups
    assert [a.dest for a in exclusive._group_actions] == ["dataset", "part_dir"]
    help_text = parser.format_help()
    assert "--prefetch PREFETCH" in help_text and "(default: 2)" in help_text


def test_cli_defaults_equal_dataclass_defaults():
    assert parse_config([]) == TrainConfig()
    assert config_from_args(build_parser().parse_args([])) == TrainConfig()
    expected = dict(
        dataset=None, verify=True, part_dir=None, model="sage", layers=3, hidden=256, heads=4,
        fanout=(5, 10, 15), gin_eps=0.0, gin_train_eps=False, aggr="mean", batch_size=1000,
        lr=0.003, weight_decay=0.0,
        dropout=0.5, epochs=40, seed=0, threads=None, malloc="retain", eval_every=1,
        eval_batch_size=4096,
        checkpoint_dir=None, resume=False, overwrite_checkpoint=False, results=None,
        progress=True, progress_every=10.0, tensorboard=None, kernels="auto", precision="fp32",
        early_stop=0,
        lr_schedule="none", lr_step_size=10, lr_gamma=0.1, lr_min=0.0, normalize_features="none",
        prefetch=2, gather_in_place=True, loader_threads=None, features=None,
        feature_cache_mb=1024.0,
        cache_policy="belady", superbatch=32, presample_epochs=1, graph_layout="mmap",
        neighbor_cache_mb=256.0, neighbor_cache_order="degree", device="cpu", sampler="auto",
        graph_placement="device", device_cache_mb=4096.0,
        device_cache_policy="presc", feature_dtype="float32", match_reorder=False,
        cuda_graphs=False, compile=False, hec_size=1_000_000,
        hec_nc=2000, hec_lifespan=2, hec_delay=1,
        no_hec=False, exact_remote=False, partition_cache=".cache/distmb-parts",
        comm="auto", grad_bucket_mb=0.25, collective_timeout=300.0,
    )  # fmt: skip
    assert dataclasses.asdict(TrainConfig()) == expected


def test_python_construction_keeps_working():
    cfg = TrainConfig(layers=2, fanout=(4, 4), hidden=16, batch_size=100, epochs=3, progress=False)
    assert (cfg.layers, cfg.fanout, cfg.lr, cfg.prefetch) == (2, (4, 4), 0.003, 2)
    assert TrainConfig(layers=2, fanout=[4, 4]).fanout == (4, 4)
    with pytest.raises(TypeError):
        TrainConfig("sage")  # keyword-only: fields are ordered as in --help
    with pytest.raises(InputError, match="--layers must be an integer, got '3'"):
        TrainConfig(layers="3")
    with pytest.raises(
        InputError, match="--model must be one of sage, gat, gcn, gin or package.module:Class"
    ):
        TrainConfig(model="gcnii")


@pytest.mark.parametrize(("flag", "value", "message"), BAD_VALUES)
def test_constraint_rejects_bad_value(flag, value, message):
    with pytest.raises(InputError) as info:
        parse_config([f"{flag}={value}"])
    assert str(info.value) == message


def test_every_constrained_option_is_tested():
    constrained = {
        o.flag
        for o in OPTIONS
        if o.spec.min is not None or o.spec.max is not None or o.spec.allowed is not None
    }
    assert constrained == {flag for flag, _, _ in BAD_VALUES}


@pytest.mark.parametrize(
    ("argv", "ok"),
    [
        (["--prefetch", "0"], True),
        (["--hec-lifespan", "0"], True),
        (["--dropout", "0"], True),
        (["--weight-decay", "0"], True),
        (["--lr", "1e-9"], True),
        (["--weight-decay", "nan"], False),
        (["--dropout", "nan"], False),
    ],
)
def test_bounds(argv, ok):
    if ok:
        parse_config(argv)
    else:
        with pytest.raises(InputError, match=argv[0]):
            parse_config(argv)


def test_no_progress_inverts_progress():
    assert parse_config([]).progress is True
    assert parse_config(["--no-progress"]).progress is False
    assert build_parser().parse_args(["--no-progress"]).no_progress is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "2", "--fanout", "5,10,15"], "lists 3 values but --layers is 2"),
        (["--fanout", "5,x,15"], "--fanout '5,x,15': expected comma-separated integers"),
        (["--fanout", ""], "expected comma-separated integers"),
        (["--fanout", "5,0,15"], "--fanout '5,0,15': each value must be >= 1 (or -1 for all)"),
        (["--fanout=5,-2,15"], "each value must be >= 1 (or -1 for all)"),
        (["--layers", "2"], "--fanout '5,10,15' lists 3 values but --layers is 2"),
    ],
)
def test_fanout_errors(argv, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(argv)


def test_fanout_all_neighbours():
    assert parse_config(["--layers", "2", "--fanout=-1,5"]).fanout == (-1, 5)


def test_lr_default_per_model():
    assert DEFAULT_LR == {"sage": 0.003, "gat": 0.001, "gcn": 0.003, "gin": 0.003}
    assert parse_config([]).lr == 0.003
    assert parse_config(["--model", "gat"]).lr == 0.001
    assert parse_config(["--model", "gat", "--lr", "0.02"]).lr == 0.02
    assert TrainConfig(model="gat").lr == 0.001
    assert TrainConfig(model="gat", lr=0.5).lr == 0.5
    assert TrainConfig(model="gat").as_dict()["lr"] == 0.001
    assert TrainConfig(model="my.models:Net").lr == 0.003  # a user's model
    assert TrainConfig(model="my.models:Net", lr=0.1).lr == 0.1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--exact-remote", "--no-hec"], "--exact-remote and --no-hec exclude each other"),
        (["--resume"], "--resume needs --checkpoint-dir"),
    ],
)
def test_relations(argv, message):
    with pytest.raises(InputError, match=message):
        parse_config(argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["--match-reorder"],
        ["--cuda-graphs"],
        ["--compile", "--kernels", "triton"],
        ["--device-cache-mb", "10", "--device-cache-policy", "degree"],
    ],
)
def test_gpu_path_options_stop_a_cpu_run(argv):
    with pytest.raises(InputError, match=r"appl(y|ies) only to the GPU path \(--device cuda"):
        parse_config(argv)
    with pytest.raises(SystemExit):  # the trainer refuses them before loading anything
        from distmb.cli.train import main_single

        main_single([*argv, "--epochs", "1", "--no-progress"])
    parse_config([*argv, "--sampler", "device"])  # the GPU path on the CPU takes them


def test_dataset_and_part_dir_exclude_each_other():
    with pytest.raises(SystemExit):  # argparse: "not allowed with argument --dataset"
        parse_config(["--dataset", "cora", "--part-dir", "p"])
    with pytest.raises(InputError, match="--dataset and --part-dir exclude each other"):
        TrainConfig(dataset="cora", part_dir="p")


def test_unknown_choice_is_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        parse_config(["--kernels", "cuda"])
    assert info.value.code == 2 and "invalid choice: 'cuda'" in capsys.readouterr().err


def test_resume_must_match():
    assert RESUME_MUST_MATCH == (
        "model", "layers", "hidden", "heads", "fanout", "gin_eps", "gin_train_eps", "aggr",
        "batch_size", "dropout", "seed", "lr_schedule", "lr_step_size", "lr_gamma", "lr_min",
        "normalize_features", "hec_size", "hec_lifespan",
    )  # fmt: skip
    assert RESUME_APPLIED == (
        "lr", "weight_decay", "kernels", "precision", "hec_nc", "hec_delay",
        "collective_timeout",
    )  # fmt: skip


def test_hec_view_and_halo_scheme():
    assert TrainConfig().hec == HecSettings(
        enabled=True, size=1_000_000, nc=2000, lifespan=2, delay=1
    )
    hec = parse_config(["--hec-size", "7", "--hec-nc", "3", "--hec-lifespan", "0"]).hec
    assert (hec.size, hec.nc, hec.lifespan, hec.delay) == (7, 3, 0, 1)
    assert parse_config(["--no-hec"]).hec.enabled is False
    assert TrainConfig().halo_scheme == "hec"
    assert parse_config(["--no-hec"]).halo_scheme == "drop"
    assert parse_config(["--exact-remote"]).halo_scheme == "exact"
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainConfig().hec.size = 1  # type: ignore[misc]


def test_as_dict_is_json_with_lists():
    record = parse_config(["--model", "gat", "--layers", "2", "--fanout", "4,4"]).as_dict()
    assert record["fanout"] == [4, 4] and record["lr"] == 0.001
    assert set(record) == set(FLAG_FIELDS.values())
    assert json.loads(json.dumps(record)) == record


def test_help_texts_agree_with_their_lists():
    from distmb.nn import AGGREGATORS, MODELS

    help_of = {o.name: o.spec.help for o in OPTIONS}
    assert help_of["aggr"] == "GraphSAGE aggregator: " + ", ".join(AGGREGATORS[:-1]) + (
        f" or {AGGREGATORS[-1]}"
    )
    assert set(MODELS) == set(DEFAULT_LR)
    assert all(f"{lr} for {m}" in help_of["lr"] for m, lr in DEFAULT_LR.items())


def test_docs_flag_table_is_up_to_date():
    assert DOCS.read_text() == flag_table_markdown(), (
        "docs/flags.md is stale: run python -m distmb.config --markdown > docs/flags.md"
    )


def test_flag_table_lists_every_flag_once():
    table = flag_table_markdown()
    assert "python -m distmb.config --markdown > docs/flags.md" in table.splitlines()[2]
    rows = [line for line in table.splitlines() if line.startswith("| `--")]
    assert sorted(row.split("`")[1] for row in rows) == sorted(FLAG_FIELDS)
    assert all(row.count(" | ") == 3 for row in rows)  # '|' inside help is escaped


def test_main_markdown(capsys):
    assert main(["--markdown"]) == 0
    assert capsys.readouterr().out == flag_table_markdown()
    with pytest.raises(SystemExit):
        main([])


def test_nan_is_refused_everywhere():
    for name in ("lr", "dropout", "weight_decay"):
        with pytest.raises(InputError):
            TrainConfig(**{name: math.nan})


#: The fields of each per-concern view, written out independently of the declarations.
VIEW_FIELDS = {
    "model_settings": (
        "model", "layers", "hidden", "heads", "aggr", "gin_eps", "gin_train_eps", "dropout",
    ),
    "optimizer_settings": (
        "lr", "weight_decay", "lr_schedule", "lr_step_size", "lr_gamma", "lr_min", "epochs",
    ),
    "pipeline": (
        "batch_size", "fanout", "prefetch", "gather_in_place", "sampler", "loader_threads",
        "features", "feature_cache_mb", "cache_policy", "superbatch", "presample_epochs",
        "graph_layout", "neighbor_cache_mb", "neighbor_cache_order", "feature_dtype",
    ),
    "device_settings": (
        "device", "kernels", "precision", "graph_placement", "device_cache_mb",
        "device_cache_policy", "match_reorder",
    ),
    "comm_settings": ("comm", "grad_bucket_mb", "collective_timeout"),
}  # fmt: skip

#: Two valid configurations that together set every field of every view off its default.
_NON_DEFAULT = dict(
    model="gat", layers=2, hidden=8, heads=2, aggr="sum", gin_eps=0.5, gin_train_eps=True,
    dropout=0.25, weight_decay=0.1, epochs=7, batch_size=50, fanout=(3, 4), prefetch=0,
    gather_in_place=False, sampler="device", loader_threads=2, features="ooc",
    feature_cache_mb=10.0, cache_policy="lru", superbatch=4, presample_epochs=2,
    graph_layout="ooc", neighbor_cache_mb=5.0, neighbor_cache_order="ratio", device="auto",
    kernels="torch", precision="bf16", graph_placement="host", device_cache_mb=10.0,
    device_cache_policy="degree", feature_dtype="bfloat16", match_reorder=True, comm="torch",
    grad_bucket_mb=0.0, collective_timeout=60.0,
)  # fmt: skip
VIEW_PROBES = [
    TrainConfig(**_NON_DEFAULT, lr=0.02, lr_schedule="cosine", lr_min=0.001),
    TrainConfig(**_NON_DEFAULT, lr_schedule="step", lr_step_size=3, lr_gamma=0.5),
]


@pytest.mark.parametrize("view", sorted(VIEW_FIELDS))
def test_view_fields_equal_the_flat_fields(view):
    default = TrainConfig()
    names = VIEW_FIELDS[view]
    for config in VIEW_PROBES:
        settings = getattr(config, view)
        assert dataclasses.asdict(settings) == {n: getattr(config, n) for n in names}
        assert [f.name for f in dataclasses.fields(settings)] == list(names)
    # The probes are not the defaults: a view returning defaults or another field would fail.
    assert all(any(getattr(c, n) != getattr(default, n) for c in VIEW_PROBES) for n in names)


@pytest.mark.parametrize("view", sorted(VIEW_FIELDS))
def test_view_is_frozen_and_read_afresh(view):
    config = dataclasses.replace(VIEW_PROBES[0])
    settings = getattr(config, view)
    name = VIEW_FIELDS[view][0]
    given, default = getattr(config, name), getattr(TrainConfig(), name)
    assert given != default
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settings, name, default)
    setattr(config, name, default)  # the view is a snapshot, taken on read
    assert getattr(getattr(config, view), name) == default
    assert getattr(settings, name) == given


@pytest.mark.parametrize("view", sorted(VIEW_FIELDS))
def test_view_field_types_are_the_flat_types(view):
    flat = typing.get_type_hints(TrainConfig)
    hints = typing.get_type_hints(type(getattr(TrainConfig(), view)))
    for name in VIEW_FIELDS[view]:
        if name == "lr":  # resolved at construction: the model's default when not given
            assert (hints[name], flat[name]) == (float, float | None)
        else:
            assert hints[name] == flat[name], name


def test_fields_are_declared_in_groups_in_help_order():
    from distmb.config import train_options as groups

    declared = [
        (groups.DataOptions, "options"),
        (groups.ModelOptions, "options"),
        (groups.TrainingOptions, "options"),
        (groups.RunOptions, "options"),
        (groups.SelectionOptions, "model selection"),
        (groups.LoadingOptions, "data loading"),
        (groups.FeatureOptions, "input features"),
        (groups.GpuPathOptions, "GPU path"),
        (groups.MultiRankOptions, "multi-rank"),
    ]
    names = [f.name for cls, _ in declared for f in dataclasses.fields(cls)]
    assert names == [f.name for f in dataclasses.fields(TrainConfig)]  # flat, in --help order
    group_of = {o.name: o.spec.group for o in OPTIONS}
    for cls, title in declared:
        assert all(group_of[f.name].startswith(title) for f in dataclasses.fields(cls)), cls


def test_option_machinery_on_a_small_dataclass():
    @option_group("extra")
    class Demo:
        count: int = option(1, "how many", min=1, max=9)
        name: str | None = option(None, "a name", exclusive="who")
        label: str | None = option(None, "a label", exclusive="who")
        quiet: bool = option(True, "say more", flag="--verbose", inverted=True)

    options = options_of(Demo)
    assert [(o.flag, o.spec.group) for o in options] == [
        ("--count", "extra"), ("--name", "extra"), ("--label", "extra"), ("--verbose", "extra"),
    ]  # fmt: skip
    parser = make_parser("demo", "a demo", options)
    args = parser.parse_args(["--count", "3", "--verbose", "--name", "n"])
    assert values_from_args(options, args) == dict(count=3, name="n", label=None, quiet=False)
    with pytest.raises(SystemExit):  # argparse's mutually exclusive group
        parser.parse_args(["--name", "n", "--label", "l"])
    with pytest.raises(InputError, match="^--name and --label exclude each other$"):
        check_exclusive(Demo(name="n", label="l"), options)
    check_exclusive(Demo(name="n"), options)
    with pytest.raises(InputError, match="^--count applies only to runs with a name$"):
        refuse_outside(Demo(count=2), options, "runs with a name")
    with pytest.raises(InputError, match="^--count, --verbose apply only to x$"):
        refuse_outside(Demo(count=2, quiet=False), options, "x")
    refuse_outside(Demo(), options, "x")
    with pytest.raises(InputError, match=r"^--count must be in \[1, 9\], got 10$"):
        options[0].check(10)


def test_options_of_refuses_what_it_cannot_parse():
    @dataclasses.dataclass
    class Undeclared:
        count: int = 1

    @dataclasses.dataclass
    class FlagOnByDefault:
        on: bool = option(True, "on")

    @dataclasses.dataclass
    class ListOption:
        values: list = option(None, "values")

    for cls, message in [
        (Undeclared, "Undeclared.count is not declared with option()"),
        (FlagOnByDefault, "FlagOnByDefault.on: a flag's default must be False"),
        (ListOption, "ListOption.values: unsupported option type"),
    ]:
        with pytest.raises(TypeError, match=re.escape(message)):
            options_of(cls)


#: Every float flag, written out independently of the declarations: none gives infinity a
#: meaning, so each refuses inf and nan.
FLOAT_FLAGS = (
    "--gin-eps", "--lr", "--weight-decay", "--dropout", "--progress-every", "--lr-gamma",
    "--lr-min", "--feature-cache-mb", "--neighbor-cache-mb", "--device-cache-mb",
    "--grad-bucket-mb", "--collective-timeout",
)  # fmt: skip


@pytest.mark.parametrize("flag", FLOAT_FLAGS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_float_flags_must_be_finite(flag, value):
    assert {o.flag for o in OPTIONS if o.type is float} == set(FLOAT_FLAGS)
    with pytest.raises(InputError, match=f"^{re.escape(flag)} must be ") as exc:
        parse_config([f"{flag}={value}"])
    assert str(float(value)) in str(exc.value)
    name = FLAG_FIELDS[flag]
    with pytest.raises(InputError, match=f"^{re.escape(flag)} must be "):
        TrainConfig(**{name: float(value)})  # built in Python too


def test_lr_inf_names_finiteness():
    with pytest.raises(InputError, match=r"^--lr must be a finite number, got inf$"):
        parse_config(["--lr", "inf"])
    with pytest.raises(InputError, match=r"^--weight-decay must be a finite number, got inf$"):
        parse_config(["--weight-decay", "inf"])


def test_infinity_is_accepted_only_where_declared():
    @option_group()
    class Limits:
        timeout: float = option(0.0, "seconds (inf = no limit)", min=0, infinite_means="no limit")
        ratio: float = option(0.5, "a ratio", min=0)

    timeout, ratio = options_of(Limits)
    timeout.check(math.inf)
    with pytest.raises(InputError, match=r"^--timeout must be >= 0, got nan$"):
        timeout.check(math.nan)
    with pytest.raises(InputError, match=r"^--ratio must be a finite number, got inf$"):
        ratio.check(math.inf)


#: Every flag that takes a path or a spec (a string without fixed choices), written out.
STRING_FLAGS = (
    "--dataset", "--part-dir", "--model", "--device", "--checkpoint-dir", "--results",
    "--tensorboard", "--partition-cache",
)  # fmt: skip


@pytest.mark.parametrize("flag", STRING_FLAGS)
def test_empty_strings_are_refused(flag):
    free = {o.flag for o in OPTIONS if o.type is str and o.allowed_values() is None}
    assert free == set(STRING_FLAGS)
    with pytest.raises(InputError, match=f"^{re.escape(flag)} must "):
        parse_config([flag, ""])
    with pytest.raises(InputError, match=f"^{re.escape(flag)} must "):
        TrainConfig(**{FLAG_FIELDS[flag]: ""})


@pytest.mark.parametrize("flag", ["--dataset", "--results", "--checkpoint-dir", "--part-dir"])
def test_empty_path_message_names_the_flag(flag):
    with pytest.raises(InputError) as exc:
        parse_config([flag, ""])
    assert str(exc.value) == f"{flag} must not be empty (give a value, or leave the flag out)"


def test_predict_refuses_empty_paths(capsys):
    from distmb.cli.predict import main as predict_main

    for argv in (["--checkpoint", "", "--out", "o"], ["--checkpoint", "c", "--out", ""]):
        with pytest.raises(SystemExit) as exc:
            predict_main(argv)
        assert exc.value.code == 2
        flag = argv[0] if argv[1] == "" else argv[2]
        assert f"{flag} must not be empty" in capsys.readouterr().err
