"""Semantic search over a table of texts: every row embedded once by a model's embedding pipeline, kept
as unit vectors, and a query's nearest rows found by cosine similarity.

    from bertforge.vectorindex import VectorIndex
    index = VectorIndex.build("models/minilm", ["a cat sat on the mat", "stock prices fell"])
    index.search("a kitten", top_k=1)    # [[Hit(id=0, text='a cat sat on the mat', score=0.61, rank=1)]]
    index.save("runs/idx")
    VectorIndex.load("runs/idx").search(["a kitten", "markets"], top_k=5)

`build_file` does the same for a file of any size (CSV, TSV, JSONL, Parquet, plain lines: `bertforge.tables`),
streaming its rows in chunks, so memory holds the vectors and one chunk of texts, never the whole table.

An index directory holds:

    vectors.npy   float32, one row per text, L2-normalised (a dot product is the cosine)
    rows.jsonl    {"id", "text"} per row, in the vectors' order
    index.json    the model (as given, its resolved directory, the Hub repository and commit, the weights'
                  fingerprint), the embedding settings (pooling, normalize, max_length), count, dimension,
                  the input file and the bertforge version

A query is embedded with the model and settings index.json records (a Hub model at the recorded commit), so
its vector is comparable with the rows'; a local model whose weights changed since is refused.

Search is exact: one matrix product per block of queries, `argpartition` for the top k, then a sort of those
k. Measured on two busy AVX2 cores (docs/benchmarks.md, `vector-search`): under 1 ms a query at 10k rows
of 384 dimensions, 12 to 24 ms one at a time and 3 to 4 ms each in batches of 64 at 100k, about what embedding
a short query costs. An HNSW graph (faiss) answered in 0.2 ms at recall@10 0.98, but the gain is at most
half of a warm query's time at 100k, and nothing against the seconds a `bertforge query` run spends loading
the model; exact results, one file format and no native dependency were kept instead. vectors.npy is a plain
float32 array, ready for such a library when a corpus grows into the millions.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.fileio import DataFormatError, atomic_path, file_fingerprint, file_mode, same_file_contents

FORMAT = 1  # of the index directory; a reader refuses a newer one
VECTORS_FILE, ROWS_FILE, INFO_FILE = "vectors.npy", "rows.jsonl", "index.json"
CHUNK_ROWS = 4096  # rows embedded and written per step: bounds the texts held at once
QUERY_BLOCK = 256  # queries scored per matrix product: bounds the (queries x rows) score matrix
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class VectorIndexError(DataFormatError):
    """An index directory that cannot be used, located as `file: field: what is wrong`: a missing or
    unreadable file, another format, files that disagree, a model that changed since the index was built."""


@dataclass(frozen=True)
class Hit:
    """One search result: the row's id and text, its cosine similarity to the query, its 1-based rank."""

    id: Any
    text: str
    score: float
    rank: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class IndexInfo:
    """What index.json records: the model and settings a query must reuse, and what was indexed."""

    model: str  # as given (a directory or a Hub name)
    model_path: str  # the directory read (a Hub model's snapshot in the cache)
    pooling: str
    normalize: bool  # whether the model's own embedding is normalised (the stored vectors always are)
    max_length: int
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    weights: dict[str, Any] | None = None  # {"file", "size", "mtime_ns", "sha256"} of the weights read
    count: int = 0
    dimension: int = 0
    input: str | None = None
    bertforge_version: str | None = None
    truncated: int = 0  # rows longer than max_length pieces, embedded from their head
    format: int = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)  # keys a newer writer added, kept on a rewrite

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {**data.pop("extra"), **data}

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Path) -> IndexInfo:
        known = set(cls.__dataclass_fields__) - {"extra"}
        missing = sorted({"model", "model_path", "pooling", "normalize", "max_length", "count", "dimension"} - set(data))
        if missing:
            raise VectorIndexError(path, None, missing[0], "missing; not an index.json written by `bertforge index`")
        return cls(**{k: v for k, v in data.items() if k in known},
                   extra={k: v for k, v in data.items() if k not in known})


