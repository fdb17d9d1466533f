"""RoBERTa's hyper-parameters (Liu et al., 2019), named as transformers' `RobertaConfig` writes them in
config.json, for the three model_types that share its architecture: `roberta`, `xlm-roberta` and
`camembert` (one subclass each, differing only in `model_type`, the default vocabulary and presets).

The defaults are transformers' class defaults (512 positions, 2 token types, eps 1e-12), so that a
config.json missing a key reads the same in both libraries. The released checkpoints differ from
them (514 positions, one token type, eps 1e-5); the presets build those.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

# name -> (layers, hidden, heads, vocabulary). The released sizes, and BERT's compact sizes
# (Turc et al., 2019) with RoBERTa's vocabulary; the feed-forward size is always 4H.
ROBERTA_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "roberta-tiny": (2, 128, 2, 50265),
    "roberta-mini": (4, 256, 4, 50265),
    "roberta-small": (4, 512, 8, 50265),
    "roberta-medium": (8, 512, 8, 50265),
    "roberta-base": (12, 768, 12, 50265),
    "roberta-large": (24, 1024, 16, 50265),
}
XLM_ROBERTA_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "xlm-roberta-base": (12, 768, 12, 250002),
    "xlm-roberta-large": (24, 1024, 16, 250002),
}
CAMEMBERT_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "camembert-base": (12, 768, 12, 32005),
}
# What every released checkpoint of the three has, unlike transformers' class defaults: 512 token
# positions after the padding_idx + 1 offset, one token type, and fairseq's LayerNorm epsilon.
RELEASED = {"max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5}

# config.json switches of transformers' RobertaConfig that bertforge's encoder does not implement:
# key -> the only value it accepts (checked when present in `extra`).
FIXED_SWITCHES: dict[str, Any] = {
    "is_decoder": False,  # causal (decoder) RoBERTa
    "add_cross_attention": False,  # encoder-decoder cross-attention
    "tie_word_embeddings": True,  # the masked-LM decoder is the word-embedding matrix itself
    "position_embedding_type": "absolute",  # older configs' relative-position variants
}


@dataclass
class RobertaConfig(ModelConfig):
    """Hyper-parameters of a RoBERTa encoder, named as in transformers' `RobertaConfig`.

    What differs from BERT: positions start at `pad_token_id + 1` and are counted over the non-padding
    tokens of `input_ids` (fairseq's convention), so a model with `max_position_embeddings` P takes
    at most P - pad_token_id - 1 tokens (`max_tokens`); the released models have a single token type.
    """

    model_type: ClassVar[str] = "roberta"
    presets: ClassVar[dict[str, tuple[int, int, int, int]]] = ROBERTA_PRESETS

    vocab_size: int = 50265
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    # The sentence heads' dropout; None: hidden_dropout_prob.
    classifier_dropout: float | None = None
    # Keys of a config.json that are not fields above (id2label, use_cache, ...): kept verbatim so
    # that a config read and written again loses nothing.
    extra: dict[str, Any] = field(default_factory=dict)

    # BERT-family switches that generic code reads of any config: none of them here.
    embedding_size: ClassVar[None] = None
    num_hidden_groups: ClassVar[None] = None
    next_sentence_head: ClassVar[bool] = False  # RoBERTa pre-trains with masked LM alone
    span_boundary_objective: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
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
        if self.max_tokens < 1:
            raise ValueError(f"max_position_embeddings ({self.max_position_embeddings}) leaves no position for "
                             f"a token: positions start at pad_token_id + 1 = {self.pad_token_id + 1}")
        rate = self.classifier_dropout
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate < 1):
            raise ValueError(f"classifier_dropout must be null or a number in [0, 1), got {rate!r}")
        for key, value in FIXED_SWITCHES.items():
            if key in self.extra and self.extra[key] != value:
                raise ValueError(f"{key} {self.extra[key]!r} is not supported (only {value!r})")

    @property
    def max_tokens(self) -> int:
        """The longest input: positions pad_token_id + 1 .. max_position_embeddings - 1."""
        return self.max_position_embeddings - self.pad_token_id - 1

    def estimated_parameter_count(self) -> int:
        """The encoder's parameters from the sizes alone, following the rows of the key map."""
        hidden, inner = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * hidden + 2 * hidden
        attention = 4 * hidden * hidden + 4 * hidden  # fused q/k/v, then the output projection
        ffn = 2 * hidden * inner + inner + hidden
        layer = attention + ffn + 4 * hidden  # + two LayerNorms
        return embeddings + self.num_hidden_layers * layer + hidden * hidden + hidden  # + the pooler

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> RobertaConfig:
        """A named size of this model_type (`roberta-base`, ...), with the released models' positions,
        token types and epsilon, optionally overridden."""
        if name not in cls.presets:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(cls.presets)}")
        layers, hidden, heads, vocab = cls.presets[name]
        values: dict[str, Any] = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                      intermediate_size=4 * hidden, vocab_size=vocab, **RELEASED)
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> RobertaConfig:
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
        """The config.json content: `model_type`, our fields, the kept extras."""
        out: dict[str, Any] = {"model_type": self.model_type}
        out.update({k: v for k, v in dataclasses.asdict(self).items() if k != "extra"})
        out.update(self.extra)
        return out


@dataclass
class XLMRobertaConfig(RobertaConfig):
    """XLM-RoBERTa (Conneau et al., 2020): RoBERTa's architecture, a 250k SentencePiece vocabulary."""

    model_type: ClassVar[str] = "xlm-roberta"
    presets: ClassVar[dict[str, tuple[int, int, int, int]]] = XLM_ROBERTA_PRESETS

    vocab_size: int = 30522  # transformers' XLMRobertaConfig default


@dataclass
class CamembertConfig(RobertaConfig):
    """CamemBERT (Martin et al., 2020): RoBERTa's architecture trained on French."""

    model_type: ClassVar[str] = "camembert"
    presets: ClassVar[dict[str, tuple[int, int, int, int]]] = CAMEMBERT_PRESETS

    vocab_size: int = 30522  # transformers' CamembertConfig default
