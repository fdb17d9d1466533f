"""Models by name (`org/name`, `name`, `org/name@revision`) through a loopback Hugging Face Hub: the
same loaders, pipeline, predict and finetune that read directories, with only the needed files
fetched, pickle-only and custom-code repositories refused, and the cache used offline with no request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from bertforge import BertConfig, BertForSequenceClassification, BertModel, BertTokenizer
from bertforge.checkpoint import CheckpointError
from bertforge.cli import app
from bertforge.hub import HubModelError, is_hub_name, resolve_model, split_revision
from bertforge.model.base import label_names_of, set_labels
from bertforge.pipeline import pipeline
from tests.hub_server import loopback_hub_fixture, set_hub_offline, use_loopback_hub  # noqa: F401  (the `loopback_hub` fixture)

WORDS = "a gripping film warm and bright dull slow flat story the acting ending"


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A bare encoder and a two-label classifier, saved as Hugging Face directories."""
    root = tmp_path_factory.mktemp("hub-models")
    corpus = root / "corpus.txt"
    corpus.write_text((WORDS + "\n") * 5, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=60, min_frequency=1, show_progress=False)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    BertForSequenceClassification(set_labels(config, ["negative", "positive"])).save_pretrained(
        root / "classifier", tokenizer=tokenizer)
    return {"encoder": root / "encoder", "classifier": root / "classifier"}


def test_what_counts_as_a_name() -> None:
    assert is_hub_name("bert-base-uncased") and is_hub_name("org/name") and is_hub_name("org/name@v1")
    for path in ("./org/name", "/abs/dir", "~/models/x", "runs/reviews/seed-1", "a/b/c@v1"):
        assert not is_hub_name(path), path
    assert split_revision("org/name@refs/pr/1") == ("org/name", "refs/pr/1")
    with pytest.raises(HubModelError, match="given twice"):
        split_revision("org/name@v1", "v2")


def test_a_model_by_name_loads_like_its_directory(loopback_hub, checkpoints: dict[str, Path]) -> None:
    files = _files(checkpoints["encoder"]) | {"pytorch_model.bin": b"never fetched", "README.md": b"# card"}
    loopback_hub.commit("org/tiny-bert", files)
    loaded = BertModel.from_pretrained("org/tiny-bert")
    local = BertModel.from_pretrained(checkpoints["encoder"])
    for (name, ours), (_, theirs) in zip(loaded.state_dict().items(), local.state_dict().items(), strict=True):
        assert torch.equal(ours, theirs), name
    assert BertTokenizer.from_pretrained("org/tiny-bert").vocab_size == BertTokenizer.from_pretrained(
        checkpoints["encoder"]).vocab_size
    fetched = {path.rsplit("/", 1)[-1] for path in loopback_hub.downloads()}
    assert "pytorch_model.bin" not in fetched and "README.md" not in fetched  # only what bertforge reads
    assert {"config.json", "model.safetensors", "vocab.txt"} <= fetched


def test_revisions_and_offline_cache(loopback_hub, checkpoints: dict[str, Path], monkeypatch) -> None:
    first = loopback_hub.commit("org/clf", _files(checkpoints["classifier"]))
    loopback_hub.tag("org/clf", "v1", first)
    changed = json.loads((checkpoints["classifier"] / "config.json").read_text())
    changed["id2label"] = {"0": "bad", "1": "good"}
    changed["label2id"] = {"bad": 0, "good": 1}
    second = loopback_hub.commit("org/clf", {"config.json": json.dumps(changed).encode()})
    assert resolve_model("org/clf").commit == second
    old = resolve_model("org/clf@v1")
    assert old.commit == first and old.provenance() == {"repo_id": "org/clf", "revision": "v1", "commit": first}
    assert pipeline("org/clf@v1")(["a gripping film"])[0]["label"] in ("negative", "positive")
    assert pipeline("org/clf")(["a gripping film"])[0]["label"] in ("bad", "good")
    assert resolve_model(f"org/clf@{first}").path == old.path

    loopback_hub.clear_requests()
    set_hub_offline(monkeypatch)
    assert pipeline("org/clf@v1")(["dull and slow"])[0]["label"] in ("negative", "positive")
    assert loopback_hub.requests == []  # the cache answers, nothing is asked
    with pytest.raises(HubModelError, match="not in the local cache"):
        resolve_model("org/never-downloaded")


