"""The `bertforge` command line: a thin typer shell over importable library functions.

Each command parses its arguments, calls one library function and prints the result. Heavy modules
(torch, tokenizers) are imported inside the commands so that `bertforge --help` stays instant.
"""

from __future__ import annotations

import inspect as pyinspect  # the `inspect` command takes the plain name
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import typer

# The recipes the commands' options are generated from (no torch behind them: --help stays instant).
from bertforge.data.prepare import PrepareOptions
from bertforge.finetune import FinetuneRecipe
from bertforge.pretrain import Recipe as PretrainRecipe

app = typer.Typer(
    name="bertforge",
    help="BERT end to end: WordPiece vocabularies, pre-training, fine-tuning, analysis and serving.\n\n"
    "Checkpoints are Hugging Face-format directories (config.json, model.safetensors, vocab.txt).",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
)


PRECISION_HELP = ("fp32, bf16, int8 (dynamic quantization of the encoder's Linear layers) or auto "
                  "(bf16 where the CPU has AMX or AVX512-BF16, else fp32).")


@app.callback()
def _main() -> None:
    """BERT end to end: WordPiece vocabularies, pre-training, fine-tuning, analysis and serving."""


def _fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr and return the exit to raise (status 2 = bad input)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(code=2)


# ---------------------------------------------------------------------------------------------------
# recipes on the command line: one option per recipe setting, plus --config FILE and --set key=value
# ---------------------------------------------------------------------------------------------------
_CONFIG_HELP = ("A recipe (YAML) whose settings replace the defaults; options given here win over it, and "
                "--set over both. A run's own run_config.yaml repeats the run.")
_SET_HELP = "Any recipe setting as key=value, by name or path (--set lr=3e-5, --set optim.schedule=cosine; repeat)."
_CONFIG_PARAMS = [
    pyinspect.Parameter("config", pyinspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[Path | None, typer.Option("--config", help=_CONFIG_HELP)]),
    pyinspect.Parameter("set_", pyinspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[list[str] | None, typer.Option("--set", help=_SET_HELP)]),
]


