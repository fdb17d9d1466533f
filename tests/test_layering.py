"""The package's layering, read from the source: who may import whom.

Every `import` statement counts, wherever it is: at module top, inside a function (the lazy imports
that keep the CLI fast) and under `if TYPE_CHECKING:`. A lazy or type-only import still ties the
lower module to the higher one's names, so it is held to the same rules.

Layers, bottom to top; a module may import from its own top-level package or module and from any
layer below, never from a layer above. Names on one line are siblings that must not import each
other (so `data` never sees the model: it prepares token ids for any encoder).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "bertforge"

LAYERS: list[tuple[str, ...]] = [
    ("fileio", "threads", "devices", "hub"),  # hub: model names resolved to cached snapshots; threads: the process's CPU thread policy (fair share of a busy machine); devices: which torch device can run here
    ("formats", "hubdata"),  # which format a user's file holds; hubdata: data set names resolved to cached Parquet files
    ("recipe", "tables"),  # settings dataclasses (knows no job); users' files as streamed rows
    ("config",),
    ("tokenizer",),
    ("checkpoint", "sentence_config"),  # the file format: knows the key map, not the model classes; sentence-transformers' embedding files
    ("model", "data"),
    ("train", "precision"),  # a training loop for any nn.Module; inference at fp32, bf16 or int8
    ("quantization_report",),  # what int8 changed against fp32 on a sample: measured, judged, written beside the model
    ("features", "plot", "tasks", "finetuned"),  # frozen features; figures; task readers, features, metrics; the fine-tuned model directory
    ("modelcard",),  # a model directory's Hub card and upload: every job that makes a model directory writes one
    ("pretrain",),  # shards -> an encoder, through the one loop
    ("adapt",),  # continued pre-training of a checkpoint on the user's text: prepare + pretrain
    ("finetune", "analysis", "export", "ablation"),  # ablation: frozen features + tasks.ner; finetune may adapt first
    ("engine",),  # the engine behind the pipeline: the model itself, or its ONNX graph in ONNX Runtime
    ("caches",),  # what bertforge keeps outside run directories (the engine's ONNX cache, derived data sets), measured and cleared
    ("pipeline", "search"),  # inference for any model: the tasks' featurize/postprocess with the saved settings; search: a grid of fine-tuning runs
    ("vectorindex",),  # semantic search over a file's rows, embedded by the pipeline
    ("distill",),  # teacher -> student through the one loop, on the tasks of finetune, the shards of pretrain, or a sentence encoder's vectors of a file
    ("serve", "quickstart"),
    ("cli",),
    ("",),  # `bertforge` itself: lazy re-exports of the public names
]

# (importer, imported) pairs that break the rules above on purpose, each with the reason. Keep it
# short: fix an import rather than listing it here.
EXCEPTIONS: dict[tuple[str, str], str] = {
}


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted((SOURCE / PACKAGE).rglob("*.py"))}


def resolve(module: str, importer: str, level: int, is_package: bool) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `importer`."""
    if not level:
        return module
    base = importer.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import of our package in one file.

    `from pkg import sub` counts as importing the module `pkg.sub` when that is a module.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = resolve(node.module or "", name, node.level, path.name == "__init__.py")
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule, "", node.lineno) if submodule in modules
                             else (source, alias.name, node.lineno))
    return [(target, imported, line) for target, imported, line in found
            if target == PACKAGE or target.startswith(PACKAGE + ".")]


