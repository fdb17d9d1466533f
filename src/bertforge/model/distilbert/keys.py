"""DistilBERT's checkpoint layout: our module names against transformers' DistilBertModel / DistilBertFor* keys."""

from __future__ import annotations

from bertforge.checkpoint import KeyLayout

# Backbone keys, relative to the encoder (ours: `distilbert.` inside a model with heads, nothing in a
# bare DistilBertModel; theirs likewise). transformers keeps the layers under `transformer.layer.{i}`
# with one Linear each for q, k and v (`q_lin`, `k_lin`, `v_lin`): the fused row below splits ours.
DISTIL_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("layers.{i}.attention.out.{p}", "transformer.layer.{i}.attention.out_lin.{p}"),
    ("layers.{i}.attention_norm.{p}", "transformer.layer.{i}.sa_layer_norm.{p}"),
    ("layers.{i}.ffn.up.{p}", "transformer.layer.{i}.ffn.lin1.{p}"),
    ("layers.{i}.ffn.down.{p}", "transformer.layer.{i}.ffn.lin2.{p}"),
    ("layers.{i}.ffn_norm.{p}", "transformer.layer.{i}.output_layer_norm.{p}"),
]
DISTIL_FUSED_QKV = ("layers.{i}.attention.qkv.{p}", "transformer.layer.{i}.attention.{part}.{p}")

# Heads sit beside the backbone. The masked-LM head's transform and norm already have transformers'
# names (`vocab_transform`, `vocab_layer_norm`), as do the task heads (`pre_classifier`, `classifier`,
# `qa_outputs`): they pass unchanged. The projection's weight is the word-embedding matrix, so only
# its bias is a tensor of ours.
DISTIL_HEAD_KEY_MAP: list[tuple[str, str]] = [
    ("vocab_bias", "vocab_projector.bias"),
]

LAYOUT = KeyLayout(
    DISTIL_KEY_MAP + DISTIL_HEAD_KEY_MAP,
    hf_base_prefix="distilbert.",
    # transformers' top-level names, and ours for the layers: the load report tells the backbone's
    # keys from the heads' by these.
    backbone_roots=("embeddings.", "transformer.", "layers."),
    layers_root="layers.",
    fused_qkv=DISTIL_FUSED_QKV,
    qkv_names=("q_lin", "k_lin", "v_lin"),
)
