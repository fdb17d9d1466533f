"""Attention analysis: Clark et al.'s per-head statistics on a hand-made attention tensor, maps and plots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.analysis import (
    STATS,
    HeadStats,
    attention_maps,
    attention_stats,
    is_punctuation,
    plot_attention,
    plot_head_stats,
    token_masks,
)


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", ".", ",", "a", "b", "##s", '"']
    return BertTokenizer({t: i for i, t in enumerate(tokens)})


@pytest.fixture(scope="module")
def model(tokenizer: BertTokenizer) -> BertModel:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=32, max_position_embeddings=64)
    return BertModel(config).eval()


def hand_made() -> tuple[torch.Tensor, torch.Tensor, list[list[str]]]:
    """Two texts, "[CLS] a . [SEP]" and "[CLS] b [SEP] [PAD]", and three heads whose answers are known:
    head 0 attends to the next token (the last token to [CLS]), head 1 uniformly over the real tokens,
    head 2 to [SEP]. Padding query rows hold garbage that must not count."""
    tokens = [["[CLS]", "a", ".", "[SEP]"], ["[CLS]", "b", "[SEP]", "[PAD]"]]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    probs = torch.zeros(2, 3, 4, 4)  # (B, A, T, T)
    for b, n in enumerate((4, 3)):
        for q in range(n):
            probs[b, 0, q, q + 1 if q + 1 < n else 0] = 1.0
            probs[b, 1, q, :n] = 1.0 / n
            probs[b, 2, q, n - 1] = 1.0
    probs[1, :, 3, :] = 0.25  # the padding query: garbage
    return probs, mask, tokens


def test_head_stats_on_a_hand_made_attention_tensor(tokenizer):
    probs, mask, tokens = hand_made()
    masks = token_masks(tokens, tokenizer)
    stats = HeadStats.empty(num_layers=1, num_heads=3)
    stats.update([probs], mask, *(torch.from_numpy(masks[k]) for k in ("cls", "sep", "punct")))
    means = {k: v[0] for k, v in stats.means().items()}  # layer 1: (A,)
    # 7 real queries; 5 pairs of neighbouring real tokens
    assert stats.counts == {"cls": 7, "sep": 7, "punct": 7, "entropy": 7, "next": 5, "prev": 5}
    expected = {
        "cls": [2 / 7, 2 / 7, 0.0],
        "sep": [2 / 7, 2 / 7, 1.0],
        "punct": [1 / 7, 1 / 7, 0.0],
        "next": [1.0, (3 / 4 + 2 / 3) / 5, 2 / 5],
        "prev": [0.0, (3 / 4 + 2 / 3) / 5, 0.0],
        "entropy": [0.0, (4 * math.log(4) + 3 * math.log(3)) / 7, 0.0],
    }
    for stat in STATS:
        np.testing.assert_allclose(means[stat], expected[stat], atol=1e-12, err_msg=stat)
    assert stats.top("next", 1) == [(1, 1, 1.0)]
    table = stats.table()
    assert table.splitlines()[0] == "| layer | head | cls | sep | punct | next | prev | entropy |"
    assert "| 1 | 1 | 0.286 | 0.286 | 0.143 | 1.000 | 0.000 | 0.000 |" in table


def test_stats_accumulate_over_batches(tokenizer):
    """Adding the texts one at a time gives the same averages as one batch."""
    probs, mask, tokens = hand_made()
    masks = {k: torch.from_numpy(v) for k, v in token_masks(tokens, tokenizer).items()}
    together, apart = HeadStats.empty(1, 3), HeadStats.empty(1, 3)
    together.update([probs], mask, masks["cls"], masks["sep"], masks["punct"])
    for b in range(2):
        n = int(mask[b].sum())
        apart.update([probs[b:b + 1, :, :n, :n]], mask[b:b + 1, :n],
                     *(masks[k][b:b + 1, :n] for k in ("cls", "sep", "punct")))
    for stat in STATS:
        np.testing.assert_allclose(together.means()[stat], apart.means()[stat], atol=1e-12)


def test_punctuation_tokens():
    assert all(map(is_punctuation, [".", ",", '"', "##.", "(", "...", "—"]))
    assert not any(map(is_punctuation, ["[CLS]", "[SEP]", "a", "##s", "$", "", "3"]))


def test_attention_stats_ignore_padding(model, tokenizer):
    """Stats of a real model over padded batches equal those of the texts run one by one."""
    texts = ["the cat sat .", "a", ("the cat", "sat , b")]
    batched = attention_stats(model, tokenizer, texts, batch_size=3)
    single = attention_stats(model, tokenizer, texts, batch_size=1)
    assert batched.texts == single.texts == 3
    for stat in STATS:
        np.testing.assert_allclose(batched.means()[stat], single.means()[stat], atol=1e-5)
        assert batched.means()[stat].shape == (2, 4)
    for stat in ("cls", "sep", "punct", "next", "prev"):
        assert np.all((batched.means()[stat] >= 0) & (batched.means()[stat] <= 1 + 1e-6))


def test_attention_maps_and_plots(model, tokenizer, tmp_path):
    tokens, maps = attention_maps(model, tokenizer, "the cat sat .")
    assert tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]"]
    assert maps.shape == (2, 4, 6, 6)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
    for name, kwargs in {"one": {"layer": 2, "head": 3}, "layer": {"layer": 1}, "head": {"head": 2}, "all": {}}.items():
        path = plot_attention(tokens, maps, tmp_path / f"{name}.png", **kwargs)
        assert path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="layer 3"):
        plot_attention(tokens, maps, tmp_path / "bad.png", layer=3)
    stats = attention_stats(model, tokenizer, ["the cat sat .", "a b"])
    assert plot_head_stats(stats, tmp_path / "grid.png").read_bytes().startswith(b"\x89PNG")


def test_cli_attention_and_stats(model, tokenizer, tmp_path):
    from typer.testing import CliRunner

    from bertforge.cli import app

    model.save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    (tmp_path / "in.txt").write_text("the cat sat .\n\na b , the cat\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["attention-stats", "--model", str(tmp_path / "model"), "--input", str(tmp_path / "in.txt"),
                                 "--table", str(tmp_path / "s.md"), "--json", str(tmp_path / "s.json"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert "highest next:" in result.output and (tmp_path / "s.png").is_file()
    assert '"texts": 2' in (tmp_path / "s.json").read_text()
    result = runner.invoke(app, ["attention", "--model", str(tmp_path / "model"), "--text", "the cat sat .",
                                 "--layer", "1", "--head", "2", "--png", str(tmp_path / "a.png")])
    assert result.exit_code == 0, result.output
    bad = runner.invoke(app, ["attention", "--model", str(tmp_path / "model"), "--text", "the cat",
                              "--layer", "7", "--png", str(tmp_path / "b.png")])
    assert bad.exit_code == 2 and "layer 7" in bad.output