def _option_type(hint: Any) -> Any:
    """The command-line type of a setting, or None for settings only a file or --set can give (mappings)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else [hint]
    if len(args) != 1:
        return None
    base = args[0]
    if base in (int, float, str, bool):
        return base
    if typing.get_origin(base) is list:
        return list[str] if typing.get_args(base) == (str,) else str  # list[int]: "1,2,3"
    return None


def _option_names(setting: Any, kind: Any) -> list[str]:
    flag = setting.name.replace("_", "-")
    if kind is bool:
        return [f"--{flag}/--no-{flag}"]
    return [f"--{flag}", *setting.aliases]


def _default_text(setting: Any) -> str:
    default = setting.default
    if default is None or default == [] or default == {}:
        return ""
    return f" (default {','.join(map(str, default)) if isinstance(default, list) else default})"


def recipe_parameters(recipe_cls: type, skip: tuple[str, ...] = ()) -> list[pyinspect.Parameter]:
    """One keyword parameter per setting of `recipe_cls`, for typer: `--batch-size` for `batch_size`.

    Every option defaults to None (not given), so a recipe file or the field's own default decides;
    the help shows the field's help, its default and its place in the recipe.
    """
    from bertforge.recipe import settings_of

    params = []
    for setting in settings_of(recipe_cls).values():
        kind = _option_type(setting.type)
        if setting.name in skip or kind is None:
            continue
        summary = (setting.help.rstrip(".") + ("" if kind is bool else _default_text(setting))).strip()
        text = f"{summary + '. ' if summary else ''}[recipe: {'.'.join(setting.path)}]"
        option = typer.Option(*_option_names(setting, kind), help=text, show_default=False)
        params.append(pyinspect.Parameter(setting.name, pyinspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[kind | None, option]))
    return params


def recipe_command(group: typer.Typer, name: str, recipe_cls: type, body: Any, *, doc: str,
                   leading: list[pyinspect.Parameter] = (), skip: tuple[str, ...] = ()) -> Any:
    """Register `name` on `group` with `leading` parameters, one option per recipe setting and
    --config / --set. `body(given=..., config=..., assignments=..., **leading)` gets the settings the
    user gave by name (None left out)."""
    generated = recipe_parameters(recipe_cls, skip)
    params = [*leading, *generated, *_CONFIG_PARAMS]
    setting_names = [p.name for p in generated]

    def command(**kwargs: Any) -> None:
        given = {n: kwargs.pop(n) for n in setting_names if kwargs.get(n) is not None}
        for n in setting_names:
            kwargs.pop(n, None)
        body(given=given, config=kwargs.pop("config"), assignments=kwargs.pop("set_") or [], **kwargs)

    command.__signature__ = pyinspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = doc
    command.__name__ = command.__qualname__ = f"{name.replace('-', '_')}_command"
    group.command(name)(command)
    return command


def _recipe_errors() -> tuple[type[BaseException], ...]:
    from bertforge.checkpoint import CheckpointError
    from bertforge.data.corpus import DataError
    from bertforge.tasks.base import DataFormatError

    return (CheckpointError, DataError, DataFormatError, FileNotFoundError, FileExistsError, ValueError)


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
    """Raw text to scores on bundled data: WordPiece -> shards -> pre-train a tiny BERT -> held-out MLM/SOP, a
    word-order probe and fill-mask -> fine-tune on SST-2 from it, from random weights and from the real
    all-MiniLM-L6 -> report.md.

    Stages: tokenizer, data, pretrain, pretrain_eval, finetune_pretrained, finetune_random, finetune_minilm,
    report. A second run reuses completed stages.

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
    precision: Annotated[str, typer.Option(
        help="fp32, bf16, int8, or auto (bf16 where the CPU has native bf16 instructions).")] = "fp32",
    long_text: Annotated[str, typer.Option(
        "--long-text", help="/classify of texts longer than the model's length: truncate (the default; the "
                            "answer says truncated) or windows (overlapping windows, their logits averaged).")]
        = "truncate",
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
        api = create_app(model, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, device=device,
                         precision=precision, long_text=long_text)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"serving {api.state.service.kind} from {model} at {api.state.service.precision} "
               f"on http://{host}:{port}/ "
               f"(tasks: {', '.join(api.state.service.tasks)})")
    uvicorn.run(api, host=host, port=port, log_level="info")


@app.command("quantize")
def quantize_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory (any head).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the int8 copy.")],
) -> None:
    """Save an int8 copy of a checkpoint (dynamic quantization of the encoder's Linear layers, torchao).

    The copy holds config.json (with the recipe), the tokenizer and model.int8.safetensors (int8 weights
    and their scales; no pickle). `predict`, `serve` and `extract` load it and run it at int8; it is not
    a transformers checkpoint. Example: `bertforge quantize --model runs/sst2/seed-1 --out runs/sst2/int8`
    """
    from bertforge.checkpoint import CheckpointError

    try:
        from bertforge.model import load_any
        from bertforge.precision import apply_precision, save_quantized
        from bertforge.tokenizer import BertTokenizer

        loaded, _ = load_any(model)
        tokenizer = BertTokenizer.from_pretrained(model) if (model / "vocab.txt").exists() else None
        quantized, _ = apply_precision(loaded, "int8")
        save_quantized(quantized, out, tokenizer=tokenizer)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    typer.echo(f"wrote {out}: {', '.join(f'{name} ({size / 1e6:.1f} MB)' for name, size in sorted(files.items()))}")


