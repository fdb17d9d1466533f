"""BertConfig: the model's hyper-parameters, named presets, and Hugging Face `config.json` in and out."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")

# (layers, hidden, heads): the BERT paper's two sizes and the compact models of Turc et al. (2019).
# The feed-forward size is always 4H.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

# Keys we write that are not fields; they describe the file, so they are not kept as "extra".
_FILE_KEYS = {"model_type", "transformers_version", "architectures", "torch_dtype", "dtype"}


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder, named as in Hugging Face's `config.json`."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # Keys of a config.json that are not fields above (id2label, classifier_dropout, ...): kept
    # verbatim so that a config read and written again loses nothing.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {SUPPORTED_ACTIVATIONS}")
        position_type = self.extra.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(f"position_embedding_type {position_type!r} is not supported (only 'absolute')")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> BertConfig:
        """A named size (`tiny`, `mini`, `small`, `medium`, `base`, `large`), optionally overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        values: dict[str, Any] = dict(
            num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> BertConfig:
        names = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"{source}: model_type {model_type!r} is not 'bert'")
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in _FILE_KEYS}
        if extra.get("position_embedding_type") == "absolute":  # the only kind we support; written back by to_dict
            del extra["position_embedding_type"]
        try:
            return cls(**known, extra=extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The config.json content: our fields, the kept extras, and `model_type`."""
        out: dict[str, Any] = {"model_type": "bert"}
        out.update({k: v for k, v in dataclasses.asdict(self).items() if k != "extra"})
        out.update(self.extra)
        out.setdefault("position_embedding_type", "absolute")
        return out

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> BertConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
        return cls.from_dict(data, source=str(path))

    def to_json_file(self, path: str | os.PathLike[str], *, architectures: list[str] | None = None) -> None:
        data = self.to_dict()
        if architectures:
            data["architectures"] = architectures
        write_text_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str]) -> BertConfig:
        return cls.from_json_file(Path(directory) / "config.json")


def resolve_config(spec: str | os.PathLike[str] | BertConfig, **overrides: Any) -> BertConfig:
    """A config from a preset name, a config.json path, a checkpoint directory, or a BertConfig."""
    if isinstance(spec, BertConfig):
        return dataclasses.replace(spec, **overrides)
    if isinstance(spec, str) and spec in PRESETS:
        return BertConfig.from_preset(spec, **overrides)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"{spec!r} is neither a preset ({', '.join(PRESETS)}) nor an existing config.json")
    config = BertConfig.from_json_file(path)
    return dataclasses.replace(config, **overrides) if overrides else config

