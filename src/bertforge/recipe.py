"""Typed recipes: every job's settings as dataclasses, read from and written to YAML.

A recipe is a dataclass whose fields are settings or sections (nested dataclasses): `PrepareOptions`
(`bertforge.data.prepare`), the pre-training `Recipe` (`bertforge.pretrain`) and `FinetuneRecipe`
(`bertforge.finetune`). Setting names are unique across a recipe's sections, so a setting is named by
its own name (`lr`) or by its path (`optim.lr`), in a YAML file, in `--set key=value` and in the
command-line options, which are generated from the fields (`bertforge.cli`). Each default lives in
one place: the field, or, where the field's default is None, the declaration it names (a task's
`default_lr`, say).

Every job resolves its settings the same way, through `resolve`: the fields' defaults, then the
`--config` file, then the settings given by name (command-line options, keyword arguments), then
`--set` assignments, each later one winning:

    from bertforge.recipe import load, override, resolve, save
    recipe = resolve(FinetuneRecipe, "recipes/finetune/mrpc.yaml", {"epochs": 2}, ["lr=3e-5"])
    recipe = load(FinetuneRecipe, "recipes/finetune/mrpc.yaml")      # unknown keys fail, located
    recipe = override(recipe, {"lr": "3e-5"}, source="--set")         # "3e-5" coerced to float
    save(recipe, "runs/mrpc/run_config.yaml")                         # the resolved recipe, reloadable

What a recipe class may declare beyond its fields:

- a mapping setting whose entries are settings of their own (pre-training's `model` section: config
  fields; fine-tuning's `task_settings`) names them with `setting(keys=...)`; `--set hidden_size=256`
  or `--set model.hidden_size=256` then sets one entry, and the class's own checks judge the values;
- `records`: keys a saved `run_config.yaml` holds as facts about a run (the data directory, the world
  size), not settings; reading skips them;
- `read_config(spec)`, a classmethod: what a `--config` value that is not a recipe file means (the
  pre-training recipe takes a preset name, a config.json or a checkpoint directory there).

This module knows no job: it reads, checks, coerces and writes dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bertforge.fileio import write_text_atomic

T = TypeVar("T")
_NONE = type(None)
RUN_CONFIG_FILE = "run_config.yaml"  # every run directory's resolved recipe, itself a recipe


class RecipeError(ValueError):
    """A recipe setting that cannot be used, as `source: name: what is wrong`."""


def setting(default: Any = dataclasses.MISSING, *, help: str, aliases: tuple[str, ...] = (),
            default_factory: Any = dataclasses.MISSING, keys: Callable[[Any], Iterable[str]] | None = None) -> Any:
    """A dataclass field with its help text (shown by `--help`) and extra command-line spellings.

    `keys`, for a mapping whose entries are settings too: the entry names it takes, as a function of
    the recipe (or section) that holds it. Those names are then set one entry at a time, by name or
    by path (`hidden_size=256`, `model.hidden_size=256`)."""
    metadata = {"help": help, "aliases": aliases, "keys": keys}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Setting:
    """One leaf field of a recipe: its name, its path through the sections, its type and its help."""

    name: str
    path: tuple[str, ...]
    type: Any
    field: dataclasses.Field

    @property
    def help(self) -> str:
        return self.field.metadata.get("help", "")

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(self.field.metadata.get("aliases", ()))

    @property
    def keys(self) -> Callable[[Any], Iterable[str]] | None:
        """For a mapping of settings: the entry names it takes, given the object holding it."""
        return self.field.metadata.get("keys")

    @property
    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return None


def is_section(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def settings_of(cls: type) -> dict[str, Setting]:
    """Every leaf setting of a recipe class by name, sections flattened; the names must be unique."""
    found: dict[str, Setting] = {}

    def visit(klass: type, prefix: tuple[str, ...]) -> None:
        hints = _hints(klass)
        for field in dataclasses.fields(klass):
            hint = hints[field.name]
            if is_section(hint):
                visit(hint, (*prefix, field.name))
                continue
            if field.name in found:
                raise TypeError(f"{cls.__name__}: setting {field.name!r} appears in two sections")
            found[field.name] = Setting(field.name, (*prefix, field.name), hint, field)

    visit(cls, ())
    return found


# ------------------------------------------------------------------------------------------------
# values
# ------------------------------------------------------------------------------------------------
def coerce(value: Any, hint: Any, where: str) -> Any:
    """`value` as type `hint` (YAML and the command line give text, ints for floats, lists...)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        options = [a for a in args if a is not _NONE]
        errors = []
        for option in options:
            try:
                return coerce(value, option, where)
            except RecipeError as exc:
                errors.append(str(exc))
        raise RecipeError(errors[0] if len(errors) == 1 else f"{where}: {value!r} is not a {_describe(hint)}")
    if hint is Any:
        return value
    if origin in (list, tuple) or hint in (list, tuple):
        item = args[0] if args else Any
        if isinstance(value, str):  # "1,2,3" on the command line
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list | tuple):
            raise RecipeError(f"{where}: expected a list, got {value!r}")
        return [coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise RecipeError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if hint is bool:
        return _as_bool(value, where)
    if hint is int:
        return _as_number(value, int, where)
    if hint is float:
        return _as_number(value, float, where)
    if hint is str:
        if isinstance(value, Path):
            return str(value)
        if not isinstance(value, str):
            raise RecipeError(f"{where}: expected text, got {value!r}")
        return value
    return value


def _as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise RecipeError(f"{where}: expected true or false, got {value!r}")


def _as_number(value: Any, kind: type, where: str) -> Any:
    if isinstance(value, bool):
        raise RecipeError(f"{where}: expected a number, got {value!r}")
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        number = None
    if isinstance(number, int | float):
        if kind is float:
            return float(number)
        if float(number).is_integer():
            return int(number)
    raise RecipeError(f"{where}: expected {'a whole number' if kind is int else 'a number'}, got {value!r}")


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


# ------------------------------------------------------------------------------------------------
# building, overriding, reading and writing
# ------------------------------------------------------------------------------------------------
def from_mapping(cls: type[T], data: Mapping[str, Any], source: str = "<recipe>") -> T:
    """A recipe of class `cls` from nested mappings; unknown keys and bad values fail, located."""
    if not isinstance(data, Mapping):
        raise RecipeError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [key for key in data if key not in names]
    if unknown:
        raise RecipeError(f"{source}: unknown setting {unknown[0]!r}{_suggest(unknown[0], names)}")
    values = {}
    for key, value in data.items():
        where = f"{source}: {key}"
        values[key] = from_mapping(hints[key], value or {}, where) if is_section(hints[key]) else \
            coerce(value, hints[key], where)
    return _build(cls, values, source)


def _build(cls: type[T], values: dict[str, Any], source: str) -> T:
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RecipeError):
            raise
        raise RecipeError(f"{source}: {exc}") from exc


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(known))}"


