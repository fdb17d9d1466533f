"""ELECTRA: the config both ways, the encoder and every head against transformers in both directions
(embedding tables narrower than the hidden size, and as wide), the discriminator's and generator's
losses, the unpadded path, and the family on bertforge's own paths (fine-tune, pipeline, fill-mask,
serve, int8, ONNX) through the registry alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.model import (
    BertForSequenceClassification,
    ElectraConfig,
    ElectraForMaskedLM,
    ElectraForPreTraining,
    ElectraForSequenceClassification,
    ElectraForTokenClassification,
    ElectraModel,
    config_from_dict,
    load_any,
    registry,
    resolve_config,
    set_labels,
)
from bertforge.model.electra.heads import replaced_token_detection_loss

ATOL = 1e-5
# Small and random: 3 layers, 4 heads of 8, a feed-forward that is not 4H, two token types.
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=40, type_vocab_size=2, pad_token_id=0)
# The embedding width: narrower than H (a projection to H, as in ELECTRA-Small), or H itself (none).
WIDTHS = {"projected": 24, "square": 32}
HEADS = {  # transformers' (and our) class name -> config overrides
    "ElectraModel": {},
    "ElectraForPreTraining": {},
    "ElectraForMaskedLM": {},
    "ElectraForSequenceClassification": {"num_labels": 3},
    "ElectraForTokenClassification": {"num_labels": 5},
    "ElectraForQuestionAnswering": {},
    "ElectraForMultipleChoice": {},
}
CASES = [(name, width) for name in HEADS for width in WIDTHS]


def hf_config(width: str = "projected", **overrides) -> transformers.ElectraConfig:
    config = transformers.ElectraConfig(**{**SIZES, "embedding_size": WIDTHS[width], **overrides})
    config._attn_implementation = "eager"  # the only implementation that returns attention probabilities
    return config


def our_config(width: str = "projected", **overrides) -> ElectraConfig:
    return ElectraConfig(**{**SIZES, "embedding_size": WIDTHS[width], **overrides})


def randomised(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter moved off its initial value (norms away from 1, biases and the padding row
    from 0), so that a mixed-up or skipped weight cannot go unnoticed."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def padded_batch(length: int = 17, rows: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """(rows, length) ids, mask and segments: rows of mixed lengths padded on the right (the first
    full), the second segment from a third of the way."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, SIZES["vocab_size"], (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, rows):
        mask[row, max(1, length * (rows - row) // rows):] = 0
    segments = (torch.arange(length) >= length // 3).long().expand_as(ids) * mask
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "token_type_ids": segments}


def as_choices(batch: dict[str, torch.Tensor], questions: int = 2) -> dict[str, torch.Tensor]:
    """The batch's rows as the choices of `questions` questions: (B, T) -> (questions, B / questions, T)."""
    return {key: value.view(questions, -1, value.shape[-1]) for key, value in batch.items()}


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values at real tokens only: padding positions mean nothing in either library."""
    return x[mask.bool()]


def saved_transformers_model(directory: Path, name: str, width: str = "projected", seed: int = 0,
                             **overrides) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    model = randomised(getattr(transformers, name)(hf_config(width, **{**HEADS[name], **overrides})))
    model.save_pretrained(directory)
    return model


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------------------------
# config.json both ways
# ------------------------------------------------------------------------------------------------
def test_transformers_config_json_reads_and_writes_back_the_same_fields(tmp_path) -> None:
    hf_config(hidden_act="gelu_new", summary_activation="tanh", summary_last_dropout=0.2, classifier_dropout=0.3,
              id2label={0: "no", 1: "yes"}).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["position_embedding_type"] = "absolute"  # what older files carry: read and written back
    ours = config_from_dict(written, source="config.json")
    assert isinstance(ours, ElectraConfig)
    assert (ours.embedding_size, ours.hidden_size, ours.num_hidden_layers, ours.intermediate_size) == (24, 32, 3, 37)
    assert (ours.hidden_act, ours.summary_activation, ours.summary_last_dropout, ours.classifier_dropout) == (
        "gelu_new", "tanh", 0.2, 0.3)
    assert ours.embedding_dim == 24 and ours.head_dim == 8 and ours.hidden_groups == 3
    again = ours.to_dict()
    for key, value in written.items():
        if key not in ("transformers_version", "dtype", "architectures"):
            assert again[key] == value, key


def test_our_config_json_loads_in_transformers(tmp_path) -> None:
    ours = set_labels(our_config(summary_use_proj=False, summary_activation="linear", classifier_dropout=0.25,
                                 hidden_dropout_prob=0.2), ["a", "b", "c"])
    ours.to_json_file(tmp_path / "config.json")
    theirs = transformers.ElectraConfig.from_pretrained(tmp_path)
    assert (theirs.embedding_size, theirs.hidden_size, theirs.num_hidden_layers) == (24, 32, 3)
    assert theirs.summary_use_proj is False and theirs.summary_activation == "linear"
    assert theirs.classifier_dropout == 0.25 and theirs.hidden_dropout_prob == 0.2
    assert theirs.num_labels == 3 and theirs.id2label[2] == "c"


def test_defaults_are_transformers_and_presets_the_released_shapes() -> None:
    ours, theirs = ElectraConfig().to_dict(), transformers.ElectraConfig().to_dict()
    for key, value in ours.items():
        if key in theirs:
            assert theirs[key] == value, key
    names = registry.preset_names()
    assert len(names) == len(set(names))  # unique across families
    for name, reference in (("electra-small-discriminator", transformers.ElectraConfig()),
                            ("electra-base-generator", transformers.ElectraConfig(
                                embedding_size=768, hidden_size=256, num_attention_heads=4, intermediate_size=1024))):
        config = resolve_config(name)
        assert isinstance(config, ElectraConfig)
        with torch.device("meta"):
            count = ElectraModel(config).num_parameters()
            expected = sum(p.numel() for p in transformers.ElectraModel(reference).parameters())
        assert count == expected == config.estimated_parameter_count(), name
    base = resolve_config("electra-base-discriminator", vocab_size=500)
    assert (base.embedding_size, base.hidden_size, base.num_attention_heads, base.vocab_size) == (768, 768, 12, 500)


BAD_CONFIGS = [
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key' is not supported"),
    ({"num_attention_heads": 5}, r"hidden_size \(32\) must be a multiple of num_attention_heads \(5\)"),
    ({"embedding_size": 0}, "embedding_size must be a positive integer"),
    ({"summary_type": "last"}, "summary_type 'last' is not supported"),
    ({"summary_activation": "swish"}, "summary_activation 'swish'"),
    ({"classifier_dropout": 1.5}, r"classifier_dropout must be a number in \[0, 1\)"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings False is not supported"),
    ({"is_decoder": True}, "is_decoder True is not supported"),
    ({"pad_token_id": 120}, "pad_token_id 120 is not an id of the vocabulary"),
]


@pytest.mark.parametrize(("change", "message"), BAD_CONFIGS)
def test_a_bad_config_json_is_one_line_naming_the_field(tmp_path, change: dict, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "electra", **SIZES, **change}))
    with pytest.raises(ValueError, match=f"^{path}: .*{message}") as caught:
        registry.read_config_file(path)
    assert "\n" not in str(caught.value)


def test_the_registry_knows_the_family() -> None:
    assert registry.jobs_of("electra") == [job for job in registry.JOBS if job != "causal-lm"]
    assert registry.model_class("electra", "pretraining") is ElectraForPreTraining  # the discriminator
    assert registry.model_class("electra", "masked-lm") is ElectraForMaskedLM  # the generator
    assert registry.class_for_architecture("ElectraForMultipleChoice").model_type == "electra"
    assert ElectraModel.supports_attention_maps


# ------------------------------------------------------------------------------------------------
# The encoder against transformers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", WIDTHS)
def test_every_hidden_state_and_attention_map_equals_transformers(tmp_path, width: str) -> None:
    theirs = saved_transformers_model(tmp_path, "ElectraModel", width)
    ours, report = load_any(tmp_path)
    assert type(ours) is ElectraModel and report.ok and not report.new_heads and ours.pooler is None
    assert (ours.embeddings_project is None) == (width == "square")  # as transformers has it: only when E != H
    batch = padded_batch()
    mask = batch["attention_mask"]
    with torch.no_grad():
        expected = theirs(**batch, output_hidden_states=True, output_attentions=True)
        out = ours.eval()(**batch, output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == len(expected.hidden_states) == SIZES["num_hidden_layers"] + 1
    for mine, reference in zip(out.hidden_states, expected.hidden_states, strict=True):  # the first after E -> H
        assert max_diff(real(mine, mask), real(reference, mask)) <= ATOL
    for mine, reference in zip(out.attentions, expected.attentions, strict=True):  # (B, A, T, T)
        rows = mask.bool()[:, None, :, None].expand_as(mine)  # real queries (keys at padding get ~0 in both)
        assert max_diff(mine[rows], reference[rows]) <= ATOL
    without_segments = {k: v for k, v in batch.items() if k != "token_type_ids"}
    with torch.no_grad():  # no segment ids: type 0 everywhere, as in transformers
        assert max_diff(real(ours(**without_segments).last_hidden_state, mask),
                        real(theirs(**without_segments).last_hidden_state, mask)) <= ATOL


def test_too_long_an_input_names_the_positions() -> None:
    model = ElectraModel(our_config()).eval()
    model(torch.full((1, 40), 5))
    with pytest.raises(ValueError, match=r"sequence length 41 exceeds max_position_embeddings \(40\)"):
        model(torch.full((1, 41), 5))


# ------------------------------------------------------------------------------------------------
# Every head against transformers, both ways: outputs without labels, the loss with them
# ------------------------------------------------------------------------------------------------
def _inputs(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    batch = padded_batch(rows=6 if name == "ElectraForMultipleChoice" else 4, seed=seed)
    return as_choices(batch) if name == "ElectraForMultipleChoice" else batch


def _labels(name: str, batch: dict[str, torch.Tensor], overrides: dict) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    rows = ids.shape[0]
    if name == "ElectraForPreTraining":  # 0/1 per token: was it replaced?
        return {"labels": torch.randint(0, 2, ids.shape, generator=generator)}
    if name == "ElectraForMaskedLM":
        chosen = (torch.rand(ids.shape, generator=generator) < 0.3) & (mask == 1)
        return {"labels": torch.where(chosen, ids, -100)}
    if name == "ElectraForTokenClassification":
        return {"labels": torch.randint(0, 5, ids.shape, generator=generator).masked_fill(mask == 0, -100)}
    if name == "ElectraForQuestionAnswering":  # inside the real tokens, plus one beyond the window (ignored)
        lengths = mask.sum(1)
        start = torch.minimum(torch.arange(rows) + 1, lengths - 1)
        end = torch.minimum(start + 2, lengths - 1)
        end[-1] = ids.shape[1] + 5
        return {"start_positions": start, "end_positions": end}
    if name == "ElectraForMultipleChoice":
        return {"labels": torch.randint(0, ids.shape[1], (rows,), generator=generator)}
    problem = overrides.get("problem_type")
    if problem == "regression":
        return {"labels": torch.rand(rows, generator=generator) * 5}
    if problem == "multi_label_classification":
        return {"labels": (torch.rand(rows, overrides["num_labels"], generator=generator) > 0.5).float()}
    return {"labels": torch.randint(0, overrides["num_labels"], (rows,), generator=generator)}


def _outputs(name: str, out, mask: torch.Tensor) -> list[torch.Tensor]:
    """A head's outputs at real tokens, from either library's output record."""
    if name == "ElectraModel":
        return [real(state, mask) for state in out.hidden_states]
    if name == "ElectraForQuestionAnswering":
        return [real(out.start_logits, mask), real(out.end_logits, mask)]
    logits = getattr(out, "mlm_logits", None)
    logits = out.logits if logits is None else logits
    per_token = ("ElectraForPreTraining", "ElectraForMaskedLM", "ElectraForTokenClassification")
    return [real(logits, mask)] if name in per_token else [logits]


def _reference_loss(name: str, reference, labels: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """transformers' loss, except for QA: ours keeps spans off padding, so padding is masked out of
    transformers' span distributions too before its loss is compared."""
    if name != "ElectraForQuestionAnswering":
        return reference.loss
    lowest = torch.finfo(torch.float32).min
    length = mask.shape[1]
    loss = 0.0
    for logits, key in ((reference.start_logits, "start_positions"), (reference.end_logits, "end_positions")):
        target = labels[key].masked_fill(labels[key] >= length, -100)
        loss = loss + torch.nn.functional.cross_entropy(logits.masked_fill(mask == 0, lowest), target)
    return loss / 2


def compare(name: str, ours, theirs, overrides: dict, seed: int = 0) -> float:
    """Outputs without labels and the loss with them, ours against transformers': the largest difference."""
    batch = _inputs(name, seed)
    mask = batch["attention_mask"]
    flat_mask = mask.flatten(0, 1) if mask.dim() == 3 else mask
    hidden = {"output_hidden_states": True} if name == "ElectraModel" else {}
    with torch.no_grad():
        diffs = [max_diff(a, b) for a, b in zip(_outputs(name, ours(**batch, **hidden), flat_mask),
                                                 _outputs(name, theirs(**batch, **hidden), flat_mask), strict=True)]
        if name != "ElectraModel":
            labels = _labels(name, batch, overrides)
            mine = ours(**batch, **labels).loss
            assert mine is not None and torch.isfinite(mine)
            diffs.append(max_diff(mine, _reference_loss(name, theirs(**batch, **labels), labels, flat_mask)))
    return max(diffs)


@pytest.mark.parametrize(("name", "width"), CASES)
def test_transformers_checkpoint_loads_with_equal_outputs_and_loss(tmp_path, name: str, width: str) -> None:
    theirs = saved_transformers_model(tmp_path, name, width)
    ours, report = load_any(tmp_path)  # the class config.json names
    assert type(ours).__name__ == name and report.ok and not report.new_heads and not report.unused
    assert compare(name, ours.eval(), theirs, HEADS[name]) <= ATOL


@pytest.mark.parametrize(("name", "width"), CASES)
def test_our_checkpoint_loads_in_transformers_with_equal_outputs_and_loss(tmp_path, name: str, width: str) -> None:
    saved_transformers_model(tmp_path / "theirs", name, width)
    ours = randomised(load_any(tmp_path / "theirs")[0], seed=3)  # new values, so the file is ours alone
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "electra" and saved["architectures"] == [name]
    assert saved["embedding_size"] == WIDTHS[width]
    reloaded, info = getattr(transformers, name).from_pretrained(tmp_path / "ours", output_loading_info=True,
                                                                 attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert compare(name, ours, reloaded.eval(), HEADS[name], seed=1) <= ATOL


@pytest.mark.parametrize(("name", "switches"), [
    ("ElectraForMultipleChoice", {"summary_use_proj": False}),  # the first token's vector as it is
    ("ElectraForMultipleChoice", {"summary_activation": "tanh"}),
    ("ElectraForPreTraining", {"hidden_act": "gelu_new"}),  # the discriminator head follows hidden_act ...
    ("ElectraForMaskedLM", {"hidden_act": "relu"}),  # ... the generator's and classifier's GELU does not
    ("ElectraForSequenceClassification", {"hidden_act": "relu", "num_labels": 3}),
])
def test_head_switches_equal_transformers(tmp_path, name: str, switches: dict) -> None:
    theirs = saved_transformers_model(tmp_path, name, **switches)
    ours, report = load_any(tmp_path)
    assert report.ok and not report.new_heads and not report.unused
    assert compare(name, ours.eval(), theirs, {**HEADS[name], **switches}) <= ATOL


@pytest.mark.parametrize("problem", ["single_label_classification", "regression", "multi_label_classification"])
def test_sequence_classification_loss_equals_transformers(tmp_path, problem: str) -> None:
    overrides = {"num_labels": 1 if problem == "regression" else 3, "problem_type": problem}
    theirs = saved_transformers_model(tmp_path, "ElectraForSequenceClassification", **overrides)
    ours = load_any(tmp_path)[0].eval()
    assert compare("ElectraForSequenceClassification", ours, theirs, overrides) <= ATOL
    if problem == "single_label_classification":  # class weights (classify's balanced): a training setting
        batch = padded_batch()
        labels = _labels("ElectraForSequenceClassification", batch, overrides)["labels"]
        with torch.no_grad():
            plain = ours(**batch, labels=labels).loss
            ours.set_label_weights(torch.tensor([1.0, 1.0, 4.0]))
            assert not torch.isclose(ours(**batch, labels=labels).loss, plain)
        assert "label_weights" not in ours.state_dict()


# ------------------------------------------------------------------------------------------------
# The two pre-training halves
# ------------------------------------------------------------------------------------------------
def test_replaced_token_detection_loss_scores_real_tokens_only() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [0.0, 1.0, -2.0, 4.0]])
    labels = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    real_tokens = mask.bool()
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[real_tokens], labels[real_tokens].float())
    torch.testing.assert_close(replaced_token_detection_loss(logits, labels, mask), expected)
    # without a mask every position is scored; -100 leaves a position out (the special tokens, say)
    everything = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.float())
    torch.testing.assert_close(replaced_token_detection_loss(logits, labels), everything)
    skipped = labels.clone()
    skipped[:, 0] = -100
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, 1:], labels[:, 1:].float())
    torch.testing.assert_close(replaced_token_detection_loss(logits, skipped), expected)
    nothing = logits.clone().requires_grad_()
    zero = replaced_token_detection_loss(nothing, torch.full_like(labels, -100))
    zero.backward()
    assert zero.item() == 0.0 and nothing.grad is not None


