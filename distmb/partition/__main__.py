"""``python -m distmb.partition`` = ``distmb-partition``."""

import sys

from distmb.cli.partition import main

sys.exit(main())
