"""Files in, files out: `bertforge predict --input`.

`predict_file` streams a table (CSV, TSV, JSONL, Parquet, plain lines: `bertforge.tables`) through the
pipeline in chunks of rows, so a file of any size is read, predicted and written with bounded memory,
in input order.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.fileio import DataFormatError
from bertforge.pipeline.runners import InputError, count_truncated, output_row, positive_int

ON_ERROR = ("record", "skip", "stop")  # what predict_file does with a row the task cannot answer


def input_columns(task: str, *, text_column: str = "text", pair_column: str | None = None,
                  question_column: str = "question", context_column: str = "context") -> dict[str, str]:
    """The input fields of `task` -> the file's column holding each."""
    if task == "question-answering":
        return {"question": question_column, "context": context_column}
    if task == "multiple-choice":  # SWAG's own columns
        return {"context": "sent1", "start": "sent2", **{f"ending{k}": f"ending{k}" for k in range(4)}}
    columns = {"text": text_column}
    if pair_column:
        if task != "text-classification":
            raise ValueError(f"a pair column goes with text-classification, not {task}")
        columns["text_pair"] = pair_column
    return columns


def predict_file(pipe: Any, input_path: str | Path, out_path: str | Path, *, text_column: str = "text",
                 pair_column: str | None = None, question_column: str = "question",
                 context_column: str = "context", keep_columns: Sequence[str] = (), chunk_rows: int = 4096,
                 progress: bool = True, on_error: str = "record", keep_input: bool = True,
                 vector_dtype: str = "float32", **options: Any) -> dict[str, Any]:
    """Predict every row of a table with `pipe` (a `Pipeline`; any `bertforge.tables` format, decided by `bertforge.formats`; plain
    lines only for a task that reads one text column) into `out_path` (.jsonl, .csv, .tsv).

    Rows are read `chunk_rows` at a time; each chunk is featurised, run in length-sorted batches and
    written in input order before the next chunk is read, so memory does not grow with the file.
    Each output row starts with where its input is and what it read (`keep_input`, the default): `row`
    (the input's line, or row in a Parquet file, as error messages count them and as fine-tuning's
    prediction files name it), the file's `id` column
    when it has one, and the text read (the text and pair columns; QA's question; nothing for multiple
    choice), so a row can be read on its own; `keep_columns` are copied after them. The output appears only
    when complete. An empty text is an input like any other where the task answers it (classification,
    tagging, embeddings, as transformers' pipelines do). A row the task cannot answer (a fill-mask text
    without [MASK], an empty question or context, an empty cell, a cell that is not text) is decided by `on_error`: "record" (the
    default) writes the row with `error` saying what is wrong, where it is ("FILE:LINE: COLUMN: ...")
    instead of a prediction, and goes on; "skip" leaves it out and goes on; "stop" ends the run with
    `DataFormatError` naming its line, and nothing is written. Returns {"rows", "seconds",
    "rows_per_second", "out", "truncated" (rows cut to max_length), "windowed" (rows read in more than
    one window), "errors" (rows recorded or skipped), "first_error"}.
    """
    from bertforge.formats import detect_format
    from bertforge.tables import LINES_COLUMN, TABLE_FORMATS, iter_rows, write_rows

    chunk_rows = positive_int(chunk_rows, "chunk_rows")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
    input_path = Path(input_path)
    columns = input_columns(pipe.task, text_column=text_column, pair_column=pair_column,
                            question_column=question_column, context_column=context_column)
    echoed = echoed_columns(pipe.task, input_path, columns) if keep_input else []
    keep_columns = list(dict.fromkeys([*echoed, *keep_columns]))
    wanted = list(dict.fromkeys([*columns.values(), *keep_columns]))
    # plain lines have the one column "text": read a file as lines only when that is all the task needs
    accept = [f for f in TABLE_FORMATS if f != "lines" or set(wanted) <= {LINES_COLUMN}]
    rows = iter_rows(input_path, wanted, fmt=detect_format(input_path, accept))
    started, count, truncated, windowed, errors = time.perf_counter(), 0, 0, 0, []
    bar = _progress_bar(progress, input_path)
    try:
        writer = (embedding_matrix(out_path, vector_dtype, pipe.pooling) if Path(out_path).suffix == ".npy" and pipe.task == "embeddings"
                  else write_rows(out_path, always=("error",) if on_error == "record" else ()))
        with writer as write:
            for chunk in _chunks(rows, chunk_rows):
                results, failed = _predict_chunk(pipe, input_path, chunk, columns, options, stop=on_error == "stop")
                truncated += count_truncated(results)
                windowed += sum(1 for r in results if isinstance(r, dict) and r.get("windows", 1) > 1)
                answers = iter(results)
                for position, row in enumerate(chunk):
                    kept = {**({"row": row.number} if keep_input else {}),
                            **{name: row.values.get(name) for name in keep_columns}}
                    if position in failed:
                        errors.append(failed[position])
                        if on_error == "record":
                            write({**kept, "error": failed[position]})
                        continue
                    write({**kept, **output_row(pipe.task, next(answers), all_scores=pipe.all_scores)})
                count += len(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - started
    return {"rows": count, "seconds": seconds, "rows_per_second": count / seconds if seconds else math.inf,
            "out": str(out_path), "truncated": truncated, "windowed": windowed, "errors": len(errors),
            "first_error": errors[0] if errors else None}


@contextmanager
def embedding_matrix(path: str | Path, dtype: str = "float32",
                     pipe_pooling: str | None = None) -> Iterator[Callable[[dict[str, Any]], None]]:
    """The embeddings task's rows into a .npy matrix, one row per written row, streamed; beside it
    `<file>.index.json` (`bertforge.features.FeatureFile` reads the pair) keeps each row's other
    fields (its input row, id, text, error). A row recorded as an error is a row of NaN, so matrix row i
    is always item i of the index."""
    from bertforge.features import StreamingMatrix, index_path
    from bertforge.fileio import write_text_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    matrix: StreamingMatrix | None = None
    pending: list[dict[str, Any]] = []  # error rows before the first vector says the width
    index: list[dict[str, Any]] = []

    def write(row: dict[str, Any]) -> None:
        nonlocal matrix
        vector = row.pop("embedding", None)
        index.append({**row, "start": len(index), "end": len(index) + 1})  # FeatureFile's items
        if vector is None:
            if matrix is None:
                pending.append(row)
            else:
                matrix.append(np.full((1, matrix.row_shape[0]), np.nan))
            return
        if matrix is None:
            matrix = StreamingMatrix(path, (len(vector),), np.dtype(dtype))
            for _ in pending:
                matrix.append(np.full((1, len(vector)), np.nan))
        matrix.append(np.asarray(vector, dtype=np.float32)[None, :])

    try:
        yield write
    except BaseException:
        if matrix is not None:
            matrix.abort()
        raise
    if matrix is None:
        raise ValueError(f"{path}: no row could be embedded, so the vectors' width is unknown and no .npy was written")
    matrix.finish([], {})
    summary = {"format": "npy", "unit": "line", "pool": pipe_pooling, "row_shape": list(matrix.row_shape),
               "dtype": dtype, "rows": matrix.rows, "inputs": len(index)}
    write_text_atomic(index_path(path), json.dumps({**summary, "items": index}, ensure_ascii=False) + "\n")


def echoed_columns(task: str, path: Path, columns: dict[str, str]) -> list[str]:
    """The input columns an output row repeats: the file's `id` column if it has one, and the text read
    (a QA context and multiple choice's fields are left out: long, or several)."""
    from bertforge.tables import column_names, table_format

    try:  # a plain-lines file has the one column; a table's first record is read once more for its names
        found = [] if table_format(path) == "lines" else column_names(path)
    except (StopIteration, DataFormatError, OSError):
        found = []  # an empty or unreadable file: the reader says so in its own words
    texts = [] if task == "multiple-choice" else [c for field, c in columns.items() if field != "context"]
    return (["id"] if "id" in found and "id" not in texts else []) + texts


def _predict_chunk(pipe: Any, path: Path, chunk: list[Any], columns: dict[str, str],
                   options: dict[str, Any], *, stop: bool) -> tuple[list[Any], dict[int, str]]:
    """(the results of the chunk's answerable rows, in order; {position in the chunk: what is wrong}
    for the others). With `stop` the first bad row raises `DataFormatError` instead."""
    failed: dict[int, str] = {}
    inputs: dict[int, Any] = {}
    for position, row in enumerate(chunk):
        try:
            inputs[position] = _row_input(path, row, columns, words=pipe.task == "token-classification")
        except DataFormatError as exc:
            if stop:
                raise
            failed[position] = str(exc)
    if pipe.task == "multiple-choice":
        inputs = {i: {"context": v["context"], "start": v["start"], "endings": [v[f"ending{k}"] for k in range(4)]}
                  for i, v in inputs.items()}
    while inputs:
        order = list(inputs)
        try:
            prepared = pipe.prepare([inputs[i] for i in order])
            break
        except InputError as exc:  # locate it in the file; without `stop`, set the row aside and go on
            position = order[exc.index]
            error = DataFormatError(path, chunk[position].number, columns.get(exc.field or "", exc.field), exc.detail)
            if stop:
                raise error from None
            failed[position] = str(error)
            del inputs[position]
    else:
        return [], failed  # no row of the chunk was answerable
    return pipe.finish(prepared, pipe.run(prepared.features, **options), **options), failed


def _chunks(rows: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """Lists of at most `size` items, pulled from `rows` only as each list is asked for."""
    while chunk := list(itertools.islice(rows, size)):
        yield chunk


def _row_input(path: Path, row: Any, columns: dict[str, str], *, words: bool = False) -> dict[str, Any]:
    """The task's inputs of one row; with `words` (tagging) a list of words stands for a text split already."""
    values = {}
    for name, column in columns.items():
        value = row.values.get(column)
        if words and isinstance(value, list) and value:
            values[name] = value  # the runner checks each word
            continue
        if not isinstance(value, str):
            what = "empty" if value is None else (f"not text ({type(value).__name__}); name the column that "
                                                  "holds the text")
            raise DataFormatError(path, row.number, column, what)
        values[name] = value  # an empty text too: the task answers it, or says why not (InputError)
    return values


def _progress_bar(progress: bool, path: Path) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(desc=f"predict {path.name}", unit=" rows", file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
