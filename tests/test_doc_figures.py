"""Every figure a user page quotes comes from the results pages, or is marked as no measured result.

Measured figures live in docs/results.md and its topic pages docs/results-*.md (what the models score) and docs/benchmarks.md (speed and
memory), whose generated sections tests/test_generated_sections.py checks against the saved results. A
figure typed into another page drifts when the run is redone: the same fine-tuning speed was once quoted
as three different numbers on three pages. So every decimal figure on a user page (README.md and
docs/*.md, but not the results pages, the research log or the generated CLI reference), outside code,
must be written on a results page or benchmarks.md exactly as the page quotes it, unless it is

- inside a section of the page that tests/test_generated_sections.py checks against its script's render
  (the page then shows the saved results themselves);
- in a table column headed "paper" (the published paper's figure beside ours);
- a setting or a version by its context: right after `lr`, `dropout`, `weight decay`, `warm-up`, a
  masking rate or a `--flag`, or after PyTorch, Python or CUDA;
- in ALLOWED below, with the reason it is not a measured result.

Integers are not checked (step counts, sizes and years are mostly settings), nor figures with a second
dot (versions such as 2.13.0).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import pytest

from test_generated_sections import BENCHMARK_PAGES, RESULT_PAGES, SECTIONS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SOURCES = tuple(page.name for page in (*RESULT_PAGES, *BENCHMARK_PAGES))  # where measured figures are written
# docs pages that are not user pages: the dated record of how figures were reached, and the page
# scripts/gen_cli_docs.py generates from the code
NOT_USER_PAGES = ("cli.md",)  # and the research log's pages, research-log*.md

# a decimal figure; not part of a word, a version (2.13.0), a longer number or a power of ten (2.5e-5); a unit
# may follow (2.2x, 80.6%)
FIGURE = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\d)(?![eE][-+]?\d)")
# the text right before a figure that makes it a setting or a version rather than a result
SETTING_OR_VERSION = re.compile(
    r"(?:\blr|\blearning rate|\bdropout|\bweight decay|\bwarm-?up|\bmask(?:ing)? rate|(?<!\w)--[a-z][a-z0-9-]*"
    r"|\bPyTorch|\bPython|\bCUDA)[ =:]*$", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`[^`\n]*`")

# (page, figure) -> why it is not a measured result. Short: a measured figure belongs on the results
# pages, and a user page quotes it from there or links to it.
ALLOWED: dict[tuple[str, str], str] = {
    ("precision.md", "0.06"): "the test suite's bound for bf16 against fp32 (BF16_ATOL in tests/test_precision.py)",
    ("precision.md", "0.12"): "the test suite's bound for int8 against fp32 (INT8_ATOL in tests/test_precision.py)",
}


class Figure(NamedTuple):
    line: int  # 1-based
    figure: str


def user_pages() -> list[Path]:
    skipped = {*SOURCES, *NOT_USER_PAGES}
    return [ROOT / "README.md", *(page for page in sorted(DOCS.glob("*.md"))
                                  if page.name not in skipped and not page.name.startswith("research-log"))]


def blank(text: str, start: int, end: int) -> str:
    """text with [start, end) turned into spaces, newlines kept: lines and columns stay where they were."""
    return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def without_code(text: str) -> str:
    """Fenced blocks and inline code blanked: code is commands, settings and examples, not quoted results."""
    lines, fenced = [], False
    for line in text.split("\n"):
        opens_or_closes = bool(FENCE.match(line))
        lines.append("" if fenced or opens_or_closes else INLINE_CODE.sub(lambda m: " " * len(m.group()), line))
        fenced ^= opens_or_closes
    return "\n".join(lines)


def without_sections(text: str, names: Iterable[str]) -> str:
    """The named <!-- name --> ... <!-- /name --> sections blanked (their figures are checked elsewhere)."""
    for name in names:
        found = re.search(rf"<!-- {re.escape(name)} -->.*?<!-- /{re.escape(name)} -->", text, re.DOTALL)
        if found:
            text = blank(text, found.start(), found.end())
    return text


def without_paper_columns(text: str) -> str:
    """Table cells under a header cell that starts with "paper" blanked: the paper's figures, not ours."""
    lines = text.split("\n")
    paper: set[int] = set()  # the current table's paper columns, by cell index
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            paper = set()
            continue
        cells = cell_spans(line)
        if i + 1 < len(lines) and re.fullmatch(r"\s*\|?[\s:|-]*-[\s:|-]*", lines[i + 1]):  # a header row
            paper = {k for k, (a, b) in enumerate(cells) if line[a + 1:b].strip().lower().startswith("paper")}
            continue
        for k in paper & set(range(len(cells))):
            a, b = cells[k]
            line = line[:a] + " " * (b - a) + line[b:]
        lines[i] = line
    return "\n".join(lines)


