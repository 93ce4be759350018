"""The code base passes its own linter (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.fail("ruff is not installed; scripts/bootstrap installs it from requirements/cpu.lock")
    result = subprocess.run(
        [ruff, "check", "service", "qualification", "tests", *(["bench"] if (REPO / "bench").is_dir() else [])], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
