"""ALBERT: the config both ways, the encoder (factorised embeddings, shared layer groups) and every head
against transformers (outputs, losses, both checkpoint round trips), the packed path against the
padded one, and the family on bertforge's own paths (fine-tune, predict, pipeline, serve, int8, ONNX)
through the registry alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.model import (
    AlbertConfig,
    AlbertForMaskedLM,
    AlbertForPreTraining,
    AlbertForSequenceClassification,
    AlbertModel,
    BertForSequenceClassification,
    config_from_dict,
    load_any,
    registry,
    resolve_config,
    set_labels,
)
from bertforge.model.layers import EncoderLayer

ATOL = 1e-5
# Small and random: E != H, a feed-forward that is not 4H, and 4 layers sharing 2 groups (depths 0-1
# run group 0, depths 2-3 group 1).
SIZES = dict(vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=4, num_hidden_groups=2,
             num_attention_heads=4, intermediate_size=48, max_position_embeddings=64, pad_token_id=0)
# (layers, groups): one group for all depths as in every released model, two shared groups, no sharing.
SHARINGS = [(3, 1), (4, 2), (3, 3)]
SHARING_IDS = ["one-group", "two-groups", "no-sharing"]


def hf_config(**overrides) -> transformers.AlbertConfig:
    # eager attention: the only implementation that returns attention probabilities
    config = transformers.AlbertConfig(**{**SIZES, **overrides})
    config._attn_implementation = "eager"
    return config


def randomised(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter moved off its initial value (norms away from 1, biases from 0), so that a
    mixed-up or skipped weight cannot go unnoticed."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def padded_batch(length: int = 20, rows: int = 4,
                 choices: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, length) ids, a mask and token types (a second segment from the middle of each row), each
    row padded on the right to its own length (the first row full); (rows, choices, length) for
    multiple choice."""
    generator = torch.Generator().manual_seed(length + rows)
    count = rows * (choices or 1)
    ids = torch.randint(3, SIZES["vocab_size"], (count, length), generator=generator)
    mask = torch.ones_like(ids)
    types = torch.zeros_like(ids)
    for row in range(count):
        real = max(1, length * (count - row) // count)
        mask[row, real:] = 0
        ids[row, real:] = 0
        types[row, real // 2:real] = 1
    if choices is not None:
        shape = (rows, choices, length)
        return ids.view(shape), mask.view(shape), types.view(shape)
    return ids, mask, types


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values at real tokens only: padding positions mean nothing in either library."""
    return x[mask.bool()]


def saved_transformers_model(directory: Path, name: str, seed: int = 0,
                             **overrides) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    model = randomised(getattr(transformers, name)(hf_config(**overrides)))
    model.save_pretrained(directory)
    return model


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------------------------
# config.json both ways
# ------------------------------------------------------------------------------------------------
def test_transformers_config_json_reads_and_writes_back_the_same_fields(tmp_path) -> None:
    hf_config(hidden_act="gelu", classifier_dropout_prob=0.3, hidden_dropout_prob=0.1, type_vocab_size=3,
              id2label={0: "no", 1: "yes"}).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["down_scale_factor"] = 1  # the released files carry keys of the original code: kept and written back
    ours = config_from_dict(written, source="config.json")
    assert isinstance(ours, AlbertConfig)
    assert (ours.embedding_size, ours.hidden_size, ours.num_hidden_layers, ours.num_hidden_groups,
            ours.inner_group_num, ours.intermediate_size) == (16, 32, 4, 2, 1, 48)
    assert ours.hidden_act == "gelu" and ours.classifier_dropout_prob == 0.3 and ours.type_vocab_size == 3
    assert (ours.bos_token_id, ours.eos_token_id, ours.extra["down_scale_factor"]) == (2, 3, 1)
    again = ours.to_dict()
    for key, value in written.items():
        if key not in ("transformers_version", "dtype", "architectures"):
            assert again[key] == value, key


def test_our_config_json_loads_in_transformers(tmp_path) -> None:
    ours = set_labels(AlbertConfig(**SIZES, hidden_dropout_prob=0.2, classifier_dropout_prob=0.3), ["a", "b", "c"])
    ours.to_json_file(tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "albert" and "embedding_size" in saved and "num_hidden_groups" in saved
    theirs = transformers.AlbertConfig.from_pretrained(tmp_path)
    assert (theirs.embedding_size, theirs.hidden_size, theirs.num_hidden_layers, theirs.num_hidden_groups) == (
        16, 32, 4, 2)
    assert theirs.hidden_act == "gelu_new" and theirs.hidden_dropout_prob == 0.2
    assert theirs.classifier_dropout_prob == 0.3 and theirs.num_labels == 3 and theirs.id2label[2] == "c"


def test_generic_code_reads_the_config() -> None:
    config = AlbertConfig(**SIZES)
    assert (config.embedding_dim, config.hidden_groups, config.head_dim, config.max_tokens) == (16, 2, 8, 64)
    assert config.next_sentence_head and not config.span_boundary_objective
    assert config.with_overrides(num_hidden_groups=4).hidden_groups == 4
    assert AlbertConfig(**SIZES, classifier_dropout_prob=None, hidden_dropout_prob=0.2).head_dropout == 0.2


@pytest.mark.parametrize(("change", "message"), [
    ({"num_hidden_groups": 3}, r"num_hidden_layers \(4\) must be a multiple of num_hidden_groups \(3\)"),
    ({"position_embedding_type": "relative_key"}, r"position_embedding_type 'relative_key' is not supported"),
    ({"inner_group_num": 2}, r"inner_group_num 2 is not supported"),
    ({"num_attention_heads": 5}, r"hidden_size \(32\) must be a multiple of num_attention_heads \(5\)"),
    ({"embedding_size": 0}, r"embedding_size must be a positive integer"),
    ({"hidden_act": "swish"}, r"hidden_act 'swish'"),
    ({"tie_word_embeddings": False}, r"tie_word_embeddings must be true"),
    ({"classifier_dropout_prob": 1.5}, r"classifier_dropout_prob must be"),
])
def test_bad_configs_are_refused_in_one_line_naming_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        config_from_dict({"model_type": "albert", **SIZES, **change}, source="config.json")
    assert "\n" not in str(caught.value) and str(caught.value).startswith("config.json: ")


def test_presets_build_albert_base_v2_exactly() -> None:
    names = registry.preset_names()
    assert len(names) == len(set(names))  # unique across families
    base = resolve_config("albert-base")
    assert isinstance(base, AlbertConfig)
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.embedding_size,
            base.intermediate_size, base.num_hidden_groups, base.vocab_size) == (12, 768, 12, 128, 3072, 1, 30000)
    with torch.device("meta"):
        ours = AlbertModel(base)
        theirs = transformers.AlbertModel(transformers.AlbertConfig(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072))  # albert-base-v2's sizes
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters()) == base.estimated_parameter_count()
    assert resolve_config("albert-tiny", vocab_size=500).vocab_size == 500


def test_the_registry_knows_the_family() -> None:
    assert registry.jobs_of("albert") == ["embeddings", "pretraining", "masked-lm", "sequence-classification",
                                          "token-classification", "question-answering", "multiple-choice"]
    assert registry.model_class("albert", "pretraining") is AlbertForPreTraining
    assert AlbertModel.supports_attention_maps


# ------------------------------------------------------------------------------------------------
# The encoder against transformers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("layers", "groups"), SHARINGS, ids=SHARING_IDS)
def test_every_hidden_state_and_attention_map_equals_transformers(tmp_path, layers: int, groups: int) -> None:
    theirs = saved_transformers_model(tmp_path, "AlbertModel", num_hidden_layers=layers, num_hidden_groups=groups)
    ours, report = load_any(tmp_path)
    assert type(ours) is AlbertModel and report.ok and not report.new_heads
    ours.eval()
    ids, mask, types = padded_batch()
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True,
                          output_attentions=True)
        out = ours(ids, mask, types, output_hidden_states=True, output_attentions=True)
    assert max_diff(out.pooled_output, expected.pooler_output) <= ATOL
    assert len(out.hidden_states) == len(expected.hidden_states) == layers + 1
    for mine, reference in zip(out.hidden_states, expected.hidden_states, strict=True):
        assert max_diff(real(mine, mask), real(reference, mask)) <= ATOL
    assert len(out.attentions) == layers
    for mine, reference in zip(out.attentions, expected.attentions, strict=True):  # (B, A, T, T)
        rows = mask.bool()[:, None, :, None].expand_as(mine)  # real queries (keys at padding get ~0 in both)
        assert max_diff(mine[rows], reference[rows]) <= ATOL


@pytest.mark.parametrize("per_sequence", [True, False, None])
def test_packed_paths_equal_transformers_and_the_padded_path(tmp_path, per_sequence: bool | None) -> None:
    theirs = saved_transformers_model(tmp_path, "AlbertModel")
    ours = load_any(tmp_path)[0].eval()
    ours.attention_per_sequence = per_sequence
    ids, mask, types = padded_batch(30, rows=5)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        packed = ours(ids, mask, types).last_hidden_state
        ours.unpad = False
        padded = ours(ids, mask, types).last_hidden_state
    assert max_diff(real(packed, mask), real(expected, mask)) <= ATOL
    assert max_diff(real(packed, mask), real(padded, mask)) <= ATOL
    assert (packed[~mask.bool()] == 0).all()  # the packed path leaves zeros at padding


def test_layers_are_shared_across_depths_and_stored_once(tmp_path) -> None:
    model = AlbertModel(AlbertConfig(**{**SIZES, "num_hidden_layers": 6, "num_hidden_groups": 2}))
    layers = model.transformer_layers()
    assert len(layers) == 2 and all(isinstance(layer, EncoderLayer) for layer in layers)
    stored_at = {id(layer): group for group, layer in enumerate(layers)}
    assert [stored_at[id(layer)] for layer in model.encoder.schedule()] == [0, 0, 0, 1, 1, 1]
    assert {key.split(".")[2] for key in model.state_dict() if key.startswith("encoder.layers.")} == {"0", "1"}
    model.save_pretrained(tmp_path)
    theirs = transformers.AlbertModel.from_pretrained(tmp_path)
    assert len(theirs.encoder.albert_layer_groups) == 2


def test_token_types_default_to_zero_and_an_unpadded_batch_matches(tmp_path) -> None:
    theirs = saved_transformers_model(tmp_path, "AlbertModel")
    ours = load_any(tmp_path)[0].eval()
    ids, _, types = padded_batch(16, rows=2)
    with torch.no_grad():
        assert max_diff(ours(ids).last_hidden_state, theirs(ids).last_hidden_state) <= ATOL
        assert max_diff(ours(ids, None, types).last_hidden_state,
                        theirs(ids, token_type_ids=types).last_hidden_state) <= ATOL
        assert max_diff(ours(ids, None, types).last_hidden_state, ours(ids).last_hidden_state) > 1e-3


# ------------------------------------------------------------------------------------------------
# Heads: outputs, losses, both round trips
# ------------------------------------------------------------------------------------------------
def _labels(name: str, ids: torch.Tensor, mask: torch.Tensor, overrides: dict) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    rows = ids.shape[0]
    if name in ("AlbertForMaskedLM", "AlbertForPreTraining"):
        unmasked = (torch.rand(ids.shape, generator=generator) > 0.3) | (mask == 0)
        labels = ids.masked_fill(unmasked, -100)
        if name == "AlbertForMaskedLM":
            return {"labels": labels}
        return {"labels": labels, "sentence_order_label": torch.randint(0, 2, (rows,), generator=generator)}
    if name == "AlbertForTokenClassification":
        labels = torch.randint(0, overrides["num_labels"], ids.shape, generator=generator)
        return {"labels": labels.masked_fill(mask == 0, -100)}
    if name == "AlbertForQuestionAnswering":  # inside the real tokens, plus one beyond the window (ignored)
        lengths = mask.sum(1)
        start = torch.minimum(torch.arange(rows) + 1, lengths - 1)
        end = torch.minimum(start + 2, lengths - 1)
        end[-1] = ids.shape[1] + 5
        return {"start_positions": start, "end_positions": end}
    if name == "AlbertForMultipleChoice":
        return {"labels": torch.randint(0, ids.shape[1], (rows,), generator=generator)}
    problem = overrides.get("problem_type")
    if problem == "regression":
        return {"labels": torch.rand(rows, generator=generator) * 5}
    if problem == "multi_label_classification":
        return {"labels": (torch.rand(rows, overrides["num_labels"], generator=generator) > 0.5).float()}
    return {"labels": torch.randint(0, overrides["num_labels"], (rows,), generator=generator)}


def _outputs(name: str, out, mask: torch.Tensor) -> list[torch.Tensor]:
    """A head's outputs at real tokens, from either library's output record."""
    if name == "AlbertForQuestionAnswering":
        return [real(out.start_logits, mask), real(out.end_logits, mask)]
    if name == "AlbertForPreTraining":
        mlm = out.mlm_logits if hasattr(out, "mlm_logits") else out.prediction_logits
        sop = out.nsp_logits if hasattr(out, "nsp_logits") else out.sop_logits
        return [real(mlm, mask), sop]
    logits = getattr(out, "mlm_logits", None)
    logits = out.logits if logits is None else logits
    return [real(logits, mask)] if name in ("AlbertForMaskedLM", "AlbertForTokenClassification") else [logits]


def _reference_loss(name: str, reference, labels: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """transformers' loss, except for QA: ours keeps spans off padding, so padding is masked out of
    transformers' span distributions too before its loss is compared."""
    if name != "AlbertForQuestionAnswering":
        return reference.loss
    lowest = torch.finfo(torch.float32).min
    length = mask.shape[1]
    loss = 0.0
    for logits, key in ((reference.start_logits, "start_positions"), (reference.end_logits, "end_positions")):
        target = labels[key].masked_fill(labels[key] >= length, -100)
        loss = loss + torch.nn.functional.cross_entropy(logits.masked_fill(mask == 0, lowest), target)
    return loss / 2


HEADS = [
    ("AlbertForPreTraining", {}),
    ("AlbertForMaskedLM", {}),
    ("AlbertForSequenceClassification", {"num_labels": 3}),
    ("AlbertForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}),
    ("AlbertForSequenceClassification", {"num_labels": 4, "problem_type": "multi_label_classification"}),
    ("AlbertForTokenClassification", {"num_labels": 5}),
    ("AlbertForQuestionAnswering", {}),
    ("AlbertForMultipleChoice", {}),
]
HEAD_IDS = ["pretraining", "mlm", "seqcls", "regression", "multilabel", "token", "qa", "mc"]


def _batch(name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return padded_batch(16, rows=2, choices=3) if name == "AlbertForMultipleChoice" else padded_batch(20)


def _compare(name: str, ours, theirs, overrides: dict) -> float:
    """Outputs without labels and the loss with them, ours against transformers': the largest difference."""
    ids, mask, types = _batch(name)
    labels = _labels(name, ids, mask, overrides)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    with torch.no_grad():
        mine, reference = ours(**inputs), theirs(**inputs)
        mine_loss = ours(**inputs, **labels).loss
        reference_loss = _reference_loss(name, theirs(**inputs, **labels), labels, mask)
    flat_mask = mask.flatten(0, 1) if mask.dim() == 3 else mask
    diffs = [max_diff(a, b) for a, b in zip(_outputs(name, mine, flat_mask), _outputs(name, reference, flat_mask),
                                             strict=True)]
    diffs.append(max_diff(mine_loss, reference_loss))
    assert torch.isfinite(mine_loss)
    return max(diffs)


@pytest.mark.parametrize(("name", "overrides"), HEADS, ids=HEAD_IDS)
def test_transformers_head_checkpoint_loads_with_equal_outputs_and_loss(tmp_path, name, overrides) -> None:
    theirs = saved_transformers_model(tmp_path, name, **overrides)
    ours, report = load_any(tmp_path)
    assert type(ours).__name__ == name and report.ok and not report.new_heads and not report.unused
    assert _compare(name, ours.eval(), theirs, overrides) <= ATOL


@pytest.mark.parametrize(("name", "overrides"), HEADS, ids=HEAD_IDS)
def test_our_head_checkpoint_loads_in_transformers_with_equal_outputs_and_loss(tmp_path, name, overrides) -> None:
    saved_transformers_model(tmp_path / "theirs", name, **overrides)
    ours = randomised(load_any(tmp_path / "theirs")[0], seed=3)  # new values, so the file is ours alone
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "albert" and saved["architectures"] == [name] and saved["embedding_size"] == 16
    reloaded, info = getattr(transformers, name).from_pretrained(tmp_path / "ours", output_loading_info=True,
                                                                 attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert _compare(name, ours, reloaded.eval(), overrides) <= ATOL


def test_pretraining_losses_are_masked_lm_plus_sentence_order(tmp_path) -> None:
    saved_transformers_model(tmp_path, "AlbertForPreTraining")
    model = load_any(tmp_path)[0].eval()
    ids, mask, types = padded_batch(20)
    labels = _labels("AlbertForPreTraining", ids, mask, {})
    with torch.no_grad():
        both = model(ids, mask, types, **labels)
        as_loader_names = model(ids, mask, types, labels=labels["labels"],
                                next_sentence_label=labels["sentence_order_label"])
        mlm_only = model(ids, mask, types, labels=labels["labels"])
    assert torch.allclose(both.loss, both.mlm_loss + both.nsp_loss)
    assert torch.equal(as_loader_names.loss, both.loss)  # bertforge's loader calls the SOP labels so
    assert torch.equal(mlm_only.loss, both.mlm_loss) and mlm_only.nsp_loss is None
    assert both.mlm_logits.shape == (int((labels["labels"] != -100).sum()), SIZES["vocab_size"])
    assert both.nsp_logits.shape == (4, 2)


def test_bert_entry_points_build_the_albert_class(tmp_path) -> None:
    """Generic code asks any family's class for a job: an ALBERT checkpoint gives ALBERT's."""
    saved_transformers_model(tmp_path, "AlbertForPreTraining")
    model = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert type(model) is AlbertForSequenceClassification and model.classifier.out_features == 4
    assert model.load_report.new_heads == ["classifier.bias", "classifier.weight"]
    assert model.load_report.unused == ["predictions.bias", "predictions.dense.bias", "predictions.dense.weight",
                                        "predictions.layer_norm.bias", "predictions.layer_norm.weight",
                                        "sop_classifier.classifier.bias", "sop_classifier.classifier.weight"]
    masked_lm = AlbertForMaskedLM.from_pretrained(tmp_path)  # the pooler and SOP head go unused
    assert masked_lm.load_report.ok and "albert.pooler.dense.weight" in masked_lm.load_report.unused


def test_training_mode_places_dropout_as_transformers_does(tmp_path, torch_dropout_draws) -> None:
    """With the padded path both libraries draw the same dropout masks in the same order, so equal
    training-mode outputs show the same dropout sites (none on the feed-forward output in ALBERT)."""
    theirs = saved_transformers_model(tmp_path, "AlbertForSequenceClassification", num_labels=3,
                                      hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0,
                                      classifier_dropout_prob=0.4)
    ours = load_any(tmp_path)[0]
    ours.albert.unpad = False
    ids, mask, types = padded_batch(12, rows=3)
    ours.train(), theirs.train()
    torch.manual_seed(5)
    mine = ours(ids, mask, types).logits
    torch.manual_seed(5)
    reference = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    torch.manual_seed(6)
    other = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    assert max_diff(mine, reference) <= ATOL and max_diff(other, reference) > 1e-3


def test_training_steps_reach_the_shared_layers_and_checkpointing_gives_the_same_loss() -> None:
    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig(**SIZES, hidden_dropout_prob=0.1)).train()
    ids, mask, types = padded_batch(24)
    labels = _labels("AlbertForPreTraining", ids, mask, {})
    torch.manual_seed(1)
    loss = model(ids, mask, types, **labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    for layer in model.transformer_layers():
        assert layer.attention.qkv.weight.grad.abs().sum() > 0
    model.albert.gradient_checkpointing = True
    torch.manual_seed(1)
    assert torch.equal(model(ids, mask, types, **labels).loss, loss)


# ------------------------------------------------------------------------------------------------
# bertforge's own paths, found through the registry
# ------------------------------------------------------------------------------------------------
def test_int8_quantizes_the_shared_encoder_layers() -> None:
    from bertforge.precision import apply_precision, is_quantized

    torch.manual_seed(0)
    reference = randomised(AlbertForSequenceClassification(set_labels(AlbertConfig(**SIZES), 3)))
    ids, mask, types = padded_batch(20)
    with torch.no_grad():
        expected = reference(ids, mask, types).logits
    model, used = apply_precision(copy.deepcopy(reference), "int8")
    assert used == "int8" and is_quantized(model)
    for layer in model.transformer_layers():
        assert all(type(m.weight).__name__ == "Int8Tensor" for m in (layer.attention.qkv, layer.attention.out, layer.ffn.up))
        assert layer.ffn.down.weight.dtype == torch.float32  # the feed-forward output projection stays fp32
    assert type(model.classifier.weight) is torch.nn.Parameter  # the head stays fp32
    assert type(model.albert.embeddings.projection.weight) is torch.nn.Parameter  # and so does the projection
    with torch.no_grad():
        got = model(ids, mask, types).logits
    # measured 0.16% to 0.21% of the largest logit over three seeds; the bound is about 5x that
    assert got.dtype == torch.float32 and 0 < max_diff(got, expected) <= 0.01 * expected.abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["AlbertForSequenceClassification", "AlbertForQuestionAnswering",
                                  "AlbertForMultipleChoice", "AlbertModel"])
def test_onnx_export_matches_pytorch(tmp_path, name: str) -> None:
    pytest.importorskip("onnx", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
    pytest.importorskip("onnxscript", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
    pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (the onnx extra)")
    from bertforge.export import export_onnx

    torch.manual_seed(0)
    model = registry.class_for_architecture(name)(set_labels(AlbertConfig(**SIZES), 3)).eval()
    result = export_onnx(model, tmp_path / "model.onnx")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    assert ("pooled_output" in result.outputs) == (name == "AlbertModel")


GOOD = ["a gripping film", "beautifully acted and warm", "the best film I have seen this year",
        "funny , warm and bright", "a clever and moving film", "what a gripping story"]
BAD = ["dull and far too long", "a terrible ending ruins it", "flat and far too slow", "too long and too dull",
       "the ending is terrible", "boring and slow"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random ALBERT pre-training checkpoint (as albert-base-v2 ships) with a WordPiece vocabulary
    trained on the fixture's words."""
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("albert")
    corpus = root / "corpus.txt"
    corpus.write_text(("\n".join(GOOD + BAD) + "\n") * 10, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=150, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = registry.from_preset("albert-tiny", vocab_size=tokenizer.vocab_size, num_hidden_layers=2,
                                  hidden_size=32, embedding_size=16, num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64)
    AlbertForPreTraining(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    return root / "encoder"


def test_finetune_predict_pipeline_and_serve_own_data(encoder_dir: Path, tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.finetune import finetune

    sample = Path(__file__).resolve().parent / "fixtures" / "classify"
    out = tmp_path / "run"
    settings = {"train": str(sample / "reviews.csv"), "dev": str(sample / "reviews-dev.csv"),
                "test": str(sample / "new.csv")}
    results = finetune("classify", None, encoder_dir, None, out, epochs=2, batch_size=4, max_length=32,
                       task_settings=settings, progress=False, verbose=False)
    assert "accuracy" in results["summary"]
    seed_dir = out / "seed-1"
    model, report = load_any(seed_dir)
    assert type(model) is AlbertForSequenceClassification and report.ok
    saved = json.loads((seed_dir / "config.json").read_text())
    assert saved["model_type"] == "albert" and saved["id2label"] == {"0": "negative", "1": "positive"}
    rows = [json.loads(line) for line in (seed_dir / "predictions-test.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["what a gripping story", "too long and too dull"]
    assert all(r["label"] in ("negative", "positive") for r in rows)
    # transformers reads the fine-tuned model and agrees on the logits
    theirs = transformers.AlbertForSequenceClassification.from_pretrained(seed_dir).eval()
    ids, mask, types = padded_batch(10, rows=2)
    ids = ids.clamp(max=model.config.vocab_size - 1)
    with torch.no_grad():
        mine = model.eval()(ids, mask, types).logits
        assert max_diff(mine, theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).logits) <= ATOL

    classify = pipeline(str(seed_dir))
    assert classify.task == "text-classification"
    answers = classify([r["text"] for r in rows])
    assert [a["label"] for a in answers] == [r["label"] for r in rows]

    fill = pipeline(str(encoder_dir))  # the pre-training checkpoint without task.json: fill-mask
    assert fill.task == "fill-mask" and len(fill(["a [MASK] film"])[0]) > 0

    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(seed_dir)) as client:
        answer = client.post("/classify", json={"text": rows[0]["text"]})
        assert answer.status_code == 200 and answer.json()["label"] == rows[0]["label"]
        assert client.post("/embed", json={"text": "a warm film", "pooling": "pooler"}).status_code == 200
        attention = client.post("/attention", json={"text": "a warm film", "layer": 1, "head": 0})
        assert attention.status_code == 200


def test_pretrain_on_sentence_order_data_trains_both_heads(tmp_path: Path) -> None:
    """bertforge's pre-training on SOP shards builds ALBERT's pre-training model from the preset, its
    loader's `next_sentence_label` reaches the sentence-order head, and transformers loads the result."""
    import warnings

    from bertforge.data.prepare import prepare
    from bertforge.pretrain import pretrain
    from bertforge.tokenizer import BertTokenizer

    text = Path(__file__).resolve().parent / "fixtures" / "gutenberg_sample.txt"
    BertTokenizer.train([text], vocab_size=400, show_progress=False).save_pretrained(tmp_path / "tokenizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one book: prepare says how it filled in
        prepare([text], tmp_path / "tokenizer", tmp_path / "data", max_seq_length=64, plain_text=True,
                objective="sop", masking="dynamic", validation_fraction=0.1, block_sentences=16, progress=False)
    result = pretrain("albert-tiny", tmp_path / "data", tmp_path / "run", max_steps=2, max_position_embeddings=64,
                      tokenizer=str(tmp_path / "tokenizer"), batch_size=8, eval_batch_size=16, eval_max_batches=4,
                      progress=False, log_every=2)
    config = json.loads((result.final / "config.json").read_text())
    assert config["architectures"] == ["AlbertForPreTraining"] and config["model_type"] == "albert"
    assert set(result.train.metrics) == {"mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"}
    _, info = transformers.AlbertForPreTraining.from_pretrained(result.final, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
