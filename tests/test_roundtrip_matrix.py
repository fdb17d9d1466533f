"""Every kind of directory bertforge writes, opened with the library it claims.

For each kind of output (a pre-trained model, a classifier with [CLS] or mean pooling, a SetFit
classifier, regression, multi-label, tagging, QA, multiple choice, a sentence-embedding model, an
ONNX export, an adapted model, a distilled sentence encoder) and a few families, the directory is made as a user makes it (`finetune`, the Python
API behind `bertforge finetune`), then:

- config.json's `architectures` names a transformers class: that class loads the directory and
  computes the same outputs as bertforge (1e-4);
- it names a class transformers does not have (a generic head, `...WithTaskHead`): transformers has
  nothing that would run it under another head, and where the card says setfit runs it,
  `SetFitModel.from_pretrained` gives bertforge's probabilities and `SentenceTransformer` the vector
  the head reads;
- a sentence-transformers directory (modules.json) encodes as `SentenceTransformer.encode` does.

Tiny random encoders (a WordPiece vocabulary of a few words, one or two layers) and one short epoch:
what is checked is that the files mean the same thing to both libraries, not the scores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge.finetune import finetune
from bertforge.model import load_any, registry
from bertforge.tokenizer import BertTokenizer
from tests.hub_server import loopback_hub_fixture  # noqa: F401  (the `loopback_hub` fixture)

transformers = pytest.importorskip("transformers")

FIXTURES = Path(__file__).parent / "fixtures"
TASKS = FIXTURES / "tasks"
QUIET = {"progress": False, "verbose": False, "epochs": 1, "batch_size": 4}
ATOL = 1e-4
CORPUS = [
    "the normans were a people who gave their name to normandy , a region in france .",
    "zurich is the largest city in switzerland ; its airport opened in 1948 .",
    "new york times reported that anna smith met bob in rome .",
    "a gripping , beautifully acted film with a terrible ending . not bad at all .",
    "what is the largest city ? when did the station open ? who gave their name ?",
    "a clever and moving film , dull and far too long , flat and far too slow .",
]
TEXTS = ["a gripping film", "dull and far too long", "zurich is the largest city in switzerland ."]
FAMILIES = ["bert", "roberta", "distilbert"]
# what each kind of directory is made by, and on which families (all: FAMILIES)
KINDS = {
    "pretrained": FAMILIES, "classify-cls": FAMILIES, "classify-mean": FAMILIES, "setfit": ["bert", "roberta"],
    "setfit-multi-label": ["bert"], "regression": FAMILIES, "multi-label": ["bert"], "bilstm": ["bert"],
    "tag": FAMILIES, "qa": FAMILIES, "multiple-choice": ["bert"], "embed": FAMILIES, "onnx": ["bert"],
    "adapted": FAMILIES, "distilled": ["bert"],
}
CASES = [pytest.param(kind, family, id=f"{kind}-{family}") for kind, families in KINDS.items() for family in families]


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The training files of each kind, small enough that one epoch is a few steps."""
    root = tmp_path_factory.mktemp("roundtrip-data")
    (root / "corpus.txt").write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    good, bad = ["gripping", "clever", "moving", "warm"], ["dull", "flat", "slow", "long"]
    rows = [(f"a {w} film", "positive") for w in good] + [(f"far too {w}", "negative") for w in bad]
    _write_csv(root / "classify.csv", ["text", "label"], rows)
    _write_csv(root / "regression.csv", ["text", "label"], [(t, str(i / 7)) for i, (t, _) in enumerate(rows)])
    multi = [{"text": t, "labels": [label, "short"] if i % 2 else [label]} for i, (t, label) in enumerate(rows)]
    (root / "multi.jsonl").write_text("".join(json.dumps(r) + "\n" for r in multi), encoding="utf-8")
    pairs = [{"sentence1": a, "sentence2": b, "score": float(x == y)}
             for a, x in rows[::3] for b, y in rows[1::3]]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs), encoding="utf-8")
    tagged, swag = root / "tagged.txt", root / "swag"
    shutil.copy(TASKS / "conll" / "without_docstart.txt", tagged)
    swag.mkdir()
    for name in ("train.jsonl", "val.jsonl", "test.jsonl"):
        shutil.copy(TASKS / "swag" / "sample.jsonl", swag / name)
    return {"root": root, "corpus": root / "corpus.txt", "classify": root / "classify.csv",
            "regression": root / "regression.csv", "multi": root / "multi.jsonl", "pairs": root / "pairs.jsonl",
            "tagged": tagged, "swag": swag, "squad": TASKS / "squad" / "v2.json"}


