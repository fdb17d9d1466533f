"""sentence-transformers' files that a job writing a model again must keep: modules.json and the module
directories it lists (pooling, normalisation), sentence_bert_config.json (the length inputs are cut to)
and config_sentence_transformers.json (the prompts a model was trained with, its similarity function)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
# the model-wide settings: prompts ("query: "), the default prompt, the similarity function
SENTENCE_SETTINGS_FILE = "config_sentence_transformers.json"


def carry_sentence_files(source: str | Path, target: str | Path, *,
                         files: tuple[str, ...] | None = None) -> list[str]:
    """Copy the sentence-transformers files of the model in `source` into `target`, where a job wrote the
    model again (adapted, fine-tuned), so `SentenceTransformer(target)` embeds as `SentenceTransformer(source)`
    did: by default modules.json, every module directory it lists, sentence_bert_config.json and the
    prompts file; `files` names the ones to copy instead. Files `target` already holds are left alone (the
    job wrote its own); returns the names copied."""
    source, target = Path(source), Path(target)
    if files is None:
        if not (source / MODULES_FILE).is_file():
            return []  # not a sentence-transformers model: nothing to keep
        modules = json.loads((source / MODULES_FILE).read_text(encoding="utf-8"))
        module_dirs = [str(m["path"]) for m in modules if isinstance(m, dict) and m.get("path")]
        files = (MODULES_FILE, TRANSFORMER_CONFIG, SENTENCE_SETTINGS_FILE, *module_dirs)
    copied = []
    for name in files:
        found, kept = source / name, target / name
        if kept.exists() or not found.exists():
            continue
        if found.is_dir():
            shutil.copytree(found, kept)
        else:
            shutil.copy2(found, kept)
        copied.append(name)
    return copied


__all__ = ["MODULES_FILE", "SENTENCE_SETTINGS_FILE", "TRANSFORMER_CONFIG", "carry_sentence_files"]