@app.command("export-onnx")
def export_onnx_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory.")],
    out: Annotated[Path, typer.Option("--out", help="The .onnx file to write.")],
    opset: Annotated[int, typer.Option(help="ONNX opset version.")] = 18,
    check: Annotated[bool, typer.Option(help="Compare ONNX Runtime with PyTorch after export.")] = True,
    int8: Annotated[bool, typer.Option("--int8", help="Quantize the graph with ONNX Runtime's dynamic "
                                                      "quantization (int8 weights, about 4x smaller).")] = False,
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
        result = export_onnx(model, out, opset=opset, check=check, int8=int8)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    except ImportError as exc:
        raise _fail(f"checking the export needs onnxruntime (or pass --no-check): {exc}") from exc
    typer.echo(f"wrote {result.path} ({result.model}{', int8' if result.int8 else ''}) in {result.seconds:.1f} s")
    typer.echo(f"inputs: {', '.join(result.inputs)}  axes: {', '.join(result.dynamic_axes[result.inputs[0]])}")
    typer.echo(f"outputs: {', '.join(result.outputs)}")
    if result.max_abs_diff is not None:
        shapes = ", ".join("x".join(map(str, s)) for s in result.checked_shapes)
        typer.echo(f"ONNX Runtime vs PyTorch: max abs diff {result.max_abs_diff:.2e} on inputs {shapes}")


# ---------------------------------------------------------------------------------------------------
# pre-training data
# ---------------------------------------------------------------------------------------------------


def _flag(name: str, help_text: str) -> pyinspect.Parameter:
    return pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY, default=False,
                               annotation=Annotated[bool, typer.Option(f"--{name}", help=help_text)])


def _required_path(name: str, help_text: str) -> pyinspect.Parameter:
    return pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY,
                               annotation=Annotated[Path, typer.Option(f"--{name}", help=help_text)])


def _prepare_body(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path,
                  overwrite: bool, quiet: bool) -> None:
    import warnings

    from bertforge.data.prepare import DataWarning, prepare
    from bertforge.recipe import resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataWarning)
        try:
            options = resolve(PrepareOptions, config, given, assignments)
            if options.tokenizer is None or not Path(options.tokenizer).is_dir():
                raise ValueError(f"--tokenizer {options.tokenizer}: no such directory" if options.tokenizer
                                 else "no tokenizer: give --tokenizer DIR (or tokenizer: in the recipe)")
            if not options.inputs:
                raise ValueError("no input: give --input FILE_OR_DIR (or inputs: in the recipe)")
            stats = prepare(options, out_dir=out, overwrite=overwrite, progress=not quiet)
        except _recipe_errors() as exc:
            raise _fail(str(exc)) from exc
    for warning in caught:
        typer.secho(f"warning: {warning.message}", err=True, fg=typer.colors.YELLOW)
    run = stats["run"]
    nsp = f", IsNext {stats['is_next_fraction']:.1%}" if stats["is_next_fraction"] is not None else ""
    masked = f", masked {stats['masked_fraction']:.1%}" if stats["masked_fraction"] is not None else ""
    typer.echo(f"{stats['documents']:,} documents, {stats['sentences']:,} sentences, {stats['tokens']:,} tokens -> "
               f"{stats['instances']:,} instances (+{stats['validation_instances']:,} validation){masked}{nsp}")
    typer.echo(f"{run['wall_s']:.1f} s, {run['mb_per_s']:.2f} MB/s, {run['docs_per_s']:.1f} docs/s -> {out}")


recipe_command(
    app, "prepare", PrepareOptions, _prepare_body,
    leading=[_required_path("out", "Output directory for the shards, stats.json and run_config.yaml."),
             _flag("overwrite", "Clear --out and start again (default: resume an interrupted run)."),
             _flag("quiet", "No progress bar.")],
    doc="""Turn text into shards of masked-LM + next-sentence instances, in parallel and resumably.

    Inputs: .txt, .jsonl (--text-field) and .parquet (--text-column) files, directories and glob
    patterns; text and JSON lines may be compressed (.gz, .bz2, .xz, .zst).

    Example: `bertforge prepare --input corpus/ --tokenizer runs/vocab --out data/bert128 --workers 4`
    """)


