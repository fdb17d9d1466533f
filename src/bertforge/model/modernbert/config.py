"""ModernBERT's hyper-parameters (Warner et al., 2024, "Smarter, Better, Faster, Longer"), named
exactly as transformers' `ModernBertConfig` writes them in config.json (`model_type: modernbert`),
and its named sizes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

GLOBAL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
ATTENTION_TYPES = (GLOBAL_ATTENTION, SLIDING_ATTENTION)

# name -> (layers, hidden, heads, feed-forward). modern-base is ModernBERT-base; the smaller ones keep
# its feed-forward ratio (I = 1.5 H, GeGLU) at the layer counts and widths of BERT's compact presets.
MODERN_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "modern-tiny": (2, 128, 2, 192),
    "modern-mini": (4, 256, 4, 384),
    "modern-small": (4, 512, 8, 768),
    "modern-base": (22, 768, 12, 1152),
}

# Keys transformers writes that describe the file or behaviour we do not model (flash-attention
# determinism, its sparse-prediction switch, special token ids): kept verbatim in `extra`.
_MODERN_DERIVED = {"rope_parameters", "global_rope_theta", "local_rope_theta", "global_attn_every_n_layers"}


@dataclass
class ModernBertConfig(ModelConfig):
    """Hyper-parameters of a ModernBERT encoder, named exactly as transformers' `ModernBertConfig`
    writes them in config.json (`model_type: modernbert`).

    What differs from BERT, each a field here: rotary position embeddings (no position table) with
    one base for global layers (`global_rope_theta`) and one for local layers (`local_rope_theta`);
    a GeGLU feed-forward (`intermediate_size` is the width after gating); pre-norm layers with a
    norm after the embeddings and a final norm; no biases in linears (`attention_bias`, `mlp_bias`)
    or norms (`norm_bias`) except the tied decoder's (`decoder_bias`); a per-layer attention type
    (`layer_types`: "full_attention", or "sliding_attention" over `local_attention` tokens, half on
    each side); no token-type embeddings. config.json spells the two rotary bases as
    `rope_parameters` (transformers 5); the older `global_rope_theta` / `local_rope_theta` and
    `global_attn_every_n_layers` keys are read too.
    """

    model_type: ClassVar[str] = "modernbert"
    presets: ClassVar[dict[str, tuple[int, int, int, int]]] = MODERN_PRESETS

    vocab_size: int = 50368
    hidden_size: int = 768
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    num_attention_heads: int = 12
    hidden_activation: str = "gelu"
    max_position_embeddings: int = 8192
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    norm_eps: float = 1e-5
    norm_bias: bool = False
    pad_token_id: int = 50283
    attention_bias: bool = False
    attention_dropout: float = 0.0
    # One entry per layer; None: global every third layer (0, 3, 6, ...), sliding elsewhere.
    layer_types: list[str] | None = None
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    local_attention: int = 128  # the sliding window: local_attention / 2 tokens on each side
    embedding_dropout: float = 0.0
    mlp_bias: bool = False
    mlp_dropout: float = 0.0
    decoder_bias: bool = True
    classifier_pooling: str = "cls"  # "cls" or "mean": what the sentence heads read
    classifier_dropout: float = 0.0
    classifier_bias: bool = False
    classifier_activation: str = "gelu"
    tie_word_embeddings: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "local_attention"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                             f"({self.num_attention_heads})")
        if not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not an id of the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if self.head_dim % 2:
            raise ValueError(f"hidden_size / num_attention_heads = {self.head_dim} is odd: rotary position "
                             "embeddings rotate pairs of dimensions, so the head size must be even")
        if self.local_attention % 2:
            raise ValueError(f"local_attention must be even (local_attention / 2 tokens on each side), "
                             f"got {self.local_attention}")
        for name in ("hidden_activation", "classifier_activation"):
            if getattr(self, name) not in SUPPORTED_ACTIVATIONS:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {SUPPORTED_ACTIVATIONS}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")
        if self.tie_word_embeddings is not True:
            raise ValueError("tie_word_embeddings must be true: the masked-LM decoder is the word-embedding matrix")
        for name in ("norm_bias", "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.layer_types is None:
            every = self.extra.pop("global_attn_every_n_layers", 3)
            if not is_int(every) or every <= 0:
                raise ValueError(f"global_attn_every_n_layers must be a positive integer, got {every!r}")
            self.layer_types = [SLIDING_ATTENTION if i % every else GLOBAL_ATTENTION
                                for i in range(self.num_hidden_layers)]
        self._check_layer_types()

    def _check_layer_types(self) -> None:
        if not isinstance(self.layer_types, list):
            raise ValueError(f"layer_types must be a list of {' or '.join(ATTENTION_TYPES)}, got {self.layer_types!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for num_hidden_layers "
                             f"{self.num_hidden_layers}")
        for index, kind in enumerate(self.layer_types):
            if kind not in ATTENTION_TYPES:
                raise ValueError(f"layer_types[{index}]: unknown attention type {kind!r} "
                                 f"(expected {' or '.join(ATTENTION_TYPES)})")

    # ---- what the rest of bertforge asks of any config (head_dim, embedding_dim and hidden_groups:
    # ModelConfig's defaults) ----
    @property
    def half_window(self) -> int:
        """How many tokens a sliding-window layer sees on each side of a token."""
        return self.local_attention // 2

    type_vocab_size: ClassVar[int] = 0  # no token-type embeddings: token_type_ids are ignored
    embedding_size: ClassVar[None] = None
    num_hidden_groups: ClassVar[None] = None
    next_sentence_head: ClassVar[bool] = False
    span_boundary_objective: ClassVar[bool] = False

    def estimated_parameter_count(self) -> int:
        """Token table; per layer q/k/v + out, GeGLU (2I in, I out), 2 norms; the head."""
        hidden, inner = self.hidden_size, self.intermediate_size
        layer = 4 * hidden * hidden + 3 * hidden * inner + 2 * hidden
        return self.vocab_size * hidden + self.num_hidden_layers * layer + 4 * hidden * hidden

    def with_overrides(self, **overrides: Any) -> ModernBertConfig:
        """A copy with fields replaced; a layer count given without `layer_types` takes the default
        pattern (global every third layer) rather than a list of the old length."""
        if "num_hidden_layers" in overrides and "layer_types" not in overrides:
            overrides = {**overrides, "layer_types": None}
        return dataclasses.replace(self, **overrides)

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModernBertConfig:
        """A named size (`modern-tiny`, `modern-mini`, `modern-small`, `modern-base`), optionally overridden."""
        if name not in MODERN_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(MODERN_PRESETS)}")
        layers, hidden, heads, inner = MODERN_PRESETS[name]
        values: dict[str, Any] = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                      intermediate_size=inner)
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> ModernBertConfig:
        names = {f.name for f in dataclasses.fields(cls) if f.name != "extra"}
        model_type = data.get("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(f"{source}: model_type {model_type!r} is not {cls.model_type!r}")
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k not in FILE_KEYS and k not in _MODERN_DERIVED}
        try:
            known.update(_rope_thetas(data))
            if "global_attn_every_n_layers" in data and data.get("layer_types") is None:
                extra["global_attn_every_n_layers"] = data["global_attn_every_n_layers"]
            return cls(**known, extra=extra)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{source}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The config.json content, as transformers 5 writes it (`rope_parameters` per attention type)."""
        out: dict[str, Any] = {"model_type": self.model_type}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k != "extra"}
        thetas = {GLOBAL_ATTENTION: values.pop("global_rope_theta"), SLIDING_ATTENTION: values.pop("local_rope_theta")}
        out.update(values)
        out["rope_parameters"] = {kind: {"rope_theta": theta, "rope_type": "default"} for kind, theta in thetas.items()}
        out.update(self.extra)
        return out



def _rope_thetas(data: dict[str, Any]) -> dict[str, float]:
    """The two rotary bases, from transformers 5's `rope_parameters` or the older top-level keys."""
    thetas: dict[str, float] = {}
    for key in ("global_rope_theta", "local_rope_theta"):
        if key in data:
            thetas[key] = data[key]
    rope = data.get("rope_parameters")
    if rope is None:
        return thetas
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters must be an object keyed by attention type, got {rope!r}")
    for kind, name in ((GLOBAL_ATTENTION, "global_rope_theta"), (SLIDING_ATTENTION, "local_rope_theta")):
        params = rope.get(kind)
        if params is None:
            continue
        if not isinstance(params, dict):
            raise ValueError(f"rope_parameters.{kind} must be an object, got {params!r}")
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"rope_parameters.{kind}.rope_type {params['rope_type']!r} is not supported "
                             "(only 'default' rotary embeddings)")
        if "rope_theta" in params:
            thetas[name] = params["rope_theta"]
    return thetas
