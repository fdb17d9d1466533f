"""The model against Hugging Face transformers (the oracle), and its own behaviour."""

from __future__ import annotations

import pytest
import torch
import transformers

from bertforge import BertConfig, BertForMaskedLM, BertForPreTraining, BertModel

ATOL = 1e-5

# Two deliberately different shapes: the tiny preset, and one with odd sizes, tanh GELU, 3 segment
# types and another LayerNorm epsilon, so that a hard-coded constant cannot pass both.
CONFIGS = {
    "tiny": BertConfig.from_preset("tiny", vocab_size=211),
    "odd": BertConfig(vocab_size=157, hidden_size=96, num_hidden_layers=3, num_attention_heads=6,
                      intermediate_size=200, hidden_act="gelu_new", type_vocab_size=3,
                      layer_norm_eps=1e-6, max_position_embeddings=64),
}


def padded_batch(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three sequences of lengths 12, 7 and 3 padded to 12, with segment B in the second half."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (3, 12), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate((12, 7, 3)):
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def assert_close_on_tokens(ours: torch.Tensor, theirs: torch.Tensor, attention_mask: torch.Tensor) -> None:
    """Equal at real tokens. Padding positions carry no meaning: the fast path leaves them at zero."""
    real = attention_mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_pretraining_outputs_match_transformers(name: str, tmp_path) -> None:
    torch.manual_seed(0)
    ours = BertForPreTraining(CONFIGS[name]).eval()
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    batch = padded_batch(CONFIGS[name].vocab_size)
    with torch.no_grad():
        out = ours(**batch, output_hidden_states=True)
        ref = theirs(**batch, output_hidden_states=True)
    mask = batch["attention_mask"]
    assert_close_on_tokens(out.mlm_logits, ref.prediction_logits, mask)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=ATOL, rtol=0)
    assert len(out.hidden_states) == CONFIGS[name].num_hidden_layers + 1
    for mine, hf in zip(out.hidden_states, ref.hidden_states, strict=True):
        assert_close_on_tokens(mine, hf, mask)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_encoder_and_attentions_match_transformers(name: str, tmp_path) -> None:
    torch.manual_seed(1)
    ours = BertModel(CONFIGS[name]).eval()
    ours.save_pretrained(tmp_path)
    # The eager implementation is the one that returns attention probabilities.
    theirs = transformers.BertModel.from_pretrained(tmp_path, attn_implementation="eager").eval()
    batch = padded_batch(CONFIGS[name].vocab_size, seed=1)
    with torch.no_grad():
        out = ours(**batch, output_attentions=True)
        ref = theirs(**batch, output_attentions=True)
        fast = ours(**batch)  # the SDPA path, without probabilities
    torch.testing.assert_close(out.last_hidden_state, ref.last_hidden_state, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.pooled_output, ref.pooler_output, atol=ATOL, rtol=0)
    assert_close_on_tokens(fast.last_hidden_state, ref.last_hidden_state, batch["attention_mask"])
    torch.testing.assert_close(fast.pooled_output, ref.pooler_output, atol=ATOL, rtol=0)
    assert len(out.attentions) == CONFIGS[name].num_hidden_layers
    for mine, hf in zip(out.attentions, ref.attentions, strict=True):
        torch.testing.assert_close(mine, hf, atol=ATOL, rtol=0)
    # Padding gets no attention, and each row is a distribution.
    probs = out.attentions[0]  # (B, A, T, T)
    assert probs[2, :, :, 3:].abs().max() < 1e-6
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))


# The packed path's two ways to attend: per sequence (the CPU's default) and re-padded with a mask
# (the GPU's), both checked here on the CPU.
PER_SEQUENCE = pytest.mark.parametrize("per_sequence", [True, False], ids=["per-sequence", "re-padded"])


