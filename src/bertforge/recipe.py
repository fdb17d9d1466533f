"""Typed recipes: every job's settings as dataclasses, read from and written to YAML.

A recipe is a dataclass whose fields are settings or sections (nested dataclasses): `PrepareOptions`
(`bertforge.data.prepare`), the pre-training `Recipe` (`bertforge.pretrain`) and `FinetuneRecipe`
(`bertforge.finetune`). Setting names are unique across a recipe's sections, so a setting is named by
its own name (`lr`) or by its path (`optim.lr`), in a YAML file, in `--set key=value` and in the
command-line options, which are generated from the fields (`bertforge.cli`). Each default lives in
one place: the field, or, where the field's default is None, the declaration it names (a task's
`default_lr`, say).

    from bertforge.recipe import load, save, override
    recipe = load(FinetuneRecipe, "recipes/finetune/mrpc.yaml")      # unknown keys fail, located
    recipe = override(recipe, {"lr": "3e-5"}, source="--set")         # "3e-5" coerced to float
    save(recipe, "runs/mrpc/run_config.yaml")                         # the resolved recipe, reloadable

This module knows no job: it reads, checks, coerces and writes dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from bertforge.fileio import write_text_atomic

T = TypeVar("T")
_NONE = type(None)


class RecipeError(ValueError):
    """A recipe setting that cannot be used, as `source: name: what is wrong`."""


def setting(default: Any = dataclasses.MISSING, *, help: str, aliases: tuple[str, ...] = (),
            default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with its help text (shown by `--help`) and extra command-line spellings."""
    metadata = {"help": help, "aliases": aliases}
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
    settings = settings_of(type(recipe))
    changes: dict[tuple[str, ...], Any] = {}
    for key, value in values.items():
        name = key.rpartition(".")[2]
        found = settings.get(name)
        if found is None or (key != name and ".".join(found.path) != key):
            raise RecipeError(f"{source}: unknown setting {key!r}{_suggest(name, settings)}")
        changes[found.path] = coerce(value, found.type, f"{source}: {key}")
    return _replace_paths(recipe, changes, source)


def _replace_paths(recipe: T, changes: dict[tuple[str, ...], Any], source: str) -> T:
    direct = {path[0]: value for path, value in changes.items() if len(path) == 1}
    nested: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in changes.items():
        if len(path) > 1:
            nested.setdefault(path[0], {})[path[1:]] = value
    for section, inner in nested.items():
        direct[section] = _replace_paths(getattr(recipe, section), inner, f"{source}: {section}")
    values = {f.name: getattr(recipe, f.name) for f in dataclasses.fields(recipe) if f.init}
    return _build(type(recipe), {**values, **direct}, source)


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
    return from_mapping(cls, read_mapping(path), source=str(path))


def dump(recipe: Any) -> str:
    import yaml

    return yaml.safe_dump(to_mapping(recipe), sort_keys=False, default_flow_style=False)


def save(recipe: Any, path: str | Path, header: str = "") -> Path:
    """Write the recipe as YAML, atomically; `header` lines become comments at the top."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    write_text_atomic(Path(path), comment + dump(recipe))
    return Path(path)


def resolve(cls: type[T], config: str | Path | None, given: Mapping[str, Any] = (),
            assignments: Iterable[str] = (), base: T | None = None) -> T:
    """What a command runs: the defaults (or `base`), then the `config` file, then the options the user
    gave (`given`, by setting name), then `--set` assignments, each later one winning."""
    recipe = base if base is not None else cls()
    if config is not None:
        recipe = _merge(recipe, read_mapping(config), str(config))
    for name, value in dict(given).items():  # one at a time, so that an error names its option
        recipe = override(recipe, {name: value}, source=f"option --{name.replace('_', '-')}")
    values = parse_assignments(assignments)
    return override(recipe, values, source="--set") if values else recipe


def _merge(recipe: T, data: Mapping[str, Any], source: str) -> T:
    """`recipe` with the settings `data` names (nested like the recipe) replaced, checked as in `from_mapping`."""
    return from_mapping(type(recipe), _merged(type(recipe), to_mapping(recipe), data), source)


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


__all__ = ["RecipeError", "Setting", "coerce", "dump", "from_mapping", "load", "override", "parse_assignments",
           "read_mapping", "resolve", "save", "setting", "settings_of", "to_mapping"]
