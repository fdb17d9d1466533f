"""RoBERTa, XLM-RoBERTa and CamemBERT: the config both ways, the encoder and every head against
transformers in both directions, losses, the unpadded path, and the whole path (fine-tune, predict,
pipeline, serve, int8, ONNX) on a tiny own-data fixture."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.model import (
    BertForSequenceClassification,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
    config_from_dict,
    load_any,
    registry,
    resolve_config,
    set_labels,
)
from bertforge.model.roberta.modeling import position_ids_from

ATOL = 1e-5
PAD = 1  # RoBERTa's <pad>: positions start at PAD + 1
# Small and random; the released models' single token type and epsilon, 40 positions (38 tokens).
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=40, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=PAD)
# config.json model_type -> transformers' (and our) class-name prefix
MODEL_TYPES = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"}
HEADS = {  # our class name without the prefix -> (the RoBERTa class doing that job, config overrides)
    "Model": (RobertaModel, {}),
    "ForMaskedLM": (RobertaForMaskedLM, {}),
    "ForSequenceClassification": (RobertaForSequenceClassification, {"num_labels": 3}),
    "ForTokenClassification": (RobertaForTokenClassification, {"num_labels": 5}),
    "ForQuestionAnswering": (RobertaForQuestionAnswering, {}),
    "ForMultipleChoice": (RobertaForMultipleChoice, {}),
}
CASES = [(model_type, head) for model_type in MODEL_TYPES for head in HEADS]


def hf_config(model_type: str, **overrides) -> transformers.PretrainedConfig:
    return getattr(transformers, f"{MODEL_TYPES[model_type]}Config")(**{**SIZES, **overrides})


def randomised(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every parameter moved off its initial value (norms away from 1, biases and the padding rows
    from 0), so that a mixed-up or skipped weight cannot go unnoticed."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def padded_batch(length: int = 17, rows: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, length) ids and mask, rows of mixed lengths padded on the right with <pad>."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(PAD + 2, SIZES["vocab_size"], (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, rows):
        real = max(1, length * (rows - row) // rows)
        mask[row, real:] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values at real tokens only: padding positions mean nothing in either library."""
    return x[mask.bool()]


def saved_transformers_model(directory: Path, model_type: str, head: str,
                             **overrides) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = hf_config(model_type, **{**HEADS[head][1], **overrides})
    model = randomised(getattr(transformers, f"{MODEL_TYPES[model_type]}{head}")(config))
    model.save_pretrained(directory)
    return model


