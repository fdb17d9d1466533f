"""Data sets by name (`org/name[@revision][:config][:split]`) through a loopback Hugging Face Hub: the
benchmark families read the Hub's GLUE, CoNLL-2003 and SQuAD layouts into the examples their local files
give; the own-data families read a repository's Parquet splits; the commits are recorded; the cache
serves an offline rerun; names that are files never reach the server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.finetune import FinetuneRecipe, finetune
from bertforge.hubdata import DatasetName, HubDataError, dataset_name, resolve_split
from bertforge.recipe import load
from bertforge.tasks.ner import Ner, read_conll
from bertforge.tasks.squad import Squad
from tests.hub_server import loopback_hub_fixture, set_hub_offline  # noqa: F401  (the `loopback_hub` fixture)
from tests.tiny_models import save_tiny_encoder

POSITIVE = ["a warm and bright film", "gripping acting and a warm story", "bright and gripping"]
NEGATIVE = ["a dull slow film", "flat acting and a dull ending", "slow and flat"]
WORDS = " ".join(POSITIVE + NEGATIVE)


def parquet(rows: list[dict], features: dict | None = None) -> bytes:
    """A Parquet file as `datasets` writes it: the features (ClassLabel names) in the schema metadata."""
    table = pa.Table.from_pylist(rows)
    if features:
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def class_label(*names: str) -> dict:
    return {"names": list(names), "_type": "ClassLabel"}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_encoder(tmp_path_factory.mktemp("hub-data"), WORDS, vocab_size=80, hidden_size=16)


def sst2_rows() -> dict[str, list[dict]]:
    train = [{"sentence": t, "label": 1, "idx": i} for i, t in enumerate(POSITIVE)]
    train += [{"sentence": t, "label": 0, "idx": i + 3} for i, t in enumerate(NEGATIVE)]
    dev = [{"sentence": t, "label": label, "idx": i} for i, (t, label) in enumerate(
        [("warm and gripping", 1), ("dull and flat", 0), ("a bright story", 1), ("a slow ending", 0)])]
    test = [{"sentence": "a warm ending", "label": -1, "idx": 0}]
    return {"train": train, "validation": dev, "test": test}


def test_names_and_paths() -> None:
    assert dataset_name("nyu-mll/glue:sst2") == DatasetName("nyu-mll/glue", None, "sst2", None)
    assert dataset_name("org/x@v1::validation") == DatasetName("org/x", "v1", None, "validation")
    assert dataset_name("imdb") == DatasetName("imdb")
    for path in ("train.csv", "data/train.jsonl", "./org/x", "/abs/dir", "~/x", "a/b/c", "reviews.tsv.gz"):
        assert dataset_name(path) is None, path


def test_glue_from_the_hub_scores_as_the_local_files(loopback_hub, encoder: Path, tmp_path: Path) -> None:
    rows = sst2_rows()
    features = {"sentence": {"dtype": "string", "_type": "Value"}, "label": class_label("negative", "positive")}
    loopback_hub.commit("nyu-mll/glue", {f"sst2/{split}-00000-of-00001.parquet": parquet(r, features)
                                         for split, r in rows.items()}, repo_type="dataset")
    loopback_hub.commit("nyu-mll/glue", {"cola/train-00000-of-00001.parquet": parquet(rows["train"])},
                        repo_type="dataset")
    local = tmp_path / "glue" / "SST-2"
    local.mkdir(parents=True)
    for split, name in (("train", "train"), ("validation", "dev")):
        lines = ["sentence\tlabel", *(f"{r['sentence']}\t{r['label']}" for r in rows[split])]
        (local / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (local / "test.tsv").write_text("index\tsentence\n0\ta warm ending\n", encoding="utf-8")
    settings = {"epochs": 2, "batch_size": 2, "lr": 1e-3, "progress": False, "verbose": False}
    from_files = finetune("glue", "SST-2", encoder, tmp_path / "glue", tmp_path / "local", **settings)
    loopback_hub.clear_requests()
    from_hub = finetune("glue", "SST-2", encoder, "nyu-mll/glue", tmp_path / "hub", **settings)
    assert from_hub["seeds"][0]["metrics"] == from_files["seeds"][0]["metrics"]
    assert from_hub["eval_examples"] == from_files["eval_examples"] == {"dev": 4}
    fetched = loopback_hub.downloads()
    assert fetched and all(url.startswith("sst2/") for url in fetched), fetched  # only the task's config
    source = from_hub["data_source"]["train"]
    assert source["commit"] == loopback_hub.head("nyu-mll/glue", repo_type="dataset") and source["config"] == "sst2"
    recorded = yaml.safe_load((tmp_path / "hub" / "run_config.yaml").read_text())
    assert recorded["data_source"]["dev"]["split"] == "validation"
    load(FinetuneRecipe, tmp_path / "hub" / "run_config.yaml")  # the records do not stop it reading back


def test_conll_from_the_hubs_parquet_conversion(loopback_hub, tmp_path: Path) -> None:
    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    features = {"ner_tags": {"feature": class_label(*names), "_type": "Sequence"},
                "pos_tags": {"feature": class_label("NNP", "VBZ", "IN"), "_type": "Sequence"}}
    dev = [{"id": "0", "tokens": ["Anna", "Smith", "visits", "Paris"], "pos_tags": [0, 0, 1, 0],
            "chunk_tags": [0, 0, 0, 0], "ner_tags": [1, 2, 0, 5]}]
    loopback_hub.commit("eriktks/conll2003", {"conll2003.py": "# a loading script", "README.md": "# CoNLL"},
                        repo_type="dataset")
    loopback_hub.branch("eriktks/conll2003", "refs/convert/parquet", repo_type="dataset")
    loopback_hub.commit("eriktks/conll2003", {"conll2003/validation/0000.parquet": parquet(dev, features)},
                        repo_type="dataset", branch="refs/convert/parquet")
    (tmp_path / "eng.testa").write_text("Anna NNP B-NP I-PER\nSmith NNP I-NP I-PER\nvisits VBZ B-VP O\n"
                                        "Paris NNP B-NP I-LOC\n", encoding="utf-8")
    task = Ner()
    from_hub = task.read("eriktks/conll2003", "dev")
    from_file = read_conll(tmp_path / "eng.testa")
    assert [(s.words, s.labels) for s in from_hub] == [(s.words, s.labels) for s in from_file]
    assert from_hub[0].pos_tags == ["NNP", "NNP", "VBZ", "NNP"]
    assert task.data_sources()["dev"]["revision"] == "refs/convert/parquet"
    with pytest.raises(HubDataError, match="no Parquet files"):  # a revision named is read as it is
        resolve_split("eriktks/conll2003@main", "dev")


def test_squad_from_the_hub_reads_as_its_json(loopback_hub, tmp_path: Path) -> None:
    context = "Paris is the capital of France."
    rows = [{"id": "q1", "title": "France", "context": context, "question": "What is the capital?",
             "answers": {"text": ["Paris"], "answer_start": [0]}},
            {"id": "q2", "title": "France", "context": context, "question": "Of what?",
             "answers": {"text": ["France", "France"], "answer_start": [24, 24]}}]
    loopback_hub.commit("rajpurkar/squad", {"plain_text/validation-00000-of-00001.parquet": parquet(rows)},
                        repo_type="dataset")
    squad_json = {"version": "1.1", "data": [{"title": "France", "paragraphs": [{"context": context, "qas": [
        {"id": r["id"], "question": r["question"],
         "answers": [{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"],
                                                                    strict=True)]} for r in rows]}]}]}
    (tmp_path / "dev-v1.1.json").write_text(json.dumps(squad_json), encoding="utf-8")
    assert Squad("v1.1").read("rajpurkar/squad", "dev") == Squad("v1.1").read(tmp_path, "dev")


def test_own_files_from_the_hub_with_label_names_and_an_offline_rerun(loopback_hub, encoder: Path,
                                                                       tmp_path: Path, monkeypatch) -> None:
    rows = sst2_rows()
    features = {"label": class_label("neg", "pos")}
    train = [{"text": r["sentence"], "label": r["label"]} for r in rows["train"]]
    dev = [{"text": r["sentence"], "label": r["label"]} for r in rows["validation"]]
    loopback_hub.commit("me/reviews", {"data/train-00000-of-00001.parquet": parquet(train, features),
                                       "data/validation-00000-of-00001.parquet": parquet(dev, features)},
                        repo_type="dataset")
    runner = CliRunner()
    args = ["finetune", "classify", "--model", str(encoder), "--train", "me/reviews", "--dev", "me/reviews",
            "--epochs", "1", "--batch-size", "2"]
    first = runner.invoke(app, [*args, "--out", str(tmp_path / "online")])
    assert first.exit_code == 0, first.output
    results = json.loads((tmp_path / "online" / "results.json").read_text())
    task = json.loads((tmp_path / "online" / "seed-1" / "task.json").read_text())
    assert task["labels"] == ["neg", "pos"]  # the ClassLabel names, not 0 and 1
    assert results["data_source"]["dev"]["split"] == "validation"
    assert results["data_source"]["train"]["commit"] == loopback_hub.head("me/reviews", repo_type="dataset")

    set_hub_offline(monkeypatch)
    loopback_hub.clear_requests()
    again = runner.invoke(app, [*args, "--out", str(tmp_path / "offline")])
    assert again.exit_code == 0, again.output
    assert loopback_hub.requests == []
    assert json.loads((tmp_path / "offline" / "results.json").read_text())["summary"] == results["summary"]


def test_bad_names_are_one_line_and_files_never_reach_the_hub(loopback_hub, encoder: Path, tmp_path: Path) -> None:
    loopback_hub.commit("me/reviews", {"data/train-00000-of-00001.parquet": parquet([{"text": "a", "label": 0}])},
                        repo_type="dataset")
    runner = CliRunner()
    base = ["finetune", "classify", "--model", str(encoder), "--out", str(tmp_path / "out")]
    loopback_hub.clear_requests()
    typo = runner.invoke(app, [*base, "--train", "reviews/train.csv"])
    assert typo.exit_code == 2 and "no such file" in typo.output and loopback_hub.requests == []
    unknown = runner.invoke(app, [*base, "--train", "me/nothing"])
    assert unknown.exit_code == 2 and "no such data set" in unknown.output, unknown.output
    split = runner.invoke(app, [*base, "--train", "me/reviews", "--dev", "me/reviews::nope"])
    assert split.exit_code == 2 and "data/train" in split.output, split.output
    assert not (tmp_path / "out" / "results.json").exists()
    with pytest.raises(HubDataError, match="several configs"):
        loopback_hub.commit("org/multi", {"a/train-0.parquet": parquet([{"x": 1}]),
                                          "b/train-0.parquet": parquet([{"x": 1}])}, repo_type="dataset")
        resolve_split("org/multi", "train")
