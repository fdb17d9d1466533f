"""Inference precision: the choice by CPU flags, every head at fp32/bf16/int8, tolerances, a saved int8 copy."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from bertforge import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.model import set_labels
from bertforge.precision import (
    PrecisionError,
    apply_precision,
    choose_precision,
    cpu_flags,
    is_quantized,
    is_quantized_checkpoint,
    load_model,
    model_precision,
    save_quantized,
)

# How far outputs may move from fp32 on the fixture model below (outputs up to ~3.2 in magnitude):
# measured at most 0.033 for bf16 and 0.061 for int8 over every head; the bounds are twice that, so
# about 2% (bf16) and 4% (int8) of the largest output. bf16 keeps 8 mantissa bits; int8 rounds every
# activation row and weight row of the encoder's matrix products to 1/127 of its largest value.
BF16_ATOL = 0.06
INT8_ATOL = 0.12

EPYC_FLAGS = {"fpu", "sse2", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
SAPPHIRE_RAPIDS_FLAGS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile"}
AMX_ONLY_FLAGS = {"avx2", "amx_bf16", "amx_tile"}
SKYLAKE_FLAGS = {"fpu", "sse2", "avx2", "avx512f", "avx512bw"}
ZEN2_FLAGS = {"fpu", "sse2", "avx2"}


@pytest.mark.parametrize(("flags", "expected"), [
    (EPYC_FLAGS, "bf16"), (SAPPHIRE_RAPIDS_FLAGS, "bf16"), (AMX_ONLY_FLAGS, "bf16"),
    (SKYLAKE_FLAGS, "fp32"), (ZEN2_FLAGS, "fp32"), (set(), "fp32"),
])
def test_auto_chooses_bf16_only_where_the_cpu_has_native_bf16(flags: set[str], expected: str) -> None:
    assert choose_precision("auto", flags) == expected


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_an_explicit_precision_is_kept_whatever_the_flags(precision: str) -> None:
    assert choose_precision(precision, ZEN2_FLAGS) == precision
    assert choose_precision(precision, SAPPHIRE_RAPIDS_FLAGS) == precision


def test_an_unknown_precision_is_refused_by_name() -> None:
    with pytest.raises(PrecisionError, match="fp16.*auto, fp32, bf16, int8"):
        choose_precision("fp16")


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 avx512_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == set()


def test_this_machines_flags_are_what_cpuid_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under qemu's user-mode emulation /proc/cpuinfo is the host's: cpuid (through numpy) has the last word
    on the flags it knows, and a CPU without AVX-512 has no avx512_* or AMX flag at all."""
    import bertforge.precision as precision

    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_int8 amx_bf16\n")
    monkeypatch.setattr(precision, "CPUINFO", str(info))
    haswell = {"avx2": True, "avx512f": False, "avx512_vnni": False, "avx512_bf16": False}
    monkeypatch.setattr(precision, "cpuid_flags", lambda: haswell)
    assert cpu_flags() == {"fpu", "avx2"}
    # a host with AVX-VNNI (Alder Lake, Zen 5): numpy cannot check that flag, but the file is not this CPU's
    info.write_text("flags\t\t: fpu avx2 avx_vnni avx512f avx512_vnni\n")
    assert cpu_flags() == {"fpu", "avx2"}
    native = {"avx2": True, "avx512f": False, "avx512_vnni": False, "avx512_bf16": False}
    monkeypatch.setattr(precision, "cpuid_flags", lambda: native)
    info.write_text("flags\t\t: fpu avx2 avx_vnni\n")
    assert cpu_flags() == {"fpu", "avx2", "avx_vnni"}  # the file agrees with cpuid: its AVX-VNNI stands
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni avx512_bf16 amx_int8 amx_bf16\n")
    assert cpu_flags(info) == {"fpu", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_bf16"}
    # no /proc/cpuinfo (another OS): cpuid's answers alone
    monkeypatch.setattr(precision, "CPUINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(precision, "cpuid_flags", lambda: {"avx2": True, "avx512f": True, "avx512_vnni": True})
    assert cpu_flags() == {"avx2", "avx512f", "avx512_vnni"}
    # numpy silent: the file as it is
    monkeypatch.setattr(precision, "CPUINFO", str(info))
    monkeypatch.setattr(precision, "cpuid_flags", lambda: {})
    assert "amx_int8" in cpu_flags()


def config(labels: int = 3) -> BertConfig:
    # A wider init than BERT's 0.02 so that the logits are of order 1, where rounding shows.
    return set_labels(BertConfig(vocab_size=90, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=128, max_position_embeddings=32, initializer_range=0.1), labels)


def inputs(shape: tuple[int, ...] = (4, 12)) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, shape, generator=gen)
    mask = torch.ones_like(ids)
    mask[..., -4:] = 0  # some padding, so the packed path runs
    mask[..., 0, -5:] = 0 if len(shape) == 3 else mask[..., 0, -5:]
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (torch.arange(shape[-1]) >= 6).long().expand(shape)}


