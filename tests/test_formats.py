"""One place decides a user's file's format: by name (compression looked through), by content where the name
leaves a choice (`.json`: a JSON document or JSON lines), within what the caller reads; else one error line."""

from __future__ import annotations

import bz2
import gzip
import json
from types import SimpleNamespace

import pytest

from bertforge.fileio import DataFormatError
from bertforge.formats import FORMATS, detect_format, expected, named_formats

TABLES = ("csv", "tsv", "jsonl", "parquet", "lines")
CORPUS = ("lines", "jsonl", "parquet")
QA = ("json", "jsonl", "parquet")
TAG = ("jsonl", "parquet", "columns")

SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
    {"id": "q1", "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
ROWS = [{"id": "q1", "question": "Where is Paris?", "context": "Paris is in France.",
         "answers": {"text": ["France"], "answer_start": [12]}}] * 2


def _jsonl(rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _one_line(error: pytest.ExceptionInfo, path) -> str:
    message = str(error.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


# ------------------------------------------------------------------------------------------------
# by name
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, accept, fmt", [
    ("r.csv", TABLES, "csv"), ("r.tsv", TABLES, "tsv"), ("R.CSV", TABLES, "csv"), ("r.jsonl", TABLES, "jsonl"),
    ("r.ndjson", TABLES, "jsonl"), ("r.parquet", TABLES, "parquet"), ("r.txt", TABLES, "lines"),
    ("readme", TABLES, "lines"), ("r.conll", TABLES, "lines"), ("r.weird", CORPUS, "lines"),
    ("t.tsv", TAG, "columns"), ("t.txt", TAG, "columns"), ("t.conll", TAG, "columns"), ("t.iob", TAG, "columns"),
    ("t.jsonl", TAG, "jsonl"), ("q.parquet", QA, "parquet"),
])
def test_the_name_decides_where_it_can(tmp_path, name, accept, fmt):
    assert detect_format(tmp_path / name, accept, read=False) == fmt  # the file need not exist
    assert detect_format(tmp_path / name, accept) == fmt


@pytest.mark.parametrize("name, accept, fmt", [
    ("r.csv.gz", TABLES, "csv"), ("r.tsv.bz2", TABLES, "tsv"), ("r.jsonl.zst", TABLES, "jsonl"),
    ("r.txt.xz", CORPUS, "lines"), ("corpus.gz", CORPUS, "lines"),
])
def test_a_compression_suffix_is_looked_through(tmp_path, name, accept, fmt):
    assert detect_format(tmp_path / name, accept, read=False) == fmt
    assert named_formats(tmp_path / name) == named_formats(tmp_path / name.rsplit(".", 1)[0])


@pytest.mark.parametrize("name, accept, message", [
    ("r.parquet.gz", TABLES, "r.parquet.gz: Parquet cannot be read compressed (a Parquet file compresses its "
                             "own columns): give the r.parquet file itself, not a compressed copy"),
    ("t.txt.gz", TAG, "t.txt.gz: column files cannot be read compressed: give the t.txt file itself"),
])
def test_a_format_read_uncompressed_refuses_a_compressed_file(tmp_path, name, accept, message):
    with pytest.raises(DataFormatError) as error:
        detect_format(tmp_path / name, accept)
    assert message in _one_line(error, tmp_path / name)


def test_a_name_of_another_format_is_one_line_naming_what_is_expected(tmp_path):
    with pytest.raises(DataFormatError) as error:
        detect_format(tmp_path / "notes.csv", CORPUS)
    assert _one_line(error, tmp_path / "notes.csv").endswith(
        "notes.csv: a .csv file is CSV; expected plain lines (.txt or any other name), "
        "JSON lines (.jsonl, .ndjson, .json) or Parquet (.parquet)")
    assert expected(["csv"]) == "CSV (.csv)"


def test_unknown_format_names_are_a_programming_error(tmp_path):
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        detect_format(tmp_path / "a.xml", ("xml",))
    assert set(QA + TAG + TABLES) <= set(FORMATS)


# ------------------------------------------------------------------------------------------------
# by content
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content, accept, fmt", [
    (json.dumps(SQUAD, indent=1), QA, "json"),           # pretty-printed: the first line goes on below
    (json.dumps(SQUAD), QA, "json"),                     # one line, the whole file: a document where one is read
    (json.dumps(SQUAD), TABLES, "jsonl"),                # ... and one record where rows are read
    ("\ufeff  \n" + json.dumps(SQUAD, indent=1), QA, "json"),
    (_jsonl(ROWS), QA, "jsonl"),
    ("\n" + _jsonl(ROWS) + "\n", TABLES, "jsonl"),
    ('{"text": "a" "b"}\n{"text": "c"}\n', TABLES, "jsonl"),  # a bad first record: the reader locates it
    ('["O", "B-PER", "I-PER"]\n', ("json", "lines"), "json"),
    ("", QA, "jsonl"),                                   # empty: (no) JSON lines, the reader says so
])
def test_json_is_told_apart_by_its_first_line(tmp_path, content, accept, fmt):
    path = tmp_path / "f.json"
    path.write_text(content, encoding="utf-8")
    assert detect_format(path, accept) == fmt


