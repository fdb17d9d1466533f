"""DistilBERT: the config both ways, the encoder and every head against transformers (outputs, losses,
both checkpoint round trips), the packed path against the padded one, and the family on bertforge's
own paths (fine-tune, predict, pipeline, serve, int8, ONNX) through the registry alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.model import (
    BertForSequenceClassification,
    DistilBertConfig,
    DistilBertForMaskedLM,
    DistilBertForSequenceClassification,
    DistilBertModel,
    config_from_dict,
    load_any,
    registry,
    resolve_config,
    set_labels,
)
from bertforge.model.distilbert.modeling import sinusoidal_positions

ATOL = 1e-5
# Small and random: 3 layers, 4 heads of 8, a feed-forward that is not 4H.
SIZES = dict(vocab_size=99, dim=32, n_layers=3, n_heads=4, hidden_dim=48, max_position_embeddings=64, pad_token_id=0)


def hf_config(**overrides) -> transformers.DistilBertConfig:
    # eager attention: the only implementation that returns attention probabilities
    config = transformers.DistilBertConfig(**{**SIZES, **overrides})
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
    hf_config(sinusoidal_pos_embds=True, activation="relu", qa_dropout=0.3, seq_classif_dropout=0.15,
              id2label={0: "no", 1: "yes"}).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["tie_weights_"] = True  # older Hub files carry this key: kept and written back
    ours = config_from_dict(written, source="config.json")
    assert isinstance(ours, DistilBertConfig)
    assert (ours.dim, ours.n_layers, ours.n_heads, ours.hidden_dim) == (32, 3, 4, 48)
    assert ours.sinusoidal_pos_embds is True and ours.activation == "relu" and ours.qa_dropout == 0.3
    again = ours.to_dict()
    for key, value in written.items():
        if key not in ("transformers_version", "dtype", "architectures"):
            assert again[key] == value, key
    assert "hidden_size" not in again and "num_hidden_layers" not in again  # transformers' names only


def test_our_config_json_loads_in_transformers(tmp_path) -> None:
    ours = set_labels(DistilBertConfig(**SIZES, sinusoidal_pos_embds=True, dropout=0.2, seq_classif_dropout=0.3),
                      ["a", "b", "c"])
    ours.to_json_file(tmp_path / "config.json")
    theirs = transformers.DistilBertConfig.from_pretrained(tmp_path)
    assert (theirs.dim, theirs.n_layers, theirs.n_heads, theirs.hidden_dim) == (32, 3, 4, 48)
    assert theirs.sinusoidal_pos_embds is True and theirs.dropout == 0.2 and theirs.seq_classif_dropout == 0.3
    assert theirs.num_labels == 3 and theirs.id2label[2] == "c"


def test_generic_code_reads_the_config_under_berts_names() -> None:
    config = DistilBertConfig(**SIZES, activation="gelu_new", dropout=0.15, attention_dropout=0.05)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.intermediate_size) == (
        32, 3, 4, 48)
    assert (config.hidden_act, config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (
        "gelu_new", 0.15, 0.05)
    assert (config.head_dim, config.layer_norm_eps, config.type_vocab_size, config.hidden_groups) == (8, 1e-12, 0, 3)
    wider = config.with_overrides(hidden_size=64, num_attention_heads=8)  # BERT's names set DistilBERT's fields
    assert (wider.dim, wider.n_heads) == (64, 8)
    with pytest.raises(ValueError, match="dim is given twice"):
        config.with_overrides(dim=64, hidden_size=64)
    # transformers' attribute_map: config.json may spell these three BERT's way
    assert config_from_dict({"model_type": "distilbert", "hidden_size": 64, "n_heads": 2}).dim == 64


def test_bad_configs_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="dim .32. must be a multiple of n_heads .5."):
        config_from_dict({"model_type": "distilbert", **SIZES, "n_heads": 5})
    with pytest.raises(ValueError, match="tie_word_embeddings must be true"):
        config_from_dict({"model_type": "distilbert", **SIZES, "tie_weights_": False})
    with pytest.raises(ValueError, match="activation 'swish'"):
        DistilBertConfig(activation="swish")


def test_presets_build_distilbert_base_exactly() -> None:
    names = registry.preset_names()
    assert len(names) == len(set(names))  # unique across families
    base = resolve_config("distil-base")
    assert isinstance(base, DistilBertConfig) and (base.n_layers, base.dim, base.n_heads, base.hidden_dim) == (
        6, 768, 12, 3072)
    with torch.device("meta"):
        ours = DistilBertModel(base)
        theirs = transformers.DistilBertModel(transformers.DistilBertConfig())
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters()) == base.estimated_parameter_count()
    assert resolve_config("distil-tiny", vocab_size=500).vocab_size == 500


def test_the_registry_knows_the_family() -> None:
    assert registry.jobs_of("distilbert") == ["embeddings", "masked-lm", "sequence-classification",
                                              "token-classification", "question-answering", "multiple-choice"]
    assert registry.model_class("distilbert", "pretraining") is DistilBertForMaskedLM  # no pre-training head
    assert DistilBertModel.supports_attention_maps


# ------------------------------------------------------------------------------------------------
# The encoder against transformers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sinusoidal", [False, True])
def test_every_hidden_state_and_attention_map_equals_transformers(tmp_path, sinusoidal: bool) -> None:
    theirs = saved_transformers_model(tmp_path, "DistilBertModel", sinusoidal_pos_embds=sinusoidal)
    ours, report = load_any(tmp_path)
    assert type(ours) is DistilBertModel and report.ok and not report.new_heads and ours.pooler is None
    ours.eval()
    ids, mask = padded_batch()
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, output_hidden_states=True, output_attentions=True)
        out = ours(ids, mask, output_hidden_states=True, output_attentions=True)
    assert out.pooled_output is None
    assert len(out.hidden_states) == len(expected.hidden_states) == SIZES["n_layers"] + 1
    for mine, reference in zip(out.hidden_states, expected.hidden_states, strict=True):
        assert max_diff(real(mine, mask), real(reference, mask)) <= ATOL
    assert len(out.attentions) == SIZES["n_layers"]
    for mine, reference in zip(out.attentions, expected.attentions, strict=True):  # (B, A, T, T)
        rows = mask.bool()[:, None, :, None].expand_as(mine)  # real queries (keys at padding get ~0 in both)
        assert max_diff(mine[rows], reference[rows]) <= ATOL


@pytest.mark.parametrize("per_sequence", [True, False, None])
def test_packed_paths_equal_transformers_and_the_padded_path(tmp_path, per_sequence: bool | None) -> None:
    theirs = saved_transformers_model(tmp_path, "DistilBertModel")
    ours = load_any(tmp_path)[0].eval()
    ours.attention_per_sequence = per_sequence
    ids, mask = padded_batch(30, rows=5)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).last_hidden_state
        packed = ours(ids, mask).last_hidden_state
        ours.unpad = False
        padded = ours(ids, mask).last_hidden_state
    assert max_diff(real(packed, mask), real(expected, mask)) <= ATOL
    assert max_diff(real(packed, mask), real(padded, mask)) <= ATOL
    assert (packed[~mask.bool()] == 0).all()  # the packed path leaves zeros at padding


def test_token_type_ids_are_ignored_and_an_unpadded_batch_matches(tmp_path) -> None:
    theirs = saved_transformers_model(tmp_path, "DistilBertModel")
    ours = load_any(tmp_path)[0].eval()
    ids, _ = padded_batch(16, rows=2)
    with torch.no_grad():
        expected = theirs(ids).last_hidden_state
        plain = ours(ids).last_hidden_state
        with_types = ours(ids, torch.ones_like(ids), torch.ones_like(ids)).last_hidden_state
    assert max_diff(plain, expected) <= ATOL and torch.equal(plain, with_types)


def test_sinusoidal_positions_equal_transformers_table_and_stay_fixed() -> None:
    theirs = transformers.DistilBertModel(hf_config(sinusoidal_pos_embds=True))
    table = theirs.embeddings.position_embeddings.weight
    assert torch.equal(sinusoidal_positions(*table.shape), table.detach())
    ours = DistilBertModel(DistilBertConfig(**SIZES, sinusoidal_pos_embds=True))
    assert torch.equal(ours.embeddings.position_embeddings.weight, table.detach())
    assert not ours.embeddings.position_embeddings.weight.requires_grad  # fixed, as in the paper


# ------------------------------------------------------------------------------------------------
# Heads: outputs, losses, both round trips
# ------------------------------------------------------------------------------------------------
def _labels(name: str, ids: torch.Tensor, mask: torch.Tensor, overrides: dict) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    rows = ids.shape[0]
    if name == "DistilBertForMaskedLM":
        labels = ids.masked_fill(torch.rand(ids.shape, generator=generator) > 0.3, -100)
        return {"labels": labels.masked_fill(mask == 0, -100)}
    if name == "DistilBertForTokenClassification":
        labels = torch.randint(0, overrides["num_labels"], ids.shape, generator=generator)
        return {"labels": labels.masked_fill(mask == 0, -100)}
    if name == "DistilBertForQuestionAnswering":  # inside the real tokens, plus one beyond the window (ignored)
        lengths = mask.sum(1)
        start = torch.minimum(torch.arange(rows) + 1, lengths - 1)
        end = torch.minimum(start + 2, lengths - 1)
        end[-1] = ids.shape[1] + 5
        return {"start_positions": start, "end_positions": end}
    if name == "DistilBertForMultipleChoice":
        return {"labels": torch.randint(0, ids.shape[1], (rows,), generator=generator)}
    problem = overrides.get("problem_type")
    if problem == "regression":
        return {"labels": torch.rand(rows, generator=generator) * 5}
    if problem == "multi_label_classification":
        return {"labels": (torch.rand(rows, overrides["num_labels"], generator=generator) > 0.5).float()}
    return {"labels": torch.randint(0, overrides["num_labels"], (rows,), generator=generator)}


def _outputs(name: str, out, mask: torch.Tensor) -> list[torch.Tensor]:
    """A head's outputs at real tokens, from either library's output record."""
    if name == "DistilBertForQuestionAnswering":
        return [real(out.start_logits, mask), real(out.end_logits, mask)]
    logits = getattr(out, "mlm_logits", None)
    logits = out.logits if logits is None else logits
    return [real(logits, mask)] if name in ("DistilBertForMaskedLM", "DistilBertForTokenClassification") else [logits]


def _reference_loss(name: str, reference, labels: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """transformers' loss, except for QA: ours keeps spans off padding, so padding is masked out of
    transformers' span distributions too before its loss is compared."""
    if name != "DistilBertForQuestionAnswering":
        return reference.loss
    lowest = torch.finfo(torch.float32).min
    length = mask.shape[1]
    loss = 0.0
    for logits, key in ((reference.start_logits, "start_positions"), (reference.end_logits, "end_positions")):
        target = labels[key].masked_fill(labels[key] >= length, -100)
        loss = loss + torch.nn.functional.cross_entropy(logits.masked_fill(mask == 0, lowest), target)
    return loss / 2