def test_refusals_fetch_nothing(loopback_hub, checkpoints: dict[str, Path]) -> None:
    config = (checkpoints["encoder"] / "config.json").read_bytes()
    loopback_hub.commit("org/pickle-only", {"config.json": config, "pytorch_model.bin": b"\x80\x04pickle"})
    with pytest.raises(HubModelError, match=r"only pickle weights .* refs/pr/N"):
        BertModel.from_pretrained("org/pickle-only")
    assert not [p for p in loopback_hub.downloads() if p.endswith(".bin")]

    custom = json.loads(config) | {"auto_map": {"AutoModel": "modeling_mine.MyModel"}}
    loopback_hub.commit("org/custom", _files(checkpoints["encoder"]) | {"config.json": json.dumps(custom).encode()})
    with pytest.raises(HubModelError, match="own code"):
        BertModel.from_pretrained("org/custom")
    with pytest.raises(HubModelError, match="no such model on the Hub"):
        BertModel.from_pretrained("org/missing")
    with pytest.raises(HubModelError, match="no revision"):
        BertModel.from_pretrained("org/custom@no-such-branch")
    loopback_hub.clear_requests()
    with pytest.raises(CheckpointError, match="not a directory"):
        BertModel.from_pretrained("./org/tiny-bert")  # a path: never sent to the Hub
    assert loopback_hub.requests == []


def test_an_unreachable_hub_is_one_line(loopback_hub) -> None:
    loopback_hub.stop()  # nothing listens there any more: the connection is refused
    with pytest.raises(HubModelError, match="no such local directory, and the Hub cannot be reached"):
        BertModel.from_pretrained("runs/typo")