def test_content_is_read_through_compression(tmp_path):
    path = tmp_path / "f.json.gz"
    path.write_bytes(gzip.compress(_jsonl(ROWS).encode()))
    assert detect_format(path, QA) == "jsonl"
    path.write_bytes(gzip.compress(json.dumps(SQUAD, indent=1).encode()))
    with pytest.raises(DataFormatError) as error:
        detect_format(path, QA)
    assert "a JSON document cannot be read compressed: give the f.json file itself" in _one_line(error, path)


def test_a_name_that_says_no_format_is_read_by_content_where_no_text_is_read(tmp_path):
    path = tmp_path / "train.txt"
    path.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    assert detect_format(path, QA) == "json"
    assert detect_format(path, TABLES) == "lines"  # where plain lines are read, a .txt file is plain lines
    path.write_text(_jsonl(ROWS), encoding="utf-8")
    assert detect_format(path, QA) == "jsonl"


@pytest.mark.parametrize("content, accept, found", [
    (json.dumps(SQUAD, indent=1), TABLES, "it holds a JSON document; expected CSV (.csv), TSV (.tsv), JSON lines"),
    (_jsonl(ROWS), ("json", "lines"), "it holds JSON lines; expected a JSON document (.json) or plain lines"),
    ("O\nB-PER\n", ("json", "lines"), "it starts 'O', which is neither JSON lines nor a JSON document; expected"),
    ("", ("json",), "it is empty; expected a JSON document (.json)"),
])
def test_json_of_the_wrong_kind_is_one_line(tmp_path, content, accept, found):
    path = tmp_path / "f.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError) as error:
        detect_format(path, accept)
    assert f"f.json: {found}" in _one_line(error, path)


def test_an_unreadable_or_undecidable_file_is_one_line(tmp_path):
    broken = tmp_path / "f.json.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(DataFormatError) as error:
        detect_format(broken, QA)
    assert "f.json.gz: cannot be read (" in _one_line(error, broken)
    assert "; expected a JSON document (.json), JSON lines (.jsonl, .ndjson, .json) or Parquet" in str(error.value)

    cut = tmp_path / "cut.json.bz2"
    cut.write_bytes(bz2.compress(b'{"a": 1}\n' * 100)[:20])
    with pytest.raises(DataFormatError) as error:
        detect_format(cut, TABLES)
    assert "cut.json.bz2: cannot be read (" in _one_line(error, cut)

    latin = tmp_path / "latin.json"
    latin.write_bytes(b'\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataFormatError) as error:
        detect_format(latin, TABLES)
    assert "latin.json:2: not UTF-8 text (b'\\xe9' at byte 14 of the line); expected" in _one_line(error, latin)

    with pytest.raises(DataFormatError) as error:  # a name that leaves the choice open, and no content to read
        detect_format(tmp_path / "out.json", TABLES, read=False)
    assert "a .json file may be JSON lines: its name alone does not say which" in _one_line(error,
                                                                                          tmp_path / "out.json")
    with pytest.raises(FileNotFoundError, match="missing.json: no such file"):
        detect_format(tmp_path / "missing.json", QA)


# ------------------------------------------------------------------------------------------------
# every caller: a file of the wrong format is one line
# ------------------------------------------------------------------------------------------------
def test_tables_refuse_a_json_document_and_read_json_lines(tmp_path):
    from bertforge.tables import read_rows, table_format, write_rows

    path = tmp_path / "squad.json"
    path.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    with pytest.raises(DataFormatError) as error:
        read_rows(path, ["text"])
    assert "squad.json: it holds a JSON document; expected CSV (.csv)" in _one_line(error, path)
    path.write_text(_jsonl(ROWS), encoding="utf-8")
    assert table_format(path) == "jsonl" and [r.values["id"] for r in read_rows(path, ["question"])] == ["q1"] * 2
    for name in ("out.json", "out.txt", "out.jsonl.gz", "out.parquet"):
        with pytest.raises(ValueError, match="predictions are written as .jsonl, .csv or .tsv"), \
                write_rows(tmp_path / name):
            pass


def test_prepare_reads_a_csv_by_its_text_column_and_refuses_a_json_document_in_one_line(tmp_path):
    from bertforge.data.corpus import DataError
    from bertforge.data.sources import expand_inputs, input_kind, plan_shards

    table = tmp_path / "notes.csv"
    table.write_text("text,label\nsome text,1\n", encoding="utf-8")
    assert input_kind(table) == "csv" and plan_shards([table], 1)[0][0][0].kind == "csv"
    with pytest.raises(DataError) as error:
        plan_shards([table], 1, text_column="review")
    assert "notes.csv: no column 'review' (columns: text, label)" in _one_line(error, table)
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"squad\.json: it holds a JSON document; expected plain lines"):
        input_kind(squad)
    rows = tmp_path / "rows.json"
    rows.write_text(_jsonl([{"text": "One. Two."}] * 2), encoding="utf-8")
    assert input_kind(rows) == "jsonl" and input_kind(tmp_path / "a.txt.gz") == "text"
    # a directory contributes what its names alone say: not .csv, not .json (too often metadata)
    (tmp_path / "corpus.txt").write_text("A sentence.\n", encoding="utf-8")
    (tmp_path / "c.parquet.gz").write_bytes(b"")
    assert [p.name for p in expand_inputs(tmp_path)] == ["corpus.txt"]