@app.command("prepare-merge")
def prepare_merge(
    data: Annotated[Path, typer.Option("--data", help="The --out of the `prepare --part I/N` runs: it holds "
                                                      "their part-I-of-N directories.")],
) -> None:
    """Join the parts of `prepare --part I/N` into one dataset that `pretrain --data` reads.

    Example: `bertforge prepare-merge --data data/bert128`
    """
    from bertforge.data.prepare import merge_parts

    try:
        stats = merge_parts(data)
    except _recipe_errors() as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{stats['parts']} parts: {stats['documents']:,} documents, {stats['tokens']:,} tokens -> "
               f"{stats['instances']:,} instances (+{stats['validation_instances']:,} validation) -> {data}")


# ---------------------------------------------------------------------------------------------------
# pre-training: the training loop and its curves
# ---------------------------------------------------------------------------------------------------


def _pretrain_body(*, given: dict[str, Any], config: Path | None, assignments: list[str], data: Path, out: Path,
                   resume: bool, init_from: Path | None, quiet: bool) -> None:
    from bertforge.pretrain import pretrain
    from bertforge.recipe import parse_assignments
    from bertforge.train import NonFiniteLossError
    from bertforge.train.distributed import DistributedTimeout

    try:
        sets = {key.rpartition(".")[2]: value for key, value in parse_assignments(assignments).items()}
        overrides = {**given, **sets, **({"progress": False} if quiet else {})}
        result = pretrain(str(config) if config is not None else "tiny", data, out, resume=resume,
                          init_from=init_from, **overrides)
    except _recipe_errors() as exc:
        raise _fail(str(exc)) from exc
    except (NonFiniteLossError, DistributedTimeout) as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=1) from exc
    if result.final is not None:
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in result.train.metrics.items())
        typer.echo(f"step {result.train.step}: {metrics or 'no validation split'}")
        typer.echo(f"final model: {result.final}")


recipe_command(
    app, "pretrain", PretrainRecipe, _pretrain_body, skip=("source", "progress"),
    leading=[_required_path("data", "Shards made by `bertforge prepare`."),
             _required_path("out", "Run directory: checkpoints, metrics.jsonl, run_config.yaml, final/."),
             _flag("resume", "Continue from the newest checkpoint in --out."),
             pyinspect.Parameter("init_from", pyinspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
                 Path | None, typer.Option("--init-from", help="Start from this checkpoint directory's weights "
                                                               "(continued pre-training; same vocabulary as --data).")]),
             _flag("quiet", "No progress bar.")],
    doc="""Pre-train BERT (masked LM + NSP/SOP) on prepared shards; the final model goes to RUN/final.

    --config takes a recipe (YAML), a preset name (tiny, mini, small, medium, base, large), a config.json or
    a checkpoint directory; model settings go through --set (--set hidden_dropout_prob=0). Runs on one
    process as is, and on several under torchrun (DDP, or FSDP with --parallel fsdp; gloo on CPU, NCCL on
    GPU). Checkpoints are full, unsharded files either way, so a run resumes under the other mode or
    another number of processes.

    Example: `bertforge pretrain --config recipes/tiny-cpu.yaml --data data/gutenberg128 --out runs/tiny`
    """)


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
# fine-tuning and prediction
# ---------------------------------------------------------------------------------------------------

finetune_app = typer.Typer(
    help="Fine-tune a pre-trained checkpoint on a task (GLUE, CoNLL-2003 NER, SQuAD, SWAG, or your own files: classify) with the paper's "
    "recipe: AdamW, 10% warm-up then linear decay, batch 32, 3 epochs. Every setting is an option, a line of "
    "a --config recipe (recipes/finetune/) or a --set key=value. Writes OUT/seed-N/ (a Hugging Face model), "
    "OUT/results.json (mean / std / median across seeds) and OUT/run_config.yaml (the resolved recipe).",
    no_args_is_help=True,
)
app.add_typer(finetune_app, name="finetune")

_FT_OUT = pyinspect.Parameter(
    "out", pyinspect.Parameter.KEYWORD_ONLY,
    annotation=Annotated[Path, typer.Option("--out", help="Run directory: seed-N/ models, results.json and "
                                                          "run_config.yaml (the resolved recipe).")])

