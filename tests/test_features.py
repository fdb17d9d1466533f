"""Feature extraction: layer strategies, word alignment, padding-aware pooling, the files, the frozen NER tagger."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.features import (
    STRATEGIES,
    FeatureExtractor,
    FeatureFile,
    LayerSelection,
    align_words,
    index_path,
    pool,
    resolve_layers,
    token_word_ids,
    write_features,
)

WORDS = ["the", "cat", "sat", "on", "mat", "un", "##aff", "##able", "u", "s", "don", "t", "'", ".", ",", "-",
         "new", "york", "a", "b"]



@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    return BertTokenizer({t: i for i, t in enumerate(specials + WORDS)})


@pytest.fixture(scope="module")
def model(tokenizer: BertTokenizer) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=5, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    return BertModel(config).eval()


def reference(model: BertModel, tokenizer: BertTokenizer, text: str) -> tuple[list[str], tuple[torch.Tensor, ...]]:
    """One text alone (no padding): its tokens and the model's L + 1 hidden states (T, H)."""
    encoding = tokenizer.encode(text)
    with torch.no_grad():
        out = model(torch.tensor([encoding.input_ids]), output_hidden_states=True)
    return encoding.tokens, tuple(h[0] for h in out.hidden_states)


# ------------------------------------------------------------------------------------------------ strategies
def test_strategies_map_to_hidden_state_indices():
    assert resolve_layers(5, "embeddings").layers == (0,)
    assert resolve_layers(5, "last").layers == (5,)
    assert resolve_layers(5, "second_to_last").layers == (4,)
    assert resolve_layers(5, "sum_last_four") == LayerSelection((2, 3, 4, 5), "sum", "sum_last_four")
    assert resolve_layers(5, "concat_last_four").combine == "concat"
    assert resolve_layers(5, "sum_all").layers == (1, 2, 3, 4, 5)  # the Transformer layers, not the embeddings
    assert resolve_layers(12, "sum_last_four").layers == (9, 10, 11, 12)  # BERT-base: layers 9-12
    assert resolve_layers(5, layers=[-1, -2, 0]).layers == (5, 4, 0)
    for bad in ({"strategy": "nope"}, {"layers": [6]}, {"layers": [-7]}, {"strategy": "last", "layers": [1]},
                {"layers": []}, {"layers": [1], "combine": "product"}):
        with pytest.raises(ValueError):
            resolve_layers(5, **bad)
    with pytest.raises(ValueError, match="at least 4"):
        resolve_layers(3, "sum_last_four")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_token_features_equal_the_models_hidden_states(model, tokenizer, strategy):
    """Per-token features of every strategy are exactly the chosen hidden states, combined as named."""
    texts = ["the cat sat on the mat", "unaffable", "a b a b a b a b a b new york"]
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, strategy), align=None, batch_size=2)
    items = list(extractor.extract(texts))
    assert [item.index for item in items] == [0, 1, 2]
    for text, item in zip(texts, items, strict=True):
        tokens, hidden = reference(model, tokenizer, text)
        assert item.units == tokens
        expected = {
            "embeddings": hidden[0], "last": hidden[5], "second_to_last": hidden[4],
            "sum_last_four": hidden[2] + hidden[3] + hidden[4] + hidden[5],
            "concat_last_four": torch.cat([hidden[2], hidden[3], hidden[4], hidden[5]], dim=-1),
            "sum_all": sum(hidden[1:]),
        }[strategy]
        np.testing.assert_allclose(item.values, expected.numpy(), atol=1e-5, rtol=1e-5)


def test_explicit_layers_kept_apart(model, tokenizer):
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, layers=[-1, 0]), align=None)
    (item,) = extractor.extract(["the cat"])
    _, hidden = reference(model, tokenizer, "the cat")
    assert item.values.shape == (4, 2, 16)  # (T, K, H)
    np.testing.assert_allclose(item.values[:, 0], hidden[5].numpy(), atol=1e-5)
    np.testing.assert_allclose(item.values[:, 1], hidden[0].numpy(), atol=1e-5)


