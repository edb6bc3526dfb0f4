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


def test_pre_commit_config_is_valid_and_runs_the_checks_of_the_suite():
    import yaml

    pre_commit = Path(sys.executable).with_name("pre-commit")
    assert pre_commit.exists(), "pre-commit is part of the dev extra (make install)"
    config = ROOT / ".pre-commit-config.yaml"
    proc = subprocess.run([str(pre_commit), "validate-config", str(config)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hooks = {h["id"]: h for repo in yaml.safe_load(config.read_text())["repos"] for h in repo["hooks"]}
    assert {"ruff-check", "ruff-format", "mypy"} <= set(hooks)
    assert all(h["language"] == "system" for h in hooks.values())  # offline: nothing fetched from the network
