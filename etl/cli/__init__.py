"""The ``medreco`` command line (console script ``medreco = etl.cli:main``: quiet output, then the Typer ``app``) and the embedded Airflow runner.

The only part of ``etl`` that may import ``dags/``, ``training/`` and ``quality/``.
"""

from etl.cli.app import app, main

__all__ = ["app", "main"]