def _write_csv(path: Path, header: list[str], rows: list[tuple[str, str]]) -> None:
    path.write_text("\n".join([",".join(header), *(",".join(row) for row in rows)]) + "\n", encoding="utf-8")


_encoders: dict[str, Path] = {}  # one random encoder per family, for the whole module


def _encoder(family: str, files: dict[str, Path], root: Path) -> Path:
    """A random bare encoder of `family`, two layers of its smallest preset, with a WordPiece vocabulary."""
    if family not in _encoders:
        tokenizer = BertTokenizer.train([files["corpus"]], vocab_size=200, min_frequency=1, show_progress=False)
        configs = [registry.from_preset(name, vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                                        num_hidden_layers=2) for name in registry.family(family).presets]
        config = min(configs, key=lambda c: c.estimated_parameter_count())
        torch.manual_seed(0)
        directory = root / f"encoder-{family}"
        registry.model_class(family, "embeddings")(config).save_pretrained(directory, tokenizer=tokenizer)
        _encoders[family] = directory
    return _encoders[family]


def _make(kind: str, family: str, files: dict[str, Path], encoder: Path, out: Path) -> Path:
    """The directory of `kind`, made as a user makes it."""
    own = {"dev": None}

    def tune(task_family: str, task: str | None, data: Path | None = None, **settings: Any) -> Path:
        finetune(task_family, task, encoder, data, out, **{**QUIET, **settings})
        return out / "seed-1"

    classify = {"train": str(files["classify"]), "dev": str(files["classify"])}
    if kind == "pretrained":  # what `bertforge pretrain` saves: the family's pre-training model
        tokenizer = BertTokenizer.from_pretrained(encoder)
        job = "pretraining" if family == "bert" else "masked-lm"
        torch.manual_seed(1)
        model = registry.model_class(family, job)(load_any(encoder)[0].config)
        model.save_pretrained(out, tokenizer=tokenizer)
        return out
    if kind in ("classify-cls", "onnx"):
        seed = tune("classify", None, max_length=24, task_settings=classify)
        if kind == "onnx":
            from bertforge.export import export_onnx

            export_onnx(seed, out / "model.onnx", check=False)
        return seed
    if kind == "classify-mean":
        return tune("classify", None, max_length=24, pooling="mean", task_settings=classify)
    if kind == "bilstm":
        return tune("classify", None, max_length=24, head="bilstm", task_settings=classify)
    if kind == "setfit":
        return tune("classify", None, max_length=24, method="setfit", task_settings=classify)
    if kind == "setfit-multi-label":
        return tune("classify", None, max_length=24, method="setfit",
                    task_settings={"train": str(files["multi"]), "dev": str(files["multi"]), "label_column": "labels"})
    if kind == "regression":
        return tune("classify", None, max_length=24, task_settings={
            "train": str(files["regression"]), "dev": str(files["regression"]), "problem_type": "regression"})
    if kind == "multi-label":
        return tune("classify", None, max_length=24, task_settings={
            "train": str(files["multi"]), "dev": str(files["multi"]), "label_column": "labels"})
    if kind == "tag":
        return tune("tag", "tag", max_length=16, task_settings={"train": str(files["tagged"]), **own,
                                                                "dev": str(files["tagged"])})
    if kind == "qa":
        return tune("qa", "qa", max_length=48, task_settings={"train": str(files["squad"]), "dev": str(files["squad"]),
                                                              "doc_stride": 16})
    if kind == "multiple-choice":
        return tune("swag", "swag", files["swag"], max_length=24)
    if kind == "embed":
        return tune("embed", None, max_length=24, task_settings={"train": str(files["pairs"]),
                                                                 "dev": str(files["pairs"]), "loss": "cosine"})
    if kind == "adapted":  # `bertforge adapt`: continued masked-LM training of a pre-trained model
        from bertforge.adapt import adapt

        start = _make("pretrained", family, files, encoder, out / "start")
        return adapt(start, files["corpus"], out / "run", max_steps=2, lr=1e-3, progress=False,
                     max_seq_length=24, batch_size=4, validation_fraction=0.1).final
    if kind == "distilled":  # `bertforge distill sentences`: a smaller student of the encoder's vectors
        from bertforge.distill import build_recipe, distill

        student = out / "student.json"
        out.mkdir(parents=True)
        student.write_text(json.dumps({"model_type": family, "hidden_size": 16, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "intermediate_size": 32,
                                       "max_position_embeddings": 64}), encoding="utf-8")
        options = {"teacher": str(encoder), "student": str(student), "tokenizer": str(encoder),
                   "data": str(files["corpus"]), "max_length": 24, "batch_size": 8, "max_steps": 3,
                   "progress": False, "heldout_texts": 5}
        distill(build_recipe("sentences", options=options), out / "run", verbose=False)
        return out / "run" / "final"
    raise AssertionError(kind)


