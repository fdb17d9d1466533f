"""A dev split held out of the training file when there is no dev file (`--dev-fraction`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.finetune import finetune
from bertforge.finetune.devsplit import split_dev
from tests.tiny_models import save_tiny_encoder

WORDS = ("good great fine warm bright bad dull slow flat poor film story acting ending anna flew to rome "
         "paris bob where did who with the a and in 1948 when arrive")


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("model"), WORDS, vocab_size=120)


def _classify_rows() -> list[dict]:
    good = [f"a {w} film" for w in ("good", "great", "fine", "warm", "bright")] * 6
    bad = [f"a {w} story" for w in ("bad", "dull", "slow", "flat", "poor")] * 3
    rare = ["the acting and the ending", "the ending"]
    return ([{"text": t, "label": "positive"} for t in good] + [{"text": t, "label": "negative"} for t in bad]
            + [{"text": t, "label": "other"} for t in rare])


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cli(*args: object) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_split_keeps_each_class_share_and_is_seeded() -> None:
    labels = ["a"] * 60 + ["b"] * 30 + ["c"] * 2
    examples = list(range(len(labels)))
    train, dev = split_dev(examples, 0.1, 0, strata=labels)
    assert Counter(labels[i] for i in dev) == {"a": 6, "b": 3, "c": 1}  # the rare class is scored too
    assert sorted(train + dev) == examples and not set(train) & set(dev)
    assert train == sorted(train) and dev == sorted(dev)  # file order kept
    assert split_dev(examples, 0.1, 0, strata=labels) == (train, dev)
    assert split_dev(examples, 0.1, 1, strata=labels)[1] != dev
    # without strata or groups: plain random rows
    assert len(split_dev(examples, 0.25, 3)[1]) == 23


def test_split_keeps_groups_together() -> None:
    groups = [f"paragraph-{i // 3}" for i in range(30)]  # ten paragraphs of three questions
    train, dev = split_dev(list(range(30)), 0.2, 0, groups=groups)
    assert len(dev) == 6 and {groups[i] for i in dev}.isdisjoint({groups[i] for i in train})


@pytest.mark.parametrize(("fraction", "count", "message"), [
    (0.1, 1, "at least 2 training examples"), (0.01, 10, "leaves no dev examples"), (1.5, 10, "between 0 and 1")])
def test_split_refuses_what_leaves_a_side_empty(fraction: float, count: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_dev(list(range(count)), fraction, 0)


def test_classify_with_only_a_training_file(encoder_dir: Path, tmp_path: Path) -> None:
    rows = _classify_rows()
    train = _jsonl(tmp_path / "reviews.jsonl", rows)
    out = tmp_path / "run"
    result = _cli("finetune", "classify", "--model", encoder_dir, "--train", train, "--out", out,
                  "--epochs", "1", "--batch-size", "8", "--max-length", "16")
    assert result.exit_code == 0, result.output
    assert "no dev file: dev is 0.1 of the training file" in " ".join(result.output.split())
    held = [json.loads(line) for line in (out / "dev-split.jsonl").read_text().splitlines()]
    assert Counter(r["label"] for r in held) == {"positive": 3, "negative": 2, "other": 1}
    assert all(rows[r["row"] - 1]["text"] == r["text"] for r in held)  # `row`: the line in the training file
    recorded = yaml.safe_load((out / "run_config.yaml").read_text())
    assert recorded["train"]["dev_fraction"] == 0.1 and recorded["train"]["dev_seed"] == 0
    results = json.loads((out / "results.json").read_text())
    assert "macro_f1" in results["summary"]
    predictions = (out / "seed-1" / "predictions-dev.jsonl").read_text().splitlines()
    assert len(predictions) == len(held)
    # another draw is another run: refused on the same directory, like any changed setting
    again = _cli("finetune", "classify", "--model", encoder_dir, "--train", train, "--out", out, "--epochs", "1",
                 "--batch-size", "8", "--max-length", "16", "--dev-seed", "1")
    assert again.exit_code == 2 and "dev_seed" in again.output


def test_dev_file_and_fraction_together_are_refused(encoder_dir: Path, tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "t.jsonl", _classify_rows())
    cases = {("--dev", train, "--dev-fraction", "0.2"): "give one of them",
             ("--dev-fraction", "0"): "needs a dev split"}
    for args, message in cases.items():
        out = tmp_path / "out"
        result = _cli("finetune", "classify", "--model", encoder_dir, "--train", train, "--out", out, *args)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
        assert not out.exists()
    with pytest.raises(ValueError, match="dev_fraction is for your own files"):
        finetune("glue", "SST-2", encoder_dir, tmp_path, tmp_path / "glue", dev_fraction=0.1, progress=False,
                 verbose=False)


def test_tag_and_qa_with_only_a_training_file(encoder_dir: Path, tmp_path: Path) -> None:
    tokens = ["anna", "flew", "to", "rome", "with", "bob", "."]
    tags = ["B-PER", "O", "O", "B-LOC", "O", "B-PER", "O"]
    tag_train = _jsonl(tmp_path / "tags.jsonl", [{"tokens": tokens, "tags": tags}] * 10)
    result = _cli("finetune", "tag", "--model", encoder_dir, "--train", tag_train, "--out", tmp_path / "tag",
                  "--epochs", "1", "--batch-size", "4", "--max-length", "16", "--dev-fraction", "0.2")
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "tag" / "dev-split.jsonl").read_text().splitlines()) == 2

    context = "anna flew to rome in 1948 with bob"
    contexts = [f"{context} {i}" for i in range(5)]
    qa_rows = [{"id": f"q{i}-{j}", "question": q, "context": c,
                "answers": {"text": [a], "answer_start": [c.index(a)]}}
               for i, c in enumerate(contexts)
               for j, (q, a) in enumerate([("where did anna fly to", "rome"), ("when", "1948")])]
    qa_train = _jsonl(tmp_path / "qa.jsonl", qa_rows)
    result = _cli("finetune", "qa", "--model", encoder_dir, "--train", qa_train, "--out", tmp_path / "qa",
                  "--epochs", "1", "--batch-size", "4", "--max-length", "32", "--dev-fraction", "0.2")
    assert result.exit_code == 0, result.output
    held = [json.loads(line) for line in (tmp_path / "qa" / "dev-split.jsonl").read_text().splitlines()]
    assert len(held) == 2 and len({r["context"] for r in held}) == 1  # one paragraph's two questions