_FT_DOCS = {
    "glue": """Fine-tune on a GLUE task (sequence classification; STS-B regression) and score its dev set.

    Example: `bertforge finetune glue --task RTE --model models/minilm --data data/glue --out runs/rte --seeds 1,2,3`
    From a bundled recipe: `bertforge finetune glue --config recipes/finetune/mrpc.yaml --set lr=3e-5 --model models/minilm --data data/glue --out runs/mrpc`
    """,
    "ner": """Fine-tune token classification on CoNLL-2003 (IOB2 tags, first sub-token labelled) and report
    conlleval's entity-level F1 on the dev set. With --frozen, the paper's feature-based set-up instead.

    Example: `bertforge finetune ner --model models/minilm --data data/conll2003 --out runs/ner`
    Feature-based: `bertforge finetune ner --frozen --strategy sum_last_four --model models/minilm --data data/conll2003 --out runs/ner-frozen`
    """,
    "squad": """Fine-tune span QA on SQuAD v1.1 or v2.0 and report the official EM / F1 (v2.0: also the tuned
    no-answer threshold, saved with the model).

    Example: `bertforge finetune squad --model models/minilm --data data/squad/dev-v1.1.json --train-articles 38 --out runs/squad`
    """,
    "tag": """Fine-tune token tagging on your own files: CoNLL-style column files or .jsonl / .parquet rows of
    tokens and tags, any entity types, IOB1, IOB2 (BIO) or BIOES (detected). The model trains on IOB2;
    dev is scored with conlleval's entity F1 (per type too) and token accuracy.

    Example: `bertforge finetune tag --train train.jsonl --dev dev.jsonl --model models/minilm --out runs/tag`
    Integer tags: `bertforge finetune tag --train train.parquet --dev dev.parquet --tag-column ner_tags --tag-names O,B-PER,I-PER --model models/minilm --out runs/tag`
    """,
    "qa": """Fine-tune extractive QA on your own files: SQuAD-format .json (v1 or v2) or .jsonl / .parquet rows
    {id, question, context, answers: {text: [...], answer_start: [...]}} (empty lists: no answer). Reports
    SQuAD EM / F1; with unanswerable questions the no-answer threshold is tuned on dev and saved.

    Example: `bertforge finetune qa --train train.jsonl --dev dev.jsonl --model models/minilm --out runs/qa`
    """,
    "classify": """Fine-tune text classification on your own CSV / TSV / JSONL / Parquet files: single-label
    (string or integer labels), multi-label (a list, or --label-delimiter), regression (numbers), sentence
    pairs (--pair-column). Writes per-class scores, a confusion matrix and predictions with label names.

    Example: `bertforge finetune classify --model models/minilm --train reviews.csv --dev reviews-dev.csv --out runs/reviews`
    Pairs, multi-label: `bertforge finetune classify --model models/minilm --train train.jsonl --dev dev.jsonl --text-column question --pair-column answer --label-column tags --label-delimiter , --out runs/tags`
    """,
    "swag": """Fine-tune multiple choice on SWAG (four endings, softmax over their [CLS] scores); reports accuracy.

    Example: `bertforge finetune swag --model models/minilm --data data/swag --out runs/swag`
    """,
}


def _task_setting_parameters(family: str) -> list[pyinspect.Parameter]:
    """Options for a family's own task settings (SQuAD's --doc-stride, ...), as the task declares them."""
    from bertforge.tasks import FAMILIES

    def names(name: str, kind: type) -> str:
        flag = name.replace("_", "-")
        return f"--{flag}/--no-{flag}" if kind is bool else f"--{flag}"

    return [pyinspect.Parameter(name, pyinspect.Parameter.KEYWORD_ONLY, default=None,
                                annotation=Annotated[kind | None, typer.Option(
                                    names(name, kind), help=f"{text} [recipe: task_settings.{name}]",
                                    show_default=False)])
            for name, (kind, text) in FAMILIES[family].setting_options.items()]


