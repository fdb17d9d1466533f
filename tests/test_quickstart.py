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
    for heading in ("WordPiece vocabulary", "Pre-training data", "Held-out", "Fill-mask", "Fine-tuning on SST-2"):
        assert heading in report
    assert (run / "pretrain_curves.png").stat().st_size > 1000

    evaluation = json.loads((run / "stages" / "pretrain_eval.json").read_text())
    assert evaluation["validation_sequences"] > 0
    assert 0.0 < evaluation["validation"]["mlm_accuracy"] < 1.0  # trained on something, scored on held-out data
    assert 0.0 <= evaluation["validation"]["nsp_accuracy"] <= 1.0
    for name in ("finetune_scratch", "finetune_minilm"):
        assert 0.0 <= json.loads((run / "stages" / f"{name}.json").read_text())["accuracy"] <= 1.0

    # The pre-trained model is a Hugging Face checkpoint with its vocabulary.
    final = run / "pretrain" / "final"
    model, info = transformers.BertForPreTraining.from_pretrained(final, output_loading_info=True)
    assert not info["missing_keys"]
    assert transformers.BertTokenizerFast.from_pretrained(final).vocab_size == evaluation_vocab(run)

    again = CliRunner().invoke(app, ["quickstart", "--out", str(run), "--budget", "smoke"])
    assert again.exit_code == 0 and again.output.count("reused") == 7


def evaluation_vocab(run) -> int:
    return json.loads((run / "stages" / "tokenizer.json").read_text())["vocab_size"]


def test_quickstart_rejects_unknown_stage_and_budget(tmp_path) -> None:
    runner = CliRunner()
    bad_stage = runner.invoke(app, ["quickstart", "--out", str(tmp_path), "--stage", "nope"])
    assert bad_stage.exit_code == 2 and "unknown stage" in bad_stage.output
    bad_budget = runner.invoke(app, ["quickstart", "--out", str(tmp_path), "--budget", "huge"])
    assert bad_budget.exit_code == 2 and "unknown budget" in bad_budget.output
