"""RoBERTa's checkpoint layout: our module names against transformers' Roberta* (and XLMRoberta*,
Camembert*) keys, which are BERT's names under a `roberta.` prefix."""

from __future__ import annotations

from bertforge.checkpoint import KeyLayout

# Backbone names, relative to the encoder (ours and theirs carry `roberta.` inside a model with heads).
# Keys named alike on both sides (word, position and token-type tables, the pooler) need no row.
ROBERTA_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("encoder.layers.{i}.attention.out.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.attention_norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.ffn.up.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.ffn.down.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.ffn_norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
]
# Our one q/k/v matrix is their query, key and value, stacked in that order.
ROBERTA_FUSED_QKV = ("encoder.layers.{i}.attention.qkv.{p}", "encoder.layer.{i}.attention.self.{part}.{p}")

# The heads use transformers' names already (`lm_head.dense`, `lm_head.layer_norm`, `lm_head.bias`,
# `classifier.dense`, `classifier.out_proj`, `classifier`, `qa_outputs`) and pass through unchanged.
LAYOUT = KeyLayout(
    ROBERTA_KEY_MAP,
    hf_base_prefix="roberta.",
    backbone_roots=("embeddings.", "encoder.", "pooler."),
    layers_root="encoder.layers.",
    fused_qkv=ROBERTA_FUSED_QKV,
)
