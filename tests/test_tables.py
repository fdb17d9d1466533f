"""Users' files as rows: every format, compression, streaming, located errors, atomic writing."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertforge.fileio import DataFormatError
from bertforge.tables import column_names, iter_rows, read_rows, table_format, write_all, write_rows

RECORDS = [{"text": "a gripping film", "label": "positive"}, {"text": "dull, \"flat\"", "label": "negative"}]


def write_fixture(path, records=RECORDS):
    name = path.name.removesuffix(".gz")
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=1)
        return path
    if name.endswith((".csv", ".tsv")):
        write_all(path.with_suffix("") if path.suffix == ".gz" else path, records)
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(path.with_suffix("").read_bytes()))
        return path
    text = "".join(json.dumps(r) + "\n" for r in records)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as handle:
        handle.write(text)
    return path


@pytest.mark.parametrize("name", ["r.csv", "r.tsv", "r.jsonl", "r.jsonl.gz", "r.csv.gz", "r.parquet"])
def test_every_format_gives_the_same_rows(tmp_path, name):
    path = write_fixture(tmp_path / name)
    rows = read_rows(path, ["text", "label"])
    assert [row.values for row in rows] == RECORDS
    assert column_names(path) == ["text", "label"]
    if table_format(path) in ("csv", "tsv"):
        assert [row.number for row in rows] == [2, 3]  # the header is line 1
    else:
        assert [row.number for row in rows] == [1, 2]


def test_plain_lines_are_one_text_column(tmp_path):
    path = tmp_path / "new.txt"
    path.write_text("\ufefffirst sentence\r\nsecond\n", encoding="utf-8")
    assert [(r.number, r.values) for r in iter_rows(path, ["text"])] == [(1, {"text": "first sentence"}),
                                                                        (2, {"text": "second"})]


def test_csv_quoted_line_break_keeps_the_start_line(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text('text,label\n"two\nlines",a\nnext,b\n', encoding="utf-8")
    rows = read_rows(path)
    assert [(r.number, r.values["text"]) for r in rows] == [(2, "two\nlines"), (4, "next")]


def test_missing_column_names_the_columns_found(tmp_path):
    path = write_fixture(tmp_path / "r.csv")
    with pytest.raises(DataFormatError, match=r"r\.csv:2: sentence: no such column; the columns are: text, label"):
        read_rows(path, ["sentence"])


def test_jsonl_record_missing_a_key_is_located(tmp_path):
    path = write_fixture(tmp_path / "r.jsonl", RECORDS + [{"text": "no label"}])
    with pytest.raises(DataFormatError, match=r"r\.jsonl:3: label: no such column"):
        read_rows(path, ["text", "label"])


@pytest.mark.parametrize("content, message", [
    (b"", "empty file"),
    (b"text,label\n", "empty file"),
    (b"text,label\ngood,a\nbad\xe9,b\n", r":3: not UTF-8"),
    (b"text,label\ngood,a\nshort\n", r":3: label: missing: 1 fields where the header has 2"),
])
def test_bad_csv_is_one_located_line(tmp_path, content, message):
    path = tmp_path / "r.csv"
    path.write_bytes(content)
    with pytest.raises(DataFormatError, match=message):
        read_rows(path)


def test_bad_json_is_located(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"text": "a"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"r\.jsonl:2: not a JSON record"):
        read_rows(path)


def test_parquet_streams_in_batches(tmp_path):
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": [f"sentence {i}" for i in range(5000)]}), path, row_group_size=1000)
    rows = iter_rows(path, ["text"], batch_rows=100)
    first = next(rows)
    assert first.number == 1 and first.values == {"text": "sentence 0"}
    assert sum(1 for _ in rows) == 4999


def test_write_rows_is_atomic(tmp_path):
    path = tmp_path / "preds.csv"
    with pytest.raises(RuntimeError), write_rows(path) as write:
        write({"label": "positive", "scores": [0.9, 0.1]})
        raise RuntimeError("crash mid-file")
    assert not path.exists() and not list(tmp_path.iterdir())
    write_all(path, [{"label": "positive", "scores": [0.9, 0.1]}])
    assert path.read_text() == 'label,scores\npositive,"[0.9, 0.1]"\n'
