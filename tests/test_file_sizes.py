"""No tracked Python file or Markdown page reaches 40 kB: past that a module holds more than one job and a
page more than one topic, and both get hard to read."""

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


def test_pages_stay_under_the_limit() -> None:
    """A reader finds a section in a page of a few screens; a longer page is split by topic (as the results,
    benchmarks, recipes and research log are) and linked from README.md."""
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    sizes = {name: (ROOT / name).stat().st_size for name in listed.stdout.splitlines()
             if (ROOT / name).exists()}
    too_big = [f"{name} ({size:,} bytes)" for name, size in sorted(sizes.items()) if size >= LIMIT]
    assert not too_big, f"pages of {LIMIT:,} bytes or more: {', '.join(too_big)}; split each by topic"


def test_generated_pages_are_tracked() -> None:
    """The command reference's pages are committed, so that the size check above sees them."""
    listed = subprocess.run(["git", "ls-files", "docs/cli"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert len(listed.stdout.splitlines()) >= 10, "docs/cli/*.md (scripts/gen_cli_docs.py) are not committed"
