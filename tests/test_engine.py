"""The onnxruntime engine behind the one pipeline: the same answers as torch on every task the pipeline
serves (fp32 within 1e-4 on the model's outputs, int8 within the export tests' bound), auto's choice on
given CPU flags and table entries, the export cache (kept, and made again when the weights change),
threads following torch's, and one-line refusals.

Models are tiny random BERTs with a WordPiece vocabulary trained on a few sentences; a task.json names
the benchmark task for each head, so the pipeline runs that task's own pre- and post-processing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxscript", reason="the onnxruntime engine exports with onnxscript (the onnx extra)")
pytest.importorskip("onnxruntime", reason="the onnxruntime engine needs onnxruntime (the onnx extra)")
import torch  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from bertforge import engine as engines  # noqa: E402
from bertforge.cli import app  # noqa: E402
from bertforge.engine import EngineError, OnnxEngine, choose_engine, select_engine  # noqa: E402
from bertforge.finetuned import TaskRecord  # noqa: E402
from bertforge.model import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertforge.model.base import set_labels  # noqa: E402
from bertforge.pipeline import pipeline  # noqa: E402
from bertforge.tokenizer import BertTokenizer  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"
TOLERANCE = 1e-4  # fp32: ONNX Runtime against PyTorch on the outputs post-processing reads
INT8_TOLERANCE = 0.15  # tests/test_export.py's bound for ONNX Runtime's dynamic int8 against fp32
CORPUS = [
    "the normans were a people who gave their name to normandy , a region in france .",
    "zurich is the largest city in switzerland ; its airport opened in 1948 .",
    "new york times reported that anna smith met bob in rome .",
    "a gripping , beautifully acted film with a terrible ending . not bad at all .",
]
ZURICH = "Zurich is the largest city in Switzerland; its airport opened in 1948."
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-MISC", "I-MISC"]
# task kind -> (head class, labels, task.json (family, task, max_length), inputs)
KINDS: dict[str, tuple[Any, Any, tuple[str, str, int] | None, list[Any]]] = {
    "classification": (BertForSequenceClassification, ["0", "1"], ("glue", "sst2", 24),
                       ["a gripping film", "not bad at all , a beautifully acted film with a terrible ending", "dull"]),
    "pairs": (BertForSequenceClassification, ["0", "1"], ("glue", "mrpc", 32),
              [("zurich is the largest city", "the largest city is zurich"), ("the normans", "bob in rome")]),
    "regression": (BertForSequenceClassification, 1, ("glue", "stsb", 32),
                   [("a gripping film", "a beautifully acted film"), ("dull", "the normans")]),
    "tagging": (BertForTokenClassification, TAGS, ("ner", "conll2003", 8),
                ["Anna Smith met Bob in Rome .", "New York Times reported that zurich is large ."]),
    "qa": (BertForQuestionAnswering, None, ("squad", "v2.0", 32),
           [{"question": "What is the largest city in Switzerland?", "context": ZURICH},
            {"question": "When did the airport open?", "context": ZURICH * 3}]),
    "multiple-choice": (BertForMultipleChoice, None, ("swag", "swag", 24),
                        [{"context": "anna smith met bob", "start": "she",
                          "endings": ["went to rome .", "is a city .", "opened in 1948 .", "gave her name ."]}]),
    "fill-mask": (BertForMaskedLM, None, None, ["the normans were a [MASK] who gave their name to [MASK] ."]),
    "embeddings": (BertModel, None, None, ["a gripping film", "zurich is the largest city in switzerland"]),
}


def _config(tokenizer: BertTokenizer) -> BertConfig:
    return BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, initializer_range=0.2)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizer:
    corpus = tmp_path_factory.mktemp("engine-corpus") / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    return BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)


def _save(kind: str, root: Path, tokenizer: BertTokenizer, seed: int = 0) -> Path:
    head, labels, task, _ = KINDS[kind]
    torch.manual_seed(seed)
    config = _config(tokenizer)
    if labels is not None:
        set_labels(config, labels)
    directory = root / kind
    head(config).save_pretrained(directory, tokenizer=tokenizer)
    if task is not None:
        family, name, max_length = task
        TaskRecord(family=family, task=name, max_length=max_length,
                   settings={"doc_stride": 8} if family == "squad" else {}).write(directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, tokenizer: BertTokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-models")
    return {kind: _save(kind, root, tokenizer) for kind in KINDS}


def _max_diff(a: list[dict[str, np.ndarray]], b: list[dict[str, np.ndarray]], skip: tuple[str, ...] = ()) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert set(x) == set(y)
        for name in x:
            if name not in skip:
                worst = max(worst, float(np.abs(x[name].astype(np.float64) - y[name].astype(np.float64)).max()))
    return worst


# ------------------------------------------------------------------------------------------------ parity


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_onnxruntime_gives_torchs_answers(kind: str, models: dict[str, Path]) -> None:
    """Same features, same post-processing: the model outputs agree within 1e-4 and so do the results."""
    inputs = KINDS[kind][3]
    torch_pipe = pipeline(models[kind])
    onnx_pipe = pipeline(models[kind], engine="onnxruntime")
    assert onnx_pipe.engine is not None and onnx_pipe.engine_name == "onnxruntime"
    assert onnx_pipe.task == torch_pipe.task and onnx_pipe.precision == "fp32"
    assert onnx_pipe.engine_choice is not None and onnx_pipe.engine_choice.reason.startswith("asked for")
    prepared = torch_pipe.prepare(inputs)
    expected, got = torch_pipe.run(prepared.features), onnx_pipe.run(prepared.features)
    # fill-mask: ids of equal scores may be ordered differently; the scores say the same
    assert _max_diff(expected, got, skip=("mask_ids",)) <= TOLERANCE
    ours, theirs = torch_pipe(inputs), onnx_pipe(inputs)
    if kind == "embeddings":
        assert np.allclose([r["embedding"] for r in ours], [r["embedding"] for r in theirs], atol=TOLERANCE)
    elif kind == "fill-mask":
        for mine, other in zip(ours[0], theirs[0], strict=True):  # per mask: the same tokens, the same scores
            assert np.allclose([p["score"] for p in mine], [p["score"] for p in other], atol=TOLERANCE)
    else:
        assert _same(ours, theirs)


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers within the tolerance."""
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) <= TOLERANCE
    if isinstance(a, dict):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_int8_is_onnxruntimes_dynamic_quantization_within_the_export_bound(models: dict[str, Path]) -> None:
    fp32 = pipeline(models["classification"])
    int8 = pipeline(models["classification"], engine="onnxruntime", precision="int8")
    assert int8.precision == "int8" and int8.engine is not None
    assert "quantized_from" in int8.engine.info or int8.engine.info["key"]["precision"] == "int8"
    import onnx

    ops = {node.op_type for node in onnx.load(str(int8.engine.path)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} & ops, ops
    prepared = fp32.prepare(KINDS["classification"][3])
    assert _max_diff(fp32.run(prepared.features), int8.run(prepared.features)) <= INT8_TOLERANCE


def test_the_dev_set_run_gives_the_same_metrics_on_either_engine(tmp_path: Path, tokenizer: BertTokenizer) -> None:
    """`bertforge predict glue --data --split dev --engine onnxruntime`: the task's own files and scores."""
    model = _save("classification", tmp_path, tokenizer, seed=3)
    runner = CliRunner()
    torch_run = runner.invoke(app, ["predict", "glue", "--model", str(model), "--data", str(FIXTURES / "glue"),
                                    "--out", str(tmp_path / "torch"), "--split", "dev", "--task", "SST-2"])
    assert torch_run.exit_code == 0, torch_run.output
    onnx_run = runner.invoke(app, ["predict", "glue", "--model", str(model), "--data", str(FIXTURES / "glue"),
                                   "--out", str(tmp_path / "onnx"), "--split", "dev", "--task", "SST-2",
                                   "--engine", "onnxruntime"])
    assert onnx_run.exit_code == 0, onnx_run.output
    assert "engine onnxruntime at fp32: asked for" in onnx_run.output
    ours = json.loads((tmp_path / "torch" / "metrics.json").read_text())["splits"]["dev"]["metrics"]
    theirs = json.loads((tmp_path / "onnx" / "metrics.json").read_text())
    assert theirs["splits"]["dev"]["metrics"] == ours and theirs["engine"]["engine"] == "onnxruntime"
    assert (tmp_path / "torch" / "SST-2-dev.tsv").read_text() == (tmp_path / "onnx" / "SST-2-dev.tsv").read_text()


def test_predict_and_serve_take_the_engine(models: dict[str, Path], tmp_path: Path) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a gripping film\ndull\n", encoding="utf-8")
    runner = CliRunner()
    outs = {}
    for engine in ("torch", "onnxruntime", "auto"):
        out = tmp_path / f"{engine}.jsonl"
        result = runner.invoke(app, ["predict", "--model", str(models["classification"]), "--input", str(texts),
                                     "--out", str(out), "--no-progress", "--engine", engine])
        assert result.exit_code == 0, result.output
        if engine != "torch":  # the choice and its reason, said on stderr
            assert "engine onnxruntime at fp32: asked for" in result.output if engine == "onnxruntime" \
                else "table entry (fp32" in result.output
        outs[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    assert _same(outs["torch"], outs["onnxruntime"]) and _same(outs["torch"], outs["auto"])

    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from fastapi.testclient import TestClient

    from bertforge.serve.app import create_app

    with TestClient(create_app(models["classification"])) as client:
        expected = client.post("/classify", json={"texts": ["a gripping film", "dull"]}).json()
        vector = client.post("/embed", json={"text": "dull"}).json()["embedding"]
    with TestClient(create_app(models["classification"], engine="onnxruntime")) as client:
        health = client.get("/health").json()
        assert health["engine"]["engine"] == "onnxruntime" and health["engine"]["reason"].startswith("asked for")
        assert _same(client.post("/classify", json={"texts": ["a gripping film", "dull"]}).json(), expected)
        assert np.allclose(client.post("/embed", json={"text": "dull"}).json()["embedding"], vector, atol=TOLERANCE)
        service = client.app.state.service  # type: ignore[attr-defined]
        assert {pipe.engine.graph for pipe in service.pipelines.values()} == {"head", "embeddings"}


# ------------------------------------------------------------------------------------------------ auto


AVX2 = {"avx2", "fma"}
VNNI = {"avx2", "avx512f", "avx512_vnni"}
BF16 = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16"}
AMX = {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


def test_cpu_and_shape_classes() -> None:
    assert [engines.cpu_class(f) for f in (AVX2, VNNI, BF16, AMX, set())] == \
        ["avx2", "avx512_vnni", "avx512_bf16", "amx", "avx2"]
    assert engines.shape_class(1, 16) == "single-short" and engines.shape_class(1, 128) == "single-long"
    assert engines.shape_class(32, 16) == "batch"


def test_auto_follows_the_table_and_the_rules() -> None:
    table = {("fp32", "avx2", "batch"): ("onnxruntime", True), ("fp32", "avx512_vnni", "batch"): ("torch", True),
             ("int8", "avx512_vnni", "single-short"): ("onnxruntime", False)}
    choice = choose_engine("auto", "fp32", batch_size=32, flags=AVX2, table=table, available=True)
    assert (choice.engine, choice.source, choice.measured) == ("onnxruntime", "table", True)
    assert "(fp32, avx2, batch) -> onnxruntime (measured)" in choice.reason
    assert choose_engine("auto", "fp32", batch_size=32, flags=VNNI, table=table, available=True).engine == "torch"
    guess = choose_engine("auto", "int8", batch_size=1, max_length=16, flags=VNNI, table=table, available=True)
    assert guess.engine == "onnxruntime" and not guess.measured and "a guess, not yet measured" in guess.reason
    # bf16 runs on torch whatever the table says; auto precision is bf16 where the CPU has it natively
    bf16 = choose_engine("auto", "bf16", flags=BF16, table={("bf16", "avx512_bf16", "single-short"):
                                                            ("onnxruntime", True)}, available=True)
    assert (bf16.engine, bf16.precision, bf16.source) == ("torch", "bf16", "rule") and "bf16" in bf16.reason
    assert choose_engine("auto", "auto", flags=AMX, available=True).precision == "bf16"
    assert choose_engine("auto", "auto", flags=AMX, available=True).engine == "torch"
    assert choose_engine("auto", "auto", flags=VNNI, available=True).precision == "fp32"
    # what ONNX Runtime cannot run: torch, said why
    assert "saved int8" in choose_engine("auto", "fp32", saved_int8=True, flags=VNNI, available=True).reason
    assert choose_engine("auto", "fp32", flags=VNNI, available=False).engine == "torch"
    assert choose_engine("auto", "fp32", device="cuda", flags=VNNI, available=True).engine == "torch"
    # asked for by name: precision auto means fp32 there; what it cannot run is refused in one line
    assert choose_engine("onnxruntime", "auto", flags=BF16, available=True).precision == "fp32"
    for kwargs, words in [({"precision": "bf16"}, "no CPU bf16 path"), ({"precision": "fp32", "device": "cuda"},
                          "runs on the CPU"), ({"precision": "fp32", "saved_int8": True}, "saved int8 copy"),
                          ({"precision": "fp32", "available": False}, "pip install")]:
        with pytest.raises(EngineError, match=words) as caught:
            choose_engine("onnxruntime", flags=VNNI, **{"available": True, **kwargs})
        assert "\n" not in str(caught.value)
    with pytest.raises(EngineError, match="unknown engine"):
        choose_engine("tensorrt", "fp32")


def test_the_shipped_table_covers_every_class_and_keeps_bf16_off_it() -> None:
    for precision in ("fp32", "int8"):
        for cpu in ("amx", "avx512_bf16", "avx512_vnni", "avx2"):
            for shape in ("single-short", "single-long", "batch"):
                engine, measured = engines.ENGINE_TABLE[(precision, cpu, shape)]
                assert engine in ("torch", "onnxruntime") and isinstance(measured, bool)
    assert not any(key[0] == "bf16" for key in engines.ENGINE_TABLE)


def test_calibration_times_both_and_is_remembered(models: dict[str, Path]) -> None:
    from bertforge.model import load_any

    model, _ = load_any(models["embeddings"])
    choice, onnx = select_engine(model.eval(), "auto", "fp32", graph="embeddings", model_dir=models["embeddings"],
                                 batch_size=4, max_length=32, calibrate_engines=True)
    assert choice.source == "calibration" and set(choice.timings_ms) == {"torch", "onnxruntime"}
    assert "calibrated now at 4x32" in choice.reason and (onnx is not None) == (choice.engine == "onnxruntime")
    again, _ = select_engine(model, "auto", "fp32", graph="embeddings", model_dir=models["embeddings"],
                             batch_size=4, max_length=32, calibrate_engines=True)
    assert "calibrated earlier" in again.reason and again.timings_ms == choice.timings_ms
    assert (models["embeddings"] / engines.CACHE_FOLDER / "calibration.json").is_file()


# ------------------------------------------------------------------------------------------------ the cache


def test_the_cache_is_reused_and_made_again_when_the_weights_change(tmp_path: Path, tokenizer: BertTokenizer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = _save("classification", tmp_path, tokenizer, seed=5)
    first = pipeline(model_dir, engine="onnxruntime")
    entries = sorted((model_dir / engines.CACHE_FOLDER).iterdir())
    assert [e.name for e in entries if e.is_dir()] == [first.engine.path.parent.name]
    assert not any(e.name.endswith(".tmp") for e in entries)  # nothing half-written left behind

    import bertforge.export

    def no_export(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("exported again although the cache holds this graph")

    monkeypatch.setattr(bertforge.export, "export_onnx", no_export)
    again = pipeline(model_dir, engine="onnxruntime")
    assert again.engine.path == first.engine.path
    monkeypatch.undo()

    # new weights in the same directory: a new entry, the old one dropped, the new numbers served
    _save("classification", tmp_path, tokenizer, seed=6)
    changed = pipeline(model_dir, engine="onnxruntime")
    assert changed.engine.path != first.engine.path
    assert [e.name for e in (model_dir / engines.CACHE_FOLDER).iterdir() if e.is_dir()] == \
        [changed.engine.path.parent.name]
    reference = pipeline(model_dir)
    prepared = reference.prepare(["a gripping film"])
    assert _max_diff(reference.run(prepared.features), changed.run(prepared.features)) <= TOLERANCE


def test_a_read_only_model_dir_uses_the_user_cache(tmp_path: Path, tokenizer: BertTokenizer,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = _save("embeddings", tmp_path / "models", tokenizer, seed=7)
    monkeypatch.setenv(engines.CACHE_ENV, str(tmp_path / "user-cache"))
    pipe = pipeline(model_dir, engine="onnxruntime")
    assert pipe.engine.path.is_relative_to(tmp_path / "user-cache")
    assert not (model_dir / engines.CACHE_FOLDER).exists()


def test_session_threads_follow_torch(models: dict[str, Path]) -> None:
    pipe = pipeline(models["embeddings"], engine="onnxruntime")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        pipe(["dull"])
        assert pipe.engine._threads == 1
        torch.set_num_threads(2)
        pipe(["dull"])
        assert pipe.engine._threads == 2  # the session was made again with torch's new count
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------ refusals


def test_what_cannot_run_on_onnxruntime_is_one_line(models: dict[str, Path], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineError, match="cannot run this model: cannot export Linear"):
        OnnxEngine(torch.nn.Linear(2, 2))
    texts = tmp_path / "texts.txt"
    texts.write_text("a gripping film\n", encoding="utf-8")
    runner = CliRunner()

    def predict(*extra: str) -> Any:
        return runner.invoke(app, ["predict", "--model", str(models["classification"]), "--input", str(texts),
                                   "--out", str(tmp_path / "out.jsonl"), "--no-progress", *extra])

    bf16 = predict("--engine", "onnxruntime", "--precision", "bf16")
    assert bf16.exit_code == 2 and "no CPU bf16 path" in bf16.output and len(bf16.output.strip().splitlines()) == 1
    unknown = predict("--engine", "tvm")
    assert unknown.exit_code == 2 and "unknown engine 'tvm'" in unknown.output

    # an exporter failure (a head whose graph cannot be traced) is one line naming the way out
    import bertforge.export

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("Failed to export the model with torch.export.\nGuard on data-dependent expression\n"
                           + "frame " * 500)

    shutil.rmtree(models["classification"] / engines.CACHE_FOLDER, ignore_errors=True)
    monkeypatch.setattr(bertforge.export, "export_onnx", broken)
    failed = predict("--engine", "onnxruntime")
    lines = failed.output.strip().splitlines()
    assert failed.exit_code == 2 and len(lines) == 1, failed.output
    # both exporters tried, each failure in a few words
    assert "does not export to ONNX (torchscript: RuntimeError: Failed to export" in lines[0]
    assert "; dynamo: RuntimeError: Failed to export" in lines[0] and "--engine torch" in lines[0]
    assert len(lines[0]) < 600
    auto = predict("--engine", "auto")  # the table may pick torch here: either way no traceback
    assert auto.exit_code in (0, 2) and "Traceback" not in auto.output


def test_fill_mask_top_k_beyond_the_graphs_is_refused(models: dict[str, Path]) -> None:
    pipe = pipeline(models["fill-mask"], engine="onnxruntime")
    with pytest.raises(ValueError, match="at most 50 tokens"):
        pipe.run(pipe.prepare(["the [MASK] ."]).features, top_k=51)
