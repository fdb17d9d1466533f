"""Rebuild the quickstart's bundled data in src/bertforge/assets/ from ../shared/data (run once; output committed).

- gutenberg/*.txt: five public-domain novels, Project Gutenberg header, footer and licence removed.
- glue_sample/SST-2/{train,dev}.tsv: GLUE SST-2 in GLUE layout, 4,000 training sentences drawn with a fixed
  seed, and the full dev set (872).
- sst2_text/train-phrases.txt.gz: 16,000 distinct phrases of SST-2's training split drawn with a fixed
  seed, labels dropped, none of them a dev sentence (the teaching stage's in-domain text).
"""

from __future__ import annotations

import gzip
import random
import re
import sys
from pathlib import Path

BOOKS = ["Pride-and-Prejudice_1342", "The-Adventures-of-Sherlock-Holmes_1661", "The-Adventures-of-Tom-Sawyer_74",
         "Alice-s-Adventures-in-Wonderland_11", "Emma_158"]
START = re.compile(r"^\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG EBOOK.*$", re.MULTILINE)
END = re.compile(r"^\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG EBOOK.*$", re.MULTILINE)


def strip_gutenberg(text: str) -> str:
    start, end = START.search(text), END.search(text)
    if not start or not end:
        raise ValueError("no Project Gutenberg START/END markers")
    body = text[start.end():end.start()].strip()
    body = re.sub(r"^Produced by[^\n]*(\n[^\n]+)*\n", "", body)  # the transcriber's credit paragraph
    body = re.sub(r"\n[^\n]*End of (the )?Project Gutenberg.*$", "", body, flags=re.IGNORECASE | re.DOTALL)
    return body.strip() + "\n"


def main(shared: Path, assets: Path) -> None:
    (assets / "gutenberg").mkdir(parents=True, exist_ok=True)
    for book in BOOKS:
        text = (shared / "pretrain_text/gutenberg" / f"{book}.txt").read_text(encoding="utf-8-sig")
        (assets / "gutenberg" / f"{book}.txt").write_text(strip_gutenberg(text), encoding="utf-8")
    sst = assets / "glue_sample" / "SST-2"
    sst.mkdir(parents=True, exist_ok=True)
    header, *rows = (shared / "glue/SST-2/train.tsv").read_text(encoding="utf-8").splitlines()
    sample = random.Random(2019).sample(rows, 4000)
    (sst / "train.tsv").write_text("\n".join([header, *sample]) + "\n", encoding="utf-8")
    (sst / "dev.tsv").write_text((shared / "glue/SST-2/dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
    write_phrases(shared / "glue/SST-2", assets / "sst2_text" / "train-phrases.txt.gz", PHRASES)


PHRASES = 16000


def sst2_texts(path: Path) -> list[str]:
    """The text column of a GLUE SST-2 file (`sentence<TAB>label` under a header line)."""
    return [row.rsplit("\t", 1)[0].strip() for row in path.read_text(encoding="utf-8").splitlines()[1:]]


def write_phrases(sst2: Path, out: Path, count: int) -> None:
    dev = set(sst2_texts(sst2 / "dev.tsv"))
    distinct = [text for text in dict.fromkeys(sst2_texts(sst2 / "train.tsv")) if text and text not in dev]
    chosen = random.Random(0).sample(distinct, count)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as handle:  # mtime 0: same bytes
        handle.write(("\n".join(chosen) + "\n").encode("utf-8"))


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else root.parent / "shared/data", root / "src/bertforge/assets")
