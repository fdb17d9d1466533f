"""The README's main job, on the smoke budget: the same code path as `bertforge quickstart`, smaller."""

from __future__ import annotations

import json

import pytest
import transformers
from typer.testing import CliRunner

from bertforge.cli import app


@pytest.mark.slow
def test_quickstart_smoke_end_to_end_and_reuse(tmp_path) -> None:
    run = tmp_path / "qs"
    result = CliRunner().invoke(app, ["quickstart", "--out", str(run), "--budget", "smoke"])
    assert result.exit_code == 0, result.output
    report = (run / "report.md").read_text()
    for heading in ("WordPiece vocabulary", "Pre-training data", "Held-out", "Does the model use word order?",
                    "Fill-mask", "Fine-tuning on SST-2"):
        assert heading in report
    assert (run / "pretrain_curves.png").stat().st_size > 1000

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
    scores = {name: json.loads((run / "stages" / f"{name}.json").read_text())
              for name in ("finetune_pretrained", "finetune_random", "finetune_minilm")}
    for record in scores.values():
        assert 0.0 <= record["accuracy"] <= 1.0
    # three rows: pre-trained here, its random twin with the same settings, MiniLM
    assert scores["finetune_random"]["lr"] == scores["finetune_pretrained"]["lr"]
    assert "random-init" in scores["finetune_random"]["model"]
    assert f"random weights | {scores['finetune_random']['train_examples']} |" in report
    assert f"{scores['finetune_random']['accuracy']:.3f} |" in report

    # The pre-trained model is a Hugging Face checkpoint with its vocabulary.
    final = run / "pretrain" / "final"
    model, info = transformers.BertForPreTraining.from_pretrained(final, output_loading_info=True)
    assert not info["missing_keys"]
    assert transformers.BertTokenizerFast.from_pretrained(final).vocab_size == evaluation_vocab(run)

    again = CliRunner().invoke(app, ["quickstart", "--out", str(run), "--budget", "smoke"])
    assert again.exit_code == 0 and again.output.count("reused") == 8


def evaluation_vocab(run) -> int:
    return json.loads((run / "stages" / "tokenizer.json").read_text())["vocab_size"]


def test_quickstart_rejects_unknown_stage_and_budget(tmp_path) -> None:
    runner = CliRunner()
    bad_stage = runner.invoke(app, ["quickstart", "--out", str(tmp_path), "--stage", "nope"])
    assert bad_stage.exit_code == 2 and "unknown stage" in bad_stage.output
    bad_budget = runner.invoke(app, ["quickstart", "--out", str(tmp_path), "--budget", "huge"])
    assert bad_budget.exit_code == 2 and "unknown budget" in bad_budget.output


def test_report_sentences_follow_the_numbers() -> None:
    from bertforge.quickstart import finetune_sentence, probe_sentence

    facts = {"tokens": 4_000_000, "train_examples": 4000, "eval_examples": 872, "word_order": 12.0}
    level = finetune_sentence(0.771, 0.765, **facts)
    assert "a gap of +0.6 points is no difference" in level and "taught the encoder word order" in level
    assert "word order" not in finetune_sentence(0.771, 0.765, **facts | {"word_order": 0.3})
    assert "lead of 8.0 points is more than noise" in finetune_sentence(0.80, 0.72, **facts)
    assert "majority class" in finetune_sentence(0.70, 0.51, **facts)
    assert "random start's lead of 5.0 points" in finetune_sentence(0.70, 0.75, **facts | {"tokens": None})
    bag = {"context intact": 13.0, "shuffled order": 12.6, "no context": 9.0}
    assert "bag-of-words stage" in probe_sentence(bag)
    assert "from their neighbours" in probe_sentence(bag | {"context intact": 30.0})
