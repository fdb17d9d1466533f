"""The inference pipeline: Python `pipeline()`, `bertforge predict --input` and `bertforge serve` give the
same predictions, equal to fine-tuning's own (`finetune.predict`), with the settings saved in task.json.

Models are fine-tuned here for a few steps from a random one-layer encoder on the small fixtures under
tests/fixtures/tasks (their predictions are meaningless; the plumbing is what is checked).
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.finetune import finetune, predict
from bertforge.model import BertConfig, BertForMaskedLM, BertModel
from bertforge.pipeline import InputError, Pipeline
from bertforge.tables import read_rows
from bertforge.tokenizer import BertTokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
CORPUS = [
    "the normans were a people who gave their name to normandy , a region in france .",
    "zurich is the largest city in switzerland ; its airport opened in 1948 .",
    "new york times reported that anna smith met bob in rome .",
    "a gripping , beautifully acted film with a terrible ending . not bad at all .",
]
SENTENCES = ["a gripping film", "not bad at all , a beautifully acted film with a terrible ending", "dull",
             "zurich is the largest city", "the normans"]
NER_TEXTS = ["Anna Smith met Bob in Rome .", "New York Times reported that zurich is large ."]
ZURICH = "Zürich is the largest city in Switzerland; its airport opened in 1948."
QUESTIONS = [{"question": "What is the largest city in Switzerland?", "context": ZURICH},
             {"question": "When did the station open?", "context": ZURICH},
             {"question": "Who gave their name to normandy?", "context": CORPUS[0] + " " + ZURICH * 3}]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fine-tuned model directories (glue SST-2, ner, squad v2.0), a masked-LM and a bare encoder."""
    root = tmp_path_factory.mktemp("pipeline")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    BertModel(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    BertForMaskedLM(config).save_pretrained(root / "mlm", tokenizer=tokenizer)
    quiet = {"progress": False, "verbose": False}
    finetune("glue", "SST-2", root / "encoder", FIXTURES / "glue", root / "sst2", epochs=1, batch_size=2,
             max_length=24, **quiet)
    conll = root / "conll"
    conll.mkdir()
    shutil.copy(FIXTURES / "conll" / "with_docstart.txt", conll / "eng.train")
    shutil.copy(FIXTURES / "conll" / "without_docstart.txt", conll / "eng.testa")
    shutil.copy(FIXTURES / "conll" / "without_docstart.txt", conll / "eng.testb")
    finetune("ner", "conll2003", root / "encoder", conll, root / "ner", epochs=1, batch_size=2, max_length=8,
             **quiet)
    squad = root / "squad2"
    squad.mkdir()
    shutil.copy(FIXTURES / "squad" / "v2.json", squad / "train-v2.0.json")
    shutil.copy(FIXTURES / "squad" / "v2.json", squad / "dev-v2.0.json")
    finetune("squad", "v2.0", root / "encoder", squad, root / "squad", epochs=1, batch_size=2, max_length=32,
             task_settings={"doc_stride": 8}, **quiet)
    swag = root / "swag-data"
    swag.mkdir()
    shutil.copy(FIXTURES / "swag" / "sample.jsonl", swag / "train.jsonl")
    shutil.copy(FIXTURES / "swag" / "sample.jsonl", swag / "val.jsonl")
    finetune("swag", "swag", root / "encoder", swag, root / "swag", epochs=1, batch_size=2, max_length=24, **quiet)
    return {"cls": root / "sst2" / "seed-1", "ner": root / "ner" / "seed-1", "qa": root / "squad" / "seed-1",
            "mc": root / "swag" / "seed-1", "mlm": root / "mlm", "encoder": root / "encoder", "conll": conll,
            "squad": squad, "swag": swag}


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["predict", *map(str, args), "--no-progress"])
    return result.exit_code, result.output


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------- Python


