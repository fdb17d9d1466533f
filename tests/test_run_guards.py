"""What a run directory guarantees: a resume under other settings or inputs is refused, one run at a time
holds a directory, fine-tuning resumes bit-exactly from mid-run checkpoints, and a newest checkpoint that
does not load is skipped for the one before it.

The interrupted runs are real processes: `CHILD` below runs the command line in a subprocess whose
checkpoint publishing (`bertforge.train.state._publish`, patched in that process only) SIGKILLs the
process right after the named checkpoint is in place ("kill"), or writes a marker file and sleeps
there so that the test can try a second run on the same directory and then kill it (a marker path).
Nothing in the package knows about this. Fine-tuning runs a random one-layer BERT on a few hundred
SST-2-like rows generated here; pre-training uses the shards of tests/test_pretrain.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.fileio import LOCK_FILE, RunLockedError, run_lock
from bertforge.train import OptimConfig, latest_checkpoint, list_checkpoints, read_metrics, train
from bertforge.train.rundir import RECORD_FILE
from test_pretrain import SMALL, shards  # noqa: F401  (the module's shards fixture)
from test_train import SyntheticBatches, run_config, tiny_model

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from pathlib import Path

    import bertforge.train.state as state

    mode, at = sys.argv[1], sys.argv[2]
    publish = state._publish

    def publish_then_stop(tmp, final):
        publish(tmp, final)
        if final.name == at:
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            Path(mode).write_text(str(os.getpid()))  # mode is the marker's path: hold the run here
            time.sleep(300)

    state._publish = publish_then_stop
    from bertforge.cli import app
    app(sys.argv[3:], prog_name="bertforge")
""")

POSITIVE = ["gripping", "moving", "clever", "beautiful", "warm", "funny", "tender", "bold"]
NEGATIVE = ["dull", "slow", "flat", "tedious", "messy", "bland", "clumsy", "stale"]
NOUNS = ["film", "story", "cast", "ending", "script", "movie"]