# ------------------------------------------------------------------------------------------------ words
def test_token_word_ids_follow_whitespace_words(tokenizer):
    """Words the pre-tokeniser splits ("u.s.", "don't", "new-york") stay one word."""
    text = "the u.s. don't  unaffable new-york"
    encoding = tokenizer.encode(text)
    ids = token_word_ids(encoding, [text])
    pieces = [(t, w) for t, w in zip(encoding.tokens, ids, strict=True)]
    assert pieces == [("[CLS]", None), ("the", 0), ("u", 1), (".", 1), ("s", 1), (".", 1), ("don", 2), ("'", 2),
                      ("t", 2), ("un", 3), ("##aff", 3), ("##able", 3), ("new", 4), ("-", 4), ("york", 4),
                      ("[SEP]", None)]
    pair = tokenizer.encode("the cat", "sat on")
    assert token_word_ids(pair, ["the cat", "sat on"]) == [None, 0, 1, None, 2, 3, None]


@pytest.mark.parametrize("mode", ["first", "mean"])
def test_word_alignment_of_multi_piece_words(model, tokenizer, mode):
    words = ["the", "unaffable", "u.s.", "cat"]
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, "last"), align=mode)
    (item,) = extractor.extract([words])
    assert item.units == words
    tokens, hidden = reference(model, tokenizer, " ".join(words))
    assert tokens == ["[CLS]", "the", "un", "##aff", "##able", "u", ".", "s", ".", "cat", "[SEP]"]
    last = hidden[5]
    spans = [[1], [2, 3, 4], [5, 6, 7, 8], [9]]  # the token positions of each word
    expected = torch.stack([last[s[0]] if mode == "first" else last[s].mean(0) for s in spans])
    np.testing.assert_allclose(item.values, expected.numpy(), atol=1e-5)


def test_align_words_gives_zeros_to_a_word_without_pieces():
    hidden = torch.arange(12.0).reshape(4, 3)
    out = align_words(hidden, [None, 0, 0, None], num_words=2, mode="mean")
    assert out.tolist() == [[4.5, 5.5, 6.5], [0.0, 0.0, 0.0]]
    assert align_words(hidden, [None, 1, 0, 1], 2, "first").tolist() == [[6.0, 7.0, 8.0], [3.0, 4.0, 5.0]]


def test_truncation_keeps_one_row_per_word(model, tokenizer):
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, "last"), max_length=5)
    (item,) = extractor.extract(["the cat sat on the mat"])
    assert item.truncated and item.values.shape == (6, 16)
    assert np.all(item.values[3:] == 0) and not np.all(item.values[2] == 0)  # 3 words fit between the specials


# ------------------------------------------------------------------------------------------------ pooling
@pytest.mark.parametrize("mode", ["cls", "mean", "max"])
def test_pooling_ignores_padding(model, tokenizer, mode):
    """A text pooled inside a padded batch equals the same text pooled alone."""
    texts = ["the cat sat on the mat , the cat", "a b"]  # the second is padded by 8 tokens
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, "sum_all"), pool=mode, batch_size=2)
    batched = [item.values for item in extractor.extract(texts)]
    alone = FeatureExtractor(model, tokenizer, resolve_layers(5, "sum_all"), pool=mode, batch_size=1)
    for text, value in zip(texts, batched, strict=True):
        (single,) = alone.extract([text])
        np.testing.assert_allclose(value, single.values, atol=1e-5)
        _, hidden = reference(model, tokenizer, text)
        tokens = sum(hidden[1:])
        expected = {"cls": tokens[0], "mean": tokens.mean(0), "max": tokens.max(0).values}[mode]
        np.testing.assert_allclose(value, expected.numpy(), atol=1e-5)


def test_pool_function_on_garbage_padding():
    hidden = torch.tensor([[[1.0], [3.0], [1e6]], [[-2.0], [-4.0], [-1e6]]])  # (B=2, T=3, H=1); position 2 padded
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0], [-3.0]]
    assert pool(hidden, mask, "max").tolist() == [[3.0], [-2.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0], [-2.0]]