def test_the_task_and_its_settings_come_from_the_model_dir(models: dict[str, Path]) -> None:
    from bertforge import pipeline

    clf = pipeline(models["cls"])
    assert isinstance(clf, Pipeline) and clf.task == "text-classification" and clf.max_length == 24
    results = clf(["a gripping film", "dull"])
    assert [set(r) for r in results] == [{"label", "score"}] * 2
    # SST-2's classes by name (its files say 0/1)
    assert all(r["label"] in ("negative", "positive") and 0.5 <= r["score"] <= 1 for r in results)
    single = clf("dull")  # one input, one result; batched with a longer input, kernels may round apart
    assert single["label"] == results[1]["label"] and single["score"] == pytest.approx(results[1]["score"], abs=1e-5)
    ner = pipeline(models["ner"])
    assert ner.task == "token-classification" and ner.max_length == 8 and ner.labels[1] == "B-PER"
    qa = pipeline(models["qa"])
    saved = json.loads((models["qa"] / "task.json").read_text())
    assert qa.task == "question-answering" and qa.spec.version == "2.0"
    assert qa.spec.settings["null_threshold"] == saved["settings"]["null_threshold"]
    assert qa.spec.settings["doc_stride"] == 8 and qa.max_length == 32
    assert pipeline(models["mlm"]).task == "fill-mask" and pipeline(models["encoder"]).task == "embeddings"


def test_task_override_embeddings_and_refusals(models: dict[str, Path]) -> None:
    from bertforge import pipeline

    mean = pipeline(models["cls"], task="embeddings", pooling="mean")(["a gripping film", "dull"])
    cls = pipeline(models["cls"], task="embeddings", pooling="cls")("a gripping film")
    assert len(mean[0]["embedding"]) == 32 and mean[0]["embedding"] != cls["embedding"]
    unit = pipeline(models["encoder"], normalize=True)("dull")["embedding"]
    assert math.isclose(sum(x * x for x in unit), 1.0, rel_tol=1e-6)
    with pytest.raises(ValueError, match="needs a BertForMaskedLM"):
        pipeline(models["cls"], task="fill-mask")
    with pytest.raises(ValueError, match="unknown pipeline task"):
        pipeline(models["cls"], task="translation")
    with pytest.raises(ValueError, match="needs a BertForSequenceClassification"):  # no head to run
        pipeline(models["encoder"], task="text-classification")
    blank = pipeline(models["cls"])(["fine", "  ", ""])  # an empty text is answered, as transformers does
    assert len(blank) == 3 and all(r["label"] for r in blank) and blank[1] == blank[2]
    with pytest.raises(ValueError, match="all_scores is for text-classification"):
        pipeline(models["cls"], task="embeddings", all_scores=True)


def test_classification_equals_finetunings_predictions(models: dict[str, Path], tmp_path: Path) -> None:
    predict("glue", "SST-2", models["cls"], FIXTURES / "glue", tmp_path, splits=["dev"])
    expected = [line.split("\t")[1] for line in (tmp_path / "SST-2-dev.tsv").read_text().splitlines()[1:]]
    sentences = [line.split("\t")[0] for line in (FIXTURES / "glue" / "SST-2" / "dev.tsv").read_text()
                 .splitlines()[1:]]
    from bertforge import pipeline

    names = {"0": "negative", "1": "positive"}  # the leaderboard file's 0/1, the head's names
    assert [r["label"] for r in pipeline(models["cls"])(sentences)] == [names[label] for label in expected]


def test_call_time_options_are_transformers_or_refused(models: dict[str, Path]) -> None:
    """A call takes the options its task changes per call (top_k for classification and fill-mask,
    as transformers' pipelines take them); any other is a TypeError naming it, never ignored."""
    from bertforge import pipeline

    classifier = pipeline(models["cls"])
    plain = classifier("a gripping film")
    ranked = classifier("a gripping film", top_k=None)  # every label, best first, as transformers answers
    assert [r["label"] for r in ranked][0] == plain["label"] and len(ranked) == len(classifier.labels)
    assert ranked[0]["score"] == pytest.approx(plain["score"]) and ranked[0]["score"] >= ranked[1]["score"]
    batched, alone = classifier(["a gripping film", "dull"], top_k=1)[1], classifier("dull", top_k=None)[:1]
    assert [r["label"] for r in batched] == [r["label"] for r in alone]
    # padded beside a longer text, the same scores up to float rounding (the reduction order may differ)
    assert [r["score"] for r in batched] == pytest.approx([r["score"] for r in alone], abs=1e-6)
    with pytest.raises(TypeError, match=r"text-classification pipeline: unknown option\(s\) foo at call time "
                                        r"\(it takes: top_k"):
        classifier("a gripping film", foo=1)
    with pytest.raises(ValueError, match="top_k"):
        classifier("a gripping film", top_k=0)
    fill = pipeline(models["mlm"])
    assert len(fill("the [MASK] sat .", top_k=2)[0]) == 2  # one mask: its two best tokens
    with pytest.raises(TypeError, match="fill-mask pipeline: unknown option.*normalize"):
        fill("the [MASK] sat .", normalize=True)