def to_mapping(recipe: Any) -> dict[str, Any]:
    """The recipe as plain nested dicts and lists (what `save` writes)."""
    return dataclasses.asdict(recipe)


def override(recipe: T, values: Mapping[str, Any], source: str = "<override>") -> T:
    """A copy with settings replaced, each named by its name (`lr`) or its path (`optim.lr`)."""
    draft = _Draft(type(recipe), recipe)
    draft.set(values, source)
    return draft.recipe


def setting_names(recipe: Any) -> list[str]:
    """Every name `override` and `--set` take for `recipe`: its settings, then the entries its mappings of
    settings take (the pre-training model section's config fields, a task family's settings)."""
    settings = settings_of(type(recipe))
    names = list(settings)
    for mapping in settings.values():
        if mapping.keys is not None:
            names += [key for key in mapping.keys(_holder(recipe, mapping.path)) if key not in names]
    return names


def _holder(recipe: Any, path: tuple[str, ...]) -> Any:
    """The recipe or section holding the field at `path`."""
    for part in path[:-1]:
        recipe = getattr(recipe, part)
    return recipe


def _locate(recipe: Any, key: str, value: Any, source: str) -> tuple[tuple[str, ...], Any]:
    """Where `key = value` goes in `recipe`: the path of the field it sets and the field's new value."""
    settings = settings_of(type(recipe))
    name = key.rpartition(".")[2]
    found = settings.get(name)
    if found is not None and key in (name, ".".join(found.path)):
        return found.path, coerce(value, found.type, f"{source}: {key}")
    for mapping in settings.values():  # an entry of a mapping of settings: model.hidden_size
        if mapping.keys is None or key not in (name, ".".join((*mapping.path, name))):
            continue
        holder = _holder(recipe, mapping.path)
        if name in mapping.keys(holder):
            return mapping.path, {**(getattr(holder, mapping.name) or {}), name: value}
    raise RecipeError(f"{source}: unknown setting {key!r}{_suggest(name, setting_names(recipe))}")


