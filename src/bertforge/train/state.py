"""A run's state and its checkpoints: everything a run needs to continue bit-exactly, written atomically.

`TrainState` is what the loop carries from step to step: the step, its `Counters`, the model,
optimiser, schedule, grad scaler and data source. `state.save(run_dir)` writes it as one checkpoint
(with the process's RNG states) and `state.resume_from(path)` puts all of it back; `save_checkpoint` /
`load_checkpoint` below are the file format underneath.

One checkpoint is a directory `RUN/checkpoints/step-000123/`:

    model.safetensors   the unwrapped model's own state dict (no `module.` / `_orig_mod.` prefix)
    optimizer.pt        optimizer.state_dict(), tensors and numbers only (read with weights_only=True)
    rank-00000.pt       per rank: Python, NumPy, torch and CUDA RNG states, and that rank's data position
    trainer.json        step, world size, scheduler, grad scaler, counters, rank 0's data position,
                        and the model selection's state (best score and step, patience used) if any

The directory is filled under a temporary name and renamed into place only when every rank has
written its part, so a crash (even SIGKILL mid-write) leaves the previous checkpoints untouched and
never a half one under a real name. An FSDP run gathers its shards to rank 0 and writes the same
files, so a checkpoint resumes under FSDP, DDP or alone alike. Nothing is unpickled on load: safetensors, `torch.load(...,
weights_only=True)` and JSON only. With several nodes the run directory must be on a filesystem they
share, since every rank writes its own file into the same directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from bertforge.fileio import atomic_path, write_text_atomic
from bertforge.train import distributed, fsdp
from bertforge.train.selection import ModelSelection

FORMAT_VERSION = 1
CHECKPOINTS = "checkpoints"
_STEP_DIR = re.compile(r"^step-(\d+)$")
Batch = dict[str, torch.Tensor]


@runtime_checkable
class ResumableBatches(Protocol):
    """A source of batch dicts whose position can be saved and restored.

    `iter()` yields the rest of the current epoch, from the current position; when an epoch is
    exhausted the source moves on by itself, so the next `iter()` starts the next one (reshuffled,
    re-masked: the source's business). `state_dict()` is the position after the last batch yielded,
    in JSON types; `load_state_dict()` must seek there without producing the skipped batches.
    The loop restores torch's global RNG after every fetch, so a source that wants randomness seeds
    its own generators (a DataLoader's per-epoch draw from the global RNG is thereby harmless).
    """

    def __iter__(self) -> Iterator[Batch]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Counters:
    """Running totals of a run, carried across resumes (trainer.json's "counters")."""

    skipped_steps: int = 0  # steps whose update was not applied: non-finite loss or gradient norm
    nonfinite_in_a_row: int = 0  # the current streak of such steps
    scaler_skips: int = 0  # fp16: updates the grad scaler skipped on inf gradients (expected, rare)
    tokens: int = 0  # non-padding tokens over all ranks
    # training time of the steps so far (mean over ranks; evaluations and checkpoints not counted):
    # the clock of TrainConfig.budget_minutes. Older checkpoints lack it and resume from 0.
    train_seconds: float = 0.0

    def add(self, tokens: int, skipped: bool, scaler_skip: bool, seconds: float = 0.0) -> None:
        """Count one optimiser step, which took `seconds` of training time."""
        self.tokens += tokens
        self.train_seconds += seconds
        self.scaler_skips += int(scaler_skip)
        self.skipped_steps += int(skipped)
        self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if skipped else 0


@dataclass
class TrainState:
    """Everything of a run that changes as it trains, saved and restored as one checkpoint.

    `step` counts optimiser steps attempted (skipped ones included). The RNG states are not fields:
    they are the process's global generators, captured by `save` and put back by `resume_from`.
    """

    model: nn.Module  # the bare module (not DDP / compiled; sharded in place by FSDP is fine)
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LR scheduler
    scaler: torch.amp.GradScaler | None
    batches: ResumableBatches
    step: int = 0
    counters: Counters = field(default_factory=Counters)
    checkpoint: Path | None = None  # the last checkpoint written or resumed from
    selection: ModelSelection | None = None  # the best evaluation so far and the patience left

    def save(self, run_dir: str | os.PathLike[str], keep_last: int | None = None) -> Path:
        """Write checkpoint `step` (every rank calls this), keeping the newest `keep_last`. Returns its path."""
        self.checkpoint = save_checkpoint(
            run_dir, self.step, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
            scaler=self.scaler, data_state=self.batches.state_dict(), counters=dataclasses.asdict(self.counters),
            keep_last=keep_last, selection=self.selection.state_dict() if self.selection is not None else None)
        return self.checkpoint

    def resume_from(self, path: str | os.PathLike[str]) -> bool:
        """Continue from checkpoint `path`: weights, optimiser, schedule, scaler, data position, step,
        counters and this rank's RNG states. Returns whether the RNG states were restored, which they
        are not on another world size than the checkpoint's (the caller then reseeds)."""
        trainer = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler,
                                  scaler=self.scaler)
        self.batches.load_state_dict(trainer["data"])
        self.step, self.counters, self.checkpoint = trainer["step"], Counters(**trainer["counters"]), Path(path)
        if self.selection is not None and trainer.get("selection"):
            self.selection.load_state_dict(trainer["selection"])
        return trainer["rng_restored"]


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary and half-deleted directories are skipped)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m[1]), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and
             (p / "trainer.json").exists()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_problem(path: str | os.PathLike[str]) -> str | None:
    """Why checkpoint `path` cannot be resumed from, found without loading it; None when its files look whole.

    Reads trainer.json, the safetensors header of model.safetensors (which also checks that the file
    is as long as the header says) and the zip directory at the end of optimizer.pt and of this rank's
    file, so that a truncated or missing file (a full disk, a copy cut short) is found before any of
    the run's state is touched.
    """
    import zipfile

    from safetensors import safe_open

    path = Path(path)
    try:
        trainer = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"trainer.json: {exc}"
    if not isinstance(trainer, dict) or trainer.get("format") != FORMAT_VERSION:
        return f"trainer.json: checkpoint format {trainer.get('format') if isinstance(trainer, dict) else None!r}, " \
               f"expected {FORMAT_VERSION}"
    try:
        with safe_open(str(path / "model.safetensors"), "pt") as handle:
            handle.keys()
    except Exception as exc:  # safetensors raises its own SafetensorError, or OSError for a missing file
        return f"model.safetensors: {_one_line(exc)}"
    rank_file = f"rank-{distributed.rank():05d}.pt"
    for name in ("optimizer.pt", rank_file):
        if name == rank_file and not (path / name).exists():
            continue  # written by a run on fewer ranks: load_checkpoint copes
        try:
            with zipfile.ZipFile(path / name):
                pass
        except (OSError, zipfile.BadZipFile) as exc:
            return f"{name}: {_one_line(exc)}"
    return None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text.removeprefix("Error while deserializing header: ")


