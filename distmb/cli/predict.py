"""``distmb-predict`` / ``python -m distmb.predict``: the command line of
:func:`distmb.engine.predict.predict` (predictions, logits and hidden embeddings of every
vertex from a training checkpoint; the flags and the output layout: docs/predict.md). Under
an MPI launcher or torchrun every rank predicts its part; else one rank predicts the whole
graph.

Under a launcher, the flags (:func:`~distmb.cli.usage.parse_on_ranks`) and each step of the
prediction's set-up (the checkpoint and ``--out``, the partition, the checkpoint against the
data, the model: :func:`~distmb.cli.usage.agree_on_ranks`, passed as ``predict(agree=...)``)
are agreed on by every rank: an error every rank meets alike is printed once, by rank 0,
one that only some ranks meet by each of them, naming its rank, and every rank exits with
one code, without aborting the job. Errors of the inference itself abort it
(:func:`~distmb.cli.launch.run_on_ranks`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from distmb.config.options import refuse_empty
from distmb.core.errors import exit_on_user_error
from distmb.core.malloc import DEFAULT_MALLOC_POLICY, MALLOC_POLICIES

if TYPE_CHECKING:
    from distmb.comm import RankGroup
    from distmb.engine.predict import Agree

    Ranks = RankGroup

#: The command (messages, ``--help``).
PROG = "distmb.predict"


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m distmb.predict`` (docs/predict.md lists them)."""
    parser = argparse.ArgumentParser(
        prog="python -m distmb.predict",
        description=(
            "Predictions, logits and (--embeddings) hidden embeddings of every vertex from a "
            "training checkpoint, by exact layer-wise inference, in original vertex id order "
            "(.npy files and a predict.json manifest in --out). Under mpirun -np P each rank "
            "predicts its part of --part-dir and rank 0 gathers the rows (or, with "
            "--per-part, each rank writes its own)."
        ),
    )
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="a checkpoint file, or a --checkpoint-dir of distmb.train (its checkpoint.pt)",
    )
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        "--dataset",
        help="dataset spec (as distmb.train's); one rank, the whole graph "
        "(default: the checkpoint's own --dataset or --part-dir)",
    )
    data.add_argument(
        "--part-dir", help="partition directory; under mpirun -np P each rank predicts its part"
    )
    parser.add_argument("--out", required=True, help="output directory (created)")
    parser.add_argument(
        "--embeddings",
        action="store_true",
        help="also write each hidden layer's output (embeddings-layer<k>.npy)",
    )
    parser.add_argument(
        "--per-part",
        action="store_true",
        help="each rank writes its own vertices' rows to OUT/part-<rank>/ with orig_ids.npy, "
        "instead of gathering them to rank 0",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier prediction in --out (its files not written again are removed)",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="destinations per block of the layer-wise inference "
        "(default: the checkpoint's --eval-batch-size)",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        default=None,
        help="threads of PyTorch and the C++ kernels (default: all cores)",
    )
    parser.add_argument(
        "--malloc",
        choices=MALLOC_POLICIES,
        default=DEFAULT_MALLOC_POLICY,
        help="C allocator policy (as distmb.train's --malloc): retain keeps each batch's freed "
        "buffers for the next instead of page-faulting them afresh; system: glibc's defaults",
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="do not hash the partition's files nor scan their features when opening them "
        "(the ids' ranges are still checked)",
    )
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed flags, with every path flag checked non-empty.

    Raises:
        SystemExit: argparse's usage errors and ``--help``.
        InputError: an empty path (``--out ''``), naming the flag.
    """
    args = build_parser().parse_args(argv)
    for flag in ("--checkpoint", "--dataset", "--part-dir", "--out"):
        refuse_empty(flag, getattr(args, flag[2:].replace("-", "_")))
    return args


def _run_cli(argv: list[str] | None, comm: Ranks | None) -> None:
    """Parse ``argv`` and predict: on one rank (``comm`` None), its errors raised; as one
    rank of a launched job, the flags and the set-up agreed on by every rank (module
    docstring)."""
    from distmb.engine.predict import predict, run_step

    agree: Agree = run_step
    if comm is None:
        args = parse_args(argv)
    else:
        from distmb.cli.usage import agree_on, parse_on_ranks

        args = parse_on_ranks(comm, PROG, lambda: parse_args(argv))
        agree = agree_on(comm, PROG)
    predict(
        args.checkpoint,
        dataset=args.dataset,
        part_dir=args.part_dir,
        out=args.out,
        embeddings=args.embeddings,
        per_part=args.per_part,
        overwrite=args.overwrite,
        batch_size=args.batch_size,
        threads=args.threads,
        malloc=args.malloc,
        verify=not args.no_verify,
        comm=comm,
        log=lambda line: print(line, flush=True),
        agree=agree,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point: every rank of an MPI or torchrun job predicts its part; else one rank."""
    from distmb.cli.launch import is_multi_rank_launch, run_on_ranks

    if is_multi_rank_launch():
        return run_on_ranks(PROG, lambda comm: _run_cli(argv, comm))
    return _main_single(argv)


@exit_on_user_error(PROG)
def _main_single(argv: list[str] | None) -> int:
    _run_cli(argv, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