HEADS = [
    ("DistilBertForMaskedLM", {}),
    ("DistilBertForSequenceClassification", {"num_labels": 3}),
    ("DistilBertForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}),
    ("DistilBertForSequenceClassification", {"num_labels": 4, "problem_type": "multi_label_classification"}),
    ("DistilBertForTokenClassification", {"num_labels": 5}),
    ("DistilBertForQuestionAnswering", {}),
    ("DistilBertForMultipleChoice", {}),
]
HEAD_IDS = ["mlm", "seqcls", "regression", "multilabel", "token", "qa", "mc"]


def _batch(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return padded_batch(16, rows=2, choices=3) if name == "DistilBertForMultipleChoice" else padded_batch(20)


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
    assert saved["model_type"] == "distilbert" and saved["architectures"] == [name] and "dim" in saved
    reloaded, info = getattr(transformers, name).from_pretrained(tmp_path / "ours", output_loading_info=True,
                                                                 attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert _compare(name, ours, reloaded.eval(), overrides) <= ATOL


def test_bert_entry_points_build_the_distilbert_class(tmp_path) -> None:
    """Generic code asks any family's class for a job: a DistilBERT checkpoint gives DistilBERT's."""
    saved_transformers_model(tmp_path, "DistilBertForMaskedLM")
    model = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert type(model) is DistilBertForSequenceClassification and model.classifier.out_features == 4
    assert model.load_report.new_heads == ["classifier.bias", "classifier.weight", "pre_classifier.bias",
                                           "pre_classifier.weight"]
    assert model.load_report.unused == ["vocab_bias", "vocab_layer_norm.bias", "vocab_layer_norm.weight",
                                        "vocab_transform.bias", "vocab_transform.weight"]
    encoder = DistilBertModel.from_pretrained(tmp_path)  # the bare encoder out of a head checkpoint
    assert encoder.load_report.ok and len(encoder.load_report.unused) == 5


def test_training_mode_places_dropout_as_transformers_does(tmp_path, torch_dropout_draws) -> None:
    """With the padded path both libraries draw the same dropout masks in the same order, so equal
    training-mode outputs show the same dropout sites (none on the attention output in DistilBERT)."""
    theirs = saved_transformers_model(tmp_path, "DistilBertForSequenceClassification", num_labels=3,
                                      dropout=0.3, attention_dropout=0.0, seq_classif_dropout=0.4)
    ours = load_any(tmp_path)[0]
    ours.distilbert.unpad = False
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
    model = DistilBertForMaskedLM(DistilBertConfig(**SIZES, sinusoidal_pos_embds=True)).train()
    ids, mask = padded_batch(24)
    labels = _labels("DistilBertForMaskedLM", ids, mask, {})["labels"]
    torch.manual_seed(1)
    loss = model(ids, mask, labels=labels).loss
    loss.backward()
    embeddings = model.distilbert.embeddings
    assert torch.isfinite(loss) and embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert embeddings.position_embeddings.weight.grad is None  # the sinusoids are not trained
    model.distilbert.gradient_checkpointing = True
    torch.manual_seed(1)
    assert torch.equal(model(ids, mask, labels=labels).loss, loss)


# ------------------------------------------------------------------------------------------------
# bertforge's own paths, found through the registry
# ------------------------------------------------------------------------------------------------
def test_int8_quantizes_the_encoder_layers() -> None:
    from bertforge.precision import apply_precision, is_quantized

    torch.manual_seed(0)
    reference = randomised(DistilBertForSequenceClassification(set_labels(DistilBertConfig(**SIZES), 3)))
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
    # measured 0.05% to 0.16% of the largest logit over three seeds; the bound is about 6x that
    assert got.dtype == torch.float32 and 0 < max_diff(got, expected) <= 0.01 * expected.abs().max().item()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["DistilBertForSequenceClassification", "DistilBertForQuestionAnswering",
                                  "DistilBertForMultipleChoice", "DistilBertModel"])
def test_onnx_export_matches_pytorch(tmp_path, name: str) -> None:
    pytest.importorskip("onnxscript", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
    pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (the onnx extra)")
    from bertforge.export import export_onnx

    torch.manual_seed(0)
    model = registry.class_for_architecture(name)(set_labels(DistilBertConfig(**SIZES), 3)).eval()
    result = export_onnx(model, tmp_path / "model.onnx")
    assert result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    assert "pooled_output" not in result.outputs


GOOD = ["a gripping film", "beautifully acted and warm", "the best film I have seen this year",
        "funny , warm and bright", "a clever and moving film", "what a gripping story"]
BAD = ["dull and far too long", "a terrible ending ruins it", "flat and far too slow", "too long and too dull",
       "the ending is terrible", "boring and slow"]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random DistilBERT masked LM with a WordPiece vocabulary trained on the fixture's words."""
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("distil")
    corpus = root / "corpus.txt"
    corpus.write_text(("\n".join(GOOD + BAD) + "\n") * 10, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=150, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = registry.from_preset("distil-tiny", vocab_size=tokenizer.vocab_size, n_layers=1, dim=32, n_heads=2,
                                  hidden_dim=64, max_position_embeddings=64)
    DistilBertForMaskedLM(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
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
    assert type(model) is DistilBertForSequenceClassification and report.ok
    saved = json.loads((seed_dir / "config.json").read_text())
    assert saved["model_type"] == "distilbert" and saved["id2label"] == {"0": "negative", "1": "positive"}
    rows = [json.loads(line) for line in (seed_dir / "predictions-test.jsonl").read_text().splitlines()]
    assert [r["text"] for r in rows] == ["what a gripping story", "too long and too dull"]
    assert all(r["label"] in ("negative", "positive") for r in rows)
    # transformers reads the fine-tuned model and agrees on the logits
    theirs = transformers.DistilBertForSequenceClassification.from_pretrained(seed_dir).eval()
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
