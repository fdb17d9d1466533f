"""The README's main job, on the smoke budget: the same code path as `bertforge quickstart`, smaller."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter

import pytest
import transformers
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.quickstart import BUDGETS, CURVES, STAGES, curve_steps, sst2_sample


@pytest.mark.slow
def test_quickstart_smoke_end_to_end_and_reuse(tmp_path) -> None:
    run = tmp_path / "qs"
    result = CliRunner().invoke(app, ["quickstart", "--out", str(run), "--budget", "smoke"])
    assert result.exit_code == 0, result.output
    report = (run / "report.md").read_text()
    for heading in ("WordPiece vocabulary", "Pre-training data", "Held-out", "Does the model use word order?",
                    "Fill-mask", "Fine-tuning on SST-2", "accuracy against labelled sentences"):
        assert heading in report
    assert (run / "pretrain_curves.png").stat().st_size > 1000
    assert (run / "learning_curve.png").stat().st_size > 1000
    assert "![SST-2 dev accuracy against labelled sentences](learning_curve.png)" in report

    evaluation = json.loads((run / "stages" / "pretrain_eval.json").read_text())
    assert evaluation["validation_sequences"] > 0
    assert 0.0 < evaluation["validation"]["mlm_accuracy"] < 1.0  # trained on something, scored on held-out data
    assert 0.0 <= evaluation["validation"]["sop_accuracy"] <= 1.0
    probe = evaluation["context_probe"]
    assert probe["scored pieces"] > 0
    for variant in ("context intact", "shuffled order", "no context"):
        assert 0.0 <= probe[variant] <= 100.0
        assert f"{probe[variant]:.1f} |" in report
    # the probe's "as it is" is the evaluation's MLM accuracy: the same pieces, the same model
    assert abs(probe["context intact"] - 100 * evaluation["validation"]["mlm_accuracy"]) < 0.01

    # the learning curve: every start at its sizes, one score per seed, on the same sentences at a size
    budget = BUDGETS["smoke"]
    subsets = {s["size"]: s for s in read_stage(run, "subsamples")["subsets"]}
    curves = {stage: read_stage(run, stage) for stage in CURVES}
    minilm_sizes = [n for n in budget.curve_sizes if n <= budget.minilm_max_size]
    for stage in ("curve_taught", "curve_pretrained", "curve_random"):
        assert [p["size"] for p in curves[stage]["points"]] == list(budget.curve_sizes)
        assert curves[stage]["pooling"] == budget.finetune_pooling
    assert [p["size"] for p in curves["curve_minilm"]["points"]] == minilm_sizes
    assert [p["size"] for p in curves["curve_minilm_adapted"]["points"]] == minilm_sizes
    minilm_curves = (curves["curve_minilm"], curves["curve_minilm_adapted"])
    for record in curves.values():
        for point in record["points"]:
            assert len(point["accuracies"]) == len(budget.curve_seeds)
            assert all(0.0 <= a <= 1.0 for a in point["accuracies"])
            assert point["data"] == subsets[point["size"]]["data"]  # the same sentences for every start
            cap = budget.minilm_max_steps if record in minilm_curves else budget.curve_max_steps
            assert point["steps"] == min(curve_steps(point["sentences"], budget), cap)
            assert f"{point['mean']:.3f} ({min(point['accuracies']):.3f} - {max(point['accuracies']):.3f})" in report
    assert curves["curve_random"]["lr"] == curves["curve_pretrained"]["lr"] == curves["curve_taught"]["lr"]
    assert "random-init" in curves["curve_random"]["model"]
    for size in budget.curve_sizes:
        assert f"| {size:,} ({subsets[size]['positive']:,} positive) |" in report  # the table's rows
    assert "not run (cost)" in report  # MiniLM stops below the largest size
    assert "A gap counts here only when every seed of one start scores above every seed of the other" in report
    assert "all-MiniLM-L6-v2, pre-trained at scale, scores" in report

    # the pre-trained model taught MiniLM's sentence vectors of the bundled in-domain text, some held out
    taught = read_stage(run, "teach")
    assert taught["steps"] == budget.teach_steps and curves["curve_taught"]["model"] == taught["final"]
    assert taught["texts"]["train"] + taught["texts"]["heldout"] == budget.teach_texts
    assert taught["texts"]["heldout"] == budget.teach_texts // 5  # the smoke budget's texts are few: a fifth
    assert -1.0 <= taught["cosine_before"] <= 1.0 and -1.0 <= taught["cosine_after"] <= 1.0
    assert f"its vectors' cosine with MiniLM's went from\n{taught['cosine_before']:.3f}" in report
    assert transformers.AutoModel.from_pretrained(taught["final"]).config.hidden_size == 128

    # MiniLM adapted to the training sentences' text: its new masked-LM head, scored before and after
    adapted = read_stage(run, "adapt_minilm")
    assert adapted["head_steps"] + adapted["steps"] == budget.adapt_steps and adapted["sentences"] == 4000
    assert any(head.startswith("mlm.") for head in adapted["new_heads"]), adapted["new_heads"]
    assert 0.0 <= adapted["after"]["mlm_accuracy"] <= 1.0
    assert curves["curve_minilm_adapted"]["model"] == adapted["final"]
    assert f"Adapted here: all-MiniLM-L6-v2 continued with masked LM for {budget.adapt_steps} steps" in report
    # the nested sub-samples, as fine-tuning read them
    train_sets = [Counter(sentences(subsets[n]["data"])) for n in sorted(budget.curve_sizes)]
    assert [s.total() for s in train_sets] == sorted(budget.curve_sizes)
    assert all(small < large for small, large in zip(train_sets, train_sets[1:], strict=False))  # (rows repeat)

    # The pre-trained model is a Hugging Face checkpoint with its vocabulary.
    final = run / "pretrain" / "final"
    model, info = transformers.BertForPreTraining.from_pretrained(final, output_loading_info=True)
    assert not info["missing_keys"]
    assert transformers.BertTokenizerFast.from_pretrained(final).vocab_size == evaluation_vocab(run)

    again = CliRunner().invoke(app, ["quickstart", "--out", str(run), "--budget", "smoke"])
    assert again.exit_code == 0 and again.output.count("reused") == len(STAGES)


def read_stage(run, name: str) -> dict:
    return json.loads((run / "stages" / f"{name}.json").read_text())


def sentences(data_dir) -> list[str]:
    """The rows of a GLUE SST-2 folder's train.tsv, header left out."""
    from pathlib import Path

    return (Path(data_dir) / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]


