"""Model selection and early stopping: `ModelSelection` alone, inside the loop (with a crash and a
resume), and in fine-tuning (the best/ model directory, the task's main metric), with scripted scores."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bertforge.finetune import BEST_DIR, finetune, load_for_task, main_metric_key, predict
from bertforge.tasks import make_task
from bertforge.train import ModelSelection, OptimConfig, read_metrics, train
from bertforge.train.state import list_checkpoints
from tests.test_finetune import FIXTURES, encoder_dir, tokenizer  # noqa: F401  (fixtures)
from tests.test_train import Crash, SyntheticBatches, run_config, tiny_model


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------
# the tracker
# ------------------------------------------------------------------------------------------------
def test_best_is_the_highest_score_and_patience_counts_evaluations_since_it() -> None:
    selection = ModelSelection("f1", patience=2)
    scores = [0.5, 0.7, 0.6, 0.8, 0.8, 0.75]
    improved = [selection.observe(step, {"f1": s, "accuracy": 0.0}) for step, s in enumerate(scores, start=1)]
    assert improved == [True, True, False, True, False, False]  # a tie is no improvement
    assert (selection.best_score, selection.best_step, selection.stopped_at) == (0.8, 4, 6)
    assert selection.stopped


def test_lower_is_better_nan_never_improves_and_no_patience_never_stops() -> None:
    selection = ModelSelection("loss", higher_is_better=False, patience=None)
    for step, loss in enumerate([3.0, math.nan, 2.0, 2.5, 2.6, 2.7, 2.8], start=1):
        selection.observe(step, {"loss": loss})
    assert (selection.best_score, selection.best_step, selection.stopped) == (2.0, 3, False)
    with pytest.raises(KeyError, match="'loss' is not among the evaluation's metrics \\(f1\\)"):
        selection.observe(8, {"f1": 1.0})
    with pytest.raises(ValueError, match="patience"):
        ModelSelection("f1", patience=-1)


def test_state_round_trips_and_refuses_another_metric() -> None:
    selection = ModelSelection("f1", patience=3)
    for step, score in [(10, 0.4), (20, 0.6), (30, 0.5)]:
        selection.observe(step, {"f1": score})
    again = ModelSelection("f1", patience=3)
    again.load_state_dict(json.loads(json.dumps(selection.state_dict())))
    assert again.state_dict() == selection.state_dict()
    with pytest.raises(ValueError, match="selected by 'f1'"):
        ModelSelection("accuracy").load_state_dict(selection.state_dict())


# ------------------------------------------------------------------------------------------------
# in the loop
# ------------------------------------------------------------------------------------------------
SCRIPT = {1: 0.2, 2: 0.5, 3: 0.4, 4: 0.6, 5: 0.55, 6: 0.58, 7: 0.9, 8: 0.1}  # step -> score


def scripted(step_of: list[int]):
    """An evaluate function whose score depends on the step only, so a replay after resume scores alike."""
    def evaluate(model: torch.nn.Module) -> dict[str, float]:
        step = len(step_of) + 1
        step_of.append(step)
        return {"score": SCRIPT[step]}
    return evaluate


def test_loop_stops_at_the_evaluation_where_patience_runs_out(tmp_path: Path) -> None:
    saved: list[int] = []
    selection = ModelSelection("score", patience=2, on_improvement=lambda model, step, metrics: saved.append(step))
    result = train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=8, eval_every=1),
                   OptimConfig(lr=1e-3), evaluate=scripted([]), selection=selection)
    # 0.2 0.5 0.4 0.6 0.55 0.58: steps 5 and 6 do not beat 0.6, so patience 2 ends the run at step 6
    assert result.stopped_early and result.step == 6 and selection.stopped_at == 6
    assert saved == [1, 2, 4] and (selection.best_step, selection.best_score) == (4, 0.6)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000006"]  # written when it stopped
    records = [r for r in read_metrics(tmp_path) if r["split"] == "selection"]
    assert [r["improved"] for r in records] == [True, True, False, True, False, False]

    # a resume of a stopped run trains no further
    again = ModelSelection("score", patience=2)
    result = train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=8, eval_every=1),
                   OptimConfig(lr=1e-3), evaluate=scripted([6]), selection=again, resume=True)
    assert result.step == 6 and result.stopped_early and again.best_step == 4


def test_without_patience_the_run_goes_on_and_keeps_the_best(tmp_path: Path) -> None:
    saved: list[int] = []
    selection = ModelSelection("score", on_improvement=lambda model, step, metrics: saved.append(step))
    result = train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=8, eval_every=1),
                   OptimConfig(lr=1e-3), evaluate=scripted([]), selection=selection)
    assert result.step == 8 and not result.stopped_early
    assert saved == [1, 2, 4, 7] and selection.best_step == 7


def test_selection_state_survives_a_crash_and_resume(tmp_path: Path) -> None:
    config = run_config(max_steps=8, eval_every=1, save_every=3)
    straight = ModelSelection("score", patience=3)
    train(tiny_model(), SyntheticBatches(), tmp_path / "straight", config, OptimConfig(lr=1e-3),
          evaluate=scripted([]), selection=straight)

    first = ModelSelection("score", patience=3)
    with pytest.raises(Crash):  # dies fetching the batch of step 5: the last checkpoint is step 3's
        train(tiny_model(), SyntheticBatches(crash_after=4), tmp_path / "crashed", config, OptimConfig(lr=1e-3),
              evaluate=scripted([]), selection=first)
    assert first.evaluations == 4
    resumed = ModelSelection("score", patience=3)
    steps_seen: list[int] = [1, 2, 3]  # the evaluations the checkpoint already counted
    result = train(tiny_model(), SyntheticBatches(), tmp_path / "crashed", config, OptimConfig(lr=1e-3),
                   evaluate=scripted(steps_seen), selection=resumed, resume=True)
    assert steps_seen == list(range(1, 9)) and result.step == 8
    assert resumed.state_dict() == straight.state_dict()
    assert (resumed.best_step, resumed.best_score, resumed.evaluations) == (7, 0.9, 8)


# ------------------------------------------------------------------------------------------------
# in fine-tuning
# ------------------------------------------------------------------------------------------------
def test_every_task_declares_a_main_metric_its_metrics_contain() -> None:
    expected = {("glue", "MRPC"): "f1", ("glue", "STS-B"): "pearson", ("glue", "CoLA"): "matthews_correlation",
                ("glue", "RTE"): "accuracy", ("glue", "MNLI"): "dev_matched_accuracy", ("ner", "conll2003"): "f1",
                ("squad", "v1.1"): "f1", ("squad", "v2.0"): "best_f1", ("swag", "swag"): "accuracy"}
    for (family, name), key in expected.items():
        assert main_metric_key(make_task(family, name)) == key, (family, name)
    assert main_metric_key(make_task("glue", "MRPC"), "accuracy") == "accuracy"
    for name in ("MRPC", "STS-B", "CoLA", "RTE"):  # the key is one the task's metric reports
        glue = make_task("glue", name)
        dev = glue.read(FIXTURES / "glue", "dev")
        assert glue.main_metric in glue.metric(dev, glue.gold(dev))


class ScriptedScores:
    """Stands in for the dev scores of fine-tuning: the n-th evaluation gets the n-th F1."""

    def __init__(self, f1s: list[float]) -> None:
        self.f1s, self.calls = f1s, 0

    def __call__(self, evaluator: object) -> dict[str, float]:
        score = self.f1s[min(self.calls, len(self.f1s) - 1)]
        self.calls += 1
        return {"accuracy": 0.5, "f1": score}


def test_finetune_keeps_the_best_evaluation_and_stops_early(encoder_dir: Path, tmp_path: Path,  # noqa: F811
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import bertforge.finetune.evaluation as evaluation

    scores = ScriptedScores([0.3, 0.7, 0.5, 0.6, 0.65, 0.2])
    monkeypatch.setattr(evaluation.Evaluator, "scores", lambda self: scores(self))
    out = tmp_path / "mrpc"
    # 2 training pairs, batch 1: 2 steps per epoch; 4 epochs = 8 steps, scored every step
    results = finetune("glue", "MRPC", encoder_dir, FIXTURES / "glue", out, epochs=4, batch_size=1,
                       eval_every_steps=1, patience=3, progress=False, verbose=False)
    seed_dir = out / "seed-1"
    final = json.loads((seed_dir / "task.json").read_text())
    # F1 0.3 0.7 0.5 0.6 0.65: three evaluations after the best (step 2) without beating it -> stop at 5
    assert final["steps"] == 5 and final["stopped_early"] and final["epoch"] == 2.5
    assert final["metrics"]["f1"] == 0.65
    assert final["best"] == {"dir": BEST_DIR, "metric": "f1", "score": 0.7, "step": 2, "epoch": 1.0,
                             "metrics": {"accuracy": 0.5, "f1": 0.7}}
    best = json.loads((seed_dir / BEST_DIR / "task.json").read_text())
    assert (best["step"], best["epoch"], best["selection_metric"], best["score"]) == (2, 1.0, "f1", 0.7)
    assert (best["family"], best["task"], best["max_length"]) == ("glue", "mrpc", 128)
    assert {"config.json", "model.safetensors", "vocab.txt", "MRPC-dev.tsv"} <= {
        p.name for p in (seed_dir / BEST_DIR).iterdir()}
    assert not [p for p in seed_dir.iterdir() if p.name.startswith(".best")]  # no staging left behind
    assert results["selection_metric"] == "f1" and results["best_summary"]["f1"]["values"] == [0.7]
    assert results["seeds"][0]["best"]["step"] == 2

    # best/ is a model directory like any: it loads, predicts, and differs from the final weights
    best_model = load_for_task(make_task("glue", "MRPC").job, seed_dir / BEST_DIR)
    final_model = load_for_task(make_task("glue", "MRPC").job, seed_dir)
    assert not torch.equal(best_model.classifier.weight, final_model.classifier.weight)
    done = predict("glue", "MRPC", seed_dir / BEST_DIR, FIXTURES / "glue", tmp_path / "sub")
    assert (tmp_path / "sub" / "MRPC.tsv").exists() and done["test"]["examples"] == 1

    # settings reach run_config.yaml
    run_config_text = (out / "run_config.yaml").read_text()
    assert "eval_every_steps: 1" in run_config_text and "patience: 3" in run_config_text


def test_finetune_without_early_stopping_runs_to_the_end(encoder_dir: Path, tmp_path: Path,  # noqa: F811
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import bertforge.finetune.evaluation as evaluation

    scores = ScriptedScores([0.3, 0.7, 0.5, 0.9])
    monkeypatch.setattr(evaluation.Evaluator, "scores", lambda self: scores(self))
    out = tmp_path / "mrpc"
    # eval_every_epoch: 2 evaluations (steps 2 and 4), best = the second
    finetune("glue", "MRPC", encoder_dir, FIXTURES / "glue", out, epochs=2, batch_size=1, progress=False,
             verbose=False)
    final = json.loads((out / "seed-1" / "task.json").read_text())
    assert final["steps"] == 4 and not final["stopped_early"]
    assert (final["best"]["step"], final["best"]["score"]) == (4, 0.7)
    # save_best off: no best/ directory, but task.json still names the best evaluation
    scores.calls = 0
    finetune("glue", "MRPC", encoder_dir, FIXTURES / "glue", tmp_path / "nobest", epochs=2, batch_size=1,
             save_best=False, progress=False, verbose=False)
    final = json.loads((tmp_path / "nobest" / "seed-1" / "task.json").read_text())
    assert not (tmp_path / "nobest" / "seed-1" / BEST_DIR).exists()
    assert final["best"]["dir"] is None and final["best"]["step"] == 4


def test_a_fresh_run_drops_a_stale_best(encoder_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    stale = tmp_path / "out" / "seed-1" / BEST_DIR
    stale.mkdir(parents=True)
    (stale / "task.json").write_text('{"step": 99}')
    finetune("glue", "MRPC", encoder_dir, FIXTURES / "glue", tmp_path / "out", epochs=1, batch_size=2,
             progress=False, verbose=False)
    assert json.loads((stale / "task.json").read_text())["step"] == 1


def test_best_is_a_link_when_it_is_the_final_model(tmp_path: Path) -> None:
    """One epoch, one evaluation at its end: best/ is the final model, its weights stored once."""
    from bertforge.finetune import finetune
    from tests.tiny_models import save_tiny_encoder

    encoder = save_tiny_encoder(tmp_path, "a warm film a dull film", vocab_size=60, hidden_size=16)
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a warm film,pos\na dull film,neg\n" * 8, encoding="utf-8")
    finetune("classify", None, encoder, None, tmp_path / "run", epochs=1, batch_size=4, max_length=16,
             task_settings={"train": str(train), "dev": str(train)}, progress=False, verbose=False)
    seed = tmp_path / "run" / "seed-1"
    final, best = (seed / "model.safetensors").stat(), (seed / "best" / "model.safetensors").stat()
    assert (final.st_ino, final.st_dev) == (best.st_ino, best.st_dev)
    from bertforge import pipeline

    assert pipeline(seed / "best")("a warm film") == pipeline(seed)("a warm film")
