"""GLUE: the nine tasks and the AX diagnostic, read from the GLUE directory layout.

```
glue_dir/CoLA/{train,dev,test}.tsv      glue_dir/MNLI/{train,dev_matched,dev_mismatched,
glue_dir/SST-2/...  MRPC/  STS-B/  QQP/                     test_matched,test_mismatched}.tsv
glue_dir/QNLI/...   RTE/   WNLI/        glue_dir/diagnostic/diagnostic.tsv  (AX; or AX/AX.tsv)
```

Files are tab-separated without quoting (a `"` is part of the text). All have a header line except
CoLA's train and dev files, which hold four columns: source, label, the author's mark, sentence.
Columns are found by their header names, so MNLI's train and dev files (different column counts)
read alike. Test files have no label column; their examples carry `label=None`.

Labels stay as the strings in the file ("0"/"1", "entailment", ...), checked against the task's label
list; `GLUE_TASKS[task].labels` gives the order to map them to class ids. STS-B labels are floats.

This module also holds `DataFormatError`, the error every task reader raises for bad input.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bertforge.tasks.metrics import canonical_glue_task


class DataFormatError(ValueError):
    """Input that a reader cannot use, located as `file:line: field: what is wrong`.

    `line` is 1-based (None when the problem is not on one line); `field` names the column, key or
    JSON path concerned (None when the whole line is at fault).
    """

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


def read_text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) for each line of a UTF-8 file, without its line ending.

    Lines are split on "\\n" only (a stray \\x1c or \\u2028 inside a sentence stays in it); a UTF-8 BOM
    at the start is dropped; bytes that are not UTF-8 raise `DataFormatError` with their line.
    """
    data = Path(path).read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    for number, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataFormatError(path, number, None, f"not UTF-8 text (byte {exc.start}: "
                                                      f"{raw[exc.start:exc.start + 1]!r})") from None
        yield number, text.removesuffix("\r")


@dataclass
class GlueExample:
    guid: str                 # "<file stem>-<index column or row number>", e.g. "dev-12"
    text_a: str
    text_b: str | None        # None for single-sentence tasks (CoLA, SST-2)
    label: str | float | None  # label name, STS-B score, or None in test files


@dataclass(frozen=True)
class GlueTask:
    name: str                       # directory name in the GLUE layout
    text_a: str                     # header names of the columns
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None  # class names in class-id order; None = regression (STS-B)
    index: str | None               # the id column of labelled files, if any
    splits: tuple[str, ...] = ("train", "dev", "test")

    @property
    def is_regression(self) -> bool:
        return self.labels is None


_MNLI_SPLITS = ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")
_NLI = ("contradiction", "entailment", "neutral")
_QNLI = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("CoLA", "sentence", None, "label", ("0", "1"), None),
    "sst2": GlueTask("SST-2", "sentence", None, "label", ("0", "1"), None),
    "mrpc": GlueTask("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), None),
    "stsb": GlueTask("STS-B", "sentence1", "sentence2", "score", None, "index"),
    "qqp": GlueTask("QQP", "question1", "question2", "is_duplicate", ("0", "1"), "id"),
    "mnli": GlueTask("MNLI", "sentence1", "sentence2", "gold_label", _NLI, "index", _MNLI_SPLITS),
    "qnli": GlueTask("QNLI", "question", "sentence", "label", _QNLI, "index"),
    "rte": GlueTask("RTE", "sentence1", "sentence2", "label", _QNLI, "index"),
    "wnli": GlueTask("WNLI", "sentence1", "sentence2", "label", ("0", "1"), "index"),
    # the diagnostic set is scored with an MNLI model's predictions; its file has no labels
    "ax": GlueTask("AX", "sentence1", "sentence2", "label", _NLI, "index", ("test",)),
}
# CoLA's train and dev files have no header: (source, label, author's mark, sentence)
_COLA_COLUMNS = ("source", "label", "original_label", "sentence")
_AX_FILES = ("diagnostic/diagnostic.tsv", "AX/AX.tsv", "AX/diagnostic.tsv", "AX/test.tsv")


