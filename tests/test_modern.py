"""ModernBERT: the config both ways, the encoder and every head against transformers, round trips."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bertforge.model import (
    MODERN_PRESETS,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    ModernBertConfig,
    ModernBertForMaskedLM,
    ModernBertModel,
    config_from_dict,
    load_any,
    resolve_config,
)
from bertforge.model.modernbert.modeling import sliding_window_attention

ATOL = 1e-5
# Small and random, with a window (8 = 4 each side) much shorter than the inputs below.
SIZES = dict(vocab_size=99, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=2,
             max_position_embeddings=512, local_attention=8, pad_token_id=0)
SPECIAL_IDS = dict(bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


def hf_config(**overrides) -> transformers.ModernBertConfig:
    return transformers.ModernBertConfig(**{**SIZES, **SPECIAL_IDS, **overrides})


def randomised(model: torch.nn.Module) -> torch.nn.Module:
    """Every parameter moved off its initial value (norms away from 1, biases from 0), so that a
    mixed-up or skipped weight cannot go unnoticed."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model.eval()


def padded_batch(length: int, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, length) ids and a mask with the later rows padded on the right."""
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(3, SIZES["vocab_size"], (rows, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, rows):
        real = max(1, length * (rows - row) // rows)
        mask[row, real:] = 0
        ids[row, real:] = 0
    return ids, mask


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Values at real tokens only: padding positions mean nothing in either library."""
    return x[mask.bool()]


def saved_transformers_model(tmp_path, name: str, **overrides) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    model = randomised(getattr(transformers, name)(hf_config(**overrides)))
    model.save_pretrained(tmp_path)
    return model


# ------------------------------------------------------------------------------------------------
# config.json both ways
# ------------------------------------------------------------------------------------------------
def test_transformers_config_json_reads_and_writes_back_the_same_fields(tmp_path) -> None:
    hf_config(layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
              classifier_pooling="mean").save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    ours = config_from_dict(written, source="config.json")
    assert isinstance(ours, ModernBertConfig)
    assert ours.layer_types == written["layer_types"] and ours.classifier_pooling == "mean"
    assert ours.global_rope_theta == 160_000.0 and ours.local_rope_theta == 10_000.0
    again = ours.to_dict()
    for key, value in written.items():
        if key not in ("transformers_version", "dtype", "architectures"):
            assert again[key] == value, key


def test_our_config_json_loads_in_transformers(tmp_path) -> None:
    ours = ModernBertConfig(**SIZES, global_rope_theta=80_000.0, local_rope_theta=5_000.0,
                            layer_types=["sliding_attention", "full_attention"] * 2, norm_bias=True)
    ours.to_json_file(tmp_path / "config.json")
    theirs = transformers.ModernBertConfig.from_pretrained(tmp_path)
    assert theirs.layer_types == ours.layer_types and theirs.norm_bias is True
    assert theirs.rope_parameters["full_attention"]["rope_theta"] == 80_000.0
    assert theirs.rope_parameters["sliding_attention"]["rope_theta"] == 5_000.0
    assert theirs.sliding_window == ours.half_window == 4


def test_older_hub_config_keys_are_read() -> None:
    """Configs on the Hub written before transformers 5 spell the bases and the pattern as scalars."""
    config = config_from_dict({"model_type": "modernbert", **SIZES, "num_hidden_layers": 6,
                               "global_rope_theta": 50_000.0, "local_rope_theta": 1_000.0,
                               "global_attn_every_n_layers": 2})
    assert config.layer_types == ["full_attention", "sliding_attention"] * 3
    assert (config.global_rope_theta, config.local_rope_theta) == (50_000.0, 1_000.0)
    assert "global_attn_every_n_layers" not in config.to_dict()


def test_modern_presets_build_modernbert_base_exactly() -> None:
    assert set(MODERN_PRESETS) == {"modern-tiny", "modern-mini", "modern-small", "modern-base"}
    base = resolve_config("modern-base")
    assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size, base.num_attention_heads) == (
        22, 768, 1152, 12)
    assert base.layer_types.count("full_attention") == 8  # layers 0, 3, ..., 21
    with torch.device("meta"):
        ours = ModernBertModel(base)
        theirs = transformers.ModernBertModel(transformers.ModernBertConfig())
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


# ------------------------------------------------------------------------------------------------
# The encoder against transformers
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [5, 20, 70])  # within the window, a few windows, many blocks
@pytest.mark.parametrize("per_sequence", [True, False])
def test_encoder_hidden_states_equal_transformers(tmp_path, length: int, per_sequence: bool) -> None:
    theirs = saved_transformers_model(tmp_path, "ModernBertModel")
    ours = BertModel.from_pretrained(tmp_path).eval()  # chosen by model_type
    assert isinstance(ours, ModernBertModel) and ours.load_report.ok
    ours.attention_per_sequence = per_sequence
    ids, mask = padded_batch(length)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).last_hidden_state
        packed = ours(ids, mask).last_hidden_state
        ours.unpad = False
        padded = ours(ids, mask).last_hidden_state
    torch.testing.assert_close(real(packed, mask), real(expected, mask), atol=ATOL, rtol=0)
    torch.testing.assert_close(real(padded, mask), real(expected, mask), atol=ATOL, rtol=0)


