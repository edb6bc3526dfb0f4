"""Shared fixtures. Slow end-to-end tests share one session-scoped demo build."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"
TEST_KEY = "medreco-test-secret-0123456789abcdef0123456789abcdef"


@pytest.fixture(autouse=True, scope="session")
def _pseudonym_key():
    """A fixed test secret, set for the whole session (never a real deployment's)."""
    old = os.environ.get("MEDRECO_PSEUDONYM_KEY")
    os.environ["MEDRECO_PSEUDONYM_KEY"] = TEST_KEY
    yield
    if old is None:
        os.environ.pop("MEDRECO_PSEUDONYM_KEY", None)
    else:
        os.environ["MEDRECO_PSEUDONYM_KEY"] = old


@pytest.fixture(scope="session")
def key():
    from etl.keys import PseudonymKey

    return PseudonymKey(TEST_KEY.encode())


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present beside the project")
    return SHARED_DATA


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> Path:
    """A private AIRFLOW_HOME (SQLite) for the session, migrated once."""
    from etl.airflow_runner import prepare_airflow_env

    home = tmp_path_factory.mktemp("airflow_home")
    os.environ["AIRFLOW_HOME"] = str(home)
    return prepare_airflow_env(home)