def test_function_to_apply_batch_size_and_aggregation_at_call_time(models: dict[str, Path]) -> None:
    """transformers' other call-time options: function_to_apply scores a classifier's labels with the named
    function of its logits, batch_size changes the batches and not the answers, and a tagger's
    aggregation_strategy='none' answers one row per word in transformers' shape."""
    import numpy as np

    from bertforge import pipeline

    classifier = pipeline(models["cls"])
    prepared = classifier.prepare(["a gripping film"])
    logits = np.asarray(classifier.run(prepared.features)[0]["logits"], dtype=np.float64)
    raw = classifier("a gripping film", function_to_apply="none", top_k=None)
    assert sorted(r["score"] for r in raw) == pytest.approx(sorted(logits.tolist()), abs=1e-5)
    sigmoid = classifier("a gripping film", function_to_apply="sigmoid", top_k=None)
    assert sorted(r["score"] for r in sigmoid) == pytest.approx(sorted((1 / (1 + np.exp(-logits))).tolist()), abs=1e-6)
    softmax = classifier("a gripping film", function_to_apply="softmax")
    plain = classifier("a gripping film")
    assert softmax["label"] == plain["label"] and softmax["score"] == pytest.approx(plain["score"], abs=1e-6)
    with pytest.raises(ValueError, match="function_to_apply must be one of softmax, sigmoid, none"):
        classifier("a gripping film", function_to_apply="tanh")
    texts = ["a gripping film", "dull", "the cast is fine and the plot is thin"]
    assert [r["label"] for r in classifier(texts, batch_size=1)] == [r["label"] for r in classifier(texts)]
    with pytest.raises(ValueError, match="batch_size"):
        classifier(texts, batch_size=0)
    ner = pipeline(models["ner"])
    words = ner(NER_TEXTS[0], aggregation_strategy="none")
    assert [set(w) for w in words] == [{"entity", "score", "index", "word", "start", "end"}] * len(words)
    assert [w["index"] for w in words] == list(range(len(words)))
    assert all(NER_TEXTS[0][w["start"]:w["end"]] == w["word"] for w in words)
    assert ner(NER_TEXTS[0], aggregation_strategy="simple") == ner(NER_TEXTS[0])
    with pytest.raises(ValueError, match="aggregation_strategy must be one of simple, none"):
        ner(NER_TEXTS[0], aggregation_strategy="max")