def graph() -> dict[str, list[tuple[str, str, int]]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def group(module: str) -> str:
    """The top-level package or module of ours that `module` belongs to ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module: str) -> int:
    for index, names in enumerate(LAYERS):
        if group(module) in names:
            return index
    raise AssertionError(f"{module}: in no layer; add {group(module)!r} to LAYERS in {__file__}")


def test_every_module_has_a_layer() -> None:
    for module in all_modules():
        layer_of(module)


@pytest.mark.slow
def test_no_import_goes_up_or_sideways() -> None:
    wrong = []
    for importer, imports in graph().items():
        for target, _, line in imports:
            if group(importer) == group(target) or (importer, target) in EXCEPTIONS:
                continue
            if layer_of(target) >= layer_of(importer):
                direction = "a sibling" if layer_of(target) == layer_of(importer) else "a higher layer"
                wrong.append(f"{importer}:{line} imports {target}, {direction}")
    assert not wrong, "imports against the layering (see LAYERS):\n" + "\n".join(sorted(set(wrong)))


def test_no_import_circles() -> None:
    edges = {importer: sorted({target for target, _, _ in imports
                               if target != importer and (importer, target) not in EXCEPTIONS})
             for importer, imports in graph().items()}
    circles = []
    state: dict[str, str] = {}  # "active" while on the path, "done" once all its imports are explored

    def visit(module: str, path: list[str]) -> None:
        state[module] = "active"
        for target in edges.get(module, []):
            if state.get(target) == "active":
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_private_names_cross_modules() -> None:
    wrong = [f"{importer}:{line} imports {imported} from {target}"
             for importer, imports in graph().items()
             for target, imported, line in imports
             if imported.startswith("_") and not imported.startswith("__") and target != importer]
    assert not wrong, "private names used outside their module:\n" + "\n".join(wrong)


def test_the_rules_catch_what_they_are_for(tmp_path, monkeypatch) -> None:
    """The checks above on a made-up package: an upward import, a circle, a private name."""
    package = tmp_path / PACKAGE
    (package / "model").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("")
    (package / "config.py").write_text("def f():\n    from bertforge.checkpoint import _helper\n")
    (package / "checkpoint.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bertforge.model import bert\n"
        "def _helper(): ...\n")
    (package / "model" / "bert.py").write_text("from bertforge import checkpoint\n")
    monkeypatch.setitem(globals(), "SOURCE", tmp_path)  # the checks read the module-level SOURCE
    edges = graph()
    assert ("bertforge.model.bert", "", 3) in edges["bertforge.checkpoint"]
    assert ("bertforge.checkpoint", "_helper", 2) in edges["bertforge.config"]
    for check in (test_no_import_goes_up_or_sideways, test_no_import_circles, test_no_private_names_cross_modules):
        try:
            check()
        except AssertionError:
            continue
        raise AssertionError(f"{check.__name__} passed on a package that breaks it")


# ------------------------------------------------------------------------------------------------
# Model families stay in their folders
# ------------------------------------------------------------------------------------------------
# A model family is a folder under bertforge/model/ whose __init__.py defines FAMILY. Its names (the
# classes its modules define and its model_type) appear only inside that folder, in the registry, and
# in the package's public re-exports, so that adding or changing a family never means editing
# modules that use models: they ask the registry for "the token-classification model of this
# checkpoint" instead.
FAMILY_NAME_HOMES = ("bertforge.model.registry", "bertforge")  # the registry; the public names of `bertforge`


def family_folders() -> dict[str, Path]:
    """Each family's module prefix (bertforge.model.bert) -> its folder."""
    root = SOURCE / PACKAGE / "model"
    return {f"{PACKAGE}.model.{init.parent.name}": init.parent for init in sorted(root.glob("*/__init__.py"))
            if "FAMILY = " in init.read_text(encoding="utf-8")}


def names_of_family(folder: Path) -> set[str]:
    """The classes the family's modules define, and its model_type."""
    names: set[str] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                names.add(node.name)
            target = getattr(node, "target", None) if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == "model_type" and isinstance(node.value, ast.Constant):
                names.add(node.value.value)
    return names


def mentions(path: Path, names: set[str], prefix: str) -> list[tuple[int, str]]:
    """(line, name) for each use of one of `names` (an identifier, an attribute, an imported name or
    a string equal to it) or an import of the module `prefix`; docstrings and comments do not count."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        used = None
        if isinstance(node, ast.Name):
            used = node.id
        elif isinstance(node, ast.Attribute):
            used = node.attr
        elif isinstance(node, ast.alias):
            used = node.name if node.name in names else (node.name if node.name.startswith(prefix) else None)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(prefix):
            used = node.module
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _names_a_model(node.value, names):
            used = node.value
        if used is not None and (used in names or used == prefix or used.startswith(prefix + ".")):
            found.append((getattr(node, "lineno", 0), used))
    return found


def _names_a_model(text: str, names: set[str]) -> bool:
    """A string that is a family's model_type or the name of one of its model or config classes
    (as config.json's `architectures` lists them); not a word that a building block happens to share."""
    return text in names and (text.islower() or text.endswith(("Model", "Config")) or "For" in text)


def family_name_leaks() -> list[str]:
    modules = all_modules()
    leaks = []
    for prefix, folder in family_folders().items():
        names = names_of_family(folder)
        for module, path in modules.items():
            if module == prefix or module.startswith(prefix + ".") or module in FAMILY_NAME_HOMES:
                continue
            leaks += [f"{module}:{line} names {used} (of {prefix})" for line, used in mentions(path, names, prefix)]
    return sorted(set(leaks))


@pytest.mark.slow
def test_family_names_stay_in_their_folders() -> None:
    assert family_folders(), "no model family found under bertforge/model/"
    leaks = family_name_leaks()
    assert not leaks, ("a model family named outside its folder and the registry; ask bertforge.model.registry "
                       "(model_class(model_type, job), the config's own fields) instead:\n" + "\n".join(leaks))


def test_the_family_check_catches_a_leak(tmp_path, monkeypatch) -> None:
    """The check above on a made-up package: a task module that names a family's class."""
    package = tmp_path / PACKAGE
    (package / "model" / "toy").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model" / "__init__.py").write_text("")
    (package / "model" / "registry.py").write_text("BUILTIN = ('bertforge.model.toy',)\n")
    (package / "model" / "toy" / "__init__.py").write_text("FAMILY = None\n")
    (package / "model" / "toy" / "modeling.py").write_text("class ToyModel:\n    model_type: str = 'toy'\n")
    (package / "tasks.py").write_text("def head():\n    from bertforge.model.toy.modeling import ToyModel\n"
                                      "    return ToyModel if 'toy' else None\n")
    monkeypatch.setitem(globals(), "SOURCE", tmp_path)
    leaks = family_name_leaks()
    assert any("bertforge.tasks:2 names ToyModel" in leak for leak in leaks), leaks
    assert any("names toy (of" in leak for leak in leaks), leaks
    assert not any(leak.startswith("bertforge.model.registry") for leak in leaks)


# ------------------------------------------------------------------------------------------------
# Task families stay in their files
# ------------------------------------------------------------------------------------------------
# A task family is one file in bertforge/tasks/ (besides base.py, metrics.py and the registry,
# registry.py, which __init__.py re-exports). Outside tasks/ nothing imports such a file or names
# its classes, and no code decides by a family's name (a call naming a family, a tuple or dict of
# family names): the finetune commands, predict, the pipeline and serve ask the registered Task
# classes instead.
TASKS_SHARED = {"__init__", "base", "metrics", "registry"}
# (module, task family file) pairs that use one family on purpose, each with the reason.
TASK_FAMILY_USERS: dict[tuple[str, str], str] = {
    ("bertforge.ablation", "bertforge.tasks.ner"): "the feature-based NER study reproduces the paper's CoNLL-2003 table",
    ("bertforge.cli.inspect", "bertforge.tasks.squad"): "`bertforge evaluate squad` is the official SQuAD script on a file",
}
# Applications that run one benchmark by name (not machinery that should work for any family).
TASK_FAMILY_APPLICATIONS = {"bertforge.quickstart.stages"}  # the bundled SST-2 demo
TASK_CALLS = {"make_task", "finetune", "predict", "FinetuneRecipe"}


def task_family_files() -> dict[str, tuple[Path, set[str], str]]:
    """Each task family module -> (its file, the classes it defines, its family name)."""
    found = {}
    for path in sorted((SOURCE / PACKAGE / "tasks").glob("*.py")):
        if path.stem in TASKS_SHARED:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}
        family = next((node.value.value for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
                       and isinstance(node.target, ast.Name) and node.target.id == "family"
                       and isinstance(node.value, ast.Constant)), path.stem)
        found[f"{PACKAGE}.tasks.{path.stem}"] = (path, classes, family)
    return found


def task_family_leaks() -> list[str]:
    files = task_family_files()
    family_names = {family for _, _, family in files.values()}
    leaks = []
    for module, path in all_modules().items():
        if group(module) == "tasks":
            continue
        for target, imported, line in imports_of(module, path, all_modules()):
            if target in files and (module, target) not in TASK_FAMILY_USERS:
                leaks.append(f"{module}:{line} imports {target}{f' ({imported})' if imported else ''}")
        if module in TASK_FAMILY_APPLICATIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                values = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "family")]
                named = [v.value for v in values if isinstance(v, ast.Constant) and v.value in family_names]
                if name in TASK_CALLS and named:
                    leaks.append(f"{module}:{node.lineno} calls {name} with the family {named[0]!r}")
            elements = (node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set)
                        else node.keys if isinstance(node, ast.Dict) else [])
            strings = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(strings) >= 2 and len(strings) == len(elements) and set(strings) <= family_names:
                leaks.append(f"{module}:{node.lineno} lists task families {strings}")
    return sorted(set(leaks))


