"""A package's __init__.py says what the package exports: imports, `__all__`, and nothing that does
the package's work. The work lives in modules named for their concern, where a reader finds it.

The one exception is PEP 562's module `__getattr__` (and `__dir__`): the lazy re-export that keeps
`import bertforge` and the CLI from importing torch until a model is used."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "src" / "bertforge"
INITS = sorted(SOURCE.rglob("__init__.py"))
LAZY_HOOKS = {"__getattr__", "__dir__"}  # PEP 562: a name imported when first asked for
MAX_CODE_LINES = 40


def code_lines(path: Path) -> int:
    """Lines holding code: not blank, not only a comment, not the module docstring."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    docstring_lines: set[int] = set()
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        docstring_lines = set(range(tree.body[0].lineno, tree.body[0].end_lineno + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstring_lines)


@pytest.mark.parametrize("path", INITS, ids=[str(p.relative_to(SOURCE)) for p in INITS])
def test_an_init_only_re_exports(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef | ast.FunctionDef |
                                                                   ast.AsyncFunctionDef)]
    assert set(defined) <= LAZY_HOOKS, f"{path}: defines {sorted(set(defined) - LAZY_HOOKS)}; move them to a module"
    assert code_lines(path) <= MAX_CODE_LINES, f"{path}: {code_lines(path)} lines of code (at most {MAX_CODE_LINES})"


def test_the_check_counts_what_it_is_for(tmp_path: Path) -> None:
    sample = tmp_path / "__init__.py"
    sample.write_text('"""Doc\nstring."""\n\n# a comment\nfrom x import (\n    a,\n    b,\n)\n\n__all__ = ["a", "b"]\n')
    assert code_lines(sample) == 5
