"""experiments/pretrain_vs_scratch.py names a committed recipe only when it matches what the run recorded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bertforge.pretrain import load_recipe, model_config
from experiments.pretrain_vs_scratch import (
    fewer_examples_table,
    int_list,
    majority_share,
    recipe_differences,
    verdict,
)

RECIPE = """model:
  preset: mini
  vocab_size: 1000
data:
  batch_size: 32
optim:
  lr: 1.0e-3
  warmup_steps: 300
train:
  max_steps: 7500
"""


def recorded_settings(recipe_file: Path) -> dict[str, Any]:
    """What `bertforge pretrain` writes to run_config.yaml for this recipe (the parts compared)."""
    recipe = load_recipe(recipe_file)
    settings = recipe.to_dict()
    settings["model"] = model_config(recipe, {"vocab_size": 1000, "pad_id": 0}, 64).to_dict()
    return settings


def test_the_run_s_own_recipe_matches_and_a_changed_one_is_named(tmp_path: Path) -> None:
    original = tmp_path / "run.yaml"
    original.write_text(RECIPE)
    run_config = recorded_settings(original)
    assert recipe_differences(original, run_config) == []
    quiet = {**run_config, "train": {**run_config["train"], "progress": False}}  # `pretrain --quiet`
    assert recipe_differences(original, quiet) == []

    edited = tmp_path / "edited.yaml"
    edited.write_text(RECIPE.replace("lr: 1.0e-3", "lr: 5.0e-4").replace("preset: mini", "preset: mini\n  num_hidden_layers: 2"))
    assert recipe_differences(edited, run_config) == ["optim.lr", "model.num_hidden_layers"]

    other_vocabulary = tmp_path / "vocab.yaml"
    other_vocabulary.write_text(RECIPE.replace("vocab_size: 1000", "vocab_size: 2000"))
    assert recipe_differences(other_vocabulary, run_config)[0].startswith("model (the recipe's vocab_size 2000")


def sst2_payload(ours: list[float], scratch: list[float]) -> dict[str, Any]:
    """A payload as the benchmark saves it: per-seed accuracies from each start, one evaluation row."""
    def summary(values: list[float]) -> dict[str, Any]:
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        return {"accuracy": {"mean": mean, "std": std, "values": values}}
    return {"sst2": {"pre-trained (ours)": summary(ours), "random initialisation": summary(scratch)},
            "recipe": {"dataset_options": {"objective": "sop"}},
            "held_out": [{"step": 100, "mlm_accuracy": 0.40, "sop_accuracy": 0.6}]}


def test_the_verdict_needs_a_lead_beyond_the_spread_over_seeds() -> None:
    clear = verdict(sst2_payload([0.80, 0.81, 0.79], [0.76, 0.77, 0.765]))
    assert clear.startswith("**Pre-training helps**") and "3 of 3 seeds above" in clear

    inside_the_noise = verdict(sst2_payload([0.775, 0.765, 0.772], [0.768, 0.772, 0.765]))
    assert "does not help measurably" in inside_the_noise and "points above" in inside_the_noise
    assert "2 of 3 seeds above" in inside_the_noise

    tie = verdict(sst2_payload([0.770, 0.773, 0.763], [0.768, 0.772, 0.765]))
    assert "same mean accuracy" in tie

    behind = verdict(sst2_payload([0.70, 0.71, 0.69], [0.768, 0.772, 0.765]))
    assert "At this budget pre-training does not help" in behind and "SOP accuracy 60.0%" in behind


def test_smaller_training_sets_are_tabulated_and_a_random_start_stuck_at_chance_is_flagged(tmp_path: Path) -> None:
    payload = sst2_payload([0.774, 0.78, 0.781], [0.768, 0.772, 0.765])
    assert fewer_examples_table(payload) == []  # only the headline size: no extra table

    glue = tmp_path / "SST-2"
    glue.mkdir()
    (glue / "dev.tsv").write_text("sentence\tlabel\n" + "good film\t1\n" * 3 + "dull\t0\n" * 2)
    payload["majority_share"] = majority_share(tmp_path)
    assert payload["majority_share"] == 0.6
    payload["fewer_examples"] = [
        {"train_examples": 2000, "sst2": sst2_payload([0.70, 0.71, 0.69], [0.66, 0.67, 0.65])["sst2"]},
        {"train_examples": 1000, "sst2": sst2_payload([0.65, 0.66, 0.64], [0.60, 0.61, 0.63])["sst2"]},
    ]
    lines = "\n".join(fewer_examples_table(payload))
    assert "60.0% of dev is the majority class" in lines
    learned = next(line for line in lines.splitlines() if line.startswith("| 2000 |"))
    assert "+4.0" in learned and "3 of 3" in learned and learned.endswith("| 3 of 3 | 0 of 3 |")
    stuck = next(line for line in lines.splitlines() if line.startswith("| 1000 |"))
    assert "+3.7" in stuck and stuck.endswith("| 3 of 3 | 2 of 3 |")  # 63% is 3 points above chance


def test_size_and_seed_lists_name_the_bad_item() -> None:
    assert int_list(1)("6000,2000,1000") == [6000, 2000, 1000]
    assert int_list(0)("0,1") == [0, 1]
    with pytest.raises(argparse.ArgumentTypeError, match="'abc' in '6000,abc' is not a whole number >= 1"):
        int_list(1)("6000,abc")
    with pytest.raises(argparse.ArgumentTypeError, match="'0' in '6000,0'"):
        int_list(1)("6000,0")
