"""Frozen encoders and the BiLSTM head (`finetune --frozen --frozen-layers`, `--head bilstm`), generic over
task families and model families.

Frozen training must leave every encoder tensor bit-for-bit as loaded and train only the head; each layer
choice gives the head its stated input width; the BiLSTM head learns (its loss falls) in classification,
tagging and QA; a directory fine-tuned either way predicts through `pipeline()` what the model predicted
right after training, and transformers still loads its encoder; bad settings fail in one line.

The models are random 4-layer encoders (the "last four" choices need four layers) of two families, BERT
and DistilBERT, with a WordPiece tokenizer trained on a tiny corpus; the data are the small fixtures.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from bertforge.finetune import finetune
from bertforge.model import registry
from bertforge.model.base import TaskHeadModel, label_maps
from bertforge.model.task_heads import LAYER_CHOICES, TASK_HEAD_KEY, TaskHead, input_width, layer_indices
from bertforge.tasks import make_task
from bertforge.tasks.base import TaskBatches
from bertforge.tokenizer import BertTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
REVIEWS = FIXTURES / "classify"
QUIET = {"progress": False, "verbose": False, "batch_size": 4, "save_best": False}
CORPUS = [
    "a gripping , beautifully acted film with a terrible ending . dull and far too long .",
    "the best film i have seen this year . eu backs german euro plan . peter blackburn",
    "the normans were a people who gave their name to normandy , a region in france .",
    "what is the largest city ? zurich is the largest city in switzerland .",
]
LAYERS = 4


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizer:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    return BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)


def _config(model_type: str, tokenizer: BertTokenizer) -> Any:
    """The family's smallest preset cut to 4 layers, with this tokenizer's vocabulary."""
    names = list(registry.family(model_type).presets)
    configs = [registry.from_preset(name, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                                    num_hidden_layers=LAYERS) for name in names]
    return min(configs, key=lambda config: config.estimated_parameter_count())


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def encoder(request: pytest.FixtureRequest, tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random bare encoder of the family, saved like a pre-trained checkpoint."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp(f"encoder-{request.param}")
    registry.model_class(request.param, "embeddings")(_config(request.param, tokenizer)).save_pretrained(
        directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def bert_encoder(tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("encoder-bert-only")
    registry.model_class("bert", "embeddings")(_config("bert", tokenizer)).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _files(family: str, tmp_path: Path) -> dict[str, Any]:
    """The task settings of one own-data family on the fixtures."""
    if family == "classify":
        return {"train": str(REVIEWS / "reviews.csv"), "dev": str(REVIEWS / "reviews-dev.csv")}
    if family == "tag":
        tagged = tmp_path / "tagged.txt"
        shutil.copy(TASKS / "conll" / "without_docstart.txt", tagged)
        return {"train": str(tagged), "dev": str(tagged)}
    return {"train": str(TASKS / "squad" / "v2.json"), "dev": str(TASKS / "squad" / "v2.json"), "doc_stride": 8}


MAX_LENGTH = {"classify": 24, "tag": 16, "qa": 48}


def _encoder_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """A directory's encoder weights by their key below the backbone (no `bert.` prefix; no head, no pooler:
    the heads here read token vectors)."""
    prefixes = ("bert.", "distilbert.")
    found = {}
    for key, tensor in load_file(str(directory / "model.safetensors")).items():
        for prefix in prefixes:
            key = key.removeprefix(prefix)
        if not key.startswith(("task_head.", "classifier.", "qa_outputs.", "pooler.", "pre_classifier.")):
            found[key] = tensor
    return found


# ------------------------------------------------------------------------------------------------
# frozen: only the head trains
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, layers, head", [
    ("classify", "sum_last_four", "linear"),
    ("tag", "concat_last_four", "linear"),
    ("qa", "weighted_sum_all", "bilstm"),
])
def test_frozen_training_changes_only_the_head(encoder: Path, family: str, layers: str, head: str,
                                               tmp_path: Path) -> None:
    out = tmp_path / "run"
    finetune(family, None, encoder, None, out, epochs=2, lr=1e-2, max_length=MAX_LENGTH[family], frozen=True,
             frozen_layers=layers, head=head, task_settings=_files(family, tmp_path), **QUIET)
    seed = out / "seed-1"
    before, after = _encoder_tensors(encoder), _encoder_tensors(seed)
    assert after and set(after) <= set(before)
    changed = [key for key, tensor in after.items() if not torch.equal(tensor, before[key])]
    assert not changed, f"frozen training changed encoder tensors: {changed}"

    saved = json.loads((seed / "config.json").read_text())
    assert saved[TASK_HEAD_KEY]["frozen"] is True and saved[TASK_HEAD_KEY]["layers"] == layers
    assert saved[TASK_HEAD_KEY]["head"] == head
    # the head did train: it is not the head a fresh model with the same settings starts from
    trained = load_file(str(seed / "model.safetensors"))
    model_type = saved["model_type"]
    job = make_task(family, family, _files(family, tmp_path)).job
    fresh = registry.model_class(model_type, job).from_pretrained(seed, **{TASK_HEAD_KEY: saved[TASK_HEAD_KEY]})
    torch.manual_seed(123)
    fresh.init_modules(fresh.task_head)
    head_keys = [k for k in trained if k.startswith("task_head.")]
    assert head_keys
    assert any(not torch.equal(trained[k], fresh.state_dict()[k]) for k in head_keys if "output" in k)


def test_frozen_model_trains_only_the_head_in_process(bert_encoder: Path, tokenizer: BertTokenizer) -> None:
    """Every parameter outside `task_head.` has requires_grad False and the encoder stays in eval mode
    through `train()`; a step of AdamW moves the head and the layer mix only."""
    from bertforge.model.auto import load_for_job

    head = TaskHead("sequence-classification", frozen=True, layers="weighted_sum_all")
    model = load_for_job(bert_encoder, "sequence-classification", **label_maps(2), **{TASK_HEAD_KEY: head.to_dict()})
    assert isinstance(model, TaskHeadModel)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"task_head.layer_mix.weights", "task_head.layer_mix.scale", "task_head.output.weight",
                         "task_head.output.bias"}
    model.train()
    assert model.task_head.training and not model.base_model.training
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor(tokenizer.encode_batch(["a gripping film", "dull"], padding=True)["input_ids"])
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(ids, (ids != tokenizer.pad_token_id).long(), labels=torch.tensor([1, 0])).loss.backward()
    optimiser.step()
    moved = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert moved == trainable


# ------------------------------------------------------------------------------------------------
# layer choices
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layers", LAYER_CHOICES)
@pytest.mark.parametrize("head", ["linear", "bilstm"])
def test_layer_choices_give_the_expected_input_width(bert_encoder: Path, layers: str, head: str) -> None:
    from bertforge.model.auto import load_for_job

    record = TaskHead("token-classification", head=head, frozen=True, layers=layers)
    model = load_for_job(bert_encoder, "token-classification", **label_maps(3), **{TASK_HEAD_KEY: record.to_dict()})
    hidden = model.config.hidden_size
    width = hidden * 4 if layers == "concat_last_four" else hidden
    assert input_width(layers, hidden, LAYERS) == width
    if head == "bilstm":
        assert model.task_head.bilstm.input_size == width
        assert model.task_head.bilstm.hidden_size == hidden // 2  # default: both directions as wide as H
        assert model.task_head.output.in_features == hidden
    else:
        assert model.task_head.output.in_features == width
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    model.eval()
    with torch.no_grad():
        logits = model(ids, mask).logits
        encoded = model.base_model(ids, mask, output_hidden_states=True)
    assert logits.shape == (2, 5, 3)
    if head == "linear":  # the head reads exactly the named hidden states, combined as named
        states = encoded.hidden_states
        expected = {
            "last": encoded.last_hidden_state, "second_to_last": states[3], "embeddings": states[0],
            "sum_last_four": states[1] + states[2] + states[3] + states[4],
            "concat_last_four": torch.cat(states[1:5], dim=-1),
            "sum_all": states[1] + states[2] + states[3] + states[4],
            "weighted_sum_all": (states[1] + states[2] + states[3] + states[4]) / 4,  # equal weights at first
        }[layers]
        torch.testing.assert_close(logits, model.task_head.output(expected))


def test_layer_choices_read_what_feature_extraction_reads() -> None:
    """The names shared with `bertforge extract` and the NER ablation pick the same hidden states."""
    from bertforge.features import STRATEGIES, resolve_layers

    for strategy in STRATEGIES:
        for layers in (4, 12):
            indices, combine = layer_indices(strategy, layers)
            selection = resolve_layers(layers, strategy)
            assert indices == selection.layers
            assert combine == ("one" if len(indices) == 1 else selection.combine)


# ------------------------------------------------------------------------------------------------
# the BiLSTM head learns
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["classify", "tag", "qa"])
def test_bilstm_head_loss_falls(bert_encoder: Path, tokenizer: BertTokenizer, family: str, tmp_path: Path) -> None:
    from bertforge.model.auto import load_for_job

    task = make_task(family, family, _files(family, tmp_path))
    examples = task.read(None, "train")
    labels = task.label_names(examples)
    features = task.featurize(examples, tokenizer, MAX_LENGTH[family],
                              label_names=labels if isinstance(labels, list) else None)
    record = TaskHead(task.job, head="bilstm")
    torch.manual_seed(0)
    model = load_for_job(bert_encoder, task.job, **(label_maps(labels) if labels else {}),
                         **task.config_overrides(), **{TASK_HEAD_KEY: record.to_dict()})
    assert model.task_head.bilstm is not None
    (everything,) = list(TaskBatches(features, len(features), pad_id=tokenizer.pad_token_id))

    def loss() -> float:
        model.eval()
        with torch.no_grad():
            return float(model(**everything).loss)

    first = loss()
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(10):  # epochs over the fixture
        for batch in TaskBatches(features, 4, pad_id=tokenizer.pad_token_id):
            model.train()
            optimiser.zero_grad()
            model(**batch).loss.backward()
            optimiser.step()
    assert loss() < 0.5 * first, (first, loss())


# ------------------------------------------------------------------------------------------------
# a fine-tuned directory predicts what the model did right after training
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family, frozen, layers", [
    ("classify", True, "concat_last_four"),
    ("tag", False, "last"),
    ("qa", True, "second_to_last"),
])
def test_finetuned_directory_predicts_through_the_pipeline(bert_encoder: Path, family: str, frozen: bool,
                                                           layers: str, tmp_path: Path) -> None:
    from bertforge import pipeline

    out = tmp_path / "run"
    files = _files(family, tmp_path)
    finetune(family, None, bert_encoder, None, out, epochs=1, lr=1e-3, max_length=MAX_LENGTH[family],
             frozen=frozen, frozen_layers=layers, head="bilstm", task_settings=files, **QUIET)
    seed = out / "seed-1"
    assert any(k.startswith("task_head.bilstm.") for k in load_file(str(seed / "model.safetensors")))
    pipe = pipeline(seed)
    assert isinstance(pipe.model, TaskHeadModel) and pipe.model.spec.head == "bilstm"
    task = make_task(family, family, files)
    dev = task.read(None, "dev")
    if family == "classify":  # predictions-dev.jsonl: the label and score of the model right after training
        written = [json.loads(line) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
        got = pipe([e.text for e in dev])
        assert [g["label"] for g in got] == [w["label"] for w in written]
        assert [g["score"] for g in got] == pytest.approx([w["score"] for w in written], abs=1e-6)
    elif family == "tag":
        written = [json.loads(line) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
        prepared = pipe.prepare([" ".join(e.words) for e in dev])
        got = pipe.finish(prepared, pipe.run(prepared.features))  # with each word's tag and score
        # sentences the pipeline splits into the file's words (it splits "1996-08-22" further)
        same = [(g, w) for g, w, e in zip(got, written, dev, strict=True) if [x["word"] for x in g["words"]] == e.words]
        assert len(same) >= 2
        for result, row in same:
            assert [x["score"] for x in result["words"]] == pytest.approx(row["scores"], abs=1e-5)
    else:
        written = json.loads((seed / "predictions-dev.json").read_text())
        got = pipe([{"question": e.question, "context": e.context} for e in dev])
        assert {e.id: g["answer"] for e, g in zip(dev, got, strict=True)} == written


def test_transformers_loads_the_encoder_of_a_bilstm_directory(bert_encoder: Path, tmp_path: Path) -> None:
    """transformers cannot know the BiLSTM: `architectures` names bertforge's class, which transformers does
    not have (no loader takes the directory for the family's own classifier); its AutoModel loads the
    encoder, whose weights are the ones trained here."""
    transformers = pytest.importorskip("transformers")

    out = tmp_path / "run"
    finetune("classify", None, bert_encoder, None, out, epochs=1, max_length=24, head="bilstm",
             task_settings=_files("classify", tmp_path), **QUIET)
    seed = out / "seed-1"
    config = json.loads((seed / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassificationWithTaskHead"]
    assert not hasattr(transformers, config["architectures"][0])
    assert "transformers loads this directory's encoder but not this head" in config[TASK_HEAD_KEY]["note"]
    theirs = transformers.BertModel.from_pretrained(seed, add_pooling_layer=False)
    ours = _encoder_tensors(seed)
    for key, tensor in theirs.state_dict().items():
        if key in ours:
            assert torch.equal(tensor, ours[key]), key


# ------------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------------
def test_bad_settings_fail_in_one_line(bert_encoder: Path, tmp_path: Path) -> None:
    files = _files("classify", tmp_path)
    cases = [
        ({"frozen": True, "frozen_layers": "middle"}, "unknown layer choice 'middle'; choose one of last,"),
        ({"head": "gru"}, "unknown head 'gru'; choose one of linear, bilstm"),
        ({"frozen_layers": "sum_all"}, "frozen_layers sum_all goes with --frozen or --head bilstm"),
        ({"lstm_size": 8}, "lstm_size 8: a positive size, for --head bilstm only"),
        ({"frozen": True, "reinit_layers": 1}, "reinit_layers with --frozen"),
    ]
    for settings, message in cases:
        with pytest.raises(ValueError) as caught:
            finetune("classify", None, bert_encoder, None, tmp_path / "bad", task_settings=files, **QUIET, **settings)
        assert message in str(caught.value) and "\n" not in str(caught.value)

    from bertforge.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "classify", "--train", files["train"], "--dev", files["dev"],
                                 "--model", str(bert_encoder), "--out", str(tmp_path / "cli"), "--frozen",
                                 "--frozen-layers", "top"])
    assert result.exit_code == 2
    assert "unknown layer choice 'top'" in result.output
    result = runner.invoke(app, ["finetune", "glue", "--task", "SST-2", "--data", str(TASKS / "glue"),
                                 "--model", str(bert_encoder), "--out", str(tmp_path / "cli2"), "--head", "crf"])
    assert result.exit_code == 2 and "unknown head 'crf'" in result.output


def test_a_layer_choice_the_model_is_too_shallow_for(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    from bertforge import BertConfig, BertModel

    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    BertModel(config).save_pretrained(tmp_path / "two-layers", tokenizer=tokenizer)
    with pytest.raises(ValueError, match="concat_last_four needs at least 4 layers; this model has 2"):
        finetune("classify", None, tmp_path / "two-layers", None, tmp_path / "run", frozen=True, max_length=24,
                 frozen_layers="concat_last_four", task_settings=_files("classify", tmp_path), **QUIET)


def test_a_saved_task_head_record_is_checked(bert_encoder: Path, tmp_path: Path) -> None:
    """A config.json whose task_head is damaged is refused by name, not loaded as some other head."""
    from bertforge.model.auto import load_any

    directory = tmp_path / "copy"
    shutil.copytree(bert_encoder, directory)
    config = json.loads((directory / "config.json").read_text())
    config[TASK_HEAD_KEY] = {"job": "sequence-classification", "head": "transformer"}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: task_head: unknown head 'transformer'"):
        registry.model_class("bert", "sequence-classification").from_pretrained(directory)
    # the bare encoder still loads from it (it has no such head), and forgets the record
    encoder, _ = load_any(directory)
    assert TASK_HEAD_KEY not in encoder.config.extra


# ------------------------------------------------------------------------------------------------
# what sentence heads read
# ------------------------------------------------------------------------------------------------
def test_bilstm_final_states_are_the_ends_of_the_real_tokens(bert_encoder: Path) -> None:
    """The classification BiLSTM reads its forward state at each row's last real token and its backward
    state at the first; the backward LSTM starts at the last real token, so a padded row gives what it
    gives alone."""
    from bertforge.model.auto import load_for_job

    record = TaskHead("sequence-classification", head="bilstm", lstm_size=6)
    model = load_for_job(bert_encoder, "sequence-classification", **label_maps(2), **{TASK_HEAD_KEY: record.to_dict()})
    model.eval()
    vectors = torch.randn(2, 5, model.config.hidden_size)  # (B, T, H)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        tokens, final = model.task_head.bilstm(vectors, mask)  # (B, T, 12), (B, 12)
        alone, alone_final = model.task_head.bilstm(vectors[1:, :3], mask[1:, :3])
        # the backward direction is the right-to-left LSTM over the row reversed
        backward, _ = model.task_head.bilstm.right_to_left(vectors[1:, :3].flip(1))
    assert torch.equal(final[0, :6], tokens[0, 4, :6]) and torch.equal(final[0, 6:], tokens[0, 0, 6:])
    assert torch.equal(final[1, :6], tokens[1, 2, :6]) and torch.equal(final[1, 6:], tokens[1, 0, 6:])
    torch.testing.assert_close(final[1:], alone_final)
    torch.testing.assert_close(tokens[1:, :3], alone)
    torch.testing.assert_close(tokens[1:, :3, 6:], backward.flip(1))
    assert not tokens[1, 3:].any()  # nothing at padding


def test_a_causal_encoders_sentence_head_reads_the_last_real_token(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    """A left-to-right encoder's first token has seen only itself: the linear sentence head reads the last
    real token instead, as the family's own sentence heads do for such a model."""
    from bertforge import BertConfig, BertModel
    from bertforge.model.auto import load_for_job

    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, is_decoder=True)
    BertModel(config).save_pretrained(tmp_path / "ltr", tokenizer=tokenizer)
    record = TaskHead("sequence-classification", frozen=True)
    model = load_for_job(tmp_path / "ltr", "sequence-classification", **label_maps(2),
                         **{TASK_HEAD_KEY: record.to_dict()}).eval()
    ids = torch.tensor([[2, 7, 8, 9, 3], [2, 7, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        logits = model(ids, mask).logits
        vectors = model.base_model(ids, mask).last_hidden_state  # (2, 5, H)
    torch.testing.assert_close(logits, model.task_head.output(torch.stack([vectors[0, 4], vectors[1, 2]])))


@pytest.mark.slow
def test_onnx_export_of_generic_heads(bert_encoder: Path, tmp_path: Path) -> None:
    """A frozen linear head and a sentence BiLSTM export with dynamic lengths and agree with PyTorch; a
    BiLSTM over every position is refused in words (the exporter would fix the input length)."""
    pytest.importorskip("onnxruntime")
    from bertforge.export import export_onnx
    from bertforge.model.auto import load_for_job

    for job, head, layers in (("token-classification", "linear", "concat_last_four"),
                              ("sequence-classification", "bilstm", "last")):
        record = TaskHead(job, head=head, frozen=True, layers=layers)
        model = load_for_job(bert_encoder, job, **label_maps(3), **{TASK_HEAD_KEY: record.to_dict()})
        result = export_onnx(model, tmp_path / f"{job}.onnx")
        assert result.max_abs_diff < 1e-4 and result.checked_shapes == [(1, 7), (3, 23)]
    record = TaskHead("question-answering", head="bilstm")
    model = load_for_job(bert_encoder, "question-answering", **{TASK_HEAD_KEY: record.to_dict()})
    with pytest.raises(Exception) as caught:
        export_onnx(model, tmp_path / "qa.onnx")
    chain, error = [], caught.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("BiLSTM head over every position (tagging, QA) does not export to ONNX" in m for m in chain)


def test_head_settings_are_recorded_only_when_used() -> None:
    """At their defaults the head settings stay out of the recorded settings (run directories made before
    they existed still continue); chosen, they are part of what a rerun is compared against."""
    from bertforge.finetune import FinetuneRecipe, hyperparameters
    from bertforge.recipe import override

    plain = hyperparameters(FinetuneRecipe(family="classify"))
    assert not {"frozen", "frozen_layers", "head", "lstm_size"} & set(plain)
    chosen = hyperparameters(override(FinetuneRecipe(family="classify"),
                                      {"frozen": True, "frozen_layers": "sum_all", "head": "bilstm"}))
    assert (chosen["frozen"], chosen["frozen_layers"], chosen["head"]) == (True, "sum_all", "bilstm")
    assert "lstm_size" not in chosen


def test_mean_pooling_reads_the_average_of_the_real_tokens(bert_encoder: Path, tokenizer: BertTokenizer) -> None:
    """`pooling mean`: the sentence head's vector is the mean of the real tokens' final vectors, so a
    padded row scores what it scores alone."""
    from bertforge.model.auto import load_for_job

    record = TaskHead("sequence-classification", pooling="mean")
    model = load_for_job(bert_encoder, "sequence-classification", **label_maps(2), **{TASK_HEAD_KEY: record.to_dict()})
    model.eval()
    encoded = tokenizer.encode_batch(["the best film i have seen this year .", "dull ."], padding=True,
                                     return_tensors="pt")
    batch = {key: encoded[key] for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        logits = model(**batch).logits  # (2, 2)
        vectors = model.base_model(batch["input_ids"], batch["attention_mask"]).last_hidden_state  # (2, T, H)
        real = batch["attention_mask"].bool()
        expected = torch.stack([vectors[row][real[row]].mean(0) for row in range(2)])  # (2, H)
        alone = tokenizer.encode_batch(["dull ."], return_tensors="pt")
        alone_logits = model(alone["input_ids"], alone["attention_mask"]).logits
    torch.testing.assert_close(logits, model.task_head.output(expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1:], alone_logits, atol=1e-5, rtol=1e-5)
    assert "mean pooling" in record.describe()

    unit = TaskHead("sequence-classification", pooling="mean", normalize=True)
    normalised = load_for_job(bert_encoder, "sequence-classification", **label_maps(2), **{TASK_HEAD_KEY: unit.to_dict()})
    normalised.load_state_dict(model.state_dict())
    with torch.no_grad():
        unit_logits = normalised.eval()(**batch).logits
    torch.testing.assert_close(unit_logits, model.task_head.output(torch.nn.functional.normalize(expected, dim=-1)),
                               atol=1e-5, rtol=1e-5)
    assert TaskHead.from_dict(unit.to_dict()) == unit and "unit length" in unit.describe()
    with pytest.raises(ValueError, match="normalize goes with mean pooling"):
        TaskHead("sequence-classification", normalize=True)


def test_finetune_with_mean_pooling_saves_and_predicts_it(bert_encoder: Path, tmp_path: Path) -> None:
    from bertforge import pipeline

    files = _files("classify", tmp_path)
    out = tmp_path / "run"
    finetune("classify", None, bert_encoder, None, out, epochs=1, lr=1e-3, max_length=32, pooling="mean",
             task_settings=files, **QUIET)
    seed = out / "seed-1"
    saved = json.loads((seed / "config.json").read_text())[TASK_HEAD_KEY]
    assert saved["pooling"] == "mean" and saved["head"] == "linear"
    pipe = pipeline(seed)
    assert isinstance(pipe.model, TaskHeadModel) and pipe.model.spec.pooling == "mean"
    written = [json.loads(line) for line in (seed / "predictions-dev.jsonl").read_text().splitlines()]
    got = pipe([e.text for e in make_task("classify", "classify", files).read(None, "dev")])
    assert [g["score"] for g in got] == pytest.approx([w["score"] for w in written], abs=1e-6)

    for settings, message in [({"pooling": "max"}, "unknown pooling 'max'; choose one of cls, mean"),
                              ({"pooling": "mean", "head": "bilstm"}, "pooling mean goes with the linear head")]:
        with pytest.raises(ValueError) as caught:
            finetune("classify", None, bert_encoder, None, tmp_path / "bad", task_settings=files, **QUIET, **settings)
        assert message in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="pooling mean is for sentence jobs"):
        TaskHead("token-classification", pooling="mean")
