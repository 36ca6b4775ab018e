"""``python -m partition`` = ``distmb-partition``."""

import sys

from partition.cli import main

sys.exit(main())
