"""`finetune classify`: your own files in every format and label kind, their metrics, bad input, and parity
with `transformers`' text-classification pipeline.

Fixtures are generated here: small sentiment / topic tables written as CSV, TSV, JSONL (.gz) and
Parquet, and a random one-layer encoder with a WordPiece vocabulary trained on their words. The
end-to-end runs check the plumbing (files, label maps, predictions in input order), not the scores.
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.finetune import finetune
from bertforge.tasks import make_task
from bertforge.tasks.base import DataFormatError, run_model
from bertforge.tasks.classify import MULTI, REGRESSION, SINGLE, Classify, ClassifyExample
from bertforge.tasks.metrics import classification_report, multi_label_report, regression_metrics

GOOD = ["a gripping film", "beautifully acted and warm", "a joy to watch", "the best film this year",
        "funny , moving and bright", "a warm and gripping story"]
BAD = ["dull and slow", "a terrible ending", "the worst film this year", "boring , flat and long",
       "a slow and dull story", "terrible acting"]
MIXED = ["neither good nor bad", "an ordinary film", "it is a film", "some parts work"]
WORDS = " ".join(GOOD + BAD + MIXED + ["sports news politics weather rain goal vote"])


def _rows(kind: str) -> list[dict[str, Any]]:
    """Training rows of one label kind."""
    if kind == "binary":
        return [{"text": t, "label": "positive"} for t in GOOD] + [{"text": t, "label": "negative"} for t in BAD]
    if kind == "three":
        return ([{"text": t, "label": 2} for t in GOOD] + [{"text": t, "label": 0} for t in BAD]
                + [{"text": t, "label": 1} for t in MIXED])
    if kind == "multi":
        return [{"text": t, "label": ["good"] + (["film"] if "film" in t else [])} for t in GOOD] + [
            {"text": t, "label": ["bad"] + (["film"] if "film" in t else [])} for t in BAD]
    if kind == "regression":
        return [{"text": t, "label": 4.5 - 0.25 * i} for i, t in enumerate(GOOD)] + [
            {"text": t, "label": 0.5 + 0.25 * i} for i, t in enumerate(BAD)]
    if kind == "pairs":
        return ([{"text": a, "text_b": b, "label": "same"} for a, b in zip(GOOD, GOOD[1:] + GOOD[:1], strict=True)]
                + [{"text": a, "text_b": b, "label": "different"} for a, b in zip(GOOD, BAD, strict=True)])
    raise ValueError(kind)


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows to .csv / .tsv (lists joined by '|'), .jsonl(.gz) or .parquet, by the file name."""
    import csv

    name = path.name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif name.endswith((".jsonl", ".jsonl.gz")):
        text = "".join(json.dumps(r) + "\n" for r in rows)
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    else:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]), delimiter="\t" if name.endswith(".tsv") else ",")
            writer.writeheader()
            writer.writerows({k: "|".join(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows)
    return path


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizer:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text((WORDS + "\n") * 10, encoding="utf-8")
    return BertTokenizer.train([corpus], vocab_size=150, min_frequency=1, show_progress=False)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: BertTokenizer) -> Path:
    """A random one-layer encoder saved like a pre-trained checkpoint (pooler included)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    directory = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _task(**settings: Any) -> Classify:
    return make_task("classify", None, settings)  # type: ignore[return-value]


def _run(encoder_dir: Path, out: Path, **settings: Any) -> dict[str, Any]:
    return finetune("classify", None, encoder_dir, None, out, epochs=1, batch_size=4, max_length=24,
                    task_settings=settings, progress=False, verbose=False)


# ------------------------------------------------------------------------------------------------
# reading: formats and label kinds
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["train.csv", "train.tsv", "train.jsonl", "train.jsonl.gz", "train.parquet"])
def test_every_format_reads_the_same_examples(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path / name, _rows("binary"))
    examples = _task(train=str(path)).read(None, "train")
    assert [(e.text, e.label) for e in examples] == [(r["text"], r["label"]) for r in _rows("binary")]
    first_row = 2 if name.endswith((".csv", ".tsv")) else 1  # a CSV's header is line 1; Parquet counts rows
    assert examples[0].row == first_row and examples[0].source == str(path)


@pytest.mark.parametrize(("kind", "name", "problem", "labels"), [
    ("binary", "t.csv", SINGLE, ["negative", "positive"]),
    ("three", "t.jsonl", SINGLE, ["0", "1", "2"]),
    ("three", "t.csv", SINGLE, ["0", "1", "2"]),
    ("multi", "t.jsonl", MULTI, ["bad", "film", "good"]),
    ("multi", "t.parquet", MULTI, ["bad", "film", "good"]),
    ("regression", "t.parquet", REGRESSION, 1),
    ("regression", "t.tsv", REGRESSION, 1),
])
def test_label_kinds_are_detected(tmp_path: Path, kind: str, name: str, problem: str, labels: Any) -> None:
    task = _task(train=str(_write(tmp_path / name, _rows(kind))))
    examples = task.read(None, "train")
    assert task.problem_type == problem and task.label_names(examples) == labels
    assert task.main_metric == {SINGLE: "macro_f1", MULTI: "micro_f1", REGRESSION: "pearson"}[problem]


def test_multi_label_from_a_delimiter_or_a_json_list_cell(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.csv", _rows("multi"))  # cells like "good|film"
    task = _task(train=str(path), label_delimiter="|")
    examples = task.read(None, "train")
    assert task.problem_type == MULTI and examples[0].label == ["good", "film"]
    # without the delimiter "good|film" is one label name: single-label, as the data says
    assert _task(train=str(path)).read(None, "train")[0].label == "good|film"
    cells = tmp_path / "cells.csv"
    cells.write_text('text,label\na film,"[""good"", ""film""]"\ndull,[]\n', encoding="utf-8")
    task = _task(train=str(cells))
    assert [e.label for e in task.read(None, "train")] == [["good", "film"], []] and task.problem_type == MULTI


def test_integer_labels_sort_numerically_and_forced_regression(tmp_path: Path) -> None:
    rows = [{"text": t, "label": label} for t, label in zip(GOOD, [10, 2, 10, 2, 1, 1], strict=True)]
    task = _task(train=str(_write(tmp_path / "t.jsonl", rows)))
    assert task.label_names(task.read(None, "train")) == ["1", "2", "10"]
    task = _task(train=str(_write(tmp_path / "t.csv", rows)), problem_type="regression")
    assert [e.label for e in task.read(None, "train")][:2] == [10.0, 2.0] and task.label_names([]) == 1


def test_balanced_weights() -> None:
    task = _task(problem_type="single_label_classification")
    examples = [ClassifyExample("x", label=name) for name in ["a", "a", "a", "b"]]
    assert task.label_weights(examples, ["a", "b"]) == pytest.approx([4 / 6, 2.0])  # n / (K * count)
    task = _task(problem_type="multi_label")
    examples = [ClassifyExample("x", label=names) for names in [["a"], ["a", "b"], [], ["a"]]]
    assert task.label_weights(examples, ["a", "b"]) == pytest.approx([1 / 3, 3.0])  # negatives / positives


# ------------------------------------------------------------------------------------------------
# metrics and thresholds
# ------------------------------------------------------------------------------------------------
def test_classification_report_by_hand() -> None:
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    report = classification_report(pred, gold, ["a", "b", "c"])
    # a: P 1 R 2/3 F 0.8; b: P 1/2 R 1/2 F 1/2; c: P 1/2 R 1 F 2/3
    assert report["metrics"]["accuracy"] == pytest.approx(4 / 6)
    assert report["metrics"]["micro_f1"] == pytest.approx(4 / 6)
    assert report["metrics"]["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert report["per_class"]["c"] == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1})
    assert report["confusion_matrix"] == {"labels": ["a", "b", "c"], "matrix": [[2, 1, 0], [0, 1, 1], [0, 0, 1]]}


def test_multi_label_and_regression_metrics_by_hand() -> None:
    gold = [["a"], ["a", "b"], [], ["b"]]
    pred = [["a"], ["a"], [], ["a", "b"]]
    report = multi_label_report(pred, gold, ["a", "b"])
    # a: tp 2 fp 1 fn 0 -> F 0.8; b: tp 1 fp 0 fn 1 -> F 2/3; pooled tp 3 fp 1 fn 1 -> 0.75
    assert report["metrics"] == pytest.approx({"micro_f1": 0.75, "macro_f1": (0.8 + 2 / 3) / 2,
                                               "subset_accuracy": 0.5})
    assert report["per_label"]["b"]["support"] == 2
    scores = regression_metrics([1.0, 2.0, 3.0, 5.0], [1.0, 2.0, 3.0, 4.0])
    assert scores["spearman"] == pytest.approx(1.0) and scores["mse"] == pytest.approx(0.25)
    assert 0.95 < scores["pearson"] < 1.0


def test_thresholds_are_tuned_per_label() -> None:
    task = _task(problem_type="multi_label_classification")
    examples = [ClassifyExample("x", label=names) for names in [["a"], ["a"], [], ["b"]]]
    # label a is right at any threshold in (0.2, 0.3] (0.25 and 0.3 tie: the one nearer 0.5 wins);
    # b has its one positive at 0.9 and negatives at 0.6
    predictions = [{"scores": {"a": a, "b": b}} for a, b in [(0.3, 0.1), (0.35, 0.6), (0.2, 0.6), (0.1, 0.9)]]
    thresholds = task.tune(examples, predictions)["thresholds"]
    assert thresholds == {"a": 0.3, "b": 0.65}
    task.settings["thresholds"] = thresholds
    assert task.decide(np.array([math.log(0.31 / 0.69), 0.0]), ["a", "b"])["labels"] == ["a"]  # 0.31, 0.5


# ------------------------------------------------------------------------------------------------
# the head's losses follow problem_type as in transformers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("problem", [SINGLE, MULTI, REGRESSION])
def test_head_loss_matches_transformers(tmp_path: Path, encoder_dir: Path, problem: str) -> None:
    import transformers

    from bertforge.model import BertForSequenceClassification, label_maps

    labels_count = 1 if problem == REGRESSION else 3
    ours = BertForSequenceClassification.from_pretrained(encoder_dir, problem_type=problem,
                                                         **label_maps(labels_count))
    ours.eval().save_pretrained(tmp_path)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert theirs.config.problem_type == problem
    ids = torch.tensor([[2, 10, 11, 12, 3], [2, 13, 14, 3, 0]])
    mask = (ids != 0).long()
    target = {SINGLE: torch.tensor([2, 0]), REGRESSION: torch.tensor([0.5, 3.0]),
              MULTI: torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])}[problem]
    with torch.no_grad():
        mine = ours(ids, attention_mask=mask, labels=target)
        hf = theirs(input_ids=ids, attention_mask=mask, labels=target)
    torch.testing.assert_close(mine.logits, hf.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mine.loss, hf.loss, atol=1e-5, rtol=1e-5)
    if problem == SINGLE:  # class weights reweigh the cross-entropy; they are not saved with the model
        ours.set_label_weights(torch.tensor([1.0, 1.0, 4.0]))
        weighted = ours(ids, attention_mask=mask, labels=target).loss
        assert not torch.isclose(weighted, mine.loss) and "label_weights" not in ours.state_dict()


# ------------------------------------------------------------------------------------------------
# end to end
# ------------------------------------------------------------------------------------------------
def test_binary_string_labels_end_to_end(encoder_dir: Path, tmp_path: Path) -> None:
    train = _write(tmp_path / "reviews.csv", _rows("binary"))
    dev = _write(tmp_path / "reviews-dev.csv", _rows("binary")[::2])
    test_rows = [{"text": t} for t in ["a joy", "dull ending", "the best story", "slow"]]
    test = _write(tmp_path / "new.csv", test_rows)
    out = tmp_path / "run"
    results = _run(encoder_dir, out, train=str(train), dev=str(dev), test=str(test))
    assert set(results["summary"]) == {"accuracy", "macro_f1", "micro_f1"} and results["data"] == {"train": str(train), "dev": str(dev), "test": str(test)}
    seed = out / "seed-1"
    config = json.loads((seed / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    assert config["problem_type"] == SINGLE
    rows = [json.loads(line) for line in (seed / "predictions-test.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == [r["text"] for r in test_rows] and [r["row"] for r in rows] == [2, 3, 4, 5]
    assert all(r["label"] in ("negative", "positive") and "gold" not in r for r in rows)
    # every label's score, ranked, in the shape predict --all-scores and serve answer with
    assert all(r["scores"][0] == {"label": r["label"], "score": pytest.approx(r["score"])} for r in rows)
    assert sum(s["score"] for s in rows[0]["scores"]) == pytest.approx(1.0)
    report = json.loads((seed / "report-dev.json").read_text())
    assert set(report["per_class"]) == {"negative", "positive"} and len(report["confusion_matrix"]["matrix"]) == 2
    assert sum(map(sum, report["confusion_matrix"]["matrix"])) == 6
    assert (seed / "confusion-dev.png").read_bytes()[:4] == b"\x89PNG"
    assert not (seed / "report-test.json").exists() and "test_summary" not in results

    # run_config.yaml repeats the run, with the files and columns in it
    saved = (out / "run_config.yaml").read_text()
    assert "reviews.csv" in saved and "problem_type: single_label_classification" in saved
    result = CliRunner().invoke(app, ["finetune", "classify", "--config", str(out / "run_config.yaml"),
                                      "--out", str(tmp_path / "again")])
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["summary"]["macro_f1"]["mean"] == results["summary"]["macro_f1"]["mean"]


def test_three_classes_pairs_and_class_weights_end_to_end(encoder_dir: Path, tmp_path: Path) -> None:
    rows = _rows("three")
    train = _write(tmp_path / "train.tsv", rows)
    out = tmp_path / "three"
    results = _run(encoder_dir, out, train=str(train), dev=str(train), test=str(train), class_weights="balanced",
                   predictions_format="csv")
    assert json.loads((out / "seed-1" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1", "2": "2"}
    assert results["test_summary"]["test"].keys() == {"accuracy", "macro_f1", "micro_f1"}
    lines = (out / "seed-1" / "predictions-test.csv").read_text().splitlines()
    assert lines[0].startswith("row,text,label,score,scores,gold") and len(lines) == len(rows) + 1

    pairs = _write(tmp_path / "pairs.jsonl", _rows("pairs"))
    results = _run(encoder_dir, tmp_path / "pairs", train=str(pairs), dev=str(pairs), pair_column="text_b")
    first = json.loads((tmp_path / "pairs" / "seed-1" / "predictions-dev.jsonl").read_text().splitlines()[0])
    assert first["text_pair"] == GOOD[1] and first["gold"] == "same"
    task = _task(train=str(pairs), pair_column="text_b")
    features = task.featurize(task.read(None, "train")[:1], BertTokenizer.from_pretrained(encoder_dir), 24,
                              label_names=["different", "same"])
    assert 1 in features[0].inputs["token_type_ids"]  # the second text is segment B


def test_multi_label_end_to_end(encoder_dir: Path, tmp_path: Path) -> None:
    train = _write(tmp_path / "topics.parquet", _rows("multi"))
    out = tmp_path / "multi"
    results = _run(encoder_dir, out, train=str(train), dev=str(train), class_weights="balanced")
    assert set(results["summary"]) == {"micro_f1", "macro_f1", "subset_accuracy"}
    seed = out / "seed-1"
    config = json.loads((seed / "config.json").read_text())
    assert config["problem_type"] == MULTI and config["id2label"] == {"0": "bad", "1": "film", "2": "good"}
    thresholds = json.loads((seed / "task.json").read_text())["settings"]["thresholds"]
    assert set(thresholds) == {"bad", "film", "good"} and all(0.05 <= t <= 0.95 for t in thresholds.values())
    assert json.loads((seed / "report-dev.json").read_text())["thresholds"] == thresholds
    row = json.loads((seed / "predictions-dev.jsonl").read_text().splitlines()[0])
    assert set(row["labels"]) <= {"bad", "film", "good"} and row["gold"] == ["good", "film"]
    assert "thresholds" not in (out / "run_config.yaml").read_text()  # learnt, not a setting


def test_regression_end_to_end(encoder_dir: Path, tmp_path: Path) -> None:
    train = _write(tmp_path / "scores.csv", _rows("regression"))
    out = tmp_path / "regression"
    results = _run(encoder_dir, out, train=str(train), dev=str(train))
    assert set(results["summary"]) <= {"pearson", "spearman", "mse"} and "mse" in results["summary"]
    config = json.loads((out / "seed-1" / "config.json").read_text())
    assert config["problem_type"] == REGRESSION and config["id2label"] == {"0": "LABEL_0"}
    row = json.loads((out / "seed-1" / "predictions-dev.jsonl").read_text().splitlines()[0])
    assert isinstance(row["score"], float) and row["gold"] == 4.5
    with pytest.raises(ValueError, match="regression"):
        _run(encoder_dir, tmp_path / "weighted", train=str(train), dev=str(train), class_weights="balanced")


# ------------------------------------------------------------------------------------------------
# interop: transformers' pipeline gives our labels and scores
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["binary", "multi", "regression", "pairs"])
def test_transformers_pipeline_gives_our_labels_and_scores(encoder_dir: Path, tmp_path: Path, kind: str) -> None:
    import transformers

    from bertforge.model import BertForSequenceClassification, label_names

    train = _write(tmp_path / "train.jsonl", _rows(kind))
    pair_column = {"pair_column": "text_b"} if kind == "pairs" else {}
    _run(encoder_dir, tmp_path / "run", train=str(train), dev=str(train), **pair_column)
    seed = tmp_path / "run" / "seed-1"
    texts = ["a gripping story", "dull and long , the worst", "it is a film"]
    pairs = ["the best film", "a warm story", "terrible acting"] if kind == "pairs" else [None] * 3

    saved = json.loads((seed / "task.json").read_text())
    task = _task(**saved["settings"])
    model = BertForSequenceClassification.from_pretrained(seed)
    names = label_names(model.config) or None
    examples = [ClassifyExample(t, p) for t, p in zip(texts, pairs, strict=True)]
    features = task.featurize(examples, BertTokenizer.from_pretrained(seed), saved["max_length"])
    ours = task.postprocess(examples, features, run_model(model, features, ("logits",)), label_names=names)

    classifier = transformers.pipeline("text-classification", model=str(seed), device="cpu")
    inputs: list[Any] = texts if kind != "pairs" else [{"text": t, "text_pair": p} for t, p in zip(texts, pairs,
                                                                                                   strict=True)]
    if kind == "regression":  # the pipeline squashes a single output with a sigmoid unless told not to
        theirs = classifier(inputs, function_to_apply="none")
        assert [t["score"] for t in theirs] == pytest.approx([o["score"] for o in ours], abs=1e-4)
        return
    theirs = classifier(inputs, top_k=None)
    for mine, their in zip(ours, theirs, strict=True):
        assert {t["label"]: t["score"] for t in their} == pytest.approx(mine["scores"], abs=1e-4)
        if kind != "multi":
            assert max(their, key=lambda t: t["score"])["label"] == mine["label"]


# ------------------------------------------------------------------------------------------------
# bad input: one line naming file, row and column; exit code 2; nothing written
# ------------------------------------------------------------------------------------------------
def _bad_files(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (extra command-line arguments, the message expected)."""
    good = _write(tmp / "good.csv", _rows("binary"))
    (tmp / "empty.csv").write_bytes(b"")
    (tmp / "latin1.csv").write_bytes("text,label\nfine,positive\ncaf\xe9 film,negative\n".encode("latin-1"))
    _write(tmp / "unseen.csv", [{"text": "a film", "label": "positive"}, {"text": "meh", "label": "neutral"}])
    _write(tmp / "unseen-test.jsonl", [{"text": "a film", "label": "positive"}, {"text": "x", "label": "mixed"}])
    _write(tmp / "no-label.csv", [{"text": "a film", "rating": "positive"}])
    _write(tmp / "empty-text.jsonl", [{"text": "a film", "label": "positive"}, {"text": "  ", "label": "negative"}])
    _write(tmp / "scores.csv", [{"text": "a", "label": "3.5"}, {"text": "b", "label": "1.25"},
                                {"text": "c", "label": "abc"}])
    _write(tmp / "one-class.csv", [{"text": "a", "label": "positive"}, {"text": "b", "label": "positive"}])
    g = str(good)
    return {
        "missing column": (["--train", str(tmp / "no-label.csv"), "--dev", g],
                           "no-label.csv:2: label: no such column; the columns are: text, rating"),
        "empty file": (["--train", g, "--dev", str(tmp / "empty.csv")], "empty.csv: empty file"),
        "not utf-8": (["--train", str(tmp / "latin1.csv"), "--dev", g], "latin1.csv:3: not UTF-8"),
        "unseen dev label": (["--train", g, "--dev", str(tmp / "unseen.csv")],
                             "unseen.csv:3: label: label 'neutral' does not occur in the training file"),
        "unseen test label": (["--train", g, "--dev", g, "--test", str(tmp / "unseen-test.jsonl")],
                              "unseen-test.jsonl:2: label: label 'mixed' does not occur in the training file"),
        "empty text": (["--train", str(tmp / "empty-text.jsonl"), "--dev", g], "empty-text.jsonl:2: text: empty text"),
        "non-numeric score": (["--train", str(tmp / "scores.csv"), "--dev", g],
                              "scores.csv:4: label: 'abc' is not a number"),
        "forced regression": (["--train", g, "--dev", g, "--problem-type", "regression"],
                              "good.csv:2: label: 'positive' is not a number"),
        "one class": (["--train", str(tmp / "one-class.csv"), "--dev", g], "only one label (positive)"),
        "dev twice": (["--train", g, "--dev", g, "--dev-fraction", "0.2"], "both give a dev split"),
        "missing column name": (["--train", g, "--dev", g, "--text-column", "review"],
                                "good.csv:2: review: no such column; the columns are: text, label"),
    }


def test_bad_input_is_one_located_line_and_writes_nothing(encoder_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    for case, (args, expected) in _bad_files(tmp_path).items():
        out = tmp_path / f"out-{case.replace(' ', '-')}"
        result = runner.invoke(app, ["finetune", "classify", "--model", str(encoder_dir), "--out", str(out),
                                     "--epochs", "1", *args])
        assert result.exit_code == 2, (case, result.output)
        message = " ".join(result.output.split())  # the terminal may wrap the one line
        assert expected in message, (case, message)
        assert message.startswith("error:") and not out.exists(), case


def test_bad_input_raises_data_format_errors_from_python(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.jsonl", [{"text": "a", "label": ["x", None]}])
    with pytest.raises(DataFormatError, match=r"t.jsonl:1: label: None is not a label name"):
        _task(train=str(path)).read(None, "train")
    with pytest.raises(ValueError, match="problem_type 'ranking'"):
        _task(problem_type="ranking")
    with pytest.raises(ValueError, match="unknown classify setting"):
        _task(text_colum="x")


def test_cli_with_the_bundled_recipe_on_the_sample_files(encoder_dir: Path, tmp_path: Path) -> None:
    """The command of docs/own-data.md on the shipped 12-row sample, from recipes/finetune/classify.yaml."""
    root = Path(__file__).resolve().parents[1]
    sample = root / "tests" / "fixtures" / "classify"
    out = tmp_path / "reviews"
    result = CliRunner().invoke(app, [
        "finetune", "classify", "--config", str(root / "recipes" / "finetune" / "classify.yaml"),
        "--model", str(encoder_dir), "--train", str(sample / "reviews.csv"), "--dev", str(sample / "reviews-dev.csv"),
        "--test", str(sample / "new.csv"), "--epochs", "1", "--batch-size", "4", "--max-length", "64",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "macro_f1" in result.output
    assert "classify: 1 seed(s)" in result.output and "classify classify" not in result.output
    rows = [json.loads(line) for line in (out / "seed-1" / "predictions-test.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["what a gripping story", "too long and too dull"]
    recipe = (out / "run_config.yaml").read_text()
    assert "lr: 2.0e-05" in recipe and "new.csv" in recipe
