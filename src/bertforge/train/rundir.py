"""What a run directory was started with, checked before it is continued; and clearing it for a fresh start.

A run that resumes (pre-training with `--resume`, fine-tuning always) continues the state it finds in
its directory. If the settings or the inputs changed in between, the result would be neither run:
the first steps trained one way, the rest another, with the records of the second. So a run writes
`RUN/fingerprint.json` when it starts afresh:

    {"format": 1,
     "settings": {"lr": 0.0001, "batch_size": 32, ...},          the settings its results depend on
     "inputs": {"model": {"path": "models/minilm",               per input, its files' size, mtime and
                          "files": {"model.safetensors": {"size": ..., "mtime_ns": ..., "sha256": ...}}},
                "data": {"path": "data/glue", "digest": "..."}}}   (or a digest of what was read from it)

and a run that would continue it first compares (`check_run_record`): any setting that differs, and
any input file whose contents differ (its size; then, where the modification time moved, its
SHA-256), is refused in one `RunMismatchError` line naming each difference as `old -> new` and the
two ways out: a new output directory, or `overwrite` (`--overwrite`), which clears the directory's
state (`clear_run`) so that the run starts again. No torch here: the jobs call this before they build
anything.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.fileio import LOCK_FILE, file_fingerprint, same_file_contents, write_text_atomic

RECORD_FILE = "fingerprint.json"
RECORD_FORMAT = 1
# the files of a model directory that loading reads: config, weights (single or sharded), tokenizer
MODEL_FILES = ("config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json",
               "vocab.txt", "tokenizer.json", "merges.txt", "vocab.json", "tokenizer_config.json",
               "special_tokens_map.json")


class RunMismatchError(ValueError):
    """A run directory holds a run started with other settings or inputs than the one asked for."""

    def __init__(self, message: str, differences: list[str]) -> None:
        super().__init__(message)
        self.differences = differences


@dataclass(frozen=True)
class RunInput:
    """One input a run depends on: a file, some files of a directory, or a digest of what was read.

    `files` names files inside `path` (a directory), matched by the glob patterns given to
    `directory_input`; None means `path` is the file itself. `digest`, when set, stands for the
    contents instead (the examples a task read from a data directory, say).
    """

    label: str
    path: Path
    files: tuple[str, ...] | None = None
    digest: str | None = None

    def record(self) -> dict[str, Any]:
        if self.digest is not None:
            return {"path": str(self.path), "digest": self.digest}
        return {"path": str(self.path), "files": {name: file_fingerprint(self._file(name)) for name in self._names()}}

    def _names(self) -> tuple[str, ...]:
        return self.files if self.files is not None else (self.path.name,)

    def _file(self, name: str) -> Path:
        return self.path / name if self.files is not None else self.path

    def differences(self, recorded: Mapping[str, Any]) -> list[str]:
        """How this input differs from what `recorded` (a `record()`) says; [] when it is the same."""
        where = f"{self.label} {self.path}"
        if self.digest is not None or "digest" in recorded:
            if recorded.get("digest") == self.digest:
                return []
            moved = f" (was {recorded.get('path')})" if recorded.get("path") != str(self.path) else ""
            return [f"{where}: other contents{moved}"]
        old = recorded.get("files") or {}
        names = self._names()
        if set(old) != set(names):
            return [f"{self.label}: files {', '.join(sorted(old)) or '(none)'} -> {', '.join(sorted(names)) or '(none)'}"]
        found = []
        for name in names:
            path = self._file(name)
            if same_file_contents(old[name], path):
                continue
            size = path.stat().st_size if path.exists() else None
            what = (f"{old[name].get('size')} -> {size} bytes" if size != old[name].get("size") else
                    "same size, other contents")
            found.append(f"{where if self.files is None else f'{where}/{name}'} changed ({what})")
        return found


def file_input(label: str, path: str | os.PathLike[str]) -> RunInput:
    return RunInput(label, Path(path))


def directory_input(label: str, directory: str | os.PathLike[str], patterns: Iterable[str] = MODEL_FILES) -> RunInput:
    """The files of `directory` (top level) that match any of `patterns` (default: a model's files)."""
    directory = Path(directory)
    patterns = tuple(patterns)
    names = sorted(p.name for p in directory.iterdir()
                   if p.is_file() and any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns))
    return RunInput(label, directory, files=tuple(names))