def _run(callable_, path):
    with pytest.raises(DataFormatError) as error:
        callable_()
    return _one_line(error, path)


def test_qa_refuses_a_file_of_another_format_in_one_line(tmp_path):
    from bertforge.tasks import make_task

    table = tmp_path / "q.csv"
    table.write_text("question,context\nWhere?,Here.\n", encoding="utf-8")
    message = _run(lambda: make_task("qa", "qa", {"dev": str(table), "version": "1.1"}).read(None, "dev"), table)
    assert message == (f"{table}: a .csv file is CSV; expected a JSON document (.json), "
                       "JSON lines (.jsonl, .ndjson, .json) or Parquet (.parquet)")
    rows = tmp_path / "rows.json"  # JSON lines named .json are rows, a SQuAD document is SQuAD
    rows.write_text(_jsonl([ROWS[0], {**ROWS[0], "id": "q2"}]), encoding="utf-8")
    squad = tmp_path / "squad.txt"
    squad.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    for path in (rows, squad):
        examples = make_task("qa", "qa", {"dev": str(path), "version": "1.1"}).read(None, "dev")
        assert examples[0].answers[0].text == "France"


def test_tag_refuses_a_file_of_another_format_in_one_line(tmp_path):
    from bertforge.tasks import make_task
    from bertforge.tasks.tag import read_tag_names

    squad = tmp_path / "t.json"
    squad.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    message = _run(lambda: make_task("tag", "tag", {"dev": str(squad)}).read(None, "dev"), squad)
    assert message == (f"{squad}: it holds a JSON document; expected JSON lines (.jsonl, .ndjson, .json), "
                       "Parquet (.parquet) or column files (.txt, .tsv, .conll or any other name)")
    table = tmp_path / "t.csv"
    table.write_text("tokens,tags\n", encoding="utf-8")
    assert "t.csv: a .csv file is CSV; expected" in _run(lambda: make_task("tag", "tag", {"dev": str(table)})
                                                         .read(None, "dev"), table)
    columns = tmp_path / "t.tsv"  # CoNLL files are often .tsv
    columns.write_text("Paris\tB-LOC\nis\tO\n", encoding="utf-8")
    assert make_task("tag", "tag", {"dev": str(columns)}).read(None, "dev")[0].words == ["Paris", "is"]
    names = tmp_path / "names.json"
    names.write_text("O\nB-PER\n", encoding="utf-8")
    assert "names.json: it starts 'O'" in _run(lambda: read_tag_names(str(names)), names)
    names.write_text('["O", "B-PER", "I-PER"]', encoding="utf-8")
    assert read_tag_names(str(names)) == ["O", "B-PER", "I-PER"]


def test_predict_file_refuses_a_file_of_another_format_in_one_line(tmp_path):
    from bertforge.pipeline import predict_file

    out = tmp_path / "out.jsonl"
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps(SQUAD, indent=1), encoding="utf-8")
    classify = SimpleNamespace(task="text-classification")
    assert "squad.json: it holds a JSON document; expected CSV (.csv), TSV (.tsv), JSON lines" in _run(
        lambda: predict_file(classify, squad, out, progress=False), squad)
    # plain lines have one column, "text": not a format for question answering
    questions = tmp_path / "questions.txt"
    questions.write_text("Where is Paris?\n", encoding="utf-8")
    message = _run(lambda: predict_file(SimpleNamespace(task="question-answering"), questions, out,
                                        progress=False), questions)
    assert message == (f"{questions}: it starts 'Where is Paris?', which is neither JSON lines nor a JSON document; "
                       "expected CSV (.csv), TSV (.tsv), JSON lines (.jsonl, .ndjson, .json) or Parquet (.parquet)")
    assert not out.exists()