# ------------------------------------------------------------------------------------------------
# RNG states
# ------------------------------------------------------------------------------------------------
def capture_rng() -> dict[str, Any]:
    """Every RNG a training step may draw from, as tensors and numbers (safe for weights_only loading)."""
    version, mt_state, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python": {"version": version, "state": list(mt_state), "gauss": gauss},
        "numpy": {"kind": np_kind, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "gauss": float(np_gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"][: torch.cuda.device_count()])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


# ------------------------------------------------------------------------------------------------
# save
# ------------------------------------------------------------------------------------------------
def save_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler | None,
    data_state: dict[str, Any],
    counters: dict[str, Any],
    keep_last: int | None = None,
    selection: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint `step` (every rank calls this) and prune to the newest `keep_last`. Returns its path.
    With `keep_last` 2 or more the oldest are deleted before the new one is written, so that no more than
    `keep_last` are ever on disk (the newest of them whole should this write fail); with 1, after it.

    `model` is the bare module (not DDP / compiled; sharded in place by FSDP is fine). Rank 0 writes
    the shared files, every rank its own RNG and data position; the rename that publishes the
    directory happens after a barrier.
    """
    rank, world = distributed.rank(), distributed.world_size()
    root = Path(run_dir) / CHECKPOINTS
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    _check_json(data_state, "the data source's state_dict()")
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-step-*"):  # left by a crash mid-save
            shutil.rmtree(stale, ignore_errors=True)
        if keep_last and keep_last > 1:  # room first, so the disk never holds more than keep_last; with
            prune_checkpoints(run_dir, keep_last - 1)  # one, the old stays until the new is whole
        tmp.mkdir()
    distributed.barrier("creating the checkpoint directory")

    with atomic_path(tmp / f"rank-{rank:05d}.pt") as path:
        torch.save({"rng": capture_rng(), "data": data_state}, path)
    if fsdp.is_sharded(model):
        _save_sharded(tmp, model, optimizer)
    elif rank == 0:
        with atomic_path(tmp / "model.safetensors") as path:
            save_model(model, str(path))
        with atomic_path(tmp / "optimizer.pt") as path:
            torch.save(optimizer.state_dict(), path)
    if rank == 0:
        trainer = {
            "format": FORMAT_VERSION, "step": step, "world_size": world, "time": time.time(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else {},
            "counters": counters, "data": data_state,
        }
        if selection is not None:
            trainer["selection"] = selection
        # written last: list_checkpoints only trusts directories that hold it
        write_text_atomic(tmp / "trainer.json", json.dumps(trainer, indent=1) + "\n")
    distributed.barrier("writing checkpoint files")

    if rank == 0:
        _publish(tmp, final)
        if keep_last:
            prune_checkpoints(run_dir, keep_last)
    distributed.barrier("publishing the checkpoint")
    return final


def _save_sharded(tmp: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The files an unsharded run writes, from FSDP shards: every rank takes part in the gathering."""
    with distributed.raise_timeout(f"rank {distributed.rank()}: gathering FSDP shards", distributed._timeout_s()):
        model_state = fsdp.full_model_state(model)
        optimizer_state = fsdp.full_optimizer_state(model, optimizer)
    if distributed.rank() == 0:
        with atomic_path(tmp / "model.safetensors") as path:
            save_file(model_state, str(path), metadata={"format": "pt"})  # what save_model writes
        with atomic_path(tmp / "optimizer.pt") as path:
            torch.save(optimizer_state, path)


def _publish(tmp: Path, final: Path) -> None:
    """Rename the finished directory into place; fsync so the rename survives a power cut."""
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (a resumed run's last step): replace it
        old = final.with_name(f".old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)


def prune_checkpoints(run_dir: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints. A directory is renamed away before it is
    deleted, so a crash mid-delete never leaves a half checkpoint that looks complete."""
    doomed = list_checkpoints(run_dir)[:-keep_last] if keep_last > 0 else []
    for path in doomed:
        gone = path.with_name(f".del-{path.name}")
        os.replace(path, gone)
        shutil.rmtree(gone, ignore_errors=True)
    return doomed


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_json(obj: Any, what: str) -> None:
    try:
        json.dumps(obj)
    except TypeError as exc:
        raise TypeError(f"{what} must hold only JSON types (dict, list, str, int, float, bool, None): {exc}") from exc


# ------------------------------------------------------------------------------------------------
# load
# ------------------------------------------------------------------------------------------------
def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: torch.amp.GradScaler | None = None,
    restore_rng_state: bool = True,
) -> dict[str, Any]:
    """Load a checkpoint into the given objects; return trainer.json plus `data` = this rank's position.

    On the world size it was saved with, each rank gets back its own RNG states and data position.
    On another world size every rank gets rank 0's data position (which the data source must read as
    a global position) and no RNG state (`rng_restored` is False): the caller reseeds.
    """
    path = Path(path)
    trainer = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    if trainer.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {trainer.get('format')!r}, expected {FORMAT_VERSION}")
    device = next(model.parameters()).device
    if fsdp.is_sharded(model):
        _load_sharded(path, model, optimizer)
    else:
        load_model(model, path / "model.safetensors", strict=True, device=str(device))
        if optimizer is not None:
            optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(trainer["scheduler"])
    if scaler is not None and trainer["scaler"]:
        scaler.load_state_dict(trainer["scaler"])

    rank, world = distributed.rank(), distributed.world_size()
    rank_file = path / f"rank-{rank:05d}.pt"
    same_world = trainer["world_size"] == world
    trainer["rng_restored"] = False
    if same_world and rank_file.exists():
        rank_state = torch.load(rank_file, map_location="cpu", weights_only=True)
        trainer["data"] = rank_state["data"]
        if restore_rng_state:
            restore_rng(rank_state["rng"])
            trainer["rng_restored"] = True
    return trainer


def _load_sharded(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Full files -> each rank's shards; rank 0 reads them and broadcasts, the others pass empty dicts."""
    main = distributed.rank() == 0
    model_state = load_file(path / "model.safetensors") if main else {}
    optimizer_state = None
    if optimizer is not None and main:
        optimizer_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
    with distributed.raise_timeout(f"rank {distributed.rank()}: loading FSDP shards", distributed._timeout_s()):
        fsdp.load_full_state(model, optimizer, model_state, optimizer_state)
