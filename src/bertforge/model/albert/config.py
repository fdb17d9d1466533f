"""ALBERT's hyper-parameters (Lan et al., 2020), named exactly as transformers' `AlbertConfig` writes
them in config.json (`model_type: albert`), and its named sizes.

The defaults are transformers' class defaults (ALBERT-xxlarge's sizes), so that a config.json missing
a key reads the same in both libraries; the presets build the released v2 models and compact sizes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

# name -> (layers, hidden, heads, embedding size E); the feed-forward size is 4H, one layer group.
# albert-base .. albert-xxlarge are the released v2 models (xxlarge: 12 layers of 4096, 64 heads);
# the smaller ones are BERT's compact sizes (Turc et al., 2019) with factorised embeddings.
ALBERT_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "albert-tiny": (2, 128, 2, 64),
    "albert-mini": (4, 256, 4, 128),
    "albert-small": (4, 512, 8, 128),
    "albert-medium": (8, 512, 8, 128),
    "albert-base": (12, 768, 12, 128),
    "albert-large": (24, 1024, 16, 128),
    "albert-xlarge": (24, 2048, 16, 128),
    "albert-xxlarge": (12, 4096, 64, 128),
}
# What the released v2 checkpoints set unlike transformers' class defaults: nothing but the sizes,
# a 30000-piece SentencePiece vocabulary and no dropout (v2 dropped it).
RELEASED: dict[str, Any] = {"vocab_size": 30000, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@dataclass
class AlbertConfig(ModelConfig):
    """Hyper-parameters of an ALBERT encoder, named as in transformers' `AlbertConfig`.

    What differs from BERT: the embedding tables are `embedding_size` (E) wide and projected to
    `hidden_size` (H); the `num_hidden_layers` (L) layers share the weights of `num_hidden_groups` (G)
    groups, depth i running group i // (L / G); pre-training adds sentence-order prediction, and the
    sentence heads drop out at `classifier_dropout_prob`.
    """

    model_type: ClassVar[str] = "albert"
    presets: ClassVar[dict[str, tuple[int, int, int, int]]] = ALBERT_PRESETS

    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 4096
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    # The sentence heads' dropout (SOP, sequence classification, multiple choice) and the token
    # classifier's; null: hidden_dropout_prob.
    classifier_dropout_prob: float | None = 0.1
    position_embedding_type: str = "absolute"
    pad_token_id: int = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 3
    tie_word_embeddings: bool = True
    # Keys of a config.json that are not fields above (id2label, down_scale_factor, ...): kept
    # verbatim so that a config read and written again loses nothing.
    extra: dict[str, Any] = field(default_factory=dict)

    # BERT-family switches that generic code reads of any config.
    next_sentence_head: ClassVar[bool] = True  # the sentence-order head (SOP) reads the pooled [CLS]
    span_boundary_objective: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_hidden_groups",
                     "num_attention_heads", "intermediate_size", "inner_group_num", "max_position_embeddings",
                     "type_vocab_size"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                             f"({self.num_attention_heads})")
        if self.num_hidden_layers % self.num_hidden_groups:
            raise ValueError(f"num_hidden_layers ({self.num_hidden_layers}) must be a multiple of "
                             f"num_hidden_groups ({self.num_hidden_groups})")
        if self.inner_group_num != 1:
            # The key layout names a layer by one index; a group of several layers needs two.
            raise ValueError(f"inner_group_num {self.inner_group_num} is not supported "
                             "(only 1: one layer per group)")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {SUPPORTED_ACTIVATIONS}")
        if self.position_embedding_type != "absolute":
            raise ValueError(f"position_embedding_type {self.position_embedding_type!r} is not supported "
                             "(only 'absolute')")
        if not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not an id of the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        rate = self.classifier_dropout_prob
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1):
            raise ValueError(f"classifier_dropout_prob must be null or a number in [0, 1), got {rate!r}")
        if self.tie_word_embeddings is not True:
            raise ValueError("tie_word_embeddings must be true: the masked-LM decoder is the word-embedding "
                             "matrix")

    # ---- what generic code reads of any config ----
    @property
    def embedding_dim(self) -> int:
        """E: the width of the embedding tables and of the masked-LM decoder."""
        return self.embedding_size

    @property
    def hidden_groups(self) -> int:
        """G: how many distinct encoder layers are stored (one per group)."""
        return self.num_hidden_groups * self.inner_group_num

    @property
    def head_dropout(self) -> float:
        """The heads' dropout: `classifier_dropout_prob`, or hidden_dropout_prob when it is null."""
        rate = self.classifier_dropout_prob
        return self.hidden_dropout_prob if rate is None else rate

    def estimated_parameter_count(self) -> int:
        """The encoder's parameters from the sizes alone, following the rows of the key map."""
        hidden, inner, width = self.hidden_size, self.intermediate_size, self.embedding_size
        tables = self.vocab_size + self.max_position_embeddings + self.type_vocab_size
        embeddings = tables * width + 2 * width + width * hidden + hidden  # + the E -> H projection
        attention = 4 * hidden * hidden + 4 * hidden  # fused q/k/v, then the output projection
        ffn = 2 * hidden * inner + inner + hidden
        layer = attention + ffn + 4 * hidden  # + two LayerNorms
        return embeddings + self.hidden_groups * layer + hidden * hidden + hidden  # + the pooler

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> AlbertConfig:
        """A named size (`albert-tiny` .. `albert-xxlarge`), one shared layer group, optionally overridden."""
        if name not in ALBERT_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(ALBERT_PRESETS)}")
        layers, hidden, heads, width = ALBERT_PRESETS[name]
        values: dict[str, Any] = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                      embedding_size=width, intermediate_size=4 * hidden, **RELEASED)
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> AlbertConfig:
        names = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        model_type = data.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(f"{source}: model_type {model_type!r} is not {cls.model_type!r}")
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
