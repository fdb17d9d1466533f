"""DeBERTa-v2/v3's hyper-parameters (He et al., 2021; DeBERTaV3, 2023), named exactly as transformers'
`DebertaV2Config` writes them in config.json (`model_type: deberta-v2`, which v3 checkpoints use too),
and its named sizes.

The fields default to transformers' defaults (DeBERTa-v2-xlarge's shape without relative attention),
so that a config.json missing a key means what it means to transformers. The keys transformers reads
only with `getattr` (`position_buckets`, `share_att_key`, `norm_rel_ebd`, `conv_*`, `cls_dropout`)
are fields here with the same fallbacks, and are always written back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bertforge.config import FILE_KEYS, SUPPORTED_ACTIVATIONS, ModelConfig, is_int

POSITION_ATTENTION_TYPES = ("c2p", "p2c")  # content-to-position, position-to-content
CONV_ACTIVATIONS = (*SUPPORTED_ACTIVATIONS, "tanh")  # the convolution's default is tanh

# name -> (layers, hidden, heads, feed-forward): the DeBERTaV3 checkpoints' shapes. Every preset also
# takes v3's attention settings (V3_SETTINGS).
DEBERTA_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "deberta-v3-xsmall": (12, 384, 6, 1536),
    "deberta-v3-small": (6, 768, 12, 3072),
    "deberta-v3-base": (12, 768, 12, 3072),
    "deberta-v3-large": (24, 1024, 16, 4096),
}
V3_SETTINGS: dict[str, Any] = dict(
    relative_attention=True, position_buckets=256, max_relative_positions=-1, norm_rel_ebd="layer_norm",
    share_att_key=True, pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
    layer_norm_eps=1e-7, legacy=True,
)


@dataclass
class DebertaV2Config(ModelConfig):
    """Hyper-parameters of a DeBERTa-v2/v3 encoder, named as in transformers' config.json.

    What differs from BERT: attention adds to the content-to-content scores content-to-position
    (`"c2p"`) and position-to-content (`"p2c"`) terms over a table of relative-position embeddings
    (`relative_attention`), with relative distances in log buckets beyond half of `position_buckets`
    (or clamped to `max_relative_positions` without buckets); `share_att_key` projects that table with
    the content query and key projections instead of projections of its own; `norm_rel_ebd`
    ("layer_norm") normalises the table; absolute positions are added to the input only with
    `position_biased_input`; `conv_kernel_size` > 0 adds a convolution beside the first layer (v2
    xlarge/xxlarge). `legacy` picks which of transformers' two masked-LM key layouts a checkpoint has.
    """

    model_type: ClassVar[str] = "deberta-v2"
    presets: ClassVar[dict[str, tuple[int, int, int, int]]] = DEBERTA_PRESETS

    vocab_size: int = 128100
    hidden_size: int = 1536
    num_hidden_layers: int = 24
    num_attention_heads: int = 24
    intermediate_size: int = 6144
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 0
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-7
    relative_attention: bool = False
    max_relative_positions: int = -1  # < 1: max_position_embeddings
    position_buckets: int = -1  # <= 0: no log buckets (distances clamped to max_relative_positions)
    pos_att_type: list[str] | None = None  # "c2p", "p2c" (older files: one string "p2c|c2p")
    share_att_key: bool = False
    norm_rel_ebd: str = "none"  # "layer_norm" normalises the relative-position table
    position_biased_input: bool = True
    pad_token_id: int = 0
    pooler_dropout: float = 0.0
    pooler_hidden_act: str = "gelu"
    pooler_hidden_size: int | None = None  # None: hidden_size (the only size the heads can read)
    cls_dropout: float | None = None  # the sentence heads' dropout; None: hidden_dropout_prob
    conv_kernel_size: int = 0  # > 0: the convolution beside the first layer
    conv_act: str = "tanh"
    conv_groups: int = 1
    legacy: bool = True  # masked LM keys as `cls.predictions.*` (True) or `lm_predictions.lm_head.*`
    tie_word_embeddings: bool = True
    # config.json keys that are not fields (id2label, bos_token_id, ...): kept verbatim and written back.
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.pos_att_type, str):  # older files: "p2c|c2p"
            self.pos_att_type = [part.strip() for part in self.pos_att_type.lower().split("|") if part.strip()]
        if self.pooler_hidden_size is None:
            self.pooler_hidden_size = self.hidden_size
        self._check_sizes()
        self._check_attention()
        self._check_choices()

    def _check_sizes(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "conv_groups"):
            if not is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in ("type_vocab_size", "conv_kernel_size"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")
        for name in ("max_relative_positions", "position_buckets"):
            if not is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                             f"({self.num_attention_heads})")
        if not is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id!r} is not an id of the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if self.pooler_hidden_size != self.hidden_size:
            raise ValueError(f"pooler_hidden_size {self.pooler_hidden_size!r} must equal hidden_size "
                             f"({self.hidden_size}): the classifier reads the pooler's output at that width")
        if self.conv_kernel_size and not self.conv_kernel_size % 2:
            raise ValueError(f"conv_kernel_size must be odd (the convolution keeps the length), got {self.conv_kernel_size}")
        if self.conv_kernel_size and self.hidden_size % self.conv_groups:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of conv_groups ({self.conv_groups})")
        # Keys transformers reads with getattr that would change the shapes: only their default is built.
        for name, default in (("embedding_size", self.hidden_size), ("attention_head_size", self.head_dim)):
            if self.extra.get(name, default) != default:
                raise ValueError(f"{name} {self.extra[name]!r} is not supported (only {default}, "
                                 f"as hidden_size and num_attention_heads give)")

    def _check_attention(self) -> None:
        kinds = self.pos_att_type if self.pos_att_type is not None else []
        if not isinstance(kinds, list) or any(kind not in POSITION_ATTENTION_TYPES for kind in kinds):
            raise ValueError(f"pos_att_type must be a list of {' and '.join(POSITION_ATTENTION_TYPES)}, got "
                             f"{self.pos_att_type!r}")
        if self.relative_attention and self.position_buckets > 0 and self.position_buckets < 2:
            raise ValueError(f"position_buckets must be at least 2 (or <= 0 for none), got {self.position_buckets}")
        middle = self.position_buckets // 2
        if (self.relative_attention and self.position_buckets > 0
                and self.relative_span - 1 <= middle < self.max_position_embeddings - 1):
            # distances past `middle` go to log buckets scaled by log((span - 1) / middle): none if that is <= 0
            raise ValueError(f"max_relative_positions ({self.relative_span}) must exceed position_buckets / 2 + 1 "
                             f"({middle + 1}) when inputs may be longer than that")
        if not isinstance(self.norm_rel_ebd, str):
            raise ValueError(f"norm_rel_ebd must be a string such as 'layer_norm' or 'none', got {self.norm_rel_ebd!r}")

    def _check_choices(self) -> None:
        for name in ("hidden_act", "pooler_hidden_act"):
            if getattr(self, name) not in SUPPORTED_ACTIVATIONS:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {SUPPORTED_ACTIVATIONS}")
        if self.conv_act not in CONV_ACTIVATIONS:
            raise ValueError(f"conv_act {self.conv_act!r} is not one of {CONV_ACTIVATIONS}")
        for name in ("relative_attention", "share_att_key", "position_biased_input", "legacy"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.tie_word_embeddings is not True:
            raise ValueError("tie_word_embeddings must be true: the masked-LM projection is the word-embedding matrix")

    # ---- derived facts the model reads ----
    @property
    def relative_span(self) -> int:
        """The largest relative distance told apart: max_relative_positions, or the position table's size."""
        return self.max_relative_positions if self.max_relative_positions >= 1 else self.max_position_embeddings

    @property
    def position_table_half(self) -> int:
        """S: the relative-position table has 2S rows, for distances -S .. S-1 after bucketing."""
        return self.position_buckets if self.position_buckets > 0 else self.relative_span

    @property
    def relative_norm(self) -> bool:
        """Whether the relative-position table goes through a LayerNorm (`norm_rel_ebd` names layer_norm)."""
        return "layer_norm" in [part.strip() for part in self.norm_rel_ebd.lower().split("|")]

    @property
    def attention_terms(self) -> list[str]:
        """The position terms that attention adds (and that divide its scale), in a fixed order."""
        kinds = self.pos_att_type or []
        return [kind for kind in POSITION_ATTENTION_TYPES if kind in kinds]

    @property
    def classifier_dropout(self) -> float:
        return self.hidden_dropout_prob if self.cls_dropout is None else self.cls_dropout

    # ---- what the rest of bertforge asks of any config ----
    embedding_size: ClassVar[None] = None
    num_hidden_groups: ClassVar[None] = None
    next_sentence_head: ClassVar[bool] = False
    span_boundary_objective: ClassVar[bool] = False

    def estimated_parameter_count(self) -> int:
        """Tables and norms; per layer q/k/v + out (+ the position projections without shared keys),
        the feed-forward, 2 norms; the relative-position table and the convolution."""
        hidden, inner = self.hidden_size, self.intermediate_size
        tables = self.vocab_size + self.type_vocab_size + (self.max_position_embeddings if self.position_biased_input
                                                           else 0)
        count = tables * hidden + 2 * hidden
        layer = 4 * hidden * hidden + 4 * hidden + 2 * hidden * inner + inner + hidden + 4 * hidden
        if self.relative_attention and not self.share_att_key:
            layer += len(self.attention_terms) * (hidden * hidden + hidden)
        count += self.num_hidden_layers * layer
        if self.relative_attention:
            count += 2 * self.position_table_half * hidden + (2 * hidden if self.relative_norm else 0)
        if self.conv_kernel_size:
            count += hidden * hidden // self.conv_groups * self.conv_kernel_size + 3 * hidden
        return count

    # ------------------------------------------------------------------ presets
    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> DebertaV2Config:
        """A DeBERTaV3 size (`deberta-v3-xsmall`, `-small`, `-base`, `-large`) with v3's attention
        settings, optionally overridden."""
        if name not in DEBERTA_PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(DEBERTA_PRESETS)}")
        layers, hidden, heads, inner = DEBERTA_PRESETS[name]
        values: dict[str, Any] = dict(V3_SETTINGS, num_hidden_layers=layers, hidden_size=hidden,
                                      num_attention_heads=heads, intermediate_size=inner)
        values.update(overrides)
        if "hidden_size" in overrides and "pooler_hidden_size" not in overrides:
            values["pooler_hidden_size"] = None
        return cls(**values)

    def with_overrides(self, **overrides: Any) -> DebertaV2Config:
        """A copy with fields replaced; a new hidden_size brings the pooler's width along."""
        if "hidden_size" in overrides and "pooler_hidden_size" not in overrides:
            overrides = {**overrides, "pooler_hidden_size": None}
        return dataclasses.replace(self, **overrides)

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> DebertaV2Config:
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