def digest_input(label: str, path: str | os.PathLike[str], digest: str) -> RunInput:
    return RunInput(label, Path(path), digest=digest)


def flat_settings(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as one level, dotted (`task_settings.train`), in JSON types as they read back."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping) and value:
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return json.loads(json.dumps(flat, default=str))


def setting_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """`name old -> new` for every setting that differs (new order first, then the ones only `old` has),
    each value whole. Two spellings of one path (relative and absolute, `./x` and `x`, through a link)
    are the same setting: what a path names is compared, as the inputs' contents are."""
    names = [*new, *(k for k in old if k not in new)]
    return [f"{name} {_show(old, name)} -> {_show(new, name)}" for name in names
            if (name in old) != (name in new) or not _same_value(old.get(name), new.get(name))]


def same_settings(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two records of settings agree (`setting_differences` finds nothing)."""
    return not setting_differences(flat_settings(old), flat_settings(new))


def _same_value(old: Any, new: Any) -> bool:
    if old == new:
        return True
    if not (isinstance(old, str) and isinstance(new, str)) or not old or not new:
        return False
    first, second = Path(old).expanduser(), Path(new).expanduser()
    return first.exists() and second.exists() and first.resolve() == second.resolve()


def _show(settings: Mapping[str, Any], name: str) -> str:
    if name not in settings:
        return "(unset)"
    value = settings[name]
    return value if isinstance(value, str) else json.dumps(value)


def read_run_record(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run directory's fingerprint.json, or None when it has none (or one that cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == RECORD_FORMAT else None


def write_run_record(run_dir: str | os.PathLike[str], settings: Mapping[str, Any], inputs: Iterable[RunInput]) -> Path:
    """Record what a run starts with (hashing its input files once)."""
    record = {"format": RECORD_FORMAT, "settings": flat_settings(settings),
              "inputs": {item.label: item.record() for item in inputs}}
    path = Path(run_dir) / RECORD_FILE
    write_text_atomic(path, json.dumps(record, indent=1) + "\n")
    return path


def run_differences(record: Mapping[str, Any], settings: Mapping[str, Any], inputs: Iterable[RunInput],
                    may_omit: Iterable[str] = ()) -> list[str]:
    """Every way `settings` and `inputs` differ from a run's `record`. Inputs recorded but not given
    now are differences, except those labelled in `may_omit` (pre-training's --init-from, which a
    resume does not need)."""
    found = setting_differences(record.get("settings", {}), flat_settings(settings))
    inputs = list(inputs)
    recorded = dict(record.get("inputs", {}))
    for item in inputs:
        old = recorded.pop(item.label, None)
        found += [f"{item.label} (none) -> {item.path}"] if old is None else item.differences(old)
    found += [f"{label} {old.get('path')} -> (none)" for label, old in recorded.items() if label not in may_omit]
    return found


def check_run_record(run_dir: str | os.PathLike[str], settings: Mapping[str, Any], inputs: Iterable[RunInput], *,
                     what: str = "run", may_omit: Iterable[str] = ()) -> None:
    """Refuse to continue `run_dir` with other settings or inputs than it was started with (one line).

    A directory without a record (made by an older version) is not refused: nothing says what it
    was started with.
    """
    record = read_run_record(run_dir)
    if record is None:
        return
    found = run_differences(record, settings, inputs, may_omit)
    if found:
        raise mismatch_error(run_dir, found, what)


def mismatch_error(run_dir: str | os.PathLike[str], differences: list[str], what: str = "run") -> RunMismatchError:
    return RunMismatchError(
        f"{run_dir} holds a {what} started with other settings or inputs ({'; '.join(differences)}); continuing "
        "it would mix two runs: use a new output directory (--out), or --overwrite (overwrite=True) to clear it "
        "and start again", differences)


def clear_run(run_dir: str | os.PathLike[str], patterns: Iterable[str]) -> list[Path]:
    """Delete what a job wrote in `run_dir`: the entries whose names match `patterns` (never the lock file)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    patterns = tuple(patterns)
    doomed = [p for p in sorted(run_dir.iterdir()) if p.name != LOCK_FILE
              and any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)]
    for path in doomed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return doomed


__all__ = ["MODEL_FILES", "RECORD_FILE", "RunInput", "RunMismatchError", "check_run_record", "clear_run",
           "digest_input", "directory_input", "file_input", "flat_settings", "mismatch_error", "read_run_record",
           "run_differences", "same_settings", "setting_differences", "write_run_record"]