def test_discriminator_and_generator_train_and_checkpointing_gives_the_same_loss() -> None:
    torch.manual_seed(0)
    config = our_config()
    batch = padded_batch()
    mask = batch["attention_mask"]
    generator = ElectraForMaskedLM(config).train()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1::3] = batch["input_ids"][:, 1::3]
    labels[mask == 0] = -100
    torch.manual_seed(1)
    out = generator(**batch, labels=labels)
    out.loss.backward()
    assert out.mlm_logits.shape == (int((labels != -100).sum()), SIZES["vocab_size"])  # labelled positions only
    assert generator.electra.embeddings.word_embeddings.weight.grad.abs().sum() > 0  # the tied projection learns
    generator.electra.gradient_checkpointing = True
    torch.manual_seed(1)
    torch.testing.assert_close(generator(**batch, labels=labels).loss, out.loss)

    discriminator = ElectraForPreTraining(config).train()
    replaced = (torch.rand(mask.shape, generator=torch.Generator().manual_seed(2)) < 0.15).long()
    torch.manual_seed(1)
    out = discriminator(**batch, labels=replaced)
    out.loss.backward()
    assert out.logits.shape == mask.shape and torch.isfinite(out.loss)
    assert discriminator.discriminator_predictions.dense_prediction.weight.grad.abs().sum() > 0


