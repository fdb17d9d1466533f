"""No tracked Python file reaches 40 kB: past that a module holds more than one job and gets hard to read."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 40_000  # bytes


def test_python_files_stay_under_the_limit() -> None:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    sizes = {name: (ROOT / name).stat().st_size for name in listed.stdout.splitlines() if (ROOT / name).exists()}
    too_big = [f"{name} ({size:,} bytes)" for name, size in sorted(sizes.items()) if size >= LIMIT]
    assert not too_big, (f"Python files of {LIMIT:,} bytes or more: {', '.join(too_big)}; "
                         "split each along its responsibilities into smaller modules")