def test_commands_take_names(loopback_hub, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    loopback_hub.commit("org/clf", _files(checkpoints["classifier"]))
    loopback_hub.commit("org/encoder", _files(checkpoints["encoder"]))
    texts = tmp_path / "texts.txt"
    texts.write_text("a gripping film\ndull and slow\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["predict", "--model", "org/clf", "--input", str(texts), "--out",
                                 str(tmp_path / "p.jsonl"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 2
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a gripping film,positive\ndull and slow,negative\n" * 6, encoding="utf-8")
    result = runner.invoke(app, ["finetune", "classify", "--model", "org/encoder", "--train", str(train), "--out",
                                 str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "4", "--max-length", "16"])
    assert result.exit_code == 0, result.output
    source = json.loads((tmp_path / "ft" / "results.json").read_text())["model_source"]
    assert source == {"repo_id": "org/encoder", "revision": None, "commit": loopback_hub.head("org/encoder")}
    shown = runner.invoke(app, ["inspect", "org/encoder"])  # a command that reads the directory's files itself
    assert shown.exit_code == 0 and "parameters" in shown.output.lower(), shown.output
    missing = runner.invoke(app, ["predict", "--model", "org/none", "--input", str(texts), "--out",
                                  str(tmp_path / "q.jsonl")])
    assert missing.exit_code == 2 and "no such model on the Hub" in " ".join(missing.output.split())


def test_revision_option_and_a_changed_commit(loopback_hub, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    first = loopback_hub.commit("org/clf", _files(checkpoints["classifier"]))
    loopback_hub.tag("org/clf", "v1", first)
    changed = json.loads((checkpoints["classifier"] / "config.json").read_text())
    changed["id2label"], changed["label2id"] = {"0": "bad", "1": "good"}, {"bad": 0, "good": 1}
    loopback_hub.commit("org/clf", {"config.json": json.dumps(changed).encode()})
    texts = tmp_path / "texts.txt"
    texts.write_text("a gripping film\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["predict", "--model", "org/clf", "--revision", "v1", "--input", str(texts),
                                 "--out", str(tmp_path / "p.jsonl"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.jsonl").read_text())["label"] in ("negative", "positive")
    twice = runner.invoke(app, ["inspect", "org/clf@v1", "--revision", "main"])
    assert twice.exit_code == 2 and "given twice" in twice.output
    local = runner.invoke(app, ["inspect", str(checkpoints["classifier"]), "--revision", "v1"])
    assert local.exit_code == 2 and "local directory" in local.output

    encoder = loopback_hub.commit("org/encoder", _files(checkpoints["encoder"]))
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a gripping film,positive\ndull and slow,negative\n" * 6, encoding="utf-8")
    args = ["finetune", "classify", "--model", "org/encoder", "--train", str(train), "--out", str(tmp_path / "ft"),
            "--epochs", "1", "--batch-size", "4", "--max-length", "16"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run_config = (tmp_path / "ft" / "run_config.yaml").read_text()
    assert "model: org/encoder\n" in run_config and f"commit: {encoder}" in run_config
    pinned_args = [str(tmp_path / "pinned") if a == str(tmp_path / "ft") else a for a in args]
    pinned = runner.invoke(app, [*pinned_args, "--revision", encoder])
    assert pinned.exit_code == 0, pinned.output
    assert f"model: org/encoder@{encoder}" in (tmp_path / "pinned" / "run_config.yaml").read_text()
    torch.manual_seed(1)
    BertModel(BertModel.from_pretrained(checkpoints["encoder"]).config).save_pretrained(tmp_path / "retrained")
    loopback_hub.commit("org/encoder", {"model.safetensors": (tmp_path / "retrained" / "model.safetensors").read_bytes()})
    refused = runner.invoke(app, args)  # the name now resolves to another commit: other weights
    assert refused.exit_code == 2 and "model" in refused.output and "other" in refused.output, refused.output


def test_model_card_and_push(loopback_hub, checkpoints: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub
    import yaml

    loopback_hub.commit("org/encoder", _files(checkpoints["encoder"]))
    train = tmp_path / "train.csv"
    train.write_text("text,label\n" + "a gripping film,positive\ndull and slow,negative\n" * 6, encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["finetune", "classify", "--model", "org/encoder", "--train", str(train), "--out",
                                 str(tmp_path / "ft"), "--epochs", "1", "--batch-size", "4", "--max-length", "16"])
    assert result.exit_code == 0, result.output
    seed = tmp_path / "ft" / "seed-1"
    card = (seed / "README.md").read_text()
    meta = yaml.safe_load(card.split("---")[1])
    assert meta["library_name"] == "transformers" and "bertforge" in meta["tags"]
    assert meta["pipeline_tag"] == "text-classification" and meta["base_model"] == "org/encoder"
    scores = meta["model-index"][0]["results"][0]["metrics"]
    assert {m["type"] for m in scores} >= {"accuracy", "macro_f1"}
    assert loopback_hub.head("org/encoder") in card  # the base model's resolved commit

    monkeypatch.setenv("HF_TOKEN", loopback_hub.token)
    (seed / "run" / "checkpoints").mkdir(parents=True, exist_ok=True)
    (seed / "run" / "checkpoints" / "state.pt").write_bytes(b"optimizer state, not for the Hub")
    pushed = runner.invoke(app, ["push", str(seed), "me/reviews"])
    assert pushed.exit_code == 0, pushed.output
    assert "me/reviews" in pushed.output and "(private)" in pushed.output
    uploaded = set(loopback_hub.files("me/reviews"))
    assert {"config.json", "model.safetensors", "README.md", "task.json", "vocab.txt"} <= uploaded
    assert not [name for name in uploaded if name.startswith("run/") or name.endswith((".png", ".jsonl", ".csv"))]
    assert (seed / "confusion-dev.png").is_file() or list(seed.glob("predictions*"))  # there, and left out
    loaded = BertForSequenceClassification.from_pretrained("me/reviews")  # by name, with the token
    assert label_names_of(loaded) == ["negative", "positive"]
    assert huggingface_hub.ModelCard.load(seed / "README.md").data.library_name == "transformers"
    texts = ["a gripping film", "dull and slow", "the acting"]
    here = pipeline(seed)(texts, top_k=None)
    use_loopback_hub(loopback_hub, tmp_path / "another-cache", monkeypatch)  # a user elsewhere, empty cache
    monkeypatch.setenv("HF_TOKEN", loopback_hub.token)
    there = pipeline("me/reviews")(texts, top_k=None)
    assert [[(d["label"], round(d["score"], 6)) for d in row] for row in there] == \
        [[(d["label"], round(d["score"], 6)) for d in row] for row in here]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size < 50_000_000]
    assert not [p for p in written if loopback_hub.token.encode() in p.read_bytes()]  # the token is in no file
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(huggingface_hub.errors.RepositoryNotFoundError):  # private: not without the token
        huggingface_hub.model_info("me/reviews", token=False)
