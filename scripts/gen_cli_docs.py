"""Write the command-line reference, docs/cli.md and a page per command in docs/cli/, from the typer app.

    .venv/bin/python scripts/gen_cli_docs.py           # rewrite docs/cli.md and docs/cli/
    .venv/bin/python scripts/gen_cli_docs.py --check   # exit 1 if any page is stale

docs/cli.md lists every command with what it does and holds the groups' sections; each leaf command
(`bertforge prepare`, `bertforge finetune classify`, ...) has its page, docs/cli/<command>.md. The
pages are built from the click command tree that typer makes of `bertforge.cli.app`
(`typer.main.get_command`): every group and command in the order `bertforge --help` lists them, its
usage line, its help text (the docstring, Example line included) and a table of its arguments and
options with their types, defaults and help. Nothing is read from a terminal rendering, so the page
has no ANSI codes or box drawing and does not depend on the terminal width.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "cli.md"
PAGES_DIR = "cli"  # beside cli.md: one page per leaf command
REGENERATE = ".venv/bin/python scripts/gen_cli_docs.py"


def command_tree() -> Any:
    """The root click command of the `bertforge` CLI."""
    import typer

    sys.path.insert(0, str(ROOT / "src"))  # a checkout without an installed package works too
    from bertforge.cli import app

    return typer.main.get_command(app)


def walk(command: Any, ctx: Any) -> Iterator[tuple[Any, Any]]:
    """(command, context) for `command` and everything below it, depth first, in listing order."""
    yield command, ctx
    if is_group(command):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from walk(sub, make_context(sub, name, ctx))


def is_group(command: Any) -> bool:
    return hasattr(command, "list_commands") and hasattr(command, "get_command")


def make_context(command: Any, name: str, parent: Any = None) -> Any:
    """A click context for `command`, without parsing any arguments (for paths, usage and defaults)."""
    return command.context_class(command, info_name=name, parent=parent)


def root_context(root: Any) -> Any:
    return make_context(root, "bertforge")


def visible_params(command: Any, ctx: Any) -> list[Any]:
    """Parameters shown in the reference: everything but the hidden ones and --help (every command has it)."""
    return [p for p in command.get_params(ctx)
            if not getattr(p, "hidden", False) and not (p.name == "help" and getattr(p, "is_eager", False))]


# ------------------------------------------------------------------------------------------------
# markdown pieces
# ------------------------------------------------------------------------------------------------
def anchor(path: str) -> str:
    """GitHub's heading anchor of `## <path>`: lower case, spaces to dashes, other punctuation dropped."""
    return re.sub(r"[^a-z0-9 _-]", "", path.lower()).replace(" ", "-")


def escape(text: str) -> str:
    """Markdown from help text: `<word>` outside code spans would be read as an HTML tag and vanish."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else re.sub(r"<(?=[A-Za-z/!])", "&lt;", part) for part in parts)


def cell(text: str) -> str:
    """Text for a markdown table cell: one line, pipes and tags escaped."""
    return escape(" ".join(text.split())).replace("|", "\\|")


def first_sentence(help_text: str) -> str:
    paragraph = help_text.strip().split("\n\n")[0]
    return " ".join(paragraph.split())


def type_name(param: Any, ctx: Any) -> str:
    """`int`, `path`, `path, repeatable`, `flag` ... from the parameter's own description of itself."""
    if getattr(param, "is_flag", False):
        return "flag"
    # typer's parameters describe themselves as <int>, <list[Path]>; plain click ones have a type name
    label = param.display_type(ctx).strip("<>") if hasattr(param, "display_type") else param.type.name
    inner = re.fullmatch(r"list\[(.+)\]", label)
    if inner or param.multiple:
        return f"{(inner[1] if inner else label).lower()}, repeatable"
    return label.lower()


def default_text(param: Any) -> str:
    if param.required:
        return "required"
    default = param.default
    if getattr(param, "is_flag", False):
        if isinstance(getattr(param, "show_default", None), str):  # a recipe's flag: `--flag` or `--no-flag`
            return f"`{param.show_default}`"  # (its default is None: given or not, the recipe decides)
        if param.secondary_opts:  # --check / --no-check
            if default is None:  # neither given: the command decides (its help says how)
                return ""
            return f"`{param.opts[0] if default else param.secondary_opts[0]}`"
        return "off" if not default else "on"
    if default is None or default == () or default == []:
        return ""
    if callable(default):
        return "(computed)"
    return f"`{default}`"


def option_names(param: Any) -> str:
    names = sorted(param.opts, key=lambda o: (o.startswith("--"), o))  # -i before --input
    text = ", ".join(f"`{n}`" for n in names)
    if param.secondary_opts:
        text += " / " + ", ".join(f"`{n}`" for n in param.secondary_opts)
    return text


