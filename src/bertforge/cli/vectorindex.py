"""`bertforge index` and `bertforge query`: semantic search over the rows of a file
(`bertforge.vectorindex`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.cli.common import MODEL_NAME_HELP, RevisionOption, fail, library_errors, with_revision
from bertforge.cli.options import QuotingOption, reading_tables

QUERY_CHUNK = 256  # queries embedded and searched per step of --input: bounds memory on a large file
TEXT_WIDTH = 100  # characters of a row's text shown in the --query table


def index_command(
    model: Annotated[Path, typer.Option("--model", help="The embedding model: a Hugging Face-format BERT directory "
                                                        "(a sentence-transformers one is followed: its pooling, "
                                                        "normalisation and length)." + MODEL_NAME_HELP)],
    input_file: Annotated[Path, typer.Option("--input", help="The texts: .csv, .tsv, .jsonl, .parquet, or any "
                                                             "other file as plain lines (one text per line).")],
    out: Annotated[Path, typer.Option("--out", help="The index directory to write (vectors.npy, rows.jsonl, "
                                                    "index.json); an index there is replaced when the new one is "
                                                    "complete.")],
    text_column: Annotated[str, typer.Option("--text-column", help="The column holding the text (a plain-lines "
                                                                   "file has the one column 'text').")] = "text",
    id_column: Annotated[str | None, typer.Option("--id-column", help="The column holding each row's id "
                                                                      "(default: the row's line in the file, or "
                                                                      "its row number in a Parquet file).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Texts per forward pass.")] = 32,
    device: Annotated[str | None, typer.Option(help="torch device (default: where the model loads, cpu).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    revision: RevisionOption = None,
    quoting: QuotingOption = False,
) -> None:
    """Embed every row's text of a file with a model and store the vectors for `bertforge query`.

    The vectors are unit length (a dot product is the cosine); index.json records the model (a Hub model's
    commit) and its embedding settings, so that queries are embedded the same way.

    Example: `bertforge index --model models/minilm --input corpus.csv --text-column body --id-column doc_id --out runs/corpus-index`
    """
    from tqdm.auto import tqdm

    from bertforge.vectorindex import build_file

    if batch_size < 1:
        raise fail(f"--batch-size must be at least 1, got {batch_size}")
    spec = with_revision(model, revision) or str(model)
    began = time.perf_counter()
    try:
        # shown after a second: a bad input fails before it, without a bar
        with reading_tables(quoting), tqdm(unit="row", disable=quiet, desc="embedding", delay=1) as bar:
            info = build_file(spec, input_file, out, text_column=text_column, id_column=id_column,
                              batch_size=batch_size, device=device, progress=bar)
    except library_errors() as exc:
        raise fail(str(exc)) from exc
    seconds = time.perf_counter() - began
    commit = f" @ {info.commit[:12]}" if info.commit else ""
    typer.echo(f"{info.count} rows of {input_file} -> {out} ({info.dimension} dimensions, {info.pooling} pooling, "
               f"max {info.max_length} pieces; model {info.model}{commit}; {seconds:.1f}s)")
    if info.truncated:
        typer.secho(f"warning: {info.truncated} rows were longer than {info.max_length} pieces; their head was "
                    "embedded", err=True, fg=typer.colors.YELLOW)


def query_command(
    index_dir: Annotated[Path, typer.Option("--index", help="An index directory written by `bertforge index`.")],
    query: Annotated[list[str] | None, typer.Option("--query", help="A query text; repeat for several. Prints a "
                                                                    "ranked table per query.")] = None,
    input_file: Annotated[Path | None, typer.Option("--input", help="Queries from a file instead (plain lines, "
                                                                    ".csv, .tsv, .jsonl, .parquet): a ranked table per "
                                                                    "query, as --query prints, or with --out "
                                                                    "JSON lines.")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="With --input: results as JSON lines, one "
                                                           "{query, results: [{id, text, score, rank}]} per query.")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Results per query.")] = 10,
    text_column: Annotated[str, typer.Option("--text-column", help="With --input: the column holding the "
                                                                   "query text.")] = "text",
    model: Annotated[Path | None, typer.Option("--model", help="The model the index was built with, where it is "
                                                               "no longer at the recorded path (its weights must "
                                                               "be the same).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Queries per forward pass.")] = 32,
) -> None:
    """Find the rows of an index nearest each query text (cosine similarity, exact search).

    Queries are embedded with the model and settings the index recorded.

    Example: `bertforge query --index runs/corpus-index --query "how do vaccines work" --top-k 5`
    (a file of queries: `--input questions.txt`, tables on stdout; `--out results.jsonl` writes JSON lines)
    """
    if (not query) == (input_file is None):
        raise fail("give --query TEXT (one or more) or --input FILE, not both")
    if out is not None and input_file is None:
        raise fail("--out goes with --input; --query prints its results")
    if top_k < 1 or batch_size < 1:
        raise fail(f"--top-k and --batch-size must be at least 1, got {top_k} and {batch_size}")
    from bertforge.vectorindex import VectorIndex

    try:
        index = VectorIndex.load(index_dir)
        if query:
            _print_tables(query, index.search(query, top_k, model=model, batch_size=batch_size))
        else:
            assert input_file is not None
            _search_file(index, input_file, out, text_column, top_k, model, batch_size)
    except library_errors() as exc:
        raise fail(str(exc)) from exc


def _print_tables(queries: list[str], results: list[list[Any]]) -> None:
    for number, (text, hits) in enumerate(zip(queries, results, strict=True)):
        if number:
            typer.echo("")
        typer.echo(f"query: {text}")
        width = max([len(str(hit.id)) for hit in hits] + [2])
        typer.echo(f"{'rank':>4}  {'score':>6}  {'id':<{width}}  text")
        for hit in hits:
            typer.echo(f"{hit.rank:>4}  {hit.score:6.4f}  {hit.id!s:<{width}}  {_shown(hit.text)}")


def _shown(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= TEXT_WIDTH else flat[:TEXT_WIDTH - 1] + "…"


def _search_file(index: Any, input_file: Path, out: Path | None, text_column: str, top_k: int, model: Path | None,
                 batch_size: int) -> None:
    """The queries of `input_file`, a chunk at a time: JSON lines into `out`, or without it a table per
    query on stdout (the summary line then goes to stderr, so that stdout holds the tables only)."""
    import contextlib

    from bertforge.tables import iter_rows, write_rows
    from bertforge.vectorindex import row_chunks, row_text

    began, count = time.perf_counter(), 0
    rows = iter_rows(input_file, [text_column])
    with write_rows(out) if out is not None else contextlib.nullcontext() as write:
        for chunk in row_chunks(rows, QUERY_CHUNK):
            texts = [row_text(input_file, row, text_column) for row in chunk]
            results = index.search(texts, top_k, model=model, batch_size=batch_size)
            if write is None:
                if count:
                    typer.echo("")
                _print_tables(texts, results)
            else:
                for text, hits in zip(texts, results, strict=True):
                    write({"query": text, "results": [hit.as_dict() for hit in hits]})
            count += len(texts)
    seconds = time.perf_counter() - began
    typer.echo(f"{count} queries -> {out or 'stdout'} (top {min(top_k, len(index))} of {len(index)} rows; "
               f"{seconds:.1f}s)", err=out is None)

