"""`bertforge search`: the paper's grid over fine-tuning settings, its choice, its resumption and its
hold-out split; and the default learning rate, which scales with the model's width.

Fixtures are generated: short reviews whose label is carried by one sentiment word among filler words
(a task a one-layer encoder learns in a few dozen steps at a fitting learning rate), as CSV files, and
a random one-layer encoder (H=32) with a WordPiece vocabulary trained on those words.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.finetune import FinetuneRecipe, build_recipe, finetune, split_holdout
from bertforge.search import MODEL_LINK, SEARCH_JSON, SEARCH_MD, Configuration, grid, search
from bertforge.tasks import FAMILIES, make_task
from bertforge.tasks.base import MAX_LR_SCALE, REFERENCE_HIDDEN_SIZE

GOOD = ["good", "great", "fine", "nice"]
BAD = ["bad", "awful", "poor", "dull"]
FILLER = ["the", "film", "was", "a", "story", "plot", "acting", "and", "it", "very", "quite", "this"]
HIDDEN = 32
GOOD_LR, FLAT_LR = 3e-3, 1e-7  # a rate that learns the fixture in a few steps, and one that cannot move it


def _reviews(count: int, seed: int) -> list[dict[str, str]]:
    """`count` reviews, half positive: two to five filler words and one sentiment word somewhere among them."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        positive = i % 2 == 0
        words = rng.choices(FILLER, k=rng.randint(2, 5))
        words.insert(rng.randint(0, len(words)), rng.choice(GOOD if positive else BAD))
        rows.append({"text": " ".join(words), "label": "positive" if positive else "negative"})
    return rows


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["text", "label"])
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("reviews")
    return {"train": _write(root / "train.csv", _reviews(48, 1)), "dev": _write(root / "dev.csv", _reviews(40, 2)),
            "big": _write(root / "big.csv", _reviews(320, 3))}


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random one-layer encoder of width 32, saved like a pre-trained checkpoint (pooler included)."""
    # a vocabulary written out, not trained: one whole piece per word
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *GOOD, *BAD, *FILLER]
    tokenizer = BertTokenizer({word: i for i, word in enumerate(words)})
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=HIDDEN, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    directory = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def pretrained_dir(encoder_dir: Path, files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The narrow encoder with features a fresh head can read, as pre-training gives a real one: fine-tuned
    at a high rate on other reviews of the same kind, then saved without its head."""
    root = tmp_path_factory.mktemp("pretrained")
    other = _write(root / "other.csv", _reviews(320, 5))
    finetune("classify", None, encoder_dir, None, root / "run", lr=GOOD_LR, save_best=False,
             task_settings={"train": str(other), "dev": str(files["dev"])}, progress=False, verbose=False)
    BertModel.from_pretrained(root / "run" / "seed-1").save_pretrained(
        root / "encoder", tokenizer=BertTokenizer.from_pretrained(encoder_dir))
    return root / "encoder"


def _recipe(encoder_dir: Path, files: dict[str, Path], **settings: Any) -> FinetuneRecipe:
    options = {"model": str(encoder_dir), "train": str(files["train"]), "dev": str(files["dev"]), "max_length": 16,
               "save_best": False, **settings}
    return build_recipe("classify", None, options)


