"""Run under mpiexec: rank 1 raises in its second epoch; the job must abort, not hang.

argv: PART_DIR [EXTRA_TRAIN_FLAGS...]
"""

from __future__ import annotations

import sys

from distmb.cli.train import main
from distmb.engine import Trainer

real = Trainer.train_epoch


def failing(self, epoch):
    if self.comm.rank == 1 and epoch == 1:
        raise RuntimeError("injected failure on rank 1")
    return real(self, epoch)


Trainer.train_epoch = failing
sys.exit(
    main(
        [
            "--part-dir",
            sys.argv[1],
            "--layers",
            "2",
            "--fanout",
            "3,3",
            "--hidden",
            "8",
            "--batch-size",
            "50",
            "--epochs",
            "50",
            "--no-progress",
            *sys.argv[2:],
        ]
    )
)
