"""``python -m distmb.train`` = ``distmb-train``: the training command (:mod:`distmb.cli.train`)."""

import sys

from distmb.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
