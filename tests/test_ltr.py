"""The left-to-right (LTR) objective: a causal BERT (`is_decoder: true`) trained to predict the next token,
the BERT paper's "LTR & No NSP" ablation.

Checked here: the causal property on every attention path (padded, packed one sequence at a time,
packed and re-padded, with left and right padding, attention maps); parity with transformers'
BertModel(is_decoder=True) and BertLMHeadModel within 1e-5 on a padded batch of mixed lengths, logits
and loss; a save loading in transformers and back; `pretrain` with objective ltr on shards prepared
for NSP (masks undone, no sentence label) with its loss falling; fine-tuning the result; and the
sentence heads reading the last real token.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import transformers

from bertforge import BertConfig, BertForMultipleChoice, BertForSequenceClassification, BertModel
from bertforge.config import IGNORE_INDEX
from bertforge.model import BertLMHeadModel, load_any, registry
from bertforge.pretrain import DataOptions, pretrain
from bertforge.train import read_metrics

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
QUIET = {"progress": False, "verbose": False, "epochs": 1, "batch_size": 4}

# (row length, padding side): right padding as the collators write it, left padding and a full row
LENGTHS = ((9, "right"), (5, "right"), (7, "left"), (1, "right"))
# Batches that take different branches of `run_layers`: a left-padded row needs the causal + padding
# bias on the re-padded path, right padding alone takes SDPA's is_causal there, and so does no padding.
PADDINGS = {"mixed": LENGTHS, "right only": ((9, "right"), (5, "right"), (7, "right"), (1, "right")),
            "none": ((9, "right"),) * 3}


def tiny(**overrides) -> BertConfig:
    values = dict(vocab_size=99, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, is_decoder=True,
                  max_position_embeddings=32)
    return BertConfig.from_preset("tiny", **{**values, **overrides})


def padded_batch(seed: int = 0, width: int = 9, rows=LENGTHS) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and mask: rows of these (length, side), padded on their side."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (length, side) in enumerate(rows):
        real = slice(0, length) if side == "right" else slice(width - length, width)
        ids[row, real] = torch.randint(5, 99, (length,), generator=generator)
        mask[row, real] = 1
    return ids, mask


# (unpad, attention_per_sequence, grad enabled, output_attentions): every path `run_layers` takes
PATHS = {
    "padded": (False, None, False, False),
    "packed per sequence": (True, True, False, False),
    "packed, re-padded": (True, False, False, False),
    "packed, re-padded, training": (True, None, True, False),
    "attention maps": (True, None, False, True),
}


def encode(model: BertModel, ids: torch.Tensor, mask: torch.Tensor, path: str) -> torch.Tensor:
    unpad, per_sequence, grad, attentions = PATHS[path]
    model.unpad, model.attention_per_sequence = unpad, per_sequence
    with torch.set_grad_enabled(grad):
        return model(ids, mask, output_attentions=attentions).last_hidden_state.detach()


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("path", list(PATHS))
def test_a_position_sees_nothing_after_it(path: str, padding: str) -> None:
    torch.manual_seed(0)
    causal = BertModel(tiny()).eval()
    ids, mask = padded_batch(rows=PADDINGS[padding])
    before = encode(causal, ids, mask, path)
    for position in range(ids.shape[1] - 1):
        changed = ids.clone()
        later = mask.clone()
        later[:, :position + 1] = 0  # the real tokens after `position`
        changed[later.bool()] = (changed[later.bool()] + 7) % 94 + 5
        after = encode(causal, changed, mask, path)
        seen = mask.bool().clone()
        seen[:, position + 1:] = False  # real tokens at or before `position`
        torch.testing.assert_close(after[seen], before[seen], atol=1e-6, rtol=0)
        assert not torch.allclose(after[later.bool()], before[later.bool()], atol=1e-3)  # the change did reach them
    # the same test fails for the bidirectional model on the same weights
    bidirectional = BertModel(tiny(is_decoder=False)).eval()
    bidirectional.load_state_dict(causal.state_dict())
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 7) % 94 + 5
    assert not torch.allclose(encode(bidirectional, changed, mask, path)[0, 0], encode(bidirectional, ids, mask, path)[0, 0])


# What each (path, padding) hands SDPA: is_causal without a mask where that is exact, else the bias
EXPECTED_SDPA = {
    ("packed per sequence", "mixed"): "is_causal", ("packed per sequence", "right only"): "is_causal",
    ("packed, re-padded", "mixed"): "bias", ("packed, re-padded", "right only"): "is_causal",
    ("packed, re-padded, training", "mixed"): "bias", ("packed, re-padded, training", "right only"): "is_causal",
    ("padded", "mixed"): "bias", ("padded", "right only"): "bias",
    **{(path, "none"): "is_causal" for path in PATHS if path != "attention maps"},
}


@pytest.mark.parametrize(("path", "padding"), list(EXPECTED_SDPA))
def test_each_path_masks_the_future_the_cheap_way_where_exact(path: str, padding: str, monkeypatch) -> None:
    import bertforge.model.layers as layers

    calls = []
    real_sdpa = layers.F.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kwargs):
        calls.append((attn_mask is not None and attn_mask.shape[-2] == query.shape[-2] > 1, is_causal))
        return real_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    ids, mask = padded_batch(rows=PADDINGS[padding])
    encode(BertModel(tiny()).eval(), ids, mask, path)
    expected = (False, True) if EXPECTED_SDPA[(path, padding)] == "is_causal" else (True, False)
    assert calls and all(call == expected for call in calls), calls


@pytest.mark.parametrize("padding", list(PADDINGS))
@pytest.mark.parametrize("path", list(PATHS))
def test_encoder_and_lm_head_match_transformers(path: str, padding: str, tmp_path: Path) -> None:
    torch.manual_seed(1)
    ours = BertLMHeadModel(tiny()).eval()
    ours.save_pretrained(tmp_path)
    unpad, per_sequence, grad, attentions = PATHS[path]
    kernel = "eager" if attentions else "sdpa"  # transformers' SDPA path returns no attention maps
    theirs = transformers.BertLMHeadModel.from_pretrained(tmp_path, attn_implementation=kernel).eval()
    assert theirs.config.is_decoder
    ids, mask = padded_batch(seed=2, rows=PADDINGS[padding])
    real = mask.bool()
    ours.bert.unpad, ours.bert.attention_per_sequence = unpad, per_sequence
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    # each row's first token is predicted by nothing (transformers would score the left pad before it)
    labels[torch.arange(ids.shape[0]), mask.argmax(dim=1)] = IGNORE_INDEX
    with torch.set_grad_enabled(grad):
        mine = ours(ids, mask, output_attentions=attentions)
        ref = theirs(input_ids=ids, attention_mask=mask, output_attentions=attentions)
        torch.testing.assert_close(mine.logits[real], ref.logits[real], atol=1e-5, rtol=0)
        if attentions:  # every head's map is lower-triangular on real tokens, and transformers' own
            for a, b in zip(mine.attentions, ref.attentions, strict=True):
                for row in range(ids.shape[0]):
                    keep = real[row]
                    torch.testing.assert_close(a[row][:, keep][:, :, keep], b[row][:, keep][:, :, keep], atol=1e-5,
                                               rtol=0)
                    assert torch.all(a[row][:, keep][:, :, keep].triu(1) == 0)
        # the loss, with transformers' shifting: logits at i against labels[i + 1]
        loss, ref_loss = ours(ids, mask, labels=labels).loss, theirs(input_ids=ids, attention_mask=mask,
                                                                      labels=labels).loss
        torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=0)
        # the bare causal encoder against transformers' BertModel(is_decoder=True), pooler included
        encoder = BertModel(tiny()).eval()
        encoder.save_pretrained(tmp_path / "encoder")
        encoder.unpad, encoder.attention_per_sequence = unpad, per_sequence
        hf_encoder = transformers.BertModel.from_pretrained(tmp_path / "encoder").eval()
        assert hf_encoder.config.is_decoder
        a, b = encoder(ids, mask), hf_encoder(input_ids=ids, attention_mask=mask)
        torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=0)
        first_real = mask[:, 0].bool()  # [CLS]'s pooled vector, where position 0 is a token (not left padding)
        torch.testing.assert_close(a.pooled_output[first_real], b.pooler_output[first_real], atol=1e-5, rtol=0)


def test_with_labels_logits_cover_the_scored_positions_only() -> None:
    torch.manual_seed(3)
    model = BertLMHeadModel(tiny()).eval()
    ids, mask = padded_batch()
    labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
    with torch.no_grad():
        full = model(ids, mask).logits  # (B, T, V)
        scored = model(ids, mask, labels=labels)
    # position i predicts the token at i + 1, unless it is padding (the left pad before row 2's first token)
    following = (labels[:, 1:] != IGNORE_INDEX) & (mask[:, :-1] == 1)
    assert following.sum() == (labels[:, 1:] != IGNORE_INDEX).sum() - 1
    assert scored.logits.shape == (int(following.sum()), 99)
    torch.testing.assert_close(scored.logits, full[:, :-1][following], atol=1e-5, rtol=0)
    manual = torch.nn.functional.cross_entropy(full[:, :-1][following], labels[:, 1:][following])
    torch.testing.assert_close(scored.loss, manual, atol=1e-5, rtol=0)


def test_a_save_moves_both_ways_with_transformers(tmp_path: Path) -> None:
    torch.manual_seed(4)
    ours = BertLMHeadModel(tiny())
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["is_decoder"] is True and saved["architectures"] == ["BertLMHeadModel"]
    theirs, info = transformers.BertLMHeadModel.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    theirs.save_pretrained(tmp_path / "theirs")
    back, report = load_any(tmp_path / "theirs")
    assert type(back) is BertLMHeadModel and back.config.is_decoder and report.ok
    ids, mask = padded_batch()
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(ids, mask).logits[mask.bool()],
                                   ours.eval()(ids, mask).logits[mask.bool()], atol=1e-6, rtol=0)
    # a plain BERT's config.json does not grow the switch
    BertModel(tiny(is_decoder=False)).save_pretrained(tmp_path / "plain")
    assert "is_decoder" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    with pytest.raises(ValueError, match="add_cross_attention"):
        BertConfig.from_dict({"is_decoder": True, "add_cross_attention": True})


def test_the_sentence_heads_read_the_last_real_token() -> None:
    torch.manual_seed(5)
    config = tiny()
    config.extra.update(num_labels=3)
    classifier = BertForSequenceClassification(config).eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        logits = classifier(ids, mask).logits  # (B, 3)
        hidden = classifier.bert(ids, mask).last_hidden_state  # (B, T, H)
        last = torch.tensor([8, 4, 8, 0])  # LENGTHS: 9 right, 5 right, 7 left (ends at 8), 1 right
        expected = classifier.classifier(torch.tanh(classifier.bert.pooler.dense(hidden[torch.arange(4), last])))
        torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)
        # only the last real token matters to a causal classifier: change the one before it and it
        # changes, change padding and it does not
        changed = ids.clone()
        changed[1, 3] = (changed[1, 3] + 7) % 94 + 5
        assert not torch.allclose(classifier(changed, mask).logits[1], logits[1])
        changed = ids.clone()
        changed[1, 6] = 42  # padding of row 1
        torch.testing.assert_close(classifier(changed, mask).logits, logits, atol=1e-6, rtol=0)
        # a bidirectional BERT still reads [CLS]'s pooled vector
        plain = BertForSequenceClassification(BertConfig(**{**config.__dict__, "is_decoder": False})).eval()
        plain.load_state_dict(classifier.state_dict())
        out = plain.bert(ids, mask)
        torch.testing.assert_close(plain(ids, mask).logits, plain.classifier(out.pooled_output), atol=1e-6, rtol=0)

        chooser = BertForMultipleChoice(config).eval()
        choices = torch.stack([ids, ids.flip(0)])  # (2, 4, T)
        masks = torch.stack([mask, mask.flip(0)])
        scores = chooser(choices, masks).logits  # (2, 4)
        flat = chooser.bert(choices.flatten(0, 1), masks.flatten(0, 1)).last_hidden_state  # (8, T, H)
        lasts = torch.cat([last, last.flip(0)])
        vectors = torch.tanh(chooser.bert.pooler.dense(flat[torch.arange(8), lasts]))
        torch.testing.assert_close(scores, chooser.classifier(vectors).view(2, 4), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# pre-training and fine-tuning
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Shards prepared for BERT's MLM + NSP with static masking: objective ltr must read them too."""
    from bertforge.data.prepare import prepare
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("ltr-shards")
    tokenizer = BertTokenizer.train([FIXTURES / "gutenberg_sample.txt"], vocab_size=400, show_progress=False)
    tokenizer.save_pretrained(root / "tokenizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one book: NotNext partners fall back, and prepare says so
        prepare([FIXTURES / "gutenberg_sample.txt"], root / "tokenizer", root / "data", max_seq_length=64,
                plain_text=True, objective="nsp", masking="static", dupe_factor=1, validation_fraction=0.1,
                block_sentences=16, progress=False)
    return root / "data", root / "tokenizer"


def test_next_token_batches_undo_the_static_masks(shards) -> None:
    from bertforge.data.loader import PretrainingLoader

    data, tokenizer = shards
    mask_id = json.loads((data / "dataset.json").read_text())["tokenizer"]["mask_id"]
    for split in ("train", "valid"):
        masked = next(iter(PretrainingLoader(data, 8, split=split, shuffle=False)))
        batch = next(iter(PretrainingLoader(data, 8, split=split, shuffle=False, next_token=True)))
        assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}  # no sentence label
        assert (masked["input_ids"] == mask_id).any() and not (batch["input_ids"] == mask_id).any()
        predicted = masked["labels"] != IGNORE_INDEX
        assert torch.equal(batch["input_ids"][predicted], masked["labels"][predicted])  # the originals back
        assert torch.equal(batch["input_ids"][~predicted], masked["input_ids"][~predicted])
        real = batch["attention_mask"].bool()
        assert torch.equal(batch["labels"][real], batch["input_ids"][real])
        assert (batch["labels"][~real] == IGNORE_INDEX).all()
    with pytest.raises(ValueError, match="mask_rate"):
        DataOptions(objective="ltr", mask_rate=0.3)


