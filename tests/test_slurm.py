"""The SLURM templates (slurm/*.sbatch): valid bash, and the commands they would run, checked
by running each template's body with stub ``srun``, ``module`` and ``distmb-partition`` on
PATH (a fresh environment: no ``$SCRATCH``, as on sites that do not set it)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from distmb.cli.partition import build_parser as partition_parser
from distmb.config.train import parse_config

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = sorted((ROOT / "slurm").glob("*.sbatch"))

#: What ``srun --mpi=list`` prints on a site with PMI-2 and PMIx (Slurm 23.x).
MPI_LIST = "MPI plugin types are...\n\tcray_shasta\n\tnone\n\tpmi2\n\tpmix\n"


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


@pytest.fixture
def site(tmp_path: Path) -> dict:
    """A fake site: stubs that log their arguments (one call per line, shell-quoted), a venv
    whose activate script puts its bin/ on PATH, and a HOME; returns the environment."""
    bin_dir, venv, home = tmp_path / "bin", tmp_path / "venv", tmp_path / "home"
    for d in (bin_dir, venv / "bin", home):
        d.mkdir(parents=True)
    log = tmp_path / "calls.log"
    record = f'printf "%s %s\\n" "$(basename "$0")" "$(printf "%q " "$@")" >> {log}\n'
    _stub(bin_dir / "module", record)
    # Like a real srun, it writes the list line by line: a template reading it through
    # "| grep -q" under pipefail then fails whenever grep stops before srun has finished.
    mpi_list = (
        'if [ "$1" = "--mpi=list" ]; then\n'
        '  while IFS= read -r l; do echo "$l"; sleep 0.05; done <<<"$(printf "$SRUN_MPI_LIST")"\n'
        "  exit 0\n"
        "fi\n"
    )
    _stub(bin_dir / "srun", mpi_list + record)
    _stub(venv / "bin" / "distmb-partition", record)
    (venv / "bin" / "activate").write_text(f'PATH="{venv / "bin"}:$PATH"\n')
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(home),
        "VENV": str(venv),
        "SLURM_CPUS_PER_TASK": "36",
        "SRUN_MPI_LIST": MPI_LIST,
    }
    return {"env": env, "log": log, "home": home}


def _run(template: str, site: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "slurm" / template)],
        env={**site["env"], **extra},
        capture_output=True,
        text=True,
        timeout=30,
    )


def _calls(site: dict) -> list[list[str]]:
    """Every stub call, as ``[command, arg, ...]``."""
    return [shlex.split(line) for line in site["log"].read_text().splitlines()]


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_template_is_valid_bash_with_the_site_lines(template: Path):
    subprocess.run(["bash", "-n", str(template)], check=True)
    text = template.read_text()
    for line in ("--mem=", "--account=", "--partition=", "--time=", "module load"):
        assert line in text, f"{template.name} lacks {line}"
    assert "set -u" not in text and "set -euo" not in text  # unset $SCRATCH must not kill it
    assert "DISTMB_MARCH" in text and "-march=native" in text  # the login-node build warning


def test_train_template_runs_srun_with_pmix_and_resumes(site):
    done = _run("train.sbatch", site)
    assert done.returncode == 0, done.stderr
    calls = _calls(site)
    assert calls[0] == ["module", "load", "mpi"]
    (srun,) = [c for c in calls if c[0] == "srun"]
    i = srun.index("python")
    assert srun[1:i] == ["--mpi=pmix", "--cpu-bind=sockets", "--kill-on-bad-exit=1"]
    assert srun[i : i + 3] == ["python", "-m", "distmb.train"]
    config = parse_config(srun[i + 3 :])  # every flag exists and the values are valid
    home = site["home"]
    assert config.part_dir == f"{home}/distmb-parts/products-16"  # $SCRATCH unset: $HOME
    assert config.checkpoint_dir == f"{home}/distmb-ckpt/products-16"
    assert (config.threads, config.epochs, config.resume) == (36, 20, False)
    assert Path(config.checkpoint_dir).is_dir() and Path(config.results).parent.is_dir()

    # Re-submitted with a checkpoint in place, more flags and another plugin: --resume.
    (Path(config.checkpoint_dir) / "checkpoint.pt").write_bytes(b"")
    site["log"].unlink()
    done = _run(
        "train.sbatch", site, SCRATCH="/scratch/me", EXTRA_ARGS="--no-hec --lr 0.006",
        SRUN_MPI="pmi2", CKPT_DIR=config.checkpoint_dir, MODULES="gcc/12 openmpi/4.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = _calls(site)
    assert calls[0] == ["module", "load", "gcc/12", "openmpi/4.1"]
    srun = calls[1]
    assert srun[1] == "--mpi=pmi2"
    config = parse_config(srun[srun.index("python") + 3 :])
    assert config.part_dir == "/scratch/me/distmb-parts/products-16"
    assert (config.resume, config.no_hec, config.lr) == (True, True, 0.006)


def test_train_template_names_the_fix_when_srun_lacks_the_plugin(site):
    done = _run("train.sbatch", site, SRUN_MPI_LIST="MPI plugin types are...\n\tnone\n")
    assert done.returncode == 2
    assert "srun has no MPI plugin 'pmix'" in done.stderr and "SRUN_MPI=" in done.stderr
    assert not any(c[0] == "srun" for c in _calls(site))  # nothing launched


def test_partition_template_runs_distmb_partition(site):
    done = _run("partition.sbatch", site, PARTS="4", EXTRA_ARGS="--replicate-halo-features")
    assert done.returncode == 0, done.stderr
    calls = _calls(site)
    assert calls[0] == ["module", "load", "mpi"]
    assert calls[1][0] == "distmb-partition"
    args = partition_parser().parse_args(calls[1][1:])
    assert args.parts == 4 and args.replicate_halo_features
    assert args.out == f"{site['home']}/distmb-parts/products-4"
    assert args.dataset == f"ogb:{site['home']}/data/ogbn_products"


def test_srun_without_mpi_plugin_is_refused(tmp_path):
    """What srun --mpi=none starts: tasks without MPI's variables; each one stops at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI", "MPI_"))}
    env.update(SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="0", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "distmb.train", "--dataset", "synthetic:nodes=100", "--epochs",
         "1", "--results", str(tmp_path / "r.jsonl")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "srun started 2 tasks without an MPI plugin" in line and "srun --mpi=pmix" in line
    assert not (tmp_path / "r.jsonl").exists()


def test_gpu_template_runs_one_rank_per_gpu_and_resumes(site):
    text = (ROOT / "slurm" / "train-gpu.sbatch").read_text()
    assert "#SBATCH --gpus-per-task=1" in text and "CUDA_VISIBLE_DEVICES" in text
    done = _run("train-gpu.sbatch", site)
    assert done.returncode == 0, done.stderr
    calls = _calls(site)
    assert calls[0] == ["module", "load", "mpi", "cuda"]
    (srun,) = [c for c in calls if c[0] == "srun"]
    i = srun.index("python")
    assert srun[1:i] == ["--mpi=pmix", "--cpu-bind=cores", "--kill-on-bad-exit=1"]
    assert srun[i : i + 3] == ["python", "-m", "distmb.train"]
    config = parse_config(srun[i + 3 :])
    assert (config.device, config.comm, config.threads) == ("cuda", "auto", 36)
    assert config.part_dir == f"{site['home']}/distmb-parts/products-8"
    assert (config.resume, Path(config.checkpoint_dir).is_dir()) == (False, True)

    (Path(config.checkpoint_dir) / "checkpoint.pt").write_bytes(b"")
    site["log"].unlink()
    done = _run("train-gpu.sbatch", site, COMM="mpi", EXTRA_ARGS="--exact-remote",
                CKPT_DIR=config.checkpoint_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr
    srun = _calls(site)[1]
    config = parse_config(srun[srun.index("python") + 3 :])
    assert (config.resume, config.comm, config.exact_remote) == (True, "mpi", True)


def test_gpu_template_names_the_fix_when_srun_lacks_the_plugin(site):
    done = _run("train-gpu.sbatch", site, SRUN_MPI_LIST="MPI plugin types are...\n\tnone\n")
    assert done.returncode == 2 and "srun has no MPI plugin 'pmix'" in done.stderr
    assert not any(c[0] == "srun" for c in _calls(site))