# ------------------------------------------------------------------------------------------------
# inputs and outputs on both sides
# ------------------------------------------------------------------------------------------------
def _batch(directory: Path, texts: list[str], choices: int = 0) -> dict[str, torch.Tensor]:
    """bertforge's ids of `texts`, padded ((B, T), or (B / choices, choices, T) for multiple choice)."""
    tokenizer = BertTokenizer.from_pretrained(directory)
    encoded = tokenizer.encode_batch(texts, max_length=24, truncation=True)
    width = max(len(ids) for ids in encoded["input_ids"])
    ids = torch.full((len(texts), width), tokenizer.pad_token_id)
    mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, (piece_ids, type_ids) in enumerate(zip(encoded["input_ids"], encoded["token_type_ids"], strict=True)):
        ids[row, :len(piece_ids)], mask[row, :len(piece_ids)] = torch.tensor(piece_ids), 1
        types[row, :len(type_ids)] = torch.tensor(type_ids)
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if choices:
        batch = {name: tensor.view(-1, choices, width) for name, tensor in batch.items()}
    return batch


def _ours(directory: Path, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    model, _ = load_any(directory)
    with torch.no_grad():
        out = model.eval()(**batch)
    names = {"mlm_logits": "prediction_logits", "nsp_logits": "seq_relationship_logits"}
    found = {names.get(name, name): getattr(out, name, None) for name in
             ("logits", "start_logits", "end_logits", "mlm_logits", "nsp_logits", "last_hidden_state")}
    if found["seq_relationship_logits"] is None:  # a masked LM alone: transformers calls its scores logits
        found["logits"] = found["logits"] if found["prediction_logits"] is None else found["prediction_logits"]
        found["prediction_logits"] = None
    return {name: value.float().numpy() for name, value in found.items() if value is not None}


def _theirs(directory: Path, architecture: str, batch: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    import inspect

    model = getattr(transformers, architecture).from_pretrained(str(directory)).eval()
    accepted = inspect.signature(model.forward).parameters
    with torch.no_grad():
        out = model(**{name: tensor for name, tensor in batch.items() if name in accepted})
    names = ("logits", "start_logits", "end_logits", "prediction_logits", "seq_relationship_logits",
             "last_hidden_state")
    return {name: out[name].float().numpy() for name in names if out.get(name) is not None}


def _config(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "config.json").read_text(encoding="utf-8"))


def _assert_close(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], mask: np.ndarray) -> None:
    assert ours.keys() == theirs.keys() and ours, (sorted(ours), sorted(theirs))
    for name, value in ours.items():
        other = theirs[name]
        assert value.shape == other.shape, (name, value.shape, other.shape)
        if value.shape[:2] == mask.shape:  # an output per position: the real ones (padding is masked differently)
            value, other = value[mask.astype(bool)], other[mask.astype(bool)]
        gap = float(np.abs(value - other).max())
        assert gap <= ATOL, f"{name}: bertforge and transformers differ by {gap:.2e}"


