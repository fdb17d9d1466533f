"""DeBERTa-v2/v3's checkpoint layout: our module names against transformers' DebertaV2Model /
DebertaV2For* keys."""

from __future__ import annotations

import dataclasses

from bertforge.checkpoint import KeyLayout

# Backbone keys, relative to the encoder (ours: `deberta.` inside a model with heads, nothing in a bare
# DebertaV2Model; theirs likewise). transformers keeps the layers under `encoder.layer.{i}` with one
# Linear each for q, k and v (`query_proj`, `key_proj`, `value_proj`): the fused row below splits ours.
# The relative-position table, its norm and the convolution sit in transformers' encoder; ours beside
# the layers. The embedding tables already have transformers' names.
DEBERTA_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("layers.{i}.attention.pos_key.{p}", "encoder.layer.{i}.attention.self.pos_key_proj.{p}"),
    ("layers.{i}.attention.pos_query.{p}", "encoder.layer.{i}.attention.self.pos_query_proj.{p}"),
    ("layers.{i}.attention.out.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("layers.{i}.attention_norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("layers.{i}.ffn.up.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("layers.{i}.ffn.down.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("layers.{i}.ffn_norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
    ("rel_embeddings.weight", "encoder.rel_embeddings.weight"),
    ("rel_norm.{p}", "encoder.LayerNorm.{p}"),
    ("conv.conv.{p}", "encoder.conv.conv.{p}"),
    ("conv.layer_norm.{p}", "encoder.conv.LayerNorm.{p}"),
]
DEBERTA_FUSED_QKV = ("layers.{i}.attention.qkv.{p}", "encoder.layer.{i}.attention.self.{part}.{p}")

# The masked-LM head in transformers' two layouts (config.json's `legacy`): `cls.predictions.*`
# (legacy, the default) or `lm_predictions.lm_head.*`. Both are the same function (dense, activation,
# LayerNorm, the tied word embeddings plus a bias); ours is `legacy_head` or `lm_head` accordingly.
# The task heads (`pooler.dense`, `classifier`, `qa_outputs`) have transformers' names and pass unchanged.
_MLM_PARTS = [("dense.{p}", "dense.{p}"), ("layer_norm.{p}", "LayerNorm.{p}")]
DEBERTA_HEAD_KEY_MAP: list[tuple[str, str]] = [
    *[(f"lm_head.{ours}", f"lm_predictions.lm_head.{theirs}") for ours, theirs in _MLM_PARTS],
    ("lm_head.bias", "lm_predictions.lm_head.bias"),
    *[(f"legacy_head.{ours}", f"cls.predictions.transform.{theirs}") for ours, theirs in _MLM_PARTS],
    ("legacy_head.bias", "cls.predictions.bias"),
]

# A file in the other layout than its config.json says still fills the masked LM's head (MLM_LAYOUT):
# the Hub's DeBERTaV3 files carry `lm_predictions.lm_head.*` with no `legacy` key (so legacy, by
# transformers' default).
_MLM_TENSORS = ("dense.weight", "dense.bias", "layer_norm.weight", "layer_norm.bias", "bias")
_THEIRS = {"lm_head": "lm_predictions.lm_head.", "legacy_head": "cls.predictions.transform."}


def _theirs(head: str, tensor: str) -> str:
    if tensor == "bias":
        return "lm_predictions.lm_head.bias" if head == "lm_head" else "cls.predictions.bias"
    return _THEIRS[head] + tensor.replace("layer_norm", "LayerNorm")


MLM_FALLBACKS: tuple[tuple[str, str], ...] = tuple(
    (f"{ours}.{tensor}", _theirs(other, tensor))
    for ours, other in (("legacy_head", "lm_head"), ("lm_head", "legacy_head")) for tensor in _MLM_TENSORS
)

LAYOUT = KeyLayout(
    DEBERTA_KEY_MAP + DEBERTA_HEAD_KEY_MAP,
    hf_base_prefix="deberta.",
    # transformers' top-level names, and ours: the load report tells the backbone's keys from the heads' by these.
    backbone_roots=("embeddings.", "encoder.", "layers.", "rel_embeddings.", "rel_norm.", "conv."),
    layers_root="layers.",
    fused_qkv=DEBERTA_FUSED_QKV,
    qkv_names=("query_proj", "key_proj", "value_proj"),
)
# The masked LM's: the same, reading its head from either layout.
MLM_LAYOUT = dataclasses.replace(LAYOUT, fallbacks=MLM_FALLBACKS)
