"""Check that bertforge reads every GLUE TSV as pandas does with quoting off, row for row and cell for cell.

    .venv/bin/python scripts/check_glue_reading.py [GLUE_DIR]     (default ../shared/data/glue)

Each .tsv under GLUE_DIR (sub-folders too) is read as one of your own files (`bertforge.tables.read_rows`,
its first line the header) and with `pandas.read_csv(sep="\\t", quoting=csv.QUOTE_NONE,
keep_default_na=False, dtype=str)`, the way google-research/bert's GLUE readers read them (no quoting: a
`"` is a character). Prints a table of file, bertforge's rows, pandas' rows and whether the two agree:
the same header, the same number of rows and the same cells in every row. A file that both refuse
(more fields on a line than its header has) agrees when both name the same line. Exits 1 if any file
differs, 2 if there is no .tsv to read.

CoLA's train and dev files (and its raw originals) have no header line: read as your own files, by
either reader, their first line is the header (an empty cell in it is named "" here, "Unnamed: 2" by
pandas, which the check counts as the same). bertforge's GLUE family reads them as GLUE defines them.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pandas as pd

from bertforge.fileio import DataFormatError
from bertforge.tables import read_rows

DEFAULT_GLUE = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "glue"


def bertforge_table(path: Path) -> tuple[list[str], list[list[str]]] | str:
    """(header, rows) as bertforge reads the file, or the error it refuses it with."""
    try:
        rows = read_rows(path, fmt="tsv")
    except DataFormatError as exc:
        return str(exc)
    return list(rows[0].values), [list(row.values.values()) for row in rows]


def pandas_table(path: Path) -> tuple[list[str], list[list[str]]] | str:
    """(header, rows) as pandas reads the file with quoting off, or the error it refuses it with."""
    try:
        frame = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False, dtype=str)
    except pd.errors.ParserError as exc:
        return " ".join(str(exc).split())
    # pandas names an empty header cell "Unnamed: N" (CoLA's first line, which is a row, not a header)
    header = ["" if re.fullmatch(rf"Unnamed: {i}", str(name)) else str(name) for i, name in enumerate(frame.columns)]
    return header, frame.to_numpy().tolist()


def compare(ours: tuple[list[str], list[list[str]]] | str, theirs: tuple[list[str], list[list[str]]] | str) -> str:
    """"yes", "yes (both refuse line N)", or what differs first."""
    if isinstance(ours, str) or isinstance(theirs, str):
        if isinstance(ours, str) and isinstance(theirs, str):
            line = re.search(r":(\d+):", ours)
            if line and re.search(rf"line {line.group(1)}\b", theirs):
                return f"yes (both refuse line {line.group(1)})"
        return f"NO: bertforge {'refuses' if isinstance(ours, str) else 'reads'}, " \
               f"pandas {'refuses' if isinstance(theirs, str) else 'reads'}"
    (our_header, our_rows), (their_header, their_rows) = ours, theirs
    if our_header != their_header:
        return f"NO: headers differ ({our_header} vs {their_header})"
    if len(our_rows) != len(their_rows):
        return "NO: row counts differ"
    for number, (mine, other) in enumerate(zip(our_rows, their_rows, strict=True), start=1):
        if mine != other:
            column = next(i for i, (x, y) in enumerate(zip(mine, other, strict=False)) if x != y) \
                if len(mine) == len(other) else None
            where = f"column {our_header[column]!r}: {mine[column][:60]!r} vs {other[column][:60]!r}" \
                if column is not None else f"{len(mine)} vs {len(other)} cells"
            return f"NO: row {number} differs ({where})"
    return "yes"


def rows_of(table: tuple[list[str], list[list[str]]] | str) -> str:
    return "refused" if isinstance(table, str) else str(len(table[1]))


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else DEFAULT_GLUE
    files = sorted(root.resolve().rglob("*.tsv"))
    if not files:
        print(f"{root}: no .tsv files", file=sys.stderr)
        return 2
    width = max(len(str(path.relative_to(root.resolve()))) for path in files)
    print(f"{'file':<{width}}  {'bertforge':>9}  {'pandas':>7}  equal")
    differing, refusals = 0, []
    for path in files:
        ours, theirs = bertforge_table(path), pandas_table(path)
        verdict = compare(ours, theirs)
        differing += not verdict.startswith("yes")
        if isinstance(ours, str):
            refusals.append(ours)
        print(f"{str(path.relative_to(root.resolve())):<{width}}  {rows_of(ours):>9}  {rows_of(theirs):>7}  {verdict}")
    print(f"{len(files) - differing} of {len(files)} files read alike (pandas {pd.__version__}, "
          "sep='\\t', quoting=QUOTE_NONE)")
    for message in refusals:
        print(f"  bertforge: {message[:200]}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