@pytest.mark.parametrize("name", list(CONFIGS))
@PER_SEQUENCE
def test_unpadded_fast_path_matches_plain_path(name: str, per_sequence: bool) -> None:
    torch.manual_seed(6)
    model = BertModel(CONFIGS[name]).eval()
    model.attention_per_sequence = per_sequence
    batch = padded_batch(CONFIGS[name].vocab_size, seed=6)
    with torch.no_grad():
        fast = model(**batch, output_hidden_states=True)
        model.unpad = False
        plain = model(**batch, output_hidden_states=True)
    padding = ~batch["attention_mask"].bool()
    for packed, reference in zip(fast.hidden_states, plain.hidden_states, strict=True):
        assert_close_on_tokens(packed, reference, batch["attention_mask"])
        assert packed[padding].abs().max() == 0
    torch.testing.assert_close(fast.pooled_output, plain.pooled_output, atol=ATOL, rtol=0)


def test_per_sequence_attention_follows_any_mask_pattern() -> None:
    """Left padding, a hole inside a row and an all-padding row: each row still attends over exactly
    its own real tokens, as the masked padded path does."""
    torch.manual_seed(11)
    model = BertModel(CONFIGS["odd"]).eval()
    batch = padded_batch(CONFIGS["odd"].vocab_size, seed=11)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1],   # left-padded
                         [1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0],   # a hole
                         [0] * 12,                               # nothing real
                         [1] * 12])
    batch = {k: torch.cat([v, v[:1]]) for k, v in batch.items()} | {"attention_mask": mask}
    with torch.no_grad():
        fast = model(**batch).last_hidden_state
        model.unpad = False
        plain = model(**batch).last_hidden_state
    assert_close_on_tokens(fast, plain, mask)
    assert fast[~mask.bool()].abs().max() == 0


@PER_SEQUENCE
def test_unpadded_gradients_match_plain_path(per_sequence: bool) -> None:
    torch.manual_seed(7)
    config = CONFIGS["odd"]
    batch = padded_batch(config.vocab_size, seed=7)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    grads = []
    for unpad in (True, False):
        torch.manual_seed(8)
        model = BertForPreTraining(config).eval()
        model.bert.unpad = unpad
        model.bert.attention_per_sequence = per_sequence
        model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 1])).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_gradient_checkpointing_gives_the_same_gradients() -> None:
    config = BertConfig.from_preset("tiny", vocab_size=80, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch = padded_batch(80, seed=9)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    grads, forward_calls = [], []
    for checkpointing in (False, True):
        torch.manual_seed(10)
        model = BertForMaskedLM(config).train()
        model.bert.gradient_checkpointing = checkpointing
        calls = []
        model.bert.encoder.layers[0].ffn.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        model(**batch, labels=labels).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        forward_calls.append(len(calls))
    assert forward_calls == [1, 2]  # with checkpointing the layer really is recomputed in backward
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], msg=name)


def test_padding_does_not_change_real_tokens() -> None:
    torch.manual_seed(2)
    model = BertModel(CONFIGS["tiny"]).eval()
    batch = padded_batch(CONFIGS["tiny"].vocab_size)
    with torch.no_grad():
        padded = model(**batch).last_hidden_state[1, :7]
        alone = model(batch["input_ids"][1:2, :7], token_type_ids=batch["token_type_ids"][1:2, :7]).last_hidden_state[0]
    torch.testing.assert_close(padded, alone, atol=ATOL, rtol=0)


def test_masked_lm_loss_uses_only_labelled_positions() -> None:
    torch.manual_seed(3)
    config = CONFIGS["tiny"]
    model = BertForPreTraining(config).eval()
    batch = padded_batch(config.vocab_size)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, 2], labels[1, 5], labels[2, 1] = 17, 42, 99
    nsp_label = torch.tensor([0, 1, 0])
    with torch.no_grad():
        out = model(**batch, labels=labels, next_sentence_label=nsp_label)
        full = model(**batch)
    assert out.mlm_logits.shape == (3, config.vocab_size)  # only the three labelled positions
    expected_mlm = torch.nn.functional.cross_entropy(full.mlm_logits.view(-1, config.vocab_size), labels.view(-1))
    expected_nsp = torch.nn.functional.cross_entropy(full.nsp_logits, nsp_label)
    torch.testing.assert_close(out.mlm_loss, expected_mlm, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.nsp_loss, expected_nsp)
    torch.testing.assert_close(out.loss, expected_mlm + expected_nsp, atol=1e-5, rtol=1e-5)