def _rows(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(["positive", "negative"])
        words = POSITIVE if label == "positive" else NEGATIVE
        rows.append((f"a {rng.choice(words)} and {rng.choice(words)} {rng.choice(NOUNS)}", label))
    return rows


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def sst(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random one-layer encoder and 208 training / 40 dev rows: 13 steps of 16 per epoch."""
    root = tmp_path_factory.mktemp("sst")
    train_rows, dev_rows = _rows(208, seed=1), _rows(40, seed=2)
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(text for text, _ in train_rows + dev_rows) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=120, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(root / "encoder", tokenizer=tokenizer)
    return {"model": root / "encoder", "train": _write_csv(root / "train.csv", train_rows),
            "dev": _write_csv(root / "dev.csv", dev_rows)}


def _finetune_args(sst: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["finetune", "classify", "--model", str(sst["model"]), "--train", str(sst["train"]), "--dev",
            str(sst["dev"]), "--out", str(out), "--epochs", "2", "--batch-size", "16", "--max-length", "16",
            "--lr", "1e-4", *extra]


def _start_child(args: list[str], mode: str, at: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, mode, at, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _killed_at(args: list[str], checkpoint: str) -> None:
    """Run the command in a child process that is SIGKILLed right after `checkpoint` is published."""
    child = _start_child(args, "kill", checkpoint)
    _, err = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL, err.decode()[-3000:]


def _held_at(args: list[str], checkpoint: str, marker: Path) -> subprocess.Popen:
    """Run the command in a child process that stops, alive and holding its run directory, after `checkpoint`."""
    child = _start_child(args, str(marker), checkpoint)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the child never reached its checkpoint"
        time.sleep(0.05)
    return child


def _error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def _assert_same_weights(a: Path, b: Path) -> None:
    first, second = _weights(a), _weights(b)
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first), [k for k in first if not torch.equal(first[k], second[k])]


def _curves(run_dir: Path) -> list[tuple]:
    """What metrics.jsonl says of training and evaluation, without the clock."""
    keep = {"train": ("loss", "lr", "grad_norm", "tokens", "skipped_steps"), "eval": None, "selection": None}
    records = []
    for record in read_metrics(run_dir):
        if record["split"] not in keep:
            continue
        names = keep[record["split"]] or sorted(k for k in record if k not in ("step", "split", "time"))
        records.append((record["step"], record["split"], *(record[k] for k in names)))
    return records


# ------------------------------------------------------------------------------------------------
# 1. a resume under other settings or inputs is refused
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_finetune_resume_under_other_settings_or_files_is_refused_in_one_line(sst, tmp_path: Path) -> None:
    out = tmp_path / "x"
    _killed_at(_finetune_args(sst, out), "step-000026")  # its final checkpoint: 2 epochs of 13 steps
    assert (out / "seed-1" / "run" / "checkpoints" / "step-000026").is_dir()
    assert not (out / "results.json").exists() and not (out / "seed-1" / "task.json").exists()
    runner = CliRunner()

    result = runner.invoke(app, _finetune_args(sst, out, "--lr", "3e-4"))
    assert result.exit_code == 2, result.output
    line = _error_line(result.output)
    assert "lr 0.0001 -> 0.0003" in line and "--out" in line and "--overwrite" in line, line
    assert "resumed" not in result.output
    assert "lr: 0.0001" in (out / "run_config.yaml").read_text()  # nothing of the refused run was written
    assert not (out / "results.json").exists()

    result = runner.invoke(app, _finetune_args(sst, out, "--batch-size", "8"))
    assert result.exit_code == 2 and "batch_size 16 -> 8" in _error_line(result.output), result.output

    other = _write_csv(tmp_path / "other.csv", _rows(208, seed=3))
    args = _finetune_args(sst, out)
    args[args.index(str(sst["train"]))] = str(other)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and f"task_settings.train {sst['train']} -> {other}" in _error_line(result.output)

    # the same file name with other contents (same size, so its SHA-256 decides)
    original = sst["train"].read_bytes()
    try:
        sst["train"].write_bytes(original.replace(b"a ", b"A ", 1))
        result = runner.invoke(app, _finetune_args(sst, out))
        line = _error_line(result.output)
        assert result.exit_code == 2 and f"train file {sst['train']} changed (same size, other contents)" in line
    finally:
        sst["train"].write_bytes(original)

    # the same settings resume (nothing left to train), and --overwrite starts again under the new ones
    result = runner.invoke(app, _finetune_args(sst, out))
    assert result.exit_code == 0 and "resumed from" in result.output, result.output
    # best/ was written before the kill: the resumed run's records point at it
    assert (out / "seed-1" / "best" / "task.json").exists()
    assert json.loads((out / "results.json").read_text())["seeds"][0]["best"]["dir"] == "best"
    result = runner.invoke(app, _finetune_args(sst, out, "--lr", "3e-4", "--overwrite"))
    assert result.exit_code == 0 and "resumed" not in result.output, result.output
    saved = json.loads((out / "seed-1" / "task.json").read_text())
    assert saved["hyperparameters"]["lr"] == 3e-4 and json.loads((out / "results.json").read_text())[
        "hyperparameters"]["lr"] == 3e-4
    fresh = tmp_path / "fresh"
    assert runner.invoke(app, _finetune_args(sst, fresh, "--lr", "3e-4")).exit_code == 0
    _assert_same_weights(out / "seed-1", fresh / "seed-1")  # the lr 3e-4 model, nothing of the first run

    # a finished seed: reused under the same settings, refused under others (not retrained over)
    result = runner.invoke(app, _finetune_args(sst, out, "--lr", "3e-4"))
    assert result.exit_code == 0 and "reusing its metrics" in result.output, result.output
    result = runner.invoke(app, _finetune_args(sst, out))
    assert result.exit_code == 2 and "lr 0.0003 -> 0.0001" in _error_line(result.output)
    (out / RECORD_FILE).unlink()  # a directory from before fingerprint.json: task.json's settings still decide
    result = runner.invoke(app, _finetune_args(sst, out))
    line = _error_line(result.output)
    assert result.exit_code == 2 and "seed-1" in line and "lr 0.0003 -> 0.0001" in line, line
    _assert_same_weights(out / "seed-1", fresh / "seed-1")


def test_a_rerun_naming_the_same_files_another_way_is_the_same_run(sst, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The model, data and output given relative instead of absolute (or through ./): the same run, its
    finished seed reused; a path that names another file is refused with both paths whole."""
    out = tmp_path / "runs" / "same"
    runner = CliRunner()
    assert runner.invoke(app, _finetune_args(sst, out, "--epochs", "1")).exit_code == 0
    monkeypatch.chdir(sst["model"].parent)
    relative = {key: Path(".") / path.relative_to(sst["model"].parent) for key, path in sst.items()}
    result = runner.invoke(app, _finetune_args(relative, out, "--epochs", "1"))
    assert result.exit_code == 0 and "reusing its metrics" in result.output, result.output

    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "train.csv"
    deep.parent.mkdir()
    deep.write_bytes(sst["train"].read_bytes())
    args = _finetune_args(sst, out, "--epochs", "1")
    args[args.index(str(sst["train"]))] = str(deep)
    result = runner.invoke(app, args)
    line = _error_line(result.output)
    assert result.exit_code == 2 and f"task_settings.train {sst['train']} -> {deep}" in line, line


def test_a_pretrain_resume_under_other_settings_or_data_is_refused(shards, tmp_path: Path) -> None:  # noqa: F811
    data, tokenizer = shards
    out = tmp_path / "run"
    args = ["pretrain", "--config", "tiny", "--data", str(data), "--out", str(out), "--max-steps", "4",
            "--save-every", "2", "--batch-size", "4", "--tokenizer", str(tokenizer), "--set",
            "max_position_embeddings=64", "--set", "data.eval_max_batches=2", "--quiet"]
    runner = CliRunner()
    assert runner.invoke(app, args).exit_code == 0
    config_before = (out / "run_config.yaml").read_text()

    result = runner.invoke(app, [*args, "--resume", "--lr", "3e-4"])
    line = _error_line(result.output)
    assert result.exit_code == 2 and "lr 0.0001 -> 0.0003" in line and "--overwrite" in line, result.output
    result = runner.invoke(app, [*args, "--resume", "--set", "hidden_size=64", "--set", "num_attention_heads=4"])
    assert result.exit_code == 2 and "hidden_size 128 -> 64" in _error_line(result.output)
    result = runner.invoke(app, args)  # checkpoints there and no --resume
    line = _error_line(result.output)
    assert result.exit_code == 2 and "--resume" in line and "--overwrite" in line, line
    assert (out / "run_config.yaml").read_text() == config_before

    # the data moved: the same contents are accepted; other contents are not
    moved = tmp_path / "moved"
    os.symlink(data, moved)  # another path to the same files
    assert runner.invoke(app, [*_with(args, data, moved), "--resume", "--save-every", "1"]).exit_code == 0
    copy = tmp_path / "copy"
    copy.mkdir()
    for entry in data.iterdir():
        (copy / entry.name).symlink_to(entry)
    (copy / "dataset.json").unlink()
    info = json.loads((data / "dataset.json").read_text())
    info["options"]["seed"] += 1
    (copy / "dataset.json").write_text(json.dumps(info))
    result = runner.invoke(app, [*_with(args, data, copy), "--resume"])
    assert result.exit_code == 2 and f"data {copy}/dataset.json changed" in _error_line(result.output)

    result = runner.invoke(app, [*args, "--lr", "3e-4", "--overwrite"])
    assert result.exit_code == 0 and "resumed" not in result.output, result.output
    assert json.loads((out / RECORD_FILE).read_text())["settings"]["lr"] == 3e-4
    assert "lr: 0.0003" in (out / "run_config.yaml").read_text()
    assert [p.name for p in list_checkpoints(out)] == ["step-000002", "step-000004"]


def _with(args: list[str], old: Path, new: Path) -> list[str]:
    return [str(new) if a == str(old) else a for a in args]


# ------------------------------------------------------------------------------------------------
# 2. one run at a time on a directory
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_second_run_on_a_directory_in_use_is_refused_and_a_dead_run_s_lock_is_taken_over(sst, tmp_path: Path) -> None:
    out = tmp_path / "x"
    args = _finetune_args(sst, out)
    child = _held_at(args, "step-000026", tmp_path / "marker")  # held alive right after its final checkpoint
    try:
        result = CliRunner().invoke(app, args)
        line = _error_line(result.output)
        assert result.exit_code == 2 and f"pid {child.pid}" in line and "in use" in line, result.output
        with pytest.raises(RunLockedError, match=f"pid {child.pid}"), run_lock(out):
            pass
    finally:
        child.kill()
        child.wait()
    assert (out / LOCK_FILE).exists()  # left by the killed run: stale, its flock died with it
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and "resumed from" in result.output and "step-000026" in result.output, result.output
    assert not (out / LOCK_FILE).exists()
    assert json.loads((out / "seed-1" / "task.json").read_text())["steps"] == 26


def test_pretrain_and_prepare_refuse_a_directory_another_process_holds(shards, tmp_path: Path) -> None:  # noqa: F811
    data, tokenizer = shards
    busy, marker = tmp_path / "busy", tmp_path / "marker"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path
        from bertforge.fileio import run_lock
        with run_lock({str(busy)!r}):
            Path({str(marker)!r}).write_text("held")
            time.sleep(300)
    """)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert holder.poll() is None and time.monotonic() < deadline, holder.stderr.read().decode()
            time.sleep(0.05)
        runner = CliRunner()
        result = runner.invoke(app, ["pretrain", "--config", "tiny", "--data", str(data), "--out", str(busy),
                                     "--max-steps", "2", "--batch-size", "4", "--set", "max_position_embeddings=64"])
        assert result.exit_code == 2 and f"pid {holder.pid}" in _error_line(result.output), result.output
        result = runner.invoke(app, ["prepare", "--input", str(Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"),
                                     "--tokenizer", str(tokenizer), "--out", str(busy), "--quiet"])
        assert result.exit_code == 2 and f"pid {holder.pid}" in _error_line(result.output), result.output
        assert sorted(p.name for p in busy.iterdir()) == [LOCK_FILE]  # neither wrote anything
    finally:
        holder.kill()
        holder.wait()
    with run_lock(busy):  # the holder is dead: its lock is taken over without a word
        assert json.loads((busy / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (busy / LOCK_FILE).exists()


# ------------------------------------------------------------------------------------------------
# 3. fine-tuning checkpoints mid-run and resumes bit-exactly
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_finetune_killed_mid_run_resumes_to_the_uninterrupted_weights_and_metrics(sst, tmp_path: Path) -> None:
    extra = ("--save-every-steps", "4", "--keep-last", "2", "--keep-checkpoints")
    killed, straight = tmp_path / "killed", tmp_path / "straight"
    _killed_at(_finetune_args(sst, killed, *extra), "step-000008")
    assert [p.name for p in list_checkpoints(killed / "seed-1" / "run")] == ["step-000004", "step-000008"]
    runner = CliRunner()
    result = runner.invoke(app, _finetune_args(sst, killed, *extra))
    assert result.exit_code == 0 and "step-000008" in result.output, result.output
    assert runner.invoke(app, _finetune_args(sst, straight, *extra)).exit_code == 0

    _assert_same_weights(killed / "seed-1", straight / "seed-1")
    _assert_same_weights(killed / "seed-1" / "best", straight / "seed-1" / "best")
    resumed, uninterrupted = (json.loads((d / "seed-1" / "task.json").read_text()) for d in (killed, straight))
    assert resumed["metrics"] == uninterrupted["metrics"] and resumed["best"] == uninterrupted["best"]
    assert _curves(killed / "seed-1" / "run") == _curves(straight / "seed-1" / "run")
    # pruned to the newest two as it went: steps 4, 8, 12, 16, 20, 24 and the last, 26
    assert [p.name for p in list_checkpoints(killed / "seed-1" / "run")] == ["step-000024", "step-000026"]


def test_the_loop_checkpoints_on_a_clock_too(tmp_path: Path) -> None:
    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=3, save_every_minutes=1e-9, keep_last=0),
          OptimConfig())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000001", "step-000002", "step-000003"]


# ------------------------------------------------------------------------------------------------
# 4. a newest checkpoint that does not load is skipped
# ------------------------------------------------------------------------------------------------
class Stop(Exception):
    """Stands for the process dying right after a checkpoint."""


def _stop_after(monkeypatch: pytest.MonkeyPatch, checkpoint: str) -> None:
    import bertforge.train.state as state

    publish = state._publish

    def publish_then_stop(tmp: Path, final: Path) -> None:
        publish(tmp, final)
        if final.name == checkpoint:
            raise Stop(final.name)

    monkeypatch.setattr(state, "_publish", publish_then_stop)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.slow
def test_pretrain_resume_skips_a_truncated_newest_checkpoint(shards, tmp_path: Path, monkeypatch) -> None:  # noqa: F811
    data, _ = shards
    args = ["pretrain", "--config", "tiny", "--data", str(data), "--max-steps", "6", "--save-every", "2",
            "--batch-size", "8", "--grad-accum", "2", "--lr", "1e-3", "--set", "max_position_embeddings=64",
            "--set", "data.eval_max_batches=2", "--quiet"]
    runner = CliRunner()
    _stop_after(monkeypatch, "step-000004")
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "crashed")])
    assert isinstance(result.exception, Stop)
    monkeypatch.undo()
    newest = latest_checkpoint(tmp_path / "crashed")
    assert newest.name == "step-000004"
    _truncate(newest / "model.safetensors")

    result = runner.invoke(app, [*args, "--out", str(tmp_path / "crashed"), "--resume"])
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.output.splitlines() if "skipped checkpoint" in line]
    assert len(skipped) == 1 and "step-000004" in skipped[0] and "model.safetensors" in skipped[0], result.output
    assert "incomplete metadata" in skipped[0]
    assert "resumed from" in result.output and "step-000002" in result.output
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "straight")]).exit_code == 0
    _assert_same_weights(tmp_path / "crashed" / "checkpoints" / "step-000006",
                         tmp_path / "straight" / "checkpoints" / "step-000006")
    _assert_same_weights(tmp_path / "crashed" / "final", tmp_path / "straight" / "final")


def test_finetune_resume_skips_a_truncated_newest_checkpoint(sst, tmp_path: Path, monkeypatch) -> None:
    extra = ("--save-every-steps", "4")
    runner = CliRunner()
    _stop_after(monkeypatch, "step-000008")
    assert isinstance(runner.invoke(app, _finetune_args(sst, tmp_path / "crashed", *extra)).exception, Stop)
    monkeypatch.undo()
    newest = latest_checkpoint(tmp_path / "crashed" / "seed-1" / "run")
    assert newest.name == "step-000008"
    _truncate(newest / "optimizer.pt")

    result = runner.invoke(app, _finetune_args(sst, tmp_path / "crashed", *extra))
    assert result.exit_code == 0, result.output
    skipped = [line for line in result.output.splitlines() if "skipped checkpoint" in line]
    assert len(skipped) == 1 and "step-000008" in skipped[0] and "optimizer.pt" in skipped[0], result.output
    assert "step-000004" in result.output
    assert runner.invoke(app, _finetune_args(sst, tmp_path / "straight", *extra)).exit_code == 0
    _assert_same_weights(tmp_path / "crashed" / "seed-1", tmp_path / "straight" / "seed-1")


def test_a_run_whose_checkpoints_all_fail_to_load_says_so(tmp_path: Path) -> None:
    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=4, save_every=2), OptimConfig())
    for checkpoint in list_checkpoints(tmp_path):
        _truncate(checkpoint / "model.safetensors")
    with pytest.raises(ValueError, match=r"no checkpoint loads \(skipped checkpoint .*step-000004 .*step-000002"):
        train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=6, save_every=2), OptimConfig(),
              resume=True)
