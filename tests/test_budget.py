"""A training budget in minutes (TrainConfig.budget_minutes, Cramming's rule): the loop stops at the step
that spends it, and warm-up and decay follow the fraction of it spent rather than the step.

The loop's clock (`bertforge.train.loop.clock`) is replaced by one that moves only while the model runs
a training forward, a fixed amount a call, so the step that spends the budget is known in advance;
whatever else takes time (evaluation, checkpoints) moves it too, where the test says so, to show that
it is not counted.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bertforge.train import (
    OptimConfig,
    TrainConfig,
    TrainState,
    distributed,
    list_checkpoints,
    read_metrics,
    train,
)
from bertforge.train import loop as loop_module
from bertforge.train.optim import TimeBudget, build_scheduler, lr_factor, lr_factor_by_time
from test_train import Crash, SyntheticBatches, assert_identical, free_port, params, run_config, tiny_model

STEP_S = 1.5  # a step's training time on the fake clock (exact in binary, so sums are exact)
BUDGET_MIN = 0.25  # 15 s: the 10th step spends it
PEAK = 1e-3
OPTIM = OptimConfig(lr=PEAK, warmup_ratio=0.2, min_lr_ratio=0.1)


class StepClock:
    """Reads `now`, which `advance` moves; installed as the loop's clock."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def timed_model(clock: StepClock, seed: int = 0, seconds: float = STEP_S) -> torch.nn.Module:
    """A tiny model whose training forward takes `seconds` on `clock` (its evaluation forward: none)."""
    model = tiny_model(seed=seed, dropout=0.0)

    def tick(module: torch.nn.Module, args: tuple) -> None:
        if module.training:
            clock.advance(seconds)

    model.register_forward_pre_hook(tick)
    return model


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> StepClock:
    fake = StepClock()
    monkeypatch.setattr(loop_module, "clock", fake)
    return fake


def budget_config(**overrides) -> TrainConfig:
    return run_config(**{"max_steps": 100, "budget_minutes": BUDGET_MIN, **overrides})


def expected_lr(step: int) -> float:
    """The rate step `step` (1-based) uses: from the time spent before it, STEP_S a step."""
    fraction = (step - 1) * STEP_S / (BUDGET_MIN * 60)
    return PEAK * lr_factor_by_time(fraction, warmup_fraction=OPTIM.warmup_ratio, min_ratio=OPTIM.min_lr_ratio)


def final_lr(run_dir: Path) -> float:
    """The rate the last checkpoint's optimiser holds: the one a next step would use."""
    state = torch.load(list_checkpoints(run_dir)[-1] / "optimizer.pt", weights_only=True)
    return state["param_groups"][0]["lr"]


# ------------------------------------------------------------------------------------------------
# the schedule by time
# ------------------------------------------------------------------------------------------------
def test_the_time_schedule_has_the_step_schedule_s_shape_on_the_time_axis() -> None:
    kwargs = dict(warmup_fraction=0.1, min_ratio=0.0)
    assert lr_factor_by_time(0.0, **kwargs) == 0.0  # no time has passed before the first step
    assert lr_factor_by_time(0.05, **kwargs) == pytest.approx(0.5)
    assert lr_factor_by_time(0.1, **kwargs) == pytest.approx(1.0)
    assert lr_factor_by_time(0.55, **kwargs) == pytest.approx(0.5)
    assert lr_factor_by_time(1.0, **kwargs) == pytest.approx(0.0)
    assert lr_factor_by_time(1.3, **kwargs) == pytest.approx(0.0)  # a last step past the end: the floor
    assert lr_factor_by_time(1.0, warmup_fraction=0.0, min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor_by_time(0.325, warmup_fraction=0.1, schedule="cosine") == pytest.approx(
        (1 + math.cos(math.pi / 4)) / 2)
    assert lr_factor_by_time(0.9, warmup_fraction=0.1, schedule="constant") == 1.0
    # the same maths as the step schedule, a step being 1/100 of the time
    for step in range(10, 101, 7):
        assert lr_factor_by_time(step / 100, warmup_fraction=0.1, schedule="cosine", min_ratio=0.2) == \
            pytest.approx(lr_factor(step, warmup_steps=10, total_steps=100, schedule="cosine", min_ratio=0.2))


def test_the_scheduler_reads_the_budget_cell_and_keeps_only_numbers_in_its_state() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([p], lr=2.0)
    budget = TimeBudget(seconds=100.0)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=2.0, warmup_ratio=0.1), total_steps=5, budget=budget)
    seen = []
    for spent in (3.0, 10.0, 55.0, 100.0):  # the loop sets the time spent, then steps the schedule
        optimizer.step()
        budget.spent = spent
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([0.6, 2.0, 1.0, 0.0])  # total_steps=5 plays no part
    json.dumps(scheduler.state_dict())  # numbers only: it goes into trainer.json

    # a warm-up in steps stays in steps, rising to the time decay rather than to the peak
    optimizer = torch.optim.SGD([p], lr=1.0)
    budget = TimeBudget(seconds=100.0)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=1.0, warmup_steps=4), total_steps=1000, budget=budget)
    seen = [optimizer.param_groups[0]["lr"]]
    for step in range(1, 6):
        optimizer.step()
        budget.spent = 10.0 * step
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([0.25, 0.5, 0.75, 0.7, 0.6, 0.5])


