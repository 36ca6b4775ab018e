"""``python -m distmb.report`` = ``distmb-report``: the run report (:mod:`distmb.cli.report`)."""

import sys

from distmb.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