@pytest.mark.slow
def test_task_family_names_stay_in_their_files() -> None:
    assert task_family_files(), "no task family found in bertforge/tasks/"
    leaks = task_family_leaks()
    assert not leaks, ("a task family named outside its file and the registry; ask the Task classes "
                       "(bertforge.tasks.FAMILIES, inference_task_of, default_task_for) instead:\n" + "\n".join(leaks))


def test_the_task_family_check_catches_a_leak(tmp_path, monkeypatch) -> None:
    package = tmp_path / PACKAGE
    (package / "tasks").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tasks" / "__init__.py").write_text("from bertforge.tasks.toy import Toy\n")
    (package / "tasks" / "toy.py").write_text("class Toy:\n    family: str = 'toy'\n")
    (package / "tasks" / "other.py").write_text("class Other:\n    family: str = 'other'\n")
    (package / "pipeline.py").write_text("from bertforge.tasks.toy import Toy\n"
                                         "def f(x):\n    make_task('toy')\n    return x in ('toy', 'other')\n")
    monkeypatch.setitem(globals(), "SOURCE", tmp_path)
    leaks = task_family_leaks()
    assert any("bertforge.pipeline:1 imports bertforge.tasks.toy" in leak for leak in leaks), leaks
    assert any("calls make_task with the family 'toy'" in leak for leak in leaks), leaks
    assert any("lists task families" in leak for leak in leaks), leaks
