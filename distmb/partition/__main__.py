"""``python -m distmb.partition`` = ``distmb-partition``."""

import sys

from distmb.partition.cli import main

sys.exit(main())
