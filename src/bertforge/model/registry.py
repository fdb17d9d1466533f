"""The one registry of model families: config.json's `model_type` -> the family's config class,
presets and models, and (model_type, job) -> the class that does that job.

A family is one folder under `bertforge/model/` whose `__init__.py` defines `FAMILY` (a `Family`),
and `FAMILIES` too when the folder serves several model_types (RoBERTa's, XLM-RoBERTa's, ...);
the list below names the built-in ones, and `register` adds another at run time (a plug-in, or a
test's toy family). Model classes register themselves when their module is imported: each class
that declares a `job` (one of JOBS) and a `model_type` is the family's model for that job.
Everything outside the family folders asks this module, never a class by name: which class
fine-tunes for token classification with this checkpoint, which preset is "mini", which config
class reads this config.json.

This module imports no family and no torch: families are imported on first use, by name, so that
building the command line stays fast and no import circle ties the registry to its families.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.config import ModelConfig, check_values, read_json_object

# The built-in families: one line each (the package that defines `FAMILY`).
BUILTIN_FAMILIES: tuple[str, ...] = (
    "bertforge.model.bert",
    "bertforge.model.modernbert",
    "bertforge.model.distilbert",
    "bertforge.model.roberta",
    "bertforge.model.electra",
    "bertforge.model.albert",
    "bertforge.model.deberta",
)

# The jobs a model class can do, as transformers' auto classes name them.
JOBS: tuple[str, ...] = (
    "embeddings",  # the bare encoder: final token vectors (and a pooled vector where the family has one)
    "pretraining",  # the family's own pre-training heads (BERT: masked LM + next sentence)
    "masked-lm",
    "sequence-classification",
    "token-classification",
    "question-answering",
    "multiple-choice",
    "causal-lm",  # a left-to-right LM head on a causal encoder (BERT's: BertLMHeadModel, objective ltr)
)

DEFAULT_MODEL_TYPE = "bert"  # what a config.json without `model_type` is read as


@dataclass
class Family:
    """What a family declares about itself in its folder's `__init__.py`.

    `config_class` reads and writes its config.json; `model_modules` are imported before its model
    classes are looked up (defining a class registers it); `job_fallbacks` names the job that stands
    in for one the family lacks (ModernBERT pre-trains with masked LM alone: pretraining -> masked-lm).
    """

    model_type: str
    config_class: type[ModelConfig]
    model_modules: tuple[str, ...] = ()
    job_fallbacks: dict[str, str] = field(default_factory=dict)
    description: str = ""

    @property
    def presets(self) -> dict[str, Any]:
        return self.config_class.presets


class UnknownFamilyError(ValueError):
    """A model_type, preset or job that no registered family provides."""


_families: dict[str, Family] = {}
_classes: dict[tuple[str, str], type] = {}  # (model_type, job) -> class
_by_architecture: dict[str, type] = {}  # class name as config.json's `architectures` lists it -> class
_builtins_loaded = False
_modules_loaded: set[str] = set()


def register(family: Family) -> Family:
    """Add a family (a second registration of the same model_type replaces the first)."""
    _families[family.model_type] = family
    _modules_loaded.discard(family.model_type)
    return family


def unregister(model_type: str) -> None:
    """Remove a family and its model classes (a test's toy family, say)."""
    _families.pop(model_type, None)
    _modules_loaded.discard(model_type)
    for key in [key for key in _classes if key[0] == model_type]:
        _by_architecture.pop(_classes.pop(key).__name__, None)


def register_model(cls: type) -> None:
    """Called by the model base class for every class that declares a `job` and a `model_type`."""
    job = getattr(cls, "job", None)
    if job is None:
        return
    if job not in JOBS:
        raise ValueError(f"{cls.__name__}: job {job!r} is not one of {', '.join(JOBS)}")
    _classes[(cls.model_type, job)] = cls  # type: ignore[attr-defined]
    _by_architecture[cls.__name__] = cls


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in BUILTIN_FAMILIES:
        package = importlib.import_module(module)
        # One folder may serve several model_types of one architecture: a Family each, in FAMILIES.
        for found in getattr(package, "FAMILIES", (package.FAMILY,)):
            _families.setdefault(found.model_type, found)


def families() -> dict[str, Family]:
    """Every registered family, by model_type."""
    _load_builtins()
    return dict(_families)


def family(model_type: str) -> Family:
    """The family config.json's `model_type` names; the error lists the supported ones."""
    known = families()
    if model_type not in known:
        raise UnknownFamilyError(f"model_type {model_type!r} is not supported; supported: {', '.join(sorted(known))}")
    return known[model_type]


def _import_models(found: Family) -> None:
    if found.model_type not in _modules_loaded:
        for module in found.model_modules:
            importlib.import_module(module)
        _modules_loaded.add(found.model_type)


def model_class(model_type: str, job: str) -> type:
    """The class of `model_type`'s family that does `job` (through the family's fallback if it has none)."""
    found = family(model_type)
    _import_models(found)
    if job not in JOBS:
        raise UnknownFamilyError(f"unknown job {job!r}; the jobs are {', '.join(JOBS)}")
    wanted = job if (model_type, job) in _classes else found.job_fallbacks.get(job, job)
    if (model_type, wanted) not in _classes:
        raise UnknownFamilyError(f"the {model_type!r} family has no model for {job!r}; it has "
                                 f"{', '.join(jobs_of(model_type))}")
    return _classes[(model_type, wanted)]


def jobs_of(model_type: str) -> list[str]:
    """The jobs `model_type`'s family has a class for, in JOBS order."""
    _import_models(family(model_type))
    return [job for job in JOBS if (model_type, job) in _classes]


def class_names(model_type: str, jobs: Iterable[str]) -> list[str]:
    """For messages: the classes of `model_type`'s family that do these jobs, or "a <job> model" where
    the family has none."""
    names = []
    for job in jobs:
        try:
            names.append(model_class(model_type, job).__name__)
        except UnknownFamilyError:
            names.append(f"a {job} model (which the {model_type!r} family does not have)")
    return list(dict.fromkeys(names))


def class_for_architecture(name: str) -> type | None:
    """The class config.json's `architectures` entry names, if any family has it."""
    for found in families().values():
        _import_models(found)
    return _by_architecture.get(name)


# ------------------------------------------------------------------------------------------------
# Configs
# ------------------------------------------------------------------------------------------------
def config_from_dict(data: dict[str, Any], *, source: str = "<dict>") -> ModelConfig:
    """The config class `model_type` names (BERT when absent), read from config.json's content."""
    model_type = data.get("model_type", DEFAULT_MODEL_TYPE)
    try:
        found = family(model_type)
    except UnknownFamilyError as exc:
        raise ValueError(f"{source}: {exc}") from None
    check_values(found.config_class, data, source)
    return found.config_class.from_dict(data, source=source)


def read_config_file(path: str | os.PathLike[str]) -> ModelConfig:
    """A config.json of any registered family."""
    return config_from_dict(read_json_object(Path(path)), source=str(path))


def presets() -> dict[str, Family]:
    """Every preset name, with the family it builds."""
    return {name: found for found in families().values() for name in found.presets}


def preset_names() -> list[str]:
    return list(presets())


def from_preset(name: str, **overrides: Any) -> ModelConfig:
    found = presets().get(name)
    if found is None:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return found.config_class.from_preset(name, **overrides)


def resolve_config(spec: str | os.PathLike[str] | ModelConfig, **overrides: Any) -> ModelConfig:
    """A config from a preset name, a config.json path, a checkpoint directory, or a config object."""
    if isinstance(spec, ModelConfig):
        return spec.with_overrides(**overrides) if overrides else spec
    if isinstance(spec, str) and spec in presets():
        return from_preset(spec, **overrides)
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ValueError(f"{spec!r} is neither a preset ({', '.join(preset_names())}) nor an existing config.json")
    config = read_config_file(path)
    return config.with_overrides(**overrides) if overrides else config


def config_fields(model_types: Iterable[str] | None = None) -> set[str]:
    """The config field names of these families (all registered ones by default), for recipes."""
    chosen = families() if model_types is None else {t: family(t) for t in model_types}
    return {f.name for found in chosen.values() for f in dataclasses.fields(found.config_class)  # type: ignore[arg-type]
            if f.name != "extra"}


__all__ = ["BUILTIN_FAMILIES", "DEFAULT_MODEL_TYPE", "JOBS", "Family", "UnknownFamilyError", "class_for_architecture",
           "class_names",
           "config_fields", "config_from_dict", "families", "family", "from_preset", "jobs_of",
           "model_class", "preset_names", "presets", "public_name", "read_config_file", "register", "register_model", "unregister",
           "resolve_config"]


def public_name(name: str) -> Any:
    """A public name (class, preset table) defined by a registered family's package or model
    modules, for `from bertforge.model import <name>`; None if no family defines it."""
    for found in families().values():
        try:
            package = importlib.import_module(found.config_class.__module__.rsplit(".", 1)[0])
        except ImportError:  # a family defined outside a package (a test's): its modules only
            package = None
        if name in getattr(package, "__all__", ()):
            return getattr(package, name)
        for module in found.model_modules:
            loaded = importlib.import_module(module)
            if name in getattr(loaded, "__all__", ()) or (isinstance(getattr(loaded, name, None), type)
                                                          and getattr(loaded, name).__module__ == module):
                return getattr(loaded, name)
    return None
