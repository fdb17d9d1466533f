"""BertConfig: presets, Hugging Face config.json in and out, validation; and the CLI's front door."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from typer.testing import CliRunner

from bertforge import PRESETS, BertConfig, BertModel
from bertforge.cli import app
from bertforge.model import resolve_config


@pytest.mark.parametrize(("name", "layers", "hidden", "heads"), [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8),
    ("medium", 8, 512, 8), ("base", 12, 768, 12), ("large", 24, 1024, 16),
])
def test_presets(name: str, layers: int, hidden: int, heads: int) -> None:
    config = BertConfig.from_preset(name)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, hidden, heads)
    assert config.intermediate_size == 4 * hidden
    assert name in PRESETS


def test_preset_overrides_and_unknown_preset() -> None:
    assert BertConfig.from_preset("tiny", vocab_size=1000).vocab_size == 1000
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        BertConfig.from_preset("huge")


def test_unknown_keys_survive_a_round_trip(tmp_path) -> None:
    original = {
        "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 99, "id2label": {"0": "neg", "1": "pos"},
        "classifier_dropout": None, "my_custom_field": [1, 2, 3], "transformers_version": "4.8.2",
    }
    (tmp_path / "config.json").write_text(json.dumps(original))
    config = BertConfig.from_pretrained(tmp_path)
    assert config.extra == {"id2label": {"0": "neg", "1": "pos"}, "classifier_dropout": None,
                            "my_custom_field": [1, 2, 3]}
    config.to_json_file(tmp_path / "again.json")
    again = json.loads((tmp_path / "again.json").read_text())
    for key, value in original.items():
        if key != "transformers_version":
            assert again[key] == value, key
    assert BertConfig.from_json_file(tmp_path / "again.json") == config


def test_transformers_reads_our_config(tmp_path) -> None:
    config = BertConfig.from_preset("mini", vocab_size=500, hidden_act="gelu_new", layer_norm_eps=1e-7)
    config.to_json_file(tmp_path / "config.json")
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "hidden_act", "layer_norm_eps", "max_position_embeddings", "type_vocab_size", "pad_token_id"):
        assert getattr(theirs, key) == getattr(config, key), key


def test_bad_configs_are_clear_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="hidden_act 'swish'"):
        BertConfig(hidden_act="swish")
    path = tmp_path / "config.json"
    path.write_text('{\n  "hidden_size": 64,\n  "vocab_size": ,\n}')
    with pytest.raises(ValueError, match=r"config.json:3: invalid JSON"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"model_type": "roberta"}))
    with pytest.raises(ValueError, match="model_type 'roberta'"):
        BertConfig.from_json_file(path)
    path.write_text(json.dumps({"position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="relative_key"):
        BertConfig.from_json_file(path)


def test_resolve_config(tmp_path) -> None:
    assert resolve_config("mini").hidden_size == 256
    BertConfig.from_preset("tiny", vocab_size=77).to_json_file(tmp_path / "config.json")
    assert resolve_config(tmp_path).vocab_size == 77
    assert resolve_config(tmp_path / "config.json", vocab_size=88).vocab_size == 88
    with pytest.raises(ValueError, match="neither a preset"):
        resolve_config("no-such-thing")


def test_cli_help_lists_commands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    assert "inspect" in result.output


def test_console_script_is_installed() -> None:
    script = shutil.which("bertforge", path=str(Path(sys.executable).parent))
    assert script, "the `bertforge` console script is not installed beside this Python"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Usage" in done.stdout


def test_cli_inspect(tmp_path) -> None:
    BertModel(BertConfig.from_preset("tiny", vocab_size=100)).save_pretrained(tmp_path)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "BertModel  L=2 H=128" in result.output and "all keys matched" in result.output
    bad = CliRunner().invoke(app, ["inspect", str(tmp_path / "missing")])
    assert bad.exit_code == 2 and "no config.json" in bad.output


def test_cli_tokenizer_train_and_encode(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat.\nthe dog sat on the log.\n" * 50)
    runner = CliRunner()
    trained = runner.invoke(app, ["tokenizer", "train", "--input", str(corpus), "--out", str(tmp_path / "vocab"),
                                  "--vocab-size", "60", "--min-frequency", "1"])
    assert trained.exit_code == 0, trained.output
    vocab = (tmp_path / "vocab" / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and "cat" in vocab
    shown = runner.invoke(app, ["tokenizer", "encode", str(tmp_path / "vocab"), "The Cat sat", "--pair", "a dog"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].split()[-1] == "[CLS]" and lines[2].split()[-1] == "cat" and lines[2].split()[2] == "4:7"
    missing = runner.invoke(app, ["tokenizer", "train", "--input", str(tmp_path / "nope.txt"), "--out", str(tmp_path)])
    assert missing.exit_code == 2 and "nope.txt" in missing.output
