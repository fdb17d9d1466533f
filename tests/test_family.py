"""BERT-family switches on the one model: ALBERT sharing and factorised embeddings, SpanBERT's
span-boundary objective, RoBERTa's missing segment table and NSP head. Small models, CPU, seconds."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from bertforge import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)
from bertforge.model import FAMILY_DEFAULTS, load_any
from bertforge.model.bert.heads import span_boundaries

FIXTURE = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
ATOL = 1e-5
V, H, L, A, FFN, P, TYPES, E = 60, 32, 4, 2, 64, 24, 2, 8  # vocab, hidden, layers, heads, I, positions, segments, E


def config(**switches) -> BertConfig:
    values = dict(vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A, intermediate_size=FFN,
                  max_position_embeddings=P, type_vocab_size=TYPES)
    return BertConfig(**{**values, **switches})


def padded_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three sequences of lengths 12, 8 and 5 padded to 12, segment B from position 6."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (3, 12), generator=gen)
    mask = torch.ones_like(ids)
    for row, length in enumerate((12, 8, 5)):
        mask[row, length:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = (torch.arange(12) >= 6).long().expand(3, 12) * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def masked(batch: dict[str, torch.Tensor], positions: list[tuple[int, int]]) -> tuple[dict, torch.Tensor]:
    """The batch with [MASK] (id 4) at `positions`, and MLM labels holding the original ids there."""
    labels = torch.full_like(batch["input_ids"], -100)
    ids = batch["input_ids"].clone()
    for row, col in positions:
        labels[row, col] = ids[row, col]
        ids[row, col] = 4
    return {**batch, "input_ids": ids}, labels


# Two runs per row: single tokens and spans of 2-3 (each with both boundaries inside the real tokens).
SPANS = [(0, 2), (0, 3), (0, 7), (0, 8), (0, 9), (1, 1), (1, 4), (1, 5), (2, 2), (2, 3)]


# ------------------------------------------------------------------------------------------------
# parameter counts, exactly
# ------------------------------------------------------------------------------------------------
def linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def layer_norm(width: int) -> int:
    return 2 * width


ONE_LAYER = linear(H, 3 * H) + linear(H, H) + layer_norm(H) + linear(H, FFN) + linear(FFN, H) + layer_norm(H)
POOLER = linear(H, H)


def embeddings(width: int, types: int = TYPES) -> int:
    return (V + P + types) * width + layer_norm(width)


def test_one_shared_layer_leaves_embeddings_one_layer_and_pooler() -> None:
    unshared = BertModel(config())
    shared = BertModel(config(num_hidden_groups=1))
    assert unshared.num_parameters() == embeddings(H) + L * ONE_LAYER + POOLER
    assert shared.num_parameters() == embeddings(H) + ONE_LAYER + POOLER
    assert unshared.num_parameters() - shared.num_parameters() == (L - 1) * ONE_LAYER
    schedule = shared.encoder.schedule()
    assert len(schedule) == L and all(layer is shared.encoder.layers[0] for layer in schedule)


def test_groups_run_in_order_of_depth() -> None:
    model = BertModel(config(num_hidden_groups=2))
    assert model.num_parameters() == embeddings(H) + 2 * ONE_LAYER + POOLER
    first, second = model.encoder.layers
    assert model.encoder.schedule() == [first, first, second, second]  # layer i runs group i // (L / G)
    ids = torch.randint(5, V, (2, 6))
    assert len(model(ids, output_hidden_states=True).hidden_states) == L + 1  # still L layers deep


def test_factorised_embeddings_parameter_count() -> None:
    model = BertForPreTraining(config(embedding_size=E))
    projection = linear(E, H)
    mlm_head = linear(H, E) + layer_norm(E) + V  # dense H -> E, LayerNorm(E), output bias; decoder tied
    nsp_head = linear(H, 2)
    assert model.num_parameters() == embeddings(E) + projection + L * ONE_LAYER + POOLER + mlm_head + nsp_head
    assert model.bert.embeddings.word_embeddings.weight.shape == (V, E)
    both = BertModel(config(embedding_size=E, num_hidden_groups=1))
    assert both.num_parameters() == embeddings(E) + projection + ONE_LAYER + POOLER


def test_switches_are_validated() -> None:
    with pytest.raises(ValueError, match="multiple of num_hidden_groups"):
        config(num_hidden_groups=3)
    with pytest.raises(ValueError, match="embedding_size must be a positive integer"):
        config(embedding_size=0)
    with pytest.raises(ValueError, match="type_vocab_size must be 0"):
        config(type_vocab_size=-1)
    with pytest.raises(ValueError, match="max_span_length"):
        config(span_boundary_objective=True, max_span_length=0)
    with pytest.raises(ValueError, match="next_sentence_head must be true or false"):
        config(next_sentence_head="no")
    with pytest.raises(ValueError, match="multiple of num_hidden_groups"):  # changing L later is checked too
        dataclasses.replace(config(num_hidden_groups=2), num_hidden_layers=3)


# ------------------------------------------------------------------------------------------------
# ALBERT: sharing trains, and the fast paths agree
# ------------------------------------------------------------------------------------------------
def test_shared_factorised_model_overfits_one_batch() -> None:
    torch.manual_seed(0)
    model = BertForMaskedLM(config(embedding_size=16, num_hidden_groups=1, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0))
    batch, labels = masked(padded_batch(), SPANS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(50):
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses[::10]  # ln(60) = 4.1 -> under 0.41


def test_shared_model_packed_and_padded_paths_agree() -> None:
    torch.manual_seed(1)
    model = BertModel(config(num_hidden_groups=1, embedding_size=E)).eval()
    batch = padded_batch(1)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        packed = model(**batch, output_hidden_states=True)
        model.unpad = False
        plain = model(**batch, output_hidden_states=True)
    for fast, reference in zip(packed.hidden_states, plain.hidden_states, strict=True):
        torch.testing.assert_close(fast[real], reference[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(packed.pooled_output, plain.pooled_output, atol=ATOL, rtol=0)


def test_shared_model_gradients_agree_across_packing_and_checkpointing() -> None:
    switches = dict(num_hidden_groups=2, embedding_size=E, span_boundary_objective=True,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    batch, labels = masked(padded_batch(2), SPANS)
    grads, calls = [], []
    for unpad, checkpointing in ((True, False), (False, False), (True, True)):
        torch.manual_seed(2)
        model = BertForPreTraining(config(**switches)).train()
        model.bert.unpad, model.bert.gradient_checkpointing = unpad, checkpointing
        count: list[int] = []
        model.bert.encoder.layers[0].ffn.register_forward_hook(lambda *_, count=count: count.append(1))
        model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 0])).loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters()})
        calls.append(len(count))
    assert calls == [2, 2, 4]  # group 0 runs at two depths, and again for each in backward when checkpointing
    for other in grads[1:]:
        for name, grad in grads[0].items():
            torch.testing.assert_close(grad, other[name], atol=1e-5, rtol=1e-4, msg=name)


# ------------------------------------------------------------------------------------------------
# SpanBERT: spans from the labels, the SBO loss
# ------------------------------------------------------------------------------------------------
def test_span_boundaries_come_from_runs_of_labelled_positions() -> None:
    x = -100
    labels = torch.tensor([
        [x, 5, 6, x, x, 7, 8, 9, x, x],  # two runs: 1..2 and 5..7
        [4, x, 5, 5, 5, x, x, x, x, 6],  # a run at the very start, one of 3, one at the very end
    ])
    spans = span_boundaries(labels, max_span_length=2)
    row0 = spans.valid[0].nonzero().squeeze(1).tolist()
    assert row0 == [1, 2, 5, 6]  # position 7 is 2 tokens into its span: past max_span_length
    assert spans.left[0, row0].tolist() == [0, 0, 4, 4]
    assert spans.right[0, row0].tolist() == [3, 3, 8, 8]
    assert spans.offset[0, row0].tolist() == [0, 1, 0, 1]
    # The first and last tokens have no boundary on one side; position 4 is too deep into its span.
    assert spans.valid[1].nonzero().squeeze(1).tolist() == [2, 3]
    assert spans.left[1, [2, 3]].tolist() == [1, 1] and spans.right[1, [2, 3]].tolist() == [5, 5]
    assert span_boundaries(labels, max_span_length=10).valid.sum() == 5 + 3


def test_sbo_loss_is_the_boundary_prediction_and_joins_the_total() -> None:
    torch.manual_seed(3)
    model = BertForPreTraining(config(span_boundary_objective=True, embedding_size=E)).eval()
    batch, labels = masked(padded_batch(3), SPANS)
    nsp = torch.tensor([1, 0, 1])
    with torch.no_grad():
        out = model(**batch, labels=labels, next_sentence_label=nsp)
        sequence = model.bert(**batch).last_hidden_state  # (B, T, H)
        spans = span_boundaries(labels, model.config.max_span_length)
        logits, targets = [], []
        for row, col in spans.valid.nonzero().tolist():  # one position at a time, by the paper's formula
            left, right = sequence[row, spans.left[row, col]], sequence[row, spans.right[row, col]]
            position = model.sbo.position_embeddings.weight[spans.offset[row, col]]
            vector = model.sbo.transform(torch.cat([left, right, position]))  # (E,)
            logits.append(vector @ model.bert.embeddings.word_embeddings.weight.T + model.mlm.bias)
            targets.append(labels[row, col])
        expected = F.cross_entropy(torch.stack(logits), torch.stack(targets))
    assert len(targets) == 10  # every masked position of SPANS has both boundaries
    torch.testing.assert_close(out.sbo_loss, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.nsp_loss + out.sbo_loss)


def test_sbo_loss_is_finite_and_decreases_with_training() -> None:
    torch.manual_seed(4)
    model = BertForMaskedLM(config(span_boundary_objective=True, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0))
    batch, labels = masked(padded_batch(4), SPANS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sbo = []
    for _ in range(30):
        out = model(**batch, labels=labels)
        assert torch.isfinite(out.sbo_loss)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        sbo.append(out.sbo_loss.item())
    assert sbo[-1] < 0.5 * sbo[0], sbo[::5]
    assert model.sbo.transform.dense1.weight.grad.abs().sum() > 0


def test_sbo_without_any_span_is_a_zero_that_backpropagates() -> None:
    model = BertForMaskedLM(config(span_boundary_objective=True))
    batch, labels = masked(padded_batch(), [(0, 0)])  # position 0 has no left boundary
    out = model(**batch, labels=labels)
    assert out.sbo_loss.item() == 0.0
    out.loss.backward()
    assert model.sbo.transform.dense1.weight.grad is not None


# ------------------------------------------------------------------------------------------------
# RoBERTa: no segment table, no NSP head
# ------------------------------------------------------------------------------------------------
def test_no_segment_table_ignores_token_type_ids() -> None:
    torch.manual_seed(5)
    model = BertModel(config(type_vocab_size=0)).eval()
    assert model.embeddings.token_type_embeddings is None
    assert model.num_parameters() == embeddings(H, types=0) + L * ONE_LAYER + POOLER
    batch = padded_batch(5)
    with torch.no_grad():
        given = model(**batch).last_hidden_state
        absent = model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
        other = model(**{**batch, "token_type_ids": torch.full_like(batch["input_ids"], 7)}).last_hidden_state
    torch.testing.assert_close(given, absent, atol=0, rtol=0)
    torch.testing.assert_close(given, other, atol=0, rtol=0)


def test_pretraining_model_without_next_sentence_head(tmp_path) -> None:
    torch.manual_seed(6)
    model = BertForPreTraining(config(next_sentence_head=False, type_vocab_size=0))
    assert model.nsp is None and model.bert.pooler is None  # nothing left that would get no gradient
    batch, labels = masked(padded_batch(6), SPANS)
    out = model(**batch, labels=labels)
    assert out.nsp_logits is None and out.nsp_loss is None
    torch.testing.assert_close(out.loss, out.mlm_loss)
    with pytest.raises(ValueError, match="no next-sentence head"):
        model(**batch, labels=labels, next_sentence_label=torch.tensor([0, 1, 0]))
    model.save_pretrained(tmp_path)
    classifier = BertForSequenceClassification.from_pretrained(tmp_path)  # the pooler is new, as for RoBERTa
    assert classifier.load_report.ok
    assert "bert.pooler.dense.weight" in classifier.load_report.new_heads


# ------------------------------------------------------------------------------------------------
# checkpoints
# ------------------------------------------------------------------------------------------------
SWITCHES = {
    "factorised": dict(embedding_size=E),
    "shared": dict(num_hidden_groups=1),
    "grouped": dict(num_hidden_groups=2),
    "no-segments": dict(type_vocab_size=0),
    "no-nsp": dict(next_sentence_head=False),
    "sbo": dict(span_boundary_objective=True, max_span_length=5),
    "albert+spanbert+roberta": dict(embedding_size=E, num_hidden_groups=1, type_vocab_size=0,
                                    next_sentence_head=False, span_boundary_objective=True),
}
INCOMPATIBLE = {"embedding_size", "num_hidden_groups", "type_vocab_size"}


@pytest.mark.parametrize("name", list(SWITCHES))
def test_save_load_round_trip_per_switch(name: str, tmp_path) -> None:
    torch.manual_seed(7)
    switches = SWITCHES[name]
    model = BertForPreTraining(config(**switches)).eval()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    for key, value in switches.items():
        assert saved[key] == value, key
    assert ("bertforge_note" in saved) == bool(INCOMPATIBLE & switches.keys())
    loaded = BertForPreTraining.from_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    assert loaded.load_report.ok and not loaded.load_report.new_heads and not loaded.load_report.unused
    assert loaded.state_dict().keys() == model.state_dict().keys()
    batch, labels = masked(padded_batch(7), SPANS)
    with torch.no_grad():
        before, after = model(**batch, labels=labels), loaded(**batch, labels=labels)
    torch.testing.assert_close(after.mlm_logits, before.mlm_logits, atol=0, rtol=0)
    torch.testing.assert_close(after.loss, before.loss, atol=0, rtol=0)
    if model.nsp is not None:
        torch.testing.assert_close(after.nsp_logits, before.nsp_logits, atol=0, rtol=0)
    if model.sbo is not None:
        torch.testing.assert_close(after.sbo_loss, before.sbo_loss, atol=0, rtol=0)
    again, report = load_any(tmp_path)  # by the architecture config.json names
    assert type(again) is BertForPreTraining and report.ok


def test_plain_bert_config_json_has_no_family_keys() -> None:
    written = config().to_dict()
    assert not FAMILY_DEFAULTS.keys() & written.keys() and "bertforge_note" not in written


def test_span_boundary_head_does_not_stop_transformers_loading_the_rest(tmp_path) -> None:
    torch.manual_seed(8)
    ours = BertForPreTraining(config(span_boundary_objective=True)).eval()
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"]
    assert info["unexpected_keys"] and all(k.startswith("cls.span_boundary.") for k in info["unexpected_keys"])
    batch = padded_batch(8)
    with torch.no_grad():
        mine, ref = ours(**batch), theirs.eval()(**batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(mine.mlm_logits[real], ref.prediction_logits[real], atol=ATOL, rtol=0)


def test_masked_lm_with_sbo_round_trips(tmp_path) -> None:
    torch.manual_seed(9)
    model = BertForMaskedLM(config(span_boundary_objective=True, num_hidden_groups=1)).eval()
    model.save_pretrained(tmp_path)
    loaded = BertForMaskedLM.from_pretrained(tmp_path).eval()
    assert loaded.load_report.ok and not loaded.load_report.new_heads
    batch, labels = masked(padded_batch(9), SPANS)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch, labels=labels).sbo_loss, model(**batch, labels=labels).sbo_loss)


# ------------------------------------------------------------------------------------------------
# pre-training end to end: RoBERTa-style data, an ALBERT + SpanBERT model
# ------------------------------------------------------------------------------------------------
def test_pretrain_without_sentence_objective_trains_a_shared_span_boundary_model(tmp_path) -> None:
    from bertforge.data.prepare import prepare
    from bertforge.pretrain import pretrain
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.train([FIXTURE], vocab_size=300, show_progress=False)
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepare([FIXTURE], tmp_path / "tokenizer", tmp_path / "data", max_seq_length=64, plain_text=True,
                objective="none", masking="dynamic", validation_fraction=0.1, block_sentences=16, progress=False)
    switches = dict(embedding_size=16, num_hidden_groups=1, type_vocab_size=0, span_boundary_objective=True)
    result = pretrain("tiny", tmp_path / "data", tmp_path / "run", max_steps=2, max_position_embeddings=64,
                      tokenizer=str(tmp_path / "tokenizer"), batch_size=8, eval_batch_size=16, eval_max_batches=2,
                      progress=False, log_every=1, **switches)
    assert set(result.train.metrics) == {"mlm_loss", "mlm_accuracy", "sbo_loss"}
    saved = json.loads((result.final / "config.json").read_text())
    assert saved["architectures"] == ["BertForMaskedLM"] and "bertforge_note" in saved
    model = BertForMaskedLM.from_pretrained(result.final)
    assert model.load_report.ok and model.sbo is not None and len(model.bert.encoder.layers) == 1


def test_pretrain_refuses_sentence_data_for_a_model_without_the_head(tmp_path) -> None:
    from bertforge.pretrain import pretrain

    data = tmp_path / "data"
    data.mkdir()
    (data / "dataset.json").write_text(json.dumps({"options": {"objective": "nsp", "max_seq_length": 16},
                                                   "tokenizer": {"vocab_size": V, "pad_id": 0}}))
    with pytest.raises(ValueError, match="next_sentence_head: false"):
        pretrain("tiny", data, tmp_path / "run", next_sentence_head=False)
