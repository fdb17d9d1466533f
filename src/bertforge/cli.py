"""The `bertforge` command line: a thin typer shell over importable library functions.

Each command parses its arguments, calls one library function and prints the result. Heavy modules
(torch, tokenizers) are imported inside the commands so that `bertforge --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    name="bertforge",
    help="BERT end to end: WordPiece vocabularies, pre-training, fine-tuning, analysis and serving.\n\n"
    "Checkpoints are Hugging Face-format directories (config.json, model.safetensors, vocab.txt).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)


@app.callback()
def _main() -> None:
    """BERT end to end: WordPiece vocabularies, pre-training, fine-tuning, analysis and serving."""


def _fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr and return the exit to raise (status 2 = bad input)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=2)


# ---------------------------------------------------------------------------------------------------
# model inspection (foundation)
# ---------------------------------------------------------------------------------------------------


@app.command()
def inspect(
    model_dir: Annotated[Path, typer.Argument(help="A Hugging Face-format BERT directory.")],
) -> None:
    """Load a checkpoint and print its config, parameter count and key report.

    Example: `bertforge inspect runs/tiny/final`
    """
    from bertforge.checkpoint import CheckpointError
    from bertforge.model import load_any

    try:
        model, report = load_any(model_dir)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    config = model.config
    n_params = sum(p.numel() for p in model.parameters())
    typer.echo(f"{type(model).__name__}  L={config.num_hidden_layers} H={config.hidden_size} "
               f"A={config.num_attention_heads} I={config.intermediate_size} vocab={config.vocab_size}")
    typer.echo(f"parameters: {n_params:,}")
    typer.echo(report.summary())


@app.command()
def quickstart(
    out: Annotated[Path, typer.Option(help="Run directory (stages, models, report.md).")] = Path("runs/quickstart"),
    budget: Annotated[str, typer.Option(help="full: the real thing (<= 15 min on 2 CPU cores); smoke: ~1 min.")] = "full",
    stage: Annotated[list[str] | None, typer.Option(help="Run only this stage (repeat); see the list above.")] = None,
    force: Annotated[bool, typer.Option(help="Rerun the chosen stages even if they completed.")] = False,
) -> None:
    """Raw text to scores on bundled data: WordPiece -> shards -> pre-train a tiny BERT -> held-out MLM/NSP and
    fill-mask -> fine-tune on SST-2, from it and from the real all-MiniLM-L6 -> report.md.

    Stages: tokenizer, data, pretrain, pretrain_eval, finetune_scratch, finetune_minilm, report. A second run
    reuses completed stages.

    Example: `bertforge quickstart --out runs/quickstart` (then read runs/quickstart/report.md)
    """
    from bertforge.quickstart import quickstart as run_quickstart

    try:
        run_quickstart(out, budget=budget, stages=stage, force=force, echo=typer.echo)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"\nreport: {out / 'report.md'}")
    typer.echo((out / "report.md").read_text(encoding="utf-8"))


tokenizer_app = typer.Typer(help="WordPiece vocabularies: train one from text, try one on a sentence.",
                             no_args_is_help=True)
app.add_typer(tokenizer_app, name="tokenizer")


@tokenizer_app.command("train")
def tokenizer_train(
    inputs: Annotated[list[Path], typer.Option("--input", "-i", help="Text file(s) to learn from (repeat).")],
    out: Annotated[Path, typer.Option(help="Directory for vocab.txt, tokenizer_config.json, tokenizer.json.")],
    vocab_size: Annotated[int, typer.Option(help="Vocabulary size, special tokens included.")] = 30522,
    min_frequency: Annotated[int, typer.Option(help="Ignore pairs seen fewer times than this.")] = 2,
    cased: Annotated[bool, typer.Option("--cased", help="Keep case (and accents) instead of lower-casing.")] = False,
) -> None:
    """Train a WordPiece vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK] reserved, "##" continuations).

    Example: `bertforge tokenizer train --input book1.txt --input book2.txt --out runs/vocab --vocab-size 8000`
    """
    from bertforge.tokenizer import BertTokenizer

    try:
        tokenizer = BertTokenizer.train(inputs, vocab_size=vocab_size, min_frequency=min_frequency,
                                        lowercase=not cased)
    except (FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    tokenizer.save_pretrained(out)
    typer.echo(f"{tokenizer.vocab_size} pieces -> {out / 'vocab.txt'}")


@tokenizer_app.command("encode")
def tokenizer_encode(
    directory: Annotated[Path, typer.Argument(help="A folder with vocab.txt (a tokenizer or a checkpoint).")],
    text: Annotated[str, typer.Argument(help="The text (segment A).")],
    pair: Annotated[str | None, typer.Option(help="Optional segment B.")] = None,
) -> None:
    """Show the WordPiece tokens, ids, segment ids and character offsets of a text.

    Example: `bertforge tokenizer encode runs/vocab "Unaffable, naïve café!"`
    """
    from bertforge.tokenizer import BertTokenizer

    if not (directory / "vocab.txt").exists() and not (directory / "tokenizer.json").exists():
        raise _fail(f"{directory}: no vocab.txt or tokenizer.json")
    try:
        encoding = BertTokenizer.from_pretrained(directory).encode(text, pair, truncation=True)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    for token, token_id, segment, (start, end) in zip(
        encoding.tokens, encoding.input_ids, encoding.token_type_ids, encoding.offsets, strict=True
    ):
        typer.echo(f"{token_id:>7}  {segment}  {start:>4}:{end:<4} {token}")


# ---------------------------------------------------------------------------------------------------
# evaluation with the official metrics (fine-tuning)
# ---------------------------------------------------------------------------------------------------

evaluate_app = typer.Typer(help="Score predictions with the official metrics.", no_args_is_help=True)
app.add_typer(evaluate_app, name="evaluate")


@evaluate_app.command("squad")
def evaluate_squad(
    data: Annotated[Path, typer.Option("--data", help="SQuAD v1.1 or v2.0 dataset json (the gold answers).")],
    predictions: Annotated[Path, typer.Option("--predictions", help="json object: question id -> answer text.")],
    na_probs: Annotated[Path | None, typer.Option(
        "--na-probs", help="v2.0 only: json object: question id -> probability of no answer.")] = None,
    na_prob_thresh: Annotated[float, typer.Option(
        "--na-prob-thresh", help="v2.0 only: a no-answer probability above this counts as answering \"\".")] = 1.0,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON to this file.")] = None,
) -> None:
    """Print EM and F1 as the official SQuAD script of the dataset's version prints them (same keys).

    v1.1: `exact_match`, `f1`. v2.0: `exact`, `f1`, `total`, `HasAns_*`, `NoAns_*`, and with `--na-probs`
    the best-threshold scores (`best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh`).

    Example: `bertforge evaluate squad --data dev-v2.0.json --predictions predictions.json --na-probs na_probs.json`
    """
    import json

    from bertforge.fileio import write_text_atomic
    from bertforge.tasks.glue import DataFormatError
    from bertforge.tasks.metrics import squad_evaluate
    from bertforge.tasks.squad import load_squad_json

    def load_object(path: Path) -> dict:
        try:
            value = json.loads(path.read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise _fail(f"{path}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _fail(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise _fail(f"{path}: expected a JSON object mapping question ids to values")
        return value

    try:
        dataset = load_squad_json(data)
    except OSError as exc:
        raise _fail(f"{data}: {exc.strerror or exc}") from exc
    except DataFormatError as exc:
        raise _fail(str(exc)) from exc
    try:
        result = squad_evaluate(dataset, load_object(predictions),
                                load_object(na_probs) if na_probs is not None else None, na_prob_thresh)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    text = json.dumps(result, indent=2)
    typer.echo(text)
    if out is not None:
        write_text_atomic(out, text + "\n")


# ---------------------------------------------------------------------------------------------------
# serving and ONNX export (serve and demo)
# ---------------------------------------------------------------------------------------------------


@app.command()
def serve(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory.")],
    host: Annotated[str, typer.Option(help="Interface to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    max_batch_size: Annotated[int, typer.Option(help="Rows per model call; 1 turns dynamic batching off.")] = 16,
    max_wait_ms: Annotated[float, typer.Option(help="How long a batch waits for company.")] = 5.0,
    device: Annotated[str, typer.Option(help="torch device: cpu, cuda, cuda:1, ...")] = "cpu",
) -> None:
    """Serve a checkpoint over HTTP: JSON API (/fill-mask /classify /qa /ner /embed /attention) and a demo page at /.

    Example: `bertforge serve --model runs/squad/final --port 8000`, then open http://127.0.0.1:8000/
    (API schema at /docs).
    """
    from bertforge.checkpoint import CheckpointError

    if not 0 < port < 65536:
        raise _fail(f"--port must be 1..65535, got {port}")
    if max_batch_size < 1 or max_wait_ms < 0:
        raise _fail("--max-batch-size must be at least 1 and --max-wait-ms at least 0")
    try:
        import uvicorn

        from bertforge.serve import bound_kernel_cache, create_app
    except ImportError as exc:
        raise _fail(f"serving needs the 'serve' extra (pip install 'bertforge[serve]'): {exc}") from exc
    bound_kernel_cache()  # memory stays flat however many batch shapes arrive
    try:
        api = create_app(model, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, device=device)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"serving {api.state.service.kind} from {model} at http://{host}:{port}/ "
               f"(tasks: {', '.join(api.state.service.tasks)})")
    uvicorn.run(api, host=host, port=port, log_level="info")


@app.command("export-onnx")
def export_onnx_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory.")],
    out: Annotated[Path, typer.Option("--out", help="The .onnx file to write.")],
    opset: Annotated[int, typer.Option(help="ONNX opset version.")] = 18,
    check: Annotated[bool, typer.Option(help="Compare ONNX Runtime with PyTorch after export.")] = True,
) -> None:
    """Export a checkpoint to ONNX with dynamic batch and sequence axes on every input.

    Example: `bertforge export-onnx --model runs/squad/final --out squad.onnx`
    """
    from bertforge.checkpoint import CheckpointError

    try:
        from bertforge.export import export_onnx
    except ImportError as exc:
        raise _fail(f"ONNX export needs onnx and onnxscript (pip install 'bertforge[onnx]'): {exc}") from exc
    if out.suffix != ".onnx":
        raise _fail(f"--out should name a .onnx file, got {out}")
    try:
        result = export_onnx(model, out, opset=opset, check=check)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    except ImportError as exc:
        raise _fail(f"checking the export needs onnxruntime (or pass --no-check): {exc}") from exc
    typer.echo(f"wrote {result.path} ({result.model}) in {result.seconds:.1f} s")
    typer.echo(f"inputs: {', '.join(result.inputs)}  axes: {', '.join(result.dynamic_axes[result.inputs[0]])}")
    typer.echo(f"outputs: {', '.join(result.outputs)}")
    if result.max_abs_diff is not None:
        shapes = ", ".join("x".join(map(str, s)) for s in result.checked_shapes)
        typer.echo(f"ONNX Runtime vs PyTorch: max abs diff {result.max_abs_diff:.2e} on inputs {shapes}")


# ---------------------------------------------------------------------------------------------------
# pre-training data (issue 4)
# ---------------------------------------------------------------------------------------------------


@app.command("prepare")
def prepare_command(
    inputs: Annotated[list[Path], typer.Option("--input", "-i", help="Text file or directory of .txt files (repeat).")],
    tokenizer: Annotated[Path, typer.Option("--tokenizer", help="Tokenizer directory (vocab.txt ...).")],
    out: Annotated[Path, typer.Option("--out", help="Output directory for the shards and stats.json.")],
    max_seq_length: Annotated[int, typer.Option(help="Tokens per instance, [CLS] and [SEP] included.")] = 128,
    workers: Annotated[int, typer.Option(help="Processes, one shard each.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the training instances and masks.")] = 12345,
    objective: Annotated[str, typer.Option(help="nsp (BERT), sop (ALBERT) or none (RoBERTa packing).")] = "nsp",
    masking: Annotated[str, typer.Option(help="static (masked here) or dynamic (masked by the loader each epoch).")]
    = "static",
    dupe_factor: Annotated[int | None, typer.Option(help="Copies of the data, each masked differently "
                                                         "(default 10 static, 1 dynamic).")] = None,
    whole_word: Annotated[bool, typer.Option("--whole-word", help="Mask whole words.")] = False,
    span: Annotated[bool, typer.Option("--span", help="SpanBERT span masking (whole words).")] = False,
    plain_text: Annotated[bool, typer.Option("--plain-text", help="Running text, split into sentences here "
                                                                 "(default: one sentence per line).")] = False,
    strip_gutenberg: Annotated[bool, typer.Option("--strip-gutenberg", help="Drop Project Gutenberg headers "
                                                                           "and licences.")] = False,
    short_seq_prob: Annotated[float, typer.Option(help="Share of shorter target lengths.")] = 0.1,
    masked_lm_prob: Annotated[float, typer.Option(help="Share of tokens masked.")] = 0.15,
    max_predictions: Annotated[int | None, typer.Option(help="Masks per sequence at most "
                                                             "(default ceil(0.15 x length)).")] = None,
    validation_fraction: Annotated[float, typer.Option(help="Share of text held out for validation.")] = 0.01,
    validation_input: Annotated[list[Path] | None, typer.Option(
        help="Text file or directory held out whole for validation, e.g. a test split (repeat).")] = None,
    bad_bytes: Annotated[str, typer.Option(help="Lines that are not UTF-8: skip, replace or error.")] = "skip",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Clear --out and start again "
                                                               "(default: resume an interrupted run).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Turn text into shards of masked-LM + next-sentence instances, in parallel and resumably.

    Example: `bertforge prepare --input corpus/ --tokenizer runs/vocab --out data/bert128 --workers 4`
    """
    import warnings

    from bertforge.data.corpus import DataError
    from bertforge.data.prepare import DataWarning, prepare

    if workers < 1:
        raise _fail(f"--workers must be at least 1, got {workers}")
    if not tokenizer.is_dir():
        raise _fail(f"--tokenizer {tokenizer}: no such directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataWarning)
        try:
            stats = prepare(
                inputs, tokenizer, out, max_seq_length=max_seq_length, workers=workers, seed=seed,
                objective=objective, masking=masking, dupe_factor=dupe_factor, whole_word=whole_word, span=span,
                masked_lm_prob=masked_lm_prob, max_predictions_per_seq=max_predictions,
                short_seq_prob=short_seq_prob, plain_text=plain_text, strip_gutenberg=strip_gutenberg,
                validation_fraction=validation_fraction, validation_inputs=validation_input or (),
                bad_bytes=bad_bytes, overwrite=overwrite, progress=not quiet,
            )
        except (DataError, ValueError, FileNotFoundError) as exc:
            raise _fail(str(exc)) from exc
    for warning in caught:
        typer.secho(f"warning: {warning.message}", err=True, fg=typer.colors.YELLOW)
    run = stats["run"]
    nsp = f", IsNext {stats['is_next_fraction']:.1%}" if stats["is_next_fraction"] is not None else ""
    masked = f", masked {stats['masked_fraction']:.1%}" if stats["masked_fraction"] is not None else ""
    typer.echo(f"{stats['documents']:,} documents, {stats['sentences']:,} sentences, {stats['tokens']:,} tokens -> "
               f"{stats['instances']:,} instances (+{stats['validation_instances']:,} validation){masked}{nsp}")
    typer.echo(f"{run['wall_s']:.1f} s, {run['mb_per_s']:.2f} MB/s, {run['docs_per_s']:.1f} docs/s -> {out}")


# ---------------------------------------------------------------------------------------------------
# pre-training: the training loop and its curves (issue 5)
# ---------------------------------------------------------------------------------------------------


@app.command("pretrain")
def pretrain_command(
    config: Annotated[str, typer.Option("--config", help="Recipe (YAML/JSON), preset name, config.json or "
                                                         "checkpoint directory.")],
    data: Annotated[Path, typer.Option("--data", help="Shards made by `bertforge prepare`.")],
    out: Annotated[Path, typer.Option("--out", help="Run directory: checkpoints, metrics.jsonl, final/.")],
    max_steps: Annotated[int | None, typer.Option(help="Optimiser steps (overrides the recipe).")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint in --out.")] = False,
    init_from: Annotated[Path | None, typer.Option(help="Start from this checkpoint directory's weights "
                                                        "(continued pre-training; same vocabulary as --data).")
                         ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Sequences per device per micro-batch.")] = None,
    grad_accum: Annotated[int | None, typer.Option(help="Micro-batches per optimiser step.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    precision: Annotated[str | None, typer.Option(help="fp32, bf16 or fp16 (GPU).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed (rank r uses seed + r).")] = None,
    parallel: Annotated[str | None, typer.Option(help="Under torchrun: ddp (a model copy per rank) or fsdp "
                                                      "(parameters, gradients and optimizer state sharded, "
                                                      "for big models).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer to ship in final/ (default: the data's).")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Any recipe field: --set warmup_steps=100 "
                                                                 "(repeat).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Pre-train BERT (masked LM + NSP/SOP) on prepared shards; the final model goes to RUN/final.

    Runs on one process as is, and on several under torchrun (DDP, or FSDP with --parallel fsdp; gloo on
    CPU, NCCL on GPU). Checkpoints are full, unsharded files either way, so a run resumes under the
    other mode or another number of processes.

    Example: `bertforge pretrain --config recipes/tiny-cpu.yaml --data data/gutenberg128 --out runs/tiny`
    """
    import yaml

    from bertforge.pretrain import pretrain
    from bertforge.train import NonFiniteLossError
    from bertforge.train.distributed import DistributedTimeout

    overrides: dict[str, object] = {}
    for item in set_ or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _fail(f"--set expects key=value, got {item!r}")
        overrides[key.strip().rpartition(".")[2]] = yaml.safe_load(value)  # "optim.lr" and "lr" alike
    overrides.update({k: v for k, v in dict(batch_size=batch_size, grad_accum=grad_accum, lr=lr,
                                             precision=precision, seed=seed, parallel=parallel).items()
                      if v is not None})
    if tokenizer is not None:
        overrides["tokenizer"] = str(tokenizer)
    if quiet:
        overrides["progress"] = False
    try:
        result = pretrain(config, data, out, max_steps=max_steps, resume=resume, init_from=init_from, **overrides)
    except (ValueError, FileExistsError, FileNotFoundError) as exc:
        raise _fail(str(exc)) from exc
    except (NonFiniteLossError, DistributedTimeout) as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=1) from exc
    if result.final is not None:
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in result.train.metrics.items())
        typer.echo(f"step {result.train.step}: {metrics or 'no validation split'}")
        typer.echo(f"final model: {result.final}")


@app.command("plot")
def plot_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holds metrics.jsonl).")],
    out: Annotated[Path | None, typer.Option(help="PNG to write (default RUN_DIR/curves.png).")] = None,
) -> None:
    """Draw a run's loss and accuracy curves (training and validation) to a PNG.

    Example: `bertforge plot runs/tiny` (writes runs/tiny/curves.png)
    """
    from bertforge.plot import plot_run

    if not (run_dir / "metrics.jsonl").is_file():
        raise _fail(f"{run_dir}: no metrics.jsonl (is it a run directory of `bertforge pretrain`?)")
    try:
        path = plot_run(run_dir, out)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"wrote {path}")


# ---------------------------------------------------------------------------------------------------
# fine-tuning and prediction (issue 6)
# ---------------------------------------------------------------------------------------------------

finetune_app = typer.Typer(
    help="Fine-tune a pre-trained checkpoint on a task (GLUE, CoNLL-2003 NER, SQuAD, SWAG) with the paper's "
    "recipe: AdamW, 10% warm-up then linear decay, batch 32, 3 epochs. Writes OUT/seed-N/ (a Hugging Face "
    "model) and OUT/results.json (mean / std / median across seeds).",
    no_args_is_help=True,
)
app.add_typer(finetune_app, name="finetune")

_FtModel = Annotated[Path, typer.Option("--model", help="The pre-trained checkpoint (Hugging Face layout).")]
_FtData = Annotated[Path, typer.Option("--data", help="The task's data directory (or file, for SQuAD).")]
_FtOut = Annotated[Path, typer.Option("--out", help="Run directory: seed-N/ models and results.json.")]
_FtSeeds = Annotated[str, typer.Option("--seeds", help="Comma-separated seeds, one fine-tuning run each.")]
_FtEpochs = Annotated[float, typer.Option("--epochs", help="Passes over the training set (fractions allowed).")]
_FtBatch = Annotated[int, typer.Option("--batch-size", help="Training batch size.")]
_FtWarmup = Annotated[float, typer.Option("--warmup", help="Fraction of the steps spent warming up.")]
_FtTrainN = Annotated[int | None, typer.Option(
    "--max-train-examples", help="Train on a fixed random sub-sample of this many examples.")]
_FtEvalN = Annotated[int | None, typer.Option("--max-eval-examples", help="Score only the first N dev examples.")]
_FtPrecision = Annotated[str, typer.Option("--precision", help="fp32, bf16 (CPU or GPU) or fp16 (GPU).")]
_FtReinit = Annotated[int, typer.Option(
    "--reinit-layers", help="Start the top N encoder layers and the pooler afresh (N = all keeps only the "
    "embeddings).")]


def _finetune_run(family: str, task: str, model: Path, data: Path, out: Path, seeds: str, *,
                  settings: dict | None = None, **options: object) -> None:
    """Shared by the `finetune` sub-commands: parse, call `bertforge.finetune.finetune`, print the summary."""
    from bertforge.checkpoint import CheckpointError
    from bertforge.finetune import finetune
    from bertforge.tasks.base import DataFormatError

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError as exc:
        raise _fail(f"--seeds must be comma-separated integers, got {seeds!r}") from exc
    if not seed_list:
        raise _fail("--seeds names no seed")
    try:
        results = finetune(family, task, model, data, out, seeds=seed_list, task_settings=settings,
                           **options)  # type: ignore[arg-type]
    except (CheckpointError, DataFormatError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{results['family']} {results['task']}: {len(results['seeds'])} seed(s), "
               f"{results['train_examples']} training examples, {results['wall_s']:.0f} s")
    for name, row in results["summary"].items():
        typer.echo(f"  {name:>24}: mean {row['mean']:.4f}  std {row['std']:.4f}  median {row['median']:.4f}")
    typer.echo(f"wrote {out / 'results.json'}")


@finetune_app.command("glue")
def finetune_glue(
    task: Annotated[str, typer.Option("--task", help="CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE or WNLI.")],
    model: _FtModel,
    data: _FtData,
    out: _FtOut,
    seeds: _FtSeeds = "1",
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 2e-5,
    epochs: _FtEpochs = 3.0,
    batch_size: _FtBatch = 32,
    max_length: Annotated[int, typer.Option("--max-length", help="Pieces per input, specials included.")] = 128,
    warmup: _FtWarmup = 0.1,
    max_train_examples: _FtTrainN = None,
    max_eval_examples: _FtEvalN = None,
    precision: _FtPrecision = "fp32",
    reinit_layers: _FtReinit = 0,
) -> None:
    """Fine-tune on a GLUE task (sequence classification; STS-B regression) and score its dev set.

    Example: `bertforge finetune glue --task RTE --model models/minilm --data data/glue --out runs/rte --seeds 1,2,3`
    """
    _finetune_run("glue", task, model, data, out, seeds, lr=lr, epochs=epochs, batch_size=batch_size,
                  max_length=max_length, warmup=warmup, max_train_examples=max_train_examples,
                  max_eval_examples=max_eval_examples, precision=precision, reinit_layers=reinit_layers)


@finetune_app.command("ner")
def finetune_ner(
    model: _FtModel,
    data: Annotated[Path, typer.Option("--data", help="Directory with eng.train / eng.testa / eng.testb "
                                                      "(or train.txt / dev.txt / test.txt).")],
    out: _FtOut,
    task: Annotated[str, typer.Option("--task", help="A name for the data set.")] = "conll2003",
    seeds: _FtSeeds = "1",
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 5e-5,
    epochs: _FtEpochs = 3.0,
    batch_size: _FtBatch = 32,
    max_length: Annotated[int, typer.Option("--max-length", help="Pieces per window; longer sentences "
                                                                 "are split into windows.")] = 128,
    warmup: _FtWarmup = 0.1,
    max_train_examples: _FtTrainN = None,
    max_eval_examples: _FtEvalN = None,
    precision: _FtPrecision = "fp32",
    frozen: Annotated[bool, typer.Option("--frozen", help="Feature-based instead: freeze the encoder and train "
                                                          "a two-layer BiLSTM tagger on its features.")] = False,
    strategy: Annotated[str, typer.Option("--strategy", help="With --frozen: embeddings, last, second_to_last, "
                                                             "sum_last_four, concat_last_four or sum_all.")] = "concat_last_four",
) -> None:
    """Fine-tune token classification on CoNLL-2003 (IOB2 tags, first sub-token labelled) and report
    conlleval's entity-level F1 on the dev set. With --frozen, the paper's feature-based set-up instead.

    Example: `bertforge finetune ner --model models/minilm --data data/conll2003 --out runs/ner`
    Feature-based: `bertforge finetune ner --frozen --strategy sum_last_four --model models/minilm --data data/conll2003 --out runs/ner-frozen`
    """
    if frozen:
        from bertforge.checkpoint import CheckpointError
        from bertforge.features import STRATEGIES
        from bertforge.tasks.base import DataFormatError
        from bertforge.tasks.frozen_ner import FrozenNerConfig, ablate

        if strategy not in STRATEGIES:
            raise _fail(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
        try:
            (row,) = ablate(model, data, out, strategies=(strategy,), train_sentences=max_train_examples,
                            config=FrozenNerConfig(seed=int(seeds.split(",")[0])))
        except (CheckpointError, DataFormatError, FileNotFoundError, ValueError) as exc:
            raise _fail(str(exc)) from exc
        typer.echo(f"{strategy}: hidden states {row['layers']} ({row['combine']}) -> dev F1 {100 * row['dev_f1']:.2f}")
        return
    _finetune_run("ner", task, model, data, out, seeds, lr=lr, epochs=epochs, batch_size=batch_size,
                  max_length=max_length, warmup=warmup, max_train_examples=max_train_examples,
                  max_eval_examples=max_eval_examples, precision=precision)


@finetune_app.command("squad")
def finetune_squad(
    model: _FtModel,
    data: Annotated[Path, typer.Option("--data", help="Directory with train-*.json and dev-*.json, or one "
                                                      "SQuAD file split with --train-articles.")],
    out: _FtOut,
    task: Annotated[str, typer.Option("--task", help="squad (version from the file), v1.1 or v2.0.")] = "squad",
    seeds: _FtSeeds = "1",
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 5e-5,
    epochs: _FtEpochs = 3.0,
    batch_size: _FtBatch = 32,
    max_length: Annotated[int, typer.Option("--max-length", help="Pieces per window, question included.")] = 384,
    doc_stride: Annotated[int, typer.Option("--doc-stride", help="Pieces between window starts.")] = 128,
    max_query_length: Annotated[int, typer.Option("--max-query-length", help="Question pieces kept.")] = 64,
    train_articles: Annotated[int | None, typer.Option(
        "--train-articles", help="Train on the first N articles of the (dev) file, evaluate on the rest.")] = None,
    warmup: _FtWarmup = 0.1,
    max_train_examples: _FtTrainN = None,
    max_eval_examples: _FtEvalN = None,
    precision: _FtPrecision = "fp32",
) -> None:
    """Fine-tune span QA on SQuAD v1.1 or v2.0 and report the official EM / F1 (v2.0: also the tuned
    no-answer threshold, saved with the model).

    Example: `bertforge finetune squad --model models/minilm --data data/squad/dev-v1.1.json --train-articles 38 --out runs/squad`
    """
    if train_articles is not None and train_articles < 1:
        raise _fail("--train-articles must be at least 1")
    settings = {"doc_stride": doc_stride, "max_query_length": max_query_length, "train_articles": train_articles}
    _finetune_run("squad", task, model, data, out, seeds, settings=settings, lr=lr, epochs=epochs,
                  batch_size=batch_size, max_length=max_length, warmup=warmup,
                  max_train_examples=max_train_examples, max_eval_examples=max_eval_examples, precision=precision)


@finetune_app.command("swag")
def finetune_swag(
    model: _FtModel,
    data: Annotated[Path, typer.Option("--data", help="Directory with train.csv / val.csv (or .jsonl).")],
    out: _FtOut,
    seeds: _FtSeeds = "1",
    lr: Annotated[float, typer.Option("--lr", help="Peak learning rate.")] = 2e-5,
    epochs: _FtEpochs = 3.0,
    batch_size: _FtBatch = 16,
    max_length: Annotated[int, typer.Option("--max-length", help="Pieces per (context, ending) pair.")] = 128,
    warmup: _FtWarmup = 0.1,
    max_train_examples: _FtTrainN = None,
    max_eval_examples: _FtEvalN = None,
    precision: _FtPrecision = "fp32",
) -> None:
    """Fine-tune multiple choice on SWAG (four endings, softmax over their [CLS] scores); reports accuracy.

    Example: `bertforge finetune swag --model models/minilm --data data/swag --out runs/swag`
    """
    _finetune_run("swag", "swag", model, data, out, seeds, lr=lr, epochs=epochs, batch_size=batch_size,
                  max_length=max_length, warmup=warmup, max_train_examples=max_train_examples,
                  max_eval_examples=max_eval_examples, precision=precision)


@app.command("predict")
def predict_command(
    family: Annotated[str, typer.Argument(help="glue, ner, squad or swag.")],
    model: Annotated[Path, typer.Option("--model", help="A fine-tuned model (a seed-N directory).")],
    data: Annotated[Path, typer.Option("--data", help="The task's data directory (or SQuAD file).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the prediction files.")],
    task: Annotated[str | None, typer.Option("--task", help="The task (default: the one the model was "
                                                           "fine-tuned for, from its task.json).")] = None,
    split: Annotated[list[str] | None, typer.Option(
        "--split", help="Split(s) to predict; default the test split(s) (MNLI: test_matched, "
                        "test_mismatched and ax).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Rows per forward pass.")] = 64,
) -> None:
    """Write a fine-tuned model's predictions: GLUE leaderboard .tsv files (label names, STS-B scores,
    MNLI-m / MNLI-mm / AX), SQuAD predictions.json (+ null_odds.json for v2.0), CoNLL lines, SWAG csv.

    Example: `bertforge predict glue --model runs/sst2/seed-1 --data data/glue --out submission/`
    """
    import json

    from bertforge.checkpoint import CheckpointError
    from bertforge.finetune import FAMILIES, TASK_FILE, predict
    from bertforge.tasks.base import DataFormatError

    if family not in FAMILIES:
        raise _fail(f"unknown task family {family!r}; choose one of {', '.join(FAMILIES)}")
    if task is None:
        try:
            task = json.loads((model / TASK_FILE).read_text(encoding="utf-8"))["task"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise _fail(f"{model}: no readable {TASK_FILE} to take the task from; pass --task") from exc
    try:
        done = predict(family, task, model, data, out, splits=split or None, batch_size=batch_size)
    except (CheckpointError, DataFormatError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    for name, result in done.items():
        scores = "  ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items())
        typer.echo(f"{name}: {result['examples']} examples -> {', '.join(result['files'])}"
                   + (f"  ({scores})" if scores else ""))


# ---------------------------------------------------------------------------------------------------
# feature-based BERT and attention analysis (issue 7)
# ---------------------------------------------------------------------------------------------------


def _parse_layers(text: str | None) -> list[int] | None:
    """"-1,-2,-3,-4" -> [-1, -2, -3, -4] (Google's --layers spelling); None stays None."""
    if text is None:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise _fail(f"--layers must be comma-separated integers such as -1,-2 or 0,6, got {text!r}") from exc


def _text_lines(path: Path, pairs: bool) -> list[str | tuple[str, str]]:
    """Every line of a UTF-8 file (blank ones too, to keep line numbers); "a ||| b" as a pair with `pairs`."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise _fail(f"{path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise _fail(f"{path}: not UTF-8 text ({exc})") from exc
    if not pairs:
        return list(lines)
    out: list[str | tuple[str, str]] = []
    for line in lines:
        first, sep, second = line.partition(" ||| ")
        out.append((first, second) if sep else line)
    return out


@app.command("extract")
def extract_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory (any head).")],
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
                                                  "(over real tokens only).")] = None,
    pairs: Annotated[bool, typer.Option("--pairs", help="Lines hold text pairs as 'text_a ||| text_b'.")] = False,
    batch_size: Annotated[int, typer.Option(help="Lines per forward pass.")] = 32,
    max_length: Annotated[int | None, typer.Option(help="Pieces per line, specials included (longer lines are "
                                                        "truncated; their cut words get zeros).")] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help="Store float16 instead of float32.")] = False,
    device: Annotated[str | None, typer.Option(help="torch device (default cpu).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Features of a frozen encoder for each line of a file: per word, per token or pooled per line.

    Words are the whitespace-separated words of a line, so "U.S." and "don't" get one vector each.

    Example: `bertforge extract --model models/minilm --input sentences.txt --strategy sum_last_four --out feats.npy`
    (Google's JSONL: `--layers -1,-2,-3,-4 --align token --out feats.jsonl`)
    """
    from tqdm.auto import tqdm

    from bertforge.checkpoint import CheckpointError
    from bertforge.features import FeatureExtractor, write_features

    if align not in ("first", "mean", "token"):
        raise _fail(f"--align must be first, mean or token, got {align!r}")
    if not input_file.is_file():
        raise _fail(f"--input {input_file}: no such file")
    if batch_size < 1:
        raise _fail(f"--batch-size must be at least 1, got {batch_size}")
    chosen = _parse_layers(layers)
    if strategy is not None and chosen is not None:
        raise _fail("give --strategy or --layers, not both")
    try:
        extractor = FeatureExtractor.from_pretrained(
            model, strategy=strategy, layers=chosen, combine=combine if chosen is not None else None,
            align=None if align == "token" else align, pool=pool, batch_size=batch_size, max_length=max_length,
            dtype="float16" if fp16 else "float32", device=device)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    inputs = _text_lines(input_file, pairs)
    try:
        with tqdm(total=len(inputs), unit="line", disable=quiet) as bar:
            summary = write_features(extractor, inputs, out, progress=bar)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{extractor.selection.describe()}; {summary['inputs']} lines -> {out} "
               f"({summary.get('rows', summary['inputs'])} {summary['unit']} rows of {summary['row_shape']})")
    if summary["truncated_inputs"]:
        typer.secho(f"warning: {summary['truncated_inputs']} lines were truncated to the length limit",
                    err=True, fg=typer.colors.YELLOW)


@app.command("attention")
def attention_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory.")],
    text: Annotated[str, typer.Option("--text", help="The text to look at.")],
    png: Annotated[Path, typer.Option("--png", help="The PNG to write.")],
    pair: Annotated[str | None, typer.Option(help="Optional second segment.")] = None,
    layer: Annotated[int | None, typer.Option(help="Layer, from 1 (default: every layer).")] = None,
    head: Annotated[int | None, typer.Option(help="Head, from 1 (default: every head).")] = None,
    max_length: Annotated[int, typer.Option(help="Pieces kept, specials included.")] = 64,
) -> None:
    """Heat map of attention: one head (--layer and --head), one layer's heads, or the layers x heads grid.

    Example: `bertforge attention --model models/minilm --text "The cat sat on the mat." --layer 2 --head 9 --png att.png`
    """
    from bertforge.analysis import attention_maps, plot_attention
    from bertforge.checkpoint import CheckpointError
    from bertforge.model.bert import BertModel
    from bertforge.tokenizer import BertTokenizer

    try:
        encoder = BertModel.from_pretrained(model)
        tokens, maps = attention_maps(encoder, BertTokenizer.from_pretrained(model), text, pair, max_length=max_length)
        path = plot_attention(tokens, maps, png, layer=layer, head=head)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{len(tokens)} tokens, {maps.shape[0]} layers x {maps.shape[1]} heads -> {path}")


@app.command("attention-stats")
def attention_stats_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory.")],
    input_file: Annotated[Path, typer.Option("--input", help="UTF-8 text, one text per line (blank lines "
                                                             "skipped; 'a ||| b' with --pairs).")],
    png: Annotated[Path | None, typer.Option(help="The layers x heads grid (default INPUT-stem.attention.png "
                                                  "next to --table, or ./attention_stats.png).")] = None,
    table: Annotated[Path | None, typer.Option(help="Markdown table: per layer, then per head.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="The averages as JSON.")] = None,
    max_texts: Annotated[int | None, typer.Option(help="Use only the first N texts.")] = None,
    max_length: Annotated[int, typer.Option(help="Pieces per text, specials included.")] = 128,
    batch_size: Annotated[int, typer.Option(help="Texts per forward pass.")] = 16,
    pairs: Annotated[bool, typer.Option("--pairs", help="Lines hold text pairs as 'text_a ||| text_b'.")] = False,
    title: Annotated[str | None, typer.Option(help="Title of the PNG (default: the model folder's name).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Per head, over a corpus: average attention to [CLS], [SEP], punctuation, the next and previous
    token, and attention entropy (Clark et al. 2019), as a table and a layers x heads PNG grid.

    Example: `bertforge attention-stats --model models/minilm --input sentences.txt --png stats.png --table stats.md`
    """
    import json

    from tqdm.auto import tqdm

    from bertforge.analysis import STATS, attention_stats, plot_head_stats
    from bertforge.checkpoint import CheckpointError
    from bertforge.fileio import write_text_atomic
    from bertforge.model.bert import BertModel
    from bertforge.tokenizer import BertTokenizer

    if not input_file.is_file():
        raise _fail(f"--input {input_file}: no such file")
    texts = [t for t in _text_lines(input_file, pairs) if (t if isinstance(t, str) else t[0]).strip()]
    texts = texts[:max_texts] if max_texts else texts
    if not texts:
        raise _fail(f"{input_file}: no text")
    try:
        encoder = BertModel.from_pretrained(model)
        tokenizer = BertTokenizer.from_pretrained(model)
        with tqdm(total=len(texts), unit="text", disable=quiet) as bar:
            stats = attention_stats(encoder, tokenizer, texts, batch_size=batch_size, max_length=max_length,
                                    progress=bar)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    png = png or (table.with_suffix(".png") if table is not None else Path("attention_stats.png"))
    plot_head_stats(stats, png, title=f"{title or model.name}: per-head attention over {stats.texts} texts")
    if table is not None:
        write_text_atomic(table, stats.layer_table() + "\n" + stats.table())
    if json_out is not None:
        write_text_atomic(json_out, json.dumps(stats.to_dict()) + "\n")
    typer.echo(stats.layer_table())
    for stat in STATS:
        tops = ", ".join(f"L{layer}-H{head} {value:.2f}" for layer, head, value in stats.top(stat, 3))
        typer.echo(f"highest {stat}: {tops}")
    typer.echo(f"wrote {png}" + (f", {table}" if table else "") + (f", {json_out}" if json_out else ""))


@app.command("ablate-features")
def ablate_features_command(
    model: Annotated[Path, typer.Option("--model", help="The checkpoint whose frozen layers are compared.")],
    data: Annotated[Path, typer.Option("--data", help="CoNLL-2003 directory (eng.train and eng.testa).")],
    out: Annotated[Path, typer.Option("--out", help="Directory: cache/, runs/<strategy>/, ablation.md, "
                                                    "ablation.png, results.json.")],
    strategy: Annotated[list[str] | None, typer.Option(
        "--strategy", help="Strategy to run (repeat; default all six). One strategy = the frozen tagger alone.")]
    = None,
    train_sentences: Annotated[int | None, typer.Option(
        help="Train on a fixed random sub-sample of N sentences (the one `finetune ner "
             "--max-train-examples N` uses).")] = None,
    epochs: Annotated[int, typer.Option(help="Passes over the training sentences.")] = 4,
    batch_size: Annotated[int, typer.Option(help="Sentences per step.")] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, 5% warm-up, linear decay).")] = 2e-3,
    lstm_size: Annotated[int, typer.Option(help="BiLSTM units per direction (the paper: 768).")] = 256,
    seed: Annotated[int, typer.Option(help="Seed of the tagger's initialisation and batch order.")] = 0,
    finetune_f1: Annotated[float | None, typer.Option(
        help="Dev F1 (%) of the whole model fine-tuned (`bertforge finetune ner`), for the table's last row.")]
    = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: torch's choice).")] = None,
    name: Annotated[str | None, typer.Option(help="The model's name in the table and chart (default: the "
                                                  "folder's name).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
) -> None:
    """The paper's feature-based NER ablation: cache every layer of a frozen encoder once, train a
    two-layer BiLSTM tagger per layer strategy, score CoNLL-2003 dev entity F1 (conlleval), write a
    markdown table beside the paper's BERT-base numbers and a bar chart.

    Example: `bertforge ablate-features --model models/minilm --data data/conll2003 --out runs/ablation --train-sentences 4000`
    """
    import torch

    from bertforge.checkpoint import CheckpointError
    from bertforge.features import STRATEGIES
    from bertforge.tasks.base import DataFormatError
    from bertforge.tasks.frozen_ner import FrozenNerConfig, ablate

    if threads is not None:
        if threads < 1:
            raise _fail(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    if epochs < 1 or batch_size < 1 or lstm_size < 1 or lr <= 0:
        raise _fail("--epochs, --batch-size and --lstm-size must be at least 1 and --lr positive")
    config = FrozenNerConfig(epochs=epochs, batch_size=batch_size, lr=lr, lstm_size=lstm_size, seed=seed,
                             progress=not quiet)
    try:
        results = ablate(model, data, out, strategies=tuple(strategy) if strategy else STRATEGIES,
                         train_sentences=train_sentences, config=config, finetune_f1=finetune_f1, model_name=name)
    except (CheckpointError, DataFormatError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    for row in results:
        typer.echo(f"{row['strategy']:>17}: hidden states {row['layers']} ({row['combine']}) -> dev F1 "
                   f"{100 * row['dev_f1']:.2f}  ({row['seconds']:.0f} s)")
    typer.echo(f"wrote {out / 'ablation.md'}, {out / 'ablation.png'}")


if __name__ == "__main__":  # pragma: no cover
    app()
