"""`bertforge query --input FILE` without --out prints what `--query` prints, one table per query."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from tests.tiny_models import save_tiny_encoder

TEXTS = ["the cat sat on the mat", "dogs bark at night", "stock prices fell sharply", "a bird sings in the tree"]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("query-input")
    model = save_tiny_encoder(root, " ".join(TEXTS))
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    made = CliRunner().invoke(app, ["index", "--model", str(model), "--input", str(corpus), "--out",
                                    str(root / "idx"), "--quiet"])
    assert made.exit_code == 0, made.output
    return root / "idx"


def test_input_without_out_prints_the_tables_query_prints(index_dir: Path, tmp_path: Path) -> None:
    queries = ["stock prices fell sharply", "a cat in the rain"]
    runner = CliRunner()
    by_option = runner.invoke(app, ["query", "--index", str(index_dir), "--top-k", "3",
                                    *[arg for q in queries for arg in ("--query", q)]])
    assert by_option.exit_code == 0, by_option.output
    lines = tmp_path / "queries.txt"
    lines.write_text("\n".join(queries) + "\n", encoding="utf-8")
    by_file = runner.invoke(app, ["query", "--index", str(index_dir), "--top-k", "3", "--input", str(lines)])
    assert by_file.exit_code == 0, by_file.output
    assert by_file.stdout == by_option.stdout  # the same tables, nothing else on stdout
    assert by_file.stdout.count("query: ") == 2 and by_file.stdout.splitlines()[1].split()[:2] == ["rank", "score"]
    assert "2 queries -> stdout" in by_file.stderr  # the summary stays off stdout


def test_input_with_out_still_writes_json_lines(index_dir: Path, tmp_path: Path) -> None:
    lines = tmp_path / "queries.txt"
    lines.write_text("dogs bark\n", encoding="utf-8")
    out = tmp_path / "results.jsonl"
    result = CliRunner().invoke(app, ["query", "--index", str(index_dir), "--input", str(lines), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").count("\n") == 1 and "query: " not in result.stdout