_NER_FROZEN = [
    pyinspect.Parameter("frozen", pyinspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[
        bool, typer.Option("--frozen", help="Feature-based instead: freeze the encoder and train a two-layer "
                                            "BiLSTM tagger on its features.")]),
    pyinspect.Parameter("strategy", pyinspect.Parameter.KEYWORD_ONLY, default="concat_last_four", annotation=Annotated[
        str, typer.Option("--strategy", help="With --frozen: embeddings, last, second_to_last, sum_last_four, "
                                             "concat_last_four or sum_all.")]),
]


def finetune_recipe(family: str, config: Path | None, given: dict[str, Any], assignments: list[str],
                    task_options: dict[str, Any] | None = None) -> Any:
    """The recipe a `finetune FAMILY` command runs: defaults, then --config, then options, then --set."""
    from bertforge.recipe import override, parse_assignments, resolve

    base = FinetuneRecipe(family=family, task=family if family in ("swag", "tag", "qa") else None)
    recipe = resolve(FinetuneRecipe, config, given, base=base)
    if recipe.family != family:
        raise ValueError(f"{config}: the recipe is for `finetune {recipe.family}`, not `finetune {family}`")
    if task_options:
        recipe = override(recipe, {"task_settings": {**recipe.task_settings, **task_options}}, source="command line")
    values = parse_assignments(assignments)
    return override(recipe, values, source="--set") if values else recipe


def _finetune_command(family: str) -> None:
    from bertforge.tasks import FAMILIES

    task_params = _task_setting_parameters(family)
    task_names = [p.name for p in task_params]

    def body(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path,
             frozen: bool = False, strategy: str = "", **task_values: Any) -> None:
        from bertforge.finetune import run_finetune

        task_options = {k: v for k, v in task_values.items() if k in task_names and v is not None}
        try:
            recipe = finetune_recipe(family, config, given, assignments, task_options)
            if frozen:
                return _frozen_ner(recipe, out, strategy)
            results = run_finetune(recipe, out)
        except _recipe_errors() as exc:
            raise _fail(str(exc)) from exc
        from bertforge.tasks.base import task_title

        typer.echo(f"{task_title(results['family'], results['task'])}: {len(results['seeds'])} seed(s), "
                   f"{results['train_examples']} training examples, {results['wall_s']:.0f} s")
        for name, row in results["summary"].items():
            typer.echo(f"  {name:>24}: mean {row['mean']:.4f}  std {row['std']:.4f}  median {row['median']:.4f}")
        for split, summary in results.get("test_summary", {}).items():
            for name, row in summary.items():
                typer.echo(f"  {split + ' ' + name:>24}: mean {row['mean']:.4f}  std {row['std']:.4f}")
        typer.echo(f"wrote {out / 'results.json'}, {out / 'run_config.yaml'}")

    leading = [_FT_OUT, *task_params, *(_NER_FROZEN if family == "ner" else [])]

    own_files = not FAMILIES[family].reads_data_dir  # classify, tag, qa: --train/--dev/--test, no --data
    skip = ("family", "task_settings", *(("task",) if family in ("swag", "tag", "qa") else ()),
            *(("data",) if own_files else ()))
    recipe_command(finetune_app, family, FinetuneRecipe, body, doc=_FT_DOCS[family], leading=leading,
                   skip=skip)


def _frozen_ner(recipe: Any, out: Path, strategy: str) -> None:
    """`finetune ner --frozen`: the feature-based tagger on the recipe's model, data and first seed."""
    from bertforge.features import STRATEGIES
    from bertforge.ablation import FrozenNerConfig, ablate

    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if recipe.model is None or recipe.data is None:
        raise ValueError("--frozen needs --model and --data")
    (row,) = ablate(Path(recipe.model), Path(recipe.data), out, strategies=(strategy,),
                    train_sentences=recipe.train.max_train_examples, config=FrozenNerConfig(seed=recipe.seeds[0]))
    typer.echo(f"{strategy}: hidden states {row['layers']} ({row['combine']}) -> dev F1 {100 * row['dev_f1']:.2f}")


for _family in ("glue", "ner", "squad", "swag", "classify", "tag", "qa"):
    _finetune_command(_family)