def model_of(cls: type, labels: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls(config(labels)).eval()


def outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.inference_mode():
        out = model(**batch)
    names = ("logits", "start_logits", "end_logits", "mlm_logits", "last_hidden_state", "pooled_output")
    found = {name: getattr(out, name) for name in names if getattr(out, name, None) is not None}
    mask = batch["attention_mask"].bool()
    # Positions at padding are not outputs anyone reads (zeros in the packed path).
    return {name: value[mask] if value.shape[: mask.dim()] == mask.shape else value for name, value in found.items()}


HEADS = [
    (BertModel, {}),
    (BertForSequenceClassification, {}),
    (BertForTokenClassification, {}),
    (BertForQuestionAnswering, {}),
    (BertForMaskedLM, {}),
    (BertForMultipleChoice, {"shape": (2, 3, 12)}),
]


@pytest.mark.parametrize(("cls", "options"), HEADS, ids=[cls.__name__ for cls, _ in HEADS])
@pytest.mark.parametrize(("precision", "atol"), [("bf16", BF16_ATOL), ("int8", INT8_ATOL)])
def test_every_head_runs_at_each_precision_close_to_fp32(cls: type, options: dict, precision: str, atol: float) -> None:
    batch = inputs(options.get("shape", (4, 12)))
    reference = model_of(cls)
    expected = outputs(reference, batch)
    model, used = apply_precision(copy.deepcopy(reference), precision)
    assert used == precision == model_precision(model)
    got = outputs(model, batch)
    assert got.keys() == expected.keys()
    for name, value in got.items():
        assert value.dtype == torch.float32, name  # callers see fp32 at every precision
        error = (value - expected[name]).abs().max().item()
        assert error <= atol, f"{name}: max |{precision} - fp32| = {error:.4f} > {atol}"
        assert error > 0, f"{name}: {precision} gave fp32's exact outputs, so it did not run at {precision}"


def test_bf16_casts_the_weights_once_and_int8_quantizes_only_the_encoder() -> None:
    bf16, _ = apply_precision(model_of(BertForSequenceClassification), "bf16")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    int8, _ = apply_precision(model_of(BertForSequenceClassification), "int8")
    assert is_quantized(int8)
    for layer in int8.bert.encoder.layers:
        quantized = [layer.attention.qkv, layer.attention.out, layer.ffn.up]
        assert all(type(m.weight).__name__ == "Int8Tensor" for m in quantized)
        # the feed-forward output projection reads GELU's outliers: it stays fp32
        assert type(layer.ffn.down.weight) is torch.nn.Parameter and layer.ffn.down.weight.dtype == torch.float32
    assert type(int8.classifier.weight) is torch.nn.Parameter and int8.classifier.weight.dtype == torch.float32


def test_an_int8_copy_saved_with_every_encoder_linear_int8_still_loads(tmp_path: Path) -> None:
    """int8 copies written before the feed-forward output projections stayed fp32 load as they were made."""
    from bertforge.precision import QUANTIZATION_KEY, _quantize_int8, load_quantized, save_quantized

    model = model_of(BertForSequenceClassification)
    _quantize_int8(model, ffn_output=True)  # the earlier recipe
    save_quantized(model, tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config[QUANTIZATION_KEY]["fp32_modules"]  # as the earlier recipe wrote it
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    loaded = load_quantized(tmp_path / "old")
    assert type(loaded.bert.encoder.layers[0].ffn.down.weight).__name__ == "Int8Tensor"
    batch = inputs((4, 10))
    assert torch.equal(outputs(loaded, batch)["logits"], outputs(model.eval(), batch)["logits"])


def test_classification_agrees_with_fp32_on_the_fixture() -> None:
    batch = inputs((16, 12))
    reference = model_of(BertForSequenceClassification)
    expected = outputs(reference, batch)["logits"].argmax(-1)
    for precision in ("bf16", "int8"):
        model, _ = apply_precision(copy.deepcopy(reference), precision)
        agree = (outputs(model, batch)["logits"].argmax(-1) == expected).float().mean().item()
        assert agree >= 0.9, f"{precision}: {agree:.0%} of fp32's labels"


def test_auto_resolves_to_a_concrete_precision() -> None:
    model, used = apply_precision(model_of(BertForSequenceClassification), "auto")
    assert used == choose_precision("auto", cpu_flags()) == model_precision(model)


def test_a_saved_int8_model_reloads_with_the_same_outputs(tmp_path: Path) -> None:
    batch = inputs()
    model, _ = apply_precision(model_of(BertForTokenClassification, labels=5), "int8")
    expected = outputs(model, batch)
    save_quantized(model, tmp_path / "int8")
    assert is_quantized_checkpoint(tmp_path / "int8")
    assert not any(path.suffix in (".bin", ".pt", ".pth") for path in (tmp_path / "int8").iterdir())
    loaded, used = load_model(tmp_path / "int8")
    assert used == "int8" and type(loaded) is BertForTokenClassification and loaded.classifier.out_features == 5
    assert "bertforge_quantization" not in loaded.config.extra
    got = outputs(loaded, batch)
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], rtol=0, atol=1e-6)
    assert load_model(tmp_path / "int8", "bf16")[1] == "int8"  # its fp32 weights are gone: it says so