# ------------------------------------------------------------------------------------------------
# the matrix
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("kind", "family"), CASES)
def test_the_library_a_directory_claims_reads_what_bertforge_reads(kind: str, family: str, files: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    encoder = _encoder(family, files, files["root"])
    directory = _make(kind, family, files, encoder, tmp_path / kind)
    architecture = _config(directory)["architectures"][0]
    if kind == "onnx":
        _check_onnx(directory, tmp_path / kind / "model.onnx")
    elif kind == "embed" or (directory / "modules.json").is_file() and kind != "setfit" and "task_head" not in _config(directory):
        _check_sentence_transformers(directory)
    if hasattr(transformers, architecture):  # transformers' own class: it must compute what bertforge does
        assert kind not in ("classify-mean", "setfit", "setfit-multi-label", "bilstm"), architecture
        batch = _batch(directory, TEXTS * 2, choices=2 if kind == "multiple-choice" else 0)
        _assert_close(_ours(directory, batch), _theirs(directory, architecture, batch),
                      batch["attention_mask"].numpy())
        return
    # a generic head: no transformers class of that name, so nothing runs another head in its place
    assert architecture.endswith("WithTaskHead") and "task_head" in _config(directory), architecture
    card = (directory / "README.md").read_text(encoding="utf-8")
    if kind == "bilstm":
        assert 'library_name: "bertforge"' in card and not (directory / "model_head.pkl").exists()
        return
    assert 'library_name: "setfit"' in card
    _check_setfit(directory, multi_label="multi-label" in kind)


def _check_setfit(directory: Path, multi_label: bool) -> None:
    """SetFitModel gives bertforge's probabilities, and SentenceTransformer the vector its head reads."""
    setfit = pytest.importorskip("setfit")
    st = pytest.importorskip("sentence_transformers")
    from bertforge import pipeline

    theirs = setfit.SetFitModel.from_pretrained(str(directory), device="cpu")
    probabilities = np.asarray(theirs.predict_proba(TEXTS, as_numpy=True), dtype=np.float64)
    batch = _batch(directory, TEXTS)
    logits = torch.as_tensor(_ours(directory, batch)["logits"], dtype=torch.float64)
    ours = torch.sigmoid(logits) if multi_label else torch.softmax(logits, dim=-1)
    assert probabilities.shape == ours.shape
    assert float(np.abs(probabilities - ours.numpy()).max()) <= ATOL
    if not multi_label:  # the labels by name, as bertforge's pipeline answers them
        assert theirs.predict(TEXTS) == [row["label"] for row in pipeline(directory)(TEXTS)]
    model, _ = load_any(directory)
    with torch.no_grad():
        hidden = model.eval().base_model(batch["input_ids"], batch["attention_mask"]).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    vectors = (hidden * mask).sum(1) / mask.sum(1)  # the mean of the real tokens' vectors: what the head reads
    if _config(directory)["task_head"]["normalize"]:
        vectors = torch.nn.functional.normalize(vectors, dim=-1)
    encoded = st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert float(np.abs(encoded - vectors.numpy()).max()) <= ATOL


def _check_sentence_transformers(directory: Path) -> None:
    st = pytest.importorskip("sentence_transformers")
    from bertforge import pipeline

    theirs = st.SentenceTransformer(str(directory), device="cpu").encode(TEXTS, convert_to_numpy=True)
    ours = np.array([row["embedding"] for row in pipeline(directory, "embeddings")(TEXTS)])
    assert float(np.abs(theirs - ours).max()) <= ATOL


def _check_onnx(directory: Path, graph: Path) -> None:
    """ONNX Runtime runs the exported classifier to bertforge's logits."""
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    batch = _batch(directory, TEXTS)
    wanted = {i.name for i in session.get_inputs()}
    logits = session.run(None, {name: tensor.numpy() for name, tensor in batch.items() if name in wanted})[0]
    gap = float(np.abs(logits - _ours(directory, batch)["logits"]).max())
    assert gap <= ATOL, f"ONNX Runtime and bertforge differ by {gap:.2e}"


def test_transformers_sees_no_classifier_in_a_mean_pooled_directory(files: dict[str, Path], tmp_path: Path) -> None:
    """The directory that transformers used to load under a fresh [CLS] head: its Auto class finds no
    weights of its own classifier (it says so in its load report), and config.json names none."""
    directory = _make("classify-mean", "bert", files, _encoder("bert", files, files["root"]), tmp_path / "mean")
    assert not hasattr(transformers, _config(directory)["architectures"][0])
    _, info = transformers.AutoModelForSequenceClassification.from_pretrained(str(directory),
                                                                              output_loading_info=True)
    assert {"classifier.weight", "classifier.bias"} <= set(info["missing_keys"])


def test_a_pushed_setfit_directory_loads_by_name_in_setfit(loopback_hub: Any, files: dict[str, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`bertforge push` uploads setfit's head and labels with the rest: setfit, given the repository's
    name, runs the classifier as trained rather than a random head."""
    setfit = pytest.importorskip("setfit")
    from bertforge.modelcard import push_model
    from tests.hub_server import set_hub_offline

    directory = _make("classify-mean", "bert", files, _encoder("bert", files, files["root"]), tmp_path / "mean")
    monkeypatch.setenv("HF_TOKEN", loopback_hub.token)
    set_hub_offline(monkeypatch, False)
    push_model(directory, "me/mean-pooled")
    assert {"model_head.pkl", "config_setfit.json", "modules.json"} <= set(loopback_hub.files("me/mean-pooled"))
    theirs = setfit.SetFitModel.from_pretrained("me/mean-pooled", device="cpu").predict_proba(TEXTS, as_numpy=True)
    logits = torch.as_tensor(_ours(directory, _batch(directory, TEXTS))["logits"], dtype=torch.float64)
    assert float(np.abs(np.asarray(theirs) - torch.softmax(logits, -1).numpy()).max()) <= ATOL


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["setfit", "classify-mean", "embed"])
def test_an_int8_copy_is_refused_by_the_libraries_that_cannot_run_it(kind: str, files: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """An int8 copy (`bertforge quantize`) keeps its sentence-transformers files for bertforge, but its
    weights are torchao's int8 layout: sentence-transformers and setfit refuse it rather than run the
    encoder (or the head) with fresh weights; bertforge runs it."""
    from typer.testing import CliRunner

    from bertforge.cli import app

    directory = _make(kind, "bert", files, _encoder("bert", files, files["root"]), tmp_path / kind)
    copy = tmp_path / "int8"
    result = CliRunner().invoke(app, ["quantize", "--model", str(directory), "--out", str(copy)])
    assert result.exit_code == 0, result.output
    st = pytest.importorskip("sentence_transformers")
    with pytest.raises((OSError, ValueError, RuntimeError)):
        st.SentenceTransformer(str(copy), device="cpu")
    if kind != "embed":
        setfit = pytest.importorskip("setfit")
        with pytest.raises((OSError, ValueError, RuntimeError)):
            setfit.SetFitModel.from_pretrained(str(copy), device="cpu")
    with pytest.raises((OSError, ValueError)):
        transformers.AutoModel.from_pretrained(str(copy))