def render_command(command: Any, ctx: Any) -> list[str]:
    path = ctx.command_path
    usage = command.get_usage(ctx).strip()
    usage = usage[len("Usage:"):].strip() if usage.startswith("Usage:") else usage
    lines = [f"## {path}", "", "```text", usage, "```", ""]
    help_text = (command.help or "").strip()
    if help_text:
        lines += [escape(help_text), ""]
    if is_group(command):
        lines += ["| command | what it does |", "|---|---|"]
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            sub_path = f"{path} {name}"
            lines.append(f"| [`{sub_path}`]({link(sub, sub_path)}) | {cell(first_sentence(sub.help or ''))} |")
        lines.append("")
        return lines
    params = visible_params(command, ctx)
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    if arguments:
        lines += ["| argument | type | required | description |", "|---|---|---|---|"]
        for p in arguments:
            name = (p.metavar or p.name).upper()
            lines.append(f"| `{name}` | {type_name(p, ctx)} | {'yes' if p.required else 'no'} | "
                         f"{cell(getattr(p, 'help', None) or '')} |")
        lines.append("")
    if options:
        lines += ["| option | type | default | description |", "|---|---|---|---|"]
        for p in options:
            lines.append(f"| {option_names(p)} | {type_name(p, ctx)} | {default_text(p)} | "
                         f"{cell(p.help or '')} |")
        lines.append("")
    return lines


def page_name(path: str) -> str:
    """docs/cli/<name>.md of a leaf command: `bertforge finetune classify` -> finetune-classify.md."""
    return "-".join(path.split()[1:]) + ".md"


def link(command: Any, path: str) -> str:
    """From docs/cli.md: a group's section on the same page, a leaf command's page."""
    return f"#{anchor(path)}" if is_group(command) else f"{PAGES_DIR}/{page_name(path)}#{anchor(path)}"


GENERATED_NOTE = (f"<!-- Generated by scripts/gen_cli_docs.py from the typer app in src/bertforge/cli/. Do not edit:"
                  f" change the code, then run `{REGENERATE}`. tests/test_docs.py fails when this page is stale. -->")


def render_pages() -> dict[str, str]:
    """Every page of the reference: "cli.md" and "cli/<command>.md" -> its text."""
    root = command_tree()
    ctx = root_context(root)
    pages = {"cli.md": render_index(root, ctx)}
    for command, sub_ctx in walk(root, ctx):
        if not is_group(command):
            lines = ["Part of the [command-line reference](../cli.md).", "", GENERATED_NOTE, "",
                     *render_command(command, sub_ctx)]
            pages[f"{PAGES_DIR}/{page_name(sub_ctx.command_path)}"] = "\n".join(lines).rstrip() + "\n"
    return pages


def render_index(root: Any, ctx: Any) -> str:
    """docs/cli.md: the contents (a link per command) and the sections of the groups."""
    lines = [
        "# Command-line reference",
        "",
        GENERATED_NOTE,
        "",
        "Every command below also takes `--help`, which prints the same text in the terminal. Paths in the",
        "examples (`models/minilm`, `data/glue`, ...) stand for your own folders; [recipes.md](recipes.md)",
        "has complete runs with the data each one needs.",
        "",
        "Contents:",
        "",
    ]
    for command, sub_ctx in walk(root, ctx):
        depth = sub_ctx.command_path.count(" ")
        path = sub_ctx.command_path
        lines.append(f"{'  ' * depth}- [`{path}`]({link(command, path)})")
    lines.append("")
    for command, sub_ctx in walk(root, ctx):
        if is_group(command):
            lines += render_command(command, sub_ctx)
    return "\n".join(lines).rstrip() + "\n"


def on_disk(docs: Path) -> dict[str, str]:
    """The reference's pages as they are under `docs` (cli.md and every page in cli/)."""
    found = {"cli.md": (docs / "cli.md").read_text(encoding="utf-8")} if (docs / "cli.md").is_file() else {}
    for page in sorted((docs / PAGES_DIR).glob("*.md")):
        found[f"{PAGES_DIR}/{page.name}"] = page.read_text(encoding="utf-8")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page differs from a fresh render")
    parser.add_argument("--docs", type=Path, default=OUTPUT.parent, help="the folder of cli.md (default docs/)")
    args = parser.parse_args(argv)
    pages = render_pages()
    if args.check:
        if on_disk(args.docs) != pages:
            print(f"the command-line reference in {args.docs} is stale; regenerate it with: {REGENERATE}",
                  file=sys.stderr)
            return 1
        print(f"{args.docs / 'cli.md'} and {args.docs / PAGES_DIR}/ are up to date")
        return 0
    for stale in (args.docs / PAGES_DIR).glob("*.md"):  # a command that is gone loses its page
        if f"{PAGES_DIR}/{stale.name}" not in pages:
            stale.unlink()
    for name, text in pages.items():
        (args.docs / name).parent.mkdir(parents=True, exist_ok=True)
        (args.docs / name).write_text(text, encoding="utf-8")
    print(f"wrote {len(pages)} pages under {args.docs} ({sum(t.count(chr(10)) for t in pages.values())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
