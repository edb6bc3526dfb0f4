"""The packages listed in pyproject ``[tool.mypy] files`` type-check clean (mypy, the project's settings)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from schemas.config import PROJECT_ROOT

pytestmark = pytest.mark.slow  # mypy over the checked packages (about a minute without a cache)


def test_mypy_clean():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
