"""BertModel = embeddings + N encoder layers + pooler, and the base class every BERT model shares.

`BertPreTrainedModel` declares what the generic base class and the checkpoint code need to know
of this family: its config class, its key layout (`keys.py`), where the backbone sits (`bert`),
that a file may lack the pooler, and that attention probabilities are available.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from bertforge.checkpoint import KeyLayout
from bertforge.model.base import EncoderOutput, PreTrainedModel
from bertforge.model.bert.config import BertConfig
from bertforge.model.bert.keys import LAYOUT
from bertforge.model.bert.layers import Embeddings
from bertforge.model.layers import EncoderLayer, run_layers

# Our keys of the pooler, wherever the backbone sits.
POOLER_KEYS = r"(^|\.)pooler\."


class BertPreTrainedModel(PreTrainedModel):
    """Shared by the BERT models: the family's config, key layout and checkpoint facts."""

    model_type: ClassVar[str] = "bert"
    config_class: ClassVar[type[BertConfig]] = BertConfig
    key_layout: ClassVar[KeyLayout] = LAYOUT
    supports_attention_maps: ClassVar[bool] = True
    # The attribute holding the BertModel, which is also our key prefix of the backbone's weights.
    base_model_prefix: ClassVar[str] = "bert"
    # Many encoders ship without a pooler.
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]] = (POOLER_KEYS,)
    # transformers' position-id buffer repeats what the model computes.
    keys_redundant_on_load: ClassVar[tuple[str, ...]] = (r"(^|\.)embeddings\.position_ids$",)

    config: BertConfig


class Pooler(nn.Module):
    """dense + tanh on the final [CLS] vector: the sentence representation for NSP and classification
    (or on the vector at chosen positions: the last real token of a causal model, see heads.py)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self,
        last_hidden_state: torch.Tensor,  # (B, T, H)
        positions: torch.Tensor | None = None,  # (B,) the token each row is pooled from; None: [CLS] (0)
    ) -> torch.Tensor:  # (B, H)
        if positions is None:
            chosen = last_hidden_state[:, 0]
        else:
            chosen = last_hidden_state[torch.arange(last_hidden_state.shape[0], device=positions.device), positions]
        return torch.tanh(self.dense(chosen))


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

    `is_decoder: true` makes it a left-to-right encoder (causal self-attention), as transformers'
    BertModel with that field. The pooled output stays tanh(W C + b) over [CLS], as there, although
    under a causal mask [CLS] sees only itself: the sentence heads read the last real token instead.
    """

    job: ClassVar[str | None] = "embeddings"
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
        # Build the attention mask whatever the batch holds (no data-dependent check): for graph
        # export, where a branch on the data cannot be traced.
        self.always_build_mask = False
        self.init_weights()

    def transformer_layers(self) -> nn.ModuleList:
        return self.encoder.layers  # the G distinct layers (all L unless ALBERT-shared)

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
        hidden, all_hidden, all_attentions = run_layers(
            self, self.encoder.schedule(), hidden, attention_mask,
            output_hidden_states=output_hidden_states, output_attentions=output_attentions,
            causal=self.config.is_decoder,  # left to right: every layer and head, every path (run_layers)
        )
        return EncoderOutput(
            last_hidden_state=hidden,
            pooled_output=self.pooler(hidden) if self.pooler is not None else None,
            hidden_states=all_hidden,
            attentions=all_attentions,
        )
