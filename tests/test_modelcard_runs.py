"""Model cards of every model directory bertforge makes, not only fine-tuned ones: pre-training's final/
(from scratch, and continued from a checkpoint), adaptation's final/ (the model adapted by its Hub name
and commit, held-out scores before and after) and distillation's students (the teacher named, the
student's start, its scores). Each card must load with huggingface_hub's ModelCard, carry the metadata
the Hub reads, and never show the folders of the machine it was made on.

The runs are a few steps of tiny models on the fixtures of tests/test_pretrain.py and tiny_models.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import ModelCard

from bertforge.modelcard import Base, local_name, model_card
from test_pretrain import shards  # noqa: F401  (the module's shards fixture)
from tiny_models import save_tiny_encoder

FAST = dict(batch_size=8, eval_batch_size=16, eval_max_batches=2, progress=False, log_every=2)
WORDS = "a gripping and moving film a dull and slow story the cast the ending was warm bland"


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine: threads cost more than they give
    yield
    torch.set_num_threads(threads)


def read_card(directory: Path, tmp_path: Path) -> tuple[Any, str]:
    """The card's metadata as huggingface_hub reads it, and its text; checks what every card holds."""
    path = directory / "README.md"
    assert path.is_file(), f"{directory}: no model card"
    card = ModelCard.load(path)
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and "bertforge" in data["tags"]
    text = path.read_text(encoding="utf-8")
    assert str(tmp_path) not in text  # no folder of this machine: a local start is named by its folder only
    return data, text


def hub_cache_copy(directory: Path, root: Path, repo_id: str, commit: str) -> Path:
    """`directory` copied where huggingface_hub's cache keeps a snapshot of `repo_id` at `commit`."""
    snapshot = root / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
    shutil.copytree(directory, snapshot)
    return snapshot


def metric_values(data: dict[str, Any]) -> dict[str, float]:
    return {m["type"]: m["value"] for m in data["model-index"][0]["results"][0]["metrics"]}


# ------------------------------------------------------------------------------------------------
# the card itself
# ------------------------------------------------------------------------------------------------
def test_a_start_is_named_by_its_hub_repository_or_its_folder(tmp_path: Path) -> None:
    snapshot = tmp_path / "hub" / "models--org--tiny-bert" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert Base.of(snapshot) == Base("org/tiny-bert", "org/tiny-bert", "abc123")
    assert Base.of("org/tiny-bert@v1") == Base("org/tiny-bert", "org/tiny-bert", "v1")
    assert Base.of(tmp_path) == Base(None, tmp_path.name, None)  # a local directory: its folder, no base_model
    assert local_name(tmp_path / "runs" / "sst2" / "seed-1") == "sst2/seed-1"
    assert local_name("runs/tiny/final") == "tiny/final"
    assert Base.of(None) == Base()


def test_held_out_scores_and_settings_in_a_valid_header(tmp_path: Path) -> None:
    directory = save_tiny_encoder(tmp_path, WORDS)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["BertForMaskedLM"]}))
    text = model_card(directory, kind="adapted", base_model="org/encoder", base_revision="c0ffee",
                      metrics={"mlm_loss": 2.0, "mlm_accuracy": 0.5, "nan_metric": float("nan")},
                      baseline={"mlm_loss": 3.0, "mlm_accuracy": 0.25}, data="reviews.txt",
                      settings={"lr": 1e-4, "inputs": [str(tmp_path / "reviews.txt")]})
    data = ModelCard(text).data.to_dict()
    assert data["pipeline_tag"] == "fill-mask" and data["base_model"] == "org/encoder"
    scores = metric_values(data)
    assert scores == {"mlm_accuracy": 0.5, "mlm_perplexity": pytest.approx(7.389, abs=1e-3)}  # losses stay in prose
    assert "| mlm_accuracy | 0.2500 | 0.5000 |" in text and "nan_metric" not in text
    assert "`org/encoder` at revision `c0ffee`" in text and str(tmp_path) not in text
    with pytest.raises(ValueError, match="kind"):
        model_card(directory, kind="baked")


# ------------------------------------------------------------------------------------------------
# pretrain
# ------------------------------------------------------------------------------------------------
def test_pretrain_cards_say_from_scratch_or_from_the_checkpoint(shards, tmp_path: Path) -> None:  # noqa: F811
    from bertforge.pretrain import pretrain

    data, tokenizer = shards
    settings = dict(tokenizer=str(tokenizer), max_position_embeddings=64, lr=1e-3, **FAST)
    scratch = pretrain("tiny", data, tmp_path / "scratch", max_steps=3, **settings)
    meta, text = read_card(scratch.final, tmp_path)
    assert meta["pipeline_tag"] == "fill-mask" and "base_model" not in meta
    assert "from scratch" in text and '"steps": 3' in text and '"mask_rate": 0.15' in text
    assert metric_values(meta)["mlm_accuracy"] == pytest.approx(scratch.train.metrics["mlm_accuracy"])
    assert f"held-out text of {data.name}" == meta["model-index"][0]["results"][0]["dataset"]["name"]

    start = hub_cache_copy(scratch.final, tmp_path / "hub", "org/tiny-bert", "abc123")
    continued = pretrain("tiny", data, tmp_path / "continued", max_steps=2, init_from=start, **settings)
    meta, text = read_card(continued.final, tmp_path)
    assert meta["base_model"] == "org/tiny-bert" and "continuing from `org/tiny-bert` at revision `abc123`" in text

    local = pretrain("tiny", data, tmp_path / "local", max_steps=2, init_from=scratch.final, **settings)
    meta, text = read_card(local.final, tmp_path)
    assert "base_model" not in meta and "continuing from `scratch/final`" in text


