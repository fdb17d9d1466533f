"""TSV and CSV read as their formats define them, with pandas as the oracle.

TSV (IANA text/tab-separated-values) has no quoting: a line is a row and a `"` is a character, as
google-research/bert's GLUE readers (`quotechar=None`) and pandas' `read_csv(sep="\\t",
quoting=csv.QUOTE_NONE)` read it. CSV is RFC 4180: quoted cells may hold commas, tabs, doubled quotes
and line breaks. `--quoting` opts a TSV into CSV's quoting.
"""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.fileio import DataFormatError
from bertforge.tables import QuotedTsvWarning, iter_rows, read_rows, table_reading, write_all
from tests.tiny_models import save_tiny_encoder

# the file of the report: a quote opening a cell used to swallow the tab, the line break and the next row
ISSUE_EXAMPLE = b'text\tlabel\n"a great film\tpositive\nreally" dull\tnegative\nthird row\tpositive\n'

TSV_FIXTURES = {
    "issue-example": ISSUE_EXAMPLE,
    "quotes": b'text\tlabel\n"wrapped"\tpos\nhe said "hi"\tneg\n""doubled""\tpos\nend quote"\tneg\n"\t"\n',
    "bom": b'\xef\xbb\xbftext\tlabel\n"bom" first\tpos\nsecond\tneg\n',
    "crlf": b'text\tlabel\r\n"a"\tpos\r\nb "c\tneg\r\n',
    "no-final-newline": b'text\tlabel\nfirst\tpos\n"last" row\tneg',
    "blank-lines": b'text\tlabel\nfirst\tpos\n\nsecond\tneg\n\n\n',
    "empty-cells": b'text\tlabel\tnote\n\tpos\t\n"\t\t"\n',
    "unicode": 'text\tlabel\n\u201ccurly\u201d \u00e9t\u00e9\tpos\n\u00ab\u00a0guillemets\u00a0\u00bb\tneg\n'.encode(),
}

CSV_FIXTURES = {
    "quoted-commas": b'text,label\n"dull, ""flat"" film",neg\nplain,pos\n',
    "tabs-in-quotes": b'text,label\n"a\ttab inside",pos\n"two\t\ttabs",neg\n',
    "multi-line": b'text,label\n"first line\nsecond line",pos\nsingle,neg\n"a\nb\nc",pos\n',
    "bom-crlf": b'\xef\xbb\xbftext,label\r\n"x, y",pos\r\nz,neg\r\n',
    "no-final-newline": b'text,label\nfirst,pos\n"last ""quoted""",neg',
    "an-empty-quoted-cell": b'text\nhello\n""\n\nworld\n',  # `""` is a row of one empty cell, the blank line none
}


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return path


def _pandas(path: Path, **options: object) -> list[dict[str, str]]:
    frame = pd.read_csv(path, keep_default_na=False, dtype=str, **options)
    return frame.to_dict("records")


def _pandas_tsv(path: Path) -> list[dict[str, str]]:
    return _pandas(path, sep="\t", quoting=csv.QUOTE_NONE)


def _values(path: Path, **options: object) -> list[dict[str, str]]:
    return [row.values for row in read_rows(path, **options)]


def test_the_issue_example_reads_as_three_rows_with_the_quote_kept(tmp_path: Path) -> None:
    path = _write(tmp_path, "reviews.tsv", ISSUE_EXAMPLE)
    rows = read_rows(path, ["text", "label"])
    assert [row.values for row in rows] == [{"text": '"a great film', "label": "positive"},
                                            {"text": 'really" dull', "label": "negative"},
                                            {"text": "third row", "label": "positive"}]
    assert [row.number for row in rows] == [2, 3, 4]  # a line is a row
    assert [row.values for row in rows] == _pandas_tsv(path)


@pytest.mark.parametrize("name", sorted(TSV_FIXTURES))
def test_tsv_reads_as_pandas_with_quoting_off(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, f"{name}.tsv", TSV_FIXTURES[name])
    assert _values(path) == _pandas_tsv(path)


@pytest.mark.parametrize("name", sorted(TSV_FIXTURES))
def test_compressed_tsv_reads_as_the_plain_file(tmp_path: Path, name: str) -> None:
    plain = _write(tmp_path, f"{name}.tsv", TSV_FIXTURES[name])
    packed = _write(tmp_path, f"{name}.tsv.gz", TSV_FIXTURES[name])
    assert _values(packed) == _values(plain) == _pandas_tsv(packed)


@pytest.mark.parametrize("name", sorted(CSV_FIXTURES))
def test_csv_reads_as_pandas_by_rfc_4180(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, f"{name}.csv", CSV_FIXTURES[name])
    assert _values(path) == _pandas(path)


def test_a_csv_record_over_several_lines_is_counted_and_located(tmp_path: Path) -> None:
    path = _write(tmp_path, "multi.csv", CSV_FIXTURES["multi-line"])
    said: list[str] = []
    with table_reading(notify=said.append):
        rows = read_rows(path, ["text"])
    assert [row.number for row in rows] == [2, 4, 5]  # where each record starts
    assert rows[2].values["text"] == "a\nb\nc"
    assert said == [f"read {path}: 3 rows (CSV; 2 records span several lines (line breaks inside quotes))"]


