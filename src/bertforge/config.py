"""The models' hyper-parameters, named presets, and Hugging Face `config.json` in and out.

Two families, told apart by config.json's `model_type`: `BertConfig` ("bert": BERT and the switches
that give RoBERTa, ALBERT and SpanBERT) and `ModernBertConfig` ("modernbert": ModernBERT's rotary,
GeGLU, pre-norm encoder with alternating global and sliding-window attention). Each keeps
transformers' field names, so one config.json reads the same in both libraries.
`config_from_dict` / `read_config_file` pick the class by `model_type`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bertforge.fileio import write_text_atomic

# The label of a position that is not scored (padding, specials, unmasked tokens, sub-word
# continuations): F.cross_entropy's default ignore_index, and Hugging Face's convention.
IGNORE_INDEX = -100

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
_FILE_KEYS = {"model_type", "transformers_version", "architectures", "torch_dtype", "dtype", "bertforge_note"}

# The BERT-family switches and their "plain BERT" values. A switch is written to config.json only when
# it is on, so a plain BERT's config.json is exactly what it was before the switches existed.
FAMILY_DEFAULTS: dict[str, Any] = {
    "embedding_size": None,
    "num_hidden_groups": None,
    "next_sentence_head": True,
    "span_boundary_objective": False,
    "max_span_length": 10,
}


_Config = TypeVar("_Config", bound="_ConfigFile")


class _ConfigFile:
    """config.json in and out, the same for every model family (each defines to_dict / from_dict)."""

    @classmethod
    def from_json_file(cls: type[_Config], path: str | os.PathLike[str]) -> _Config:
        return cls.from_dict(_read_json_object(Path(path)), source=str(path))  # type: ignore[attr-defined]

    def to_json_file(self, path: str | os.PathLike[str], *, architectures: list[str] | None = None) -> None:
        data = self.to_dict()  # type: ignore[attr-defined]
        if architectures:
            data["architectures"] = architectures
        write_text_atomic(Path(path), json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_pretrained(cls: type[_Config], directory: str | os.PathLike[str]) -> _Config:
        return cls.from_json_file(Path(directory) / "config.json")


@dataclass
class BertConfig(_ConfigFile):
    """Hyper-parameters of a BERT encoder, named as in Hugging Face's `config.json`."""

    model_type: ClassVar[str] = "bert"

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
            if not _is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if not _is_int(self.type_vocab_size) or self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be 0 (no segment embeddings) or more, got {self.type_vocab_size!r}")
        for name in ("embedding_size", "num_hidden_groups"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or null, got {value!r}")
        if self.num_hidden_layers % self.hidden_groups:
            raise ValueError(f"num_hidden_layers ({self.num_hidden_layers}) must be a multiple of "
                             f"num_hidden_groups ({self.num_hidden_groups})")
        for name in ("next_sentence_head", "span_boundary_objective"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """E: the width of the embedding tables and of the MLM decoder (H unless factorised)."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def hidden_groups(self) -> int:
        """G: how many distinct encoder layers are stored (L unless layers are shared)."""
        return self.num_hidden_layers if self.num_hidden_groups is None else self.num_hidden_groups

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
        extra = {k: v for k, v in data.items() if k not in names and k not in _FILE_KEYS}
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



def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ------------------------------------------------------------------------------------------------
# ModernBERT (Warner et al., 2024, "Smarter, Better, Faster, Longer")
# ------------------------------------------------------------------------------------------------
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
class ModernBertConfig(_ConfigFile):
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
            if not _is_int(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                             f"({self.num_attention_heads})")
        if not _is_int(self.pad_token_id) or not 0 <= self.pad_token_id < self.vocab_size:
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
            if not _is_int(every) or every <= 0:
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

    # ---- what the rest of bertforge asks of any config ----
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def half_window(self) -> int:
        """How many tokens a sliding-window layer sees on each side of a token."""
        return self.local_attention // 2

    type_vocab_size: ClassVar[int] = 0  # no token-type embeddings: token_type_ids are ignored
    embedding_size: ClassVar[None] = None
    num_hidden_groups: ClassVar[None] = None
    next_sentence_head: ClassVar[bool] = False
    span_boundary_objective: ClassVar[bool] = False

    @property
    def embedding_dim(self) -> int:
        return self.hidden_size

    @property
    def hidden_groups(self) -> int:
        return self.num_hidden_layers

    def transformers_incompatibilities(self) -> list[str]:
        return []

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
        extra = {k: v for k, v in data.items() if k not in names and k not in _FILE_KEYS and k not in _MODERN_DERIVED}
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


ModelConfig = BertConfig | ModernBertConfig  # either family


def resolve_config(spec: str | os.PathLike[str] | BertConfig | ModernBertConfig,
                   **overrides: Any) -> BertConfig | ModernBertConfig:
    """A config from a preset name, a config.json path, a checkpoint directory, or a config object."""
    if isinstance(spec, (BertConfig, ModernBertConfig)):
        return _replace(spec, overrides)
    if isinstance(spec, str) and spec in PRESETS:
        return BertConfig.from_preset(spec, **overrides)
    if isinstance(spec, str) and spec in MODERN_PRESETS:
        return ModernBertConfig.from_preset(spec, **overrides)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"{spec!r} is neither a preset ({', '.join([*PRESETS, *MODERN_PRESETS])}) "
                         "nor an existing config.json")
    config = read_config_file(path)
    return _replace(config, overrides) if overrides else config


def _replace(config: BertConfig | ModernBertConfig, overrides: dict[str, Any]) -> BertConfig | ModernBertConfig:
    """A copy with fields replaced; a ModernBERT layer count given without `layer_types` takes the
    default pattern (global every third layer) rather than a list of the old length."""
    if isinstance(config, ModernBertConfig) and "num_hidden_layers" in overrides and "layer_types" not in overrides:
        overrides = {**overrides, "layer_types": None}
    return dataclasses.replace(config, **overrides)


def config_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> BertConfig | ModernBertConfig:
    """The config class `model_type` names (BERT when absent), read from config.json's content."""
    model_type = data.get("model_type", "bert")
    if model_type == ModernBertConfig.model_type:
        return ModernBertConfig.from_dict(data, source=source)
    return BertConfig.from_dict(data, source=source)


def read_config_file(path: str | os.PathLike[str]) -> BertConfig | ModernBertConfig:
    """A config.json of either family (see `config_from_dict`)."""
    return config_from_dict(_read_json_object(Path(path)), source=str(path))


def _read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