def test_budget_minutes_is_checked() -> None:
    assert TrainConfig().budget_minutes == 0.0
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="budget_minutes"):
            TrainConfig(budget_minutes=bad)


def test_the_progress_bar_total_follows_the_pace() -> None:
    config = TrainConfig(max_steps=1000, budget_minutes=1.0)
    assert loop_module._expected_steps(10, config, None) == 1000
    assert loop_module._expected_steps(0, config, TimeBudget(60.0)) == 1000  # no pace yet
    assert loop_module._expected_steps(10, config, TimeBudget(60.0, spent=6.0)) == 100
    assert loop_module._expected_steps(10, config, TimeBudget(60.0, spent=0.3)) == 1000  # max_steps caps
    assert loop_module._expected_steps(10, config, TimeBudget(60.0, spent=61.0)) == 10  # over: this one


# ------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------
def test_the_run_ends_at_the_step_that_spends_the_budget_and_the_rate_follows_the_time(
        clock: StepClock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def slow_evaluation(model: torch.nn.Module) -> dict[str, float]:
        clock.advance(100.0)  # evaluations take no budget time
        return {"steps_seen": 1.0}

    save = TrainState.save

    def slow_save(self: TrainState, *args, **kwargs) -> Path:
        clock.advance(100.0)  # nor do checkpoints
        return save(self, *args, **kwargs)

    monkeypatch.setattr(TrainState, "save", slow_save)
    result = train(timed_model(clock), SyntheticBatches(), tmp_path, budget_config(eval_every=3, save_every=4),
                   OPTIM, evaluate=slow_evaluation)
    assert (result.step, result.budget_reached, result.train_seconds) == (10, True, 15.0)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000004", "step-000008", "step-000010"]
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if r["split"] == "eval"] == [3, 6, 9, 10]  # the last step evaluates
    train_records = [r for r in records if r["split"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, 11))
    assert [r["train_minutes"] for r in train_records] == [round(s * STEP_S / 60, 4) for s in range(1, 11)]
    lrs = [r["lr"] for r in train_records]
    assert lrs == pytest.approx([expected_lr(s) for s in range(1, 11)])
    assert lrs[:4] == pytest.approx([0.0, 0.5 * PEAK, PEAK, PEAK * (0.1 + 0.9 * (1 - 0.1 / 0.8))])
    assert final_lr(tmp_path) == pytest.approx(0.1 * PEAK)  # the floor, at the budget's end
    trainer = json.loads((tmp_path / "checkpoints" / "step-000010" / "trainer.json").read_text())
    assert trainer["counters"]["train_seconds"] == 15.0


def test_max_steps_still_caps_a_budget(clock: StepClock, tmp_path: Path) -> None:
    result = train(timed_model(clock), SyntheticBatches(), tmp_path, budget_config(max_steps=6), OPTIM)
    assert (result.step, result.budget_reached, result.train_seconds) == (6, False, 9.0)
    assert [r["lr"] for r in read_metrics(tmp_path) if r["split"] == "train"] == \
        pytest.approx([expected_lr(s) for s in range(1, 7)])


def test_the_update_s_time_counts_with_the_next_step(clock: StepClock, tmp_path: Path) -> None:
    handle = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: clock.advance(0.5))
    try:
        result = train(timed_model(clock, seconds=1.0), SyntheticBatches(), tmp_path, run_config(max_steps=4), OPTIM)
    finally:
        handle.remove()
    # a step's time goes into its all-reduce, which comes before its update: the last update is not counted
    assert result.train_seconds == 1.0 + 3 * 1.5