def test_every_file_read_is_reported_once_with_its_rows_and_skipped_blank_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, "blank.tsv", TSV_FIXTURES["blank-lines"])
    said: list[str] = []
    with table_reading(notify=said.append):
        read_rows(path)
        read_rows(path)  # read again by the same command: said once
        next(iter_rows(_write(tmp_path, "part.tsv", ISSUE_EXAMPLE)))  # not read to the end: not said
    assert said == [f"read {path}: 2 rows (TSV, a quote is a character; 3 blank lines skipped)"]


LOOKS_QUOTED = b'"text"\t"label"\n"a fine film"\t"pos"\n"dull"\t"neg"\nplain\tpos\n'


def test_a_tsv_that_looks_quoted_warns_naming_the_option(tmp_path: Path) -> None:
    path = _write(tmp_path, "quoted.tsv", LOOKS_QUOTED)
    with pytest.warns(QuotedTsvWarning, match="--quoting"):
        rows = read_rows(path)
    assert rows[0].values == {'"text"': '"a fine film"', '"label"': '"pos"'}  # quotes kept, as pandas keeps them
    assert [row.values for row in rows] == _pandas_tsv(path)
    said: list[str] = []
    with table_reading(notify=said.append):
        read_rows(path)
    assert said[0].startswith(f"warning: {path}: 3 of its first 4 lines have cells wrapped in double quotes")


@pytest.mark.parametrize("name", ["issue-example", "quotes", "bom", "unicode"])
def test_a_quote_here_and_there_is_no_reason_to_warn(tmp_path: Path, name: str, recwarn: pytest.WarningsRecorder) -> None:
    read_rows(_write(tmp_path, f"{name}.tsv", TSV_FIXTURES[name]))
    assert not [w for w in recwarn if issubclass(w.category, QuotedTsvWarning)]


def test_quoting_opts_a_tsv_into_csv_quoting(tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    quoted = _write(tmp_path, "quoted.tsv", LOOKS_QUOTED)
    spanning = _write(tmp_path, "issue.tsv", ISSUE_EXAMPLE)
    for path in (quoted, spanning):  # pandas' default quoting is the oracle of the opt-in
        assert _values(path, quoting=True) == _pandas(path, sep="\t")
    said: list[str] = []
    with table_reading(tsv_quoting=True, notify=said.append):
        rows = read_rows(spanning)
        read_rows(quoted)
    assert [row.values["text"] for row in rows] == ["a great film\tpositive\nreally dull", "third row"]
    assert said[0] == f"read {spanning}: 2 rows (TSV with CSV quoting; 1 record spans several lines (line breaks inside quotes))"
    assert not [w for w in recwarn if issubclass(w.category, QuotedTsvWarning)]  # asked for: no warning
    assert _values(spanning, quoting=False) == _pandas_tsv(spanning)  # an explicit False wins over the block


@pytest.mark.parametrize(("data", "line", "message"), [
    (b"a\tb\tc\n1\t2\t3\n1\t2\n", 3, r"bad\.tsv:3: c: missing: 2 fields where the header has 3 \(a, b, c\)"),
    (b"a\tb\tc\n1\t2\t3\n1\t2\t3\t4\n", 3, r"bad\.tsv:3: field 4: one too many \('4'\): 4 fields where the header"),
    (b'a\tb\n"x\ty"\tz\n', 2, r"bad\.tsv:2: field 3: .*with --quoting a double quote opens a quoted cell"),
])
def test_a_row_of_the_wrong_width_names_file_line_and_field(tmp_path: Path, data: bytes, line: int,
                                                             message: str) -> None:
    path = _write(tmp_path, "bad.tsv", data)
    with pytest.raises(DataFormatError, match=message) as caught:
        read_rows(path)
    assert caught.value.line == line
    if data.count(b"\t") > 2 * data.count(b"\n"):  # too many fields: pandas refuses the same line
        with pytest.raises(pd.errors.ParserError, match=f"line {line}, saw"):
            _pandas_tsv(path)


@pytest.mark.parametrize("name", ["twice.tsv", "twice.csv"])
def test_a_column_named_twice_is_refused(tmp_path: Path, name: str) -> None:
    separator = b"\t" if name.endswith(".tsv") else b","
    path = _write(tmp_path, name, separator.join([b"text", b"label", b"text"]) + b"\na" + separator + b"b" + separator + b"c\n")
    with pytest.raises(DataFormatError, match=rf"{name}:1: text: a column named twice in the header \(columns 1 and 3\)"):
        read_rows(path)


def test_a_csv_row_with_tabs_hints_at_tsv(tmp_path: Path) -> None:
    path = _write(tmp_path, "tabs.csv", b"text,label\nfilm\tpos\n")
    with pytest.raises(DataFormatError, match=r"tabs\.csv:2: label: missing: .*named \.tsv"):
        read_rows(path)


def test_tsv_is_written_without_quoting_and_reads_back(tmp_path: Path) -> None:
    records = [{"text": '"wrapped"', "label": "pos"}, {"text": 'he said "hi"', "label": None}]
    path = tmp_path / "out.tsv"
    write_all(path, records)
    assert path.read_text() == 'text\tlabel\n"wrapped"\tpos\nhe said "hi"\t\n'
    assert _values(path) == _pandas_tsv(path) == [{**r, "label": r["label"] or ""} for r in records]
    with pytest.raises(ValueError, match=r"text: 'a\\tb' holds a tab or a line break"):
        write_all(tmp_path / "tab.tsv", [{"text": "a\tb"}])
    assert not (tmp_path / "tab.tsv").exists()  # nothing half-written


# ------------------------------------------------------------------------------------------------
# the commands say how many rows they read
# ------------------------------------------------------------------------------------------------
WORDS = "a great film really dull third row positive negative good bad story fine poor"


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("model"), WORDS, vocab_size=80)


