"""Task readers on small fixtures (tests/fixtures/tasks) and on malformed input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertforge.tasks.glue import GLUE_TASKS, DataFormatError, glue_task, read_glue, read_glue_file
from bertforge.tasks.ner import CONLL2003_LABELS, iob1_to_iob2, label_list, read_conll
from bertforge.tasks.squad import read_squad
from bertforge.tasks.swag import read_swag

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
GLUE = FIXTURES / "glue"

# ---------------------------------------------------------------------------------------------------
# GLUE
# ---------------------------------------------------------------------------------------------------

GLUE_COUNTS = {  # task -> {split: examples in the fixture}
    "cola": {"train": 3, "dev": 2, "test": 2}, "sst2": {"train": 2, "dev": 1, "test": 1},
    "mrpc": {"train": 2, "dev": 1, "test": 1}, "stsb": {"train": 2, "dev": 1, "test": 1},
    "qqp": {"train": 2, "dev": 1, "test": 1},
    "mnli": {"train": 2, "dev_matched": 1, "dev_mismatched": 1, "test_matched": 1, "test_mismatched": 1},
    "qnli": {"train": 2, "dev": 1, "test": 1}, "rte": {"train": 2, "dev": 1, "test": 1},
    "wnli": {"train": 2, "dev": 1, "test": 1}, "ax": {"test": 2},
}


@pytest.mark.parametrize(("task", "split"), [(t, s) for t, splits in GLUE_COUNTS.items() for s in splits])
def test_glue_every_task_and_split(task, split):
    spec = GLUE_TASKS[task]
    examples = read_glue(GLUE, task, split)
    assert len(examples) == GLUE_COUNTS[task][split]
    for example in examples:
        assert example.text_a and (example.text_b is None) == (spec.text_b is None)
        if split.startswith("test"):
            assert example.label is None
        elif spec.is_regression:
            assert isinstance(example.label, float) and 0 <= example.label <= 5
        else:
            assert example.label in spec.labels


def test_glue_file_details():
    cola = read_glue(GLUE, "CoLA", "train")
    assert [e.label for e in cola] == ["1", "0", "1"]
    assert cola[2].text_a == 'She said "hello" twice.'        # no csv quoting: quotes are text
    assert read_glue(GLUE, "cola", "dev")[-1].text_a == "I saw him."  # last line without a newline
    mrpc = read_glue(GLUE, "MRPC", "train")                    # BOM before the "Quality" header
    assert mrpc[0].label == "1" and mrpc[0].text_b == '"The company made money," he said.'
    assert read_glue(GLUE, "STS-B", "train")[0].label == pytest.approx(4.2)
    assert [e.guid for e in read_glue(GLUE, "QQP", "train")] == ["train-7", "train-8"]
    assert read_glue(GLUE, "qqp", "test")[0].guid == "test-0"
    mnli = read_glue(GLUE, "MNLI", "dev_matched")              # 16 columns, label is gold_label (last)
    assert mnli[0].label == "neutral" and mnli[0].text_b == "She bought a red car."
    assert read_glue(GLUE, "MNLI-mm", "dev_mismatched")[0].label == "entailment"
    assert glue_task("sts-b").labels is None and glue_task("RTE").labels == ("entailment", "not_entailment")


def test_glue_bad_task_or_split(tmp_path):
    with pytest.raises(ValueError, match="MNLI has no split 'dev'"):
        read_glue(GLUE, "mnli", "dev")
    with pytest.raises(ValueError, match="unknown GLUE task"):
        read_glue(GLUE, "imdb", "train")
    with pytest.raises(FileNotFoundError, match="GLUE layout"):
        read_glue(tmp_path, "rte", "train")


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_glue_missing_column(tmp_path):
    path = _write(tmp_path / "RTE" / "train.tsv", "index\tsentence1\tsentence2\n0\ta\tb\n")
    with pytest.raises(DataFormatError) as info:
        read_glue(tmp_path, "rte", "train")
    assert (info.value.line, info.value.field) == (1, "label")
    assert str(info.value).startswith(f"{path}:1: label: missing column")


def test_glue_unknown_label_names_line_and_field(tmp_path):
    _write(tmp_path / "RTE" / "dev.tsv", "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n"
                                         "1\tc\td\tentailed\n")
    with pytest.raises(DataFormatError, match=r"dev.tsv:3: label: unknown label 'entailed' for RTE"):
        read_glue(tmp_path, "rte", "dev")


def test_glue_wrong_field_count_and_skip(tmp_path):
    path = _write(tmp_path / "QQP" / "train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                                                  "1\t1\t2\tq?\tr?\t0\n2\t3\t4\tonly one question\n"
                                                  "3\t5\t6\tx?\ty?\t1\n")
    with pytest.raises(DataFormatError, match=r"train.tsv:3: 4 tab-separated fields, expected 6"):
        read_glue_file(path, "qqp")
    with pytest.warns(UserWarning, match=r"skipped 1 malformed rows \(lines \[3\]\)"):
        examples = read_glue_file(path, "qqp", skip_malformed=True)
    assert [e.guid for e in examples] == ["train-1", "train-3"]


def test_glue_stsb_score_and_cola_columns(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    path = _write(tmp_path / "dev.tsv", header + "0\tg\tf\ty\t1\tn\tn\ta\tb\tfive\n")
    with pytest.raises(DataFormatError, match=r":2: score: 'five' is not a number"):
        read_glue_file(path, "stsb")
    path = _write(tmp_path / "train.tsv", "src\t1\t\tA sentence.\nsrc\t1\tA sentence.\n")
    with pytest.raises(DataFormatError, match=r"train.tsv:2: 3 tab-separated fields, expected 4"):
        read_glue_file(path, "cola")


def test_glue_not_utf8_and_empty(tmp_path):
    path = _write(tmp_path / "dev.tsv", b"sentence\tlabel\nok\t1\nbad \xff byte\t0\n")
    with pytest.raises(DataFormatError, match=r"dev.tsv:3: not UTF-8"):
        read_glue_file(path, "sst2")
    with pytest.raises(DataFormatError, match="empty file"):
        read_glue_file(_write(tmp_path / "empty.tsv", b""), "sst2")


# ---------------------------------------------------------------------------------------------------
# CoNLL-2003
# ---------------------------------------------------------------------------------------------------


def test_iob1_to_iob2():
    assert iob1_to_iob2(["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG", "I-ORG"]) == \
        ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG", "I-ORG"]
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC"]
    assert iob1_to_iob2(iob2) == iob2  # IOB2 input passes unchanged


def test_conll_with_docstart():
    sentences = read_conll(FIXTURES / "conll" / "with_docstart.txt")
    assert [len(s.words) for s in sentences] == [7, 5]
    first = sentences[0]
    assert first.words[:2] == ["Rome", "talks"] and first.pos_tags[0] == "NNP" and first.chunk_tags[-1] == "O"
    assert first.labels == ["B-LOC", "O", "O", "B-PER", "I-PER", "B-PER", "O"]
    assert sentences[1].labels == ["B-ORG", "I-ORG", "I-ORG", "O", "O"]
    assert [s.doc_index for s in sentences] == [0, 1]
    assert label_list(sentences) == list(CONLL2003_LABELS)


def test_conll_without_leading_docstart_and_keep_scheme():
    path = FIXTURES / "conll" / "without_docstart.txt"
    sentences = read_conll(path)
    assert [s.words[0] for s in sentences] == ["EU", "Oslo", "Peter"]  # two blank lines are one break
    assert sentences[0].labels == ["B-ORG", "O", "B-MISC", "B-MISC", "O"]
    assert [s.doc_index for s in sentences] == [0, 0, 1]
    assert read_conll(path, scheme="keep")[0].labels == ["I-ORG", "O", "I-MISC", "B-MISC", "O"]
    assert sentences[0].guid == "without_docstart.txt-0"


def test_conll_errors(tmp_path):
    path = _write(tmp_path / "bad.txt", "EU NNP I-NP I-ORG\nrejects VBZ I-VP\n")
    with pytest.raises(DataFormatError) as info:
        read_conll(path)
    assert (info.value.line, info.value.field) == (2, "columns")
    assert "3 fields, expected 4" in str(info.value)
    path = _write(tmp_path / "tag.txt", "-DOCSTART- -X- -X- O\n\nEU NNP I-NP ORG\n")
    with pytest.raises(DataFormatError, match=r"tag.txt:3: NER tag: 'ORG' is not O, B-TYPE or I-TYPE"):
        read_conll(path)
    assert read_conll(_write(tmp_path / "two.txt", "EU B-ORG\n"), n_columns=2)[0].labels == ["B-ORG"]
    with pytest.raises(DataFormatError, match="E-ORG"):
        read_conll(_write(tmp_path / "ioe.txt", "EU NNP I-NP E-ORG\n"))


# ---------------------------------------------------------------------------------------------------
# SQuAD
# ---------------------------------------------------------------------------------------------------


def test_squad_v1():
    examples = read_squad(FIXTURES / "squad" / "v1.json")
    assert [e.id for e in examples] == ["q1", "q2", "q3"]
    q1 = examples[0]
    assert q1.title == "Normans" and not q1.is_impossible and [a.text for a in q1.answers] == ["France", "in France"]
    for example in examples:
        for answer in example.answers:
            assert example.context[answer.answer_start:answer.answer_start + len(answer.text)] == answer.text


def test_squad_v2():
    examples = read_squad(FIXTURES / "squad" / "v2.json")
    assert [(e.id, e.is_impossible, len(e.answers)) for e in examples] == [("a1", False, 1), ("a2", True, 0)]
    assert examples[0].answers[0].text == "Zürich"


def _squad_file(tmp_path: Path, mutate) -> Path:
    data = json.loads((FIXTURES / "squad" / "v1.json").read_text(encoding="utf-8"))
    mutate(data)
    return _write(tmp_path / "s.json", json.dumps(data, indent=1, ensure_ascii=False))


def test_squad_misaligned_answer_is_reported_with_ids_and_line(tmp_path):
    def shift(data):
        data["data"][1]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 1
    path = _squad_file(tmp_path, shift)
    with pytest.raises(DataFormatError) as info:
        read_squad(path)
    err = info.value
    assert err.field == "data[1].paragraphs[0].qas[0].answers[0]"
    assert "article 'Zürich', question q3" in str(err) and "'1948'" in str(err)
    assert path.read_text(encoding="utf-8").splitlines()[err.line - 1].strip() == '"id": "q3",'
    with pytest.warns(UserWarning, match="skipped 1 answers.*1 questions were left"):
        assert [e.id for e in read_squad(path, on_misaligned="skip")] == ["q1", "q2"]


def test_squad_structure_errors(tmp_path):
    def drop_question(data):
        del data["data"][0]["paragraphs"][0]["qas"][1]["question"]
    with pytest.raises(DataFormatError, match=r"data\[0\].paragraphs\[0\].qas\[1\].question: missing"):
        read_squad(_squad_file(tmp_path, drop_question))

    def string_start(data):
        data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = "12"
    with pytest.raises(DataFormatError, match="answer_start: expected int, got str"):
        read_squad(_squad_file(tmp_path, string_start))

    def duplicate(data):
        data["data"][1]["paragraphs"][0]["qas"][0]["id"] = "q1"
    with pytest.raises(DataFormatError, match="duplicate question id 'q1'"):
        read_squad(_squad_file(tmp_path, duplicate))

    def no_answers(data):
        data["data"][0]["paragraphs"][0]["qas"][1]["answers"] = []
    with pytest.raises(DataFormatError, match="q2 has no answers and is not marked is_impossible"):
        read_squad(_squad_file(tmp_path, no_answers))


def test_squad_malformed_json_has_line(tmp_path):
    path = _write(tmp_path / "s.json", '{"version": "1.1",\n "data": [\n  {"title": "x",}\n ]}\n')
    with pytest.raises(DataFormatError) as info:
        read_squad(path)
    assert (info.value.line, info.value.field) == (3, "json")
    with pytest.raises(DataFormatError, match="not a SQuAD file"):
        read_squad(_write(tmp_path / "l.json", "[1, 2]"))


# ---------------------------------------------------------------------------------------------------
# SWAG
# ---------------------------------------------------------------------------------------------------


def test_swag_csv():
    examples = read_swag(FIXTURES / "swag" / "train.csv")
    assert [(e.guid, e.label) for e in examples] == [("1001", 0), ("1002", 1)]
    first = examples[0]
    assert first.context == "She opens the door." and first.start_ending == "She"
    assert first.endings == ["walks in, smiling.", "eats the door.", "flies away.", 'sings "loudly".']


def test_swag_test_csv_without_labels():
    examples = read_swag(FIXTURES / "swag" / "test.csv")
    assert [e.label for e in examples] == [None, None]
    assert examples[0].endings[3] == "multi\nline ending."


def test_swag_jsonl():
    examples = read_swag(FIXTURES / "swag" / "sample.jsonl")
    assert [(e.guid, e.label) for e in examples] == [("sample-0", 2), ("sample-1", 3)]
    assert examples[1].endings[0] == "drops it." and examples[1].start_ending == "He"


def test_swag_errors(tmp_path):
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,label\n"
    with pytest.raises(DataFormatError, match=r"a.csv:1: ending3: missing column"):
        read_swag(_write(tmp_path / "a.csv", header))
    text = (FIXTURES / "swag" / "test.csv").read_text(encoding="utf-8")
    lines = text.replace(",ending3\n", ",ending3,label\n", 1).splitlines()
    # the first record spans lines 2-3 (a quoted newline), so the second record starts on line 4
    lines[2] += ",1"
    lines[3] += ",7"
    with pytest.raises(DataFormatError, match=r"b.csv:4: label: 7 is not an ending index 0..3"):
        read_swag(_write(tmp_path / "b.csv", "\n".join(lines) + "\n"))
    good = json.dumps({"sent1": "a", "sent2": "b", "ending0": "c", "ending1": "d", "ending2": "e",
                       "ending3": "f", "label": 1})
    with pytest.raises(DataFormatError, match=r"c.jsonl:2: json:"):
        read_swag(_write(tmp_path / "c.jsonl", good + "\n{not json}\n"))
    with pytest.raises(DataFormatError, match=r"d.jsonl:2: ending2: missing"):
        read_swag(_write(tmp_path / "d.jsonl", good + "\n" + good.replace('"ending2"', '"ending9"') + "\n"))
    with pytest.raises(DataFormatError, match=r"e.jsonl:1: label"):
        read_swag(_write(tmp_path / "e.jsonl", good.replace('"label": 1', '"label": true')))


# ---------------------------------------------------------------------------------------------------
# Property: random bytes and truncated files give DataFormatError (or a result), never a traceback
# ---------------------------------------------------------------------------------------------------

_READERS = {
    "glue_rte": lambda p: read_glue_file(p, "rte"),
    "glue_cola": lambda p: read_glue_file(p, "cola"),
    "glue_mnli": lambda p: read_glue_file(p, "mnli"),
    "conll": read_conll,
    "squad": read_squad,
    "swag_csv": read_swag,
    "swag_jsonl": read_swag,
}
_SOURCES = {
    "glue_rte": GLUE / "RTE" / "train.tsv", "glue_cola": GLUE / "CoLA" / "train.tsv",
    "glue_mnli": GLUE / "MNLI" / "dev_matched.tsv", "conll": FIXTURES / "conll" / "with_docstart.txt",
    "squad": FIXTURES / "squad" / "v2.json", "swag_csv": FIXTURES / "swag" / "train.csv",
    "swag_jsonl": FIXTURES / "swag" / "sample.jsonl",
}
_SUFFIX = {"squad": ".json", "swag_csv": ".csv", "swag_jsonl": ".jsonl"}


def _read_or_format_error(reader_name: str, path: Path) -> None:
    try:
        result = _READERS[reader_name](path)
    except DataFormatError as exc:
        assert str(path) in str(exc)
    else:
        assert isinstance(result, list)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    directory = tmp_path_factory.mktemp("fuzz")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@settings(max_examples=60, deadline=None)
@given(reader_name=st.sampled_from(sorted(_READERS)), data=st.binary(max_size=400))
def test_random_bytes_never_crash_a_reader(scratch, reader_name, data):
    path = scratch / f"random{_SUFFIX.get(reader_name, '.txt')}"
    path.write_bytes(data)
    _read_or_format_error(reader_name, path)


@settings(max_examples=80, deadline=None)
@given(reader_name=st.sampled_from(sorted(_READERS)), fraction=st.floats(0.0, 1.0))
def test_truncated_files_never_crash_a_reader(scratch, reader_name, fraction):
    source = _SOURCES[reader_name].read_bytes()
    path = scratch / f"cut{_SUFFIX.get(reader_name, '.txt')}"
    path.write_bytes(source[:int(len(source) * fraction)])
    _read_or_format_error(reader_name, path)
