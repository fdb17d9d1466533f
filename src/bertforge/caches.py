"""What bertforge keeps outside run directories, with its size, and how to clear it (`bertforge cache`).

    kind        where                                               what
    onnx        $BERTFORGE_ONNX_CACHE, else $XDG_CACHE_HOME/bertforge/onnx (~/.cache/bertforge/onnx)
                                                                    ONNX graphs exported for models whose
                                                                    directory is not writable (`engine`)
    datasets    $HF_HOME/bertforge/datasets                         files derived from Hub data sets (`hubdata`)
    hub         $HF_HUB_CACHE (~/.cache/huggingface/hub)             models and data sets downloaded by name;
                                                                    shared with transformers and datasets
    model-onnx  MODEL/.bertforge-onnx, found under the folders given
                                                                    ONNX graphs beside a writable model's weights

Each is a cache: deleting it loses nothing but the time to make it again. `clear` removes what it is
given; the Hub cache is another library's too, so it is cleared only when named.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

KINDS = ("onnx", "datasets", "hub", "model-onnx")
OWN_KINDS = ("onnx", "datasets", "model-onnx")  # cleared by default: bertforge's alone
DESCRIPTIONS = {
    "onnx": "ONNX graphs exported for models whose directory is not writable",
    "datasets": "files bertforge derived from Hub data sets",
    "hub": "models and data sets downloaded by name (shared with transformers and datasets)",
    "model-onnx": "ONNX graphs beside a model's weights (MODEL/.bertforge-onnx)",
}


@dataclass(frozen=True)
class CacheEntry:
    """One folder a cache lives in, with what it holds now (0 and 0 when it does not exist)."""

    kind: str
    path: Path
    size: int
    files: int


def onnx_cache() -> Path:
    from bertforge.engine import user_cache_dir

    return user_cache_dir()


def datasets_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "bertforge" / "datasets"


def hub_cache() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def model_onnx_caches(roots: Iterable[str | os.PathLike[str]]) -> Iterator[Path]:
    """Every MODEL/.bertforge-onnx folder under `roots` (not descending into one)."""
    from bertforge.engine import CACHE_FOLDER

    for root in roots:
        for folder, subfolders, _ in os.walk(root):
            if CACHE_FOLDER in subfolders:
                yield Path(folder) / CACHE_FOLDER
            subfolders[:] = [name for name in subfolders if name != CACHE_FOLDER]


def folder_usage(path: Path) -> tuple[int, int]:
    """(bytes on disk, files) under `path`; a file hard-linked twice (the Hub cache's blobs and
    snapshots are links or symlinks) is counted once, symlinks not at all."""
    seen: set[tuple[int, int]] = set()
    size = files = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                info = os.lstat(os.path.join(folder, name))  # a symlink's own entry, not its target
            except OSError:  # removed while we looked
                continue
            if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            size, files = size + info.st_size, files + 1
    return size, files


def entries(kinds: Iterable[str] = KINDS, under: Iterable[str | os.PathLike[str]] = ()) -> list[CacheEntry]:
    """The caches of `kinds`, measured; model-onnx ones are looked for under `under`."""
    kinds = list(kinds)
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        raise ValueError(f"unknown cache {', '.join(unknown)}; the caches are {', '.join(KINDS)}")
    fixed = {"onnx": onnx_cache, "datasets": datasets_cache, "hub": hub_cache}
    found = []
    for kind in kinds:
        paths = list(model_onnx_caches(under)) if kind == "model-onnx" else [fixed[kind]()]
        for path in paths:
            found.append(CacheEntry(kind, path, *folder_usage(path)))
    return found


def clear(entry: CacheEntry) -> None:
    """Delete a cache folder: renamed away first, so that a reader never sees half of it."""
    if not entry.path.exists():
        return
    doomed = entry.path.with_name(f".{entry.path.name}.deleting-{os.getpid()}")
    os.replace(entry.path, doomed)
    shutil.rmtree(doomed)


def human_size(size: int) -> str:
    """1.2 MB, 340 kB, 12 B: decimal units, as `du --si` and the issue reports measure."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


__all__ = ["DESCRIPTIONS", "KINDS", "OWN_KINDS", "CacheEntry", "clear", "entries", "folder_usage", "human_size",
           "model_onnx_caches"]