def test_unpadded_batch_and_every_hidden_state_equal_transformers(tmp_path) -> None:
    theirs = saved_transformers_model(tmp_path, "ModernBertModel")
    ours = BertModel.from_pretrained(tmp_path).eval()
    ids, _ = padded_batch(40, rows=2)
    with torch.no_grad():
        expected = theirs(ids, output_hidden_states=True)
        out = ours(ids, output_hidden_states=True)
    torch.testing.assert_close(out.last_hidden_state, expected.last_hidden_state, atol=ATOL, rtol=0)
    assert len(out.hidden_states) == len(expected.hidden_states) == SIZES["num_hidden_layers"] + 1
    for mine, reference in zip(out.hidden_states, expected.hidden_states, strict=True):
        torch.testing.assert_close(mine, reference, atol=ATOL, rtol=0)


def test_sliding_window_attention_equals_a_dense_banded_mask() -> None:
    torch.manual_seed(0)
    for length, half_window in [(3, 4), (5, 4), (6, 4), (30, 4), (50, 4), (97, 8), (64, 16)]:
        query, key, value = torch.randn(3, 2, 2, length, 8).unbind(0)
        padding = torch.zeros(2, length, dtype=torch.bool)
        padding[1, length * 2 // 3:] = True
        positions = torch.arange(length)
        keep = ((positions[:, None] - positions[None, :]).abs() <= half_window) & ~padding[:, None, None, :]
        expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=keep)
        got = sliding_window_attention(query, key, value, half_window, padding)
        rows = ~padding
        torch.testing.assert_close(got.transpose(1, 2)[rows], expected.transpose(1, 2)[rows], atol=1e-5, rtol=0)
        band = (positions[:, None] - positions[None, :]).abs() <= half_window
        unpadded = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=band)
        torch.testing.assert_close(sliding_window_attention(query, key, value, half_window), unpadded,
                                   atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------
# Heads: transformers' checkpoints load through the BERT entry points; ours load in transformers
# ------------------------------------------------------------------------------------------------
HEADS = [
    ("ModernBertForMaskedLM", BertForMaskedLM, {}),
    ("ModernBertForSequenceClassification", BertForSequenceClassification, {"num_labels": 3}),
    ("ModernBertForSequenceClassification", BertForSequenceClassification,
     {"num_labels": 3, "classifier_pooling": "mean"}),
    ("ModernBertForTokenClassification", BertForTokenClassification, {"num_labels": 5}),
    ("ModernBertForQuestionAnswering", BertForQuestionAnswering, {}),
    ("ModernBertForMultipleChoice", BertForMultipleChoice, {}),
]


def head_outputs(name: str, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """The head's outputs at real tokens, for either library's model."""
    if name.endswith("MultipleChoice"):
        return [model(input_ids=ids.view(1, *ids.shape), attention_mask=mask.view(1, *mask.shape)).logits]
    out = model(input_ids=ids, attention_mask=mask)
    if name.endswith("QuestionAnswering"):
        return [real(out.start_logits, mask), real(out.end_logits, mask)]
    logits = out.mlm_logits if hasattr(out, "mlm_logits") else out.logits
    return [logits] if name.endswith("SequenceClassification") else [real(logits, mask)]


@pytest.mark.parametrize(("name", "bert_class", "overrides"), HEADS)
def test_transformers_head_checkpoint_loads_with_equal_outputs(tmp_path, name, bert_class, overrides) -> None:
    theirs = saved_transformers_model(tmp_path, name, **overrides)
    for ours in (load_any(tmp_path)[0], bert_class.from_pretrained(tmp_path)):
        assert type(ours).__name__ == name and ours.load_report.ok and not ours.load_report.new_heads
        ids, mask = padded_batch(30, rows=2)
        with torch.no_grad():
            for mine, reference in zip(head_outputs(name, ours.eval(), ids, mask),
                                       head_outputs(name, theirs, ids, mask), strict=True):
                torch.testing.assert_close(mine, reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize(("name", "bert_class", "overrides"), HEADS)
def test_our_head_checkpoint_loads_in_transformers_with_equal_outputs(tmp_path, name, bert_class, overrides) -> None:
    theirs = saved_transformers_model(tmp_path / "theirs", name, **overrides)
    ours = randomised(load_any(tmp_path / "theirs")[0])  # new values, so the file is ours alone
    ours.save_pretrained(tmp_path / "ours")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "modernbert" and saved["architectures"] == [name]
    reloaded, info = type(theirs).from_pretrained(tmp_path / "ours", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ids, mask = padded_batch(30, rows=2)
    with torch.no_grad():
        for mine, reference in zip(head_outputs(name, ours, ids, mask),
                                   head_outputs(name, reloaded.eval(), ids, mask), strict=True):
            torch.testing.assert_close(mine, reference, atol=ATOL, rtol=0)


def test_encoder_checkpoint_under_a_task_head_reports_the_new_head(tmp_path) -> None:
    saved_transformers_model(tmp_path, "ModernBertForMaskedLM")
    model = BertForSequenceClassification.from_pretrained(tmp_path, **{"num_labels": 4})
    assert type(model).__name__ == "ModernBertForSequenceClassification"
    assert model.load_report.new_heads == ["classifier.bias", "classifier.weight"]  # head.* came from the MLM
    assert model.load_report.unused == ["decoder_bias"]


def test_modern_masked_lm_trains_and_gradient_checkpointing_gives_the_same_loss() -> None:
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(**SIZES)).train()
    ids, mask = padded_batch(40)
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    labels[mask == 0] = -100
    torch.manual_seed(1)
    loss = model(ids, mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and model.backbone.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    model.backbone.gradient_checkpointing = True
    torch.manual_seed(1)
    torch.testing.assert_close(model(ids, mask, labels=labels).loss, loss)


# ------------------------------------------------------------------------------------------------
# A bad config.json: one line naming the file and the field, exit code 2
# ------------------------------------------------------------------------------------------------
BAD_CONFIGS = [
    ({"layer_types": ["full_attention", "sliding_attention", "banded_attention", "full_attention"]},
     "layer_types[2]: unknown attention type 'banded_attention'"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types has 2 entries for num_hidden_layers 4"),
    ({"local_attention": 127}, "local_attention must be even"),
    ({"hidden_size": 30, "num_attention_heads": 2}, "hidden_size / num_attention_heads = 15 is odd"),
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}}},
     "rope_parameters.full_attention.rope_type 'yarn' is not supported"),
]


@pytest.mark.parametrize(("change", "message"), BAD_CONFIGS)
def test_bad_modern_config_is_one_line_naming_file_and_field(tmp_path, change, message) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app

    saved_transformers_model(tmp_path, "ModernBertModel")
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data.update(change)
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as caught:
        load_any(tmp_path)
    assert str(caught.value) == f"{path}: {str(caught.value).split(': ', 1)[1]}" and message in str(caught.value)
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and message in lines[0], result.output


# ------------------------------------------------------------------------------------------------
# Long inputs: a sliding-window layer's memory grows linearly with the length
# ------------------------------------------------------------------------------------------------
class PeakMemory(TorchDispatchMode):
    """Peak bytes of the storages created under it, each counted once while any tensor on it lives
    (views and ops that return an input share its storage). Storages that existed before (weights,
    inputs: `existing`) are not counted.

    With SDPA's math backend the attention scores are ordinary ops, so a T x T matrix would show
    here; the fused kernels would hide their own buffers."""

    def __init__(self, existing: list[torch.Tensor]) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.external = {t.untyped_storage().data_ptr() for t in existing}
        self.holders: dict[int, int] = {}  # storage address -> tensors alive on it

    def _release(self, address: int, size: int) -> None:
        self.holders[address] -= 1
        if not self.holders[address]:
            del self.holders[address]
            self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            address, size = storage.data_ptr(), storage.nbytes()
            if address in self.external or not size:
                continue
            if address not in self.holders:
                self.holders[address] = 0
                self.live += size
                self.peak = max(self.peak, self.live)
            self.holders[address] += 1
            weakref.finalize(tensor, self._release, address, size)
        return out


def layer_peak_memory(model: ModernBertModel, index: int, length: int) -> int:
    layer = model.layers[index]
    hidden = torch.randn(1, length, model.config.hidden_size)
    rotations = model._rotations(torch.arange(length)[None])[layer.attention_type]
    existing = [hidden, rotations.cos, rotations.sin, *layer.parameters()]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), PeakMemory(existing) as memory:
        layer(hidden, rotations, None, None)
    return memory.peak