def evaluation_vocab(run) -> int:
    return json.loads((run / "stages" / "tokenizer.json").read_text())["vocab_size"]


def test_full_budget_subsamples_are_nested_and_fixed(tmp_path) -> None:
    """The full budget's sizes: each set inside the next, in the bundled file's order, the same on a rerun."""
    from bertforge.quickstart import stage_subsamples

    budget = BUDGETS["full"]
    record = stage_subsamples(tmp_path, budget, print)
    bundled = sentences(sst2_sample().parent)
    sets = [sentences(s["data"]) for s in record["subsets"]]
    assert [len(s) for s in sets] == list(budget.curve_sizes) and sets[-1] == bundled  # 4,000: all of them
    for small, large in zip(sets, sets[1:], strict=False):
        rows = iter(large)
        assert all(row in rows for row in small)  # a subsequence: inside the larger set, in the file's order
    assert record["subsets"][0]["positive"] == sum(row.endswith("\t1") for row in sets[0])
    assert 0.5 < record["dev_majority_accuracy"] < 0.52 and record["dev_sentences"] == 872
    again = stage_subsamples(tmp_path / "again", budget, print)
    assert [sentences(s["data"]) for s in again["subsets"]] == sets


def test_curve_steps_follow_the_budget() -> None:
    from bertforge.quickstart import epochs_for

    full = BUDGETS["full"]
    # 200 steps of 32 at every size: the random start needs about that many to leave the majority class
    assert [curve_steps(n, full) for n in full.curve_sizes] == [200, 200, 200, 200]
    assert curve_steps(100, dataclasses.replace(full, curve_min_steps=10)) == 12  # 3 epochs of 4 batches
    for size in range(1, 5000, 37):  # finetune runs ceil(batches per epoch x epochs) steps: exactly these
        for steps in (1, 7, 50, 94, 200, 333):
            assert math.ceil(math.ceil(size / 32) * epochs_for(steps, size)) == steps


