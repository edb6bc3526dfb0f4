"""``python -m medreco.cli``: the ``medreco`` command line."""

import sys

from medreco.cli.app import main

sys.exit(main())
