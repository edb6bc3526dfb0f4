"""The ``medreco`` command line (console script ``medreco = medreco.cli:main``: quiet output, then the Typer
``app``), the embedded Airflow runner (:mod:`medreco.cli.embedded`), the scheduled run and the processes it starts.

The application layer: the only package that imports ``dags/``, ``training/`` and ``quality/`` together.
"""

from medreco.cli.app import app, main

__all__ = ["app", "main"]
