"""Quiet, honest command-line output: what the ``medreco`` entry point sets up before any command runs.

- Libraries' deprecation warnings (``DeprecationWarning``, ``PendingDeprecationWarning``, ``FutureWarning``,
  and ``UserWarning`` messages that announce a deprecation, as Airflow's ``determine_kwargs`` one) are ignored
  when they come from outside the project's packages; the project's own still show. Child processes (Airflow
  task runners, training launchers) inherit the same categories through ``PYTHONWARNINGS`` unless it is set.
- Airflow's "XCom not found" error line, which the task SDK's client logs whenever a task looks up an XCom
  that was not pushed (a mapped task's end, the training DAG's sensors: harmless, the DAGs succeed with it),
  is dropped; every other line of that logger is kept.

Only the entry point (:func:`medreco.cli.app.main`, the ``medreco`` console script) calls :func:`quiet_entry_point`;
the line filter is put in place by :func:`after_airflow_setup` once Airflow's environment is prepared. Tests
that invoke the commands in-process keep every warning and line.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

#: the project's top-level packages: their warnings are never filtered
OWN_PACKAGES = (
    "medreco",
    "etl",
    "schemas",
    "entity_extraction",
    "quality",
    "training",
    "dags",
    "plugins",
    "medreco_reader",
)
#: a module regex matching every module outside :data:`OWN_PACKAGES`
LIBRARY_MODULES = r"(?!(" + "|".join(OWN_PACKAGES) + r")(\.|$))"
#: the categories ignored from libraries
DEPRECATION_CATEGORIES = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
#: inherited by child processes (the ``-W`` syntax cannot name modules, so there it is by category only)
CHILD_WARNINGS = "ignore::DeprecationWarning,ignore::PendingDeprecationWarning,ignore::FutureWarning"
#: events dropped from Airflow's log output (exact event text)
HARMLESS_AIRFLOW_EVENTS = frozenset({"XCom not found"})


def filter_library_warnings() -> None:
    """Ignore libraries' deprecation warnings in this process (see the module docstring) and set
    ``PYTHONWARNINGS`` for child processes when it is unset."""
    for category in DEPRECATION_CATEGORIES:
        warnings.filterwarnings("ignore", category=category, module=LIBRARY_MODULES)
    warnings.filterwarnings("ignore", message=r"(?i).*\bdeprecated\b", category=UserWarning, module=LIBRARY_MODULES)
    os.environ.setdefault("PYTHONWARNINGS", CHILD_WARNINGS)


class _DropHarmless:
    """A logger proxy that drops the events of :data:`HARMLESS_AIRFLOW_EVENTS` and passes every other call on."""

    def __init__(self, log: Any) -> None:
        self._log = log

    def error(self, event: Any = None, *args: Any, **kwargs: Any) -> Any:
        if event in HARMLESS_AIRFLOW_EVENTS:
            return None
        return self._log.error(event, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


#: set by :func:`quiet_entry_point`: :func:`after_airflow_setup` then drops the harmless lines
_ENTRY_POINT = {"quiet": False}


def after_airflow_setup() -> None:
    """Called by the embedded runner once Airflow's environment is prepared (Airflow reads its configuration at
    import, so nothing here imports it earlier): drops the harmless lines when the entry point asked for it."""
    if _ENTRY_POINT["quiet"]:
        # importing airflow.configuration puts Airflow's own "default" filters for its deprecation warnings in
        # front (unless -W options were given): ours go in front of them again
        import airflow.configuration  # noqa: F401

        filter_library_warnings()
        suppress_harmless_airflow_lines()


def suppress_harmless_airflow_lines() -> None:
    """Drop the harmless "XCom not found" error line of Airflow's task SDK client
    (``airflow.sdk.api.client.log``, a structlog logger: its events are filtered before any processor or
    handler sees them, however Airflow configures logging later). Every other event of that logger passes.
    Idempotent; a no-op where that module or logger is not there (another Airflow version)."""
    try:
        from airflow.sdk.api import client
    except ImportError:  # pragma: no cover - Airflow is a core dependency
        return
    log = getattr(client, "log", None)
    if log is not None and not isinstance(log, _DropHarmless):
        client.log = _DropHarmless(log)


def quiet_entry_point() -> None:
    """Everything the ``medreco`` entry point sets up for quiet, honest output (see the module docstring)."""
    filter_library_warnings()
    _ENTRY_POINT["quiet"] = True
