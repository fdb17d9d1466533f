"""ALBERT's checkpoint layout: our module names against transformers' AlbertModel / AlbertFor* keys."""

from __future__ import annotations

from bertforge.checkpoint import KeyLayout

# Backbone keys, relative to the encoder (ours and theirs carry `albert.` inside a model with heads).
# We keep the G distinct layers as `encoder.layers.{i}`; transformers keeps each as the only layer of
# a group, `encoder.albert_layer_groups.{i}.albert_layers.0`. The E -> H projection sits in our
# embeddings and in their encoder; the pooler is a bare Linear of theirs.
ALBERT_LAYER = "encoder.albert_layer_groups.{i}.albert_layers.0"
ALBERT_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("embeddings.projection.{p}", "encoder.embedding_hidden_mapping_in.{p}"),
    ("encoder.layers.{i}.attention.out.{p}", f"{ALBERT_LAYER}.attention.dense.{{p}}"),
    ("encoder.layers.{i}.attention_norm.{p}", f"{ALBERT_LAYER}.attention.LayerNorm.{{p}}"),
    ("encoder.layers.{i}.ffn.up.{p}", f"{ALBERT_LAYER}.ffn.{{p}}"),
    ("encoder.layers.{i}.ffn.down.{p}", f"{ALBERT_LAYER}.ffn_output.{{p}}"),
    ("encoder.layers.{i}.ffn_norm.{p}", f"{ALBERT_LAYER}.full_layer_layer_norm.{{p}}"),
    ("pooler.dense.{p}", "pooler.{p}"),
]
# Our one q/k/v matrix is their query, key and value, stacked in that order.
ALBERT_FUSED_QKV = ("encoder.layers.{i}.attention.qkv.{p}", f"{ALBERT_LAYER}.attention.{{part}}.{{p}}")

# Heads sit beside the backbone with transformers' names (`predictions.dense`, `predictions.bias`,
# `sop_classifier.classifier`, `classifier`, `qa_outputs`) and pass unchanged, but for the masked-LM
# norm. The decoder's weight is the word-embedding matrix and its bias `predictions.bias`.
ALBERT_HEAD_KEY_MAP: list[tuple[str, str]] = [
    ("predictions.layer_norm.{p}", "predictions.LayerNorm.{p}"),
]

LAYOUT = KeyLayout(
    ALBERT_KEY_MAP + ALBERT_HEAD_KEY_MAP,
    hf_base_prefix="albert.",
    backbone_roots=("embeddings.", "encoder.", "pooler."),
    layers_root="encoder.layers.",
    fused_qkv=ALBERT_FUSED_QKV,
)