def test_pretraining_checkpoints_under_other_heads(tmp_path) -> None:
    """A discriminator checkpoint fine-tunes under a task head (its detection head unused); a generator
    checkpoint under the discriminator reports the detection head as new."""
    saved_transformers_model(tmp_path / "discriminator", "ElectraForPreTraining")
    model = BertForSequenceClassification.from_pretrained(tmp_path / "discriminator", num_labels=4)
    assert type(model) is ElectraForSequenceClassification and model.classifier.out_proj.out_features == 4
    assert all(key.startswith("classifier.") for key in model.load_report.new_heads)
    assert model.load_report.unused == ["discriminator_predictions.dense.bias", "discriminator_predictions.dense.weight",
                                        "discriminator_predictions.dense_prediction.bias",
                                        "discriminator_predictions.dense_prediction.weight"]
    saved_transformers_model(tmp_path / "generator", "ElectraForMaskedLM")
    model = ElectraForPreTraining.from_pretrained(tmp_path / "generator")
    assert model.load_report.ok and all(k.startswith("discriminator_predictions.") for k in model.load_report.new_heads)
    assert model.load_report.unused == ["generator_lm_head.bias", "generator_predictions.dense.bias",  # ours, by name
                                        "generator_predictions.dense.weight", "generator_predictions.layer_norm.bias",
                                        "generator_predictions.layer_norm.weight"]


