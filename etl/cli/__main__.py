"""``python -m etl.cli``: the ``medreco`` command line."""

import sys

from etl.cli.app import main

sys.exit(main())
