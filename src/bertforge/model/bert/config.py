"""BERT's hyper-parameters (config.json's `model_type: bert`) and its named sizes.

One class covers BERT and the switches that give RoBERTa-, ALBERT- and SpanBERT-style models
(see FAMILY_DEFAULTS); field names are transformers' BertConfig's, so one config.json reads the
same in both libraries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

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

# The BERT-family switches and their "plain BERT" values. A switch is written to config.json only when
# it is on, so a plain BERT's config.json is exactly what it was before the switches existed.
FAMILY_DEFAULTS: dict[str, Any] = {
    "embedding_size": None,
    "num_hidden_groups": None,
    "next_sentence_head": True,
    "span_boundary_objective": False,
    "max_span_length": 10,
    "is_decoder": False,
}


@dataclass
class BertConfig(ModelConfig):
    """Hyper-parameters of a BERT encoder, named as in Hugging Face's `config.json`."""

    model_type: ClassVar[str] = "bert"
    presets: ClassVar[dict[str, tuple[int, int, int]]] = PRESETS

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
    # ---- BERT-family switches (plain BERT when left alone; see FAMILY_DEFAULTS) ----
    # ALBERT factorised embeddings: the word/position/segment tables are E = embedding_size wide, with
    # LayerNorm on E, then a Linear E -> H. None: E = H and no projection (BERT).
    embedding_size: int | None = None
    # ALBERT cross-layer sharing: G distinct layers serve all L; layer i runs group i // (L / G).
    # None: G = L (no sharing); 1: one set of layer weights applied L times. L must be a multiple of G.
    num_hidden_groups: int | None = None
    # RoBERTa: `type_vocab_size: 0` (above) means no segment table; token_type_ids are then ignored.
    # BertForPreTraining's sentence-pair classifier (NSP or SOP) and the pooler it reads. False for
    # RoBERTa / SpanBERT-style pre-training with no sentence objective.
    next_sentence_head: bool = True
    # SpanBERT span-boundary objective on the pre-training models, with relative positions 0..max_span_length-1.
    span_boundary_objective: bool = False
    max_span_length: int = 10
    # Causal self-attention (transformers' name, under which BertModel applies the same mask): each
    # token attends to itself and the tokens before it, in every layer and head, in pre-training and
    # in every fine-tuning head. The left-to-right LM of the BERT paper's "LTR & No NSP" ablation
    # (`pretrain` objective ltr sets it); sentence heads then read the last real token, not [CLS].
    is_decoder: bool = False
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
                     "intermediate_size", "max_position_embeddings", "max_span_length"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not is_int(self.type_vocab_size) or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be 0 (no segment embeddings) or more, got {self.type_vocab_size!r}")
        for name in ("embedding_size", "num_hidden_groups"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or null, got {value!r}")
        if self.num_hidden_layers % self.hidden_groups:
            raise ValueError(f"num_hidden_layers ({self.num_hidden_layers}) must be a multiple of "
                             f"num_hidden_groups ({self.num_hidden_groups})")
        if self.extra.get("add_cross_attention"):
            # transformers' encoder-decoder variant: a cross-attention block per layer that this
            # encoder does not have (its weights would load nowhere)
            raise ValueError("add_cross_attention true is not supported (a decoder with cross-attention)")
        for name in ("next_sentence_head", "span_boundary_objective", "is_decoder"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def embedding_dim(self) -> int:
        """E: the width of the embedding tables and of the MLM decoder (H unless factorised)."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def hidden_groups(self) -> int:
        """G: how many distinct encoder layers are stored (L unless layers are shared)."""
        return self.num_hidden_layers if self.num_hidden_groups is None else self.num_hidden_groups

    def estimated_parameter_count(self) -> int:
        """The encoder's parameters from the sizes alone, following the rows of the key map."""
        hidden, inner, width = self.hidden_size, self.intermediate_size, self.embedding_dim
        tables = self.vocab_size + self.max_position_embeddings + self.type_vocab_size
        embeddings = tables * width + 2 * width
        if self.embedding_size is not None:
            embeddings += width * hidden + hidden  # the E -> H projection
        attention = 4 * hidden * hidden + 4 * hidden  # fused q/k/v, then the output projection
        ffn = 2 * hidden * inner + inner + hidden
        layer = attention + ffn + 4 * hidden  # + two LayerNorms
        return embeddings + self.hidden_groups * layer + hidden * hidden + hidden  # + the pooler

    def transformers_incompatibilities(self) -> list[str]:
        """Why `transformers.BertModel` cannot load this model's weights (empty for a plain BERT).

        Sharing stores G < L layers (transformers would initialise the others at random), factorised
        embeddings have other shapes plus a projection, and no segment table leaves transformers'
        token-type embedding uninitialised. Such checkpoints load only in bertforge.
        """
        reasons = []
        if self.embedding_size is not None:
            reasons.append(f"factorised embeddings (embedding_size {self.embedding_size} + a projection to "
                           f"{self.hidden_size})")
        if self.hidden_groups != self.num_hidden_layers:
            reasons.append(f"cross-layer sharing (num_hidden_groups {self.hidden_groups} for "
                           f"{self.num_hidden_layers} layers)")
        if self.type_vocab_size == 0:
            reasons.append("no segment embeddings (type_vocab_size 0)")
        return reasons

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
        extra = {k: v for k, v in data.items() if k not in names and k not in FILE_KEYS}
        if extra.get("position_embedding_type") == "absolute":  # the only kind we support; written back by to_dict
            del extra["position_embedding_type"]
        try:
            return cls(**known, extra=extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The config.json content: our fields, the kept extras, and `model_type`.

        Family switches appear only when on. A model that `transformers.BertModel` cannot load (see
        `transformers_incompatibilities`) still says `model_type: bert`, since that is the layout of
        its keys, and gets a `bertforge_note` saying why transformers cannot load it.
        """
        out: dict[str, Any] = {"model_type": "bert"}
        out.update({k: v for k, v in dataclasses.asdict(self).items()
                    if k != "extra" and not (k in FAMILY_DEFAULTS and v == FAMILY_DEFAULTS[k])})
        out.update(self.extra)
        out.setdefault("position_embedding_type", "absolute")
        reasons = self.transformers_incompatibilities()
        if reasons:
            out["bertforge_note"] = ("transformers.BertModel cannot load these weights: " + "; ".join(reasons)
                                     + ". Load them with bertforge (BertModel.from_pretrained).")
        return out