def test_load_model_applies_the_precision_to_a_normal_checkpoint(tmp_path: Path) -> None:
    model_of(BertForSequenceClassification).save_pretrained(tmp_path / "fp32")
    for precision in ("fp32", "bf16", "int8"):
        model, used = load_model(tmp_path / "fp32", precision)
        assert used == precision == model_precision(model)
    with pytest.raises(PrecisionError):
        load_model(tmp_path / "fp32", "int4")


def test_a_modernbert_model_runs_at_bf16_and_int8_and_its_int8_copy_reloads(tmp_path: Path) -> None:
    from bertforge.model import ModernBertConfig, ModernBertForSequenceClassification

    torch.manual_seed(0)
    modern = set_labels(ModernBertConfig(vocab_size=90, pad_token_id=0, hidden_size=64, intermediate_size=96,
                                         num_hidden_layers=3, num_attention_heads=4, local_attention=4,
                                         initializer_range=0.1), 3)
    reference = ModernBertForSequenceClassification(modern).eval()
    batch = inputs()
    expected = outputs(reference, batch)["logits"]
    for precision, atol in (("bf16", BF16_ATOL), ("int8", INT8_ATOL)):
        model, used = apply_precision(copy.deepcopy(reference), precision)
        error = (outputs(model, batch)["logits"] - expected).abs().max().item()
        assert used == precision and 0 < error <= atol, (precision, error)
    int8, _ = apply_precision(copy.deepcopy(reference), "int8")
    layer = int8.backbone.layers[1]
    assert all(type(m.weight).__name__ == "Int8Tensor" for m in (layer.attention.qkv, layer.attention.out, layer.ffn.up))
    assert layer.ffn.down.weight.dtype == torch.float32  # the feed-forward output projection stays fp32
    assert type(int8.classifier.weight) is torch.nn.Parameter
    save_quantized(int8, tmp_path / "int8")
    loaded, used = load_model(tmp_path / "int8")
    assert used == "int8" and type(loaded) is ModernBertForSequenceClassification
    torch.testing.assert_close(outputs(loaded, batch)["logits"], outputs(int8, batch)["logits"], rtol=0, atol=1e-6)


# --- the commands that take --precision ---------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random sentence-pair classifier with labels 0/1 and a tokenizer trained on the MRPC fixture."""
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("precision")
    tokenizer = BertTokenizer.train([FIXTURES / "glue" / "MRPC" / "train.tsv"], vocab_size=200, min_frequency=1,
                                    show_progress=False)
    torch.manual_seed(0)
    config = set_labels(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=128, max_position_embeddings=128,
                                   initializer_range=0.1), ["0", "1"])
    BertForSequenceClassification(config).save_pretrained(root / "fp32", tokenizer=tokenizer)
    model, _ = apply_precision(BertForSequenceClassification.from_pretrained(root / "fp32"), "int8")
    save_quantized(model, root / "int8", tokenizer=tokenizer)
    return root


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "auto"])
def test_predict_runs_at_the_precision_and_records_it(classifier_dir: Path, tmp_path: Path, precision: str) -> None:
    import json

    from bertforge.finetune import predict

    done = predict("glue", "MRPC", classifier_dir / "fp32", FIXTURES / "glue", tmp_path, splits=["dev"],
                   precision=precision)
    used = choose_precision(precision, cpu_flags())
    assert done["dev"]["precision"] == used and "accuracy" in done["dev"]["metrics"]
    record = json.loads((tmp_path / "metrics.json").read_text())
    assert record["precision"] == used and record["precision_requested"] == precision
    assert record["cpu"] and isinstance(record["cpu_flags"], list)
    assert record["splits"]["dev"]["metrics"] == done["dev"]["metrics"]


