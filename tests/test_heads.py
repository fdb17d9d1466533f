"""Fine-tuning heads against transformers: same keys both ways, same logits, same loss."""

from __future__ import annotations

import pytest
import torch
import transformers

from bertforge import (
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertforge.model import label_names, set_labels

ATOL = 1e-5


def config(labels: int | list[str] = 3) -> BertConfig:
    return set_labels(BertConfig(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=64, max_position_embeddings=32), labels)


def inputs(shape: tuple[int, ...] = (3, 10)) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, shape, generator=gen)
    mask = torch.ones_like(ids)
    mask[..., -3:] = torch.randint(0, 2, mask[..., -3:].shape, generator=gen).sort(dim=-1, descending=True).values
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(shape[-1]) >= 5).long().expand(shape)}


def with_padding_ignored(labels: dict[str, torch.Tensor], mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Token labels are -100 at padding, as every collator writes them."""
    if "labels" in labels and labels["labels"].dim() == 2:
        return {"labels": labels["labels"].masked_fill(mask == 0, -100)}
    return labels


def span_loss_without_padding(ref, labels: dict[str, torch.Tensor], real: torch.Tensor) -> torch.Tensor:
    lowest = torch.finfo(torch.float32).min
    length = real.shape[1]
    loss = 0.0
    for logits, key in ((ref.start_logits, "start_positions"), (ref.end_logits, "end_positions")):
        target = labels[key].masked_fill(labels[key] >= length, -100)  # beyond the window: ignored
        loss = loss + torch.nn.functional.cross_entropy(logits.masked_fill(~real, lowest), target)
    return loss / 2


CASES = [
    (BertForSequenceClassification, transformers.BertForSequenceClassification, {"labels": torch.tensor([0, 2, 1])}, 3),
    (BertForSequenceClassification, transformers.BertForSequenceClassification, {"labels": torch.tensor([0.5, 2.0, 4.5])}, 1),
    (BertForTokenClassification, transformers.BertForTokenClassification,
     {"labels": torch.tensor([[-100, 1, 2, 0, -100, 3, 1, 0, 0, -100]] * 3)}, 4),
    (BertForQuestionAnswering, transformers.BertForQuestionAnswering,
     {"start_positions": torch.tensor([1, 0, 4]), "end_positions": torch.tensor([3, 0, 12])}, 2),
]


@pytest.mark.parametrize(("ours_cls", "hf_cls", "labels", "n"), CASES, ids=["seqcls", "regression", "token", "qa"])
def test_heads_match_transformers(ours_cls, hf_cls, labels, n, tmp_path) -> None:
    torch.manual_seed(0)
    ours = ours_cls(config(n)).eval()
    ours.save_pretrained(tmp_path)
    theirs, info = hf_cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    theirs.eval()
    batch = inputs()
    real = batch["attention_mask"].bool()
    labels = with_padding_ignored(labels, batch["attention_mask"])
    with torch.no_grad():
        out, ref = ours(**batch, **labels), theirs(**batch, **labels)
    if ours_cls is BertForQuestionAnswering:
        # Ours excludes padding from the span distributions; transformers lets padding compete.
        # On real tokens the logits agree; the loss agrees once transformers' padding is masked too.
        torch.testing.assert_close(out.start_logits[real], ref.start_logits[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(out.end_logits[real], ref.end_logits[real], atol=ATOL, rtol=0)
        assert (out.start_logits[~real] < -1e30).all()
        torch.testing.assert_close(out.loss, span_loss_without_padding(ref, labels, real), atol=ATOL, rtol=1e-5)
    else:
        # Token logits at padding carry no meaning (the fast path leaves them from zero vectors).
        logits, ref_logits = (out.logits[real], ref.logits[real]) if out.logits.dim() == 3 else (out.logits, ref.logits)
        torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=1e-5)
    # And back: the transformers checkpoint loads here with nothing missing.
    theirs.save_pretrained(tmp_path / "hf")
    again = ours_cls.from_pretrained(tmp_path / "hf")
    assert again.load_report.ok and not again.load_report.new_heads


def test_multiple_choice_matches_transformers(tmp_path) -> None:
    torch.manual_seed(1)
    ours = BertForMultipleChoice(config()).eval()
    ours.save_pretrained(tmp_path)
    theirs = transformers.BertForMultipleChoice.from_pretrained(tmp_path).eval()
    batch = inputs((2, 4, 10))  # (B, C, T)
    labels = torch.tensor([3, 1])
    with torch.no_grad():
        out, ref = ours(**batch, labels=labels), theirs(**batch, labels=labels)
    assert out.logits.shape == (2, 4)
    torch.testing.assert_close(out.logits, ref.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(out.loss, ref.loss, atol=ATOL, rtol=1e-5)


def test_pretrained_encoder_into_a_task_head_reports_the_new_head(tmp_path) -> None:
    """The fine-tuning start: a pre-trained checkpoint, one new output layer."""
    torch.manual_seed(2)
    pretrained = BertForPreTraining(config())
    pretrained.save_pretrained(tmp_path)
    model = BertForSequenceClassification.from_pretrained(tmp_path)
    report = model.load_report
    assert report.ok
    assert report.new_heads == ["classifier.bias", "classifier.weight"]
    assert set(report.unused) >= {"mlm.bias", "nsp.weight"}
    assert torch.equal(model.bert.encoder.layers[1].ffn.up.weight, pretrained.bert.encoder.layers[1].ffn.up.weight)


def test_label_names_are_saved_for_transformers(tmp_path) -> None:
    BertForSequenceClassification(config(["negative", "positive"])).save_pretrained(tmp_path)
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path)
    assert theirs.config.id2label == {0: "negative", 1: "positive"}
    assert BertForSequenceClassification.from_pretrained(tmp_path).num_labels == 2


def test_label_names_read_back_in_id_order() -> None:
    assert label_names(config(["O", "B-PER", "I-PER"])) == ["O", "B-PER", "I-PER"]
    shuffled = BertConfig(extra={"id2label": {"1": "positive", "0": "negative"}})
    assert label_names(shuffled) == ["negative", "positive"]
    assert label_names(BertConfig(extra={"id2label": {0: "a", 2: "c", 1: "b"}})) == ["a", "b", "c"]  # int keys
    assert label_names(BertConfig()) == []


@pytest.mark.parametrize("head", [BertForTokenClassification, BertForQuestionAnswering])
def test_pooler_in_the_file_is_unused_not_an_error_for_token_heads(head, tmp_path) -> None:
    """Tagging and span QA read every token, so they have no pooler; an encoder file with one (most
    pre-trained BERTs) loads strictly, its pooler listed as unused, as in transformers."""
    BertForPreTraining(config()).save_pretrained(tmp_path)
    model = head.from_pretrained(tmp_path)  # strict by default
    assert model.load_report.ok and not model.load_report.unexpected
    assert {"bert.pooler.dense.weight", "bert.pooler.dense.bias"} <= set(model.load_report.unused)
