"""How a model directory says its sentence embedding is made: sentence-transformers' own files.

A sentence-transformers directory (all-MiniLM-L6-v2 and every model trained with that library) lists
its modules in `modules.json`: the Transformer (whose `sentence_bert_config.json` gives the pieces an
input is cut to, `max_seq_length`), a Pooling module (its `config.json` says cls, mean or max), and
often Normalize (unit length). `SentenceTransformer.encode` applies them in that order, so an
embedding made another way (all 512 positions, no normalisation) is not the vector the model was
trained to give. bertforge's embedding paths read these files and, unless told otherwise, do the same.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

MODULES_FILE = "modules.json"
TRANSFORMER_CONFIG = "sentence_bert_config.json"
_MODULE_PREFIX = "sentence_transformers.models."
# sentence-transformers' pooling flags -> the name bertforge's embedding paths use
_POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_max_tokens": "max",
                  "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len", "pooling_mode_weightedmean_tokens": "weightedmean",
                  "pooling_mode_lasttoken": "lasttoken"}
SUPPORTED_POOLING = ("cls", "mean", "max")
# version 6's `pooling_mode` names -> the names above (the same where they agree)
_POOLING_NAMES = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}
UNSET_LENGTH = 1_000_000  # a tokenizer's model_max_length at or above this means "no limit set"
# a classifier on the mean token vector is also saved as the setfit package reads it
# (`bertforge.model.sentence.save_setfit_files`): its head, a pickled scikit-learn estimator that
# bertforge writes for setfit and never reads, and the labels
SETFIT_HEAD_FILE = "model_head.pkl"
SETFIT_CONFIG_FILE = "config_setfit.json"


class SentenceConfigError(ValueError):
    """A sentence-transformers directory whose embedding bertforge cannot reproduce, or unreadable files."""


@dataclass(frozen=True)
class SentenceEmbedding:
    """The embedding a sentence-transformers directory defines."""

    pooling: str  # cls, mean or max, over the final token vectors (specials included, padding not)
    normalize: bool  # scaled to unit length after pooling
    max_length: int | None  # pieces an input is cut to, [CLS] and [SEP] included (None: the model's limit)
    lowercase: bool  # sentence_bert_config's do_lower_case: texts lower-cased before the tokenizer

    def describe(self) -> str:
        cut = f", cut to {self.max_length} pieces" if self.max_length else ""
        return f"{self.pooling} pooling{', normalised' if self.normalize else ''}{cut} (modules.json)"


def read_sentence_embedding(model_dir: str | os.PathLike[str]) -> SentenceEmbedding | None:
    """The embedding `model_dir`'s sentence-transformers files define, or None when it has none.

    Raises `SentenceConfigError` for a pipeline bertforge does not run the same way (a Dense or other
    module after pooling, a pooling mode other than cls, mean and max), naming the module: its
    default vectors would silently differ from `SentenceTransformer.encode`."""
    directory = Path(model_dir)
    listed = directory / MODULES_FILE
    if not listed.is_file():
        return None
    modules = _read_json(listed)
    if not isinstance(modules, list):
        raise SentenceConfigError(f"{listed}: expected a list of modules")
    kinds = [_module_kind(str(m.get("type", ""))) for m in modules]
    pooling_dir = next((m.get("path", "") for m, kind in zip(modules, kinds, strict=True) if kind == "Pooling"), None)
    unknown = [kind for kind in kinds if kind not in ("Transformer", "Pooling", "Normalize")]
    if unknown or pooling_dir is None:
        what = f"the module(s) {', '.join(unknown)}" if unknown else "no Pooling module"
        raise SentenceConfigError(f"{listed}: lists {what}; bertforge runs Transformer, Pooling and Normalize only, "
                                  "so its vectors would differ from the model's own: pass the pooling explicitly "
                                  "to embed with the encoder alone")
    return SentenceEmbedding(pooling=_pooling(directory / pooling_dir / "config.json"), normalize="Normalize" in kinds,
                             **_transformer_settings(directory))


def brought_max_length(model_dir: str | os.PathLike[str]) -> int | None:
    """The max_seq_length a sentence-transformers model brings (256 for all-MiniLM-L6-v2), or None: a
    job that writes the model again keeps it unless told otherwise."""
    try:
        found = read_sentence_embedding(model_dir)
    except SentenceConfigError:  # modules bertforge does not run
        return None
    return found.max_length if found is not None and found.max_length else None


def _module_kind(type_name: str) -> str:
    """"Pooling" from "sentence_transformers.models.Pooling" (up to version 5) and from the module paths
    version 6 writes ("sentence_transformers.sentence_transformer.modules.pooling.Pooling"); another
    package's module keeps its whole name (it is not one bertforge runs)."""
    if type_name.startswith(_MODULE_PREFIX) or type_name.startswith("sentence_transformers."):
        return type_name.rsplit(".", 1)[-1]
    return type_name


def _pooling(path: Path) -> str:
    config = _read_json(path) if path.is_file() else {"pooling_mode_mean_tokens": True}  # the library's default
    if isinstance(config, dict) and isinstance(config.get("pooling_mode"), str):  # version 6: one named mode
        modes = [_POOLING_NAMES.get(config["pooling_mode"], config["pooling_mode"])]
    else:
        modes = [name for flag, name in _POOLING_FLAGS.items() if config.get(flag)]
    if len(modes) != 1 or modes[0] not in SUPPORTED_POOLING:
        raise SentenceConfigError(f"{path}: pooling {' + '.join(modes) or 'none'}; bertforge pools one of "
                                  f"{', '.join(SUPPORTED_POOLING)}")
    return modes[0]


def _transformer_settings(directory: Path) -> dict[str, object]:
    """The length inputs are cut to and the extra lower-casing: sentence_bert_config.json's up to version 5;
    version 6 keeps the length as the tokenizer's model_max_length instead."""
    path = directory / TRANSFORMER_CONFIG
    config = _read_json(path) if path.is_file() else {}
    length = config.get("max_seq_length")
    if not length and (directory / "tokenizer_config.json").is_file():
        tokenizer = _read_json(directory / "tokenizer_config.json")
        limit = tokenizer.get("model_max_length") if isinstance(tokenizer, dict) else None
        length = limit if isinstance(limit, int) and limit < UNSET_LENGTH else None  # transformers' "no limit" is ~1e30
    return {"max_length": int(length) if length else None, "lowercase": bool(config.get("do_lower_case", False))}


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SentenceConfigError(f"{path}: not readable JSON ({exc})") from exc


__all__ = ["SETFIT_CONFIG_FILE", "SETFIT_HEAD_FILE", "SUPPORTED_POOLING", "SentenceConfigError", "SentenceEmbedding", "read_sentence_embedding"]