@app.command("predict")
def predict_command(
    model: Annotated[Path, typer.Option("--model", help="A fine-tuned model (a seed-N directory) or any "
                                                        "BERT checkpoint.")],
    family: Annotated[str | None, typer.Argument(
        help="With --data: the task family (glue, ner, squad, swag, tag or qa). Not used with --input.")] = None,
    input_file: Annotated[Path | None, typer.Option(
        "--input", help="Your file to predict: .csv, .tsv, .jsonl (also .gz, .bz2, .xz, .zst), .parquet, "
                        "or anything else as one text per line.")] = None,
    data: Annotated[Path | None, typer.Option(
        "--data", help="The task's data directory (or SQuAD file; for tag and qa the file to predict): writes "
                       "the task's prediction files (leaderboard formats).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", help="With --input: the predictions file (.jsonl, .csv or .tsv); with --data: the "
                      "directory for the leaderboard files.")] = None,
    task: Annotated[str | None, typer.Option(
        "--task", help="With --input: the pipeline task (text-classification, token-classification, "
                       "question-answering, fill-mask, embeddings; default: the model's). With --data: the "
                       "benchmark task (default: the one in the model's task.json).")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="Column holding the text.")] = "text",
    pair_column: Annotated[str | None, typer.Option(
        "--pair-column", help="Column holding the second sentence of a pair (classification).")] = None,
    question_column: Annotated[str, typer.Option("--question-column", help="QA: column of the questions.")]
    = "question",
    context_column: Annotated[str, typer.Option("--context-column", help="QA: column of the passages.")]
    = "context",
    keep_columns: Annotated[list[str] | None, typer.Option(
        "--keep-columns", help="Input columns copied into each output row (comma-separated; repeat).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Rows per forward pass.")] = 64,
    max_length: Annotated[int | None, typer.Option(
        "--max-length", help="Pieces per input (default: the length the model was fine-tuned with).")] = None,
    chunk_rows: Annotated[int, typer.Option(
        "--chunk-rows", help="Rows read, predicted and written at a time (memory is bounded by it).")] = 4096,
    pooling: Annotated[str, typer.Option("--pooling", help="Embeddings: mean, cls or pooler.")] = "mean",
    normalize: Annotated[bool, typer.Option("--normalize", help="Embeddings: scale to unit length.")] = False,
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
    device: Annotated[str | None, typer.Option("--device", help="torch device (default: cpu).")] = None,
    precision: Annotated[str, typer.Option(
        "--precision", help="fp32, bf16, int8, or auto (bf16 where the CPU has native bf16 instructions).")]
    = "fp32",
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")] = True,
    split: Annotated[list[str] | None, typer.Option(
        "--split", help="With --data: split(s) to predict; default the test split(s) (MNLI: test_matched, "
                        "test_mismatched and ax).")] = None,
) -> None:
    """Predict with a model: your own file with `--input` (any fine-tuned model, streamed in chunks, rows in
    input order), or a task's prediction files with `FAMILY --data`: GLUE leaderboard .tsv files, SQuAD
    predictions.json (+ null_odds.json for v2.0), CoNLL lines, SWAG csv; for tag, predictions-test.jsonl
    (tokens, tags in the training files' scheme, scores), for qa the SQuAD files.

    Examples: `bertforge predict --model runs/reviews/seed-1 --input new.csv --out preds.jsonl`;
    `bertforge predict glue --model runs/sst2/seed-1 --data data/glue --out submission/`
    """
    if (input_file is None) == (data is None):
        raise _fail("give --input FILE (your data) or FAMILY --data DIR (a benchmark's leaderboard files)")
    if out is None:
        raise _fail("--out is required")
    if input_file is not None:
        if family is not None:
            raise _fail(f"FAMILY ({family}) goes with --data; with --input the task comes from the model "
                        "(or --task)")
        keep = [name.strip() for item in keep_columns or [] for name in item.split(",") if name.strip()]
        _predict_file(model, input_file, out, task=task, text_column=text_column, pair_column=pair_column,
                      question_column=question_column, context_column=context_column, keep_columns=keep,
                      batch_size=batch_size, max_length=max_length, chunk_rows=chunk_rows, device=device,
                      precision=precision, progress=progress, pooling=pooling, normalize=normalize, top_k=top_k,
                      all_scores=all_scores, long_text=long_text, window_stride=window_stride)
        return
    if family is None:
        raise _fail("--data needs the task family first: bertforge predict glue|ner|squad|swag|tag|qa --data ...")
    _predict_leaderboard(family, model, data, out, task=task, split=split, batch_size=batch_size,  # type: ignore[arg-type]
                         precision=precision)


