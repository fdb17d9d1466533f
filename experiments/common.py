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
RESULT_PAGES = (DOC, *(ROOT / "docs" / f"results-{topic}.md" for topic in ("pretraining", "finetuning", "own-data",
                                                                         "inference")))


def save_results(name: str, payload: dict[str, Any]) -> Path:
    return shared.save_results(name, payload, RESULTS)


def results_page(name: str) -> Path:
    """The results page that holds section `name` (docs/results.md and its topic pages), else results.md."""
    for page in RESULT_PAGES:
        if page.is_file() and f"<!-- {name} -->" in page.read_text(encoding="utf-8"):
            return page
    return DOC


def update_doc_section(name: str, body: str, doc: Path | None = None) -> None:
    """Replace (or append) the section between <!-- name --> and <!-- /name --> in `doc`: by default the
    results page that holds it (docs/results.md for a new section)."""
    shared.update_doc_section(name, body, results_page(name) if doc is None or doc == DOC else doc, DOC_HEADER)


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


__all__ = ["DOC", "RESULTS", "RESULT_PAGES", "results_page", "ROOT", "machine", "machine_line", "markdown_table", "publish", "save_results",
           "update_doc_section"]
