"""int8 measured against fp32: the report's arithmetic on constructed cases, and every int8 path writing
and printing it (torchao's `quantize`, `export-onnx --int8`, the onnxruntime engine at int8)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge import BertConfig, BertForSequenceClassification
from bertforge import quantization_report as qr
from bertforge.cli import app
from bertforge.model import set_labels
from tests.tiny_models import save_tiny_encoder

TEXT = "the film was good and the plot was bad but the actors were great fun to watch again"


# --- the arithmetic -----------------------------------------------------------------------------
def test_agreement_counts_the_flips_of_a_constructed_case() -> None:
    """10 rows, rows 2 and 7 flipped by int8 (row 7 with the most confidence lost), gold labels known."""
    fp32 = np.zeros((10, 2))
    fp32[:, 1] = [3, -3, 0.2, 2, -2, 1, -1, 4, 2, -2]  # labels 1 0 1 1 0 1 0 1 1 0
    int8 = fp32.copy()
    int8[2, 1], int8[7, 1] = -0.1, -1.0  # 2: 0.55 -> 0.48 (label 0); 7: 0.98 -> 0.27 (label 0)
    gold = [1, 0, 1, 1, 0, 1, 0, 1, 0, None]
    found = qr.compare_scores(fp32, int8, gold=gold, label_names=["neg", "pos"])
    assert found["decisions"] == 10 and found["flipped"] == 2 and found["label_agreement"] == pytest.approx(0.8)
    p = 1 / (1 + np.exp(-np.array([4.0, -1.0])))
    assert found["max_probability_change"] == pytest.approx(p[0] - p[1])
    assert found["largest_flip"] == {"row": 7, "fp32_label": "pos", "fp32_probability": round(p[0], 4),
                                     "int8_label": "neg", "int8_probability": round(1 - p[1], 4)}
    # accuracy on the 9 rows with a gold label: fp32 misses row 8 only; int8 also rows 2 and 7
    assert found["metric"] == "accuracy"
    assert found["fp32_score"] == pytest.approx(8 / 9) and found["int8_score"] == pytest.approx(6 / 9)


def test_token_labels_count_real_positions_only_and_multi_label_each_class() -> None:
    fp32 = np.zeros((2, 3, 2))
    fp32[..., 1] = [[1, -1, 5], [1, 1, -5]]
    int8 = fp32.copy()
    int8[0, 0, 1] = -1  # a real token flips
    int8[1, 2, 1] = 5  # a padded position changes: not counted
    mask = np.array([[1, 1, 1], [1, 1, 0]])
    found = qr.compare_scores(fp32, int8, mask=mask)
    assert (found["decisions"], found["flipped"]) == (5, 1)
    multi = qr.compare_scores(np.array([[2.0, -2.0, 0.5]]), np.array([[2.0, 1.0, 0.5]]), multi_label=True)
    assert (multi["decisions"], multi["flipped"]) == (3, 1)


def test_cosines_are_each_rows() -> None:
    a = np.array([[1.0, 0.0], [0.0, 2.0]])
    b = np.array([[1.0, 1.0], [0.0, 3.0]])
    found = qr.compare_vectors(a, b)
    assert found["cosine_min"] == pytest.approx(2 ** -0.5) and found["cosine_mean"] == pytest.approx((1 + 2 ** -0.5) / 2)


def test_below_the_floor_the_verdict_warns_and_says_what_keeps_accuracy() -> None:
    low = qr.judge(qr.QuantizationReport("p", "r", "s", 100, "labels", label_agreement=0.98, decisions=100,
                                         flipped=2))
    assert not low.ok and low.verdict.startswith("WARNING") and "below 99%" in low.verdict
    text = "\n".join(low.lines())
    for lever in ("per-token", "fp32", "static calibration", "bf16"):
        assert lever in text, lever
    fine = qr.judge(qr.QuantizationReport("p", "r", "s", 100, "labels", label_agreement=0.995, decisions=200,
                                          flipped=1))
    assert fine.ok and not fine.advice and "WARNING" not in "\n".join(fine.lines())
    vectors = qr.judge(qr.QuantizationReport("p", "r", "s", 10, "sentence vectors", cosine_min=0.9, cosine_mean=0.97))
    assert not vectors.ok and "cosine" in vectors.verdict


def test_reports_of_several_paths_stand_side_by_side(tmp_path: Path) -> None:
    one = qr.judge(qr.QuantizationReport("a", "r", "s", 1, "labels", label_agreement=1.0, decisions=1, flipped=0))
    two = qr.judge(qr.QuantizationReport("b", "r", "s", 1, "labels", label_agreement=0.5, decisions=2, flipped=1))
    qr.write_report(one, tmp_path)
    path = qr.write_report(two, tmp_path)
    body = json.loads(path.read_text())
    assert path == tmp_path / qr.REPORT_FILE and set(body["reports"]) == {"a", "b"} and body["ok"] is False
    assert qr.report_path(tmp_path / "m.onnx") == tmp_path / "m.quantization_report.json"


def test_the_sample_is_the_dev_file_task_json_names(tmp_path: Path) -> None:
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\n\"a quote\" opens it\t1\nplain\t0\n", encoding="utf-8")
    (tmp_path / "task.json").write_text(json.dumps({"family": "classify", "task": "classify", "settings": {
        "dev": str(dev), "text_column": "sentence", "label_column": "label"}}), encoding="utf-8")
    sample = qr.sample_for(tmp_path)
    assert sample.texts == ['"a quote" opens it', "plain"] and sample.labels == ["1", "0"]
    assert sample.source.startswith("dev file")
    fixed = qr.sample_for(tmp_path / "nothing")
    assert fixed.texts == list(qr.FIXED_SENTENCES) and fixed.labels is None


# --- the int8 paths -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer sentiment classifier with a dev file named in its task.json."""
    root = tmp_path_factory.mktemp("int8report")
    encoder = save_tiny_encoder(root, TEXT, vocab_size=120, hidden_size=64, num_layers=2, num_heads=4)
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(encoder)
    torch.manual_seed(1)
    config = set_labels(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                                   initializer_range=0.2), ["neg", "pos"])
    directory = root / "classifier"
    BertForSequenceClassification(config).save_pretrained(directory, tokenizer=tokenizer)
    words = TEXT.split()
    rows = [" ".join(words[i % 7:i % 7 + 3 + i % 5]) + f"\t{['neg', 'pos'][i % 2]}" for i in range(40)]
    (root / "dev.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    (directory / "task.json").write_text(json.dumps({"family": "classify", "task": "classify", "max_length": 32,
                                                     "settings": {"dev": str(root / "dev.tsv")}}), encoding="utf-8")
    return directory