# ------------------------------------------------------------------------------------------------
# The fast path, dropout sites, layers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", WIDTHS)
def test_the_unpadded_path_equals_the_padded_path(width: str) -> None:
    model = randomised(ElectraForTokenClassification(set_labels(our_config(width), 5)))
    batch = padded_batch(length=23, rows=5)
    mask = batch["attention_mask"]
    with torch.no_grad():
        model.electra.unpad = False
        padded = model(**batch, output_hidden_states=True)
        model.electra.unpad = True
        for per_sequence in (True, False):
            model.electra.attention_per_sequence = per_sequence
            packed = model(**batch, output_hidden_states=True)
            assert max_diff(real(packed.logits, mask), real(padded.logits, mask)) <= ATOL
            for mine, reference in zip(packed.hidden_states, padded.hidden_states, strict=True):
                assert max_diff(real(mine, mask), real(reference, mask)) <= ATOL
        maps = model(**batch, output_attentions=True).attentions  # attention maps take the padded path
    assert len(maps) == SIZES["num_hidden_layers"] and maps[0].shape == (5, SIZES["num_attention_heads"], 23, 23)


@pytest.mark.parametrize("name", ["ElectraForSequenceClassification", "ElectraForMultipleChoice"])
def test_training_mode_places_dropout_as_transformers_does(tmp_path, torch_dropout_draws, name: str) -> None:
    """With the padded path both libraries draw the same dropout masks in the same order, so equal
    training-mode outputs show the same dropout sites (embeddings, layers, and the heads' own)."""
    theirs = saved_transformers_model(tmp_path, name, hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.0,
                                      classifier_dropout=0.3, summary_last_dropout=0.4)
    ours = load_any(tmp_path)[0]
    ours.electra.unpad = False
    batch = _inputs(name)
    ours.train(), theirs.train()
    torch.manual_seed(5)
    mine = ours(**batch).logits
    torch.manual_seed(5)
    reference = theirs(**batch).logits
    torch.manual_seed(6)
    other = theirs(**batch).logits
    assert max_diff(mine, reference) <= ATOL and max_diff(other, reference) > 1e-3


