"""``python -m distmb.config --markdown``: the flag tables of docs/flags.md."""

import sys

from distmb.config.flags_doc import main

sys.exit(main())
