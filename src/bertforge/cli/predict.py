"""Using a model: predictions on your files or a benchmark's test split, serving over HTTP, int8 and ONNX
copies, and frozen features."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.cli.common import MODEL_NAME_HELP, PRECISION_HELP, RevisionOption, fail, hub_model, text_lines
from bertforge.cli.options import EngineCalibrateOption, EngineOption, QuotingOption, reading_tables


def predict_command(
    model: Annotated[Path, typer.Option("--model", help="A fine-tuned model (a seed-N directory) or any "
                                                                            "BERT checkpoint." + MODEL_NAME_HELP)],
    family: Annotated[str | None, typer.Argument(
        help="With --data: the task family (glue, ner, squad, swag, tag or qa). Not used with --input.")] = None,
    input_file: Annotated[Path | None, typer.Option(
        "--input", help="Your file to predict: .csv, .tsv, .jsonl (also .gz, .bz2, .xz, .zst), .parquet, "
                        "or anything else as one text per line.")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", help="The task's data directory (or SQuAD file; for tag and qa the file to predict): writes "
                       "the task's prediction files (leaderboard formats).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="With --input: the predictions file (.jsonl, .csv or .tsv; embeddings also .npy, with "
                      "<file>.index.json beside it); with --data: the directory for the leaderboard files.")] = None,
    task: Annotated[str | None, typer.Option(
        "--task", help="With --input: the pipeline task (text-classification, token-classification, "
                       "question-answering, fill-mask, embeddings; default: the model's). With --data: the "
                       "benchmark task (default: the one in the model's task.json).")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="Column holding the text. Tagging: a JSON list of "
                                                                   "words (a tagging file's tokens) is tagged word by "
                                                                   "word: tags in the files' scheme, scores.")] = "text",
    pair_column: Annotated[str | None, typer.Option(
        "--pair-column", help="Column holding the second sentence of a pair (classification).")] = None,
    question_column: Annotated[str, typer.Option("--question-column", help="QA: column of the questions.")]
    = "question",
    context_column: Annotated[str, typer.Option("--context-column", help="QA: column of the passages.")]
    = "context",
    keep_columns: Annotated[list[str] | None, typer.Option(
        "--keep-columns", help="Input columns copied into each output row (comma-separated; repeat).")] = None,
    keep_input: Annotated[bool, typer.Option(
        "--keep-input/--no-keep-input", help="Start each output row with its input's row (line) number, the file's id column "
                                             "if any, and the text read (QA: the question).")] = True,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Rows per forward pass.")] = 64,
    max_length: Annotated[int | None, typer.Option(
        "--max-length", help="Pieces per input (default: the length the model was fine-tuned with).")] = None,
    chunk_rows: Annotated[int, typer.Option(
        "--chunk-rows", help="Rows read, predicted and written at a time (memory is bounded by it).")] = 4096,
    on_error: Annotated[str, typer.Option(
        "--on-error", help="A row the task cannot answer (no [MASK], an empty question or context, an empty "
                           "cell, a number where text goes; an empty text is answered): record (its output "
                           "row says what is wrong, in an error column, and the run goes on), skip (left out) or "
                           "stop (exit 2, nothing written).")] = "record",
    pooling: Annotated[str | None, typer.Option("--pooling", help="Embeddings: mean, cls, max or pooler (default: "
                                                                  "what a sentence-transformers model's modules.json "
                                                                  "says, else mean).")] = None,
    normalize: Annotated[bool | None, typer.Option("--normalize/--no-normalize", help="Embeddings: scale to unit "
                                                   "length (default: as modules.json says, else not).")] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Fill-mask: tokens per [MASK].")] = 5,
    all_scores: Annotated[bool, typer.Option(
        "--all-scores", help="Text classification: also write every label's score (a ranked list of "
                             "{label, score}; JSON text in a CSV).")] = False,
    long_text: Annotated[str, typer.Option(
        "--long-text", help="Text classification of texts longer than --max-length: truncate (the default, "
                            "counted and reported) or windows (overlapping windows, their logits averaged).")]
        = "truncate",
    window_stride: Annotated[int | None, typer.Option(
        "--window-stride", help="With --long-text windows: pieces from one window's start to the next "
                                "(default: half a window).")] = None,
    device: Annotated[str | None, typer.Option("--device", help="torch device for --input (default: cpu); "
                                                                "with --data the model runs where fine-tuning "
                                                                "would (a visible GPU).")] = None,
    precision: Annotated[str, typer.Option(
        "--precision", help="fp32, bf16, int8, or auto (bf16 where the CPU has native bf16 instructions).")]
    = "fp32",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    split: Annotated[list[str] | None, typer.Option(
        "--split", help="With --data: split(s) to predict; default the test split(s) (MNLI: test_matched, "
                        "test_mismatched and ax).")] = None,
    engine: EngineOption = "torch",
    engine_calibrate: EngineCalibrateOption = False,
    revision: RevisionOption = None,
    quoting: QuotingOption = False,
) -> None:
    """Predict with a model: your own file with `--input` (any fine-tuned model, streamed in chunks, rows in
    input order), or a task's prediction files with `FAMILY --data`: GLUE leaderboard .tsv files, SQuAD
    predictions.json (+ null_odds.json for v2.0), CoNLL lines, SWAG csv; for tag, predictions-test.jsonl
    (tokens, tags in the training files' scheme, scores), for qa the SQuAD files.

    Examples: `bertforge predict --model runs/reviews/seed-1 --input new.csv --out preds.jsonl`;
    `bertforge predict glue --model runs/sst2/seed-1 --data data/glue --out submission/`
    """
    if (input_file is None) == (data is None):
        raise fail("give --input FILE (your data) or FAMILY --data DIR (a benchmark's leaderboard files)")
    if out is None:
        raise fail("--out is required")
    model = hub_model(model, revision)  # type: ignore[assignment]  # a Hub name: its cached snapshot
    if input_file is not None:
        if family is not None:
            raise fail(f"FAMILY ({family}) goes with --data; with --input the task comes from the model "
                        "(or --task)")
        keep = [name.strip() for item in keep_columns or [] for name in item.split(",") if name.strip()]
        _predict_file(model, input_file, out, task=task, text_column=text_column, pair_column=pair_column,
                      question_column=question_column, context_column=context_column, keep_columns=keep,
                      batch_size=batch_size, max_length=max_length, chunk_rows=chunk_rows, device=device,
                      precision=precision, progress=progress, pooling=pooling, normalize=normalize, top_k=top_k,
                      all_scores=all_scores, long_text=long_text, window_stride=window_stride, engine=engine,
                      engine_calibrate=engine_calibrate, on_error=on_error, keep_input=keep_input,
                      quoting=quoting)
        return
    if family is None:
        raise fail("--data needs the task family first: bertforge predict glue|ner|squad|swag|tag|qa --data ...")
    _predict_leaderboard(family, model, data, out, task=task, split=split, batch_size=batch_size,  # type: ignore[arg-type]
                         precision=precision, engine=engine, engine_calibrate=engine_calibrate)


def _predict_file(model: Path, input_file: Path, out: Path, *, task: str | None, batch_size: int,
                  max_length: int | None, device: str | None, precision: str, pooling: str | None,
                  normalize: bool | None,
                  top_k: int, all_scores: bool = False, long_text: str = "truncate",
                  window_stride: int | None = None, engine: str = "torch", engine_calibrate: bool = False,
                  quoting: bool = False, **file_options: Any) -> None:
    from bertforge.checkpoint import CheckpointError
    from bertforge.pipeline import pipeline, predict_file
    from bertforge.tables import WRITE_FORMATS
    from bertforge.tasks.base import DataFormatError

    # what can be told without the model is told before it loads (a large model takes a while)
    if not input_file.is_file():
        raise fail(f"{input_file}: no such file")
    if out.suffix.lower().lstrip(".") not in (*WRITE_FORMATS, "npy"):
        raise fail(f"{out}: predictions are written as .jsonl, .csv or .tsv (embeddings also .npy)")
    try:
        pipe = pipeline(model, task, batch_size=batch_size, max_length=max_length, device=device,
                        precision=precision, pooling=pooling, normalize=normalize, top_k=top_k,
                        all_scores=all_scores, long_text=long_text, window_stride=window_stride, engine=engine,
                        engine_calibrate=engine_calibrate)
        _say_engine(pipe.engine_choice, engine)
        with reading_tables(quoting):
            done = predict_file(pipe, input_file, out, **file_options)
    except (CheckpointError, DataFormatError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    on = f", {pipe.engine_name}" if pipe.engine is not None else ""  # torch, the default, goes unsaid
    typer.echo(f"{pipe.task} ({pipe.precision}{on}): {done['rows']} rows -> {out} "
               f"({done['rows_per_second']:.1f} rows/s)")
    if done["errors"]:
        verb = "recorded with an error column" if file_options.get("on_error", "record") == "record" else "skipped"
        rows = "1 row could not be answered and was" if done["errors"] == 1 else \
            f"{done['errors']} rows could not be answered and were"
        typer.secho(f"warning: {rows} {verb}; the first: "
                    f"{done['first_error']}", fg="yellow", err=True)
    if pipe.task == "embeddings":
        how = "as asked" if pipe.embedding_source in ("asked for", "default") else f"from {pipe.embedding_source}"
        typer.echo(f"embeddings: {pipe.pooling} pooling{', normalised' if pipe.normalize else ''}, "
                   f"at most {pipe.max_length} pieces ({how})")
    if done["windowed"]:
        typer.echo(f"{done['windowed']} rows were longer than {pipe.max_length} pieces and were read in "
                   f"windows (stride {pipe.window_stride})")
    if done["truncated"]:
        hint = " (--long-text windows reads them whole)" if pipe.task == "text-classification" else ""
        typer.secho(f"warning: {done['truncated']} rows were longer than {pipe.max_length} pieces and were "
                    f"truncated{hint}", fg="yellow", err=True)


def _say_engine(choice: Any, requested: str) -> None:
    """The engine a run uses and why, on stderr (only when the user asked for one other than torch)."""
    if choice is not None and requested != "torch":
        typer.echo(choice.describe(), err=True)


def _predict_leaderboard(family: str, model: Path, data: Path, out: Path, *, task: str | None,
                         split: list[str] | None, batch_size: int, precision: str = "fp32",
                         engine: str = "torch", engine_calibrate: bool = False) -> None:
    from bertforge.checkpoint import CheckpointError
    from bertforge.engine import EngineRequest
    from bertforge.finetune import FAMILIES, predict
    from bertforge.finetuned import TASK_FILE, TaskRecord
    from bertforge.tasks.base import DataFormatError

    if family not in FAMILIES:
        raise fail(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}")
    if task is None:
        record = TaskRecord.read(model)
        if record is None or not record.task:
            raise fail(f"{model}: no readable {TASK_FILE} to take the task from; pass --task")
        task = record.task
    try:
        # torch runs the model itself, as fine-tuning scored it; another engine runs the rows of the
        # same task code and records its choice in metrics.json
        request = None if engine == "torch" else EngineRequest(engine, calibrate=engine_calibrate)
        done = predict(family, task, model, data, out, splits=split or None, batch_size=batch_size,
                       precision=precision, engine=request)
        if request is not None:
            engine_record = json.loads((out / "metrics.json").read_text(encoding="utf-8"))["engine"]
            typer.echo(f"engine {engine_record['engine']} at {engine_record['precision']}: {engine_record['reason']}",
                       err=True)
    except (CheckpointError, DataFormatError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    for name, result in done.items():
        scores = "  ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items())
        at = result["precision"] + (f", {result['engine']}" if "engine" in result else "")
        typer.echo(f"{name}: {result['examples']} examples at {at} -> {', '.join(result['files'])}"
                   + (f"  ({scores})" if scores else ""))


def serve_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory." + MODEL_NAME_HELP)],
    host: Annotated[str, typer.Option(help="Interface to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    max_batch_size: Annotated[int, typer.Option(help="Rows per model call; 1 turns dynamic batching off.")] = 16,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for company.")] = 5.0,
    device: Annotated[str, typer.Option(help="torch device: cpu, cuda, cuda:1, ...")] = "cpu",
    precision: Annotated[str, typer.Option(
        help="fp32, bf16, int8, or auto (bf16 where the CPU has native bf16 instructions).")] = "fp32",
    long_text: Annotated[str, typer.Option(
        "--long-text", help="/classify of texts longer than the model's length: truncate (the default; the "
                            "answer says truncated) or windows (overlapping windows, their logits averaged).")]
        = "truncate",
    max_body_bytes: Annotated[int, typer.Option(
        help="Largest request body, however it is sent (413 beyond).")] = 1_000_000,
    body_timeout: Annotated[float, typer.Option(
        help="Seconds a request body may pause before the server answers 408.")] = 10.0,
    max_connections: Annotated[int, typer.Option(
        help="Open connections served at once; more are answered 503 at once.")] = 512,
    engine: EngineOption = "torch",
    engine_calibrate: EngineCalibrateOption = False,
    revision: RevisionOption = None,
    model_name: Annotated[str | None, typer.Option(
        "--model-name", help="The model's id in the OpenAI-compatible API (/v1/models); default: the Hub name "
                             "given to --model, or the directory's name.")] = None,
) -> None:
    """Serve a checkpoint over HTTP: JSON API (/fill-mask /classify /qa /ner /embed /attention), OpenAI's
    embeddings API (/v1/embeddings, /v1/models) and a demo page at /.

    Example: `bertforge serve --model runs/squad/seed-1 --port 8000`, then open http://127.0.0.1:8000/
    (API schema at /docs).
    """
    given = model
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    if model_name is None:  # a snapshot directory's name is a commit hash: the Hub name says more
        model_name = given.as_posix() if model != given else model.name
    from bertforge.checkpoint import CheckpointError

    if not 0 < port < 65536:
        raise fail(f"--port must be 1..65535, got {port}")
    if max_batch_size < 1 or max_wait_ms < 0:
        raise fail("--max-batch-size must be at least 1 and --max-wait-ms at least 0")
    if max_body_bytes < 1 or body_timeout <= 0 or max_connections < 1:
        raise fail("--max-body-bytes and --max-connections must be at least 1, --body-timeout more than 0")
    try:
        import uvicorn

        from bertforge.serve import bound_kernel_cache, create_app
    except ImportError as exc:
        raise fail(f"serving needs the 'serve' extra (pip install 'bertforge[serve]'): {exc}") from exc
    bound_kernel_cache()  # memory stays flat however many batch shapes arrive
    try:
        api = create_app(model, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, device=device,
                         precision=precision, long_text=long_text, max_body_bytes=max_body_bytes,
                         body_timeout_s=body_timeout, engine=engine, engine_calibrate=engine_calibrate,
                         model_name=model_name)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    _say_engine(api.state.service.engine_choice, engine)
    typer.echo(f"serving {api.state.service.kind} from {model} at {api.state.service.precision} "
               f"({api.state.service.engine_choice.engine}) on http://{host}:{port}/ "
               f"(tasks: {', '.join(api.state.service.tasks)})")
    # idle keep-alive connections close after 5 s, and at most max_connections are held at once
    uvicorn.run(api, host=host, port=port, log_level="info", limit_concurrency=max_connections,
                timeout_keep_alive=5)


def quantize_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory (any head)." + MODEL_NAME_HELP)],
    out: Annotated[Path, typer.Option("--out", help="Directory for the int8 copy.")],
    revision: RevisionOption = None,
    sample: Annotated[Path | None, typer.Option(
        "--sample", help="A file with the model's columns to measure int8 against fp32 on (default: the dev "
                         "file task.json names, else training rows, else fixed sentences).")] = None,
) -> None:
    """Save an int8 copy of a checkpoint (dynamic quantization of the encoder's Linear layers, torchao).

    The copy holds config.json (with the recipe), the tokenizer, model.int8.safetensors (int8 weights
    and their scales; no pickle) and the model's task.json and sentence-transformers module files.
    `predict`, `serve` and `extract` load it and run it at int8; it is not a transformers checkpoint.
    int8 is measured against fp32 on a sample (label agreement, largest probability change, the metric
    before and after) and written to quantization_report.json in the copy; below 99% agreement it warns.
    Example: `bertforge quantize --model runs/sst2/seed-1 --out runs/sst2/int8`
    """
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    from bertforge.checkpoint import CheckpointError

    try:
        import copy

        from bertforge.model import load_any
        from bertforge.precision import apply_precision, copy_sidecars, save_quantized
        from bertforge.tokenizer import BertTokenizer

        loaded, _ = load_any(model)
        try:
            tokenizer = BertTokenizer.from_pretrained(model)
        except FileNotFoundError:  # a checkpoint without tokenizer files: the copy has none either
            tokenizer = None
        quantized, _ = apply_precision(copy.deepcopy(loaded), "int8")
        save_quantized(quantized, out, tokenizer=tokenizer)
        if Path(model).is_dir():
            copy_sidecars(model, out)
        # int8 measured against fp32 on the model's dev file (or training rows, or fixed sentences)
        from bertforge.quantization_report import int8_report, write_report

        report = int8_report(loaded.eval(), quantized, model if Path(model).is_dir() else None, tokenizer,
                             data=sample)
        write_report(report, out)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    typer.echo(f"wrote {out}: {', '.join(f'{name} ({size / 1e6:.1f} MB)' for name, size in sorted(files.items()))}")
    typer.echo("\n".join(report.lines()), err=not report.ok)


def export_onnx_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory." + MODEL_NAME_HELP)],
    out: Annotated[Path, typer.Option("--out", help="The .onnx file to write.")],
    opset: Annotated[int, typer.Option(help="ONNX opset version.")] = 18,
    check: Annotated[bool, typer.Option(help="Compare ONNX Runtime with PyTorch after export.")] = True,
    int8: Annotated[bool, typer.Option("--int8", help="Quantize the graph with ONNX Runtime's dynamic "
                                                      "quantization (int8 weights, about 4x smaller), measured "
                                                      "against fp32 in NAME.quantization_report.json.")] = False,
    revision: RevisionOption = None,
) -> None:
    """Export a checkpoint to ONNX with dynamic batch and sequence axes on every input.

    Example: `bertforge export-onnx --model runs/squad/seed-1 --out squad.onnx`
    """
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    from bertforge.checkpoint import CheckpointError

    try:
        from bertforge.export import export_onnx
    except ImportError as exc:
        raise fail(f"ONNX export needs onnx and onnxscript (pip install 'bertforge[onnx]'): {exc}") from exc
    if out.suffix != ".onnx":
        raise fail(f"--out should name a .onnx file, got {out}")
    try:
        result = export_onnx(model, out, opset=opset, check=check, int8=int8)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    except ImportError as exc:
        raise fail(f"checking the export needs onnxruntime (or pass --no-check): {exc}") from exc
    typer.echo(f"wrote {result.path} ({result.model}{', int8' if result.int8 else ''}) in {result.seconds:.1f} s")
    typer.echo(f"inputs: {', '.join(result.inputs)}  axes: {', '.join(result.dynamic_axes[result.inputs[0]])}")
    typer.echo(f"outputs: {', '.join(result.outputs)}")
    if result.max_abs_diff is not None:
        shapes = ", ".join("x".join(map(str, s)) for s in result.checked_shapes)
        typer.echo(f"ONNX Runtime vs PyTorch: max abs diff {result.max_abs_diff:.2e} on inputs {shapes}")
    if result.quantization is not None:  # int8: measured against the fp32 graph on the model's sample
        typer.echo("\n".join(result.quantization.lines()), err=not result.quantization.ok)
        typer.echo(f"report: {result.report_path}")


def _parse_layers(text: str | None) -> list[int] | None:
    """"-1,-2,-3,-4" -> [-1, -2, -3, -4] (Google's --layers spelling); None stays None."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise fail(f"--layers must be comma-separated integers such as -1,-2 or 0,6, got {text!r}") from exc


def extract_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory (any head)." + MODEL_NAME_HELP)],
    input_file: Annotated[Path, typer.Option("--input", help="UTF-8 text, one input per line.")],
    out: Annotated[Path, typer.Option("--out", help="Output: .npy or .safetensors (+ .index.json), or .jsonl.")],
    strategy: Annotated[str | None, typer.Option(
        help="embeddings, last, second_to_last, sum_last_four, concat_last_four or sum_all "
             "(default last, unless --layers is given).")] = None,
    layers: Annotated[str | None, typer.Option(
        help="Explicit hidden states instead of a strategy: 0 = embeddings, 1..L the layers, -1 the last "
             "(e.g. -1,-2,-3,-4).")] = None,
    combine: Annotated[str, typer.Option(help="With --layers: none (one vector per layer), sum, mean or "
                                              "concat.")] = "none",
    align: Annotated[str, typer.Option(help="first or mean (one vector per input word, from its first piece or "
                                            "the mean of its pieces) or token (one per WordPiece token).")] = "first",
    pool: Annotated[str | None, typer.Option(help="One vector per line instead: cls, mean or max "
                                                  "(over real tokens only). Without --strategy/--layers/--pairs "
                                                  "this is `predict --task embeddings --pooling`: the same "
                                                  "vectors and rows.")] = None,
    normalize: Annotated[bool | None, typer.Option(
        "--normalize/--no-normalize", help="With --pool: scale each vector to unit length (default: as a "
                                           "sentence-transformers directory says, else no).")] = None,
    on_error: Annotated[str, typer.Option(
        "--on-error", help="With --pool: a line that cannot be embedded: record (a row of NaN, the error in the "
                           "index), skip or stop.")] = "record",
    pairs: Annotated[bool, typer.Option("--pairs", help="Lines hold text pairs as 'text_a ||| text_b'.")] = False,
    batch_size: Annotated[int, typer.Option(help="Lines per forward pass.")] = 32,
    max_length: Annotated[int | None, typer.Option(help="Pieces per line, specials included (longer lines are "
                                                        "truncated; their cut words get zeros).")] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="Store float16 instead of float32.")] = False,
    device: Annotated[str | None, typer.Option(help="torch device (default cpu).")] = None,
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "fp32",
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
    revision: RevisionOption = None,
) -> None:
    """Features of a frozen encoder for each line of a file: per word, per token or pooled per line.

    Words are the whitespace-separated words of a line, so "U.S." and "don't" get one vector each.

    Example: `bertforge extract --model models/minilm --input sentences.txt --strategy sum_last_four --out feats.npy`
    (Google's JSONL: `--layers -1,-2,-3,-4 --align token --out feats.jsonl`)
    """
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    from tqdm.auto import tqdm

    from bertforge.checkpoint import CheckpointError
    from bertforge.features import FeatureExtractor, write_features

    if align not in ("first", "mean", "token"):
        raise fail(f"--align must be first, mean or token, got {align!r}")
    if not input_file.is_file():
        raise fail(f"--input {input_file}: no such file")
    if batch_size < 1:
        raise fail(f"--batch-size must be at least 1, got {batch_size}")
    chosen = _parse_layers(layers)
    if strategy is not None and chosen is not None:
        raise fail("give --strategy or --layers, not both")
    if pool is not None and strategy is None and chosen is None and not pairs and out.suffix in (".npy", ".jsonl"):
        # one vector per line from the last layer: the one embeddings path `predict` has, so both commands
        # give the same vectors, treat rows alike and write the same files
        _predict_file(model, input_file, out, task="embeddings", batch_size=batch_size, max_length=max_length,
                      device=device, precision=precision, pooling=pool, normalize=normalize, top_k=5,
                      progress=not quiet, on_error=on_error, vector_dtype="float16" if fp16 else "float32")
        return
    if normalize is not None:
        raise fail("--normalize goes with --pool (one vector per line, written as .npy or .jsonl)")
    try:
        extractor = FeatureExtractor.from_pretrained(
            model, strategy=strategy, layers=chosen, combine=combine if chosen is not None else None,
            align=None if align == "token" else align, pool=pool, batch_size=batch_size, max_length=max_length,
            dtype="float16" if fp16 else "float32", device=device, precision=precision)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    inputs = text_lines(input_file, pairs)
    try:
        with tqdm(total=len(inputs), unit="line", disable=quiet) as bar:
            summary = write_features(extractor, inputs, out, progress=bar)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"{extractor.selection.describe()} at {extractor.precision}; {summary['inputs']} lines -> {out} "
               f"({summary.get('rows', summary['inputs'])} {summary['unit']} rows of {summary['row_shape']})")
    if summary["truncated_inputs"]:
        typer.secho(f"warning: {summary['truncated_inputs']} lines were truncated to the length limit",
                    err=True, fg=typer.colors.YELLOW)
