"""BertModel = embeddings + N encoder layers + pooler, and the base class every BERT model shares.

The base class gives each model BERT's initialisation and Hugging Face-layout save/load
(`save_pretrained` / `from_pretrained`). The file format itself lives below the model, in
`bertforge.checkpoint`, which knows no model class: the classes declare what a load needs to know
about them (`base_model_prefix`, `head_prefixes`, the `keys_*_on_load` patterns) and hand
themselves to it. Each class registers its name in `BertPreTrainedModel.registry`, so that
`bertforge.model.load_any` can build whichever class a checkpoint's config.json names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import bertforge.checkpoint as hf_checkpoint
from bertforge.checkpoint import LoadReport
from bertforge.config import BertConfig, ModelConfig
from bertforge.model.layers import Embeddings, EncoderLayer, PackedLayout

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer


# Our keys of the pooler, wherever the backbone sits.
POOLER_KEYS = r"(^|\.)pooler\."


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H): T_i, the final token vectors
    pooled_output: torch.Tensor | None  # (B, H): tanh(W C + b) over the final [CLS] vector C
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 tensors (B, T, H): embeddings, then each layer
    attentions: tuple[torch.Tensor, ...] | None = None  # L tensors (B, A, T, T): attention probabilities


class BertPreTrainedModel(nn.Module):
    """Shared by every BERT model: config, initialisation, checkpoint save/load, a class registry."""

    # Hugging Face architecture name -> class, so a checkpoint's config.json picks the class to build.
    registry: ClassVar[dict[str, type[BertPreTrainedModel]]] = {}
    # The config family (config.json's model_type) this class implements.
    model_type: ClassVar[str] = "bert"
    # (class name, another model_type) -> the class that does the same job in that family
    # (BertForSequenceClassification, "modernbert") -> ModernBertForSequenceClassification; filled
    # in by the family's module.
    counterparts: ClassVar[dict[tuple[str, str], str]] = {}

    # What loading a checkpoint needs to know of a class (see bertforge.checkpoint.Checkpointable).
    # The attribute holding the BertModel, which is also our key prefix of the backbone's weights.
    base_model_prefix: ClassVar[str] = "bert"
    # Our module names that are task heads (not the backbone): missing ones are "new", not errors.
    head_prefixes: ClassVar[tuple[str, ...]] = ()
    # Patterns of our keys a file may lack: the pooler (many encoders ship without one).
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]] = (POOLER_KEYS,)
    # Patterns of keys a file may carry that this model does not use (reported as unused).
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ()
    # Patterns of keys that repeat what this model computes: transformers' position-id buffer.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.position_ids$",)

    # What `from_pretrained` found in the file; None for a model built any other way.
    load_report: LoadReport | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        BertPreTrainedModel.registry[cls.__name__] = cls

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config

    @classmethod
    def for_config(cls, config: ModelConfig) -> type[BertPreTrainedModel]:
        """This class, or the one doing its job in `config`'s family (BertForSequenceClassification
        with a ModernBERT config: ModernBertForSequenceClassification)."""
        if config.model_type == cls.model_type:
            return cls
        name = cls.counterparts.get((cls.__name__, config.model_type))
        if name is None:
            raise ValueError(f"{cls.__name__} has no counterpart for model_type {config.model_type!r}")
        return cls.registry[name]

    def init_weights(self) -> None:
        """BERT's initialisation: weights ~ N(0, initializer_range), biases 0, LayerNorm 1 and 0."""
        self.init_modules(self)

    def init_modules(self, *modules: nn.Module) -> None:
        """Initialise just these modules (a head added on top of an initialised backbone)."""
        for module in modules:
            module.apply(self._init_module)

    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @property
    def base_model(self) -> BertModel:
        """The BertModel inside (the model itself for a BertModel), found through `base_model_prefix`."""
        return getattr(self, self.base_model_prefix) if self.base_model_prefix else self  # type: ignore[return-value]

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def save_pretrained(self, directory: str | os.PathLike[str], tokenizer: BertTokenizer | None = None) -> None:
        """Write `config.json` + `model.safetensors` (+ the tokenizer's files) in Hugging Face layout."""
        hf_checkpoint.save_pretrained(self, directory, tokenizer=tokenizer)

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike[str],
        *,
        strict: bool = True,
        allow_pickle: bool = False,
        **config_overrides: Any,
    ) -> Any:
        """Load a Hugging Face-layout BERT directory (ours or `transformers`'), heads included.

        The directory's `model_type` picks the family: a ModernBERT checkpoint loaded through a BERT
        class comes back as its ModernBERT counterpart (see `for_config`), so every caller of
        `BertForSequenceClassification.from_pretrained` also takes ModernBERT checkpoints.

        config.json is checked against the weights' shapes before anything is allocated: a field that
        disagrees, a truncated file or an absurd size raise a one-line `CheckpointError`. Keys the
        target lacks or the file lacks are sorted into expected (a new task head, pre-training heads a
        bare encoder does not use) and errors, as this class declares; errors raise `CheckpointError`
        unless `strict=False`. The sorted lists are kept on `model.load_report`. Pickle files
        (`pytorch_model.bin`) are refused unless `allow_pickle=True`, and then read with `weights_only=True`.
        """
        target = cls.for_config(hf_checkpoint.read_config(directory))
        model, report = hf_checkpoint.load_pretrained(target, directory, strict=strict, allow_pickle=allow_pickle, **config_overrides)
        model.load_report = report
        return model


