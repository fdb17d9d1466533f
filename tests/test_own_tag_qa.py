"""`finetune tag` and `finetune qa` on users' files: schemes, formats, bad input, transformers parity.

The fixtures are generated here: a custom tag set (PER and LOC only) written as a BIOES column file, as
JSONL with string tags, as JSONL with integer tags and a names list, and as a Parquet file written by
`datasets` (ClassLabel names in its metadata); QA rows as JSONL with unanswerable questions (v2) and as
SQuAD v1 JSON. The model is a random one-layer encoder: the runs check the plumbing and parity, not scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.tasks.tag import detect_scheme, first_invalid, from_iob2, to_iob2

CORPUS = [
    "anna smith flew from paris to rome with bob .",
    "the mayor of berlin met maria lopez in madrid on monday .",
    "john lives in new york and works for acme .",
    "where did anna smith fly to ? she flew to rome in 1948 .",
    "the eiffel tower is in paris , the capital of france .",
]

# (tokens, IOB2 tags) with PER and LOC only
SENTENCES = [
    (["anna", "smith", "flew", "from", "paris", "to", "rome", "with", "bob", "."],
     ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "B-LOC", "O", "B-PER", "O"]),
    (["the", "mayor", "of", "berlin", "met", "maria", "lopez", "in", "madrid", "on", "monday", "."],
     ["O", "O", "O", "B-LOC", "O", "B-PER", "I-PER", "O", "B-LOC", "O", "O", "O"]),
    (["john", "lives", "in", "new", "york", "and", "works", "for", "acme", "."],
     ["B-PER", "O", "O", "B-LOC", "I-LOC", "O", "O", "O", "O", "O"]),
    (["the", "eiffel", "tower", "is", "in", "paris", ",", "the", "capital", "of", "france", "."],
     ["O", "O", "O", "O", "O", "B-LOC", "O", "O", "O", "O", "B-LOC", "O"]),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizer:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    return BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: BertTokenizer) -> Path:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    directory = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _cli(*args: str) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _write_columns(path: Path, sentences: list[tuple[list[str], list[str]]], *, pos: bool = True) -> Path:
    """A CoNLL-style file: `token POS tag` (or `token tag`), -DOCSTART- first, a blank line between sentences."""
    lines = ["-DOCSTART- -X- O", ""]
    for tokens, tags in sentences:
        lines += [f"{t} NN {g}" if pos else f"{t} {g}" for t, g in zip(tokens, tags, strict=True)] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------
# schemes
# ------------------------------------------------------------------------------------------------
def test_scheme_conversions_round_trip() -> None:
    for _, iob2 in SENTENCES:
        for scheme in ("iob1", "iob2", "bioes"):
            assert to_iob2(from_iob2(iob2, scheme), scheme) == iob2
    assert from_iob2(["B-PER", "I-PER", "B-PER", "O", "B-LOC"], "bioes") == ["B-PER", "E-PER", "S-PER", "O", "S-LOC"]
    assert from_iob2(["B-PER", "I-PER", "B-PER", "O", "B-LOC"], "iob1") == ["I-PER", "I-PER", "B-PER", "O", "I-LOC"]
    assert to_iob2(["S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC"], "bioes") == ["B-PER", "B-LOC", "I-LOC", "I-LOC", "B-LOC"]
    # predictions read leniently, as conlleval reads them: I- after O opens an entity
    assert from_iob2(["O", "I-PER", "I-PER"], "bioes") == ["O", "B-PER", "E-PER"]


def test_scheme_detection_and_validity() -> None:
    assert detect_scheme([["B-PER", "I-PER", "O"]]) == "iob2"
    assert detect_scheme([["I-PER", "I-PER", "B-PER"]]) == "iob1"
    assert detect_scheme([["B-PER", "E-PER"], ["O"]]) == "bioes"
    assert detect_scheme([["B-PER", "I-LOC"]]) == "iob2"  # B- opens entities: IOB2 with a stray I-
    assert first_invalid(["B-PER", "I-PER", "O"], "iob2") is None
    assert first_invalid(["O", "I-PER"], "iob2")[0] == 1
    assert first_invalid(["I-PER", "B-LOC"], "iob1")[0] == 1
    assert first_invalid(["B-PER", "O"], "bioes")[0] == 0
    assert first_invalid(["B-PER", "E-PER", "S-LOC"], "bioes") is None
    assert first_invalid(["S-LOC"], "iob2")[0] == 0


# ------------------------------------------------------------------------------------------------
# tag: both file kinds, custom tag set
# ------------------------------------------------------------------------------------------------
def test_tag_bioes_column_files_end_to_end(encoder_dir: Path, tmp_path: Path) -> None:
    bioes = [(tokens, from_iob2(tags, "bioes")) for tokens, tags in SENTENCES]
    train = _write_columns(tmp_path / "train.conll", bioes * 3)
    dev = _write_columns(tmp_path / "dev.conll", bioes[:2])
    out = tmp_path / "run"
    result = _cli("finetune", "tag", "--train", train, "--dev", dev, "--test", dev, "--model", encoder_dir,
                  "--out", out, "--epochs", "2", "--batch-size", "4", "--max-length", "16", "--strict-tags")
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    assert {"dev_f1", "dev_precision", "dev_recall", "dev_accuracy", "test_f1"} <= set(results["summary"])
    seed = out / "seed-1"
    config = json.loads((seed / "config.json").read_text())
    assert config["id2label"] == {"0": "O", "1": "B-LOC", "2": "I-LOC", "3": "B-PER", "4": "I-PER"}
    assert config["label2id"] == {v: int(k) for k, v in config["id2label"].items()}
    task = json.loads((seed / "task.json").read_text())
    assert task["settings"]["tag_scheme"] == "bioes" and task["labels"][0] == "O"
    rows = [json.loads(line) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows] == [t for t, _ in bioes[:2]]
    assert rows[0]["gold"] == bioes[0][1]
    for row in rows:  # predictions come back in the files' scheme (BIOES), valid in it
        assert len(row["tags"]) == len(row["tokens"]) == len(row["scores"])
        assert first_invalid(row["tags"], "bioes") is None
        assert all(0 < s <= 1 for s in row["scores"])
    # new sentences without tags, in another file kind
    new = _write_jsonl(tmp_path / "new.jsonl", [{"tokens": t} for t, _ in SENTENCES[:2]])
    result = _cli("predict", "tag", "--model", seed, "--data", new, "--out", tmp_path / "pred")
    assert result.exit_code == 0, result.output
    predicted = [json.loads(line) for line in (tmp_path / "pred" / "predictions-test.jsonl").read_text().splitlines()]
    assert [r["tags"] for r in predicted] == [r["tags"] for r in rows] and "gold" not in predicted[0]


def test_tag_jsonl_string_and_integer_tags_agree(encoder_dir: Path, tmp_path: Path) -> None:
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    strings = [{"tokens": t, "tags": g} for t, g in SENTENCES]
    integers = [{"tokens": t, "ner_tags": [names.index(x) for x in g]} for t, g in SENTENCES]
    _write_jsonl(tmp_path / "s.jsonl", strings)
    _write_jsonl(tmp_path / "i.jsonl", integers)
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    common = ["--model", encoder_dir, "--epochs", "1", "--batch-size", "2", "--seeds", "3"]
    # string tags with the names given too (as a list): the same label order, so the same run
    a = _cli("finetune", "tag", "--train", tmp_path / "s.jsonl", "--dev", tmp_path / "s.jsonl", "--out", tmp_path / "a",
             "--tag-names", ",".join(names), *common)
    b = _cli("finetune", "tag", "--train", tmp_path / "i.jsonl", "--dev", tmp_path / "i.jsonl", "--out", tmp_path / "b",
             "--tag-column", "ner_tags", "--tag-names", tmp_path / "names.txt", *common)
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ra, rb = (json.loads((tmp_path / d / "results.json").read_text()) for d in "ab")
    assert ra["summary"]["f1"]["mean"] == rb["summary"]["f1"]["mean"]
    assert ra["summary"]["accuracy"]["mean"] == rb["summary"]["accuracy"]["mean"]
    # the names file orders the types: PER before LOC
    config = json.loads((tmp_path / "b" / "seed-3" / "config.json").read_text())
    assert list(config["id2label"].values()) == names


def test_tag_parquet_written_by_datasets_carries_its_names(encoder_dir: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    data = datasets.Dataset.from_dict({"tokens": [t for t, _ in SENTENCES],
                                       "ner_tags": [[names.index(x) for x in g] for _, g in SENTENCES]},
                                      features=features)
    data.to_parquet(str(tmp_path / "train.parquet"))
    result = _cli("finetune", "tag", "--train", tmp_path / "train.parquet", "--dev", tmp_path / "train.parquet",
                  "--tag-column", "ner_tags", "--model", encoder_dir, "--out", tmp_path / "run", "--epochs", "1")
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "run" / "seed-1" / "config.json").read_text())
    assert set(config["label2id"]) == set(names)


# ------------------------------------------------------------------------------------------------
# qa
# ------------------------------------------------------------------------------------------------
CONTEXTS = [
    "Anna Smith flew from Paris to Rome with Bob. She arrived in 1948.",
    "The Eiffel Tower is in Paris, the capital of France. John lives in New York.",
]


def _qa_rows() -> list[dict]:
    def answer(context: str, text: str) -> dict:
        return {"text": [text], "answer_start": [context.index(text)]}

    no_answer = {"text": [], "answer_start": []}
    return [
        {"id": "a1", "question": "Where did Anna fly to?", "context": CONTEXTS[0], "answers": answer(CONTEXTS[0], "Rome")},
        {"id": "a2", "question": "When did she arrive?", "context": CONTEXTS[0], "answers": answer(CONTEXTS[0], "1948")},
        {"id": "a3", "question": "Who flew with Anna?", "context": CONTEXTS[0], "answers": answer(CONTEXTS[0], "Bob")},
        {"id": "b1", "question": "Where is the Eiffel Tower?", "context": CONTEXTS[1],
         "answers": answer(CONTEXTS[1], "Paris")},
        {"id": "b2", "question": "Where does John live?", "context": CONTEXTS[1],
         "answers": answer(CONTEXTS[1], "New York")},
        {"id": "b3", "question": "Who built the tower?", "context": CONTEXTS[1], "answers": no_answer},
    ]


def _squad_json(rows: list[dict], *, v2: bool) -> dict:
    paragraphs = {}
    for row in rows:
        qa = {"id": row["id"], "question": row["question"],
              "answers": [{"text": t, "answer_start": s}
                          for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"], strict=True)]}
        if v2:
            qa["is_impossible"] = not qa["answers"]
        paragraphs.setdefault(row["context"], []).append(qa)
    return {"version": "v2.0" if v2 else "1.1",
            "data": [{"title": "t", "paragraphs": [{"context": c, "qas": q} for c, q in paragraphs.items()]}]}


def test_qa_jsonl_v2_with_unanswerable_rows(encoder_dir: Path, tmp_path: Path) -> None:
    rows = _qa_rows()
    _write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "run"
    result = _cli("finetune", "qa", "--train", tmp_path / "train.jsonl", "--dev", tmp_path / "train.jsonl",
                  "--model", encoder_dir, "--out", out, "--epochs", "1", "--batch-size", "2", "--max-length", "48",
                  "--doc-stride", "8")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1", "best_f1_thresh"} <= set(summary)
    task = json.loads((out / "seed-1" / "task.json").read_text())
    assert task["settings"]["version"] == "2.0"
    # the tuned threshold is saved and the reported F1 is the one it gives: the sweep's best
    assert isinstance(task["settings"]["null_threshold"], float)
    assert task["metrics"]["f1"] == pytest.approx(task["metrics"]["best_f1"])
    dev_answers = json.loads((out / "seed-1" / "predictions-dev.json").read_text())
    assert set(json.loads((out / "seed-1" / "null_odds-dev.json").read_text())) == {r["id"] for r in rows}
    # questions without answers to predict: the tuned threshold is applied
    new = _write_jsonl(tmp_path / "new.jsonl", [{k: v for k, v in r.items() if k != "answers"} for r in rows])
    result = _cli("predict", "qa", "--model", out / "seed-1", "--data", new, "--out", tmp_path / "pred")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "pred" / "predictions.json").read_text()) == dev_answers


def test_qa_squad_json_v1_and_rows_give_the_same_run(encoder_dir: Path, tmp_path: Path) -> None:
    rows = [r for r in _qa_rows() if r["answers"]["text"]]
    (tmp_path / "train.json").write_text(json.dumps(_squad_json(rows, v2=False)))
    _write_jsonl(tmp_path / "train.jsonl", rows)
    common = ["--model", encoder_dir, "--epochs", "1", "--batch-size", "2", "--max-length", "48"]
    for name in ("train.json", "train.jsonl"):
        result = _cli("finetune", "qa", "--train", tmp_path / name, "--dev", tmp_path / name, "--out",
                      tmp_path / name.replace(".", "-"), *common)
        assert result.exit_code == 0, result.output
    a = json.loads((tmp_path / "train-json" / "results.json").read_text())
    b = json.loads((tmp_path / "train-jsonl" / "results.json").read_text())
    assert set(a["summary"]) == {"exact_match", "f1"}  # v1: no unanswerable question anywhere
    assert a["summary"] == b["summary"]
    assert json.loads((tmp_path / "train-json" / "seed-1" / "task.json").read_text())["settings"]["version"] == "1.1"


# ------------------------------------------------------------------------------------------------
# bad input: one line naming file, line/row and field; exit 2; nothing written
# ------------------------------------------------------------------------------------------------
def _assert_rejected(args: list, out: Path, *expected: str) -> None:
    result = _cli(*args, "--out", out, "--epochs", "1")
    message = " ".join(result.output.split())  # the console may wrap the line
    assert result.exit_code == 2, result.output
    assert message.startswith("error: ") and all(e in message for e in expected), message
    assert not out.exists()


def test_tag_bad_input(encoder_dir: Path, tmp_path: Path) -> None:
    good = _write_jsonl(tmp_path / "good.jsonl", [{"tokens": t, "tags": g} for t, g in SENTENCES])
    model = ["--model", encoder_dir]
    short = _write_jsonl(tmp_path / "short.jsonl", [{"tokens": ["a", "b"], "tags": ["O", "O"]},
                                                    {"tokens": ["anna", "smith", "flew"], "tags": ["B-PER", "I-PER"]}])
    _assert_rejected(["finetune", "tag", "--train", short, "--dev", good, *model], tmp_path / "o1",
                     "short.jsonl:2: tags:", "2 tags for 3 tokens")
    unseen = _write_jsonl(tmp_path / "unseen.jsonl", [{"tokens": ["x", "acme"], "tags": ["O", "B-ORG"]}])
    _assert_rejected(["finetune", "tag", "--train", good, "--dev", unseen, *model], tmp_path / "o2",
                     "unseen.jsonl:1: tags[1]:", "type ORG does not occur in the good.jsonl file")
    loose = _write_columns(tmp_path / "loose.conll", [(["x", "anna", "smith"], ["O", "B-PER", "I-LOC"])])
    _assert_rejected(["finetune", "tag", "--train", loose, "--dev", loose, "--strict-tags",
                      *model], tmp_path / "o3", "loose.conll:5: tag:", "'I-LOC' follows 'B-PER'")
    # without --strict-tags the same file trains (I-LOC read as the start of a LOC entity)
    assert _cli("finetune", "tag", "--train", loose, "--dev", loose, *model, "--out", tmp_path / "o4",
                "--epochs", "1").exit_code == 0
    # a declared scheme that the tags do not use is an error even when not strict
    single = _write_columns(tmp_path / "single.conll", [(["x", "anna"], ["O", "S-PER"])])
    _assert_rejected(["finetune", "tag", "--train", single, "--dev", single, "--tag-scheme", "bio", *model],
                     tmp_path / "o8", "single.conll:4: tag:", "IOB2 has no S- tags")
    missing = _write_jsonl(tmp_path / "missing.jsonl", [{"words": ["a"], "tags": ["O"]}])
    _assert_rejected(["finetune", "tag", "--train", missing, "--dev", good, *model], tmp_path / "o5",
                     "missing.jsonl:1: tokens:", "no such column; the columns are: words, tags")
    integers = _write_jsonl(tmp_path / "int.jsonl", [{"tokens": ["a"], "tags": [1]}])
    _assert_rejected(["finetune", "tag", "--train", integers, "--dev", good, *model], tmp_path / "o6",
                     "int.jsonl:1: tags[0]:", "give --tag-names")
    bad_tag = _write_columns(tmp_path / "bad.conll", [(["a", "b"], ["O", "PER"])], pos=False)
    _assert_rejected(["finetune", "tag", "--train", bad_tag, "--dev", good, *model], tmp_path / "o7",
                     "bad.conll:4: NER tag:", "'PER'")


def test_qa_bad_input(encoder_dir: Path, tmp_path: Path) -> None:
    good = _write_jsonl(tmp_path / "good.jsonl", _qa_rows())
    model = ["--model", encoder_dir]

    def rows_with(index: int, **change: object) -> list[dict]:
        rows = _qa_rows()
        rows[index] = {**rows[index], **change}
        return rows

    cases = [
        ("outside", rows_with(2, answers={"text": ["Bob"], "answer_start": [500]}),
         "outside.jsonl:3: answers.answer_start[0]:", "lies outside its context"),
        ("moved", rows_with(1, answers={"text": ["1948"], "answer_start": [3]}),
         "moved.jsonl:2: answers.answer_start[0]:", "'1948' is not at 3"),
        ("noquestion", rows_with(3, question="  "), "noquestion.jsonl:4: question:", "empty question"),
        ("nocontext", rows_with(0, context=""), "nocontext.jsonl:1: context:", "empty context"),
    ]
    for name, rows, *expected in cases:
        path = _write_jsonl(tmp_path / f"{name}.jsonl", rows)
        _assert_rejected(["finetune", "qa", "--train", good, "--dev", path, *model], tmp_path / f"o-{name}", *expected)
    no_answers = _write_jsonl(tmp_path / "noanswers.jsonl", [{k: v for k, v in r.items() if k != "answers"}
                                                             for r in _qa_rows()])
    _assert_rejected(["finetune", "qa", "--train", no_answers, "--dev", good, *model], tmp_path / "o-na",
                     "noanswers.jsonl:1: answers:", "no such column")
    squad = _squad_json(_qa_rows(), v2=True)
    squad["data"][0]["paragraphs"][0]["qas"][1]["answers"][0]["answer_start"] = 2
    (tmp_path / "moved.json").write_text(json.dumps(squad, indent=1))
    _assert_rejected(["finetune", "qa", "--train", tmp_path / "moved.json", "--dev", good, *model], tmp_path / "o-j",
                     "moved.json:", "data[0].paragraphs[0].qas[1].answers[0]:", "'1948' is not at answer_start 2")
    squad = _squad_json(_qa_rows(), v2=True)
    squad["data"][0]["paragraphs"][1]["qas"][0]["question"] = ""
    (tmp_path / "empty.json").write_text(json.dumps(squad, indent=1))
    _assert_rejected(["finetune", "qa", "--train", tmp_path / "empty.json", "--dev", good, *model], tmp_path / "o-e",
                     "empty.json:", "data[0].paragraphs[1].qas[0].question:", "empty question")


# ------------------------------------------------------------------------------------------------
# transformers parity
# ------------------------------------------------------------------------------------------------
def test_tag_model_matches_transformers_token_classification_pipeline(encoder_dir: Path, tmp_path: Path) -> None:
    """aggregation_strategy="none" scores every piece: on each word's first piece (the one we predict
    from) its label and softmax probability equal ours."""
    transformers = pytest.importorskip("transformers")
    from bertforge.finetune import load_for_task
    from bertforge.tasks import make_task
    from bertforge.tasks.base import run_model

    _write_jsonl(tmp_path / "t.jsonl", [{"tokens": t, "tags": g} for t, g in SENTENCES])
    assert _cli("finetune", "tag", "--train", tmp_path / "t.jsonl", "--dev", tmp_path / "t.jsonl", "--model",
                encoder_dir, "--out", tmp_path / "run", "--epochs", "3", "--batch-size", "2", "--lr", "1e-3"
                ).exit_code == 0
    seed = tmp_path / "run" / "seed-1"
    task = make_task("tag", "tag", {"dev": str(tmp_path / "t.jsonl")})
    examples = task.read(None, "dev")
    tokenizer = BertTokenizer.from_pretrained(seed)
    model = load_for_task(task.job, seed)
    labels = list(json.loads((seed / "config.json").read_text())["id2label"].values())
    features = task.featurize(examples, tokenizer, 128, label_names=labels)
    ours = task.postprocess(examples, features, run_model(model, features, task.output_names,
                                                          token_outputs=task.token_outputs), label_names=labels)

    theirs = transformers.pipeline("token-classification", model=str(seed), aggregation_strategy="none",
                                   ignore_labels=[], device="cpu")
    compared = 0
    for example, prediction in zip(examples, ours, strict=True):
        text = " ".join(example.words)
        pieces = theirs(text)
        starts = {}  # character start of each word -> its first piece's result
        for piece in pieces:
            starts.setdefault(piece["start"], piece)
        position = 0
        for word, tag, score in zip(example.words, prediction.tags, prediction.scores, strict=True):
            piece = starts[position]
            assert piece["entity"] == tag
            assert piece["score"] == pytest.approx(score, abs=1e-4)
            position += len(word) + 1
            compared += 1
    assert compared == sum(len(t) for t, _ in SENTENCES)


@pytest.mark.slow
def test_qa_model_matches_transformers_question_answering(encoder_dir: Path, tmp_path: Path) -> None:
    """transformers 5 no longer has a question-answering pipeline; its decoding rule (transformers 4's
    `QuestionAnsweringPipeline`) is applied here to transformers' own tokenizer and model outputs: over
    one window, P(start) and P(end) are softmaxes over [CLS] and the context pieces, [CLS] is then
    excluded, and the best span (end >= start, at most max_answer_len pieces) maximises P(start) * P(end),
    which is the score. Ours ranks spans by start + end logit, the same order within a window; the same
    score is computed from our logits and compared, with the span and the logits themselves."""
    transformers = pytest.importorskip("transformers")
    from bertforge.finetune import load_for_task
    from bertforge.tasks import make_task
    from bertforge.tasks.base import run_model

    rows = [r for r in _qa_rows() if r["answers"]["text"]]
    _write_jsonl(tmp_path / "q.jsonl", rows)
    assert _cli("finetune", "qa", "--train", tmp_path / "q.jsonl", "--dev", tmp_path / "q.jsonl", "--model",
                encoder_dir, "--out", tmp_path / "run", "--epochs", "3", "--batch-size", "2", "--lr", "1e-3",
                "--max-length", "64").exit_code == 0
    seed = tmp_path / "run" / "seed-1"
    max_answer = 15
    task = make_task("qa", "qa", {"dev": str(tmp_path / "q.jsonl"), "version": "1.1", "max_answer_length": max_answer})
    examples = task.read(None, "dev")
    model = load_for_task(task.job, seed)
    features = task.featurize(examples, BertTokenizer.from_pretrained(seed), 64)
    assert len(features) == len(examples)  # one window each: the contexts are short
    outputs = run_model(model, features, task.output_names, token_outputs=task.token_outputs)
    ours = task.postprocess(examples, features, outputs)

    their_tokenizer = transformers.AutoTokenizer.from_pretrained(seed)
    their_model = transformers.AutoModelForQuestionAnswering.from_pretrained(seed).eval()
    for example, feature, output, prediction in zip(examples, features, outputs, ours, strict=True):
        encoded = their_tokenizer(example.question, example.context, truncation="only_second", max_length=64,
                                  return_offsets_mapping=True, return_tensors="pt")
        offsets = encoded.pop("offset_mapping")[0].tolist()
        allowed = [0] + [i for i, s in enumerate(encoded.sequence_ids(0)) if s == 1]  # [CLS] and the context
        assert encoded["input_ids"][0].tolist() == feature.inputs["input_ids"]
        with torch.no_grad():
            theirs = their_model(**encoded)
        start_logits, end_logits = theirs.start_logits[0].numpy(), theirs.end_logits[0].numpy()
        np.testing.assert_allclose(start_logits, output["start_logits"], atol=1e-4)
        np.testing.assert_allclose(end_logits, output["end_logits"], atol=1e-4)
        first, last, their_score = _pipeline_best_span(start_logits, end_logits, allowed, max_answer)
        best = prediction.nbest[0]
        assert (offsets[first][0], offsets[last][1]) == (best["start"], best["end"])
        assert example.context[offsets[first][0]:offsets[last][1]] == prediction.text
        _, _, our_score = _pipeline_best_span(output["start_logits"], output["end_logits"], allowed, max_answer)
        assert their_score == pytest.approx(our_score, abs=1e-4)


def _pipeline_best_span(start_logits: np.ndarray, end_logits: np.ndarray, allowed: list[int],
                        max_answer: int) -> tuple[int, int, float]:
    """transformers 4's question-answering decoding: (first token, last token, P(start) * P(end))."""
    start_p, end_p = _softmax(start_logits[allowed]), _softmax(end_logits[allowed])
    start_p[0] = end_p[0] = 0.0  # [CLS] takes part in the normalisation only
    scores = np.triu(np.outer(start_p, end_p)) - np.triu(np.outer(start_p, end_p), k=max_answer)
    a, b = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return allowed[a], allowed[b], float(scores[a, b])