def _stored(target: Path, path: str) -> dict:
    return json.loads(qr.report_path(target).read_text())["reports"][path]


def _consistent(report: dict, rows: int) -> None:
    assert report["rows"] == rows and report["decisions"] == rows
    assert report["label_agreement"] == pytest.approx(1 - report["flipped"] / report["decisions"])
    assert 0 <= report["max_probability_change"] <= 1 and report["metric"] == "accuracy"
    assert report["ok"] == (report["label_agreement"] >= qr.AGREEMENT_FLOOR and
                            report["fp32_score"] - report["int8_score"] <= 0.005)


def test_quantize_writes_and_prints_the_report(classifier: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["quantize", "--model", str(classifier), "--out", str(tmp_path / "int8")])
    assert result.exit_code == 0, result.output
    report = _stored(tmp_path / "int8", "torch int8 (torchao)")
    _consistent(report, 40)
    assert "dev file" in report["sample"] and "label agreement" in result.output
    assert f"{report['label_agreement']:.2%}" in result.output


def test_quantize_warns_when_int8_flips_labels(classifier: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantizer that turns the head around: every label flips, and the command says so."""
    import bertforge.precision as precision

    real = precision._quantize_int8

    def broken(model: torch.nn.Module) -> None:
        real(model)
        with torch.no_grad():
            model.classifier.weight.neg_()
            model.classifier.bias.neg_()

    monkeypatch.setattr(precision, "_quantize_int8", broken)
    result = CliRunner().invoke(app, ["quantize", "--model", str(classifier), "--out", str(tmp_path / "int8")])
    assert result.exit_code == 0, result.output
    report = _stored(tmp_path / "int8", "torch int8 (torchao)")
    assert report["label_agreement"] < 0.5 and not report["ok"]
    assert "WARNING: label agreement" in result.output and "static calibration" in result.output


@pytest.mark.slow
def test_export_int8_writes_and_prints_the_report(classifier: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    out = tmp_path / "model.onnx"
    result = CliRunner().invoke(app, ["export-onnx", "--model", str(classifier), "--out", str(out), "--int8"])
    assert result.exit_code == 0, result.output
    report = _stored(out, "export-onnx --int8")
    _consistent(report, 40)
    assert "label agreement" in result.output and report["verdict"] in result.output


def test_the_engine_at_int8_reports_int8_against_fp32(classifier: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's reason and report compare the int8 graph with the fp32 one (not fused with plain fp32):
    its max diff is the int8 graph's from fp32, recomputed here."""
    pytest.importorskip("onnxruntime")
    from bertforge.engine import ONNX_INT8_PATH, OnnxEngine
    from bertforge.model import load_any

    monkeypatch.setenv("BERTFORGE_ONNX_CACHE", str(tmp_path / "cache"))
    model, _ = load_any(classifier)
    fp32 = OnnxEngine(model.eval(), "head", "fp32", model_dir=classifier).prepare()
    int8 = OnnxEngine(model, "head", "int8", model_dir=classifier).prepare()
    report = int8.info["quantization"]
    _consistent(report, 40)
    assert "int8 vs fp32 on 40 rows: label agreement" in int8.info["reason"]
    assert _stored(classifier, ONNX_INT8_PATH)["label_agreement"] == report["label_agreement"]
    sample, batches = qr.sample_batches(model, classifier)
    worst = max(float((int8(**b)["logits"] - fp32(**b)["logits"]).abs().max()) for b in batches)
    assert report["max_abs_diff"] == pytest.approx(worst, rel=1e-5, abs=1e-6) and worst > 0


# --- an embedding model's export ----------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_an_embedding_export_outputs_the_sentence_vector_sentence_transformers_gives(tmp_path: Path,
                                                                                   pooling: str) -> None:
    pytest.importorskip("onnxruntime")
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from bertforge.export import export_onnx, onnx_session
    from bertforge.tokenizer import BertTokenizer

    encoder = save_tiny_encoder(tmp_path, TEXT, vocab_size=120)
    body = Transformer(str(encoder), max_seq_length=32)
    st = SentenceTransformer(modules=[body, Pooling(body.get_embedding_dimension(), pooling_mode=pooling),
                                      Normalize()], device="cpu")
    st.save(str(tmp_path / "st"))
    texts = ["the film was good", "the plot was bad but the actors were great fun", "again"]
    result = export_onnx(tmp_path / "st", tmp_path / "st.onnx")
    assert result.outputs == ["sentence_embedding"]
    batch = BertTokenizer.from_pretrained(tmp_path / "st")(texts, padding=True, return_tensors="np")
    ours = onnx_session(tmp_path / "st.onnx").run(None, {k: batch[k] for k in ("input_ids", "attention_mask",
                                                                                "token_type_ids")})[0]
    theirs = st.encode(texts, convert_to_numpy=True)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)

    int8 = export_onnx(tmp_path / "st", tmp_path / "st8.onnx", int8=True)
    report = int8.quantization
    assert report.outputs == "sentence vectors" and report.rows == len(qr.FIXED_SENTENCES)
    assert -1 <= report.cosine_min <= report.cosine_mean <= 1 and report.verdict
    assert _stored(tmp_path / "st8.onnx", "export-onnx --int8")["cosine_min"] == report.cosine_min