def test_predict_from_a_saved_int8_copy_matches_int8_in_memory(classifier_dir: Path, tmp_path: Path) -> None:
    from bertforge.finetune import predict

    in_memory = predict("glue", "MRPC", classifier_dir / "fp32", FIXTURES / "glue", tmp_path / "a", splits=["dev"],
                        precision="int8")
    saved = predict("glue", "MRPC", classifier_dir / "int8", FIXTURES / "glue", tmp_path / "b", splits=["dev"])
    assert saved["dev"]["precision"] == "int8"
    assert (tmp_path / "a" / "MRPC-dev.tsv").read_text() == (tmp_path / "b" / "MRPC-dev.tsv").read_text()
    assert saved["dev"]["metrics"] == in_memory["dev"]["metrics"]


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_extract_at_low_precision_stays_close_to_fp32(classifier_dir: Path, precision: str) -> None:
    from bertforge.features import FeatureExtractor

    texts = ["Prices rose 5%.", "Prices went up five percent in the market today."]
    reference = FeatureExtractor.from_pretrained(classifier_dir / "fp32", align=None)
    low = FeatureExtractor.from_pretrained(classifier_dir / "fp32", align=None, precision=precision)
    assert (reference.precision, low.precision) == ("fp32", precision)
    for ref, got in zip(reference.extract(texts), low.extract(texts), strict=True):
        assert got.values.dtype == ref.values.dtype and got.units == ref.units
        assert abs(got.values - ref.values).max() <= (BF16_ATOL if precision == "bf16" else INT8_ATOL)
    saved = FeatureExtractor.from_pretrained(classifier_dir / "int8", align=None)
    assert saved.precision == "int8"


def test_serve_runs_at_the_precision_and_reports_it(classifier_dir: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    for directory, precision in ((classifier_dir / "fp32", "bf16"), (classifier_dir / "int8", "fp32")):
        expected = "int8" if directory.name == "int8" else precision
        with TestClient(create_app(directory, precision=precision)) as client:
            health = client.get("/health").json()
            assert health["precision"] == expected and health["cpu"]
            response = client.post("/classify", json={"text": "Prices rose 5%.", "text_pair": "Prices went up."})
            assert response.status_code == 200, response.text


def test_cli_refuses_an_unknown_precision_in_one_line(classifier_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app

    result = CliRunner().invoke(app, ["predict", "glue", "--task", "MRPC", "--model", str(classifier_dir / "fp32"),
                                      "--data", str(FIXTURES / "glue"), "--out", str(tmp_path), "--split", "dev",
                                      "--precision", "fp16"])
    assert result.exit_code == 2 and "unknown precision 'fp16'" in result.output
    assert not (tmp_path / "metrics.json").exists()


def test_cli_quantize_writes_a_copy_that_predict_runs(classifier_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["quantize", "--model", str(classifier_dir / "fp32"), "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    assert {"config.json", "model.int8.safetensors", "vocab.txt"} <= {p.name for p in (tmp_path / "q").iterdir()}
    predicted = runner.invoke(app, ["predict", "glue", "--task", "MRPC", "--model", str(tmp_path / "q"),
                                    "--data", str(FIXTURES / "glue"), "--out", str(tmp_path / "p"), "--split", "dev",
                                    "--precision", "auto"])
    assert predicted.exit_code == 0, predicted.output
    assert "at int8" in predicted.output
    missing = runner.invoke(app, ["quantize", "--model", str(tmp_path / "absent"), "--out", str(tmp_path / "x")])
    assert missing.exit_code == 2 and not (tmp_path / "x").exists()


def test_the_int8_copy_keeps_the_task_and_sentence_transformers_files(tmp_path: Path) -> None:
    from bertforge.precision import copy_sidecars

    source = tmp_path / "fp32"
    model_of(BertForSequenceClassification).save_pretrained(source)
    (source / "task.json").write_text('{"task": "SST-2"}', encoding="utf-8")
    (source / "modules.json").write_text("[]", encoding="utf-8")
    (source / "1_Pooling").mkdir()
    (source / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}', encoding="utf-8")
    int8, _ = apply_precision(model_of(BertForSequenceClassification), "int8")
    save_quantized(int8, tmp_path / "int8")
    assert copy_sidecars(source, tmp_path / "int8") == ["task.json", "modules.json", "1_Pooling"]
    assert (tmp_path / "int8" / "task.json").read_text(encoding="utf-8") == '{"task": "SST-2"}'
    assert (tmp_path / "int8" / "1_Pooling" / "config.json").is_file()
