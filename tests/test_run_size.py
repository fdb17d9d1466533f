"""A run's size is bounded: `--save-total-limit N` (transformers' name for keep_last) keeps at most N
resumable checkpoints while a seed trains, and a best/ model that is the final one is a hard link to its
weights, not a second copy: it loads in transformers as the final model does, also once the final
model's file and the checkpoints are deleted."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.train import state
from tests.tiny_models import save_tiny_encoder

ROWS = "a gripping film,positive\ndull and slow,negative\nwonderful acting,positive\nboring plot,negative\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("run-size")
    model = save_tiny_encoder(root, "a gripping film dull and slow wonderful acting boring plot")
    train = root / "train.csv"
    train.write_text("text,label\n" + ROWS * 4, encoding="utf-8")
    dev = root / "dev.csv"
    dev.write_text("text,label\n" + ROWS, encoding="utf-8")
    return {"model": model, "train": train, "dev": dev}


def finetune(files: dict[str, Path], out: Path, *extra: str) -> None:
    args = ["finetune", "classify", "--model", str(files["model"]), "--train", str(files["train"]), "--dev",
            str(files["dev"]), "--out", str(out), "--epochs", "2", "--batch-size", "4", "--max-length", "16", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("limit", [1, 3])
def test_save_total_limit_bounds_the_checkpoints_on_disk(files, tmp_path: Path, monkeypatch, limit: int) -> None:
    on_disk: list[int] = []  # checkpoints there as each new one is published, the new one counted
    publish = state._publish

    def counting_publish(tmp: Path, final: Path) -> None:
        on_disk.append(len(state.list_checkpoints(final.parent.parent)) + 1)
        publish(tmp, final)

    monkeypatch.setattr(state, "_publish", counting_publish)
    finetune(files, tmp_path / "run", "--save-every-steps", "1", "--save-total-limit", str(limit),
             "--keep-checkpoints")
    # 8 steps, a checkpoint each: never more than the limit on disk, even while the next is written
    # (with a limit of 1 the old one stays until the new one is whole: a crash mid-write loses nothing)
    assert len(on_disk) == 8 and max(on_disk) == max(limit, 2)
    kept = state.list_checkpoints(tmp_path / "run" / "seed-1" / "run")
    assert [path.name for path in kept] == [state.step_dir_name(step) for step in range(9 - limit, 9)]
    recorded = (tmp_path / "run" / "run_config.yaml").read_text(encoding="utf-8")
    assert f"keep_last: {limit}" in recorded


def test_a_best_model_that_is_the_final_one_is_a_link_that_loads(files, tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "run"
    finetune(files, out, "--no-eval-every-epoch", "--save-every-steps", "2", "--keep-checkpoints")  # one evaluation
    seed, best = out / "seed-1", out / "seed-1" / "best"
    final_weights, best_weights = seed / "model.safetensors", best / "model.safetensors"
    assert best_weights.stat().st_ino == final_weights.stat().st_ino and final_weights.stat().st_nlink == 2
    weights = final_weights.stat().st_size
    models = [p for p in out.rglob("*.safetensors") if "checkpoints" not in p.parts]
    assert len(models) == 2 and sum(p.stat().st_size for p in {p.stat().st_ino: p for p in models}.values()) \
        == weights  # two models, one copy of the weights on disk

    tokenizer = AutoTokenizer.from_pretrained(seed)
    batch = tokenizer(["a gripping film", "boring plot"], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = AutoModelForSequenceClassification.from_pretrained(seed).eval()(**batch).logits
    final_weights.unlink()  # the final model's file and the run's checkpoints gone: the link still holds
    assert state.list_checkpoints(seed / "run")
    shutil.rmtree(seed / "run")
    with torch.no_grad():
        loaded = AutoModelForSequenceClassification.from_pretrained(best).eval()(**batch).logits
    torch.testing.assert_close(loaded, expected, rtol=0, atol=1e-6)