def head_outputs(head: str, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """The outputs to compare, at real tokens, for either library's model."""
    if head == "ForMultipleChoice":  # the batch's rows as the choices of two questions
        length = ids.shape[-1]
        return [model(input_ids=ids.view(2, -1, length), attention_mask=mask.view(2, -1, length)).logits]
    out = model(input_ids=ids, attention_mask=mask, output_hidden_states=head == "Model")
    if head == "Model":
        pooled = out.pooled_output if hasattr(out, "pooled_output") else out.pooler_output
        return [real(state, mask) for state in out.hidden_states] + [pooled]
    if head == "ForQuestionAnswering":
        return [real(out.start_logits, mask), real(out.end_logits, mask)]
    logits = out.mlm_logits if hasattr(out, "mlm_logits") else out.logits
    return [logits] if head == "ForSequenceClassification" else [real(logits, mask)]


def max_difference(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> float:
    assert len(ours) == len(theirs)
    return max((mine - reference).abs().max().item() for mine, reference in zip(ours, theirs, strict=True))


# ------------------------------------------------------------------------------------------------
# config.json both ways
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_transformers_config_json_reads_and_writes_back_the_same_fields(tmp_path, model_type: str) -> None:
    hf_config(model_type, classifier_dropout=0.2, num_labels=4).save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["some_future_key"] = {"kept": True}
    ours = config_from_dict(written, source="config.json")
    assert type(ours).__name__ == f"{MODEL_TYPES[model_type]}Config" and ours.model_type == model_type
    assert (ours.max_position_embeddings, ours.type_vocab_size, ours.pad_token_id) == (40, 1, PAD)
    assert ours.classifier_dropout == 0.2 and ours.extra["some_future_key"] == {"kept": True}
    again = ours.to_dict()
    for key, value in written.items():
        if key not in ("transformers_version", "dtype", "architectures"):
            assert again[key] == value, key


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_our_config_json_loads_in_transformers(tmp_path, model_type: str) -> None:
    ours = registry.family(model_type).config_class(**SIZES, classifier_dropout=0.3, bos_token_id=5, eos_token_id=6)
    ours.to_json_file(tmp_path / "config.json", architectures=[f"{MODEL_TYPES[model_type]}ForMaskedLM"])
    theirs = transformers.AutoConfig.from_pretrained(tmp_path)
    assert type(theirs).__name__ == f"{MODEL_TYPES[model_type]}Config"
    for name, value in ours.to_dict().items():
        assert getattr(theirs, name) == value, name
    assert registry.read_config_file(tmp_path / "config.json") == ours


def test_defaults_are_transformers_and_presets_are_the_released_models() -> None:
    """A config.json missing a key reads as transformers reads it; the presets build the real sizes."""
    defaults = transformers.RobertaConfig()
    assert all(getattr(RobertaConfig(), name) == getattr(defaults, name)
               for name in ("vocab_size", "max_position_embeddings", "type_vocab_size", "layer_norm_eps",
                            "pad_token_id", "bos_token_id", "eos_token_id", "hidden_act"))
    names = registry.preset_names()
    assert len(names) == len(set(names))  # unique across the families
    for name, hub in [("roberta-base", transformers.RobertaConfig(max_position_embeddings=514, type_vocab_size=1)),
                      ("xlm-roberta-base", transformers.XLMRobertaConfig(
                          vocab_size=250002, max_position_embeddings=514, type_vocab_size=1))]:
        config = resolve_config(name)
        assert config.model_type == hub.model_type and config.max_tokens == 512 and config.layer_norm_eps == 1e-5
        with torch.device("meta"):
            ours = registry.model_class(config.model_type, "embeddings")(config)
            theirs = transformers.AutoModel.from_config(hub)
        assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
        assert config.estimated_parameter_count() == ours.num_parameters()


BAD_CONFIGS = [
    ({"is_decoder": True}, "is_decoder True is not supported"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings False is not supported"),
    ({"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key' is not supported"),
    ({"pad_token_id": 120}, "pad_token_id 120 is not an id of the vocabulary"),
    ({"max_position_embeddings": 2}, "leaves no position for a token"),
    ({"type_vocab_size": 0}, "type_vocab_size must be a positive integer"),
]


@pytest.mark.parametrize(("change", "message"), BAD_CONFIGS)
def test_a_bad_config_json_is_one_line_naming_the_field(tmp_path, change: dict, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "roberta", **SIZES, **change}))
    with pytest.raises(ValueError, match=f"^{path}: .*{message}"):
        registry.read_config_file(path)


def test_three_families_from_one_folder() -> None:
    """The folder lists its three model_types in FAMILIES; each is a family with every job but NSP
    pre-training, which falls back to masked LM."""
    for model_type, prefix in MODEL_TYPES.items():
        assert registry.family(model_type).config_class.model_type == model_type
        assert registry.jobs_of(model_type) == [job for job in registry.JOBS if job not in ("pretraining", "causal-lm")]
        assert registry.model_class(model_type, "pretraining").__name__ == f"{prefix}ForMaskedLM"
        assert registry.class_for_architecture(f"{prefix}ForTokenClassification").model_type == model_type


# ------------------------------------------------------------------------------------------------
# Positions and token types
# ------------------------------------------------------------------------------------------------
def test_positions_count_tokens_from_padding_idx_plus_one() -> None:
    ids = torch.tensor([[0, 5, 6, 2, 1, 1], [0, 7, 1, 8, 2, 1]])  # a <pad> inside the second row too
    assert position_ids_from(ids, 1).tolist() == [[2, 3, 4, 5, 1, 1], [2, 3, 1, 4, 5, 1]]


def test_too_long_an_input_names_the_token_positions() -> None:
    model = RobertaModel(RobertaConfig(**SIZES)).eval()
    model(torch.full((1, 38), 5))  # 40 positions, the first two unused: 38 tokens
    with pytest.raises(ValueError, match="sequence length 39 exceeds the 38 token positions"):
        model(torch.full((1, 39), 5))


def test_one_token_type_ignores_segment_ids_two_use_them(tmp_path) -> None:
    """A WordPiece tokenizer's segment-B ids would index past a one-row table: they are ignored. With
    `type_vocab_size: 2` they are read, as transformers reads them."""
    ids, mask = padded_batch()
    segments = (torch.arange(ids.shape[1]) >= 6).long().expand_as(ids)
    model = randomised(RobertaModel(RobertaConfig(**SIZES)))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask, segments).last_hidden_state, model(ids, mask).last_hidden_state)
    theirs = saved_transformers_model(tmp_path, "roberta", "Model", type_vocab_size=2)
    ours = load_any(tmp_path)[0].eval()
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask, token_type_ids=segments).last_hidden_state
        got = ours(ids, mask, segments).last_hidden_state
        assert not torch.allclose(real(got, mask), real(ours(ids, mask).last_hidden_state, mask))
    torch.testing.assert_close(real(got, mask), real(expected, mask), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------
# Every head against transformers, both ways
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_transformers_checkpoint_loads_with_equal_outputs(tmp_path, model_type: str, head: str) -> None:
    theirs = saved_transformers_model(tmp_path, model_type, head)
    name = f"{MODEL_TYPES[model_type]}{head}"
    ids, mask = padded_batch(rows=4)
    with torch.no_grad():
        expected = head_outputs(head, theirs, ids, mask)
    # by the class config.json names, and by RoBERTa's class for the job (the model_type picks the class)
    for ours in (load_any(tmp_path)[0], HEADS[head][0].from_pretrained(tmp_path)):
        assert type(ours).__name__ == name and ours.load_report.ok and not ours.load_report.new_heads
        with torch.no_grad():
            assert max_difference(head_outputs(head, ours.eval(), ids, mask), expected) <= ATOL


@pytest.mark.parametrize(("model_type", "head"), CASES)
def test_our_checkpoint_loads_in_transformers_with_equal_outputs(tmp_path, model_type: str, head: str) -> None:
    theirs = saved_transformers_model(tmp_path / "theirs", model_type, head)
    ours = randomised(load_any(tmp_path / "theirs")[0], seed=2)  # new values, so the file is ours alone
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == model_type and saved["architectures"] == [type(theirs).__name__]
    reloaded, info = type(theirs).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids, mask = padded_batch(rows=4, seed=1)
    with torch.no_grad():
        expected = head_outputs(head, reloaded.eval(), ids, mask)
        assert max_difference(head_outputs(head, ours, ids, mask), expected) <= ATOL


def test_an_encoder_checkpoint_under_a_task_head_reports_the_new_head(tmp_path) -> None:
    saved_transformers_model(tmp_path, "xlm-roberta", "ForMaskedLM")
    model = BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert type(model).__name__ == "XLMRobertaForSequenceClassification"
    assert all(key.startswith("classifier.") for key in model.load_report.new_heads)
    assert model.load_report.unused == ["lm_head.bias", "lm_head.dense.bias", "lm_head.dense.weight",
                                        "lm_head.layer_norm.bias", "lm_head.layer_norm.weight"]


# ------------------------------------------------------------------------------------------------
# Losses against transformers
# ------------------------------------------------------------------------------------------------
def _labels_for(problem: str, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    if problem == "regression":
        return torch.rand(rows, generator=generator) * 5
    if problem == "multi_label_classification":
        return torch.randint(0, 2, (rows, 3), generator=generator).float()
    return torch.randint(0, 3, (rows,), generator=generator)


@pytest.mark.parametrize("problem", ["single_label_classification", "regression", "multi_label_classification"])
def test_sequence_classification_loss_equals_transformers(tmp_path, problem: str) -> None:
    labels = 1 if problem == "regression" else 3
    theirs = saved_transformers_model(tmp_path, "camembert", "ForSequenceClassification", num_labels=labels,
                                      problem_type=problem)
    ours = load_any(tmp_path)[0].eval()
    ids, mask = padded_batch()
    target = _labels_for(problem, ids.shape[0])
    with torch.no_grad():
        mine, reference = ours(ids, mask, labels=target), theirs(ids, attention_mask=mask, labels=target)
    torch.testing.assert_close(mine.logits, reference.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(mine.loss, reference.loss, atol=ATOL, rtol=1e-5)
    if problem == "single_label_classification":  # class weights (classify's balanced): a training setting
        ours.set_label_weights(torch.tensor([1.0, 1.0, 4.0]))
        assert not torch.isclose(ours(ids, mask, labels=target).loss, mine.loss)
        assert "label_weights" not in ours.state_dict()


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForTokenClassification", "ForMultipleChoice",
                                  "ForQuestionAnswering"])
def test_other_losses_equal_transformers(tmp_path, head: str) -> None:
    theirs = saved_transformers_model(tmp_path, "roberta", head)
    ours = load_any(tmp_path)[0].eval()
    ids, mask = padded_batch()
    generator = torch.Generator().manual_seed(4)
    if head == "ForMaskedLM":
        chosen = (torch.rand(ids.shape, generator=generator) < 0.3) & (mask == 1)
        labels = {"labels": torch.where(chosen, ids, -100)}
    elif head == "ForTokenClassification":
        labels = {"labels": torch.randint(0, 5, ids.shape, generator=generator).masked_fill(mask == 0, -100)}
    elif head == "ForMultipleChoice":
        ids, mask = ids.view(2, 2, -1), mask.view(2, 2, -1)
        labels = {"labels": torch.tensor([1, 0])}
    else:  # ours keeps spans off padding, transformers does not: compared on an unpadded batch
        mask = torch.ones_like(mask)
        labels = {"start_positions": torch.tensor([1, 0, 4, 30]), "end_positions": torch.tensor([3, 0, 9, 30])}
    with torch.no_grad():
        mine, reference = ours(ids, mask, **labels), theirs(input_ids=ids, attention_mask=mask, **labels)
    torch.testing.assert_close(mine.loss, reference.loss, atol=ATOL, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# The fast path
# ------------------------------------------------------------------------------------------------
def test_the_unpadded_path_equals_the_padded_path() -> None:
    model = randomised(RobertaForTokenClassification(set_labels(RobertaConfig(**SIZES), 5)))
    ids, mask = padded_batch(length=23, rows=5)
    with torch.no_grad():
        model.roberta.unpad = False
        padded = model(ids, mask, output_hidden_states=True)
        model.roberta.unpad = True
        for per_sequence in (True, False):
            model.roberta.attention_per_sequence = per_sequence
            packed = model(ids, mask, output_hidden_states=True)
            torch.testing.assert_close(real(packed.logits, mask), real(padded.logits, mask), atol=ATOL, rtol=0)
            for mine, reference in zip(packed.hidden_states, padded.hidden_states, strict=True):
                torch.testing.assert_close(real(mine, mask), real(reference, mask), atol=ATOL, rtol=0)
        maps = model(ids, mask, output_attentions=True).attentions  # attention maps take the padded path
    assert model.supports_attention_maps and len(maps) == SIZES["num_hidden_layers"]
    assert maps[0].shape == (5, SIZES["num_attention_heads"], 23, 23)


def test_masked_lm_trains_and_gradient_checkpointing_gives_the_same_loss() -> None:
    torch.manual_seed(0)
    model = RobertaForMaskedLM(RobertaConfig(**SIZES)).train()
    ids, mask = padded_batch()
    labels = torch.full_like(ids, -100)
    labels[:, 1::3] = ids[:, 1::3]
    labels[mask == 0] = -100
    torch.manual_seed(1)
    out = model(ids, mask, labels=labels)
    out.loss.backward()
    assert out.mlm_logits.shape == (int((labels != -100).sum()), SIZES["vocab_size"])  # labelled positions only
    assert torch.isfinite(out.loss) and model.roberta.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    model.roberta.gradient_checkpointing = True
    torch.manual_seed(1)
    torch.testing.assert_close(model(ids, mask, labels=labels).loss, out.loss)


def test_transformer_layers_serve_top_layer_reinitialisation() -> None:
    from bertforge.finetune import reinitialize_top_layers

    model = randomised(RobertaForMultipleChoice(RobertaConfig(**SIZES)))
    layers = model.transformer_layers()
    assert len(layers) == SIZES["num_hidden_layers"] and layers is model.roberta.encoder.layers
    before = copy.deepcopy(model.state_dict())
    reinitialize_top_layers(model, 1)
    changed = {key for key, value in model.state_dict().items() if not torch.equal(value, before[key])}
    assert any(key.startswith("roberta.encoder.layers.2.") for key in changed)
    assert any(key.startswith("roberta.pooler.") for key in changed)
    assert not any(key.startswith(("roberta.encoder.layers.0.", "roberta.encoder.layers.1.")) for key in changed)


# ------------------------------------------------------------------------------------------------
# The whole path on own data: fine-tune, predict, pipeline, serve, int8, ONNX
# ------------------------------------------------------------------------------------------------
SAMPLE = Path(__file__).parent / "fixtures" / "classify"


@pytest.fixture(scope="module")
def roberta_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random roberta-tiny with a WordPiece vocabulary trained on the sample's words (the family
    does not depend on the tokenizer: its pad id becomes the config's, so positions count right)."""
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("roberta")
    words = [line for name in ("reviews.csv", "reviews-dev.csv", "new.csv")
             for line in (SAMPLE / name).read_text(encoding="utf-8").splitlines()[1:]]
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(words * 5) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = registry.from_preset("roberta-tiny", vocab_size=tokenizer.vocab_size,
                                  pad_token_id=tokenizer.pad_token_id, max_position_embeddings=130)
    RobertaForMaskedLM(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    return root / "encoder"


def test_finetune_predict_pipeline_and_serve_on_own_data(roberta_encoder: Path, tmp_path: Path) -> None:
    from bertforge import pipeline
    from bertforge.finetune import finetune

    out = tmp_path / "run"
    settings = {"train": str(SAMPLE / "reviews.csv"), "dev": str(SAMPLE / "reviews-dev.csv"),
                "test": str(SAMPLE / "new.csv")}
    results = finetune("classify", None, roberta_encoder, None, out, epochs=2, batch_size=4, max_length=32,
                       task_settings=settings, progress=False, verbose=False)
    assert "macro_f1" in results["summary"]
    seed_dir = out / "seed-1"
    model, report = load_any(seed_dir)
    assert type(model) is RobertaForSequenceClassification and report.ok and not report.new_heads
    saved = json.loads((seed_dir / "config.json").read_text())
    assert saved["model_type"] == "roberta" and saved["id2label"] == {"0": "negative", "1": "positive"}

    rows = [json.loads(line) for line in (seed_dir / "predictions-test.jsonl").read_text().splitlines()]
    texts = [row["text"] for row in rows]
    classify = pipeline(str(seed_dir))
    assert classify.task == "text-classification"
    answers = classify(texts)
    assert [a["label"] for a in answers] == [row["label"] for row in rows]  # as fine-tuning predicted
    for answer, row in zip(answers, rows, strict=True):
        assert answer["score"] == pytest.approx(row["score"], abs=1e-5)

    # the fine-tuned checkpoint is transformers' too: same logits there
    theirs = transformers.RobertaForSequenceClassification.from_pretrained(seed_dir).eval()
    ids = torch.tensor([classify.tokenizer.encode(texts[0]).input_ids])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, theirs(ids).logits, atol=ATOL, rtol=0)

    pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(seed_dir)) as client:
        answer = client.post("/classify", json={"text": texts[0]})
        assert answer.status_code == 200 and answer.json()["label"] == rows[0]["label"]
        assert client.post("/embed", json={"text": texts[1]}).status_code == 200
        maps = client.post("/attention", json={"text": texts[1]})
        assert maps.status_code == 200, maps.text


def test_fill_mask_pipeline_on_the_masked_lm_checkpoint(roberta_encoder: Path) -> None:
    from bertforge import pipeline

    fill = pipeline(str(roberta_encoder))
    assert fill.task == "fill-mask"
    [[candidates]] = fill(["a gripping [MASK]"])  # one text, one mask
    model = RobertaForMaskedLM.from_pretrained(roberta_encoder).eval()
    encoding = fill.tokenizer.encode("a gripping [MASK]")
    position = encoding.input_ids.index(fill.tokenizer.mask_token_id)
    with torch.no_grad():
        logits = model(torch.tensor([encoding.input_ids])).mlm_logits[0, position]
    logits[sorted(set(fill.tokenizer.all_special_ids))] = -torch.inf
    assert [c["token_id"] for c in candidates] == logits.topk(len(candidates)).indices.tolist()


def test_int8_quantizes_the_encoder_and_stays_close(roberta_encoder: Path) -> None:
    from bertforge.precision import apply_precision, is_quantized

    model = randomised(RobertaForSequenceClassification.from_pretrained(roberta_encoder, num_labels=3))
    ids, mask = padded_batch(rows=4)
    ids = ids.clamp(max=model.config.vocab_size - 1).masked_fill(mask == 0, model.config.pad_token_id)
    with torch.inference_mode():
        expected = model(ids, mask).logits
    int8, used = apply_precision(copy.deepcopy(model), "int8")
    assert used == "int8" and is_quantized(int8)
    layer = int8.transformer_layers()[0]
    assert all(type(m.weight).__name__ == "Int8Tensor" for m in (layer.attention.qkv, layer.attention.out, layer.ffn.up))
    assert layer.ffn.down.weight.dtype == torch.float32  # the feed-forward output projection stays fp32
    assert type(int8.classifier.out_proj.weight) is torch.nn.Parameter  # the head stays fp32
    with torch.inference_mode():
        error = (int8(ids, mask).logits - expected).abs().max().item()
    assert 0 < error <= 0.12 * max(1.0, expected.abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_onnx_export_matches_pytorch(tmp_path, model_type: str) -> None:
    pytest.importorskip("onnxscript", reason="ONNX export needs onnx and onnxscript (the onnx extra)")
    pytest.importorskip("onnxruntime", reason="the parity check needs onnxruntime (the onnx extra)")
    from bertforge.export import check_onnx, export_onnx, sample_inputs

    saved_transformers_model(tmp_path / "model", model_type, "ForTokenClassification")
    model = load_any(tmp_path / "model")[0].eval()
    result = export_onnx(model, tmp_path / "model.onnx")
    assert result.outputs == ["logits"] and result.max_abs_diff is not None and result.max_abs_diff <= 1e-4
    inputs = sample_inputs(model, batch=3, length=model.config.max_tokens, seed=5)  # the longest input
    assert check_onnx(model, tmp_path / "model.onnx", inputs) <= 1e-4