# ------------------------------------------------------------------------------------------------ files
@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_matrix_files_and_their_index(model, tokenizer, tmp_path, suffix):
    texts = ["the cat sat", "unaffable u.s.", "a"]
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, "concat_last_four"), batch_size=2,
                                 dtype="float16")
    out = tmp_path / f"words{suffix}"
    summary = write_features(extractor, texts, out)
    assert summary["rows"] == 6 and summary["row_shape"] == [64] and summary["unit"] == "word"
    features = FeatureFile(out)
    assert len(features) == 3
    expected = list(FeatureExtractor(model, tokenizer, resolve_layers(5, "concat_last_four")).extract(texts))
    for i, item in enumerate(expected):
        words, values = features[i]
        assert words == item.units and values.dtype == np.float16
        np.testing.assert_allclose(values.astype(np.float32), item.values, atol=2e-3, rtol=2e-3)
    index = json.loads(index_path(out).read_text())
    assert [(e["start"], e["end"]) for e in index["items"]] == [(0, 3), (3, 5), (5, 6)]
    assert [e["row"] for e in index["items"]] == [1, 2, 3]  # numbered from 1, as predict numbers its rows
    if suffix == ".safetensors":
        from safetensors.numpy import load_file

        tensors = load_file(out)
        assert tensors["offsets"].tolist() == [0, 3, 5, 6] and tensors["features"].shape == (6, 64)
    else:
        assert np.load(out).shape == (6, 64)
    assert not list(tmp_path.glob("*.part"))


def test_jsonl_like_googles_extract_features(model, tokenizer, tmp_path):
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, layers=[-1, -2]), align=None)
    write_features(extractor, ["the cat", ("a", "b")], tmp_path / "f.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert [line["linex_index"] for line in lines] == [0, 1]
    first = lines[0]["features"]
    assert [f["token"] for f in first] == ["[CLS]", "the", "cat", "[SEP]"]
    assert [layer["index"] for layer in first[1]["layers"]] == [5, 4]
    _, hidden = reference(model, tokenizer, "the cat")
    np.testing.assert_allclose(first[1]["layers"][0]["values"], hidden[5][1].numpy(), atol=1e-5)
    assert [f["token"] for f in lines[1]["features"]] == ["[CLS]", "a", "[SEP]", "b", "[SEP]"]

    pooled = FeatureExtractor(model, tokenizer, resolve_layers(5, "sum_last_four"), pool="mean")
    write_features(pooled, ["the cat"], tmp_path / "p.jsonl")
    record = json.loads((tmp_path / "p.jsonl").read_text())
    assert record["pooled"] == "mean" and record["layers"][0]["index"] == [2, 3, 4, 5]
    assert len(record["layers"][0]["values"]) == 16


def test_bad_output_suffix(model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="must end in"):
        write_features(FeatureExtractor(model, tokenizer, resolve_layers(5, "last")), ["a"], tmp_path / "x.csv")


# ------------------------------------------------------------------------------------------------ frozen NER
def test_frozen_ner_tagger_trains_with_the_shared_loop(model, tokenizer, tmp_path):
    """Tiny end-to-end run: cache every layer, train the BiLSTM on one strategy, score with conlleval."""
    from bertforge.ablation import FrozenNerConfig, cache_features, train_frozen_ner
    from bertforge.tasks.ner import NerSentence

    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir, tokenizer=tokenizer)
    rows = [(["the", "cat", "sat", "on", "new", "york"], ["O", "B-PER", "O", "O", "B-LOC", "I-LOC"]),
            (["a", "cat", "sat"], ["O", "B-PER", "O"]), (["new", "york", "sat"], ["B-LOC", "I-LOC", "O"])]
    sentences = [NerSentence(f"s-{i}", w, t, [], [], 0) for i, (w, t) in enumerate(rows * 4)]
    cache = cache_features(model_dir, sentences, tmp_path / "cache.npy", progress=False)
    assert cache.matrix.shape == (sum(len(s.words) for s in sentences), 6, 16)
    assert cache_features(model_dir, sentences, tmp_path / "cache.npy", progress=False).matrix.shape == cache.matrix.shape
    config = FrozenNerConfig(epochs=25, batch_size=4, lr=1e-2, lstm_size=16, dropout=0.0, progress=False)
    result = train_frozen_ner(cache, sentences, cache, sentences, "concat_last_four", tmp_path / "run", config)
    assert result["layers"] == [2, 3, 4, 5] and result["input_size"] == 64
    assert result["steps"] == 25 * 3
    assert result["dev_f1"] > 0.9  # memorises 3 sentences
    assert json.loads((tmp_path / "run" / "result.json").read_text())["dev_f1"] == result["dev_f1"]


