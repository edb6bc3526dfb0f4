"""Shared fixtures. Slow end-to-end tests share one session-scoped demo build.

Every test that runs the build DAG (it needs the session's ``airflow_home``, directly or through a build
fixture) is marked ``slow`` here, so ``make test-fast`` (``-m "not slow"``) leaves out exactly the end-to-end
builds; modules with other long work (CPU training, type checking) carry ``pytestmark = pytest.mark.slow``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from schemas.config import PROJECT_ROOT

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
    from medreco.cli.embedded import prepare_airflow_env

    home = tmp_path_factory.mktemp("airflow_home")
    os.environ["AIRFLOW_HOME"] = str(home)
    return prepare_airflow_env(home)


def config_for(root: Path, base: str = "demo.yaml", **overrides) -> Path:
    """A copy of a config under ``config/`` with its storage root set to ``root`` and ``overrides`` applied."""
    data = yaml.safe_load((PROJECT_ROOT / "config" / base).read_text())
    data["storage"]["root"] = str(root)
    data.update(overrides)
    path = root.parent / f"{root.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory, airflow_home):
    """The demo corpus (seed 7, 16 patients) built twice with dag.test(): one build per test session."""
    from etl.demo.corpus import generate_corpus
    from medreco.cli.embedded import run_build

    root = tmp_path_factory.mktemp("demo") / "root"
    generate_corpus(root, seed=7, n_patients=16)
    # 32 shards for 16 patients: empty shards must be no-ops; 8 mapped tasks of 4 shards each
    cfg = config_for(root, shard_count=32, max_map_length=8)
    first = run_build(cfg)
    second = run_build(cfg)
    from etl.storage import Storage

    return {"root": root, "config": cfg, "first": first, "second": second, "storage": Storage.open(str(root))}


@pytest.fixture(scope="session")
def datasets_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment (the base interpreter of this one, no system site packages) holding Hugging Face
    ``datasets`` and its dependencies only, pinned by ``constraints/requirements.lock``: no project module, no
    reader. Made once per session (a pip install from the registry, about a minute). Returns its ``python``."""
    import subprocess
    import sys

    venv = tmp_path_factory.mktemp("datasets_venv") / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    pip = subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "-c",
            str(PROJECT_ROOT / "constraints" / "requirements.lock"),
            "datasets",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    return venv / "bin" / "python"


#: fixtures whose use makes a test an end-to-end build (``slow``)
SLOW_FIXTURES = frozenset({"airflow_home"})


def pytest_collection_modifyitems(config, items):
    """Mark every test that (transitively) uses a fixture of :data:`SLOW_FIXTURES` as ``slow``; refuse a test
    that uses a shared build fixture from a file not listed for it in ``xdist_groups.SHARED_BUILD_FILES`` (under
    ``make test``'s two workers its build would run a second time)."""
    from xdist_groups import SHARED_BUILD_FILES

    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & names:
            item.add_marker(pytest.mark.slow)
        path = item.nodeid.split("::", 1)[0]
        for fixture, files in SHARED_BUILD_FILES.items():
            if fixture in names and path not in files:
                raise pytest.UsageError(
                    f"{path} uses the session fixture {fixture!r}: add it to "
                    f"SHARED_BUILD_FILES[{fixture!r}] in tests/xdist_groups.py"
                )


try:
    import xdist  # noqa: F401  (optional: ``make test`` runs two workers with it)
except ImportError:
    xdist = None

if xdist is not None:

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        """``--dist loadgroup``: one work unit per test file, one for all users of a shared session build
        (``xdist_groups.SharedBuildScheduling``); other ``--dist`` modes are pytest-xdist's own."""
        if config.getvalue("dist") != "loadgroup":
            return None
        from xdist_groups import SharedBuildScheduling

        return SharedBuildScheduling(config, log)