class Pooler(nn.Module):
    """dense + tanh on the final [CLS] vector: the sentence representation for NSP and classification."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, last_hidden_state: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        return torch.tanh(self.dense(last_hidden_state[:, 0]))


class Encoder(nn.Module):
    """L layers deep. `layers` holds the distinct layers: all L for BERT, G with ALBERT's sharing.

    With num_hidden_groups G < L, depth i runs `layers[i // (L / G)]`: G = 1 is one layer applied L
    times, so the encoder has the parameters of one layer and the compute of L. The state dict holds
    each distinct layer once (`encoder.layers.{g}`), and gradients from every depth add up in it.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.hidden_groups))
        self.depth = config.num_hidden_layers

    def schedule(self) -> list[EncoderLayer]:
        """The layer run at each depth 0..L-1 (the same module repeats when layers are shared)."""
        repeats = self.depth // len(self.layers)
        return [self.layers[i // repeats] for i in range(self.depth)]


class BertModel(BertPreTrainedModel):
    """The bidirectional Transformer encoder: ids -> final token vectors T_i and pooled [CLS] vector.

    The config's family switches give ALBERT's factorised embeddings and cross-layer sharing and
    RoBERTa's missing segment table on this same class. Checkpoints of such models keep BERT's key
    layout but `transformers.BertModel` cannot load them (their config.json says so in
    `bertforge_note`); load them with `BertModel.from_pretrained`.
    """

    base_model_prefix = ""  # it is the backbone: its keys carry no prefix

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        # The fast path: drop padding before the encoder (see PackedLayout). Identical results on
        # real tokens; vectors at padding positions come out as zeros instead of meaningless values.
        # Off only for reference comparisons in tests.
        self.unpad = True
        # How packed tokens attend: one sequence at a time (True) or re-padded with a mask (False);
        # None: per sequence for inference on the CPU, re-padded when training or on a GPU.
        self.attention_per_sequence: bool | None = None
        # Recompute each layer's activations in backward instead of storing them: less memory for
        # long sequences or big batches, about one extra forward pass of compute.
        self.gradient_checkpointing = False
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
        token_type_ids: torch.Tensor | None = None,  # (B, T): 0 segment A, 1 segment B
        position_ids: torch.Tensor | None = None,  # (B, T); default 0..T-1
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> EncoderOutput:
        """Encode a batch. With `type_vocab_size: 0` (RoBERTa-style) there is no segment table and
        `token_type_ids` are ignored, whatever they hold: tokenizers and collators write them for every
        batch, and such a model has no way to use them ([SEP] alone separates the segments)."""
        batch, length = input_ids.shape
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {length} exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings}); truncate the input (tokenizer truncation=True)"
            )
        if self.embeddings.token_type_embeddings is None:
            token_type_ids = None
        elif token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device).unsqueeze(0)  # (1, T)

        hidden = self.embeddings(input_ids, token_type_ids, position_ids)  # (B, T, H)
        attention_bias = padding_bias(attention_mask, hidden.dtype)
        # Pack only when there is padding to drop; attention probabilities need the padded path.
        # A compiled model stays padded: packing's shapes depend on the data (one graph break per
        # batch shape), while the padded graph compiles once and fuses the element-wise work.
        layout = None
        if self.unpad and attention_bias is not None and not output_attentions and not torch.compiler.is_compiling():
            per_sequence = self.attention_per_sequence
            if per_sequence is None and torch.is_grad_enabled():
                # Training: backward through one padded SDPA call beats backward through one call per
                # sequence (a BERT-tiny pre-training step measured 20% slower per sequence).
                per_sequence = False
            layout = PackedLayout.from_mask(attention_mask, per_sequence)
            hidden = layout.pack(hidden)  # (B, T, H) -> (N, H)

        def padded(x: torch.Tensor) -> torch.Tensor:
            return layout.unpack(x) if layout is not None else x

        all_hidden = [padded(hidden)] if output_hidden_states else None
        all_attentions = [] if output_attentions else None
        for layer in self.encoder.schedule():
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                hidden, probs = checkpoint(layer, hidden, attention_bias, output_attentions, layout,
                                           use_reentrant=False)
            else:
                hidden, probs = layer(hidden, attention_bias, output_attentions, layout)
            if all_hidden is not None:
                all_hidden.append(padded(hidden))
            if all_attentions is not None:
                all_attentions.append(probs)
        hidden = all_hidden[-1] if all_hidden is not None else padded(hidden)  # (B, T, H)

        return EncoderOutput(
            last_hidden_state=hidden,
            pooled_output=self.pooler(hidden) if self.pooler is not None else None,
            hidden_states=tuple(all_hidden) if all_hidden is not None else None,
            attentions=tuple(all_attentions) if all_attentions is not None else None,
        )


def padding_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """(B, T) 1/0 mask -> (B, 1, 1, T) additive bias for the keys; None when nothing is padded.

    A large negative number rather than -inf keeps a row whose keys are all padding finite
    (softmax gives it a uniform distribution instead of NaN). Returning None for an unpadded batch
    lets SDPA pick its mask-free kernels. Under `torch.compile` the bias is always built: the
    data-dependent check would break the graph.
    """
    if attention_mask is None:
        return None
    if not torch.compiler.is_compiling() and bool(attention_mask.all()):
        return None
    keep = attention_mask[:, None, None, :].to(dtype)  # (B, 1, 1, T)
    return (1.0 - keep) * torch.finfo(dtype).min