def _softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()


def test_qa_predict_input_rows_agree_with_predict_qa_data(encoder_dir: Path, tmp_path: Path) -> None:
    """The two ways to answer a QA file: `predict qa --data` writes SQuAD's predictions.json,
    `predict --input` a row per question (id, answer, score, character offsets); same answers."""
    rows = _qa_rows()
    _write_jsonl(tmp_path / "train.jsonl", rows)
    out = tmp_path / "run"
    assert _cli("finetune", "qa", "--train", tmp_path / "train.jsonl", "--dev", tmp_path / "train.jsonl", "--model",
                encoder_dir, "--out", out, "--epochs", "3", "--batch-size", "2", "--lr", "1e-3",
                "--max-length", "64").exit_code == 0
    new = _write_jsonl(tmp_path / "new.jsonl", [{k: v for k, v in r.items() if k != "answers"} for r in rows])
    result = _cli("predict", "qa", "--model", out / "seed-1", "--data", new, "--out", tmp_path / "pred")
    assert result.exit_code == 0, result.output
    answers = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    result = _cli("predict", "--model", out / "seed-1", "--input", new, "--out", tmp_path / "rows.jsonl")
    assert result.exit_code == 0, result.output
    predicted = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [p["id"] for p in predicted] == [r["id"] for r in rows]
    assert {p["id"]: p["answer"] for p in predicted} == answers
    assert any(answers.values()), answers  # the model answers some questions: the comparison means something
    for row, p in zip(rows, predicted, strict=True):
        assert p["no_answer"] == (p["answer"] == "")
        if p["answer"]:
            assert row["context"][p["start"]:p["end"]] == p["answer"]
