"""`prepare`: text, JSON lines and Parquet -> shards of pre-training instances, in parallel, streaming and
resumable.

The work is cut into shards (`sources.cut_ranges`: byte ranges of text cut at blank lines, of JSON lines
at line ends, Parquet at row groups; a compressed file whole); each shard is made by one process from
its own ranges, with its own random streams seeded from `(seed, shard index)`, so the output depends
only on the inputs, the options, the seed and the number of shards (which is `max(workers, input size
/ shard_mb)`), never on timing. A shard is finished when its record `done/shard_XXXXX.json` exists; it
is written after the shard's data, so an interrupted run, started again with the same arguments,
redoes only the shards that have no record.

Parts (`part="I/N"`, for N machines): the input is first cut into N parts by the same rule, part I
alone is prepared into `out/part-I-of-N` in `ceil(part size / shard_mb)` shards (so a part does not
depend on the machine's number of workers), with random streams seeded from `(seed, shard, I, N)`.
:func:`merge_parts` then writes the dataset index over the N part directories, and the loader reads
their shards in place.

NotNext partners: every shard keeps a :class:`~bertforge.data.instances.DocumentPool` of recent
documents of its own range and draws NotNext segments from documents other than the current one,
from another file when the pool holds one. So that the first documents of a shard have partners too
(a shard may start with a long book), the pool is first filled with the first document of each file
and the documents found at 16 places spread over the shard's range. A shard whose range holds a single document has no partner at all: it
falls back to the actual next segment and counts `random_next_fallbacks`, reported as a warning.
(In plain text a document is a section: chapters set apart by 3+ blank lines, so one book is enough.)

Validation: a fraction of the blocks (chosen by a hash of their text, so independent of the seed and
of the vocabulary, whose training is not reproducible bit for bit) goes to `valid/` instead of `train/`; it is made with fixed random streams and always masked
statically, once, so the validation loss is comparable between runs with different seeds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.data.corpus import (
    BAD_BYTES_POLICIES,
    SECTION_BLANK_LINES,
    DataError,
    InputRange,
    ReadStats,
    next_document_start,
)
from bertforge.data.instances import (
    OBJECTIVES,
    BufferedDraws,
    DocumentPool,
    InstanceMaker,
    SentenceBlock,
)
from bertforge.data.masking import IGNORE_INDEX, Masker, continuation_flags
from bertforge.data.prepare_stats import DATASET_FORMAT, collect_stats, merge_parts
from bertforge.data.records import BAD_RECORDS_POLICIES, parquet_layout
from bertforge.data.shards import ShardWriter, read_json, shard_name, token_dtype
from bertforge.data.sources import cut_ranges, expand_inputs, input_bodies, read_blocks
from bertforge.fileio import LOCK_FILE, atomic_path, run_lock, write_text_atomic
from bertforge.recipe import RUN_CONFIG_FILE, resolve, setting
from bertforge.recipe import save as save_recipe

__all__ = ["MASKING_MODES", "RUN_CONFIG_FILE", "DataWarning", "PrepareOptions", "merge_parts", "parse_part", "prepare"]

MASKING_MODES = ("static", "dynamic")
VALIDATION_SEED = 20181011  # fixed: validation instances and masks do not depend on `seed`
_POOL_SEED = 7  # fixed: which blocks the NotNext pool keeps does not depend on `seed` either
_PREFILL_PROBES = 16
_BATCH = 2048  # instances masked and written at a time


class DataWarning(UserWarning):
    """Input problems that `prepare` skipped and counted (bad bytes, empty files, overlong lines...)."""


@dataclass
class PrepareOptions:
    """Everything `prepare` makes shards from: the inputs, the tokenizer and how instances are made.

    One section, the recipe of `bertforge prepare` (`--config FILE`, `--set key=value`, or one option
    per setting); DATA/run_config.yaml holds it resolved.
    """

    inputs: list[str] = setting(default_factory=list, aliases=("--input", "-i"),
                                help="File, directory or glob pattern (repeat): .txt, .jsonl, .parquet, .csv, "
                                     ".tsv, and those but Parquet compressed (.gz, .bz2, .xz, .zst).")
    tokenizer: str | None = setting(None, help="Tokenizer directory (vocab.txt ...).")
    max_seq_length: int = setting(128, help="Tokens per instance, [CLS] and [SEP] included.")
    workers: int = setting(1, help="Processes, one shard each at a time.")
    seed: int = setting(12345, help="Seed of the training instances and masks.")
    objective: str = setting("nsp", help="nsp (BERT), sop (ALBERT) or none (RoBERTa packing).")
    line_by_line: bool = setting(False, help="Objective none: every line its own sequence (cut at max_seq_length, "
                                             "padded in batches) instead of lines packed up to the length.")
    masking: str = setting("static", help="static (masked here) or dynamic (masked by the loader each epoch).")
    dupe_factor: int | None = setting(None, help="Copies of the data, each masked differently "
                                                 "(default 10 static, 1 dynamic).")
    whole_word: bool = setting(False, help="Mask whole words.")
    span: bool = setting(False, help="SpanBERT span masking (whole words).")
    masked_lm_prob: float = setting(0.15, help="Share of tokens masked.")
    max_predictions_per_seq: int | None = setting(None, aliases=("--max-predictions",),
                                                  help="Masks per sequence at most (default ceil(0.15 x length)).")
    short_seq_prob: float = setting(0.1, help="Share of shorter target lengths.")
    plain_text: bool = setting(False, help="Running text, split into sentences here (default: one sentence "
                                           "per line).")
    strip_gutenberg: bool = setting(False, help="Drop Project Gutenberg headers and licences.")
    validation_fraction: float = setting(0.01, help="Share of text held out for validation.")
    validation_inputs: list[str] = setting(default_factory=list, aliases=("--validation-input",),
                                           help="Text file or directory held out whole for validation, e.g. a "
                                                "test split (repeat).")
    shard_mb: float = setting(256.0, help="Input megabytes per shard at most.")
    block_sentences: int = setting(256, help="Sentences per block (the unit held out for validation).")
    max_line_chars: int = setting(10_000, help="Longer lines are cut (and counted).")
    bad_bytes: str = setting("skip", help="Lines that are not UTF-8: skip, replace or error.")
    text_field: str = setting("text", help="JSON lines: the field of each record that holds its text.")
    text_column: str = setting("text", help="Parquet, CSV, TSV: the column that holds each row's text (other "
                                            "columns, labels among them, are ignored).")
    bad_records: str = setting("skip", help="JSON lines / Parquet records without usable text: skip (counted, "
                                            "reported) or error (stop at the first, naming file and line).")
    part: str | None = setting(None, help="I/N: prepare only part I (0 to N-1) of N disjoint parts of the "
                                          "input, into OUT/part-I-of-N, for N machines or a job array; join "
                                          "them with `bertforge prepare-merge`.")

    def __post_init__(self) -> None:
        _check_options(self)

    def job_options(self) -> dict[str, Any]:
        """The settings the shards depend on, as dataset.json records them (resume compares them)."""
        skip = {"inputs", "tokenizer", "validation_inputs", "workers"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


def prepare(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | PrepareOptions,
    tokenizer_dir: str | os.PathLike[str] | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    overwrite: bool = False,
    progress: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """Make pre-training shards from text, JSON lines or Parquet and return the statistics (also in
    `out_dir/stats.json`; with `part`, in `out_dir/part-I-of-N/stats.json`).

    `inputs` is a `PrepareOptions` (then `tokenizer_dir` may stay None), or the input paths, with any
    other setting of `PrepareOptions` by name (`max_seq_length=64`, `objective="sop"`, ...).

    Args:
        inputs: files, directories (their text, JSON-lines and Parquet files, recursively) and glob
            patterns; text and JSON lines may be compressed (.gz, .bz2, .xz, .zst). BERT layout (one
            sentence per line, blank line between documents) unless `plain_text`; a JSON-lines record
            (its `text_field`) or a Parquet row (its `text_column`) is one document.
        tokenizer_dir: a directory `BertTokenizer.from_pretrained` reads (vocab.txt ...).
        out_dir: where the shards go; a rerun with the same arguments finishes an interrupted run.
        objective: "nsp" (BERT), "sop" (ALBERT sentence order) or "none" (RoBERTa full sentences).
        masking: "static" (masked here, `dupe_factor` times, default 10 as in BERT) or "dynamic"
            (stored unmasked, masked by the loader each epoch; `dupe_factor` default 1).
        whole_word / span: whole-word masking / SpanBERT span masking (span implies whole words).
        max_predictions_per_seq: default ceil(masked_lm_prob x max_seq_length); a warning when it caps.
        validation_fraction: share of blocks (about `block_sentences` sentences each) held out in `valid/`.
        validation_inputs: text files or directories held out whole: all their text goes to `valid/`
            (e.g. a corpus's official test split), besides the `validation_fraction` of `inputs`.
        shard_mb: input megabytes per shard at most (more shards than workers when the input is large).
        bad_bytes: lines that are not UTF-8: "skip" (counted, reported), "replace" or "error".
        bad_records: records without usable text: "skip" (counted, reported) or "error" (a RecordError
            naming file, line or row, and field).
        part: "I/N": only part I of N disjoint parts, into `out_dir/part-I-of-N` (see `merge_parts`).

    Example:
        >>> stats = prepare(["corpus/"], "tokenizer/", "data/bert128", workers=4)  # doctest: +SKIP
        >>> stats["instances"], stats["masked_fraction"]  # doctest: +SKIP
    """
    started = time.time()
    recipe = _prepare_options(inputs, tokenizer_dir, settings)
    if out_dir is None:
        raise ValueError("prepare needs an output directory (out_dir)")
    tokenizer_dir, workers, strip_gutenberg = recipe.tokenizer, recipe.workers, recipe.strip_gutenberg
    shard_mb, plain_text = recipe.shard_mb, recipe.plain_text
    inputs, validation_inputs = recipe.inputs, recipe.validation_inputs
    options = recipe.job_options()  # workers are not part of the job: the plan below says what the output depends on
    out = Path(out_dir)
    held_out = expand_inputs(validation_inputs) if validation_inputs else []
    files = [f for f in expand_inputs(inputs) if f not in held_out] + held_out
    options["validation_files"] = [str(f) for f in held_out]
    tokenizer = _load_tokenizer(str(tokenizer_dir))
    vocab_facts = _vocab_facts(tokenizer)

    bodies, plan_warnings = input_bodies(files, strip_gutenberg=strip_gutenberg, text_column=recipe.text_column)
    if not bodies:
        raise DataError(f"no text to prepare: all {len(files)} input files are empty ({', '.join(map(str, files[:3]))}"
                        f"{', ...' if len(files) > 3 else ''})")
    if recipe.part is not None:  # this machine's part of the corpus, cut by the same rule as shards
        part, num_parts = parse_part(recipe.part)
        parts = cut_ranges(bodies, num_parts)
        if part >= len(parts):
            raise DataError(f"part {recipe.part}: the input only splits into {len(parts)} parts (a compressed file "
                            "or a Parquet row group is never split); use fewer parts")
        bodies = parts[part]
        out = out / part_dir_name(part, num_parts)
    if recipe.part is None:
        num_shards = max(workers, math.ceil(sum(f.stat().st_size for f in files) / (shard_mb * 1e6)))
    else:  # a part's shards do not depend on the machine it runs on: shard_mb alone sets them
        num_shards = max(1, math.ceil(sum(r.weight for r in bodies) / (shard_mb * 1e6)))
    plan = cut_ranges(bodies, num_shards)
    dataset = {
        "format": DATASET_FORMAT, "version": 1, "options": options, "tokenizer": vocab_facts,
        "inputs": [{"path": str(f), "bytes": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns} for f in files],
        "shards": [[r.to_json() for r in shard] for shard in plan],
    }
    with run_lock(out, what="prepare run"):  # held till the end: a second prepare on `out` is refused
        _start_output(out, dataset, overwrite)
        save_recipe(recipe, out / RUN_CONFIG_FILE, header=f"bertforge prepare --config {out / RUN_CONFIG_FILE} "
                                                           "--out DIR makes the same shards")
        continuation = continuation_flags(tokenizer.vocab, tokenizer.vocab_size, tuple(tokenizer.all_special_ids))
        with atomic_path(out / "continuation.npy") as tmp, open(tmp, "wb") as handle:
            np.save(handle, continuation)
        # The shards are ids of this vocabulary: keep a copy beside them, so the data directory is
        # self-contained and pre-training exports a final model with the right vocab.txt.
        tokenizer.save_pretrained(out / "tokenizer")

        todo = [i for i in range(len(plan)) if not (out / "done" / f"{shard_name(i)}.json").exists()]
        todo_bytes = sum(r.weight for i in todo for r in plan[i])
        # the random streams of a shard: (seed, shard), and the part too when there are parts
        stream = [] if recipe.part is None else list(parse_part(recipe.part))
        jobs = [{"shard": i, "ranges": dataset["shards"][i], "options": options, "out_dir": str(out),
                 "tokenizer_dir": str(tokenizer_dir), "stream": [i, *stream]} for i in todo]
        # the bar counts text bytes read: known in advance only when no input is compressed or Parquet
        exact = all(r.weight == r.end - r.start for i in todo for r in plan[i])
        _run_jobs(jobs, workers, todo_bytes if exact else None, progress)

        stats = collect_stats(out, dataset, plan_warnings)
        stats["run"] = {"wall_s": round(time.time() - started, 3), "shards_made": len(todo), "bytes_read": todo_bytes,
                        "workers": workers}
        elapsed = max(time.time() - started, 1e-9)
        stats["run"]["mb_per_s"] = round(todo_bytes / 1e6 / elapsed, 3)
        stats["run"]["docs_per_s"] = round(sum(stats["per_shard"][i]["documents"] for i in todo) / elapsed, 1)
        write_text_atomic(out / "stats.json", json.dumps(stats, indent=1) + "\n")
        for message in stats["warnings"]:
            warnings.warn(message, DataWarning, stacklevel=2)
        if stats["instances"] == 0:
            raise DataError(_no_instances(stats, len(files), plain_text))
        return stats


def _no_instances(stats: dict[str, Any], files: int, plain_text: bool) -> str:
    """Why no training instance was made, naming the likeliest cause: records without usable text (a
    field or column that is not there), else single sentences that a pair objective cannot use."""
    bad = stats["skipped"]["bad_records"]
    if bad and stats["documents"] == 0:
        return (f"no text was read from {files} file(s): all {bad} record(s) lack usable text, the first at "
                f"{stats['skipped']['first_bad_record']}; name the field (JSON lines) or the column that holds the text")
    return (f"no training instances were made from {files} file(s): {stats['documents']} documents, "
            f"{stats['sentences']} sentences, {stats['skipped']['one_sentence_documents']} one-sentence documents "
            f"skipped{' (is the input plain text? pass plain_text=True)' if not plain_text else ''}")


# ---------------------------------------------------------------------------------------------------
# options, tokenizer facts, the output directory
# ---------------------------------------------------------------------------------------------------


def _prepare_options(inputs: Any, tokenizer_dir: Any, settings: dict[str, Any]) -> PrepareOptions:
    """The options of one `prepare` call: a `PrepareOptions` (with any settings replaced), or the inputs,
    the tokenizer and the settings by name, resolved as every recipe is (`bertforge.recipe.resolve`)."""
    if isinstance(inputs, PrepareOptions):
        given = {**({} if tokenizer_dir is None else {"tokenizer": str(tokenizer_dir)}), **settings}
        recipe = resolve(PrepareOptions, inputs, given, given_as="prepare(): {name}")
    else:
        paths = [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs)
        given = {"inputs": [str(p) for p in paths], "tokenizer": None if tokenizer_dir is None else str(tokenizer_dir),
                 **{k: ([str(p) for p in v] if k == "validation_inputs" else v) for k, v in settings.items()}}
        recipe = resolve(PrepareOptions, None, given, given_as="prepare(): {name}")
    if recipe.tokenizer is None:
        raise ValueError("no tokenizer: give --tokenizer DIR (or tokenizer: in the recipe, tokenizer_dir in Python)")
    if not Path(recipe.tokenizer).is_dir():
        raise ValueError(f"--tokenizer {recipe.tokenizer}: no such directory")
    if not recipe.inputs:
        raise ValueError("no input: give --input FILE_OR_DIR (or inputs: in the recipe)")
    return recipe


def _check_options(o: PrepareOptions) -> None:
    """Check the settings, and fill in the defaults that depend on others (dupe_factor, max predictions)."""
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ValueError(message)

    need(o.objective in OBJECTIVES, f"objective must be one of {OBJECTIVES}, not {o.objective!r}")
    need(o.masking in MASKING_MODES, f"masking must be one of {MASKING_MODES}, not {o.masking!r}")
    need(o.bad_bytes in BAD_BYTES_POLICIES, f"bad_bytes must be one of {BAD_BYTES_POLICIES}, not {o.bad_bytes!r}")
    need(o.bad_records in BAD_RECORDS_POLICIES,
         f"bad_records must be one of {BAD_RECORDS_POLICIES}, not {o.bad_records!r}")
    need(bool(o.text_field) and bool(o.text_column), "text_field and text_column must not be empty")
    need(not o.line_by_line or o.objective == "none", "line_by_line makes masked-LM sequences of single lines: it "
                                                      "needs objective none (a sentence objective pairs segments)")
    if o.part is not None:
        parse_part(o.part)
    need(8 <= o.max_seq_length <= 65535, f"max_seq_length must be in [8, 65535], not {o.max_seq_length}")
    need(o.workers >= 1, f"workers must be at least 1, not {o.workers}")
    need(0.0 < o.masked_lm_prob < 1.0, f"masked_lm_prob must be in (0, 1), not {o.masked_lm_prob}")
    need(0.0 <= o.short_seq_prob <= 1.0, f"short_seq_prob must be in [0, 1], not {o.short_seq_prob}")
    need(0.0 <= o.validation_fraction < 1.0, f"validation_fraction must be in [0, 1), not {o.validation_fraction}")
    need(o.shard_mb > 0, f"shard_mb must be positive, not {o.shard_mb}")
    need(o.block_sentences >= 2, f"block_sentences must be at least 2, not {o.block_sentences}")
    need(o.max_line_chars >= 100, f"max_line_chars must be at least 100, not {o.max_line_chars}")
    if o.dupe_factor is None:
        o.dupe_factor = 10 if o.masking == "static" else 1
    need(o.dupe_factor >= 1, f"dupe_factor must be at least 1, not {o.dupe_factor}")
    if o.max_predictions_per_seq is None:
        o.max_predictions_per_seq = math.ceil(o.masked_lm_prob * o.max_seq_length)
    need(o.max_predictions_per_seq >= 1, "max_predictions_per_seq must be at least 1")
    if o.span:
        o.whole_word = True  # SpanBERT spans are made of whole words


def parse_part(part: str) -> tuple[int, int]:
    """`"I/N"` -> (I, N), with 0 <= I < N; ValueError otherwise."""
    index, _, count = str(part).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"part must be I/N (e.g. 0/4), not {part!r}") from None
    if not 0 <= i < n:
        raise ValueError(f"part {part}: I must be in [0, N) (parts count from 0: 0/{max(n, 1)} ... "
                         f"{max(n, 1) - 1}/{max(n, 1)})")
    return i, n


def part_dir_name(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


_TOKENIZERS: dict[str, Any] = {}


def _load_tokenizer(directory: str):
    if directory not in _TOKENIZERS:
        from bertforge.tokenizer import BertTokenizer

        try:
            _TOKENIZERS[directory] = BertTokenizer.from_pretrained(directory)
        except FileNotFoundError as exc:
            raise DataError(f"tokenizer: {exc}") from exc
    return _TOKENIZERS[directory]


def _vocab_facts(tokenizer) -> dict[str, Any]:
    vocab = tokenizer.vocab
    ordered = sorted(vocab, key=vocab.__getitem__)
    return {
        "vocab_size": tokenizer.vocab_size, "pad_id": tokenizer.pad_token_id, "unk_id": tokenizer.unk_token_id,
        "cls_id": tokenizer.cls_token_id, "sep_id": tokenizer.sep_token_id, "mask_id": tokenizer.mask_token_id,
        "special_ids": list(tokenizer.all_special_ids),
        "vocab_sha1": hashlib.sha1("\n".join(ordered).encode("utf-8")).hexdigest(),
        "token_dtype": token_dtype(tokenizer.vocab_size).str,
    }


def _start_output(out: Path, dataset: dict[str, Any], overwrite: bool) -> None:
    """Create `out`, or check that it holds a run of the same job (to resume it), or clear it (`overwrite`)."""
    record = out / "dataset.json"
    if record.exists() and not overwrite:
        old = read_json(record)
        same = all(old.get(k) == dataset[k] for k in ("format", "options", "tokenizer", "inputs", "shards"))
        if not same:
            changed = [k for k in ("options", "tokenizer", "inputs", "shards") if old.get(k) != dataset[k]]
            raise DataError(
                f"{out} holds data prepared with other {' and '.join(changed)}"
                f"{' (another number of workers or shard_mb?)' if changed == ['shards'] else ''}; resuming needs "
                "the same arguments. Use a new output directory or overwrite=True (--overwrite)"
            )
        return
    if not record.exists() and out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()) and not overwrite:
        raise DataError(f"{out} exists and is not a prepared-data directory; use an empty or new directory")
    if overwrite and out.exists():
        for sub in ("train", "valid", "done"):
            for path in (out / sub).glob("shard_*") if (out / sub).is_dir() else []:
                path.unlink()
        for name in ("stats.json", "dataset.json"):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(record, json.dumps(dataset, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------------
# running shards: in this process, or in a pool of spawned processes
# ---------------------------------------------------------------------------------------------------

_progress_queue = None


def _init_worker(queue) -> None:
    global _progress_queue
    _progress_queue = queue
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already


def _run_jobs(jobs: list[dict], workers: int, total_bytes: int | None, progress: bool) -> None:
    if not jobs:
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare",
               disable=not progress, smoothing=0.1)
    started, docs, seen = time.time(), 0, 0

    def update(nbytes: int, ndocs: int) -> None:
        nonlocal docs, seen
        docs += ndocs
        seen += nbytes
        bar.update(nbytes)
        elapsed = max(time.time() - started, 1e-9)
        bar.set_postfix_str(f"{docs / elapsed:,.0f} docs/s, {seen / 1e6 / elapsed:.1f} MB/s", refresh=False)

    try:
        if workers == 1 or len(jobs) == 1:
            for job in jobs:
                _build_shard(job, update)
            return
        import multiprocessing as mp
        import queue as queue_module
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

        ctx = mp.get_context("spawn")  # no fork: the tokenizers thread pool does not survive it
        progress_queue = ctx.Queue()

        def drain() -> None:
            while True:
                try:
                    update(*progress_queue.get_nowait())
                except queue_module.Empty:
                    return

        # a worker that dies (killed, out of memory) breaks the pool with an error instead of hanging
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx, initializer=_init_worker,
                                 initargs=(progress_queue,)) as pool:
            pending = {pool.submit(_build_shard, job) for job in jobs}
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    drain()
                    for future in done:
                        future.result()  # re-raises a worker's error (a DataError names file and line)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)  # shards already running still finish
                raise
        drain()
    finally:
        bar.close()


def _report_progress(callback: Callable[[int, int], None] | None) -> Callable[[int, int], None]:
    """A throttled progress sink: to the callback (same process) or to the pool's queue."""
    pending = [0, 0, time.time()]

    def report(nbytes: int, ndocs: int, force: bool = False) -> None:
        pending[0] += nbytes
        pending[1] += ndocs
        if force or time.time() - pending[2] > 0.2:
            if callback is not None:
                callback(pending[0], pending[1])
            elif _progress_queue is not None:
                _progress_queue.put((pending[0], pending[1]))
            pending[:] = [0, 0, time.time()]

    return report


# ---------------------------------------------------------------------------------------------------
# one shard
# ---------------------------------------------------------------------------------------------------


class _Split:
    """Instance making, masking and writing for one split (train or valid) of one shard."""

    def __init__(self, name: str, shard: int, o: dict, facts: dict, masker: Masker | None, seed: int,
                 out: Path, dupe: int, pool: DocumentPool | None, fallback_pool: DocumentPool | None,
                 stream: Sequence[int]):
        self.maker = InstanceMaker(o["max_seq_length"], facts["cls_id"], facts["sep_id"], o["objective"],
                                   o["short_seq_prob"], line_by_line=o.get("line_by_line", False))
        streams = np.random.SeedSequence([seed, *stream]).spawn(2)
        self.rng = BufferedDraws(np.random.default_rng(streams[0]))
        self.mask_rng = np.random.default_rng(streams[1])
        self.masker = masker
        self.pad_id = facts["pad_id"]
        self.dupe = dupe
        self.pool, self.fallback_pool = pool, fallback_pool
        self.writer = ShardWriter(out / name, shard, dtype=np.dtype(facts["token_dtype"]), static=masker is not None)
        self.buffer: list = []
        self.masked = self.maskable = 0

    def add(self, block: SentenceBlock) -> None:
        maker = self.maker
        if maker.objective == "none":
            for instance in maker.pack(block):
                self.buffer.extend([instance] * self.dupe)
        else:
            pool = self.pool
            if pool is not None and self.fallback_pool is not None and len(pool) < 2:
                pool = self.fallback_pool
            for copy in range(self.dupe):
                self.buffer.extend(maker.pairs(block, self.rng, pool, first_pass=copy == 0))
        if len(self.buffer) >= _BATCH:
            self.flush()

    def finish(self) -> dict | None:
        if self.maker.objective == "none":
            for instance in self.maker.flush():
                self.buffer.extend([instance] * self.dupe)
        self.flush()
        return self.writer.close()

    def flush(self) -> None:
        if not self.buffer:
            return
        instances, self.buffer = self.buffer, []
        n = len(instances)
        lengths = np.fromiter((len(inst.tokens) for inst in instances), dtype=np.int64, count=n)
        flat = np.concatenate([inst.tokens for inst in instances])
        segment_b = np.fromiter((inst.segment_b_start for inst in instances), dtype=np.int64, count=n)
        labels = np.fromiter((inst.label for inst in instances), dtype=np.int64, count=n)
        if self.masker is None:
            self.writer.add_flat(flat, lengths, segment_b, labels)
            return
        # (n, T) padded batch -> mask -> back to the flat layout (row-major order = instance order)
        inside = np.arange(int(lengths.max()))[None, :] < lengths[:, None]
        batch = np.full(inside.shape, self.pad_id, dtype=np.int64)
        batch[inside] = flat
        result = self.masker(batch, self.mask_rng)
        chosen = result.labels != IGNORE_INDEX
        rows, cols = np.nonzero(chosen)
        self.masked += len(rows)
        self.maskable += int(self.masker.maskable(batch).sum())
        self.writer.add_flat(result.input_ids[inside], lengths, segment_b, labels, cols, result.labels[rows, cols],
                             np.bincount(rows, minlength=n))

    def abort(self) -> None:
        self.writer.abort()

    def record(self) -> dict:
        return {"instances": self.writer.instances, "tokens": self.writer.tokens,
                "predictions": self.writer.predictions, "masked": self.masked, "maskable": self.maskable,
                "counters": self.maker.counters.to_json(),
                "capped_rows": self.masker.capped_rows if self.masker is not None else 0}


def _tokenize(tokenizer, doc_key: tuple, sentences: list[str], new_document: bool) -> SentenceBlock:
    backend = tokenizer.backend
    # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we do not need: twice as fast
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    ids = [e.ids for e in encode(sentences, add_special_tokens=False)]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    keep = lengths > 0
    offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(lengths[keep], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    return SentenceBlock(doc_key, flat, offsets, new_document)


def _is_validation(sentences: list[str], fraction: float) -> bool:
    if fraction <= 0 or not sentences:
        return False
    return zlib.crc32("\n".join(sentences).encode("utf-8"), 0x5A17) / 2**32 < fraction


def _text_field(o: dict, r: InputRange) -> str:
    return o["text_field"] if r.kind == "jsonl" else o["text_column"]


def _prefill(pool: DocumentPool, ranges: list[InputRange], o: dict, tokenizer) -> None:
    """Fill the NotNext pool with the first block of documents spread over the shard: the first
    document of each file piece, and the next document after each of `_PREFILL_PROBES` evenly spaced
    places. A probe starts where a document starts, so its key is the key the main pass gives it.
    (A compressed file is only read from its start; a Parquet probe starts at a row group.)"""
    total = sum(r.weight for r in ranges)
    starts: dict[tuple[str, int], InputRange] = {}
    for r in ranges[:_PREFILL_PROBES]:
        starts[(r.path, r.start)] = r
    for k in range(1, _PREFILL_PROBES):
        target = total * k // _PREFILL_PROBES
        for r in ranges:
            if target < r.weight:
                break
            target -= r.weight
        else:
            continue
        start = _probe_start(r, target, o)
        if start is not None:
            starts.setdefault((r.path, start), r)
    for (_, start), r in sorted(starts.items(), key=lambda item: (item[1].file_index, item[0][1])):
        if r.kind == "parquet":
            row = r.first_line + sum(_parquet_rows(r)[:start - r.start])
            probe = dataclasses.replace(r, start=start, end=start + 1, first_line=row)
        else:
            probe = dataclasses.replace(r, start=start, first_line=0)
        blocks = read_blocks(probe, plain_text=o["plain_text"], block_sentences=o["block_sentences"],
                             max_line_chars=o["max_line_chars"], bad_bytes="skip", stats=ReadStats(),
                             field=_text_field(o, r), bad_records="skip")
        for text in itertools.islice(blocks, 1):
            pool.add(_tokenize(tokenizer, text.doc_key, text.sentences, True))


def _parquet_rows(r: InputRange) -> tuple[int, ...]:
    return parquet_layout(r.path)[1][r.start:r.end]


def _probe_start(r: InputRange, offset: int, o: dict) -> int | None:
    """Where the first document at or after `offset` (bytes into `r`'s weight) starts, in `r`'s unit."""
    if r.compressed:
        return None
    if r.kind == "parquet":
        sizes = parquet_layout(r.path)[0]
        base = 0
        for group in range(r.start, r.end):
            if base >= offset:
                return group
            base += sizes[group]
        return None
    blank_lines = 0 if r.kind == "jsonl" else SECTION_BLANK_LINES if o["plain_text"] else 1
    with open(r.path, "rb") as handle:
        return next_document_start(handle, r.start + offset, r.end, blank_lines=blank_lines)


def _build_shard(job: dict, callback: Callable[[int, int], None] | None = None) -> dict:
    """Make one shard: read its ranges, tokenize, make and mask instances, write train/ and valid/."""
    started = time.time()
    o, shard, out = job["options"], job["shard"], Path(job["out_dir"])
    tokenizer = _load_tokenizer(job["tokenizer_dir"])
    facts = _vocab_facts(tokenizer)
    ranges = [InputRange.from_json(r) for r in job["ranges"]]
    stream = job.get("stream", [shard])
    report = _report_progress(callback)
    name = shard_name(shard)
    for split in ("train", "valid"):  # what an interrupted run of this shard left: start clean
        for stale in (out / split).glob(f"{name}.*"):
            stale.unlink()

    def masker() -> Masker:  # capped masks are counted and reported in stats.json, not warned per process
        return Masker.from_tokenizer(tokenizer, prob=o["masked_lm_prob"], max_predictions=o["max_predictions_per_seq"],
                                     whole_word=o["whole_word"], span=o["span"], warn=False)

    pools: dict[str, DocumentPool | None] = {"train": None, "valid": None}
    if o["objective"] == "nsp":
        pool_rng = np.random.default_rng([_POOL_SEED, *stream])
        pools = {"train": DocumentPool(pool_rng), "valid": DocumentPool(pool_rng)}
        held_out = set(o.get("validation_files", ()))  # held-out text must not reach training as partners
        _prefill(pools["train"], [r for r in ranges if r.path not in held_out], o, tokenizer)
    static = o["masking"] == "static"
    train = _Split("train", shard, o, facts, masker() if static else None, o["seed"], out,
                   o["dupe_factor"], pools["train"], None, stream)
    valid = _Split("valid", shard, o, facts, masker(), VALIDATION_SEED, out, 1, pools["valid"], pools["train"],
                   stream)
    read = ReadStats()
    tokens = 0
    one_sentence: list[str] = []  # where the first one-sentence documents are, for the warning
    try:
        for r in ranges:
            for text in read_blocks(r, plain_text=o["plain_text"], block_sentences=o["block_sentences"],
                                    max_line_chars=o["max_line_chars"], bad_bytes=o["bad_bytes"], stats=read,
                                    field=_text_field(o, r), bad_records=o["bad_records"]):
                block = _tokenize(tokenizer, text.doc_key, text.sentences, text.new_document)
                tokens += len(block.ids)
                held_out = r.path in o.get("validation_files", ())
                split = valid if held_out or _is_validation(text.sentences, o["validation_fraction"]) else train
                if pools["train"] is not None:
                    pools["valid" if split is valid else "train"].add(block)
                split.add(block)
                if block.new_document and block.num_sentences == 1 and len(one_sentence) < 5:
                    one_sentence.append(text.location)
                report(text.nbytes, int(text.new_document))
        valid_index = valid.finish()
        train_index = train.finish()
    except BaseException:
        train.abort()
        valid.abort()
        raise
    report(0, 0, force=True)
    record = {
        "shard": shard, "name": name, "ranges": job["ranges"], "read": read.to_json(), "tokens": tokens,
        "train": train.record(), "valid": valid.record(),
        "train_index": train_index is not None, "valid_index": valid_index is not None,
        "one_sentence_locations": one_sentence,
        "wall_s": round(time.time() - started, 3),
    }
    write_text_atomic(out / "done" / f"{name}.json", json.dumps(record, indent=1) + "\n")
    return record
