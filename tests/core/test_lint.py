"""The tree stays clean under the project's ruff rules (pyproject [tool.ruff])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.config import PROJECT_ROOT

ROOT = PROJECT_ROOT


def test_ruff_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    proc = subprocess.run([ruff, "check", "--output-format", "concise", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