# ------------------------------------------------------------------------------------------------
# the model side: texts -> unit vectors
# ------------------------------------------------------------------------------------------------
class Embedder:
    """A model's embedding pipeline (`bertforge.pipeline`, task "embeddings") giving float32 unit vectors."""

    def __init__(self, pipe: Any, info: IndexInfo) -> None:
        self.pipe, self.info = pipe, info
        self.truncated = 0  # inputs cut to max_length so far

    @classmethod
    def open(cls, model: str | os.PathLike[str], *, revision: str | None = None, batch_size: int = 32,
             device: str | None = None, pooling: str | None = None, max_length: int | None = None,
             precision: str = "fp32") -> Embedder:
        """The embedding pipeline of `model` (a directory, or a Hub name `org/name[@revision]`): by default
        with the pooling, normalisation and length a sentence-transformers directory defines, at
        `precision` (`pipeline()`'s: fp32, bf16, int8 or auto)."""
        from bertforge.hub import resolve_local_or_hub, with_revision

        resolved = resolve_local_or_hub(with_revision(os.fspath(model), revision))
        return cls._from_resolved(os.fspath(model), resolved, weights_fingerprint(resolved.path), batch_size=batch_size,
                                  device=device, pooling=pooling, max_length=max_length, precision=precision)

    @classmethod
    def for_index(cls, info: IndexInfo, where: Path, *, model: str | os.PathLike[str] | None = None,
                  batch_size: int = 32, device: str | None = None) -> Embedder:
        """The embedder an index was built with: the recorded model (a Hub model at its recorded commit)
        or `model`, with the recorded settings; refused when its weights are not the ones recorded."""
        from bertforge.hub import resolve_local_or_hub

        spec = os.fspath(model) if model is not None else (
            f"{info.repo_id}@{info.commit}" if info.repo_id and info.commit else info.model_path)
        if model is None and not info.repo_id and not Path(spec).is_dir():
            raise VectorIndexError(where, None, "model_path", f"{spec}: no such directory; pass the model the "
                                   "index was built with (--model / model=)")
        resolved = resolve_local_or_hub(spec)
        check_same_model(info, resolved.path, spec, where)  # before loading it: a refusal costs nothing
        return cls._from_resolved(spec, resolved, info.weights, batch_size=batch_size, device=device,
                                  pooling=info.pooling, max_length=info.max_length)

    @classmethod
    def _from_resolved(cls, given: str, resolved: Any, weights: dict[str, Any] | None, **options: Any) -> Embedder:
        from bertforge.pipeline import pipeline

        pipe = pipeline(resolved.path, task="embeddings", **options)
        info = IndexInfo(model=given, model_path=str(Path(resolved.path).resolve()), pooling=pipe.pooling,
                         normalize=pipe.normalize, max_length=pipe.max_length, repo_id=resolved.repo_id,
                         revision=resolved.revision, commit=resolved.commit, weights=weights,
                         bertforge_version=installed_version())
        return cls(pipe, info)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dimension) float32 unit vectors; an empty text is embedded like any other."""
        if not texts:
            return np.zeros((0, self.info.dimension or 0), np.float32)
        prepared = self.pipe.prepare(list(texts))
        results = self.pipe.finish(prepared, self.pipe.run(prepared.features))
        self.truncated += sum(1 for result in results if result.get("truncated"))
        return unit_rows(np.asarray([result["embedding"] for result in results], dtype=np.float32))


def installed_version() -> str | None:
    """bertforge's version as installed (None from a source tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bertforge")
    except PackageNotFoundError:
        return None


