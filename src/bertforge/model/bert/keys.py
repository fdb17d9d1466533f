"""BERT's checkpoint layout: our module names against transformers' BertModel / BertFor* keys."""

from __future__ import annotations

from bertforge.checkpoint import KeyLayout

# The key map. "{i}" is a layer index, "{p}" a parameter name (weight or bias).
# Backbone names are relative to the encoder (ours: `bert.` inside a model with heads, nothing in a
# bare BertModel; theirs: `bert.` likewise). The fused q/k/v is the one row that is not a rename.
# Family switches add rows but no new layout: ALBERT's factorised embeddings add the E -> H
# projection (named as in Hugging Face's ALBERT), and with shared layers `{i}` counts the G distinct
# layers. Such checkpoints do not load in transformers.BertModel (see BertConfig.transformers_incompatibilities).
KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("embeddings.projection.{p}", "encoder.embedding_hidden_mapping_in.{p}"),
    ("encoder.layers.{i}.attention.out.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.attention_norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.ffn.up.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.ffn.down.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.ffn_norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
    ("pooler.dense.{p}", "pooler.dense.{p}"),
]
FUSED_QKV = ("encoder.layers.{i}.attention.qkv.{p}", "encoder.layer.{i}.attention.self.{part}.{p}")

# Heads sit beside the backbone (ours: `mlm.`, `nsp.`, `sbo.`; theirs: `cls.`). Task heads that are not
# listed (`classifier`, `qa_outputs`) already use Hugging Face's names and pass through unchanged.
# transformers has no span-boundary head: it reports `cls.span_boundary.*` as unused and loads the rest.
HEAD_KEY_MAP: list[tuple[str, str]] = [
    ("mlm.transform.dense.{p}", "cls.predictions.transform.dense.{p}"),
    ("mlm.transform.layer_norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
    ("mlm.bias", "cls.predictions.bias"),
    ("nsp.{p}", "cls.seq_relationship.{p}"),
    ("sbo.position_embeddings.weight", "cls.span_boundary.position_embeddings.weight"),
    ("sbo.transform.dense1.{p}", "cls.span_boundary.transform.dense1.{p}"),
    ("sbo.transform.layer_norm1.{p}", "cls.span_boundary.transform.LayerNorm1.{p}"),
    ("sbo.transform.dense2.{p}", "cls.span_boundary.transform.dense2.{p}"),
    ("sbo.transform.layer_norm2.{p}", "cls.span_boundary.transform.LayerNorm2.{p}"),
]

# Hugging Face prefixes the backbone with `bert.` in a model with heads; these roots are the backbone's.
HF_BASE_PREFIX = "bert."
HF_BACKBONE_ROOTS = ("embeddings.", "encoder.", "pooler.")

LAYOUT = KeyLayout(
    KEY_MAP + HEAD_KEY_MAP,
    hf_base_prefix=HF_BASE_PREFIX,
    backbone_roots=HF_BACKBONE_ROOTS,
    layers_root="encoder.layers.",
    fused_qkv=FUSED_QKV,
    # A checkpoint saved before the bias moved keeps the MLM bias only as the decoder's bias.
    fallbacks=(("mlm.bias", "cls.predictions.decoder.bias"),),
)
