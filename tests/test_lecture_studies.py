"""The four lecture studies' tables and verdicts come from their saved numbers (no training here).

experiments/pretraining_tasks.py, model_size.py, features_vs_finetuning.py and paper_search.py each
turn a results payload into a docs/results.md section; these payloads have the shape the studies save,
with numbers chosen so that each verdict has a clear answer to give.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments import features_vs_finetuning, model_size, paper_search, pretraining_tasks

MACHINE = {"date": "2026-01-01", "cpu": "test cpu", "cores": 2, "torch": "2", "transformers": "4", "python": "3"}


def score(mean: float, std: float = 0.5, metric: str = "accuracy") -> dict[str, Any]:
    return {"metric": metric, "mean": mean, "std": std, "values": [mean - std, mean + std], "wall_s": 1.0}


@pytest.fixture(autouse=True)
def plain_machine_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # the machine line's wording belongs to benchmarks.common; here only that a line is there
    for module in (pretraining_tasks, model_size, features_vs_finetuning, paper_search):
        monkeypatch.setattr(module, "machine_line", lambda machine: f"machine: {machine['cpu']}")


def test_pretraining_tasks_verdict_finds_mlm_over_ltr() -> None:
    tasks = ["SST-2", "MRPC"]
    means = {"MLM + NSP": 80.0, "No NSP (MLM only)": 79.8, "LTR & No NSP": 70.0, "LTR & No NSP + BiLSTM": 72.0,
             pretraining_tasks.RANDOM: 60.0}
    run = {"steps": 100, "wall_s": 60.0, "parameters": 4_000_000,
           "curve": [{"step": 100, "minutes": 1.0, "mlm_accuracy": 0.2}]}
    payload = {"machine": MACHINE, "smoke": False, "steps": 100, "preset": "mini", "max_seq_length": 128,
               "seeds": [1, 2], "lr": 3e-4, "tasks": tasks, "train_examples": {"SST-2": 6000, "MRPC": None},
               "runs": {label: run for label in pretraining_tasks.OBJECTIVES},
               "finetune": {label: {t: score(m) for t in tasks} for label, m in means.items()}}
    text = pretraining_tasks.render(payload)
    assert "beat the left-to-right one beyond the seed spread on SST-2, MRPC" in text
    assert "NSP's effect is within the seed spread" in text
    assert "| LTR & No NSP + BiLSTM | 82.1 | 84.1 | 75.7 | 91.6 | 84.9 |" in text  # the paper's row


def test_a_resumed_pretraining_counts_only_its_training_time() -> None:
    """A run stopped after step 200 (its checkpoint at 100) and resumed an hour later: the hour is not
    training, and the step evaluated twice keeps its later figures."""
    rows = [{"step": 1, "split": "run", "time": 1000.0}, {"step": 100, "split": "eval", "time": 1100.0, "loss": 5.0},
            {"step": 200, "split": "eval", "time": 1200.0, "loss": 4.0},
            {"step": 101, "split": "run", "time": 4800.0}, {"step": 200, "split": "eval", "time": 4900.0, "loss": 3.9},
            {"step": 300, "split": "eval", "time": 5000.0, "loss": 3.5}]
    assert pretraining_tasks.training_clock(rows) == [0.0, 100.0, 200.0, 200.0, 300.0, 400.0]


def test_a_resumed_pretraining_curve_has_each_step_once(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"step": 1, "split": "run", "time": 0.0}, {"step": 100, "split": "eval", "time": 60.0, "loss": 5.0},
            {"step": 101, "split": "run", "time": 900.0}, {"step": 100, "split": "eval", "time": 960.0, "loss": 4.8}]
    monkeypatch.setattr(pretraining_tasks, "records", lambda run: rows)
    assert pretraining_tasks.curve(tmp_path) == [{"step": 100, "minutes": 2.0, "loss": 4.8}]
    assert pretraining_tasks.training_seconds(tmp_path) == 120.0


def test_model_size_verdict_reads_the_trend() -> None:
    sizes = ["tiny", "mini"]
    runs = {s: {"steps": 10, "wall_s": w, "parameters": p, "curve": [{"mlm_loss": loss}],
                "recipe": {"data": {"batch_size": 32}, "optim": {"lr": lr}}}
            for s, w, p, loss, lr in (("tiny", 10.0, 500_000, 5.0, 2e-3), ("mini", 30.0, 4_000_000, 4.0, 1e-3))}
    payload = {"machine": MACHINE, "smoke": False, "sizes": sizes, "steps": 10, "max_seq_length": 128, "seeds": [1, 2],
               "lr": 3e-4, "pretrain_lr_rule": "width", "train_examples": {"SST-2": 6000, "MRPC": None},
               "shapes": {"tiny": "L=2, H=128, A=2", "mini": "L=4, H=256, A=4"}, "runs": runs,
               "finetune": {"tiny": {"SST-2": score(70.0), "MRPC": score(75.0, metric="f1")},
                            "mini": {"SST-2": score(75.0), "MRPC": score(75.2, metric="f1")}}}
    text = model_size.render(payload)
    assert "148.4 -> 54.6" in text and "falling at every step up, as in the paper" in text
    assert "SST-2 70.0 -> 75.0 (1 of 1 steps up beyond the seed spread)" in text
    assert "MRPC 75.0 -> 75.2 (0 of 1" in text
    assert "took 3.0x the smallest's" in text
    assert "| BERT-tiny | L=2, H=128, A=2 | 0.50 M | 0.002 |" in text and "peak lr 1e-3 x 256/H" in text
    assert "Why, at this scale" not in text  # no held-out masked-LM accuracy saved: nothing to read


def test_model_size_reading_sets_the_scores_against_the_commonest_label() -> None:
    sizes = ["tiny", "mini"]
    runs = {s: {"steps": 10, "wall_s": 10.0, "parameters": p,
                "curve": [{"mlm_loss": 6.0, "mlm_accuracy": acc, "nsp_accuracy": nsp}],
                "recipe": {"data": {"batch_size": 32}, "optim": {"lr": 1e-3}}}
            for s, p, acc, nsp in (("tiny", 500_000, 0.10, 0.49), ("mini", 4_000_000, 0.12, 0.51))}
    payload = {"machine": MACHINE, "smoke": False, "sizes": sizes, "steps": 1000, "max_seq_length": 128,
               "seeds": [1, 2], "lr": 3e-4, "pretrain_lr_rule": "width", "train_examples": {"SST-2": 6000, "MRPC": None},
               "shapes": {"tiny": "L=2, H=128, A=2", "mini": "L=4, H=256, A=4"}, "runs": runs,
               "majority": {"SST-2": {"accuracy": 0.509}, "MRPC": {"accuracy": 0.684, "f1": 0.812}},
               "finetune": {"tiny": {"SST-2": score(71.0), "MRPC": score(77.0, metric="f1")},
                            "mini": {"SST-2": score(74.0), "MRPC": score(81.5, metric="f1")}}}
    text = model_size.reading(payload)
    assert "held-out masked-LM accuracy 10.0 / 12.0% (tiny / mini), for 8x the parameters" in text
    assert "next-sentence accuracy on held-out pairs 49.0-51.0%" in text
    assert "8,000 times as many" in text  # 1M x 256 against 1,000 x 32
    assert "every size clears the commonest label's 50.9 (accuracy) by 20.1-23.1 points" in text
    assert "On MRPC every size scores 77.0-81.5 (f1), no better than answering the commonest label" in text
    payload["finetune"]["mini"]["MRPC"] = score(84.0, metric="f1")
    assert "On MRPC tiny scores no better than the commonest label (81.2 f1)" in model_size.reading(payload)
    assert "Why, at this scale" in model_size.render(payload)


def test_model_size_scales_the_pretraining_rate_with_width_and_keeps_other_rates_apart() -> None:
    assert [model_size.pretrain_lr("width", s) for s in ("tiny", "mini", "small")] == [2e-3, 1e-3, 5e-4]
    assert model_size.pretrain_lr("3e-4", "small") == 3e-4
    with pytest.raises(ValueError, match="expected a number or `width`"):
        model_size.pretrain_lr("fast", "small")
    # Table 5's rate keeps the shared run's folder; any other rate gets its own
    assert model_size.run_name("mini", 1e-3) == "mini" and model_size.run_name("small", 5e-4) == "small-lr0.0005"


def test_a_finished_pretraining_run_is_not_reused_for_other_settings(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text("{}")
    made = pretraining_tasks.recipe("BERT-mini", 10)
    (run / "study.json").write_text(json.dumps({"recipe": made, "steps": 10}))
    # the same settings under another study's label: reused
    assert pretraining_tasks.pretrain_run("MLM + NSP", tmp_path, run, 10)["steps"] == 10
    with pytest.raises(ValueError, match="pre-trained with other settings"):
        pretraining_tasks.pretrain_run("MLM + NSP", tmp_path, run, 10, lr=5e-4)


def test_features_vs_finetuning_names_no_unchecked_paper_figure() -> None:
    tasks = ["CoNLL-2003", "MRPC"]
    frozen = "frozen (concat_last_four, bilstm head)"
    payload = {"machine": MACHINE, "smoke": False, "frozen_layers": "concat_last_four", "frozen_head": "bilstm",
               "frozen_lr": 1e-3, "tasks": tasks, "seeds": [1, 2], "train_examples": {"CoNLL-2003": 4000, "MRPC": None},
               "scores": {"all-MiniLM-L6-v2": {"fine-tuned": {"CoNLL-2003": score(85.0), "MRPC": score(88.0)},
                                               frozen: {"CoNLL-2003": score(84.8), "MRPC": score(80.0)}}}}
    text = features_vs_finetuning.render(payload)
    assert "fine-tuning ahead beyond the seed spread on MRPC, features ahead on none, level on CoNLL-2003" in text
    assert "96.4 fine-tuned and 96.1 from frozen concat_last_four features" in text  # the BERT paper's Table 7
    assert "could not be checked" in text
    assert "+8.0 points on the sentence pairs (MRPC) and +0.2 on the rest (CoNLL-2003)" in text
    assert "commonest label" not in text  # no floors saved: none read


def test_features_vs_finetuning_reading_tells_a_learned_task_from_the_floor() -> None:
    tasks = ["SST-2", "MRPC", "STS-B", "RTE"]
    frozen = "frozen (concat_last_four, bilstm head)"
    minilm = {"fine-tuned": {"SST-2": score(85.0), "MRPC": score(85.4, metric="f1"), "STS-B": score(82.4, metric="pearson"),
                             "RTE": score(53.0)},
              frozen: {"SST-2": score(83.0), "MRPC": score(81.1, metric="f1"), "STS-B": score(81.8, metric="pearson"),
                       "RTE": score(52.0)}}
    payload = {"smoke": False, "tasks": tasks, "seeds": [1, 2], "scores": {"all-MiniLM-L6-v2": minilm},
               "majority": {"SST-2": {"accuracy": 0.509}, "RTE": {"accuracy": 0.527},
                            "MRPC": {"accuracy": 0.684, "f1": 0.812}}}
    text = features_vs_finetuning.reading(payload)
    assert ("all-MiniLM-L6-v2 frozen 81.1 on MRPC is no better than answering the commonest label everywhere (81.2, "
            "within the seed spread or a point), fine-tuned 85.4 is") in text
    assert "learned nothing of RTE either way (fine-tuned 53.0, frozen 52.0, against 52.7" in text
    assert "closest to fine-tuning on STS-B (+0.6)" in text and "fine-tuning buys most on SST-2 (+2.0)" in text
    # a left-to-right encoder that learned nothing of RTE either way, and whose frozen BiLSTM model leads on SST-2
    payload["scores"]["bertforge ltr"] = {"fine-tuned": {**minilm["fine-tuned"], "SST-2": score(70.0)},
                                          frozen: {**minilm[frozen], "SST-2": score(75.0)}}
    payload.update(frozen_head="bilstm", machine=MACHINE, frozen_layers="concat_last_four", frozen_lr=1e-3,
                   train_examples={"SST-2": 6000})
    text = features_vs_finetuning.reading(payload)
    assert "Frozen features lead fine-tuning for the left-to-right bertforge ltr on SST-2 (+5.0)" in text
    verdict = features_vs_finetuning.verdict(payload)
    assert "(RTE: no better than the commonest label either way)" in verdict
    assert "cells at the floor either way left out" in verdict


def test_paper_search_verdict_separates_dev_from_holdout() -> None:
    configurations = [{"name": "lr5e-05-bs16-ep3", "lr": 5e-5, "batch_size": 16, "epochs": 3.0, "steps": 10,
                       "dev": score(90.0), "holdout": score(84.0)},
                      {"name": "lr2e-05-bs32-ep2", "lr": 2e-5, "batch_size": 32, "epochs": 2.0, "steps": 5,
                       "dev": score(85.0), "holdout": score(83.0)},
                      {"name": "lr3e-05-bs32-ep4", "error": "out of memory"}]
    result = {"metric": "f1", "configurations": configurations, "chosen": "lr5e-05-bs16-ep3", "search_wall_s": 1.0,
              "default": {"lr": 1e-4, "batch_size": 32, "epochs": 3.0, "dev": score(86.0), "holdout": score(83.8),
                          "wall_s": 1.0}, "train_examples": 800, "holdout_examples": 200}
    payload = {"machine": MACHINE, "smoke": False, "model": "m", "tasks": ["MRPC"],
               "grid": {"lr": [5e-5, 2e-5, 3e-5], "batch_size": [16, 32], "epochs": [2.0, 3.0, 4.0]},
               "seeds": [1, 2], "holdout": 200, "train_examples": 1000, "jobs": 1, "results": {"MRPC": result}}
    text = paper_search.render(payload)
    assert "leads the default by +4.0 on dev" in text and "+0.2 on the hold-out (within the seed spread" in text
    assert "no better than the default recipe beyond the seed spread, so whatever it leads by" in text
    assert "| MRPC | lr3e-05-bs32-ep4 | failed | - |  |" in text
    assert "commonest label" not in text and "rises with the rate" in text  # no floors saved; 2e-5 < 5e-5 best


def test_paper_search_reading_sets_the_grid_against_the_floor_and_the_default() -> None:
    def config(lr: float, batch: int, epochs: float, dev: float, steps: int) -> dict[str, Any]:
        return {"name": f"lr{lr:g}-bs{batch}-ep{epochs:g}", "lr": lr, "batch_size": batch, "epochs": epochs,
                "steps": steps, "dev": score(dev), "holdout": score(dev - 1)}

    rows = [config(2e-5, 32, 3.0, 81.3, 94), config(4e-5, 32, 3.0, 81.9, 94), config(4e-5, 16, 2.0, 83.0, 125)]
    result = {"metric": "f1", "configurations": rows, "chosen": rows[2]["name"], "search_wall_s": 1.0,
              "default": {"lr": 4e-5, "batch_size": 32, "epochs": 3.0, "dev": score(81.9), "holdout": score(80.9),
                          "wall_s": 1.0, "same_runs_as": "lr4e-05-bs32-ep3"},
              "train_examples": 800, "holdout_examples": 200}
    payload = {"smoke": False, "seeds": [1, 2, 3], "grid": {"lr": [4e-5, 2e-5], "batch_size": [16, 32],
                                                               "epochs": [2.0, 3.0]},
               "results": {"MRPC": result}, "majority": {"MRPC": {"accuracy": 0.684, "f1": 0.812}}}
    text = paper_search.reading(payload)
    assert "2 of 3 configurations score within their seed spread or a point of answering the commonest" in text
    assert "2e-05: 81.3, 4e-05: 83.0 rises with the rate" in text
    assert "(lr 4e-05, batch 32, 3 epochs) is itself one of the grid's configurations" in text
    assert "(its runs are lr4e-05-bs32-ep3's: the same resolved settings and seeds)" in text
    assert ("the paper's BERT-base recipe (lr 2e-5, batch 32, 3 epochs) scores 81.3 ± 0.5 on dev and 80.3 ± 0.5 "
            "on the hold-out") in text
    assert "trains for 94-125 steps" in text
    assert "rises with the optimiser steps" not in text  # two lengths only: no trend to read

    longer = [config(4e-5, 32, 2.0, 20.0, 63), config(4e-5, 32, 3.0, 30.0, 94), config(2e-5, 16, 3.0, 70.0, 189),
              config(4e-5, 16, 3.0, 60.0, 189)]
    payload["results"]["MRPC"] = {**result, "configurations": longer, "chosen": longer[2]["name"]}
    assert ("rises with the optimiser steps (63: 20.0, 94: 30.0, 189: 65.0), so the run's length, more than its "
            "rate, decides the score") in paper_search.reading(payload)


def test_commonest_label_floors_come_from_the_dev_files(tmp_path: Path) -> None:
    from experiments.electra_vs_mlm import majority_baselines

    def write(task: str, header: str, rows: list[str]) -> None:
        (tmp_path / task).mkdir()
        (tmp_path / task / "dev.tsv").write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")

    write("SST-2", "sentence\tlabel", ["good\t1", "bad\t0", "fine\t1", "great\t1"])
    write("MRPC", "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", ["1\t1\t2\ta\tb", "0\t3\t4\tc\td"] + ["1\t5\t6\te\tf"] * 2)
    write("RTE", "index\tsentence1\tsentence2\tlabel", ["0\ta\tb\tnot_entailment", "1\tc\td\tentailment",
                                                         "2\te\tf\tnot_entailment"])
    floors = majority_baselines(tmp_path)
    assert floors["SST-2"] == {"accuracy": 0.75} and floors["RTE"]["accuracy"] == pytest.approx(2 / 3)
    # "paraphrase" to every pair: precision 3/4, recall 1
    assert floors["MRPC"]["accuracy"] == 0.75 and floors["MRPC"]["f1"] == pytest.approx(2 * 0.75 / 1.75)


def test_model_size_reads_other_rates_tried_at_the_same_settings(tmp_path: Path) -> None:
    def study(folder: str, lr: float, loss: float, batch: int = 32) -> dict[str, Any]:
        facts = {"steps": 10, "wall_s": 1.0, "parameters": 1, "curve": [{"mlm_loss": loss, "mlm_accuracy": 0.1}],
                 "recipe": {"data": {"batch_size": batch}, "optim": {"lr": lr}}}
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "study.json").write_text(json.dumps(facts))
        return facts

    def finetuned(folder: str, start: str, lr: float, accuracy: float | None) -> None:
        (tmp_path / folder).mkdir()
        settings = {"model": str(tmp_path / start), "lr": lr}
        (tmp_path / folder / "fingerprint.json").write_text(json.dumps({"format": 1, "settings": settings}))
        if accuracy is not None:
            summary = {"accuracy": {"mean": accuracy, "std": 0.01}}
            (tmp_path / folder / "results.json").write_text(json.dumps({"summary": summary}))

    table = study("tiny-lr0.002-pretrain", 2e-3, 7.0)
    study("tiny-pretrain", 1e-3, 6.0)
    study("tiny-lr0.0005-pretrain", 5e-4, 5.0, batch=8)  # another batch too: not a rate comparison
    finetuned("sst-2-tiny-lr0.002", "tiny-lr0.002-finetune-start", 3e-4, 0.70)
    finetuned("sst-2-tiny", "tiny-finetune-start", 3e-4, 0.72)  # the same fine-tuning from the other start
    finetuned("mrpc-tiny-lr0.002", "tiny-lr0.002-finetune-start", 3e-4, None)
    finetuned("mrpc-tiny", "tiny-finetune-start", 1e-4, 0.5)  # fine-tuned otherwise: left out
    tried = model_size.other_rates(tmp_path, {"tiny": table})
    sst2 = {"metric": "accuracy", "mean": 72.0, "std": 1.0}
    assert tried == {"tiny": [{"lr": 1e-3, "mlm_loss": 6.0, "mlm_accuracy": 0.1, "finetune": {"SST-2": sst2}}]}
    mini = {**table, "curve": [{"mlm_loss": 6.2, "mlm_accuracy": 0.12, "nsp_accuracy": 0.5}], "parameters": 4}
    payload = {"smoke": False, "sizes": ["tiny", "mini"], "steps": 10, "seeds": [1, 2], "other_rates": tried,
               "runs": {"tiny": table, "mini": mini},
               "finetune": {s: {"SST-2": score(70.0), "MRPC": score(75.0, metric="f1")} for s in ("tiny", "mini")}}
    text = model_size.reading(payload)
    assert "tiny at 0.001: perplexity 403.4, masked-LM accuracy 10.0%, SST-2 72.0 ± 1.0)" in text
    assert "perplexity goes 403.4 -> 492.7 (no longer falling at every step up)" in text


def test_paper_search_reuses_the_grid_configuration_that_is_the_default_recipe(tmp_path: Path) -> None:
    from bertforge.finetune import RESULTS_FILE, build_recipe, hyperparameters, model_hidden_size
    from bertforge.tasks import make_task

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 384, "num_hidden_layers": 2,
                                                   "num_attention_heads": 6, "intermediate_size": 64,
                                                   "vocab_size": 100}))

    def recipe(**options: Any) -> Any:
        return build_recipe("glue", options={"task": "MRPC", "model": str(model), "data": str(tmp_path),
                                             "seeds": [1, 2], **options})

    def saved(name: str, built: Any, seeds: list[int]) -> dict[str, Any]:
        resolved = built.resolved(make_task("glue", "MRPC", {}), model_hidden_size(model))
        (tmp_path / "search" / "configs" / name).mkdir(parents=True)
        (tmp_path / "search" / "configs" / name / RESULTS_FILE).write_text(json.dumps(
            {"hyperparameters": hyperparameters(resolved), "seeds": [{"seed": s} for s in seeds],
             "summary": {"f1": {"mean": 0.8}}}))
        return {"name": name, "dir": f"configs/{name}"}

    default_rate = recipe().resolved(make_task("glue", "MRPC", {}), 384).optim.lr
    rows = [saved("other-rate", recipe(lr=1e-4), [1, 2]), saved("other-seeds", recipe(lr=default_rate), [1, 3]),
            {"name": "failed", "dir": "configs/failed", "error": "out of memory"},
            saved("same", recipe(lr=default_rate, batch_size=32, epochs=3.0), [1, 2])]
    twin = paper_search.grid_twin(recipe(), tmp_path / "search", {"configurations": rows})
    assert twin is not None and twin["configuration"] == "same"
    assert paper_search.grid_twin(recipe(warmup_ratio=0.2), tmp_path / "search", {"configurations": rows}) is None