def weights_fingerprint(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The fingerprint of the weights file a model directory is loaded from (None when there is none)."""
    for name in WEIGHT_FILES:
        path = Path(model_dir) / name
        if path.is_file():
            return {"file": name, **file_fingerprint(path)}
    return None


def check_same_model(recorded: IndexInfo, model_dir: str | os.PathLike[str], model: str, where: Path) -> None:
    """Refuse a model other than the one an index was built with: its vectors would not be comparable.
    (`same_file_contents` reads the weights only when their size matches and their time does not.)"""
    saved = recorded.weights
    if saved and not same_file_contents(saved, Path(model_dir) / saved["file"]):
        raise VectorIndexError(where, None, "weights", f"built with {saved['file']} sha256 {saved['sha256'][:12]} of "
                               f"{recorded.model}; {model} holds other weights: another version of the model. "
                               "Rebuild the index with `bertforge index`, or query with the model it was built with")


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    """`matrix` with each row scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


# ------------------------------------------------------------------------------------------------
# exact search
# ------------------------------------------------------------------------------------------------
def exact_search(vectors: np.ndarray, queries: np.ndarray, top_k: int,
                 block: int = QUERY_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(row indices, scores), each (queries, k), best first: the `top_k` rows of `vectors` with the largest
    dot product with each query (the cosine, for unit rows). k = min(top_k, rows)."""
    queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
    k = min(int(top_k), len(vectors))
    indices = np.empty((len(queries), k), np.int64)
    scores = np.empty((len(queries), k), np.float32)
    for start in range(0, len(queries), block):  # blocks bound the score matrix at block x rows
        part = slice(start, start + block)
        indices[part], scores[part] = top_k_of(queries[part] @ vectors.T, k)
    return indices, scores


def top_k_of(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` largest entries of each row of `scores`, best first: argpartition (linear) then a sort of k."""
    if k <= 0:
        return np.empty((len(scores), 0), np.int64), np.empty((len(scores), 0), np.float32)
    if k < scores.shape[1]:
        chosen = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        chosen = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
    top = np.take_along_axis(scores, chosen, axis=1)
    order = np.argsort(-top, axis=1, kind="stable")
    return np.take_along_axis(chosen, order, axis=1), np.take_along_axis(top, order, axis=1)


# ------------------------------------------------------------------------------------------------
# the index
# ------------------------------------------------------------------------------------------------
class VectorIndex:
    """Unit vectors of texts with their ids, searchable by a query text's cosine similarity (see the module
    docstring). Make one with `build`, `load` or `build_file`; `embedder` embeds the queries."""

    def __init__(self, vectors: np.ndarray, ids: Sequence[Any], texts: Sequence[str], info: IndexInfo,
                 embedder: Embedder | None = None) -> None:
        if not len(vectors) == len(ids) == len(texts):
            raise ValueError(f"{len(vectors)} vectors, {len(ids)} ids and {len(texts)} texts: one of each per row")
        self.vectors, self.ids, self.texts, self.info = vectors, list(ids), list(texts), info
        self.embedder = embedder
        self._embedder_key: tuple[str | None, int] | None = None  # the (model, batch_size) it was opened with
        self.where = Path(".")  # the directory it was loaded from, for messages

    def __len__(self) -> int:
        return len(self.vectors)

    def __repr__(self) -> str:
        return f"VectorIndex({len(self)} rows x {self.info.dimension}, model={self.info.model!r})"

    @classmethod
    def build(cls, model: str | os.PathLike[str], texts: Iterable[str], ids: Iterable[Any] | None = None, *,
              revision: str | None = None, batch_size: int = 32, device: str | None = None,
              pooling: str | None = None, max_length: int | None = None) -> VectorIndex:
        """Embed every text with `model`'s embedding pipeline; `ids` default to the texts' positions (0, 1, ...)."""
        embedder = Embedder.open(model, revision=revision, batch_size=batch_size, device=device, pooling=pooling,
                                 max_length=max_length)
        texts = [_checked_text(text, i) for i, text in enumerate(texts)]
        ids = list(range(len(texts))) if ids is None else list(ids)
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        chunks = [embedder(texts[start:start + CHUNK_ROWS]) for start in range(0, len(texts), CHUNK_ROWS)]
        vectors = np.concatenate(chunks) if chunks else embedder([""])[:0]
        _finish_info(embedder, len(texts), vectors.shape[1], None)
        return cls(vectors, ids, texts, embedder.info, embedder)

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index to `directory`, replacing an index there in one rename (see `publish`)."""
        directory = Path(directory)
        with staged(directory) as staging:
            write_vectors(staging / VECTORS_FILE, [self.vectors], len(self), self.info.dimension)
            with open(staging / ROWS_FILE, "w", encoding="utf-8") as handle:
                for row_id, text in zip(self.ids, self.texts, strict=True):
                    handle.write(_row_json(row_id, text) + "\n")
            write_info(staging, self.info)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, mmap: bool = False) -> VectorIndex:
        """The index saved in `directory`; `mmap` maps vectors.npy instead of reading it (the OS pages it
        in as searches touch it: for an index larger than memory, or many processes sharing one)."""
        directory = Path(directory)
        info = read_info(directory)
        vectors = read_vectors(directory / VECTORS_FILE, info, mmap)
        ids, texts = read_rows_file(directory / ROWS_FILE, info.count)
        index = cls(vectors, ids, texts, info)
        index.where = directory
        return index

    def search(self, queries: str | Sequence[str], top_k: int = 10, *, model: str | os.PathLike[str] | None = None,
               batch_size: int = 32) -> list[list[Hit]]:
        """The `top_k` rows nearest each query text, best first (one list per query; a single text is a
        list of one query). The queries are embedded as the rows were; `model` replaces the recorded
        model's path (a copy elsewhere: its weights must be the same)."""
        texts = [queries] if isinstance(queries, str) else [_checked_text(q, i) for i, q in enumerate(queries)]
        wanted = (None if model is None else os.fspath(model), batch_size)
        if self.embedder is None or (model is not None and wanted != self._embedder_key):
            # opened once, then reused: loading a model costs far more than a search
            self.embedder = Embedder.for_index(self.info, self.where / INFO_FILE, model=model, batch_size=batch_size)
            self._embedder_key = wanted
        return self.search_vectors(self.embedder(texts), top_k)

    def search_vectors(self, queries: np.ndarray, top_k: int = 10) -> list[list[Hit]]:
        """The `top_k` rows nearest each query vector (unit length, as the rows are), best first."""
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
        queries = np.atleast_2d(np.asarray(queries, dtype=np.float32))
        if queries.shape[1] != self.vectors.shape[1]:
            raise VectorIndexError(self.where / INFO_FILE, None, "dimension", f"the index holds {self.vectors.shape[1]}-"
                                   f"dimensional vectors; the queries are {queries.shape[1]}-dimensional")
        indices, scores = exact_search(self.vectors, queries, top_k)
        # scores to 6 decimals: float32 products carry no more, and 0.99999994 reads worse than 1.0
        return [[Hit(self.ids[i], self.texts[i], round(float(score), 6), rank)
                 for rank, (i, score) in enumerate(zip(row, row_scores, strict=True), start=1)]
                for row, row_scores in zip(indices.tolist(), scores.tolist(), strict=True)]


def _checked_text(value: Any, index: int) -> str:
    if not isinstance(value, str):
        raise ValueError(f"text {index}: must be a string, got {type(value).__name__}")
    return value


def _finish_info(embedder: Embedder, count: int, dimension: int, input_path: str | None) -> None:
    info = embedder.info
    info.count, info.dimension, info.input, info.truncated = count, dimension, input_path, embedder.truncated


# ------------------------------------------------------------------------------------------------
# a file of any size -> an index directory, streamed
# ------------------------------------------------------------------------------------------------
def build_file(model: str | os.PathLike[str], input_path: str | os.PathLike[str], out: str | os.PathLike[str], *,
               text_column: str = "text", id_column: str | None = None, revision: str | None = None,
               batch_size: int = 32, device: str | None = None, pooling: str | None = None,
               max_length: int | None = None, chunk_rows: int = CHUNK_ROWS, progress: Any = None) -> IndexInfo:
    """Embed the `text_column` of every row of `input_path` and write the index directory `out`.

    A row's id is its `id_column` value, else its number (`bertforge.tables.Row.number`: the line in a text
    file, the 1-based row of a Parquet file). Rows stream in chunks of `chunk_rows`; `progress` (a tqdm
    bar, say) is told how many rows each chunk held. Raises `DataFormatError` naming the file, line and
    column of a bad row; `out` is replaced only when the whole index is written."""
    from bertforge.tables import iter_rows

    input_path, out = Path(input_path), Path(out)
    check_out_dir(out)
    columns = [text_column] + ([id_column] if id_column else [])
    rows = iter_rows(input_path, columns)
    first = next(rows)  # read before the model loads: a missing file or column fails at once
    embedder = Embedder.open(model, revision=revision, batch_size=batch_size, device=device, pooling=pooling,
                             max_length=max_length)
    with staged(out) as staging:
        chunks = _embed_chunks(embedder, input_path, itertools.chain([first], rows), text_column, id_column, chunk_rows,
                               staging / ROWS_FILE, progress)
        count = sum(len(chunk) for chunk in chunks)
        dimension = chunks[0].shape[1]
        write_vectors(staging / VECTORS_FILE, chunks, count, dimension)
        _finish_info(embedder, count, dimension, str(input_path))
        write_info(staging, embedder.info)
    return embedder.info


def _embed_chunks(embedder: Embedder, path: Path, rows: Iterator[Any], text_column: str, id_column: str | None,
                  chunk_rows: int, rows_file: Path, progress: Any) -> list[np.ndarray]:
    """The vectors of every row, chunk by chunk, writing each row's id and text to `rows_file` as it goes."""
    chunks: list[np.ndarray] = []
    with open(rows_file, "w", encoding="utf-8") as handle:
        for chunk in row_chunks(rows, chunk_rows):
            texts = [row_text(path, row, text_column) for row in chunk]
            ids = [_row_id(path, row, id_column) for row in chunk]
            chunks.append(embedder(texts))
            handle.writelines(_row_json(row_id, text) + "\n" for row_id, text in zip(ids, texts, strict=True))
            if progress is not None:
                progress.update(len(chunk))
    return chunks


def row_chunks(rows: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """`rows` in lists of `size` (the last one shorter)."""
    chunk: list[Any] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def row_text(path: Path, row: Any, column: str) -> str:
    """The text in `column` of a `bertforge.tables.Row` of `path`; not text (a null, a number) is a located error."""
    value = row.values.get(column)
    if not isinstance(value, str):  # JSONL and Parquet keep types: a null or a number is no text
        shown = "null" if value is None else f"a {type(value).__name__} ({value!r:.40})"
        raise DataFormatError(path, row.number, column, f"must be text, got {shown}")
    return value


def _row_id(path: Path, row: Any, column: str | None) -> Any:
    if column is None:
        return row.number
    value = row.values.get(column)
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise DataFormatError(path, row.number, column, f"an id must be a non-empty string or a number, got {value!r:.40}")
    return value


def _row_json(row_id: Any, text: str) -> str:
    return json.dumps({"id": row_id, "text": text}, ensure_ascii=False)


# ------------------------------------------------------------------------------------------------
# the files
# ------------------------------------------------------------------------------------------------
def check_out_dir(out: Path) -> None:
    """Refuse an output that is a file, or a directory holding something other than an index: replacing it
    would delete the user's files."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out}: a file, not a directory; --out names the index directory to write")
    if out.is_dir() and any(out.iterdir()) and not (out / INFO_FILE).is_file():
        raise FileExistsError(f"{out}: a directory that holds other files and no {INFO_FILE}; choose a new or "
                              "empty directory for the index")


class staged:  # noqa: N801 - used as a context manager, like a function
    """A temporary directory beside `directory` to write an index into, renamed into place when the block
    completes (removed if it fails), so a crash or an error leaves the old index or the new one whole."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __enter__(self) -> Path:
        check_out_dir(self.directory)
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(dir=self.directory.parent, prefix=f".{self.directory.name}.", suffix=".tmp"))
        mode = file_mode()
        os.chmod(self.tmp, mode | (mode & 0o444) >> 2)  # mkdtemp's 0700 would shut other users out
        return self.tmp

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        publish(self.tmp, self.directory)


def publish(tmp: Path, directory: Path) -> None:
    """Swap the finished `tmp` in for `directory` by renames (the old index is moved aside, then deleted)."""
    old = directory.with_name(f".{directory.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def write_vectors(path: Path, chunks: Sequence[np.ndarray], count: int, dimension: int) -> None:
    """Write `chunks` (float32 rows) as one (count, dimension) .npy file, chunk by chunk: no concatenated copy."""
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                      "fortran_order": False, "shape": (count, dimension)})
        for chunk in chunks:
            handle.write(np.ascontiguousarray(chunk, dtype=np.float32).tobytes())


def write_info(directory: Path, info: IndexInfo) -> None:
    with atomic_path(directory / INFO_FILE) as tmp:
        tmp.write_text(json.dumps(info.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_info(directory: Path) -> IndexInfo:
    path = directory / INFO_FILE
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory}: no such index directory")
    if not path.is_file():
        raise VectorIndexError(path, None, None, "missing: not an index directory written by `bertforge index`")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VectorIndexError(path, None, None, f"not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise VectorIndexError(path, None, None, "not a JSON object")
    if not isinstance(data.get("format"), int) or data["format"] > FORMAT:
        raise VectorIndexError(path, None, "format", f"{data.get('format')!r}: written by a newer bertforge "
                               f"(this one reads format {FORMAT}); upgrade bertforge or rebuild the index")
    return IndexInfo.from_json(data, path)


def read_vectors(path: Path, info: IndexInfo, mmap: bool) -> np.ndarray:
    try:
        vectors = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise VectorIndexError(path, None, None, "missing; rebuild the index") from None
    except ValueError as exc:
        raise VectorIndexError(path, None, None, f"not a readable .npy file ({exc})") from None
    if vectors.dtype != np.float32 or vectors.shape != (info.count, info.dimension):
        raise VectorIndexError(path, None, None, f"holds {vectors.dtype} {vectors.shape}; index.json says float32 "
                               f"({info.count}, {info.dimension}): the files are of different builds, rebuild the index")
    return vectors


def read_rows_file(path: Path, count: int) -> tuple[list[Any], list[str]]:
    ids: list[Any] = []
    texts: list[str] = []
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                row = _parse_row(path, number, line)
                ids.append(row["id"])
                texts.append(row["text"])
    except FileNotFoundError:
        raise VectorIndexError(path, None, None, "missing; rebuild the index") from None
    except UnicodeDecodeError as exc:
        raise VectorIndexError(path, None, None, f"not UTF-8 text ({exc.reason})") from None
    if len(ids) != count:
        raise VectorIndexError(path, None, None, f"{len(ids)} rows; index.json says {count}: the files are of "
                               "different builds, rebuild the index")
    return ids, texts


def _parse_row(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise VectorIndexError(path, number, None, f"not a JSON record ({exc.msg})") from None
    if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("text"), str):
        raise VectorIndexError(path, number, None, 'expected {"id": ..., "text": "..."}')
    return row


__all__ = ["FORMAT", "Embedder", "Hit", "IndexInfo", "VectorIndex", "VectorIndexError", "build_file",
           "exact_search", "row_chunks", "row_text", "top_k_of", "unit_rows"]