def test_an_interrupted_run_resumes_its_spent_time_and_ends_where_a_straight_run_does(
        clock: StepClock, tmp_path: Path) -> None:
    config = budget_config(save_every=4)
    straight = timed_model(clock)
    assert train(straight, SyntheticBatches(), tmp_path / "straight", config, OPTIM).step == 10

    clock.now = 0.0
    with pytest.raises(Crash):
        train(timed_model(clock), SyntheticBatches(crash_after=4 + 1), tmp_path / "crashed", config, OPTIM)
    assert [p.name for p in list_checkpoints(tmp_path / "crashed")] == ["step-000004"]

    clock.now = 5000.0  # a new process: only the time its steps take counts
    resumed = timed_model(clock, seed=99)  # everything must come from the checkpoint
    result = train(resumed, SyntheticBatches(), tmp_path / "crashed", config, OPTIM, resume=True)
    assert (result.step, result.budget_reached, result.train_seconds) == (10, True, 15.0)
    assert_identical(params(resumed), params(straight))  # so every step had the same rate
    assert [r["lr"] for r in read_metrics(tmp_path / "crashed") if r["split"] == "train"] == \
        pytest.approx([expected_lr(s) for s in range(1, 11)])


def test_a_checkpoint_from_before_the_budget_resumes_with_no_time_spent(clock: StepClock, tmp_path: Path) -> None:
    train(timed_model(clock), SyntheticBatches(), tmp_path, run_config(max_steps=2), OPTIM)
    path = list_checkpoints(tmp_path)[-1] / "trainer.json"
    trainer = json.loads(path.read_text())
    assert trainer["counters"].pop("train_seconds") == 2 * STEP_S  # counted without a budget too
    path.write_text(json.dumps(trainer))  # as an older version wrote it
    result = train(timed_model(clock), SyntheticBatches(), tmp_path, budget_config(budget_minutes=4 * STEP_S / 60),
                   OPTIM, resume=True)
    assert (result.step, result.budget_reached, result.train_seconds) == (6, True, 4 * STEP_S)


def test_without_a_budget_the_run_goes_by_steps(tmp_path: Path) -> None:
    result = train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=3), OPTIM)
    assert (result.step, result.budget_reached) == (3, False) and result.train_seconds > 0  # the real clock
    warmup = int(OPTIM.warmup_ratio * 3)
    assert [r["lr"] for r in read_metrics(tmp_path) if r["split"] == "train"] == pytest.approx(
        [PEAK * lr_factor(s, warmup_steps=warmup, total_steps=3, min_ratio=0.1) for s in range(3)])


def _ddp_budget_worker(rank: int, world_size: int, port: int, run_dir: str) -> None:
    """Rank r's steps take 1 + 2r seconds on its own clock: the ranks agree on their mean, 2 s a step."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    clock = StepClock()
    loop_module.clock = clock  # a spawned process: nothing to restore
    try:
        result = train(timed_model(clock, seconds=1.0 + 2 * rank), SyntheticBatches(rank=rank, world_size=world_size),
                       run_dir, run_config(max_steps=100, budget_minutes=0.1, dist_timeout_s=60), OPTIM)
        Path(run_dir, f"rank{rank}.json").write_text(json.dumps([result.step, result.train_seconds]))
    finally:
        distributed.cleanup()


@pytest.mark.slow
def test_ranks_agree_on_the_time_spent_and_stop_together(tmp_path: Path) -> None:
    mp.spawn(_ddp_budget_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    ends = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert ends == [[3, 6.0], [3, 6.0]]  # 6 s of budget at a mean 2 s a step


# ------------------------------------------------------------------------------------------------
# the run directory's guard
# ------------------------------------------------------------------------------------------------
def test_a_pretraining_resume_with_another_budget_is_refused(tmp_path: Path) -> None:
    from bertforge import BertConfig
    from bertforge.pretrain import load_recipe, run_settings, with_overrides
    from bertforge.train.rundir import RunMismatchError, check_run_record, write_run_record

    config = BertConfig.from_preset("tiny")
    recipe = load_recipe("tiny")
    write_run_record(tmp_path, run_settings(recipe, config), [])
    check_run_record(tmp_path, run_settings(recipe, config), [])
    with pytest.raises(RunMismatchError, match="budget_minutes 0.0 -> 30"):
        check_run_record(tmp_path, run_settings(with_overrides(recipe, budget_minutes=30.0), config), [])