def _set_path(values: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of the nested `values` with the one at `path` replaced."""
    out = dict(values)
    out[path[0]] = value if len(path) == 1 else _set_path(out.get(path[0]) or {}, path[1:], value)
    return out


class _Draft:
    """A recipe being resolved: the values set so far, nested like the recipe, and the recipe they make.

    Only what was set is kept, and each step builds the recipe afresh from it, so a default that
    depends on other settings (prepare's `dupe_factor` on `masking`) follows the final values instead
    of being fixed by an earlier step. Each step checks what it set, so an error names its source.
    """

    def __init__(self, cls: type[T], base: Any = None) -> None:
        self.cls = cls
        self.values: dict[str, Any] = {} if base is None else _config_data(cls, base)
        self.recipe = from_mapping(cls, self.values, "<defaults>")

    def merge(self, data: Mapping[str, Any], source: str) -> None:
        """Settings nested as in a recipe file; facts a run recorded beside them (`records`) are skipped."""
        if isinstance(data, Mapping):
            records = getattr(self.cls, "records", ())
            data = {key: value for key, value in data.items() if key not in records}
        self.values = _merged(self.cls, self.values, data)
        self.recipe = from_mapping(self.cls, self.values, source)

    def set(self, values: Mapping[str, Any], source: str) -> None:
        """Settings by name or path: the recipe's own first, then entries of its mappings of settings,
        one at a time (which entries a mapping takes may depend on the rest: the task family's)."""
        settings = settings_of(self.cls)
        own = {key: value for key, value in values.items() if key.rpartition(".")[2] in settings}
        for key, value in own.items():
            self.values = _set_path(self.values, *_locate(self.recipe, key, value, source))
        if own:
            self.recipe = from_mapping(self.cls, self.values, source)
        for key, value in values.items():
            if key not in own:
                self.values = _set_path(self.values, *_locate(self.recipe, key, value, source))
                self.recipe = from_mapping(self.cls, self.values, source)


def _config_data(cls: type, config: Any) -> dict[str, Any]:
    """The settings a `--config` value stands for: a recipe of `cls` as it is, a mapping, or a file (or
    what the class's `read_config` makes of the value)."""
    if isinstance(config, cls):
        return to_mapping(config)
    if isinstance(config, Mapping):
        return dict(config)
    reader = getattr(cls, "read_config", None)
    return dict(reader(config)) if reader is not None else read_mapping(config)


def parse_assignments(items: Iterable[str], source: str = "--set") -> dict[str, Any]:
    """`["lr=3e-5", "optim.schedule=cosine"]` -> {"lr": 3e-05, "optim.schedule": "cosine"} (YAML values)."""
    import yaml

    values: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise RecipeError(f"{source}: expected key=value, got {item!r}")
        try:
            values[key.strip()] = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise RecipeError(f"{source}: {key.strip()}: cannot read {text!r} ({exc})") from exc
    return values


def read_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML (or JSON) file; a syntax error names the file and line."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise RecipeError(f"{path}: no such recipe file") from exc
    except UnicodeDecodeError as exc:
        raise RecipeError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        data = yaml.safe_load(text)  # YAML is a superset of JSON
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise RecipeError(f"{where}: invalid YAML/JSON ({getattr(exc, 'problem', exc)})") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: expected a mapping of settings at the top, got {type(data).__name__}")
    return data


def load(cls: type[T], path: str | Path) -> T:
    """The recipe a file holds (a run's `run_config.yaml` too), checked; unknown keys fail, located."""
    return resolve(cls, Path(path))


def dump(recipe: Any) -> str:
    import yaml

    return yaml.safe_dump(to_mapping(recipe), sort_keys=False, default_flow_style=False)


def save(recipe: Any, path: str | Path, header: str = "", records: str = "") -> Path:
    """Write the recipe as YAML, atomically; `header` lines become comments at the top, `records` (YAML of
    keys the recipe class lists as `records`) follows the settings."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    write_text_atomic(Path(path), comment + dump(recipe) + records)
    return Path(path)


def resolve(cls: type[T], config: Any = None, given: Mapping[str, Any] = (), assignments: Iterable[str] = (),
            base: Any = None, *, given_as: str = "option --{flag}") -> T:
    """What a job runs, resolved in the same order for every job, each later step winning:

    1. the fields' defaults (or `base`: a recipe of `cls` or a mapping of settings to start from);
    2. `config`: a recipe file (or what `cls.read_config` makes of the value), a mapping, or a recipe;
    3. `given`: settings by name or path, one at a time (a command's options, a function's keyword
       arguments; `given_as` names them in errors, with `{name}` or `{flag}`);
    4. `assignments`: `--set key=value` strings, values read as YAML.

    Every value is checked and coerced as it comes, and the recipe is built once more from all of them
    at each step, so a setting's derived default follows the final values.
    """
    draft = _Draft(cls, base)
    if config is not None:
        draft.merge(_config_data(cls, config), "<recipe>" if isinstance(config, cls | Mapping) else str(config))
    for name, value in dict(given).items():  # one at a time, so that an error names its option
        draft.set({name: value}, given_as.format(name=name, flag=name.replace("_", "-")))
    values = parse_assignments(assignments)
    if values:
        draft.set(values, "--set")
    return draft.recipe


def _merged(cls: type, base: dict[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated by `data`, section by section (a section is merged, any other value replaced)."""
    if not isinstance(data, Mapping):
        return data  # from_mapping reports it
    hints = _hints(cls)
    out = dict(base)
    for key, value in data.items():
        hint = hints.get(key)
        out[key] = _merged(hint, base.get(key, {}), value or {}) if hint is not None and is_section(hint) else value
    return out


__all__ = ["RUN_CONFIG_FILE", "RecipeError", "Setting", "coerce", "dump", "from_mapping", "load", "override",
           "parse_assignments", "read_mapping", "resolve", "save", "setting", "setting_names", "settings_of",
           "to_mapping"]
