"""The inputs every bertforge model takes, by name and in order, and random ones shaped for a model
(for tracing an export, warming an engine, or measuring a model without text)."""

from __future__ import annotations

import torch
from torch import nn

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def is_multiple_choice(model: nn.Module) -> bool:
    return getattr(model, "job", None) == "multiple-choice"  # inputs are (B, C, T)


def sample_inputs(model: nn.Module, batch: int = 2, length: int = 16, choices: int = 2,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with some right padding (the mask path must be traced), shaped for the model."""
    config = model.config  # type: ignore[attr-defined]
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, choices, length) if is_multiple_choice(model) else (batch, length)
    ids = torch.randint(1, config.vocab_size, shape, generator=generator)
    mask = torch.ones(shape, dtype=torch.long)
    mask[-1, ..., length // 2:] = 0  # the last example padded from half way (every choice of it)
    ids = ids.masked_fill(mask == 0, config.pad_token_id)
    types = torch.zeros(shape, dtype=torch.long)
    if config.type_vocab_size > 1:
        types[..., length // 4:] = 1  # a second segment from a quarter of the way
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types * mask}