def test_loss_matches_transformers_and_backward_runs(tmp_path) -> None:
    torch.manual_seed(4)
    config = CONFIGS["odd"]
    ours = BertForPreTraining(config).eval()
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    batch = padded_batch(config.vocab_size)
    chosen = (torch.rand(batch["input_ids"].shape) < 0.3) & batch["attention_mask"].bool()
    labels = torch.where(chosen, batch["input_ids"], -100)
    labels[0, 0] = 7  # at least one
    nsp_label = torch.tensor([1, 0, 1])
    out = ours(**batch, labels=labels, next_sentence_label=nsp_label)
    ref = theirs(**batch, labels=labels, next_sentence_label=nsp_label)
    torch.testing.assert_close(out.loss, ref.loss, atol=1e-5, rtol=1e-5)
    out.loss.backward()
    embeddings = ours.bert.embeddings.word_embeddings.weight
    assert embeddings.grad is not None and embeddings.grad.abs().sum() > 0  # reached through the tied decoder


def test_batch_without_masked_tokens_gives_zero_loss() -> None:
    model = BertForMaskedLM(CONFIGS["tiny"])
    batch = padded_batch(CONFIGS["tiny"].vocab_size)
    out = model(**batch, labels=torch.full_like(batch["input_ids"], -100))
    assert out.loss.item() == 0.0
    out.loss.backward()  # still differentiable, so a training step does not need a special case


def test_decoder_is_tied_to_word_embeddings() -> None:
    model = BertForPreTraining(CONFIGS["tiny"]).eval()
    ids = torch.tensor([[2, 10, 11, 3]])
    with torch.no_grad():
        before = model(ids).mlm_logits
        model.bert.embeddings.word_embeddings.weight[10:12] += 1.0
        after = model(ids).mlm_logits
    assert not torch.allclose(before, after)
    names = [name for name, _ in model.named_parameters()]
    assert not any("decoder" in name for name in names)  # the matrix is stored once


def test_initialisation_follows_bert() -> None:
    torch.manual_seed(5)
    model = BertForPreTraining(BertConfig.from_preset("mini"))
    layer = model.bert.encoder.layers[0]
    assert abs(layer.ffn.up.weight.std().item() - 0.02) < 0.002
    assert abs(model.bert.embeddings.word_embeddings.weight[1:].std().item() - 0.02) < 0.002
    assert torch.all(model.bert.embeddings.word_embeddings.weight[0] == 0)  # the padding row
    assert torch.all(layer.attention.qkv.bias == 0) and torch.all(model.mlm.bias == 0)
    assert torch.all(layer.attention_norm.weight == 1) and torch.all(layer.attention_norm.bias == 0)


def test_too_long_input_is_a_clear_error() -> None:
    model = BertModel(CONFIGS["odd"])
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        model(torch.ones(1, 65, dtype=torch.long))


def test_dropout_only_in_training() -> None:
    config = BertConfig.from_preset("tiny", vocab_size=50, hidden_dropout_prob=0.5)
    model = BertModel(config)
    ids = torch.randint(5, 50, (2, 8))
    model.train()
    assert not torch.allclose(model(ids).last_hidden_state, model(ids).last_hidden_state)
    model.eval()
    torch.testing.assert_close(model(ids).last_hidden_state, model(ids).last_hidden_state)


