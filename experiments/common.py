"""Shared by the studies: the machine description, result files, and docs/results.md sections.

A study that owns a section of docs/results.md (between `<!-- name -->` and `<!-- /name -->` markers)
rewrites only that section, so the studies can be rerun independently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common as shared
from benchmarks.common import machine, machine_line, markdown_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
DOC = ROOT / "docs" / "results.md"
DOC_HEADER = "# Results\n"
# the overview and its topic pages; a study's section lives on one of them
RESULT_PAGES = (DOC, *(ROOT / "docs" / f"results-{topic}.md"
                      for topic in ("pretraining", "finetuning", "own-data", "inference")))


def save_results(name: str, payload: dict[str, Any]) -> Path:
    return shared.save_results(name, payload, RESULTS)


def update_doc_section(name: str, body: str, doc: Path | None = None) -> None:
    """Replace (or append) the section between <!-- name --> and <!-- /name --> in `doc`: by default the
    results page that holds it (docs/results.md for a new section)."""
    page = shared.page_holding(name, RESULT_PAGES) if doc is None or doc == DOC else doc
    shared.update_doc_section(name, body, page, DOC_HEADER)


def publish(name: str, section: str, payload: dict[str, Any], render: Callable[[dict[str, Any]], str], *,
            smoke: bool = False, work: Path | None = None, write_doc: bool = False) -> None:
    """A study's ending: a smoke run's payload goes beside its scratch work and its section is printed
    (and written to the doc only when asked); a real run saves its results and rewrites its section."""
    text = render(payload)
    if smoke:
        assert work is not None, "a smoke run keeps its payload in its work directory"
        (work / f"{name}.json").write_text(json.dumps(payload, indent=2))
        if write_doc:
            update_doc_section(section, text)
        print(text)
        return
    save_results(name, payload)
    update_doc_section(section, text)
    print(text)


__all__ = ["DOC", "RESULTS", "RESULT_PAGES", "ROOT", "machine", "machine_line", "markdown_table", "publish",
           "save_results", "update_doc_section"]