def test_word_features_pick_the_pieces_the_ner_task_labels(model, tokenizer):
    """The frozen tagger's word vectors are the hidden states at the pieces `Ner.featurize` puts labels on."""
    from bertforge.tasks.ner import Ner, NerSentence

    words = [["the", "u.s.", "don't", "cat"], ["unaffable", "new-york", ",", "a"]]
    sentences = [NerSentence(f"s-{i}", w, ["O"] * len(w), [], [], 0) for i, w in enumerate(words)]
    extractor = FeatureExtractor(model, tokenizer, resolve_layers(5, "sum_last_four"), align="first")
    ours = [item.values for item in extractor.extract([s.words for s in sentences])]
    for feature in Ner().featurize(sentences, tokenizer, 64):
        with torch.no_grad():
            hidden = model(torch.tensor([feature.inputs["input_ids"]]), output_hidden_states=True).hidden_states
        summed = sum(hidden[2:])[0]  # (T, H)
        np.testing.assert_allclose(ours[feature.example], summed[feature.meta.token_of_word].numpy(), atol=1e-5)


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_extract_and_ablate_features(model, tokenizer, tmp_path):
    from typer.testing import CliRunner

    from bertforge.cli import app

    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir, tokenizer=tokenizer)
    (tmp_path / "in.txt").write_text("the cat sat\nunaffable u.s. ||| a b\n\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["extract", "--model", str(model_dir), "--input", str(tmp_path / "in.txt"),
                                 "--strategy", "sum_all", "--out", str(tmp_path / "f.npy"), "--quiet"])
    assert result.exit_code == 0, result.output
    features = FeatureFile(tmp_path / "f.npy")
    assert len(features) == 3 and features[1][0] == ["unaffable", "u.s.", "|||", "a", "b"] and features[2][0] == []
    result = runner.invoke(app, ["extract", "--model", str(model_dir), "--input", str(tmp_path / "in.txt"), "--pairs",
                                 "--layers=-1,0", "--combine", "concat", "--pool", "max",
                                 "--out", str(tmp_path / "f.safetensors"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert FeatureFile(tmp_path / "f.safetensors").matrix.shape == (3, 32)
    bad = runner.invoke(app, ["extract", "--model", str(model_dir), "--input", str(tmp_path / "in.txt"),
                              "--strategy", "middle", "--out", str(tmp_path / "x.npy")])
    assert bad.exit_code == 2 and "strategy 'middle'" in bad.output

    data = tmp_path / "conll"
    data.mkdir()
    rows = ["the X X O", "cat X X I-PER", "sat X X O", "", "new X X I-LOC", "york X X I-LOC", "a X X O", ""]
    (data / "eng.train").write_text("\n".join(rows * 3) + "\n", encoding="utf-8")
    (data / "eng.testa").write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = runner.invoke(app, ["ablate-features", "--model", str(model_dir), "--data", str(data),
                                 "--out", str(tmp_path / "ablation"), "--strategy", "last", "--strategy", "sum_all",
                                 "--epochs", "2", "--lstm-size", "8", "--threads", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    table = (tmp_path / "ablation" / "ablation.md").read_text()
    assert "| last | Last hidden | 5 | 94.9 |" in table
    assert "| sum_all | Weighted sum all 12 layers | 1-5 (sum) | 95.5 |" in table
    assert "| finetune_all | Fine-tune all | all, fine-tuned | 96.4 | not run |" in table
    assert (tmp_path / "ablation" / "ablation.png").read_bytes().startswith(b"\x89PNG")


def test_cli_finetune_ner_frozen(model, tokenizer, tmp_path):
    """`finetune ner --frozen --strategy S`: the feature-based set-up through the fine-tuning command."""
    from typer.testing import CliRunner

    from bertforge.cli import app

    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir, tokenizer=tokenizer)
    data = tmp_path / "conll"
    data.mkdir()
    rows = ["the X X O", "cat X X I-PER", "sat X X O", "", "new X X I-LOC", "york X X I-LOC", "a X X O", ""]
    (data / "eng.train").write_text("\n".join(rows * 3) + "\n", encoding="utf-8")
    (data / "eng.testa").write_text("\n".join(rows) + "\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "ner", "--frozen", "--strategy", "second_to_last", "--model",
                                 str(model_dir), "--data", str(data), "--out", str(tmp_path / "frozen")])
    assert result.exit_code == 0, result.output
    assert "second_to_last: hidden states [4]" in result.output and "dev F1" in result.output
    assert (tmp_path / "frozen" / "runs" / "second_to_last" / "result.json").exists()
    bad = runner.invoke(app, ["finetune", "ner", "--frozen", "--strategy", "middle", "--model", str(model_dir),
                              "--data", str(data), "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "middle" in bad.output