def test_quickstart_rejects_unknown_stage_and_budget(tmp_path) -> None:
    runner = CliRunner()
    bad_stage = runner.invoke(app, ["quickstart", "--out", str(tmp_path), "--stage", "nope"])
    assert bad_stage.exit_code == 2 and "unknown stage" in bad_stage.output
    bad_budget = runner.invoke(app, ["quickstart", "--out", str(tmp_path), "--budget", "huge"])
    assert bad_budget.exit_code == 2 and "unknown budget" in bad_budget.output


def points(scores: dict[int, list[float]]) -> list[dict]:
    return [{"sentences": n, "accuracies": a, "mean": sum(a) / len(a)} for n, a in scores.items()]


def test_report_sentences_follow_the_numbers() -> None:
    from bertforge.quickstart import compare_starts, curve_paragraph, probe_sentence

    bag = {"context intact": 13.0, "shuffled order": 12.6, "no context": 9.0}
    assert "bag-of-words stage" in probe_sentence(bag)
    assert "from their neighbours" in probe_sentence(bag | {"context intact": 30.0})

    # a gap counts only when the seeds separate completely and the means differ by a point or more
    assert compare_starts([0.60, 0.61, 0.62], [0.55, 0.56, 0.59]) == "better"
    assert compare_starts([0.60, 0.61, 0.62], [0.55, 0.56, 0.605]) == "tie"  # overlapping seeds
    assert compare_starts([0.600, 0.601, 0.602], [0.595, 0.596, 0.597]) == "tie"  # separated, 0.5 points
    assert compare_starts([0.50, 0.51, 0.52], [0.55, 0.56, 0.57]) == "worse"

    ours = points({100: [0.60, 0.62, 0.61], 300: [0.66, 0.67, 0.65], 1000: [0.69, 0.70, 0.71],
                   4000: [0.71, 0.72, 0.70]})
    twin = points({100: [0.51, 0.52, 0.50], 300: [0.60, 0.61, 0.59], 1000: [0.70, 0.69, 0.72],
                   4000: [0.74, 0.75, 0.73]})
    minilm = points({100: [0.75, 0.74, 0.76]})
    small_only = curve_paragraph(ours, twin, minilm, majority=0.509, eval_examples=872)
    assert small_only.startswith("Pre-training helps only with few labelled sentences: at 100 and 300 sentences; "
                                 "from 1,000 on random weights catch up, then do better")
    assert "100: 0.610 (0.600 - 0.620) against 0.510 (0.500 - 0.520), +10.0 points" in small_only
    assert "4,000: 0.710 (0.700 - 0.720) against 0.740 (0.730 - 0.750), -3.0 points" in small_only
    assert "about 1.7 points" in small_only  # one score's binomial error on 872 sentences
    assert "+14.0 points from the better tiny start at 100" in small_only
    assert "already does as well as the tiny model does with 4,000" in small_only  # 0.750 >= 0.740

    never = curve_paragraph(points({100: [0.50, 0.51, 0.50], 300: [0.60, 0.62, 0.61], 4000: [0.70, 0.71, 0.70]}),
                            points({100: [0.51, 0.52, 0.51], 300: [0.61, 0.60, 0.63], 4000: [0.74, 0.75, 0.73]}),
                            [], majority=0.509, eval_examples=872)
    assert never.startswith("At this scale pre-training never helps: the two starts are within their seeds' "
                            "spread at 100 and 300 sentences; random weights do better at 4,000 sentences")
    assert "At 100 sentences neither tiny start gets clear of the majority class (0.509)" in never
    assert "all-MiniLM" not in never and "Masked LM alone at this budget never made a better start" in never

    everywhere = curve_paragraph(ours[:2], twin[:2], points({100: [0.55, 0.56, 0.57]}), majority=0.509,
                                 eval_examples=872)
    assert everywhere.startswith("Pre-training helps at every size here")
    assert "majority class" not in everywhere and "Masked LM alone" not in everywhere
    assert "stays below the 0.660 the tiny model reaches with 300" in everywhere
    at_chance = curve_paragraph(ours, twin, points({100: [0.50, 0.52, 0.51]}), majority=0.509, eval_examples=872)
    assert "with 100 sentences it does not get clear of the majority class either" in at_chance
    assert "lectures' claim" not in at_chance