def test_ner_equals_finetunings_tags_and_entities_point_into_the_text(models: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    predict("ner", "conll2003", models["ner"], models["conll"], tmp_path)
    sentences, current = [], []
    for line in (tmp_path / "predictions-test.txt").read_text().splitlines() + [""]:
        if line.strip():
            current.append(line.split())
        elif current:
            sentences.append(current)
            current = []
    from bertforge import pipeline

    ner = pipeline(models["ner"])
    prepared = ner.prepare([" ".join(w for w, _, _ in s) for s in sentences])
    results = ner.finish(prepared, ner.run(prepared.features))
    compared = 0
    for sentence, result in zip(sentences, results, strict=True):
        if [w["word"] for w in result["words"]] != [w for w, _, _ in sentence]:
            continue  # "1996-08-22" is one CoNLL word but five for BERT's pre-tokeniser
        assert [w["label"] for w in result["words"]] == [tag for _, _, tag in sentence]
        compared += 1
    assert compared >= 2
    for text, entities in zip(NER_TEXTS, ner(NER_TEXTS), strict=True):
        for entity in entities:
            assert text[entity["start"]:entity["end"]] == entity["text"] and entity["label"] in ("PER", "ORG", "LOC", "MISC")


def test_words_split_already_are_tagged_as_fine_tuning_tagged_them(models: dict[str, Path], tmp_path: Path) -> None:
    """A tagging file's tokens (a JSON list of words) are tagged word by word, every sentence alike,
    "1996-08-22" included; a word holding a space is that row's error, not the run's."""
    predict("ner", "conll2003", models["ner"], models["conll"], tmp_path)
    sentences = [block.split("\n") for block in (tmp_path / "predictions-test.txt").read_text().strip().split("\n\n")]
    words = [[line.split()[0] for line in s] for s in sentences]
    tags = [[line.split()[-1] for line in s] for s in sentences]
    rows = [{"tokens": w} for w in words] + [{"tokens": ["two words", "x"]}]
    source = _write_jsonl(tmp_path / "tokens.jsonl", rows)
    code, output = _cli("--model", models["ner"], "--input", source, "--text-column", "tokens",
                        "--out", tmp_path / "tags.jsonl")
    assert code == 0, output
    written = [json.loads(line) for line in (tmp_path / "tags.jsonl").read_text().splitlines()]
    assert [r["tags"] for r in written[:-1]] == tags and [r["tokens"] for r in written[:-1]] == words
    assert all(len(r["scores"]) == len(r["tags"]) for r in written[:-1])
    assert "a word must be non-empty text without spaces" in written[-1]["error"]
    from bertforge import pipeline

    entities = pipeline(models["ner"])([words[0]])[0]  # in Python: a list of words inside the batch
    joined = " ".join(words[0])
    assert all(joined[e["start"]:e["end"]] == e["text"] for e in entities)


def test_squad_v2_equals_finetuning_and_respects_the_tuned_threshold(models: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    from bertforge import pipeline

    predict("squad", "v2.0", models["qa"], models["squad"], tmp_path, splits=["dev"])
    expected = json.loads((tmp_path / "predictions-dev.json").read_text())
    results = pipeline(models["qa"])(QUESTIONS[:2])
    assert [r["answer"] for r in results] == [expected["a1"], expected["a2"]]
    for result in results:
        if not result["no_answer"]:
            assert ZURICH[result["start"]:result["end"]] == result["answer"]

    as_tuple = pipeline(models["qa"])((QUESTIONS[2]["question"], QUESTIONS[2]["context"]))  # one input
    assert as_tuple == pipeline(models["qa"])(QUESTIONS[2])

    # the saved threshold decides: just below a question's null odds -> no answer; just above -> an answer
    odds = pipeline(models["qa"])(QUESTIONS[0])["null_odds"]
    copy = tmp_path / "model"
    shutil.copytree(models["qa"], copy)
    task_file = json.loads((copy / "task.json").read_text())
    for threshold, no_answer in ((odds - 0.01, True), (odds + 0.01, False)):
        task_file["settings"]["null_threshold"] = threshold
        (copy / "task.json").write_text(json.dumps(task_file))
        result = pipeline(copy)(QUESTIONS[0])
        assert result["no_answer"] is no_answer and (result["answer"] == "") is no_answer
        assert result["start"] is None if no_answer else ZURICH[result["start"]:result["end"]] == result["answer"]
        assert 0 < result["score"] <= 1


# ----------------------------------------------------------------------------- predict = serve = pipeline


def _serve(model_dir: Path, path: str, body: dict) -> list[dict]:
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(model_dir)) as client:
        response = client.post(path, json=body)
        assert response.status_code == 200, response.text
        return response.json()["results"]


def test_predict_serve_and_pipeline_agree_on_classification(models: dict[str, Path], tmp_path: Path) -> None:
    from bertforge import pipeline

    source = _write_jsonl(tmp_path / "in.jsonl", [{"id": i, "sentence": s} for i, s in enumerate(SENTENCES)])
    code, output = _cli("--model", models["cls"], "--input", source, "--text-column", "sentence",
                        "--keep-columns", "id", "--out", tmp_path / "out.csv", "--batch-size", "2")
    assert code == 0, output
    written = [row.values for row in read_rows(tmp_path / "out.csv")]
    direct = pipeline(models["cls"])(SENTENCES)
    served = _serve(models["cls"], "/classify", {"texts": SENTENCES})
    assert [row["id"] for row in written] == [str(i) for i in range(len(SENTENCES))]  # input order kept
    for row, mine, theirs in zip(written, direct, served, strict=True):
        assert row["label"] == mine["label"] == theirs["label"]
        assert math.isclose(float(row["score"]), mine["score"], rel_tol=1e-5)
        assert math.isclose(theirs["score"], mine["score"], rel_tol=1e-5)
        assert set(mine) == {"label", "score"}  # every label's score only when asked for

    # all_scores: every label, ranked, the same in all three (serve always answers them)
    code, output = _cli("--model", models["cls"], "--input", source, "--text-column", "sentence",
                        "--out", tmp_path / "all.jsonl", "--all-scores")
    assert code == 0, output
    written = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    direct = pipeline(models["cls"], all_scores=True)(SENTENCES)
    for row, mine, theirs in zip(written, direct, served, strict=True):
        for scores in (row["scores"], theirs["scores"]):
            assert [s["label"] for s in scores] == [s["label"] for s in mine["scores"]]
            assert all(math.isclose(a["score"], b["score"], rel_tol=1e-5)
                       for a, b in zip(scores, mine["scores"], strict=True))
        assert mine["scores"][0] == {"label": mine["label"], "score": mine["score"]}
        assert math.isclose(sum(s["score"] for s in mine["scores"]), 1.0, rel_tol=1e-5)


def test_predict_serve_and_pipeline_agree_on_ner(models: dict[str, Path], tmp_path: Path) -> None:
    from bertforge import pipeline

    source = tmp_path / "in.txt"
    source.write_text("\n".join(NER_TEXTS) + "\n", encoding="utf-8")
    code, output = _cli("--model", models["ner"], "--input", source, "--out", tmp_path / "out.jsonl")
    assert code == 0, output
    written = [json.loads(line)["entities"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    served = [r["entities"] for r in _serve(models["ner"], "/ner", {"texts": NER_TEXTS})]
    direct = pipeline(models["ner"])(NER_TEXTS)
    key = [[(e["label"], e["start"], e["end"], e["text"]) for e in entities] for entities in direct]
    for other in (written, served):
        assert [[(e["label"], e["start"], e["end"], e["text"]) for e in entities] for entities in other] == key
        # scores to 1e-5: rounding them would split two values a few ulps apart that straddle a boundary
        assert all(math.isclose(a["score"], b["score"], rel_tol=1e-5)
                   for mine, theirs in zip(direct, other, strict=True) for a, b in zip(mine, theirs, strict=True))


def test_predict_serve_and_pipeline_agree_on_squad_v2(models: dict[str, Path], tmp_path: Path) -> None:
    from bertforge import pipeline

    source = _write_jsonl(tmp_path / "in.jsonl", [{"q": q["question"], "passage": q["context"]} for q in QUESTIONS])
    code, output = _cli("--model", models["qa"], "--input", source, "--question-column", "q",
                        "--context-column", "passage", "--out", tmp_path / "out.jsonl")
    assert code == 0, output
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    served = _serve(models["qa"], "/qa", {"questions": [q["question"] for q in QUESTIONS],
                                          "contexts": [q["context"] for q in QUESTIONS]})
    direct = pipeline(models["qa"])(QUESTIONS)
    fields = ("answer", "start", "end", "no_answer")
    for row, mine, theirs in zip(written, direct, served, strict=True):
        assert [row[f] for f in fields] == [mine[f] for f in fields] == [theirs[f] for f in fields]
        assert math.isclose(row["score"], mine["score"], rel_tol=1e-5)
        assert math.isclose(theirs["score"], mine["score"], rel_tol=1e-5)


def test_predict_serve_and_pipeline_agree_on_fill_mask_and_embeddings(models: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    from bertforge import pipeline

    texts = ["the [MASK] is large .", "zurich is the [MASK] city in [MASK] ."]
    source = _write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    code, output = _cli("--model", models["mlm"], "--input", source, "--top-k", "3", "--out", tmp_path / "f.jsonl")
    assert code == 0, output
    written = [json.loads(line)["predictions"] for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    direct = pipeline(models["mlm"], top_k=3)(texts)
    served = [[m["predictions"] for m in r["masks"]] for r in _serve(models["mlm"], "/fill-mask",
                                                                      {"texts": texts, "top_k": 3})]
    assert [len(masks) for masks in direct] == [1, 2]
    for other in (written, served):
        assert [[[p["token"] for p in mask] for mask in masks] for masks in other] == \
            [[[p["token"] for p in mask] for mask in masks] for masks in direct]

    code, output = _cli("--model", models["mlm"], "--input", source, "--task", "embeddings", "--out",
                        tmp_path / "e.jsonl")
    assert code == 0, output
    written = [json.loads(line)["embedding"] for line in (tmp_path / "e.jsonl").read_text().splitlines()]
    direct = [r["embedding"] for r in pipeline(models["mlm"], task="embeddings")(texts)]
    served = [r["embedding"] for r in _serve(models["mlm"], "/embed", {"texts": texts, "normalize": False})]
    for other in (written, served):
        assert max(abs(a - b) for x, y in zip(other, direct, strict=True) for a, b in zip(x, y, strict=True)) < 1e-5


# ------------------------------------------------------------------------------------ files


@pytest.mark.parametrize("suffix", ["csv", "tsv", "jsonl.gz", "parquet", "txt"])
def test_predict_reads_every_format(models: dict[str, Path], tmp_path: Path, suffix: str) -> None:
    source = tmp_path / f"in.{suffix}"
    if suffix == "csv":
        source.write_text("text\n" + "\n".join(f'"{s}"' for s in SENTENCES) + "\n", encoding="utf-8")
    elif suffix == "tsv":
        source.write_text("text\n" + "\n".join(SENTENCES) + "\n", encoding="utf-8")
    elif suffix == "jsonl.gz":
        source.write_bytes(gzip.compress("".join(json.dumps({"text": s}) + "\n" for s in SENTENCES).encode()))
    elif suffix == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": SENTENCES}), source)
    else:
        source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    code, output = _cli("--model", models["cls"], "--input", source, "--out", tmp_path / "out.jsonl")
    assert code == 0, output
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(rows) == len(SENTENCES) and all(r["label"] in ("negative", "positive") for r in rows)
    # each row says where its input is and what it read (a CSV's header is line 1, a Parquet file counts rows)
    first_line = {"csv": 2, "tsv": 2, "parquet": 1}.get(suffix, 1)
    assert [r["row"] for r in rows] == list(range(first_line, first_line + len(SENTENCES)))
    assert [r["text"] for r in rows] == SENTENCES


def test_predict_rows_keep_the_id_and_text_unless_told(models: dict[str, Path], tmp_path: Path) -> None:
    source = _write_jsonl(tmp_path / "in.jsonl", [{"id": f"r{i}", "review": s, "stars": 3}
                                                  for i, s in enumerate(SENTENCES)])
    code, output = _cli("--model", models["cls"], "--input", source, "--text-column", "review",
                        "--keep-columns", "stars", "--out", tmp_path / "out.jsonl")
    assert code == 0, output
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert list(rows[0])[:4] == ["row", "id", "review", "stars"] and rows[0]["label"]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(len(SENTENCES))]
    code, output = _cli("--model", models["cls"], "--input", source, "--text-column", "review", "--no-keep-input",
                        "--out", tmp_path / "bare.jsonl")
    assert code == 0, output
    bare = [json.loads(line) for line in (tmp_path / "bare.jsonl").read_text().splitlines()]
    assert set(bare[0]) == {"label", "score"}


def test_extract_pool_and_predict_embeddings_are_one_path(models: dict[str, Path], tmp_path: Path) -> None:
    """`extract --pool` and `predict --task embeddings` give the same vectors, rows and files: .npy (with
    an index FeatureFile reads) or JSONL by --out; a blank line is embedded like any text; a row that
    cannot be embedded is a row of NaN with its error in the index, so row i stays input i."""
    import numpy as np

    from bertforge.features import FeatureFile

    lines = tmp_path / "in.txt"
    lines.write_text("the normans\n\na gripping film\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["extract", "--model", str(models["encoder"]), "--input", str(lines), "--pool",
                                      "mean", "--out", str(tmp_path / "x.npy"), "--quiet"])
    assert result.exit_code == 0, result.output
    code, output = _cli("--model", models["encoder"], "--input", lines, "--task", "embeddings", "--pooling", "mean",
                        "--out", tmp_path / "p.jsonl")
    assert code == 0, output
    predicted = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    features = FeatureFile(tmp_path / "x.npy")
    assert len(features) == 3 and [item["row"] for item in features.items] == [1, 2, 3]
    assert [item["text"] for item in features.items] == ["the normans", "", "a gripping film"]
    np.testing.assert_allclose(features.matrix, np.array([r["embedding"] for r in predicted]), atol=1e-6)
    source = _write_jsonl(tmp_path / "in.jsonl", [{"text": "the normans"}, {"text": None}, {"text": "dull"}])
    code, output = _cli("--model", models["encoder"], "--input", source, "--task", "embeddings",
                        "--out", tmp_path / "e.npy")
    assert code == 0, output
    recorded = FeatureFile(tmp_path / "e.npy")
    assert np.isnan(recorded.matrix[1]).all() and not np.isnan(recorded.matrix[[0, 2]]).any()
    assert "in.jsonl:2: text" in recorded.items[1]["error"] and "error" not in recorded.items[0]


def test_predict_streams_the_input_in_chunks(models: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk is predicted before the next is read: memory is bounded by the chunk, not the file."""
    import bertforge.tables
    from bertforge import pipeline
    from bertforge.pipeline import predict_file

    texts = [" ".join(["film"] * (1 + i % 7)) + f" {i}" for i in range(50)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    pulled: list[int] = []
    real = bertforge.tables.iter_rows

    def counting(*args, **kwargs):
        for row in real(*args, **kwargs):
            pulled.append(row.number)
            yield row

    monkeypatch.setattr(bertforge.tables, "iter_rows", counting)
    pipe = pipeline(models["cls"], batch_size=4)
    pulled_at_run: list[int] = []
    run = pipe.run

    def recording(features, **options):
        pulled_at_run.append(len(pulled))
        return run(features, **options)

    monkeypatch.setattr(pipe, "run", recording)
    done = predict_file(pipe, source, tmp_path / "out.jsonl", chunk_rows=8, progress=False)
    assert done["rows"] == 50 and pulled_at_run == [8, 16, 24, 32, 40, 48, 50]
    written = [json.loads(line)["label"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert written == [r["label"] for r in pipe(texts)]  # input order, whatever the length sorting did


@pytest.mark.parametrize("case", ["missing column", "empty file", "null text", "number for text"])
def test_predict_bad_input_is_one_located_line_and_no_file(models: dict[str, Path], tmp_path: Path,
                                                           case: str) -> None:
    out = tmp_path / "out.jsonl"
    if case == "missing column":
        source = tmp_path / "in.csv"
        source.write_text("review,stars\ngood,5\n", encoding="utf-8")
        expected = "in.csv:2: text: no such column; the columns are: review, stars"
    elif case == "empty file":
        source = tmp_path / "in.txt"
        source.write_text("", encoding="utf-8")
        expected = "in.txt: empty file"
    elif case == "null text":
        source = tmp_path / "in.jsonl"
        source.write_text('{"text": "good"}\n' * 10 + '{"text": null}\n', encoding="utf-8")
        expected = "in.jsonl:11: text: empty"
    else:
        source = tmp_path / "in.jsonl"
        source.write_text('{"text": "good"}\n{"text": 3}\n', encoding="utf-8")
        expected = "in.jsonl:2: text: not text (int)"
    code, output = _cli("--model", models["cls"], "--input", source, "--out", out, "--chunk-rows", "4",
                        "--on-error", "stop")
    assert code == 2
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0], output
    assert not out.exists() and not list(tmp_path.glob(".out.jsonl*"))  # nothing written half


@pytest.mark.parametrize("out_name", ["out.jsonl", "out.csv"])
def test_one_bad_row_never_kills_the_run(models: dict[str, Path], tmp_path: Path, out_name: str) -> None:
    """1,000 rows with a blank text and a cell that is not text: 999 answers (the blank one too, as
    transformers answers "") and one error row, in order."""
    source = tmp_path / "in.jsonl"
    rows = [{"text": f"review number {i} was good", "id": i} for i in range(1000)]
    rows[10]["text"], rows[500]["text"] = "   ", 7
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / out_name
    code, output = _cli("--model", models["cls"], "--input", source, "--out", out, "--keep-columns", "id",
                        "--chunk-rows", "64", "--no-progress")
    assert code == 0, output
    assert "1 row could not be answered and was recorded" in " ".join(output.split()), output
    if out_name.endswith(".jsonl"):
        written = [json.loads(line) for line in out.read_text().splitlines()]
    else:
        import csv

        written = list(csv.DictReader(out.open(encoding="utf-8")))
    assert [int(r["id"]) for r in written] == list(range(1000))  # every row, in input order
    errors = {int(r["id"]): r["error"] for r in written if r.get("error")}
    assert errors == {500: f"{source}:501: text: not text (int); name the column that holds the text"}
    assert all(r["label"] for r in written if int(r["id"]) not in errors)
    skipped = tmp_path / "skipped.jsonl"
    code, output = _cli("--model", models["cls"], "--input", source, "--out", skipped, "--keep-columns", "id",
                        "--on-error", "skip", "--no-progress")
    assert code == 0 and "was skipped" in " ".join(output.split())
    kept = [json.loads(line)["id"] for line in skipped.read_text().splitlines()]
    assert len(kept) == 999 and 10 in kept and 500 not in kept


def test_predict_keeps_the_leaderboard_mode(models: dict[str, Path], tmp_path: Path) -> None:
    code, output = _cli("glue", "--model", models["cls"], "--data", FIXTURES / "glue", "--out", tmp_path)
    assert code == 0, output
    assert (tmp_path / "SST-2.tsv").read_text().startswith("index\tprediction\n")
    code, output = _cli("--model", models["cls"], "--out", tmp_path / "x.jsonl")
    assert code == 2 and "--input" in output
    code, output = _cli("glue", "--model", models["cls"], "--input", tmp_path / "SST-2.tsv", "--out",
                        tmp_path / "x.jsonl")
    assert code == 2 and "FAMILY" in output


def test_precision(models: dict[str, Path], tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.precision import save_quantized

    fp32 = pipeline(models["cls"])
    assert fp32.precision == "fp32"
    reference = fp32(SENTENCES)
    for precision in ("bf16", "int8"):
        pipe = pipeline(models["cls"], precision=precision)
        assert pipe.precision == precision
        for mine, theirs in zip(pipe(SENTENCES), reference, strict=True):
            assert abs(mine["score"] - theirs["score"]) < 0.02
    quantized = tmp_path / "int8"
    save_quantized(pipeline(models["cls"], precision="int8").model, quantized, tokenizer=fp32.tokenizer)
    shutil.copy(models["cls"] / "task.json", quantized / "task.json")
    saved = pipeline(quantized)
    assert saved.precision == "int8" and saved.task == "text-classification"
    assert [r["label"] for r in saved(SENTENCES)] == [r["label"] for r in pipeline(models["cls"], precision="int8")(SENTENCES)]
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    code, output = _cli("--model", models["cls"], "--input", source, "--out", tmp_path / "o.jsonl", "--precision", "bf16")
    assert code == 0 and "(bf16)" in output, output
    code, output = _cli("--model", models["cls"], "--input", source, "--out", tmp_path / "o.jsonl", "--precision", "fp8")
    assert code == 2 and "unknown precision" in output
    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(models["cls"], precision="bf16")) as client:
        served = client.post("/classify", json={"texts": SENTENCES}).json()["results"]
    expected = pipeline(models["cls"], precision="bf16")(SENTENCES)
    assert [r["label"] for r in served] == [r["label"] for r in expected]
    assert all(abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(served, expected, strict=True))


def test_multiple_choice_equals_finetuning_through_pipeline_and_predict(models: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    from bertforge import pipeline

    predict("swag", "swag", models["mc"], models["swag"], tmp_path, splits=["dev"])
    expected = [int(line.split(",")[1]) for line in (tmp_path / "predictions-dev.csv").read_text().splitlines()[1:]]
    rows = [json.loads(line) for line in (models["swag"] / "val.jsonl").read_text().splitlines() if line.strip()]
    inputs = [{"context": r["sent1"], "start": r["sent2"], "endings": [r[f"ending{k}"] for k in range(4)]}
              for r in rows]
    mc = pipeline(models["mc"])
    assert mc.task == "multiple-choice"
    results = mc(inputs)
    assert [r["choice"] for r in results] == expected
    assert all(r["ending"] == i["endings"][r["choice"]] for r, i in zip(results, inputs, strict=True))
    code, output = _cli("--model", models["mc"], "--input", models["swag"] / "val.jsonl", "--out", tmp_path / "o.jsonl")
    assert code == 0, output
    assert [json.loads(line)["choice"] for line in (tmp_path / "o.jsonl").read_text().splitlines()] == expected
    with pytest.raises(InputError, match="3 endings"):
        mc({"context": "a", "endings": ["b", "c", "d"]})


def test_a_cuda_device_without_cuda_is_one_line_before_the_model_loads(models: dict[str, Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from bertforge import pipeline
    from bertforge.devices import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"device cuda: this torch \(.*\) (was built without CUDA|sees no CUDA GPU); "
                                         r"use --device cpu") as caught:
        pipeline(models["cls"], device="cuda")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="not a torch device"):
        check_device("gpu0")
    check_device("cpu")
    check_device(None)
    source = tmp_path / "in.txt"
    source.write_text("a gripping film\n", encoding="utf-8")
    code, output = _cli("--model", str(models["cls"]), "--input", str(source), "--out",
                        str(tmp_path / "out.jsonl"), "--device", "cuda")
    assert code == 2 and "use --device cpu" in output and "Traceback" not in output
    assert not (tmp_path / "out.jsonl").exists()


def test_predict_names_a_missing_input_or_a_wrong_out_before_loading_the_model(tmp_path: Path) -> None:
    never_loaded = tmp_path / "no-model-here"  # a model error would come first if the model were loaded first
    code, output = _cli("--model", never_loaded, "--input", tmp_path / "missing.txt", "--out", tmp_path / "o.jsonl")
    assert code == 2 and "missing.txt: no such file" in output
    source = tmp_path / "in.txt"
    source.write_text("a line\n", encoding="utf-8")
    code, output = _cli("--model", never_loaded, "--input", source, "--out", tmp_path / "o.xlsx")
    assert code == 2 and "o.xlsx: predictions are written as .jsonl, .csv or .tsv" in output
