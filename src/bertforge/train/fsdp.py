"""FSDP (fully sharded data parallel, PyTorch's FSDP2 `fully_shard`): the option for models too big for DDP.

DDP keeps a whole copy of the parameters, gradients and optimizer state on every rank; FSDP keeps
1/W of each and all-gathers a layer's parameters just before it runs. Each encoder layer is one
unit (gathered, freed and reduce-scattered on its own), and the root unit holds the rest: the
embeddings, the pooler and the heads. The MLM decoder reads the word-embedding matrix at call time
(it is not a second parameter), so the tie lives in the root unit and needs nothing special.

Checkpoints stay the unwrapped, full format of `state.py`: the shards are gathered to rank 0 to
save, and every rank takes its shard of the full tensors to load. The optimizer's state is
converted between torch's own layout (parameters numbered in optimizer order) and the layout keyed
by parameter name that the sharded API uses, so a checkpoint moves freely between FSDP, DDP and a
single process, and between world sizes. Works on GPU (NCCL) and on CPU (gloo).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertforge.train.config import PARALLEL_MODES  # noqa: F401  (re-exported)


def is_sharded(model: nn.Module) -> bool:
    """Whether `fully_shard` was applied to the model (its parameters are then DTensor shards)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: nn.Module, device: torch.device, world_size: int) -> nn.Module:
    """Shard `model` in place over all ranks: one FSDP unit per layer of each ModuleList, then the root.

    Every rank first takes rank 0's parameters, as DDP would, since `fully_shard` keeps each rank's
    own values for its shard. Call this before the optimizer is built (the parameters become new,
    sharded objects), and best while the model is still on the CPU: each unit is moved to `device`
    as it is sharded, so the device never holds more than one unit unsharded.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    for tensor in [*model.parameters(), *model.buffers()]:
        _broadcast_from_rank0(tensor, device)
    mesh = init_device_mesh(device.type, (world_size,))
    # Units bottom-up: a layer of a ModuleList (the encoder's layers) is the natural unit of a
    # Transformer; whatever no layer owns goes to the root unit.
    for module in list(model.modules()):
        if isinstance(module, nn.ModuleList):
            for layer in module:
                fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _broadcast_from_rank0(tensor: torch.Tensor, device: torch.device) -> None:
    """Rank 0's values, in place; staged through `device` one tensor at a time (NCCL needs them there)."""
    data = tensor.data
    staged = data.to(device)  # `data` itself when it is already there
    dist.broadcast(staged, src=0)
    if staged is not data:
        data.copy_(staged)


@contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """FSDP's counterpart of DDP's `no_sync`: accumulate full gradients locally, reduce-scatter later."""
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def full_value(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's global value (a collective); any other tensor as it is. For the gradient norm."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


# ------------------------------------------------------------------------------------------------
# full state dicts for checkpoints (every rank calls these: they are collectives)
# ------------------------------------------------------------------------------------------------
def _options(**values: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **values)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model state dict, on the CPU of rank 0 (an empty dict on the other ranks)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(cpu_offload=True))
    return {name: tensor.contiguous() for name, tensor in state.items()}


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` as an unsharded optimizer would give it, on rank 0 ({} elsewhere)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_options(cpu_offload=True))
    return _numbered(by_name) if by_name else {}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    model_state: dict[str, torch.Tensor], optimizer_state: dict[str, Any] | None) -> None:
    """Give every rank its shard of full (unsharded) states; rank 0 holds them, the others pass empty dicts.

    Rank 0 broadcasts tensor by tensor, so only one rank needs the whole model in host memory.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    set_model_state_dict(model, model_state, options=_options(broadcast_from_rank0=True, strict=True))
    if optimizer is not None:
        by_name = _named(optimizer_state, _optimizer_names(model, optimizer)) if optimizer_state else {}
        set_optimizer_state_dict(model, optimizer, by_name, options=_options(broadcast_from_rank0=True))


def _optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter names in optimizer order: torch numbers parameters 0, 1, ... in this order."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [names[id(param)] for group in optimizer.param_groups for param in group["params"]]


def _numbered(by_name: dict[str, Any]) -> dict[str, Any]:
    """Name-keyed optimizer state -> torch's layout, where groups list parameters by number."""
    number: dict[str, int] = {}
    groups = []
    for group in by_name["param_groups"]:
        ids = [number.setdefault(name, len(number)) for name in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
    state = {number[name]: values for name, values in by_name["state"].items()}
    return {"state": state, "param_groups": groups}


def _named(numbered: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """torch's layout -> name-keyed (the inverse of `_numbered`), given the names in optimizer order."""
    groups = [{**group, "params": [names[i] for i in group["params"]]} for group in numbered["param_groups"]]
    state = {names[int(i)]: values for i, values in numbered["state"].items()}
    return {"state": state, "param_groups": groups}


def unsharded(model: nn.Module, build: Callable[[], nn.Module]) -> nn.Module | None:
    """The trained model as a plain module on rank 0 (for export), whether or not it was sharded.

    Unsharded: `model` itself. Sharded: every rank must call this (the shards are gathered); rank 0
    gets a fresh `build()` holding the full weights, the other ranks None.
    """
    if not is_sharded(model):
        return model
    state = full_model_state(model)
    if dist.get_rank() != 0:
        return None
    plain = build()
    plain.load_state_dict(state, strict=True)
    return plain


__all__ = ["PARALLEL_MODES", "full_model_state", "full_optimizer_state", "full_value", "is_sharded",
           "load_full_state", "no_gradient_sync", "shard", "unsharded"]