@pytest.fixture(scope="module")
def ltr_run(shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    data, tokenizer = shards
    run = tmp_path_factory.mktemp("ltr-run") / "run"
    pretrain("tiny", data, run, objective="ltr", max_steps=40, eval_every=10, save_every=40, lr=2e-3,
             warmup_steps=4, tokenizer=str(tokenizer), max_position_embeddings=64, batch_size=8,
             eval_batch_size=16, eval_max_batches=4, progress=False, log_every=5)
    return run


def test_pretrain_ltr_learns_the_next_token_and_exports_transformers_bertlmheadmodel(ltr_run: Path) -> None:
    records = read_metrics(ltr_run)
    evals = [r for r in records if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20, 30, 40]
    assert {"next_token_loss", "next_token_accuracy", "perplexity"} <= evals[-1].keys()
    assert "mlm_loss" not in evals[-1] and "nsp_loss" not in evals[-1]
    losses = [r["next_token_loss"] for r in evals]  # measured: 5.42, 5.31, 5.24, 5.21 (ln(400) = 6.0 at random)
    assert all(later < earlier for earlier, later in zip(losses, losses[1:], strict=False))
    assert losses[-1] < losses[0] - 0.1
    assert evals[-1]["perplexity"] == pytest.approx(2.718281828 ** losses[-1], rel=1e-6)
    trains = [r["loss"] for r in records if r["split"] == "train"]
    # the training loss falls too: about 5.7 -> 5.2 (a drop of 0.497 in one run at another thread count)
    assert sum(trains[-2:]) / 2 < sum(trains[:2]) / 2 - 0.3

    final = ltr_run / "final"
    config = json.loads((final / "config.json").read_text())
    assert config["is_decoder"] is True and config["architectures"] == ["BertLMHeadModel"]
    ours = load_any(final)[0].eval()
    assert type(ours) is registry.model_class("bert", "causal-lm")
    theirs = transformers.BertLMHeadModel.from_pretrained(final).eval()
    ids = torch.tensor([[2, 50, 60, 70, 4, 80, 3, 90, 100, 3, 0, 0], [2, 51, 61, 3, 0, 0, 0, 0, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        mine, ref = ours(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(mine[mask.bool()], ref[mask.bool()], atol=1e-5, rtol=0)


def test_ltr_refuses_what_it_cannot_train(shards, tmp_path: Path) -> None:
    data, tokenizer = shards
    with pytest.raises(ValueError, match="left-to-right LM head"):
        pretrain("modern-mini", data, tmp_path / "modern", objective="ltr", max_steps=1, num_hidden_layers=1,
                 progress=False)
    with pytest.raises(ValueError, match="span_boundary_objective"):
        pretrain("tiny", data, tmp_path / "sbo", objective="ltr", max_steps=1, span_boundary_objective=True,
                 max_position_embeddings=64, progress=False)


def test_an_ltr_checkpoint_fine_tunes_causally_in_every_task_family(ltr_run: Path, tmp_path: Path) -> None:
    from bertforge.finetune import finetune
    from bertforge.model import load_for_job

    model = ltr_run / "final"
    conll, squad, swag = tmp_path / "conll", tmp_path / "squad", tmp_path / "swag"
    for directory, source, names in ((conll, TASKS / "conll" / "with_docstart.txt", ("eng.train", "eng.testa", "eng.testb")),
                                     (squad, TASKS / "squad" / "v2.json", ("train-v1.1.json", "dev-v1.1.json")),
                                     (swag, TASKS / "swag" / "sample.jsonl", ("train.jsonl", "val.jsonl", "test.jsonl"))):
        directory.mkdir()
        for name in names:
            shutil.copy(source, directory / name)
    tagged, squad_v2 = tmp_path / "tagged.txt", str(TASKS / "squad" / "v2.json")
    shutil.copy(TASKS / "conll" / "without_docstart.txt", tagged)
    reviews = FIXTURES / "classify"
    runs = {  # family: (task, data, settings)
        "glue": ("SST-2", TASKS / "glue", {"max_length": 24}),
        "ner": ("conll2003", conll, {"max_length": 12}),
        "squad": ("v1.1", squad, {"max_length": 48, "task_settings": {"doc_stride": 8}}),
        "swag": ("swag", swag, {"max_length": 24}),
        "classify": (None, None, {"max_length": 24, "task_settings": {"train": str(reviews / "reviews.csv"),
                                                                        "dev": str(reviews / "reviews-dev.csv")}}),
        "tag": ("tag", None, {"max_length": 12, "task_settings": {"train": str(tagged), "dev": str(tagged)}}),
        "qa": ("qa", None, {"max_length": 48, "task_settings": {"train": squad_v2, "dev": squad_v2, "doc_stride": 8}}),
    }
    for family, (task, data, settings) in runs.items():
        results = finetune(family, task, model, data, tmp_path / family, **QUIET, **settings)
        assert results["seeds"][0]["metrics"], family
    for family, job in (("glue", "sequence-classification"), ("tag", "token-classification"),
                        ("swag", "multiple-choice"), ("qa", "question-answering")):
        directory = tmp_path / family / "seed-1"
        tuned = load_for_job(directory, job).eval()
        assert tuned.config.is_decoder  # still left to right after fine-tuning
        encoder = tuned.bert
        ids = torch.tensor([[2, 50, 60, 70, 3], [2, 51, 61, 71, 3]])
        with torch.no_grad():
            a = encoder(ids).last_hidden_state
            b = encoder(torch.tensor([[2, 50, 60, 99, 3], [2, 51, 61, 98, 3]])).last_hidden_state
        torch.testing.assert_close(a[:, :3], b[:, :3], atol=1e-6, rtol=0)
