"""Every registered model family through every workflow: each task family fine-tunes it, predict and
the pipeline run what fine-tuning trained, serve answers, low precision and ONNX export hold, features
and attention maps come out where the family computes them.

The families are read from the registry, so a family added later is covered without an edit here. Each
runs from its smallest preset, with a WordPiece tokenizer trained on a tiny corpus (the tokenizer is
not the family's concern here) and one epoch on the small fixtures: the plumbing is what is checked,
not the scores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from bertforge.finetune import finetune, predict
from bertforge.model import registry
from bertforge.tokenizer import BertTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
QUIET = {"progress": False, "verbose": False, "epochs": 1, "batch_size": 2}
CORPUS = [
    "the normans were a people who gave their name to normandy , a region in france .",
    "zurich is the largest city in switzerland ; its airport opened in 1948 .",
    "new york times reported that anna smith met bob in rome .",
    "a gripping , beautifully acted film with a terrible ending . not bad at all .",
    "what is the largest city ? when did the station open ? who gave their name ?",
]



def _architectures() -> list[str]:
    """One model_type per architecture: a family whose config class derives from another family's
    (XLM-R's and CamemBERT's from RoBERTa's) runs the same code, tested in its own folder's tests."""
    known = registry.families()
    return sorted(name for name, family in known.items()
                  if not any(other is not family and issubclass(family.config_class, other.config_class)
                             for other in known.values()))


FAMILIES = _architectures()


def smallest_config(model_type: str, tokenizer: BertTokenizer) -> Any:
    """The family's smallest preset (by parameters) cut to two layers, with this tokenizer's vocabulary
    and padding id."""
    names = list(registry.family(model_type).presets)
    configs = [registry.from_preset(name, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                                    num_hidden_layers=2) for name in names]
    return min(configs, key=lambda config: config.estimated_parameter_count())


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("every-family-data")
    (root / "corpus.txt").write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    conll, squad, swag = root / "conll", root / "squad", root / "swag"
    for directory in (conll, squad, swag):
        directory.mkdir()
    for name in ("eng.train", "eng.testa", "eng.testb"):
        shutil.copy(TASKS / "conll" / "with_docstart.txt", conll / name)
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        shutil.copy(TASKS / "squad" / "v2.json", squad / name)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        shutil.copy(TASKS / "swag" / "sample.jsonl", swag / name)
    return {"root": root, "corpus": root / "corpus.txt", "conll": conll, "squad": squad, "swag": swag}


@pytest.fixture(scope="module", params=FAMILIES)
def encoder(request: pytest.FixtureRequest, data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight bare encoder of the family, saved with a WordPiece tokenizer."""
    model_type = request.param
    tokenizer = BertTokenizer.train([data["corpus"]], vocab_size=200, min_frequency=1, show_progress=False)
    config = smallest_config(model_type, tokenizer)
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp(f"family-{model_type}") / "encoder"
    registry.model_class(model_type, "embeddings")(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _tune(family: str, task: str | None, encoder: Path, data_dir: Path | None, out: Path, **settings: Any) -> Path:
    results = finetune(family, task, encoder, data_dir, out, **QUIET, **settings)
    assert results["seeds"][0]["metrics"], results
    return out / "seed-1"


@pytest.mark.slow
def test_every_task_family_fine_tunes_and_predicts(encoder: Path, data: dict[str, Path], tmp_path: Path) -> None:
    from bertforge import pipeline

    sst2 = _tune("glue", "SST-2", encoder, TASKS / "glue", tmp_path / "sst2", max_length=24)
    done = predict("glue", "SST-2", sst2, TASKS / "glue", tmp_path / "sst2-test")
    assert done["test"]["examples"] > 0
    assert set(pipeline(sst2)("a gripping film")) >= {"label", "score"}

    ner = _tune("ner", "conll2003", encoder, data["conll"], tmp_path / "ner", max_length=12)
    assert isinstance(pipeline(ner)("Anna Smith met Bob in Rome ."), list)  # its entities

    squad = _tune("squad", "v1.1", encoder, data["squad"], tmp_path / "squad", max_length=48,
                  task_settings={"doc_stride": 8})
    answer = pipeline(squad)({"question": "What is the largest city?", "context": CORPUS[1]})
    assert "answer" in answer

    swag = _tune("swag", "swag", encoder, data["swag"], tmp_path / "swag", max_length=24)
    row = json.loads((TASKS / "swag" / "sample.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert "choice" in pipeline(swag)({"context": row["sent1"], "start": row["sent2"],
                                       "endings": [row[f"ending{i}"] for i in range(4)]})

    reviews = FIXTURES / "classify"
    _tune("classify", None, encoder, None, tmp_path / "classify", max_length=24,
          task_settings={"train": str(reviews / "reviews.csv"), "dev": str(reviews / "reviews-dev.csv")})
    tagged = tmp_path / "tagged.txt"
    shutil.copy(TASKS / "conll" / "without_docstart.txt", tagged)
    _tune("tag", "tag", encoder, None, tmp_path / "tag", max_length=12,
          task_settings={"train": str(tagged), "dev": str(tagged)})
    _tune("qa", "qa", encoder, None, tmp_path / "qa", max_length=48,
          task_settings={"train": str(TASKS / "squad" / "v2.json"), "dev": str(TASKS / "squad" / "v2.json"),
                         "doc_stride": 8})


@pytest.mark.slow
def test_serve_precision_export_features_and_attention(encoder: Path, tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.features import FeatureExtractor
    from bertforge.model import load_any

    classifier = _tune("glue", "SST-2", encoder, TASKS / "glue", tmp_path / "sst2", max_length=24)
    fp32 = pipeline(classifier)("a gripping film")
    for precision in ("bf16", "int8"):
        lower = pipeline(classifier, precision=precision)
        assert lower.precision == precision and lower("a gripping film")["label"] in ("negative", "positive")
    assert fp32["label"] in ("negative", "positive")

    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    model, _ = load_any(classifier)
    with TestClient(create_app(classifier)) as client:
        health = client.get("/health").json()
        assert health["family"] == model.config.model_type
        assert client.post("/classify", json={"text": "a gripping film"}).json()["label"] == fp32["label"]
        attention = client.post("/attention", json={"text": "a gripping film", "layer": 0, "head": 0})
        assert attention.status_code == (200 if model.supports_attention_maps else 400)

    vectors = list(FeatureExtractor.from_pretrained(encoder, strategy="last").extract(["a gripping film", "dull"]))
    assert len(vectors) == 2

    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    from bertforge.export import export_onnx

    result = export_onnx(classifier, tmp_path / "model.onnx")
    assert result.max_abs_diff is not None and result.max_abs_diff < 1e-4