def cell_spans(row: str) -> list[tuple[int, int]]:
    """(start, end) of each cell of a table row: from the pipe before it to the pipe after it."""
    pipes = [k for k, char in enumerate(row) if char == "|"]
    return list(zip(pipes, pipes[1:], strict=False))


def page_figures(text: str, generated: Iterable[str] = ()) -> list[Figure]:
    """The figures of a user page that must come from the results pages, in order."""
    text = without_paper_columns(without_sections(without_code(text), generated))
    found = []
    for number, line in enumerate(text.split("\n"), 1):
        for match in FIGURE.finditer(line):
            if not SETTING_OR_VERSION.search(line[:match.start()]):
                found.append(Figure(number, match.group()))
    return found


def source_figures() -> set[str]:
    return {figure for name in SOURCES for figure in FIGURE.findall((DOCS / name).read_text(encoding="utf-8"))}


def generated_sections(page: str) -> set[str]:
    return {name for (where, name) in SECTIONS if where == page}


@pytest.mark.parametrize("page", user_pages(), ids=lambda page: page.name)
def test_every_figure_comes_from_the_results_pages(page: Path) -> None:
    known = source_figures()
    figures = page_figures(page.read_text(encoding="utf-8"), generated_sections(page.name))
    stray = [f for f in figures if f.figure not in known and (page.name, f.figure) not in ALLOWED]
    where = page.relative_to(ROOT)
    assert not stray, (
        "\n".join(f"{where}:{f.line}: {f.figure} is on no results page (docs/results*.md) nor docs/benchmarks*.md" for f in stray)
        + "\nQuote the figure as a results page or benchmarks.md writes it, or replace it with a link to the section "
        "(or research-log entry) that holds it. A figure that is not a measured result (a setting, a threshold, "
        "a version) goes in ALLOWED in tests/test_doc_figures.py, with the reason.")


def test_every_allowed_figure_is_still_on_its_page() -> None:
    pages = {page.name: page for page in user_pages()}
    for (name, figure), why in ALLOWED.items():
        assert why, f"ALLOWED[{name}, {figure}] needs its reason"
        assert name in pages, f"ALLOWED names {name}, which is not a user page"
        on_page = {f.figure for f in page_figures(pages[name].read_text(encoding="utf-8"), generated_sections(name))}
        assert figure in on_page, f"{name} no longer quotes {figure}: drop it from ALLOWED"


# The scanner itself, on made-up pages.

PAGE = """# A page

Fine-tuned with lr 0.5 and dropout 0.1 (`--holdout 0.3`), it scored 81.25, or 2.5x faster (decay 1.5e-3).

```bash
bertforge finetune --warmup 0.77
echo 12.5
```

| task | measured here | paper, BERT-base |
|---|---|---|
| SST-2 | 81.25 | 93.5 |

<!-- made -->
| made by a script | 44.4 |
<!-- /made -->
With PyTorch 2.13 (torch 2.13.0+cpu), 3.14159 is 7.1.
"""


def test_the_scanner_finds_prose_figures_and_skips_code_settings_papers_and_sections() -> None:
    assert page_figures(PAGE, ["made"]) == [Figure(3, "81.25"), Figure(3, "2.5"), Figure(12, "81.25"),
                                            Figure(17, "3.14159"), Figure(17, "7.1")]


def test_the_scanner_reads_an_unchecked_section_as_prose() -> None:
    assert Figure(15, "44.4") in page_figures(PAGE)


def test_a_figure_missing_from_the_results_pages_is_caught() -> None:
    known = {"81.25", "2.5", "3.14159"}
    assert [f for f in page_figures(PAGE, ["made"]) if f.figure not in known] == [Figure(17, "7.1")]