def test_transformer_layers_serve_top_layer_reinitialisation() -> None:
    from bertforge.finetune import reinitialize_top_layers

    model = randomised(ElectraForSequenceClassification(set_labels(our_config(), 2)))
    layers = model.transformer_layers()
    assert len(layers) == SIZES["num_hidden_layers"] and layers is model.electra.encoder.layers
    before = copy.deepcopy(model.state_dict())
    reinitialize_top_layers(model, 1)
    changed = {key for key, value in model.state_dict().items() if not torch.equal(value, before[key])}
    assert any(key.startswith("electra.encoder.layers.2.") for key in changed)
    assert not any(key.startswith(("electra.encoder.layers.0.", "electra.encoder.layers.1.", "electra.embeddings"))
                   for key in changed)


# ------------------------------------------------------------------------------------------------
# bertforge's own paths, found through the registry: int8, ONNX, fine-tune, pipeline, serve
# ------------------------------------------------------------------------------------------------
def test_int8_quantizes_the_encoder_layers() -> None:
    from bertforge.precision import apply_precision, is_quantized

    torch.manual_seed(0)
    reference = randomised(ElectraForSequenceClassification(set_labels(our_config(), 3)))
    batch = padded_batch()
    with torch.no_grad():
        expected = reference(**batch).logits
    model, used = apply_precision(copy.deepcopy(reference), "int8")
    assert used == "int8" and is_quantized(model)
    layer = model.transformer_layers()[0]
    assert all(type(m.weight).__name__ == "Int8Tensor" for m in (layer.attention.qkv, layer.attention.out, layer.ffn.up))
    assert layer.ffn.down.weight.dtype == torch.float32  # the feed-forward output projection stays fp32
    assert type(model.classifier.out_proj.weight) is torch.nn.Parameter  # the head stays fp32
    assert type(model.electra.embeddings_project.weight) is torch.nn.Parameter  # only the layers are quantized
    with torch.no_grad():
        got = model(**batch).logits
    # measured 0.13% to 0.4% of the largest logit over three seeds; the bound is 5x that
    assert got.dtype == torch.float32 and 0 < max_diff(got, expected) <= 0.02 * expected.abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "outputs"), [
    ("ElectraForPreTraining", ["logits"]),  # the discriminator: one logit per token
    ("ElectraForMaskedLM", ["logits"]),
    ("ElectraForSequenceClassification", ["logits"]),
    ("ElectraForQuestionAnswering", ["start_logits", "end_logits"]),
    ("ElectraForMultipleChoice", ["logits"]),
    ("ElectraModel", ["last_hidden_state"]),  # no pooler, so no pooled output
])
def test_onnx_export_matches_pytorch(tmp_path, name: str, outputs: list[str]) -> None:
    pytest.importorskip("onnxscript", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
    pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (the onnx extra)")
    from bertforge.export import export_onnx

    torch.manual_seed(0)
    model = randomised(registry.class_for_architecture(name)(set_labels(our_config(), 3)))
    result = export_onnx(model, tmp_path / "model.onnx")
    assert result.outputs == outputs
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4


SAMPLE = Path(__file__).parent / "fixtures" / "classify"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random discriminator and generator pair, sharing a WordPiece vocabulary trained on the
    sample's words: the generator narrower than the discriminator, as in ELECTRA."""
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("electra")
    words = [line for name in ("reviews.csv", "reviews-dev.csv", "new.csv")
             for line in (SAMPLE / name).read_text(encoding="utf-8").splitlines()[1:]]
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(words * 5) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)
    shape = dict(vocab_size=tokenizer.vocab_size, num_hidden_layers=1, embedding_size=24, max_position_embeddings=64,
                 pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    discriminator = registry.from_preset("electra-small-discriminator", hidden_size=32, num_attention_heads=2,
                                         intermediate_size=64, **shape)
    ElectraForPreTraining(discriminator).save_pretrained(root / "discriminator", tokenizer=tokenizer)
    generator = registry.from_preset("electra-base-generator", hidden_size=16, num_attention_heads=2,
                                     intermediate_size=32, **shape)
    ElectraForMaskedLM(generator).save_pretrained(root / "generator", tokenizer=tokenizer)
    return {"discriminator": root / "discriminator", "generator": root / "generator"}


def test_finetune_predict_pipeline_and_serve_on_own_data(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.finetune import finetune

    out = tmp_path / "run"
    settings = {"train": str(SAMPLE / "reviews.csv"), "dev": str(SAMPLE / "reviews-dev.csv"),
                "test": str(SAMPLE / "new.csv")}
    results = finetune("classify", None, checkpoints["discriminator"], None, out, epochs=2, batch_size=4,
                       max_length=32, task_settings=settings, progress=False, verbose=False)
    assert "accuracy" in results["summary"]
    seed_dir = out / "seed-1"
    model, report = load_any(seed_dir)
    assert type(model) is ElectraForSequenceClassification and report.ok and not report.new_heads
    saved = json.loads((seed_dir / "config.json").read_text())
    assert saved["model_type"] == "electra" and saved["id2label"] == {"0": "negative", "1": "positive"}

    rows = [json.loads(line) for line in (seed_dir / "predictions-test.jsonl").read_text().splitlines()]
    texts = [row["text"] for row in rows]
    classify = pipeline(str(seed_dir))
    assert classify.task == "text-classification"
    answers = classify(texts)
    assert [a["label"] for a in answers] == [row["label"] for row in rows]  # as fine-tuning predicted
    for answer, row in zip(answers, rows, strict=True):
        assert answer["score"] == pytest.approx(row["score"], abs=1e-5)

    # the fine-tuned checkpoint is transformers' too: same logits there, segments included
    theirs = transformers.ElectraForSequenceClassification.from_pretrained(seed_dir).eval()
    encoding = classify.tokenizer.encode(texts[0], texts[1])
    ids, types = torch.tensor([encoding.input_ids]), torch.tensor([encoding.token_type_ids])
    with torch.no_grad():
        assert max_diff(model.eval()(ids, None, types).logits, theirs(ids, token_type_ids=types).logits) <= ATOL

    vectors = pipeline(str(checkpoints["discriminator"]), task="embeddings")(texts)
    assert len(vectors) == len(texts)

    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(seed_dir)) as client:
        answer = client.post("/classify", json={"text": texts[0]})
        assert answer.status_code == 200 and answer.json()["label"] == rows[0]["label"]
        assert client.post("/embed", json={"text": texts[1]}).status_code == 200
        maps = client.post("/attention", json={"text": texts[1]})
        assert maps.status_code == 200, maps.text


def test_fill_mask_pipeline_on_the_generator_checkpoint(checkpoints: dict[str, Path]) -> None:
    from bertforge import pipeline

    fill = pipeline(str(checkpoints["generator"]))
    assert fill.task == "fill-mask"
    [[candidates]] = fill(["a gripping [MASK]"])  # one text, one mask
    model = ElectraForMaskedLM.from_pretrained(checkpoints["generator"]).eval()
    assert model.electra.embeddings_project.in_features == 24  # the shared tables' width, projected to H 16
    encoding = fill.tokenizer.encode("a gripping [MASK]")
    position = encoding.input_ids.index(fill.tokenizer.mask_token_id)
    with torch.no_grad():
        logits = model(torch.tensor([encoding.input_ids])).mlm_logits[0, position]
    logits[sorted(set(fill.tokenizer.all_special_ids))] = -torch.inf
    assert [c["token_id"] for c in candidates] == logits.topk(len(candidates)).indices.tolist()
    theirs = transformers.ElectraForMaskedLM.from_pretrained(checkpoints["generator"]).eval()
    with torch.no_grad():
        reference = theirs(torch.tensor([encoding.input_ids])).logits[0, position]
    reference[sorted(set(fill.tokenizer.all_special_ids))] = -torch.inf
    assert reference.topk(len(candidates)).indices.tolist() == [c["token_id"] for c in candidates]