def _counting_train(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the training loops started in this process (finetune imports `train` when it runs)."""
    import bertforge.train as train_module

    started: list[str] = []
    original = train_module.train

    def counted(model: Any, batches: Any, run_dir: Path, *args: Any, **kwargs: Any) -> Any:
        started.append(str(Path(run_dir).parent.relative_to(Path(run_dir).parents[2])))
        return original(model, batches, run_dir, *args, **kwargs)

    monkeypatch.setattr(train_module, "train", counted)
    return started


# ------------------------------------------------------------------------------------------------
# the grid and the choice
# ------------------------------------------------------------------------------------------------
def test_the_grid_is_the_papers_by_default() -> None:
    configurations = grid()
    assert len(configurations) == 4 * 2 * 3 and configurations[0] == Configuration(5e-5, 16, 2.0)
    assert {c.lr for c in configurations} == {5e-5, 4e-5, 3e-5, 2e-5}
    assert {c.batch_size for c in configurations} == {16, 32} and {c.epochs for c in configurations} == {2, 3, 4}
    assert configurations[0].name == "lr5e-05-bs16-ep2"
    assert grid([1e-4, 1e-4], [8], [1]) == [Configuration(1e-4, 8, 1.0)]
    for bad in (([], [8], [1]), ([0.0], [8], [1]), ([1e-4], [8.5], [1])):
        with pytest.raises(ValueError):
            grid(*bad)


@pytest.mark.slow
def test_the_command_chooses_the_configuration_that_learns(pretrained_dir: Path, files: dict[str, Path],
                                                            tmp_path: Path) -> None:
    out = tmp_path / "search"
    result = CliRunner().invoke(app, [
        "search", "classify", "--model", str(pretrained_dir), "--train", str(files["train"]), "--dev", str(files["dev"]),
        "--max-length", "16", "--lr", f"{FLAT_LR},{GOOD_LR}", "--batch-size", "8", "--epochs", "2",
        "--seeds", "1,2", "--jobs", "1", "--no-save-best", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / SEARCH_JSON).read_text())
    flat, good = summary["configurations"]
    assert summary["metric"] == "macro_f1" and summary["seeds"] == [1, 2]
    # the flat rate leaves each seed's random head as it started: right or wrong by luck
    assert good["mean"] > 0.9 and flat["mean"] < good["mean"] - 0.2, (flat, good)
    chosen = summary["chosen"]
    assert chosen["name"] == good["name"] == Configuration(GOOD_LR, 8, 2).name
    assert chosen["values"] == good["values"] and len(chosen["values"]) == 2
    assert chosen["best_seed"] == [1, 2][max(range(2), key=good["values"].__getitem__)]
    assert chosen["mean"] == pytest.approx(sum(good["values"]) / 2)

    # the search's model is the chosen configuration's best seed, an ordinary fine-tuned directory
    model = out / MODEL_LINK
    assert model.resolve() == (out / chosen["model_dir"]).resolve()
    assert model.resolve() == (out / "configs" / good["name"] / f"seed-{chosen['best_seed']}").resolve()
    from bertforge import pipeline

    assert pipeline(str(model))(["the film was good", "it was awful"])[0]["label"] == "positive"
    table = (out / SEARCH_MD).read_text()
    assert "(chosen)" in table and f"| {GOOD_LR:g} | 8 | 2 |" in table and "(chosen)" in result.output
    assert "mean ± std over seeds 1, 2" in table


# ------------------------------------------------------------------------------------------------
# resuming
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_half_finished_search_resumes_without_training_finished_runs(
        pretrained_dir: Path, files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = _counting_train(monkeypatch)
    out = tmp_path / "search"
    first = Configuration(GOOD_LR, 16, 1)
    search(_recipe(pretrained_dir, files, seeds=[1]), out, lrs=[GOOD_LR], batch_sizes=[16], epochs=[1], jobs=1,
           verbose=False)
    assert started == [f"{first.name}/seed-1"]
    finished = out / "configs" / first.name / "seed-1"
    stamps = {p.name: p.stat().st_mtime_ns for p in finished.iterdir() if p.is_file()}

    # a bigger grid with another seed: only what is missing trains
    started.clear()
    summary = search(_recipe(pretrained_dir, files, seeds=[1, 2]), out, lrs=[GOOD_LR, 1e-3], batch_sizes=[16],
                     epochs=[1], jobs=1, verbose=False)
    second = Configuration(1e-3, 16, 1)
    assert sorted(started) == sorted([f"{first.name}/seed-2", f"{second.name}/seed-1", f"{second.name}/seed-2"])
    assert {p.name: p.stat().st_mtime_ns for p in finished.iterdir() if p.is_file()} == stamps
    assert [len(row["values"]) for row in summary["configurations"]] == [2, 2]

    # and once everything is done, nothing trains at all
    started.clear()
    again = search(_recipe(pretrained_dir, files, seeds=[1, 2]), out, lrs=[GOOD_LR, 1e-3], batch_sizes=[16],
                   epochs=[1], jobs=1, verbose=False)
    assert started == [] and again["configurations"] == summary["configurations"]


@pytest.mark.slow
def test_parallel_processes_give_the_same_scores(pretrained_dir: Path, files: dict[str, Path], tmp_path: Path) -> None:
    recipe = _recipe(pretrained_dir, files, seeds=[1])
    kwargs: dict[str, Any] = {"lrs": [GOOD_LR, 1e-3], "batch_sizes": [16], "epochs": [1], "verbose": False}
    alone = search(recipe, tmp_path / "one", jobs=1, **kwargs)
    together = search(recipe, tmp_path / "two", jobs=2, **kwargs)
    assert together["jobs"] == 2
    assert [row["values"] for row in together["configurations"]] == [row["values"] for row in alone["configurations"]]
    assert together["chosen"]["name"] == alone["chosen"]["name"]


def test_a_failing_configuration_does_not_stop_the_others(pretrained_dir: Path, files: dict[str, Path],
                                                          tmp_path: Path) -> None:
    from bertforge.search import SearchError

    out = tmp_path / "search"
    # a batch-size-16 run already holds this directory with other settings: that configuration is refused
    finetune(_recipe(pretrained_dir, files, seeds=[1], lr=GOOD_LR, batch_size=16, epochs=1, max_length=12),
             out_dir=out / "configs" / Configuration(GOOD_LR, 16, 1).name, progress=False, verbose=False)
    with pytest.raises(SearchError, match="1 of 2 configuration"):
        search(_recipe(pretrained_dir, files, seeds=[1]), out, lrs=[GOOD_LR], batch_sizes=[8, 16], epochs=[1], jobs=1,
               verbose=False)
    summary = json.loads((out / SEARCH_JSON).read_text())
    assert "error" in summary["configurations"][1] and summary["chosen"]["batch_size"] == 8


# ------------------------------------------------------------------------------------------------
# the hold-out split
# ------------------------------------------------------------------------------------------------
def test_the_holdout_is_disjoint_from_training_and_the_same_for_every_configuration(
        pretrained_dir: Path, files: dict[str, Path], tmp_path: Path) -> None:
    spec = make_task("classify", None, {"train": str(files["train"])})
    examples = spec.read(None, "train")
    kept, held = split_holdout(examples, 8)
    assert len(held) == 8 and len(kept) == len(examples) - 8
    assert not {e.row for e in held} & {e.row for e in kept} and {e.row for e in held} | {e.row for e in kept} == {
        e.row for e in examples}
    assert [e.row for e in split_holdout(examples, 8)[1]] == [e.row for e in held]  # fixed, not drawn anew
    assert len(split_holdout(examples, 0.25)[1]) == 12 and split_holdout(examples, 0)[1] == []
    with pytest.raises(ValueError):
        split_holdout(examples, len(examples))

    out = tmp_path / "search"
    summary = search(_recipe(pretrained_dir, files, seeds=[1], holdout=8), out, lrs=[GOOD_LR, 1e-3], batch_sizes=[8, 16],
                     epochs=[1], jobs=1, verbose=False)
    held_rows = {e.row for e in held}
    for row in summary["configurations"]:
        results = json.loads((out / row["dir"] / "results.json").read_text())
        assert results["train_examples"] == len(examples) - 8 and results["eval_examples"]["holdout"] == 8
        predicted = [json.loads(line) for line in (out / row["dir"] / "seed-1" / "predictions-holdout.jsonl")
                     .read_text().splitlines()]
        assert {p["row"] for p in predicted} == held_rows  # the same examples for every configuration
        assert set(row["holdout"]) == {"accuracy", "macro_f1", "micro_f1"}
    chosen = summary["chosen"]
    assert chosen["holdout"]["macro_f1"]["values"] and "Hold-out macro_f1 of the chosen" in (out / SEARCH_MD).read_text()
    # the dev metrics keep their names beside the hold-out's
    assert {"accuracy", "holdout_accuracy"} <= set(
        json.loads((out / chosen["dir"] / "results.json").read_text())["summary"])


# ------------------------------------------------------------------------------------------------
# the default learning rate
# ------------------------------------------------------------------------------------------------
def test_the_default_learning_rate_scales_with_width_and_keeps_the_papers_at_base() -> None:
    for name in FAMILIES:
        family = FAMILIES[name]
        for width in (None, REFERENCE_HIDDEN_SIZE, 1024):  # BERT-base and BERT-large: the paper's rates
            assert family.learning_rate_for(width) == family.default_lr
        assert family.learning_rate_for(384) == pytest.approx(2 * family.default_lr)  # all-MiniLM-L6-v2
        assert family.learning_rate_for(128) == pytest.approx(6 * family.default_lr)  # BERT-tiny
        assert family.learning_rate_for(8) == pytest.approx(MAX_LR_SCALE * family.default_lr)
    for task in ("SST-2", "MRPC", "RTE"):
        spec = make_task("glue", task, {})
        assert build_recipe("glue", None, {"task": task}).resolved(spec, 768).optim.lr == 2e-5
        assert build_recipe("glue", None, {"task": task, "lr": 3e-5}).resolved(spec, 384).optim.lr == 3e-5


@pytest.mark.slow
def test_default_settings_learn_a_small_file_where_the_papers_rate_does_not(
        pretrained_dir: Path, files: dict[str, Path], tmp_path: Path) -> None:
    """320 rows at batch 32 for 3 epochs: 30 steps (the step floor off, to compare the rates alone). At the
    paper's 2e-5 the narrow model hardly moves from its start (a fresh random head: right or wrong by luck,
    per seed); the default for its width (2e-5 x 16) learns the task."""
    task = {"train": str(files["big"]), "dev": str(files["dev"])}
    default = finetune("classify", None, pretrained_dir, None, tmp_path / "default", seeds=(1, 2, 3),
                       save_best=False, min_steps=0, task_settings=task, progress=False, verbose=False)
    old = finetune("classify", None, pretrained_dir, None, tmp_path / "old", lr=2e-5, seeds=(1, 2, 3),
                   save_best=False, min_steps=0, task_settings=task, progress=False, verbose=False)
    scale = min(REFERENCE_HIDDEN_SIZE / HIDDEN, MAX_LR_SCALE)
    assert default["hyperparameters"]["lr"] == pytest.approx(2e-5 * scale)
    assert default["train_features"] == 320 and default["seeds"][0]["steps"] == 30
    assert default["hyperparameters"]["batch_size"] == 32
    assert default["summary"]["accuracy"]["mean"] >= 0.9, default["summary"]
    start = finetune("classify", None, pretrained_dir, None, tmp_path / "start", lr=1e-9, seeds=(1, 2, 3),
                     save_best=False, min_steps=0, task_settings=task, progress=False, verbose=False)
    assert old["summary"]["accuracy"]["mean"] == pytest.approx(start["summary"]["accuracy"]["mean"], abs=0.1)
    assert old["summary"]["accuracy"]["mean"] < default["summary"]["accuracy"]["mean"] - 0.2


def test_search_layout_names_are_stable() -> None:
    assert (MODEL_LINK, SEARCH_JSON, SEARCH_MD) == ("model", "search.json", "search.md")
    assert os.sep not in Configuration(1e-4, 8, 2.5).name and Configuration(1e-4, 8, 2.5).name == "lr0.0001-bs8-ep2.5"


# ------------------------------------------------------------------------------------------------
# disk
# ------------------------------------------------------------------------------------------------
def test_a_search_whose_models_will_not_fit_warns_before_training(encoder_dir: Path, files: dict[str, Path],
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    import warnings

    from safetensors import safe_open

    import bertforge.search as search_module

    with safe_open(str(encoder_dir / "model.safetensors"), "pt") as weights:
        float32_bytes = sum(4 * math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118 (a safe_open handle is not iterable)
    assert search_module.saved_model_bytes(encoder_dir) == float32_bytes > 0
    usage = shutil.disk_usage(tmp_path)
    # room for 7 models: 2 configurations x 2 seeds x (final + best/) is 8, without best/ copies 4
    monkeypatch.setattr(search_module.shutil, "disk_usage", lambda path: usage._replace(free=7 * float32_bytes))
    with pytest.warns(search_module.DiskSpaceWarning, match=r"2 configuration\(s\) still to run .*--no-save-best"):
        search_module.warn_if_short_of_disk(_recipe(encoder_dir, files, seeds=[1, 2], save_best=True), 2, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        search_module.warn_if_short_of_disk(_recipe(encoder_dir, files, seeds=[1, 2]), 2, tmp_path)  # no best/