# ------------------------------------------------------------------------------------------------
# adapt
# ------------------------------------------------------------------------------------------------
def test_adapt_card_names_the_hub_model_and_its_scores_before_and_after(tmp_path: Path, monkeypatch) -> None:
    from bertforge import adapt as adapt_module
    from bertforge.hub import ResolvedModel

    encoder = save_tiny_encoder(tmp_path, WORDS, max_positions=64)
    snapshot = hub_cache_copy(encoder, tmp_path / "hub", "org/tiny-bert", "0123abcd")
    # `org/tiny-bert` as the Hub would resolve it: its cached snapshot, repository and commit
    monkeypatch.setattr(adapt_module, "resolve_local_or_hub", lambda spec: ResolvedModel(
        snapshot, "org/tiny-bert", None, "0123abcd") if spec == "org/tiny-bert" else ResolvedModel(Path(spec)))
    text_file = tmp_path / "reviews.txt"
    text_file.write_text("".join(f"{WORDS} {i % 7}\n" for i in range(160)), encoding="utf-8")
    result = adapt_module.adapt("org/tiny-bert", text_file, tmp_path / "run", max_steps=3, lr=1e-3, progress=False,
                                max_seq_length=32, batch_size=4, validation_fraction=0.2)
    meta, text = read_card(result.final, tmp_path)
    assert meta["base_model"] == "org/tiny-bert" and meta["pipeline_tag"] == "fill-mask"
    assert "`org/tiny-bert` at revision `0123abcd`" in text and "Adapted with `bertforge adapt`" in text
    assert metric_values(meta)["mlm_accuracy"] == pytest.approx(result.after["mlm_accuracy"])
    before, after = result.before["mlm_accuracy"], result.after["mlm_accuracy"]
    assert f"| mlm_accuracy | {before:.4f} | {after:.4f} |" in text and "| mlm_perplexity |" in text
    assert "reviews.txt" in text and '"steps": 3' in text


# ------------------------------------------------------------------------------------------------
# distill
# ------------------------------------------------------------------------------------------------
def test_task_distillation_cards_name_the_teacher_and_the_students_start(tmp_path: Path) -> None:
    from bertforge.distill import build_recipe, distill
    from bertforge.finetune import finetune

    encoder = save_tiny_encoder(tmp_path, WORDS, max_positions=64)
    rows = [("a gripping and moving film", "positive"), ("a dull and slow story", "negative")] * 12
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "".join(f"{t},{label}\n" for t, label in rows), encoding="utf-8")
    finetune("classify", None, encoder, None, tmp_path / "teacher", epochs=1, batch_size=8, max_length=16,
             task_settings={"train": str(train), "dev": str(train)}, progress=False, verbose=False)
    student = hub_cache_copy(encoder, tmp_path / "hub", "org/tiny-bert", "feed42")
    recipe = build_recipe("task", options={"teacher": str(tmp_path / "teacher" / "seed-1"), "student": str(student),
                                           "epochs": 1, "batch_size": 8, "progress": False})
    results = distill(recipe, tmp_path / "kd", verbose=False)
    for name in ("student", "final"):
        meta, text = read_card(tmp_path / "kd" / name, tmp_path)
        assert meta["pipeline_tag"] == "text-classification" and meta["base_model"] == "org/tiny-bert"
        assert "from the teacher `teacher/seed-1`" in text and "`org/tiny-bert` at revision `feed42`" in text
        assert "Distilled on classify" in text and "accuracy" in metric_values(meta)
    assert metric_values(read_card(tmp_path / "kd" / "final", tmp_path)[0])["accuracy"] == pytest.approx(
        results["final_metrics"]["accuracy"])


def test_general_distillation_card_has_the_validation_losses(shards, tmp_path: Path) -> None:  # noqa: F811
    from bertforge import BertConfig, BertTokenizer
    from bertforge.distill import build_recipe, distill
    from bertforge.model.registry import model_class

    data, tokenizer_dir = shards
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model_class("bert", "masked-lm")(config).save_pretrained(tmp_path / "teacher", tokenizer=tokenizer)
    recipe = build_recipe("general", options={
        "teacher": str(tmp_path / "teacher"), "student": "tiny", "data": str(data), "max_steps": 2, "batch_size": 8,
        "eval_max_batches": 1, "mlm_weight": 1.0, "relation_weight": 1.0, "progress": False})
    results = distill(recipe, tmp_path / "general", verbose=False)
    meta, text = read_card(tmp_path / "general" / "final", tmp_path)
    assert meta["pipeline_tag"] == "fill-mask" and "base_model" not in meta
    assert "from the teacher `teacher`" in text and "random weights in the shape of `tiny`" in text
    start, end = results["start_metrics"]["distill_loss"], results["final_metrics"]["distill_loss"]
    assert f"| distill_loss | {start:.4f} | {end:.4f} |" in text and '"mlm_weight": 1.0' in text
