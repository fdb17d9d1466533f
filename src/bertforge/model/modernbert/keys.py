"""ModernBERT's checkpoint layout: our module names against transformers' ModernBert* keys."""

from __future__ import annotations

from bertforge.checkpoint import KeyLayout

# ModernBERT (model_type "modernbert"). transformers' names: `model.` before the backbone in a model
# with heads; `tok_embeddings`, `layers.{i}.attn.Wqkv` (already fused, rows q; k; v as ours),
# `attn.Wo`, `mlp.Wi` (the GeGLU input and gate halves in one matrix, as ours), `mlp.Wo`, the
# norms; the heads' shared `head.dense` / `head.norm`, and `decoder.bias` (the decoder's weight is
# the tied embedding matrix and is not written). Question answering calls its layer `classifier`.
MODERN_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "embeddings.tok_embeddings.weight"),
    ("embeddings.layer_norm.{p}", "embeddings.norm.{p}"),
    ("layers.{i}.attention_norm.{p}", "layers.{i}.attn_norm.{p}"),
    ("layers.{i}.attention.qkv.{p}", "layers.{i}.attn.Wqkv.{p}"),
    ("layers.{i}.attention.out.{p}", "layers.{i}.attn.Wo.{p}"),
    ("layers.{i}.ffn_norm.{p}", "layers.{i}.mlp_norm.{p}"),
    ("layers.{i}.ffn.up.{p}", "layers.{i}.mlp.Wi.{p}"),
    ("layers.{i}.ffn.down.{p}", "layers.{i}.mlp.Wo.{p}"),
    ("final_norm.{p}", "final_norm.{p}"),
    ("head.layer_norm.{p}", "head.norm.{p}"),
    ("decoder_bias", "decoder.bias"),
]

LAYOUT = KeyLayout(MODERN_KEY_MAP, hf_base_prefix="model.", backbone_roots=("embeddings.", "layers.", "final_norm."),
                   layers_root="layers.")
