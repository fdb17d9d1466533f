"""Shared by the studies: the machine description, result files, and docs/results.md sections.

A study that owns a section of docs/results.md (between `<!-- name -->` and `<!-- /name -->` markers)
rewrites only that section, so the studies can be rerun independently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks import common as shared
from benchmarks.common import machine, machine_line, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
DOC = ROOT / "docs" / "results.md"
DOC_HEADER = "# Results\n"


def save_results(name: str, payload: dict[str, Any]) -> Path:
    return shared.save_results(name, payload, RESULTS)


def update_doc_section(name: str, body: str, doc: Path = DOC) -> None:
    """Replace (or append) the section between <!-- name --> and <!-- /name --> in `doc` (docs/results.md)."""
    shared.update_doc_section(name, body, doc, DOC_HEADER)


__all__ = ["DOC", "RESULTS", "ROOT", "machine", "machine_line", "markdown_table", "save_results",
           "update_doc_section"]
