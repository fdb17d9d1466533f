"""THE training loop, shared by pre-training and every fine-tuning task.

It knows a model only through `model(**batch).loss` and data only through `ResumableBatches`; what a
task adds (heads, metrics, data) arrives as arguments. Several ranks share the work by DDP (a full
copy per rank) or FSDP (`parallel="fsdp"`: parameters, gradients and optimizer state sharded; see
`bertforge.train.fsdp`). Per optimiser step it runs `grad_accum` micro-batches (gradients are
synchronised on the last only), averages the loss over micro-batches
and ranks, skips the update when the loss or the gradient norm is not finite, clips, steps the
optimiser and the schedule, and then logs, evaluates and checkpoints on their cadences. With a
`ModelSelection` every evaluation is scored by one metric: an improvement is handed to its
`on_improvement` (rank 0), and once its patience runs out the loop writes a checkpoint and stops.

Everything that changes as the run goes on (step, counters, optimiser, schedule, grad scaler, data
position) lives in one `TrainState` (`bertforge.train.state`), which is saved and resumed as one
checkpoint; the rest of this module is stateless between steps but for the logging window.

Step arithmetic: `step` counts optimiser steps attempted, skipped ones included, so that the step,
the schedule and the data position always agree; after `step` steps a run has consumed exactly
`step * grad_accum` micro-batches per rank. The loss of a step is the mean of its micro-batches'
mean losses, the same as one batch of `grad_accum` times the size when micro-batches weigh the same.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge import threads
from bertforge.train import distributed, fsdp
from bertforge.train.config import PRECISIONS, OptimConfig, TrainConfig  # noqa: F401  (re-exported)
from bertforge.train.log import RunLogger
from bertforge.train.optim import TimeBudget, build_optimizer, build_scheduler
from bertforge.train.selection import ModelSelection
from bertforge.train.state import (
    Batch,
    Counters,
    ResumableBatches,
    TrainState,
    capture_rng,
    checkpoint_problem,
    list_checkpoints,
    restore_rng,
    seed_everything,
)

EvalFn = Callable[[nn.Module], dict[str, float]]
# the clock of a step's training time (TrainConfig.budget_minutes); looked up at each call, so that a
# test can put a clock of its own here
clock = time.monotonic


@dataclass
class TrainResult:
    step: int
    checkpoint: Path | None  # the last checkpoint written
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation
    train_loss: float = math.nan  # mean loss of the last logging interval
    skipped_steps: int = 0
    stopped_early: bool = False  # the selection's patience ran out before max_steps
    train_seconds: float = 0.0  # training time of all its steps, resumed runs' included
    budget_reached: bool = False  # it ended because config.budget_minutes of training time were spent


class NonFiniteLossError(RuntimeError):
    """Too many steps in a row with a non-finite loss; a checkpoint was written before raising."""

    def __init__(self, message: str, module: str | None, checkpoint: Path | None) -> None:
        super().__init__(message)
        self.module = module
        self.checkpoint = checkpoint


# ------------------------------------------------------------------------------------------------
# the loop
# ------------------------------------------------------------------------------------------------
def train(
    model: nn.Module,
    batches: ResumableBatches,
    run_dir: str | Path,
    config: TrainConfig,
    optim: OptimConfig,
    *,
    evaluate: EvalFn | None = None,
    resume: bool = False,
    ctx: distributed.DistContext | None = None,
    selection: ModelSelection | None = None,
) -> TrainResult:
    """Train `model` on `batches` for `config.max_steps` optimiser steps; checkpoints go to `run_dir`.

    `evaluate(model)` (called on rank 0 in eval mode, without gradients, under the run's autocast)
    returns metrics to log. With `resume=True` the run continues from the newest complete checkpoint
    in `run_dir`, bit-exactly on CPU; a newest checkpoint whose files do not load (truncated, missing)
    is skipped for the one before it, with a line saying which and why. Without `resume`, a `run_dir`
    that already holds checkpoints is refused. Checkpoints are written every `config.save_every`
    steps and every `config.save_every_minutes` of training, and at the end.
    With `config.budget_minutes` the run ends after the first step that brings its training time (the
    steps' own, not evaluations' or checkpoints'; counted across resumes) to the budget, or at
    `max_steps` if that comes first, and the learning rate follows the fraction of the budget spent.
    Under torchrun every rank calls this with its own part of the data; `ctx` is the caller's
    `distributed.init_distributed(config.device, config.dist_timeout_s)` where it has joined the process
    group already (by default the loop joins it). With `parallel="fsdp"` on several ranks the model is
    sharded in place and stays so after the run: its parameters are DTensor shards (`fsdp.unsharded`
    gives rank 0 a plain copy, `fsdp.full_model_state` the weights).
    `selection` (see `bertforge.train.selection`) sees every evaluation's metrics; its state is saved
    in the checkpoints and restored on resume, and the run ends early when its patience runs out.
    """
    run_dir = Path(run_dir)
    ctx = ctx if ctx is not None else distributed.init_distributed(config.device, config.dist_timeout_s)
    if selection is not None and selection.on_improvement is not None and config.parallel == "fsdp":
        raise ValueError("keeping the best model needs the whole model on rank 0; not available with fsdp")
    budget = TimeBudget(config.budget_minutes * 60) if config.budget_minutes > 0 else None
    state, skipped = _start(model, batches, run_dir, config, optim, ctx, resume, selection, budget)
    if budget is not None:  # a resumed run's rate and end follow the time its checkpoint had spent
        budget.spent = state.counters.train_seconds
    start_step = state.step
    runner = model if fsdp.is_sharded(model) else distributed.wrap_ddp(model, ctx, find_unused=config.ddp_find_unused)
    if config.compile:
        runner = torch.compile(runner)
    logger = RunLogger(run_dir, total_steps=_expected_steps(start_step, config, budget), start_step=start_step,
                       enabled=ctx.is_main, progress=config.progress)
    for line in skipped:
        logger.info(line)
    if resume:
        logger.info(f"resumed from {state.checkpoint}" if state.checkpoint else
                    f"nothing to resume in {run_dir}; starting")
    stepper = _Stepper(runner, state, config, ctx)
    data = _forever(batches)
    result = TrainResult(step=state.step, checkpoint=state.checkpoint)
    window = _Window()
    save_interval_s = config.save_every_minutes * 60
    last_save = time.monotonic()
    model.train()
    try:
        while not (_last_step(state.step, config, budget) or (selection is not None and selection.stopped)):
            started = clock()  # a step's training time includes fetching its data
            micro_batches = [next(data) for _ in range(config.grad_accum)]
            # rank 0's clock decides, and the step's all-reduce tells every rank (they save together)
            time_is_up = ctx.is_main and save_interval_s > 0 and time.monotonic() - last_save >= save_interval_s
            threads.tick()  # a fair share of the cores when other jobs run (if the caller installed it)
            outcome = stepper.step(micro_batches, time_is_up, started)
            state.step += 1
            state.counters.add(outcome.tokens, outcome.skipped, outcome.scaler_skip, outcome.seconds)
            _advance_schedule(state, budget)
            window.add(outcome)
            step = state.step
            last = _last_step(step, config, budget)  # the cadences all fall on it
            if step == start_step + 1:  # this process's first step
                _log_run_facts(logger, model, getattr(batches, "batch_size", None) or micro_batches[0], config, ctx, step)
            if state.counters.nonfinite_in_a_row >= config.max_nonfinite:
                state.save(run_dir, config.keep_last)
                _raise_nonfinite(state, micro_batches, config, ctx)
            logger.progress(step, {"loss": outcome.loss, "lr": outcome.lr, "tok/s": window.tokens_per_s()},
                            total=_expected_steps(step, config, budget))
            if last and budget is not None and budget.exhausted:
                logger.info(f"step {step}: {state.counters.train_seconds / 60:.4g} minutes of training spent the "
                            f"budget of {config.budget_minutes:g}; this is the last step")
            if _due(config.log_every, step, last):
                logger.log(step, "train", window.summary(state.counters))
                result.train_loss = window.mean_loss()
                window = _Window()
            if _due(config.eval_every, step, last):
                result.metrics = _evaluate(evaluate, model, config, ctx)
                if result.metrics:
                    logger.log(step, "eval", result.metrics)
                    split = getattr(evaluate, "label", "")  # the split the scores are from (fine-tuning's dev)
                    logger.info(f"step {step}: {split + ' ' if split else ''}"
                                + "  ".join(f"{k} {v:.4g}" for k, v in result.metrics.items()))
                    if selection is not None:
                        _select(selection, model, step, result.metrics, logger, ctx)
            if (_due(config.save_every, step, last) or outcome.save_due
                    or (selection is not None and selection.stopped)):
                state.save(run_dir, config.keep_last)
                last_save = time.monotonic()
    finally:
        logger.close()
    result.step, result.checkpoint, result.skipped_steps = state.step, state.checkpoint, state.counters.skipped_steps
    result.stopped_early = selection is not None and selection.stopped
    result.train_seconds = state.counters.train_seconds
    result.budget_reached = budget is not None and budget.exhausted
    return result


def _select(selection: ModelSelection, model: nn.Module, step: int, metrics: dict[str, float], logger: RunLogger,
            ctx: distributed.DistContext) -> None:
    """Score one evaluation; hand an improvement to `on_improvement` (rank 0); say when patience runs out."""
    improved = selection.observe(step, metrics)
    logger.log(step, "selection", {"metric": selection.metric, "score": selection.score_of(metrics),
                                   "improved": improved, "best_score": selection.best_score,
                                   "best_step": selection.best_step, "since_best": selection.since_best})
    if improved and selection.on_improvement is not None and ctx.is_main:
        selection.on_improvement(model, step, metrics)
    if selection.stopped:
        logger.info(f"step {step}: no improvement of {selection.metric} in {selection.since_best} evaluations "
                    f"(best {selection.best_score:.4g} at step {selection.best_step}); stopping early")


def _start(model: nn.Module, batches: ResumableBatches, run_dir: Path, config: TrainConfig, optim: OptimConfig,
           ctx: distributed.DistContext, resume: bool, selection: ModelSelection | None = None,
           budget: TimeBudget | None = None) -> tuple[TrainState, list[str]]:
    """The state at the first step of this process: fresh, or the newest loadable checkpoint's with
    `resume`; and a line for each newer checkpoint that was skipped because it does not load."""
    if config.precision == "fp16" and ctx.device.type != "cuda":
        raise ValueError("precision fp16 needs a GPU (its loss scaler is CUDA-only); use bf16 on CPU")
    _seed(config, ctx, step=0)
    if config.parallel == "fsdp":
        # before the optimizer, since sharding replaces the parameters; and before the move to the
        # device, since sharding moves one unit at a time, so the whole model is never there unsharded
        distributed.shard_fsdp(model, ctx)
    model.to(ctx.device)
    optimizer = build_optimizer(model, optim)
    state = TrainState(model, optimizer, scheduler=build_scheduler(optimizer, optim, config.max_steps, budget),
                       scaler=torch.amp.GradScaler("cuda") if config.precision == "fp16" else None,
                       batches=batches, selection=selection)
    checkpoints = list_checkpoints(run_dir)
    if checkpoints and not resume:
        raise FileExistsError(f"{run_dir} already holds checkpoints ({checkpoints[-1].name}); resume it "
                              f"(resume=True, --resume) or choose a new run directory")
    skipped: list[str] = []
    for checkpoint in reversed(checkpoints if resume else []):
        # every rank looks at the files first and all agree, so that no rank loads a checkpoint another skips
        problem = checkpoint_problem(checkpoint)
        problems = [p for p in distributed.all_gather_object(problem) if p] if ctx.distributed else [problem]
        problem = problems[0] if problems else None
        if problem is None:
            try:
                restored = state.resume_from(checkpoint)
            except Exception as exc:  # the files looked whole but do not load; alone, try the one before
                if ctx.distributed:
                    raise
                problem = " ".join(f"{type(exc).__name__}: {exc}".split())
            else:
                if not restored:
                    _seed(config, ctx, step=state.step)  # another world size: fresh, distinct streams per rank
                return state, skipped
        skipped.append(f"skipped checkpoint {checkpoint} ({problem}); trying the one before it")
    if skipped:
        raise ValueError(f"{run_dir}: no checkpoint loads ({'; '.join(skipped)}); start afresh in a new run "
                         "directory (or with --overwrite)")
    return state, skipped


def _seed(config: TrainConfig, ctx: distributed.DistContext, step: int) -> None:
    """Seed this rank's RNGs for a run that starts (or, without saved RNG states, resumes) at `step`."""
    seed_everything(config.seed + ctx.rank + 1_000_003 * step)


def _due(every: int, step: int, last: bool) -> bool:
    """Whether a cadence of `every` steps falls on `step`; 0 means only at the end. The `last` step always."""
    return (every > 0 and step % every == 0) or last


def _last_step(step: int, config: TrainConfig, budget: TimeBudget | None) -> bool:
    """Whether a run that has taken `step` steps is done: at `max_steps`, or with its training budget spent."""
    return step >= config.max_steps or (budget is not None and budget.exhausted)


def _advance_schedule(state: TrainState, budget: TimeBudget | None) -> None:
    """Set the next step's rate: from its index, or from the training time spent before it."""
    if budget is not None:
        budget.spent = state.counters.train_seconds
    with warnings.catch_warnings():
        # a skipped first step makes LambdaLR warn that optimizer.step() was not called; we know
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
        state.scheduler.step()


def _expected_steps(step: int, config: TrainConfig, budget: TimeBudget | None) -> int:
    """The progress bar's total: `max_steps`, or with a budget the step the run ends at at its pace so
    far (steps over the fraction of the budget spent), which makes tqdm's ETA the budget's remaining time."""
    if budget is None or budget.fraction <= 0:
        return config.max_steps
    return min(config.max_steps, max(step, math.ceil(step / budget.fraction)))


@dataclass
class StepOutcome:
    loss: float  # mean over micro-batches and ranks (nan when not finite)
    lr: float  # the rate this step used
    grad_norm: float  # before clipping (nan when the step was skipped)
    tokens: int  # non-padding tokens over micro-batches and ranks
    skipped: bool  # the update was not applied because loss or gradients were not finite
    scaler_skip: bool = False  # fp16: the scaler found inf gradients and lowered its scale (expected, rare)
    save_due: bool = False  # rank 0's save_every_minutes ran out: every rank checkpoints after this step
    seconds: float = 0.0  # training time, mean over ranks: this step's up to its all-reduce, and the rest of the one before


class _Stepper:
    """One optimiser step over a list of micro-batches."""

    def __init__(self, runner: nn.Module, state: TrainState, config: TrainConfig, ctx: distributed.DistContext) -> None:
        self.runner, self.optimizer, self.scaler = runner, state.optimizer, state.scaler
        self.config, self.ctx = config, ctx
        self.params = [p for group in self.optimizer.param_groups for p in group["params"]]
        self.unshared_s = 0.0  # the end of the previous step, timed after its all-reduce had begun

    def step(self, micro_batches: list[Batch], save_due: bool = False, started: float | None = None) -> StepOutcome:
        """One step; `save_due` (this rank's wish to checkpoint after it) is summed over ranks with the loss,
        and so is its training time since `started` (the `clock()` reading where the step began; default now)."""
        started = clock() if started is None else started
        self.optimizer.zero_grad(set_to_none=True)
        accum = len(micro_batches)
        loss_sum = torch.zeros((), device=self.ctx.device)
        tokens = 0
        for i, cpu_batch in enumerate(micro_batches):
            tokens += count_tokens(cpu_batch)  # on the CPU copy: no device sync
            batch = to_device(cpu_batch, self.ctx.device)
            # DDP all-reduces (FSDP reduce-scatters) gradients in the backward of the last micro-batch only
            with distributed.no_sync(self.runner, i < accum - 1)():
                with autocast(self.ctx.device, self.config.precision):
                    loss = self.runner(**batch).loss
                scaled = loss.float() / accum
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            loss_sum += loss.detach().float()
        # this rank's time goes into the all-reduce, so its reading must come before it: the rest of the
        # step (on a GPU, waiting for the queued kernels; the update) is counted with the next step
        shared_until = clock()
        seconds = self.unshared_s + shared_until - started
        # one collective for all the numbers; a NaN on any rank makes the sum NaN on all, so every rank
        # takes the same skip decision, and the mean of the ranks' times the same budget decision
        device = loss_sum.device
        totals = torch.stack([loss_sum, torch.tensor(float(tokens), device=device),
                              torch.tensor(float(save_due), device=device), torch.tensor(seconds, device=device)])
        loss_total, token_total, save_votes, seconds_total = (
            distributed.all_reduce_sum(totals, "averaging the loss").tolist())  # one sync
        mean_loss = loss_total / (accum * self.ctx.world_size)
        lr = self.optimizer.param_groups[0]["lr"]
        outcome = StepOutcome(loss=mean_loss, lr=lr, grad_norm=math.nan, tokens=int(token_total),
                              skipped=not math.isfinite(mean_loss), save_due=save_votes > 0,
                              seconds=seconds_total / self.ctx.world_size)
        if not outcome.skipped:
            self._update(outcome)
        self.optimizer.zero_grad(set_to_none=True)
        self.unshared_s = clock() - shared_until
        return outcome

    def _update(self, outcome: StepOutcome) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.config.max_grad_norm or math.inf
        # the norm is computed even without clipping: it is how inf/NaN gradients are caught
        grad_norm = fsdp.full_value(torch.nn.utils.clip_grad_norm_(self.params, max_norm)).item()
        outcome.grad_norm = grad_norm
        if self.scaler is not None:  # the scaler skips the update itself on inf gradients
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            outcome.scaler_skip = self.scaler.get_scale() < scale
        elif math.isfinite(grad_norm):
            self.optimizer.step()
        else:
            outcome.skipped = True


class _Window:
    """Running numbers between two log records."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.losses: list[float] = []
        self.tokens = 0
        self.last: StepOutcome | None = None

    def add(self, outcome: StepOutcome) -> None:
        self.tokens += outcome.tokens
        if math.isfinite(outcome.loss):
            self.losses.append(outcome.loss)
        self.last = outcome

    def tokens_per_s(self) -> float:
        return self.tokens / max(time.perf_counter() - self.start, 1e-9)

    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan

    def summary(self, counters: Counters) -> dict[str, Any]:
        last = self.last
        return {"loss": self.mean_loss(), "lr": last.lr if last else math.nan,
                "grad_norm": last.grad_norm if last else math.nan, "tokens_per_s": round(self.tokens_per_s(), 1),
                "tokens": counters.tokens, "skipped_steps": counters.skipped_steps,
                "train_minutes": round(counters.train_seconds / 60, 4)}


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _forever(batches: ResumableBatches) -> Iterator[Batch]:
    """Epoch after epoch. One empty pass is normal (a resume exactly at an epoch's end); two are not.

    Fetching leaves torch's RNG as it was: a DataLoader draws a base seed from it whenever an epoch's
    iterator starts, and a resumed run starts one at another moment than an uninterrupted run, which
    would shift every later dropout mask. Sources that need randomness must seed their own generators.
    """
    empty_passes = 0
    while True:
        iterator, produced = iter(batches), False
        while (batch := _next_keeping_rng(iterator)) is not None:
            produced = True
            yield batch
        empty_passes = 0 if produced else empty_passes + 1
        if empty_passes >= 2:
            raise ValueError("the data source yields no batches (is the data directory empty, or the "
                             "batch size larger than this rank's share with drop_last?)")


def _next_keeping_rng(iterator: Iterator[Batch]) -> Batch | None:
    state = torch.get_rng_state()
    try:
        return next(iterator, None)
    finally:
        torch.set_rng_state(state)


def count_tokens(batch: Batch) -> int:
    """Non-padding tokens of a batch (attention_mask ones; all input_ids without a mask)."""
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    if "input_ids" in batch:
        return batch["input_ids"].numel()
    return 0


def to_device(batch: Batch, device: torch.device) -> Batch:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def autocast(device: torch.device, precision: str) -> Any:
    """bf16/fp16 autocast on the device (matmuls in half precision, reductions in fp32); fp32: nothing."""
    if precision == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Run a block without moving any RNG, so that evaluating (or not) never changes the training run."""
    state = capture_rng()
    try:
        yield
    finally:
        restore_rng(state)


def _evaluate(evaluate: EvalFn | None, model: nn.Module, config: TrainConfig,
              ctx: distributed.DistContext) -> dict[str, float]:
    if evaluate is None:
        return {}
    metrics: dict[str, float] = {}
    # a sharded model's forward all-gathers parameters, so every rank must run it (rank 0's metrics count)
    if ctx.is_main or fsdp.is_sharded(model):
        device = next(model.parameters()).device
        model.eval()
        try:
            with preserved_rng(), torch.no_grad(), autocast(device, config.precision):
                metrics = {k: float(v) for k, v in evaluate(model).items()}
        finally:
            model.train()
    return distributed.broadcast_object(metrics)


def _log_run_facts(logger: RunLogger, model: nn.Module, batch: Batch | int, config: TrainConfig,
                   ctx: distributed.DistContext, step: int) -> None:
    """Once per run: the effective batch (per device x accumulation x world size) and the model size.
    `batch` is the source's batch size, or a batch to count when the source does not say (its first
    batch may be an epoch's short last one)."""
    per_device = batch if isinstance(batch, int) else len(next(iter(batch.values())))
    facts = {"per_device_batch": per_device, "grad_accum": config.grad_accum, "world_size": ctx.world_size,
             "parallel": config.parallel if ctx.distributed else "none",
             "effective_batch": per_device * config.grad_accum * ctx.world_size,
             "parameters": sum(p.numel() for p in model.parameters()), "device": str(ctx.device),
             "precision": config.precision}
    logger.log(step, "run", facts)
    logger.info(f"effective batch {facts['effective_batch']} = {per_device} per device x {config.grad_accum} "
                f"accumulation x {ctx.world_size} ranks; {facts['parameters']:,} parameters on {ctx.device}")


# ------------------------------------------------------------------------------------------------
# non-finite diagnosis
# ------------------------------------------------------------------------------------------------
def _raise_nonfinite(state: TrainState, micro_batches: list[Batch], config: TrainConfig,
                     ctx: distributed.DistContext) -> None:
    """After a checkpoint of the state at the end of the streak: name the module that went non-finite."""
    model, module = state.model, None
    for batch in micro_batches:
        found = first_nonfinite_module(model, to_device(batch, ctx.device), config.precision)
        module = module or found
        if module and not fsdp.is_sharded(model):  # sharded: every rank runs as many forwards
            break
    where = (f"the first module whose output went non-finite: {module}" if module else
             "no module output was non-finite on a re-run (the loss itself, or a non-deterministic overflow)")
    raise NonFiniteLossError(
        f"{state.counters.nonfinite_in_a_row} steps in a row (up to step {state.step}) had a non-finite loss "
        f"or gradient norm and were skipped; {where}. A checkpoint was written to {state.checkpoint}. Try a "
        f"lower learning rate or longer warm-up, bf16 instead of fp16, or look at the data of these steps.",
        module, state.checkpoint,
    )


def first_nonfinite_module(model: nn.Module, batch: Batch, precision: str = "fp32") -> str | None:
    """Re-run a forward with hooks and name the first module (in completion order) with a NaN/inf output.

    Hooks fire when a module finishes, so a child is seen before its parent: the name is the smallest
    module where things went wrong. "<input batch>" when the batch itself is not finite.
    """
    # a sharded model's ranks must all run the forward, whatever their own batch holds
    if _has_nonfinite(batch) and not fsdp.is_sharded(model):
        return "<input batch>"
    found: list[str] = []

    def hook(name: str) -> Callable[..., None]:
        def check(module: nn.Module, args: Any, output: Any) -> None:
            if not found and _has_nonfinite(output):
                found.append(name)
        return check

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules() if name]
    try:
        with torch.no_grad(), autocast(next(model.parameters()).device, precision):
            model(**batch)
    finally:
        for handle in handles:
            handle.remove()
    if _has_nonfinite(batch):
        return "<input batch>"
    return found[0] if found else None


def _has_nonfinite(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.is_floating_point() and not bool(torch.isfinite(obj).all())
    if isinstance(obj, (list, tuple)):
        return any(_has_nonfinite(x) for x in obj)
    if isinstance(obj, dict):
        return any(_has_nonfinite(x) for x in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return any(_has_nonfinite(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return False


__all__ = [
    "Batch", "EvalFn", "NonFiniteLossError", "ResumableBatches", "StepOutcome", "TrainConfig", "TrainResult",
    "autocast", "count_tokens", "first_nonfinite_module", "list_checkpoints", "preserved_rng", "to_device",
    "train",
]