def glue_task(task: str) -> GlueTask:
    """The task's description; `task` as in `canonical_glue_task` ("SST-2", "sst2", "MNLI-mm" -> MNLI)."""
    key = canonical_glue_task(task)
    return GLUE_TASKS["mnli" if key.startswith("mnli") else key]


def read_glue(glue_dir: str | Path, task: str, split: str) -> list[GlueExample]:
    """Read one split of one task from the GLUE layout under `glue_dir`.

    `split` is train / dev / test, or for MNLI train / dev_matched / dev_mismatched / test_matched /
    test_mismatched; AX has only test.
    """
    spec = glue_task(task)
    if split not in spec.splits:
        raise ValueError(f"{spec.name} has no split {split!r}; it has {', '.join(spec.splits)}")
    root = Path(glue_dir)
    if spec.name == "AX":
        candidates = [root / name for name in _AX_FILES]
        path = next((p for p in candidates if p.is_file()), candidates[0])
    else:
        path = root / spec.name / f"{split}.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected the GLUE layout under {root})")
    return read_glue_file(path, task, labelled=not split.startswith("test"))


def read_glue_file(path: str | Path, task: str, *, labelled: bool | None = None,
                   skip_malformed: bool = False) -> list[GlueExample]:
    """Read one GLUE .tsv file of `task`.

    `labelled` says whether the file has labels; by default, files whose name starts with "test" or
    "diagnostic" (and AX's) have none. Every row must have as many fields as the header. With
    `skip_malformed=True`, rows with a wrong field count are skipped and counted in a warning instead
    of raising (Hugging Face's reader does the same for QQP); unknown labels always raise.
    """
    path = Path(path)
    spec = glue_task(task)
    if labelled is None:
        labelled = spec.name != "AX" and not path.stem.lower().startswith(("test", "diagnostic"))
    lines = read_text_lines(path)
    if spec.name == "CoLA" and labelled:
        header, first_row_line, header_text = _COLA_COLUMNS, None, ""
    else:
        first = next(lines, None)
        if first is None:
            raise DataFormatError(path, 1, None, "empty file; expected a header line")
        first_row_line, header_text = first
        header = tuple(header_text.split("\t"))
    columns = {name: i for i, name in enumerate(header)}
    wanted = [spec.text_a] + ([spec.text_b] if spec.text_b else []) + ([spec.label] if labelled else [])
    for name in wanted:
        if name not in columns:
            raise DataFormatError(path, first_row_line, name,
                                  f"missing column for {spec.name}; header is {header_text!r}")
    id_column = columns.get("index", columns.get("id")) if not labelled else columns.get(spec.index or "")

    examples: list[GlueExample] = []
    skipped: list[int] = []
    for number, text in lines:
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != len(header):
            if skip_malformed:
                skipped.append(number)
                continue
            raise DataFormatError(path, number, None, f"{len(fields)} tab-separated fields, expected "
                                                      f"{len(header)} ({', '.join(header)})")
        label: str | float | None = None
        if labelled:
            label = _parse_label(spec, fields[columns[spec.label]], path, number)
        row_id = fields[id_column] if id_column is not None else str(len(examples) + len(skipped))
        examples.append(GlueExample(
            guid=f"{path.stem}-{row_id}",
            text_a=fields[columns[spec.text_a]],
            text_b=fields[columns[spec.text_b]] if spec.text_b else None,
            label=label,
        ))
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} malformed rows (lines {skipped[:10]})", stacklevel=2)
    return examples


def _parse_label(spec: GlueTask, value: str, path: Path, line: int) -> str | float:
    if spec.labels is None:
        try:
            score = float(value)
        except ValueError:
            raise DataFormatError(path, line, spec.label, f"{value!r} is not a number") from None
        if not 0.0 <= score <= 5.0:
            raise DataFormatError(path, line, spec.label, f"{score} is outside STS-B's range 0..5")
        return score
    if value not in spec.labels:
        raise DataFormatError(path, line, spec.label,
                              f"unknown label {value!r} for {spec.name}; expected one of {', '.join(spec.labels)}")
    return value