def test_cpu_dropout_keeps_one_minus_p_and_rescales() -> None:
    from bertforge.model.layers import dropout

    torch.manual_seed(0)
    x = torch.ones(400, 1000, requires_grad=True)
    dropped = dropout(x, 0.1, True)
    kept = dropped != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.003  # 400,000 draws: the std of the share is 0.0005
    torch.testing.assert_close(dropped[kept], torch.full_like(dropped[kept], 1 / 0.9))
    dropped.sum().backward()
    torch.testing.assert_close(x.grad, dropped.detach())  # d(x * keep)/dx is the scaled mask itself
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_cpu_attention_with_dropout_is_sdpa_with_the_probabilities_dropped(monkeypatch, causal, with_bias) -> None:
    """The explicit CPU path taken while training with attention dropout computes what SDPA does: with
    the dropout made the identity it must give SDPA's output and gradients (masks and causality too)."""
    from bertforge.model import layers

    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, 7, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 4:] = 0
    bias = layers.padding_bias(mask, torch.float32) if with_bias else None
    if causal and with_bias:
        bias = layers.causal_bias(mask, 7, torch.float32, query.device)
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=bias,
                                                                is_causal=causal and not with_bias)
    expected_grads = torch.autograd.grad(expected.square().sum(), (query, key, value))
    monkeypatch.setattr(layers, "dropout", lambda x, p, training: x)
    ours = layers.attend(query, key, value, bias, 0.25, causal and not with_bias)  # the explicit path
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    for got, want in zip(torch.autograd.grad(ours.square().sum(), (query, key, value)), expected_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_presets_have_the_paper_sizes() -> None:
    base = BertModel(BertConfig.from_preset("base"))
    assert 109e6 < base.num_parameters() < 111e6  # "110M"
    large = BertConfig.from_preset("large")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.intermediate_size) == (
        24, 1024, 16, 4096)


def test_compiled_encoder_has_no_graph_break_and_matches_eager() -> None:
    """torch.compile traces the whole forward in one graph (fullgraph=True raises on a break) and gives
    the eager result on real tokens. The 'eager' backend runs dynamo's tracing without code generation,
    which is what a graph break is about, and keeps the test fast."""
    torch._dynamo.reset()
    config = BertConfig.from_preset("tiny", vocab_size=99)
    model = BertModel(config).eval()
    batch = padded_batch(config.vocab_size)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        eager_out = model(**batch).last_hidden_state
        compiled_out = compiled(**batch).last_hidden_state
    assert_close_on_tokens(compiled_out, eager_out, batch["attention_mask"])


def test_bf16_autocast_fast_path_matches_padded_path_and_fp32() -> None:
    """The GPU recipe's bf16 autocast, checked on the CPU: the packed path agrees with the padded one
    in bf16, and both stay within bf16 rounding of fp32 (LayerNorm and the loss run in fp32)."""
    config = BertConfig.from_preset("tiny", vocab_size=211)
    torch.manual_seed(0)
    model = BertForPreTraining(config).eval()
    batch = padded_batch(config.vocab_size)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    with torch.no_grad():
        reference = model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
        outputs = {}
        for unpad, per_sequence in ((True, True), (True, False), (False, None)):
            model.bert.unpad, model.bert.attention_per_sequence = unpad, per_sequence
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outputs[unpad, per_sequence] = model(**batch, labels=labels,
                                                     next_sentence_label=torch.tensor([0, 1, 0]))
    padded = outputs[False, None]
    for packed in (outputs[True, True], outputs[True, False]):
        assert torch.isfinite(packed.loss) and torch.isfinite(padded.loss)
        assert torch.allclose(packed.loss.float(), padded.loss.float(), atol=2e-2)
        assert torch.allclose(packed.loss.float(), reference.loss, rtol=2e-2)
        assert torch.allclose(packed.nsp_logits.float(), reference.nsp_logits, atol=5e-2)
        assert torch.allclose(packed.mlm_logits.float(), padded.mlm_logits.float(), atol=5e-2)
