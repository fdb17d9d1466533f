"""DistilBERT's hyper-parameters (Sanh et al., 2019), named exactly as transformers' `DistilBertConfig`
writes them in config.json (`model_type: distilbert`), and its named sizes.

DistilBERT spells BERT's sizes its own way (`dim`, `n_layers`, `n_heads`, `hidden_dim`, `activation`,
`dropout`, `attention_dropout`). The rest of bertforge reads every config under BERT's names, so
they are properties here; the fixed facts (LayerNorm epsilon 1e-12, no segment table) are class
constants. `from_preset` and `with_overrides` take either spelling.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

# name -> (layers, hidden, heads); the feed-forward size is 4H. distil-base is distilbert-base
# (BERT-base's width at half its depth); the smaller ones are BERT's compact sizes at DistilBERT's
# depth ratio.
DISTIL_PRESETS: dict[str, tuple[int, int, int]] = {
    "distil-tiny": (2, 128, 2),
    "distil-mini": (3, 256, 4),
    "distil-small": (4, 512, 8),
    "distil-base": (6, 768, 12),
}

# BERT's name for a size -> DistilBERT's field. transformers' `attribute_map` reads the first three
# from config.json too; all of them are accepted by `from_preset` and `with_overrides`.
BERT_NAMES: dict[str, str] = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "hidden_act": "activation",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}
_ATTRIBUTE_MAP = ("hidden_size", "num_hidden_layers", "num_attention_heads")  # what transformers maps on read


@dataclass
class DistilBertConfig(ModelConfig):
    """Hyper-parameters of a DistilBERT encoder, named as in transformers' config.json.

    The architecture is BERT's post-LN encoder without token types and without a pooler; positions
    are learnt, or fixed sinusoids with `sinusoidal_pos_embds`. The task heads have their own
    dropouts: `seq_classif_dropout` (sequence classification and multiple choice), `qa_dropout`.
    """

    model_type: ClassVar[str] = "distilbert"
    presets: ClassVar[dict[str, tuple[int, int, int]]] = DISTIL_PRESETS

    vocab_size: int = 30522
    max_position_embeddings: int = 512
    sinusoidal_pos_embds: bool = False
    n_layers: int = 6
    n_heads: int = 12
    dim: int = 768
    hidden_dim: int = 3072
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    initializer_range: float = 0.02
    qa_dropout: float = 0.1
    seq_classif_dropout: float = 0.2
    pad_token_id: int = 0
    tie_word_embeddings: bool = True
    # config.json keys that are not fields (id2label, eos_token_id, older files' tie_weights_, ...):
    # kept verbatim and written back.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_position_embeddings", "n_layers", "n_heads", "dim", "hidden_dim"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of n_heads ({self.n_heads})")
        if self.activation not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r} is not one of {SUPPORTED_ACTIVATIONS}")
        if not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not an id of the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if not isinstance(self.sinusoidal_pos_embds, bool):
            raise ValueError(f"sinusoidal_pos_embds must be true or false, got {self.sinusoidal_pos_embds!r}")
        # The masked-LM projection is the word-embedding matrix itself (older files say tie_weights_).
        if self.tie_word_embeddings is not True or self.extra.get("tie_weights_", True) is not True:
            raise ValueError("tie_word_embeddings must be true: the masked-LM projection is the word-embedding matrix")

    # ---- what the rest of bertforge asks of any config, under BERT's names ----
    layer_norm_eps: ClassVar[float] = 1e-12  # fixed in DistilBERT, not a config.json key
    type_vocab_size: ClassVar[int] = 0  # no segment table: token_type_ids are ignored
    embedding_size: ClassVar[None] = None
    num_hidden_groups: ClassVar[None] = None
    next_sentence_head: ClassVar[bool] = False
    span_boundary_objective: ClassVar[bool] = False

    @property
    def hidden_size(self) -> int:
        return self.dim

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    @property
    def intermediate_size(self) -> int:
        return self.hidden_dim

    @property
    def hidden_act(self) -> str:
        return self.activation

    @property
    def hidden_dropout_prob(self) -> float:
        return self.dropout

    @property
    def attention_probs_dropout_prob(self) -> float:
        return self.attention_dropout

    def estimated_parameter_count(self) -> int:
        """Word and position tables and their norm; per layer q/k/v + out, the feed-forward, 2 norms."""
        hidden, inner = self.dim, self.hidden_dim
        embeddings = (self.vocab_size + self.max_position_embeddings) * hidden + 2 * hidden
        layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * inner + inner + hidden + 4 * hidden
        return embeddings + self.n_layers * layer

    def with_overrides(self, **overrides: Any) -> DistilBertConfig:
        """A copy with fields replaced, under DistilBERT's names or BERT's (`hidden_size` sets `dim`)."""
        return dataclasses.replace(self, **_own_names(overrides))

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> DistilBertConfig:
        """A named size (`distil-tiny`, `distil-mini`, `distil-small`, `distil-base`), optionally overridden."""
        if name not in DISTIL_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(DISTIL_PRESETS)}")
        layers, hidden, heads = DISTIL_PRESETS[name]
        values: dict[str, Any] = dict(n_layers=layers, dim=hidden, n_heads=heads, hidden_dim=4 * hidden)
        values.update(_own_names(overrides))
        return cls(**values)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> DistilBertConfig:
        model_type = data.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(f"{source}: model_type {model_type!r} is not {cls.model_type!r}")
        names = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        data = dict(data)
        for bert_name in _ATTRIBUTE_MAP:  # read as transformers reads them, unless the own name is there too
            if bert_name in data and BERT_NAMES[bert_name] not in data:
                data[BERT_NAMES[bert_name]] = data.pop(bert_name)
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


def _own_names(values: dict[str, Any]) -> dict[str, Any]:
    """Overrides with BERT's names of the sizes replaced by DistilBERT's (a name given both ways is an error)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        own = BERT_NAMES.get(name, name)
        if own in out:
            raise ValueError(f"{own} is given twice (as {own} and as {name})")
        out[own] = value
    return out