def _said(result: object) -> str:
    return " ".join(result.output.split())  # type: ignore[attr-defined]


def test_finetune_and_predict_report_the_rows_of_a_tsv_with_quotes(encoder_dir: Path, tmp_path: Path) -> None:
    rows = [("a great film", "positive"), ('"really" dull', "negative"), ("good story", "positive"),
            ('poor "film', "negative")] * 3
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\n" + "".join(f"{t}\t{label}\n" for t, label in rows), encoding="utf-8")
    dev = _write(tmp_path, "dev.tsv", ISSUE_EXAMPLE)
    out = tmp_path / "run"
    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "classify", "--model", str(encoder_dir), "--train", str(train),
                                 "--dev", str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "4",
                                 "--max-length", "16"])
    assert result.exit_code == 0, result.output
    said = _said(result)
    assert f"read {train}: 12 rows (TSV, a quote is a character)" in said
    assert f"read {dev}: 3 rows (TSV, a quote is a character)" in said
    predictions = [json.loads(line) for line in (out / "seed-1" / "predictions-dev.jsonl").read_text().splitlines()]
    assert len(predictions) == 3  # rows in, rows out

    preds = tmp_path / "preds.jsonl"
    result = runner.invoke(app, ["predict", "--model", str(out / "seed-1"), "--input", str(dev), "--out", str(preds),
                                 "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f"read {dev}: 3 rows (TSV, a quote is a character)" in _said(result)
    assert [json.loads(line)["text"] for line in preds.read_text().splitlines()] == \
        ['"a great film', 'really" dull', "third row"]

    result = runner.invoke(app, ["predict", "--model", str(out / "seed-1"), "--input", str(dev), "--out", str(preds),
                                 "--no-progress", "--quoting"])
    assert result.exit_code == 0, result.output
    assert f"read {dev}: 2 rows (TSV with CSV quoting; 1 record spans" in _said(result)
    assert len(preds.read_text().splitlines()) == 2


def test_finetune_records_quoting_and_a_rerun_without_it_is_another_run(encoder_dir: Path, tmp_path: Path) -> None:
    """--quoting changes the rows a run reads: run_config.yaml records it, and the same command without it
    does not continue the run (the fingerprint differs)."""
    train = _write(tmp_path, "train.tsv", b'text\tlabel\n' + b'"a good" film\tpositive\npoor film\tnegative\n' * 3)
    out = tmp_path / "run"
    command = ["finetune", "classify", "--model", str(encoder_dir), "--train", str(train), "--dev", str(train),
               "--out", str(out), "--epochs", "1", "--batch-size", "4", "--max-length", "16"]
    result = CliRunner().invoke(app, [*command, "--quoting"])
    assert result.exit_code == 0, result.output
    assert f"read {train}: 6 rows (TSV with CSV quoting)" in _said(result)
    assert "quoting: true" in (out / "run_config.yaml").read_text(encoding="utf-8")
    again = CliRunner().invoke(app, command)
    assert again.exit_code == 2 and "quoting true -> false" in _said(again).lower()


DOCS = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"


@pytest.mark.parametrize(("name", "data"), [
    ("reviews.tsv", b"text\tlabel\na\tpos\nb\tneg\nc\tpos\nd\n"),
    ("reviews.tsv", b"text\tlabel\na\tpos\nb\tneg\nc\tpos\nd\tpos\t5 stars\n"),
    ("reviews.csv", b"text,label,text\na,b,c\n"),
])
def test_the_errors_docs_own_data_shows_are_the_errors_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            name: str, data: bytes) -> None:
    monkeypatch.chdir(tmp_path)
    Path(name).write_bytes(data)
    with pytest.raises(DataFormatError) as caught:
        read_rows(name)
    assert f"| `error: {caught.value}` |" in DOCS.read_text(encoding="utf-8")


def test_the_warning_docs_own_data_shows_is_the_warning_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("reviews.tsv").write_bytes(b'"text"\t"label"\n"a fine film"\t"pos"\n"dull"\t"neg"\n"fine"\t"pos"\n')
    said: list[str] = []
    with table_reading(notify=said.append):
        read_rows("reviews.tsv")
    assert said[0] in DOCS.read_text(encoding="utf-8").splitlines()
