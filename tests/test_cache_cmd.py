"""`bertforge cache` lists what bertforge keeps outside run directories with sizes, and `cache clear`
removes it: bertforge's own caches by default, the shared Hugging Face download cache only when named."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge import pipeline
from bertforge.cli import app
from bertforge.engine import CACHE_ENV, CACHE_FOLDER
from tests.tiny_models import save_tiny_encoder

runner = CliRunner()


def du_bytes(path: Path) -> int:
    """Bytes of the regular files under `path`, each inode once: what `du -b` counts."""
    inodes = {(p.lstat().st_dev, p.lstat().st_ino): p.lstat().st_size for p in path.rglob("*")
              if p.is_file() and not p.is_symlink()}
    return sum(inodes.values())


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Every cache in `tmp_path`: an ONNX export in the user cache, one beside a model, files in the
    Hub cache (a blob and the snapshot's symlink to it, as huggingface_hub lays them out) and a derived
    data set file."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.delenv(CACHE_ENV, raising=False)  # the first export goes beside its model
    (tmp_path / "models").mkdir()
    model = save_tiny_encoder(tmp_path / "models", "a great film really dull")
    beside = tmp_path / "runs" / "seed-1"
    shutil.copytree(model, beside)
    pipeline(beside, task="embeddings", engine="onnxruntime")(["a great film"])  # MODEL/.bertforge-onnx
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "onnx-cache"))
    pipeline(model, task="embeddings", engine="onnxruntime")(["a great film"])  # the user cache
    blob = home / "hub" / "models--org--tiny" / "blobs" / "abc123"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"w" * 5000)
    snapshot = home / "hub" / "models--org--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to(blob)
    derived = home / "bertforge" / "datasets" / "org--reviews" / "main" / "train.jsonl"
    derived.parent.mkdir(parents=True)
    derived.write_text('{"text": "a row"}\n', encoding="utf-8")
    return {"onnx": tmp_path / "onnx-cache", "model-onnx": beside / CACHE_FOLDER, "hub": home / "hub",
            "datasets": home / "bertforge" / "datasets", "runs": tmp_path / "runs"}


def listed(output: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in output.splitlines()[1:] if line.split()}


def test_the_plain_command_lists_each_cache_with_its_size(caches: dict[str, Path]) -> None:
    from bertforge.caches import human_size

    result = runner.invoke(app, ["cache", "list", "--under", str(caches["runs"])])
    assert result.exit_code == 0, result.output
    rows = listed(result.output)
    for kind in ("onnx", "model-onnx", "hub", "datasets"):
        assert str(caches[kind]) in result.output
        assert " ".join(rows[kind][1:3]) == human_size(du_bytes(caches[kind])), (kind, result.output)
    assert rows["hub"][1:3] == ["5.0", "kB"]  # the blob once: the snapshot's symlink adds nothing
    assert du_bytes(caches["onnx"]) > 10_000 and int(rows["onnx"][3]) == sum(
        1 for p in caches["onnx"].rglob("*") if p.is_file())
    total = sum(du_bytes(caches[kind]) for kind in ("onnx", "model-onnx", "hub", "datasets"))
    assert " ".join(rows["total"][1:3]) == human_size(total)
    plain = runner.invoke(app, ["cache"])  # no subcommand: the same list, without the folders under runs
    assert plain.exit_code == 0 and "model-onnx" not in listed(plain.output) and "total" in plain.output


def test_clear_removes_bertforge_caches_and_keeps_the_shared_one(caches: dict[str, Path]) -> None:
    refused = runner.invoke(app, ["cache", "clear"], input="n\n")  # asks first
    assert refused.exit_code == 2 and caches["onnx"].is_dir() and caches["datasets"].is_dir()
    cleared = runner.invoke(app, ["cache", "clear", "--under", str(caches["runs"]), "--yes"])
    assert cleared.exit_code == 0, cleared.output
    assert not caches["onnx"].exists() and not caches["datasets"].exists() and not caches["model-onnx"].exists()
    assert (caches["runs"] / "seed-1" / "model.safetensors").is_file()  # the model beside its cache stays
    assert caches["hub"].is_dir()  # transformers' and datasets' downloads too, unless named
    hub = runner.invoke(app, ["cache", "clear", "--what", "hub", "--yes"])
    assert hub.exit_code == 0 and not caches["hub"].exists()
    assert runner.invoke(app, ["cache", "clear", "--yes"]).output.strip() == "nothing to clear"
    again = pipeline(caches["runs"] / "seed-1", task="embeddings", engine="onnxruntime")
    assert again(["a great film"]) is not None and any(caches["onnx"].iterdir())  # made again when needed


def test_an_unknown_cache_is_refused(caches: dict[str, Path]) -> None:
    result = runner.invoke(app, ["cache", "clear", "--what", "onnx-models", "--yes"])
    assert result.exit_code == 2 and "the caches are onnx, datasets, hub, model-onnx" in result.output
    assert caches["onnx"].is_dir() and os.listdir(caches["onnx"])
