"""The code base stays clean by ruff's rules in pyproject.toml (imports sorted, no unused names, modern
syntax), so a change that breaks them fails the suite rather than piling up unnoticed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it comes with the test extra: pip install -e .[test])")
    result = subprocess.run([ruff, "check", "--no-cache", "src", "tests", "experiments", "benchmarks", "scripts"],
                            cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
