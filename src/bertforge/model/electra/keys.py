"""ELECTRA's checkpoint layout: our module names against transformers' ElectraModel / ElectraFor* keys,
which are BERT's names under an `electra.` prefix, plus the projection from the embedding width."""

from __future__ import annotations

from bertforge.checkpoint import KeyLayout

# Backbone names, relative to the encoder (ours and theirs carry `electra.` inside a model with heads).
# Keys named alike on both sides (the three embedding tables, `embeddings_project`) need no row.
ELECTRA_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("encoder.layers.{i}.attention.out.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.attention_norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.ffn.up.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.ffn.down.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.ffn_norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
]
# Our one q/k/v matrix is their query, key and value, stacked in that order.
ELECTRA_FUSED_QKV = ("encoder.layers.{i}.attention.qkv.{p}", "encoder.layer.{i}.attention.self.{part}.{p}")

# The heads use transformers' module names (`discriminator_predictions`, `generator_predictions.dense`,
# `generator_lm_head.bias`, `classifier`, `qa_outputs`, `sequence_summary.summary`) and pass through
# unchanged, except the generator's norm, snake-cased like every norm of ours.
ELECTRA_HEAD_KEY_MAP: list[tuple[str, str]] = [
    ("generator_predictions.layer_norm.{p}", "generator_predictions.LayerNorm.{p}"),
]

LAYOUT = KeyLayout(
    ELECTRA_KEY_MAP + ELECTRA_HEAD_KEY_MAP,
    hf_base_prefix="electra.",
    # the backbone's top-level names: the load report tells its keys from the heads' by these
    backbone_roots=("embeddings.", "embeddings_project.", "encoder."),
    layers_root="encoder.layers.",
    fused_qkv=ELECTRA_FUSED_QKV,
)
