"""ELECTRA's hyper-parameters (Clark et al., 2020), named as transformers' `ElectraConfig` writes them
in config.json (`model_type: electra`), and its named sizes.

ELECTRA is BERT's post-LN encoder with embedding tables of their own width E (`embedding_size`),
projected to the hidden size H when the two differ. The same config describes both halves of the
pre-training pair: the discriminator (the model kept for fine-tuning) and the smaller generator (a
masked LM). The defaults are transformers' class defaults, the discriminator of ELECTRA-Small, so
that a config.json missing a key reads the same in both libraries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

# name -> (layers, hidden H, embedding E, heads, feed-forward I): the released checkpoints' shapes
# under their Hub names. The small generator was released at the small discriminator's shape; the
# base generator is the narrow one (H 256 on E 768 tables, which it shares with its discriminator
# in pre-training).
ELECTRA_PRESETS: dict[str, tuple[int, int, int, int, int]] = {
    "electra-small-discriminator": (12, 256, 128, 4, 1024),
    "electra-small-generator": (12, 256, 128, 4, 1024),
    "electra-base-discriminator": (12, 768, 768, 12, 3072),
    "electra-base-generator": (12, 256, 768, 4, 1024),
    "electra-large-discriminator": (24, 1024, 1024, 16, 4096),
}

# The activations the multiple-choice summary may name: the feed-forward's, and the two that
# transformers' sequence summary also knows ("linear" is none at all).
SUMMARY_ACTIVATIONS = (*SUPPORTED_ACTIVATIONS, "tanh", "linear")

# config.json switches of transformers' ElectraConfig that bertforge does not implement: key -> the
# only value accepted (checked when present in `extra`).
FIXED_SWITCHES: dict[str, Any] = {
    "is_decoder": False,  # ElectraForCausalLM
    "add_cross_attention": False,  # encoder-decoder cross-attention
    "tie_word_embeddings": True,  # the generator's output projection is the word-embedding matrix
    "summary_proj_to_labels": False,  # a summary projection onto the labels instead of H
}


@dataclass
class ElectraConfig(ModelConfig):
    """Hyper-parameters of an ELECTRA encoder (discriminator or generator), named as in transformers.

    `summary_*` shape the multiple-choice head's summary of the first token (`summary_type` "first"
    only: the other kinds read padding or need an index). `classifier_dropout` is the sentence and
    token heads' dropout (null: hidden_dropout_prob). `position_embedding_type` must be "absolute":
    the relative kinds of older transformers are not implemented.
    """

    model_type: ClassVar[str] = "electra"
    presets: ClassVar[dict[str, tuple[int, int, int, int, int]]] = ELECTRA_PRESETS

    vocab_size: int = 30522
    embedding_size: int = 128
    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 4
    intermediate_size: int = 1024
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    summary_type: str = "first"
    summary_use_proj: bool = True
    summary_activation: str | None = "gelu"
    summary_last_dropout: float = 0.1
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"
    classifier_dropout: float | None = None
    # config.json keys that are not fields (id2label, use_cache, ...): kept verbatim and written back.
    extra: dict[str, Any] = field(default_factory=dict)

    # BERT-family switches that generic code reads of any config: none of them here.
    num_hidden_groups: ClassVar[None] = None
    next_sentence_head: ClassVar[bool] = False  # pre-trained by replaced-token detection, no sentence objective
    span_boundary_objective: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {SUPPORTED_ACTIVATIONS}")
        if not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not an id of the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if self.position_embedding_type != "absolute":
            raise ValueError(f"position_embedding_type {self.position_embedding_type!r} is not supported "
                             "(only 'absolute')")
        self._check_heads()
        for key, value in FIXED_SWITCHES.items():
            if key in self.extra and self.extra[key] != value:
                raise ValueError(f"{key} {self.extra[key]!r} is not supported (only {value!r})")

    def _check_heads(self) -> None:
        """The task heads' settings: dropouts in [0, 1), the summary's kind, projection and activation."""
        for name in ("classifier_dropout", "summary_last_dropout"):
            rate = getattr(self, name)
            if rate is None and name == "classifier_dropout":
                continue
            if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1:
                raise ValueError(f"{name} must be a number in [0, 1), got {rate!r}")
        if self.summary_type != "first":
            raise ValueError(f"summary_type {self.summary_type!r} is not supported (only 'first': the "
                             "others read padding or need a classification index)")
        if not isinstance(self.summary_use_proj, bool):
            raise ValueError(f"summary_use_proj must be true or false, got {self.summary_use_proj!r}")
        if self.summary_activation is not None and self.summary_activation not in SUMMARY_ACTIVATIONS:
            raise ValueError(f"summary_activation {self.summary_activation!r} is not null or one of "
                             f"{SUMMARY_ACTIVATIONS}")

    # ---- what the rest of bertforge asks of any config ----
    @property
    def embedding_dim(self) -> int:
        """E: the width of the embedding tables (and of the generator's output projection)."""
        return self.embedding_size

    def estimated_parameter_count(self) -> int:
        """The encoder's parameters from the sizes alone, following the rows of the key map."""
        hidden, inner, width = self.hidden_size, self.intermediate_size, self.embedding_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * width + 2 * width
        project = width * hidden + hidden if width != hidden else 0
        attention = 4 * hidden * hidden + 4 * hidden  # fused q/k/v, then the output projection
        ffn = 2 * hidden * inner + inner + hidden
        layer = attention + ffn + 4 * hidden  # + two LayerNorms
        return embeddings + project + self.num_hidden_layers * layer

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ElectraConfig:
        """A released shape by its Hub name (`electra-small-discriminator`, ...), optionally overridden."""
        if name not in cls.presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(cls.presets)}")
        layers, hidden, width, heads, inner = cls.presets[name]
        values: dict[str, Any] = dict(num_hidden_layers=layers, hidden_size=hidden, embedding_size=width,
                                      num_attention_heads=heads, intermediate_size=inner)
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> ElectraConfig:
        model_type = data.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(f"{source}: model_type {model_type!r} is not {cls.model_type!r}")
        names = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in FILE_KEYS}
        try:
            return cls(**known, extra=extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The config.json content: `model_type`, the fields under transformers' names, the kept extras."""
        out: dict[str, Any] = {"model_type": self.model_type}
        out.update({k: v for k, v in dataclasses.asdict(self).items() if k != "extra"})
        out.update(self.extra)
        return out
