"""A ModernBERT checkpoint with a byte-level BPE tokenizer.json through every fine-tuning family and `predict`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

from bertforge.finetune import finetune, predict  # noqa: E402
from bertforge.model import (  # noqa: E402
    BertForMaskedLM,
    ModernBertConfig,  # noqa: E402
    ModernBertModel,
)
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.tokenizer import BertTokenizer  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
SPECIALS = {"unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
            "mask_token": "[MASK]"}


def training_text() -> list[str]:
    """Words of every task fixture, so that the small BPE vocabulary covers them in a few pieces."""
    texts = []
    for path in sorted(FIXTURES.rglob("*")):
        if path.is_file():
            texts += path.read_text(encoding="utf-8").splitlines()
    return texts


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json laid out as ModernBERT's: [CLS] A [SEP] (B [SEP])."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(SPECIALS.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(training_text(), trainer)
    ids = backend.get_vocab()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    directory = tmp_path_factory.mktemp("bpe")
    backend.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, **SPECIALS}
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def modern_dir(tmp_path_factory: pytest.TempPathFactory, bpe_dir: Path) -> Path:
    """A random modern encoder (a window of 8 tokens, shorter than the inputs) with the BPE tokenizer."""
    torch.manual_seed(0)
    tokenizer = BertTokenizer.from_pretrained(bpe_dir)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                              hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                              local_attention=8, max_position_embeddings=1024)
    directory = tmp_path_factory.mktemp("modern")
    ModernBertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def test_tokenizer_json_encodes_as_transformers_does(bpe_dir: Path, tmp_path: Path) -> None:
    ours = BertTokenizer.from_pretrained(bpe_dir)
    theirs = transformers.AutoTokenizer.from_pretrained(bpe_dir)
    texts = [("the normans gave their name", "zurich is a city"), ("a gripping film", None), ("Ünïcode ✓", None)]
    for text, pair in texts:
        encoded = ours.encode(text, pair)
        reference = theirs(text, pair)
        assert encoded.input_ids == reference["input_ids"]
        assert encoded.sequence_ids == reference.sequence_ids()
        assert encoded.word_ids[0] is None and encoded.tokens[0] == "[CLS]"
    assert ours.decode(ours.encode("the normans gave").input_ids) == "the normans gave"
    cut = ours.encode("the normans gave their name", "zurich is a city", max_length=8, truncation=True)
    assert len(cut) == 8 and cut.tokens.count("[SEP]") == 2  # BERT's pair truncation, specials kept
    ours.save_pretrained(tmp_path)
    assert not (tmp_path / "vocab.txt").exists()
    assert BertTokenizer.from_pretrained(tmp_path).encode("a film", "b").input_ids == ours.encode("a film", "b").input_ids


def test_glue_and_predict_with_a_tokenizer_json_checkpoint(modern_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "mrpc"
    results = finetune("glue", "MRPC", modern_dir, FIXTURES / "glue", out, epochs=2, batch_size=2,
                       progress=False, verbose=False)
    assert results["summary"].keys() == {"accuracy", "f1"}
    seed_dir = out / "seed-1"
    config = json.loads((seed_dir / "config.json").read_text())
    assert config["model_type"] == "modernbert"
    assert config["architectures"] == ["ModernBertForSequenceClassification"]
    assert (seed_dir / "tokenizer.json").exists() and not (seed_dir / "vocab.txt").exists()
    reloaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(seed_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    done = predict("glue", "MRPC", seed_dir, FIXTURES / "glue", tmp_path / "submission", splits=["dev"])
    assert done["dev"]["metrics"]["accuracy"] == results["seeds"][0]["metrics"]["accuracy"]
    with TestClient(create_app(seed_dir)) as client:
        result = client.post("/classify", json={"text": "a gripping film", "text_pair": "a bad one"}).json()
        assert result["label"] in ("not_equivalent", "equivalent") and len(result["scores"]) == 2
        embedded = client.post("/embed", json={"text": "the normans"}).json()
        assert embedded["dim"] == 32 and embedded["pooling"] == "mean"
        assert client.post("/embed", json={"text": "x", "pooling": "pooler"}).status_code == 422
        assert client.post("/attention", json={"text": "x"}).status_code != 200


def test_fill_mask_service_with_a_tokenizer_json_checkpoint(modern_dir: Path, tmp_path: Path) -> None:
    model = BertForMaskedLM.from_pretrained(modern_dir)  # the encoder, with a new MLM head
    assert type(model).__name__ == "ModernBertForMaskedLM"
    model.save_pretrained(tmp_path, tokenizer=BertTokenizer.from_pretrained(modern_dir))
    with TestClient(create_app(tmp_path)) as client:
        result = client.post("/fill-mask", json={"text": "the [MASK] gave their name", "top_k": 3}).json()
        assert len(result["masks"][0]["predictions"]) == 3, result


def test_ner_on_a_modern_model(modern_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "conll"
    data.mkdir()
    shutil.copy(FIXTURES / "conll" / "with_docstart.txt", data / "eng.train")
    shutil.copy(FIXTURES / "conll" / "without_docstart.txt", data / "eng.testa")
    shutil.copy(FIXTURES / "conll" / "without_docstart.txt", data / "eng.testb")
    results = finetune("ner", "conll2003", modern_dir, data, tmp_path / "ner", epochs=1, batch_size=2,
                       max_length=16, progress=False, verbose=False)
    assert set(results["summary"]) == {"precision", "recall", "f1", "accuracy"}
    seed_dir = tmp_path / "ner" / "seed-1"
    assert json.loads((seed_dir / "config.json").read_text())["architectures"] == ["ModernBertForTokenClassification"]
    done = predict("ner", "conll2003", seed_dir, data, tmp_path / "out")
    assert done["test"]["metrics"].keys() == {"precision", "recall", "f1", "accuracy"}


def test_squad_on_a_modern_model(modern_dir: Path, tmp_path: Path) -> None:
    results = finetune("squad", "squad", modern_dir, FIXTURES / "squad" / "v1.json", tmp_path / "v1",
                       epochs=1, batch_size=4, max_length=48, task_settings={"doc_stride": 8},
                       progress=False, verbose=False)
    assert set(results["summary"]) == {"exact_match", "f1"}
    seed_dir = tmp_path / "v1" / "seed-1"
    assert json.loads((seed_dir / "config.json").read_text())["architectures"] == ["ModernBertForQuestionAnswering"]
    predict("squad", "squad", seed_dir, FIXTURES / "squad" / "v1.json", tmp_path / "pred")
    answers = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    context = json.loads((FIXTURES / "squad" / "v1.json").read_text())["data"][0]["paragraphs"][0]["context"]
    assert set(answers) == {"q1", "q2", "q3"} and answers["q1"].strip() in context


def test_swag_on_a_modern_model(modern_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "swag"
    data.mkdir()
    shutil.copy(FIXTURES / "swag" / "sample.jsonl", data / "train.jsonl")
    shutil.copy(FIXTURES / "swag" / "train.csv", data / "val.csv")
    shutil.copy(FIXTURES / "swag" / "test.csv", data / "test.csv")
    results = finetune("swag", "swag", modern_dir, data, tmp_path / "swag-run", epochs=1, batch_size=2,
                       progress=False, verbose=False)
    assert set(results["summary"]) == {"accuracy"}
    seed_dir = tmp_path / "swag-run" / "seed-1"
    assert json.loads((seed_dir / "config.json").read_text())["architectures"] == ["ModernBertForMultipleChoice"]
    predict("swag", "swag", seed_dir, data, tmp_path / "pred")
    lines = (tmp_path / "pred" / "predictions-test.csv").read_text().splitlines()
    assert lines[0] == "id,label" and all(line.split(",")[1] in "0123" for line in lines[1:])


def test_inputs_longer_than_bert_s_512_positions_on_a_rotary_model(modern_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "glue" / "SST-2"
    data.mkdir(parents=True)
    long_review = " ".join(["a gripping , beautifully acted film with a terrible ending ."] * 60)
    rows = [f"{long_review}\t1", "a terrible film .\t0", f"{long_review} terrible\t0", "beautifully acted .\t1"]
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.from_pretrained(modern_dir)
    assert len(tokenizer.encode(long_review)) > 600
    results = finetune("glue", "SST-2", modern_dir, tmp_path / "glue", tmp_path / "sst2", epochs=1, batch_size=2,
                       max_length=1024, progress=False, verbose=False)
    seed_dir = tmp_path / "sst2" / "seed-1"
    assert json.loads((seed_dir / "task.json").read_text())["max_length"] == 1024
    assert results["summary"].keys() == {"accuracy"}
    with pytest.raises(ValueError, match=r"max_length 2048 exceeds the 1024 positions of .*config.json"):
        finetune("glue", "SST-2", modern_dir, tmp_path / "glue", tmp_path / "x", max_length=2048, verbose=False)


def test_top_layers_of_a_modern_model_can_start_afresh(modern_dir: Path) -> None:
    from bertforge.finetune import reinitialize_top_layers
    from bertforge.model import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(modern_dir)
    before = [p.clone() for p in model.backbone.layers.parameters()]
    torch.manual_seed(5)
    reinitialize_top_layers(model, 1)
    after = list(model.backbone.layers.parameters())
    changed = [not torch.equal(a, b) for a, b in zip(before, after, strict=True)]
    top = len(list(model.backbone.layers[-1].parameters()))
    assert not any(changed[:-top]) and any(changed[-top:])
    with pytest.raises(ValueError, match="distinct layers"):
        reinitialize_top_layers(model, 4)


def test_a_random_twin_of_a_modern_checkpoint(modern_dir: Path, tmp_path: Path) -> None:
    """`random_init_like` (pre-trained vs random-weights studies) keeps a modern model's family,
    config and tokenizer and draws fresh weights."""
    from safetensors.torch import load_file

    from bertforge.model import ModernBertForMaskedLM
    from bertforge.pretrain import random_init_like

    twin = random_init_like(modern_dir, tmp_path / "twin", seed=3)
    assert json.loads((twin / "config.json").read_text())["model_type"] == "modernbert"
    model = BertForMaskedLM.from_pretrained(twin)
    assert isinstance(model, ModernBertForMaskedLM)
    assert (twin / "tokenizer.json").is_file()
    original, fresh = load_file(modern_dir / "model.safetensors"), load_file(twin / "model.safetensors")
    embeddings = [k for k in original if k.endswith("tok_embeddings.weight")]
    assert len(embeddings) == 1
    name = embeddings[0]
    fresh_name = next(k for k in fresh if k.endswith("tok_embeddings.weight"))
    assert original[name].shape == fresh[fresh_name].shape
    assert not torch.equal(original[name], fresh[fresh_name])
