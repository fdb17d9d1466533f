"""What every model family's configuration shares: Hugging Face `config.json` in and out, and the
facts the rest of bertforge asks of any config.

Each family defines its own config class in its folder (`bertforge/model/<family>/config.py`),
named field for field as transformers writes that family's config.json, and registers it (see
`bertforge.model.registry`, which also picks the class by config.json's `model_type`). This module
knows no family: it holds the base class they derive from and the conventions they all follow.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bertforge.fileio import write_text_atomic

# The label of a position that is not scored (padding, specials, unmasked tokens, sub-word
# continuations): F.cross_entropy's default ignore_index, and Hugging Face's convention.
IGNORE_INDEX = -100

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

# Keys we write that are not fields; they describe the file, so they are not kept as "extra".
FILE_KEYS = frozenset({"model_type", "transformers_version", "architectures", "torch_dtype", "dtype",
                       "bertforge_note"})

_Config = TypeVar("_Config", bound="ModelConfig")


class ModelConfig:
    """The base of every family's config dataclass: config.json in and out, presets, and the facts
    generic code reads (checkpoint loading, the training loop, the tasks).

    A family's class is a dataclass deriving from this one. It sets `model_type` (config.json's
    value) and `presets` (name -> anything its `from_preset` understands), implements `from_dict` /
    `to_dict` / `from_preset`, and provides the fields and properties below under these names, as
    properties where its config.json spells them otherwise.
    """

    model_type: ClassVar[str]
    presets: ClassVar[dict[str, Any]] = {}

    # Fields every family has (read by generic code), declared here for the type checker only.
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    pad_token_id: int
    initializer_range: float
    type_vocab_size: int  # 0: no segment embeddings (token_type_ids are ignored)
    extra: dict[str, Any]  # config.json keys that are not fields (id2label, ...), kept verbatim

    # ---- to implement in each family ----
    @classmethod
    def from_dict(cls: type[_Config], data: dict[str, Any], *, source: str = "<dict>") -> _Config:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_preset(cls: type[_Config], name: str, **overrides: Any) -> _Config:
        raise NotImplementedError

    @property
    def max_tokens(self) -> int:
        """The longest input in tokens: the position table's size, unless the family's positions start
        later (RoBERTa's at pad_token_id + 1)."""
        return self.max_position_embeddings

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """E: the width of the embedding tables (H unless the family factorises them)."""
        return self.hidden_size

    @property
    def hidden_groups(self) -> int:
        """How many distinct encoder layers are stored (L unless layers are shared)."""
        return self.num_hidden_layers

    def estimated_parameter_count(self) -> int:
        """The encoder's parameter count from the sizes alone (heads add little): enough for loading to
        refuse an absurd config.json before anything is allocated."""
        raise NotImplementedError

    def transformers_incompatibilities(self) -> list[str]:
        """Why transformers cannot load this model's weights (empty when it can)."""
        return []

    def with_overrides(self: _Config, **overrides: Any) -> _Config:
        """A copy with fields replaced (and validated again)."""
        return dataclasses.replace(self, **overrides)  # type: ignore[type-var]

    # ---- config.json, the same for every family ----
    @classmethod
    def from_json_file(cls: type[_Config], path: str | os.PathLike[str]) -> _Config:
        return cls.from_dict(read_json_object(Path(path)), source=str(path))

    def to_json_file(self, path: str | os.PathLike[str], *, architectures: list[str] | None = None) -> None:
        data = self.to_dict()
        if architectures:
            data["architectures"] = architectures
        write_text_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls: type[_Config], directory: str | os.PathLike[str]) -> _Config:
        return cls.from_json_file(Path(directory) / "config.json")


def check_values(config_class: type, data: dict[str, Any], source: str) -> None:
    """Refuse, in one line naming the field, a config.json value of the wrong kind that a family's own
    checks would trip over or let through: a string where a number belongs ("hidden_size": "128"), a
    NaN or infinity, an epsilon that is not above 0, a dropout rate outside [0, 1)."""
    for field_ in dataclasses.fields(config_class):
        name, kind = field_.name, str(field_.type)
        if name not in data or data[name] is None:
            continue
        value = data[name]
        if kind == "int" and not is_int(value):
            raise ValueError(f"{source}: {name} must be an integer, got {value!r}")
        if kind.startswith("float") or kind == "int":
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{source}: {name} must be a finite number, got {value!r}")
            if name.endswith("eps") and not value > 0:
                raise ValueError(f"{source}: {name} must be a finite number above 0, got {value!r}")
            if (name.endswith("dropout") or name.endswith("dropout_prob")) and not 0 <= value < 1:
                raise ValueError(f"{source}: {name} must be a number in [0, 1), got {value!r}")
            if name == "initializer_range" and not value > 0:
                raise ValueError(f"{source}: {name} must be above 0, got {value!r}")


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON's true would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file that must hold one object; errors name the file and line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