def test_loading_at_int8_measures_once_per_weights(classifier: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """predict / serve --precision int8 on torch quantize in memory: the first load measures and writes the
    report, later loads of the same weights reuse it."""
    import shutil

    import bertforge.precision as precision
    from bertforge.finetuned import load_for_inference

    directory = Path(shutil.copytree(classifier, tmp_path / "model"))
    (directory / qr.REPORT_FILE).unlink(missing_ok=True)
    assert load_for_inference(directory, "int8").precision == "int8"
    report = _stored(directory, precision.TORCH_INT8_PATH)
    _consistent(report, 40)
    assert report["weights"]

    def measured_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stored report should have been reused")

    monkeypatch.setattr(qr, "int8_report", measured_again)
    load_for_inference(directory, "int8")


def test_the_torch_engine_chosen_at_int8_measures_too(classifier: Path, tmp_path: Path) -> None:
    """`predict FAMILY --precision int8` and `--engine auto` quantize through the engine choice: that path
    writes the torchao report as well."""
    import shutil

    from bertforge.engine import select_engine
    from bertforge.model import load_any
    from bertforge.precision import TORCH_INT8_PATH, is_quantized

    directory = Path(shutil.copytree(classifier, tmp_path / "model"))
    (directory / qr.REPORT_FILE).unlink(missing_ok=True)
    model, _ = load_any(directory)
    choice, _ = select_engine(model.eval(), "torch", "int8", model_dir=directory)
    assert choice.precision == "int8" and is_quantized(model)
    _consistent(_stored(directory, TORCH_INT8_PATH), 40)
