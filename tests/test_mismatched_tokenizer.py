"""A tokenizer whose ids run past the model's embedding table is refused in one line, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.finetuned import load_for_inference
from bertforge.model import BertConfig, BertModel
from bertforge.tokenizer import BertTokenizer

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mismatch")
    corpus = root / "corpus.txt"
    corpus.write_text("a gripping film with a terrible ending and a dull middle act\n" * 20, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)
    small = BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size - 10)  # ten ids without an embedding
    BertModel(small).save_pretrained(root / "model", tokenizer=tokenizer)
    return root / "model"


def test_loading_refuses_a_tokenizer_bigger_than_the_embeddings(mismatched: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer has .* pieces but config.json's vocab_size is"):
        load_for_inference(mismatched)


def test_the_commands_exit_2_and_write_nothing(mismatched: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a gripping film\n", encoding="utf-8")
    out = tmp_path / "preds.jsonl"
    result = CliRunner().invoke(app, ["predict", "--model", str(mismatched), "--input", str(texts), "--out", str(out),
                                      "--task", "embeddings", "--no-progress"])
    assert result.exit_code == 2 and "vocab_size" in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists()
    run = tmp_path / "run"
    result = CliRunner().invoke(app, ["finetune", "classify", "--model", str(mismatched), "--out", str(run),
                                      "--train", str(FIXTURES / "classify" / "reviews.csv"),
                                      "--dev", str(FIXTURES / "classify" / "reviews-dev.csv")])
    assert result.exit_code == 2 and "vocab_size" in result.output, result.output
    assert not (run / "results.json").exists()