def _predict_file(model: Path, input_file: Path, out: Path, *, task: str | None, batch_size: int,
                  max_length: int | None, device: str | None, precision: str, pooling: str, normalize: bool,
                  top_k: int, all_scores: bool = False, long_text: str = "truncate",
                  window_stride: int | None = None, **file_options: Any) -> None:
    from bertforge.checkpoint import CheckpointError
    from bertforge.pipeline import pipeline, predict_file
    from bertforge.tasks.base import DataFormatError

    try:
        pipe = pipeline(model, task, batch_size=batch_size, max_length=max_length, device=device,
                        precision=precision, pooling=pooling, normalize=normalize, top_k=top_k,
                        all_scores=all_scores, long_text=long_text, window_stride=window_stride)
        done = predict_file(pipe, input_file, out, **file_options)
    except (CheckpointError, DataFormatError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{pipe.task} ({pipe.precision}): {done['rows']} rows -> {out} "
               f"({done['rows_per_second']:.1f} rows/s)")
    if done["windowed"]:
        typer.echo(f"{done['windowed']} rows were longer than {pipe.max_length} pieces and were read in "
                   f"windows (stride {pipe.window_stride})")
    if done["truncated"]:
        hint = " (--long-text windows reads them whole)" if pipe.task == "text-classification" else ""
        typer.secho(f"warning: {done['truncated']} rows were longer than {pipe.max_length} pieces and were "
                    f"truncated{hint}", fg="yellow", err=True)


def _predict_leaderboard(family: str, model: Path, data: Path, out: Path, *, task: str | None,
                         split: list[str] | None, batch_size: int, precision: str = "fp32") -> None:
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
        done = predict(family, task, model, data, out, splits=split or None, batch_size=batch_size,
                       precision=precision)
    except (CheckpointError, DataFormatError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    for name, result in done.items():
        scores = "  ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items())
        typer.echo(f"{name}: {result['examples']} examples at {result['precision']} -> {', '.join(result['files'])}"
                   + (f"  ({scores})" if scores else ""))


# ---------------------------------------------------------------------------------------------------
# feature-based BERT and attention analysis
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
    from bertforge.fileio import NotUtf8Error, decode_utf8

    try:
        lines = decode_utf8(path.read_bytes(), path).splitlines()
    except OSError as exc:
        raise _fail(f"{path}: {exc.strerror or exc}") from exc
    except NotUtf8Error as exc:
        raise _fail(str(exc)) from None
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
    precision: Annotated[str, typer.Option(help=PRECISION_HELP)] = "fp32",
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
            dtype="float16" if fp16 else "float32", device=device, precision=precision)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        raise _fail(str(exc)) from exc
    inputs = _text_lines(input_file, pairs)
    try:
        with tqdm(total=len(inputs), unit="line", disable=quiet) as bar:
            summary = write_features(extractor, inputs, out, progress=bar)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"{extractor.selection.describe()} at {extractor.precision}; {summary['inputs']} lines -> {out} "
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
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    try:
        encoder = load_for_job(model, "embeddings")
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
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    if not input_file.is_file():
        raise _fail(f"--input {input_file}: no such file")
    texts = [t for t in _text_lines(input_file, pairs) if (t if isinstance(t, str) else t[0]).strip()]
    texts = texts[:max_texts] if max_texts else texts
    if not texts:
        raise _fail(f"{input_file}: no text")
    try:
        encoder = load_for_job(model, "embeddings")
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
    from bertforge.ablation import FrozenNerConfig, ablate

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
