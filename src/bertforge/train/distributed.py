"""Distributed set-up on PyTorch's own engine: torchrun's environment, DDP or FSDP, rank helpers, timeouts.

Launch the same entry point with `torchrun --nproc-per-node N ...` (add `--nnodes/--rdzv-*` for
several machines). torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; without
them everything here degrades to a single process, so the loop has one code path.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from bertforge.train.config import DEFAULT_TIMEOUT_S

T = TypeVar("T")

_TIMEOUT_S = [DEFAULT_TIMEOUT_S]  # the timeout init_distributed gave the group, for messages


class DistributedTimeout(RuntimeError):
    """Another rank did not answer in time: it crashed, hangs, or the ranks disagree on what to do."""


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join the process group that torchrun describes in the environment (or run alone without one).

    NCCL on GPU, gloo on CPU. Each rank uses GPU LOCAL_RANK. `timeout_s` bounds every collective and
    the rendezvous, so a dead rank ends the others with `DistributedTimeout` instead of a silent hang.
    """
    from bertforge.devices import check_device

    check_device(device)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    use_cuda = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device(device or "cpu")
    _TIMEOUT_S[0] = timeout_s
    if world_size > 1 and not dist.is_initialized():
        with raise_timeout(f"rank {rank}: joining the process group of {world_size} ranks", timeout_s):
            dist.init_process_group(
                backend="nccl" if use_cuda else "gloo",
                rank=rank, world_size=world_size,
                timeout=datetime.timedelta(seconds=timeout_s),
                device_id=dev if use_cuda else None,
            )
    return DistContext(rank, world_size, local_rank, dev, timeout_s)


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def raise_timeout(what: str, timeout_s: float) -> Iterator[None]:
    """Turn a backend's timeout error (worded differently by gloo, NCCL and the store) into one clear message."""
    try:
        yield
    except (RuntimeError, dist.DistError) as exc:
        text = str(exc).lower()
        if "timed out" in text or "timeout" in text or "connection closed" in text or "connection reset" in text:
            raise DistributedTimeout(
                f"{what}: no answer from the other ranks within {timeout_s:g}s. Another rank has probably "
                f"crashed or is stuck (look at its log first); a slow start or checkpoint write may need a "
                f"larger timeout (train.dist_timeout_s). Backend said: {str(exc).splitlines()[0]}"
            ) from exc
        raise


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier(what: str = "barrier") -> None:
    if dist.is_initialized():
        with raise_timeout(f"rank {rank()}: {what}", _timeout_s()):
            dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, what: str = "all-reduce") -> torch.Tensor:
    """Sum a tensor over ranks, in place (a no-op alone)."""
    if dist.is_initialized():
        with raise_timeout(f"rank {rank()}: {what}", _timeout_s()):
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank `src`'s small Python object on every rank (metadata such as a checkpoint path)."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    with raise_timeout(f"rank {rank()}: broadcast", _timeout_s()):
        dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T) -> list[T]:
    """Every rank's small Python object, in rank order, on every rank ([obj] alone)."""
    if not dist.is_initialized():
        return [obj]
    found: list[T] = [obj] * dist.get_world_size()
    with raise_timeout(f"rank {rank()}: all-gather", _timeout_s()):
        dist.all_gather_object(found, obj)
    return found


def wrap_ddp(model: nn.Module, ctx: DistContext, find_unused: bool = False) -> nn.Module:
    """DDP over the model (a no-op alone). DDP broadcasts rank 0's parameters, so every rank starts equal."""
    if not ctx.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    with raise_timeout(f"rank {ctx.rank}: wrapping the model in DDP", ctx.timeout_s):
        return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused)


def shard_fsdp(model: nn.Module, ctx: DistContext) -> nn.Module:
    """FSDP over the model, in place (a no-op alone): see `bertforge.train.fsdp`. Before the optimizer."""
    if not ctx.distributed:
        return model
    from bertforge.train.fsdp import shard

    with raise_timeout(f"rank {ctx.rank}: sharding the model with FSDP", ctx.timeout_s):
        return shard(model, ctx.device, ctx.world_size)


def no_sync(model: nn.Module, skip: bool) -> Callable[[], object]:
    """No gradient communication for micro-batches before the last of an accumulation: DDP's `no_sync`,
    FSDP's `set_requires_gradient_sync(False)`; nothing to do alone."""
    if not skip:
        return _nothing
    if hasattr(model, "no_sync"):
        return model.no_sync
    if hasattr(model, "set_requires_gradient_sync"):
        from bertforge.train.fsdp import no_gradient_sync

        return partial(no_gradient_sync, model)
    return _nothing


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _timeout_s() -> float:
    return _TIMEOUT_S[0]
