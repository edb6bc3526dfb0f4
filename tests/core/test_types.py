"""The packages listed in pyproject ``[tool.mypy] files`` type-check clean (mypy, the project's settings)."""

from __future__ import annotations

import subprocess
import sys

from schemas.config import PROJECT_ROOT


def test_mypy_clean():
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