def test_a_sliding_window_layer_needs_linear_memory_at_4096_tokens() -> None:
    config = ModernBertConfig(vocab_size=10, pad_token_id=0, hidden_size=64, intermediate_size=96,
                              num_hidden_layers=2, num_attention_heads=2, local_attention=128)
    model = ModernBertModel(config).eval()
    assert model.layers[0].attention_type == "full_attention" and model.layers[1].attention_type == "sliding_attention"
    sliding = [layer_peak_memory(model, 1, length) for length in (2048, 4096)]
    full = [layer_peak_memory(model, 0, length) for length in (2048, 4096)]
    assert sliding[1] / sliding[0] < 2.1  # doubling the length doubles the memory
    assert full[1] / full[0] > 3.5  # the measure does see a T x T score matrix: 4x
    assert sliding[1] < full[1] / 5


def test_8192_tokens_through_a_padded_batch_match_the_unpacked_path() -> None:
    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=50, pad_token_id=0, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2)  # max_position_embeddings 8192
    model = ModernBertModel(config).eval()
    ids = torch.randint(1, 50, (2, 8192))
    mask = torch.ones_like(ids)
    mask[1, 5000:] = 0
    with torch.no_grad():
        packed = model(ids, mask).last_hidden_state  # per sequence
        alone = model(ids[1:, :5000]).last_hidden_state  # the second row on its own, unpadded
    torch.testing.assert_close(packed[1, :5000], alone[0], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        model(torch.ones(1, 8193, dtype=torch.long))
