"""DeBERTa-v2/v3: the config both ways, the encoder (disentangled attention, log buckets, shared and
separate position projections, the convolution) and every head against transformers (outputs,
losses, both checkpoint round trips, both masked-LM layouts), the packed path against the padded one,
and the family on bertforge's own paths (fine-tune, pipeline, serve, int8, ONNX) through the registry."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import transformers
from transformers.models.deberta_v2 import modeling_deberta_v2 as reference_modeling

from bertforge.model import (
    BertForSequenceClassification,
    DebertaV2Config,
    DebertaV2ForMaskedLM,
    DebertaV2ForSequenceClassification,
    DebertaV2Model,
    config_from_dict,
    load_any,
    registry,
    resolve_config,
    set_labels,
)
from bertforge.model.deberta.modeling import log_buckets

ATOL = 1e-5
# Small and random: 3 layers, 4 heads of 8, a feed-forward that is not 4H.
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, pad_token_id=0)
# DeBERTaV3's attention: relative positions only, both position terms, keys shared, normalised table.
V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
          position_biased_input=False, position_buckets=256)
CONFIGS = {
    "v3": V3,
    # 8 buckets: distances past 4 fall into log buckets within the test's 20 tokens
    "log-buckets": {**V3, "position_buckets": 8, "max_relative_positions": 32},
    # DeBERTa-v2 (xlarge style): own position projections, distances clamped at 8, absolute positions,
    # token types, the convolution, the table not normalised, pos_att_type as older files spell it
    "v2-conv": {**V3, "share_att_key": False, "position_buckets": -1, "max_relative_positions": 8,
                "position_biased_input": True, "type_vocab_size": 2, "conv_kernel_size": 3, "conv_act": "gelu",
                "norm_rel_ebd": "none", "pos_att_type": "p2c|c2p"},
    "c2p-only": {**V3, "share_att_key": False, "pos_att_type": ["c2p"], "position_buckets": 6,
                 "max_relative_positions": 16},
    "no-relative": {"relative_attention": False, "pos_att_type": ["c2p", "p2c"]},  # the scale still counts them
}
HEAD_CONFIG = CONFIGS["log-buckets"]


def hf_config(**overrides) -> transformers.DebertaV2Config:
    config = transformers.DebertaV2Config(**{**SIZES, **V3, **overrides})
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


def padded_batch(length: int = 20, rows: int = 4, choices: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, length) ids and a mask, each row padded on the right to its own length (the first
    row full), or (rows, choices, length) for multiple choice."""
    generator = torch.Generator().manual_seed(length + rows)
    count = rows * (choices or 1)
    ids = torch.randint(3, SIZES["vocab_size"], (count, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, count):
        real = max(1, length * (count - row) // count)
        mask[row, real:] = 0
        ids[row, real:] = 0
    if choices is not None:
        return ids.view(rows, choices, length), mask.view(rows, choices, length)
    return ids, mask


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values at real tokens only: padding positions mean nothing in either library."""
    return x[mask.bool()]


def saved_transformers_model(directory: Path, name: str, seed: int = 0, **overrides) -> transformers.PreTrainedModel:
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
    hf_config(**CONFIGS["v2-conv"], pooler_dropout=0.2, pooler_hidden_act="gelu_new", cls_dropout=0.3, legacy=False,
              id2label={0: "no", 1: "yes"}).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["z_steps"] = 0  # a key that is no field: kept and written back
    ours = config_from_dict(written, source="config.json")
    assert isinstance(ours, DebertaV2Config)
    assert (ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads, ours.intermediate_size) == (32, 3, 4, 48)
    assert ours.pos_att_type == ["p2c", "c2p"] and ours.position_buckets == -1 and ours.conv_kernel_size == 3
    assert ours.legacy is False and ours.cls_dropout == 0.3 and ours.extra["z_steps"] == 0
    assert (ours.position_table_half, ours.relative_norm, ours.classifier_dropout) == (8, False, 0.3)
    again = ours.to_dict()
    for key, value in written.items():
        if key not in ("transformers_version", "dtype", "architectures", "pos_att_type"):
            assert again[key] == value, key
    assert again["pos_att_type"] == ["p2c", "c2p"]  # the older "p2c|c2p" is written as transformers reads it now


def test_our_config_json_loads_in_transformers(tmp_path) -> None:
    ours = set_labels(DebertaV2Config(**SIZES, **CONFIGS["log-buckets"], hidden_dropout_prob=0.2, pooler_dropout=0.1),
                      ["a", "b", "c"])
    ours.to_json_file(tmp_path / "config.json")
    theirs = transformers.DebertaV2Config.from_pretrained(tmp_path)
    assert (theirs.hidden_size, theirs.num_hidden_layers, theirs.num_attention_heads) == (32, 3, 4)
    assert (theirs.position_buckets, theirs.max_relative_positions, theirs.share_att_key) == (8, 32, True)
    assert theirs.pos_att_type == ["p2c", "c2p"] and theirs.norm_rel_ebd == "layer_norm"
    assert theirs.relative_attention is True and theirs.position_biased_input is False
    assert theirs.hidden_dropout_prob == 0.2 and theirs.pooler_dropout == 0.1 and theirs.pooler_hidden_size == 32
    assert theirs.num_labels == 3 and theirs.id2label[2] == "c"


def test_missing_keys_mean_what_they_mean_to_transformers() -> None:
    """A config.json with only the sizes: transformers' defaults (no relative attention, absolute
    positions, the legacy masked-LM layout)."""
    ours = config_from_dict({"model_type": "deberta-v2", **SIZES})
    theirs = transformers.DebertaV2Config(**SIZES)
    for name in ("relative_attention", "position_biased_input", "type_vocab_size", "layer_norm_eps", "legacy",
                 "max_relative_positions", "pooler_hidden_act", "hidden_act"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.position_buckets == -1 and ours.share_att_key is False and ours.norm_rel_ebd == "none"


@pytest.mark.parametrize(("change", "field"), [
    ({"pos_att_type": ["c2p", "p2p"]}, "pos_att_type"),
    ({"num_attention_heads": 5}, "num_attention_heads"),
    ({"position_buckets": 64, "max_relative_positions": 20}, "max_relative_positions"),
    ({"conv_kernel_size": 2}, "conv_kernel_size"),
    ({"conv_act": "swish"}, "conv_act"),
    ({"embedding_size": 16}, "embedding_size"),
    ({"pooler_hidden_size": 16}, "pooler_hidden_size"),
    ({"share_att_key": "yes"}, "share_att_key"),
    ({"hidden_act": "swish"}, "hidden_act"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
])
def test_bad_configs_are_refused_in_one_line_naming_the_field(change: dict, field: str) -> None:
    with pytest.raises(ValueError) as error:
        config_from_dict({"model_type": "deberta-v2", **SIZES, **V3, **change}, source="config.json")
    message = str(error.value)
    assert "\n" not in message and message.startswith("config.json: ") and field in message


def test_presets_build_deberta_v3_base_exactly() -> None:
    names = registry.preset_names()
    assert len(names) == len(set(names))  # unique across families
    base = resolve_config("deberta-v3-base")
    assert isinstance(base, DebertaV2Config)
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size) == (
        12, 768, 12, 3072)
    assert base.position_buckets == 256 and base.share_att_key and not base.position_biased_input
    with torch.device("meta"):
        ours = DebertaV2Model(base)
        fields = {k: v for k, v in base.to_dict().items() if k != "model_type"}
        theirs = transformers.DebertaV2Model(transformers.DebertaV2Config(**fields))
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters()) == base.estimated_parameter_count()
    small = resolve_config("deberta-v3-xsmall", vocab_size=500, hidden_size=64, num_attention_heads=4)
    assert small.vocab_size == 500 and small.pooler_hidden_size == 64


def test_the_registry_knows_the_family() -> None:
    assert registry.jobs_of("deberta-v2") == ["embeddings", "masked-lm", "sequence-classification",
                                              "token-classification", "question-answering", "multiple-choice"]
    assert registry.model_class("deberta-v2", "pretraining") is DebertaV2ForMaskedLM
    assert DebertaV2Model.supports_attention_maps


def test_log_buckets_equal_transformers() -> None:
    distances = torch.arange(-600, 601)
    for buckets, span in ((256, 512), (8, 32), (6, 16), (4, 64)):
        expected = reference_modeling.make_log_bucket_position(distances, buckets, span).long()
        assert torch.equal(log_buckets(distances, buckets, span), expected), (buckets, span)


# ------------------------------------------------------------------------------------------------
# The encoder against transformers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_every_hidden_state_and_attention_map_equals_transformers(tmp_path, variant: str) -> None:
    theirs = saved_transformers_model(tmp_path, "DebertaV2Model", **CONFIGS[variant])
    ours, report = load_any(tmp_path)
    assert type(ours) is DebertaV2Model and report.ok and not report.new_heads and not report.unused
    assert ours.pooler is None
    ours.eval()
    ids, mask = padded_batch()
    types = (torch.arange(ids.shape[1]) >= 8).long().expand_as(ids) * mask  # a second segment (used with a table)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True,
                          output_attentions=True)
        probed = ours(ids, mask, types, output_hidden_states=True, output_attentions=True)  # padded path
        packed = ours(ids, mask, types, output_hidden_states=True)
    assert len(probed.hidden_states) == len(expected.hidden_states) == SIZES["num_hidden_layers"] + 1
    for out in (probed, packed):
        for mine, reference in zip(out.hidden_states, expected.hidden_states, strict=True):
            assert max_diff(real(mine, mask), real(reference, mask)) <= ATOL
    assert len(probed.attentions) == SIZES["num_hidden_layers"]
    for mine, reference in zip(probed.attentions, expected.attentions, strict=True):  # (B, A, T, T)
        rows = mask.bool()[:, None, :, None].expand_as(mine)  # real queries (keys at padding get 0 in both)
        assert max_diff(mine[rows], reference[rows]) <= ATOL


def test_packed_path_equals_the_padded_path_and_leaves_zeros_at_padding(tmp_path) -> None:
    theirs = saved_transformers_model(tmp_path, "DebertaV2Model", **CONFIGS["v2-conv"])
    ours = load_any(tmp_path)[0].eval()
    ids, mask = padded_batch(30, rows=5)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).last_hidden_state
        packed = ours(ids, mask).last_hidden_state
        ours.unpad = False
        padded = ours(ids, mask).last_hidden_state
    assert max_diff(real(packed, mask), real(expected, mask)) <= ATOL
    assert max_diff(real(packed, mask), real(padded, mask)) <= ATOL
    assert (packed[~mask.bool()] == 0).all()


def test_an_unpadded_batch_and_no_mask_match(tmp_path) -> None:
    theirs = saved_transformers_model(tmp_path, "DebertaV2Model")
    ours = load_any(tmp_path)[0].eval()
    ids, _ = padded_batch(16, rows=2)
    with torch.no_grad():
        expected = theirs(ids).last_hidden_state
        plain = ours(ids).last_hidden_state
        with_mask = ours(ids, torch.ones_like(ids)).last_hidden_state
    assert max_diff(plain, expected) <= ATOL and torch.equal(plain, with_mask)


# ------------------------------------------------------------------------------------------------
# Heads: outputs, losses, both round trips
# ------------------------------------------------------------------------------------------------
def _labels(name: str, ids: torch.Tensor, mask: torch.Tensor, overrides: dict) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    rows = ids.shape[0]
    if name == "DebertaV2ForMaskedLM":
        labels = ids.masked_fill(torch.rand(ids.shape, generator=generator) > 0.3, -100)
        return {"labels": labels.masked_fill(mask == 0, -100)}
    if name == "DebertaV2ForTokenClassification":
        labels = torch.randint(0, overrides["num_labels"], ids.shape, generator=generator)
        return {"labels": labels.masked_fill(mask == 0, -100)}
    if name == "DebertaV2ForQuestionAnswering":  # inside the real tokens, plus one beyond the window (ignored)
        lengths = mask.sum(1)
        start = torch.minimum(torch.arange(rows) + 1, lengths - 1)
        end = torch.minimum(start + 2, lengths - 1)
        end[-1] = ids.shape[1] + 5
        return {"start_positions": start, "end_positions": end}
    if name == "DebertaV2ForMultipleChoice":
        return {"labels": torch.randint(0, ids.shape[1], (rows,), generator=generator)}
    problem = overrides.get("problem_type")
    if problem == "regression":
        return {"labels": torch.rand(rows, generator=generator) * 5}
    if problem == "multi_label_classification":
        return {"labels": (torch.rand(rows, overrides["num_labels"], generator=generator) > 0.5).float()}
    return {"labels": torch.randint(0, overrides["num_labels"], (rows,), generator=generator)}


def _outputs(name: str, out, mask: torch.Tensor) -> list[torch.Tensor]:
    """A head's outputs at real tokens, from either library's output record."""
    if name == "DebertaV2ForQuestionAnswering":
        return [real(out.start_logits, mask), real(out.end_logits, mask)]
    logits = getattr(out, "mlm_logits", None)
    logits = out.logits if logits is None else logits
    return [real(logits, mask)] if name in ("DebertaV2ForMaskedLM", "DebertaV2ForTokenClassification") else [logits]


def _reference_loss(name: str, reference, labels: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """transformers' loss, except for QA: ours keeps spans off padding, so padding is masked out of
    transformers' span distributions too before its loss is compared."""
    if name != "DebertaV2ForQuestionAnswering":
        return reference.loss
    lowest = torch.finfo(torch.float32).min
    length = mask.shape[1]
    loss = 0.0
    for logits, key in ((reference.start_logits, "start_positions"), (reference.end_logits, "end_positions")):
        target = labels[key].masked_fill(labels[key] >= length, -100)
        loss = loss + torch.nn.functional.cross_entropy(logits.masked_fill(mask == 0, lowest), target)
    return loss / 2


HEADS = [
    ("DebertaV2ForMaskedLM", {}),
    ("DebertaV2ForMaskedLM", {"legacy": False}),
    ("DebertaV2ForSequenceClassification", {"num_labels": 3}),
    ("DebertaV2ForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}),
    ("DebertaV2ForSequenceClassification", {"num_labels": 4, "problem_type": "multi_label_classification"}),
    ("DebertaV2ForTokenClassification", {"num_labels": 5}),
    ("DebertaV2ForQuestionAnswering", {}),
    ("DebertaV2ForMultipleChoice", {}),
]
HEAD_IDS = ["mlm-legacy", "mlm", "seqcls", "regression", "multilabel", "token", "qa", "mc"]


def _batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return padded_batch(16, rows=2, choices=3) if name == "DebertaV2ForMultipleChoice" else padded_batch(20)


def _compare(name: str, ours, theirs, overrides: dict) -> float:
    """Outputs without labels and the loss with them, ours against transformers': the largest difference."""
    ids, mask = _batch(name)
    labels = _labels(name, ids, mask, overrides)
    with torch.no_grad():
        mine, reference = ours(input_ids=ids, attention_mask=mask), theirs(input_ids=ids, attention_mask=mask)
        mine_loss = ours(input_ids=ids, attention_mask=mask, **labels).loss
        reference_loss = _reference_loss(name, theirs(input_ids=ids, attention_mask=mask, **labels), labels, mask)
    flat_mask = mask.flatten(0, 1) if mask.dim() == 3 else mask
    diffs = [max_diff(a, b) for a, b in zip(_outputs(name, mine, flat_mask), _outputs(name, reference, flat_mask),
                                             strict=True)]
    diffs.append(max_diff(mine_loss, reference_loss))
    assert torch.isfinite(mine_loss)
    return max(diffs)


@pytest.mark.parametrize(("name", "overrides"), HEADS, ids=HEAD_IDS)
def test_transformers_head_checkpoint_loads_with_equal_outputs_and_loss(tmp_path, name, overrides) -> None:
    theirs = saved_transformers_model(tmp_path, name, **HEAD_CONFIG, **overrides)
    ours, report = load_any(tmp_path)
    assert type(ours).__name__ == name and report.ok and not report.new_heads and not report.unused
    assert _compare(name, ours.eval(), theirs, overrides) <= ATOL


@pytest.mark.parametrize(("name", "overrides"), HEADS, ids=HEAD_IDS)
def test_our_head_checkpoint_loads_in_transformers_with_equal_outputs_and_loss(tmp_path, name, overrides) -> None:
    saved_transformers_model(tmp_path / "theirs", name, **HEAD_CONFIG, **overrides)
    ours = randomised(load_any(tmp_path / "theirs")[0], seed=3)  # new values, so the file is ours alone
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "deberta-v2" and saved["architectures"] == [name]
    reloaded, info = getattr(transformers, name).from_pretrained(tmp_path / "ours", output_loading_info=True,
                                                                 attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert _compare(name, ours, reloaded.eval(), overrides) <= ATOL


def test_a_masked_lm_file_in_the_other_layout_still_fills_the_head(tmp_path) -> None:
    """The Hub's DeBERTaV3 files carry `lm_predictions.lm_head.*` without `legacy` in config.json
    (so legacy, by default): the head is read from the other layout rather than left random."""
    theirs = saved_transformers_model(tmp_path, "DebertaV2ForMaskedLM", **HEAD_CONFIG, legacy=False)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["legacy"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours, report = load_any(tmp_path)
    assert ours.config.legacy is True and report.ok and not report.new_heads
    assert _compare("DebertaV2ForMaskedLM", ours.eval(), theirs, {}) <= ATOL


def test_bert_entry_points_build_the_deberta_class(tmp_path) -> None:
    """Generic code asks any family's class for a job: a DeBERTa checkpoint gives DeBERTa's."""
    saved_transformers_model(tmp_path, "DebertaV2ForMaskedLM", **HEAD_CONFIG)
    model = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert type(model) is DebertaV2ForSequenceClassification and model.classifier.out_features == 4
    assert model.load_report.ok
    assert model.load_report.new_heads == ["classifier.bias", "classifier.weight", "pooler.dense.bias",
                                           "pooler.dense.weight"]
    assert model.load_report.unused == ["legacy_head.bias", "legacy_head.dense.bias", "legacy_head.dense.weight",
                                        "legacy_head.layer_norm.bias", "legacy_head.layer_norm.weight"]
    encoder = DebertaV2Model.from_pretrained(tmp_path)  # the bare encoder out of a head checkpoint
    assert encoder.load_report.ok and not encoder.load_report.new_heads


def test_training_mode_places_dropout_as_transformers_does(tmp_path, torch_dropout_draws) -> None:
    """With the padded path both libraries draw the same dropout masks in the same order, so equal
    training-mode outputs show the same dropout sites (embeddings, the relative table in every layer,
    the attention and feed-forward outputs, the pooler's input, the classifier's input)."""
    theirs = saved_transformers_model(tmp_path, "DebertaV2ForSequenceClassification", **HEAD_CONFIG, num_labels=3,
                                      hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0, pooler_dropout=0.2,
                                      cls_dropout=0.4)
    ours = load_any(tmp_path)[0]
    ours.deberta.unpad = False
    ids, mask = padded_batch(12, rows=3)
    ours.train(), theirs.train()
    torch.manual_seed(5)
    mine = ours(ids, mask).logits
    torch.manual_seed(5)
    reference = theirs(input_ids=ids, attention_mask=mask).logits
    torch.manual_seed(6)
    other = theirs(input_ids=ids, attention_mask=mask).logits
    assert max_diff(mine, reference) <= ATOL and max_diff(other, reference) > 1e-3


def test_training_steps_and_gradient_checkpointing_give_the_same_loss() -> None:
    torch.manual_seed(0)
    model = DebertaV2ForMaskedLM(DebertaV2Config(**SIZES, **CONFIGS["v2-conv"])).train()
    ids, mask = padded_batch(24)
    labels = _labels("DebertaV2ForMaskedLM", ids, mask, {})["labels"]
    torch.manual_seed(1)
    loss = model(ids, mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and model.deberta.rel_embeddings.weight.grad.abs().sum() > 0
    assert model.deberta.conv.conv.weight.grad.abs().sum() > 0
    model.deberta.gradient_checkpointing = True
    torch.manual_seed(1)
    assert torch.equal(model(ids, mask, labels=labels).loss, loss)


# ------------------------------------------------------------------------------------------------
# bertforge's own paths, found through the registry
# ------------------------------------------------------------------------------------------------
def test_int8_quantizes_the_encoder_layers() -> None:
    from bertforge.precision import apply_precision, is_quantized

    torch.manual_seed(0)
    config = set_labels(DebertaV2Config(**SIZES, **HEAD_CONFIG), 3)
    reference = randomised(DebertaV2ForSequenceClassification(config))
    ids, mask = padded_batch(20)
    with torch.no_grad():
        expected = reference(ids, mask).logits
    model, used = apply_precision(copy.deepcopy(reference), "int8")
    assert used == "int8" and is_quantized(model)
    layer = model.transformer_layers()[0]
    assert all(type(m.weight).__name__ == "Int8Tensor" for m in (layer.attention.qkv, layer.attention.out, layer.ffn.up))
    assert layer.ffn.down.weight.dtype == torch.float32  # the feed-forward output projection stays fp32
    assert type(model.classifier.weight) is torch.nn.Parameter  # the head stays fp32
    with torch.no_grad():
        got = model(ids, mask).logits
    assert got.dtype == torch.float32 and 0 < max_diff(got, expected) <= 0.01 * expected.abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["DebertaV2ForSequenceClassification", "DebertaV2ForQuestionAnswering",
                                  "DebertaV2ForMultipleChoice", "DebertaV2Model"])
def test_onnx_export_matches_pytorch(tmp_path, name: str) -> None:
    pytest.importorskip("onnxscript", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
    pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (the onnx extra)")
    from bertforge.export import export_onnx

    torch.manual_seed(0)
    config = set_labels(DebertaV2Config(**SIZES, **HEAD_CONFIG), 3)
    model = registry.class_for_architecture(name)(config).eval()
    result = export_onnx(model, tmp_path / "model.onnx")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    assert "pooled_output" not in result.outputs


GOOD = ["a gripping film", "beautifully acted and warm", "the best film I have seen this year",
        "funny , warm and bright", "a clever and moving film", "what a gripping story"]
BAD = ["dull and far too long", "a terrible ending ruins it", "flat and far too slow", "too long and too dull",
       "the ending is terrible", "boring and slow"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random DeBERTaV3-shaped masked LM with a WordPiece vocabulary trained on the fixture's words."""
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("deberta")
    corpus = root / "corpus.txt"
    corpus.write_text(("\n".join(GOOD + BAD) + "\n") * 10, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=150, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = registry.from_preset("deberta-v3-xsmall", vocab_size=tokenizer.vocab_size, num_hidden_layers=1,
                                  hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, position_buckets=16)
    DebertaV2ForMaskedLM(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
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
    assert type(model) is DebertaV2ForSequenceClassification and report.ok
    saved = json.loads((seed_dir / "config.json").read_text())
    assert saved["model_type"] == "deberta-v2" and saved["id2label"] == {"0": "negative", "1": "positive"}
    rows = [json.loads(line) for line in (seed_dir / "predictions-test.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["what a gripping story", "too long and too dull"]
    assert all(r["label"] in ("negative", "positive") for r in rows)
    # transformers reads the fine-tuned model and agrees on the logits
    theirs = transformers.DebertaV2ForSequenceClassification.from_pretrained(seed_dir,
                                                                             attn_implementation="eager").eval()
    ids, mask = padded_batch(10, rows=2)
    ids = ids.clamp(max=model.config.vocab_size - 1)
    with torch.no_grad():
        assert max_diff(model.eval()(ids, mask).logits, theirs(input_ids=ids, attention_mask=mask).logits) <= ATOL

    classify = pipeline(str(seed_dir))
    assert classify.task == "text-classification"
    answers = classify([r["text"] for r in rows])
    assert [a["label"] for a in answers] == [r["label"] for r in rows]

    fill = pipeline(str(encoder_dir))  # the masked LM without task.json: fill-mask
    assert fill.task == "fill-mask" and len(fill(["a [MASK] film"])[0]) > 0

    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(seed_dir)) as client:
        answer = client.post("/classify", json={"text": rows[0]["text"]})
        assert answer.status_code == 200 and answer.json()["label"] == rows[0]["label"]
        assert client.post("/embed", json={"text": "a warm film"}).status_code == 200
        assert client.post("/attention", json={"text": "a warm film"}).status_code == 200  # maps on the padded path
