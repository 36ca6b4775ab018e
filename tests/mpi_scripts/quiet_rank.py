"""Run under mpiexec: rank 1 goes quiet at the start of its second epoch, the others train on.

argv: PART_DIR MODE TIMEOUT
- MODE ``stop``: rank 1 sends itself SIGSTOP (a stopped process: no heartbeats, no progress);
  the watchdog must abort the job naming rank 1 instead of hanging.
- MODE ``slow``: rank 1 sleeps 2.5 x TIMEOUT (alive: its heartbeats continue); the job must
  finish, with a warning and no abort.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from distmb.cli.train import main
from distmb.engine import Trainer

part_dir, mode, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
real = Trainer.train_epoch


def quiet(self, epoch):
    if self.comm.rank == 1 and epoch == 1:
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            time.sleep(2.5 * timeout)
    return real(self, epoch)


Trainer.train_epoch = quiet
sys.exit(
    main(
        [
            "--part-dir",
            part_dir,
            "--layers",
            "2",
            "--fanout",
            "3,3",
            "--hidden",
            "8",
            "--batch-size",
            "50",
            "--epochs",
            "3" if mode == "slow" else "50",
            "--eval-every",
            "100",
            "--collective-timeout",
            str(timeout),
            "--no-progress",
        ]
    )
)
