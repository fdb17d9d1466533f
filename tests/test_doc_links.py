"""Every relative link in README.md, docs/*.md and docs/research/*.md leads somewhere: the file exists and, when the link
names a section (`page.md#anchor` or `#anchor`), the page has a heading with that anchor, as GitHub
makes anchors (lower case, punctuation dropped, spaces to hyphens, `-1`, `-2` for repeats)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "research").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def github_anchor(heading: str) -> str:
    text = re.sub(r"[`*]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    out, inside = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            out.append((number, line))
    return out


def anchors(path: Path) -> set[str]:
    found: dict[str, int] = {}
    names = set()
    for _, line in prose_lines(path):
        if match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = github_anchor(match[1])
            count = found.get(base, 0)
            names.add(base if count == 0 else f"{base}-{count}")
            found[base] = count + 1
    return names


def test_the_anchor_rule_is_githubs():
    assert github_anchor("Few labels: `--method setfit` against fine-tuning, SST-2") == \
        "few-labels---method-setfit-against-fine-tuning-sst-2"
    assert github_anchor("The quickstart's levers, one at a time") == "the-quickstarts-levers-one-at-a-time"
    assert github_anchor("SQuAD v1.1") == "squad-v11"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page: Path):
    broken = []
    for number, line in prose_lines(page):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue  # https:, mailto: ...
            file_part, _, anchor = target.partition("#")
            linked = (page.parent / file_part).resolve() if file_part else page
            if not linked.exists():
                broken.append(f"{page.name}:{number}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.name}:{number}: {target}: {linked.name} has no heading with that anchor")
    assert not broken, "\n".join(broken)
