"""The training path as commands: WordPiece vocabularies, shards, pre-training, and the quickstart that
runs the whole path. (`finetune` has its own module.)

`prepare` and `pretrain` take one option per setting of their recipe (`PrepareOptions`, the
pre-training `Recipe`), with --config and --set, resolved by `bertforge.recipe.resolve`.
"""

from __future__ import annotations

import inspect as pyinspect
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.adapt import AdaptRecipe
from bertforge.cli.common import fail, flag, library_errors, required_path
from bertforge.cli.options import recipe_command
from bertforge.data.prepare import PrepareOptions
from bertforge.pretrain import Recipe as PretrainRecipe


def quickstart(
    out: Annotated[Path, typer.Option(help="Run directory (stages, models, report.md).")] = Path("runs/quickstart"),
    budget: Annotated[str, typer.Option(help="full: the real thing (<= 15 min on 2 CPU cores); smoke: ~1 min.")] = "full",
    stage: Annotated[list[str] | None, typer.Option(help="Run only this stage (repeat); see the list above.")] = None,
    force: Annotated[bool, typer.Option(help="Rerun the chosen stages even if they completed.")] = False,
) -> None:
    """Raw text to scores on bundled data: WordPiece -> shards -> pre-train a tiny BERT -> held-out MLM/SOP, a
    word-order probe and fill-mask -> teach it all-MiniLM-L6's sentence vectors of bundled in-domain text ->
    SST-2 learning curves (100 to 4,000 labelled sentences, 3 seeds) from it, from it after masked LM alone,
    from its random twin and from the real all-MiniLM-L6, as released and adapted to the sample's own
    text -> report.md with the curve.

    Stages: tokenizer, data, pretrain, pretrain_eval, teach, subsamples, curve_taught, curve_pretrained,
    curve_random, curve_minilm, adapt_minilm, curve_minilm_adapted, report. A second run reuses completed
    stages.

    Example: `bertforge quickstart --out runs/quickstart` (then read runs/quickstart/report.md)
    """
    from bertforge.quickstart import quickstart as run_quickstart

    try:
        run_quickstart(out, budget=budget, stages=stage, force=force, echo=typer.echo)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    report = out / "report.md"
    if report.is_file():  # a run of chosen stages before the first report has none yet
        typer.echo(f"\nreport: {report}")
        typer.echo(report.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------------
# WordPiece
# ---------------------------------------------------------------------------------------------------
def tokenizer_train(
    inputs: Annotated[list[Path], typer.Option("--input", "-i", help="Text to learn from (repeat): .txt, or the "
                                                                     "--text-column of .jsonl, .csv, .tsv, .parquet "
                                                                     "(compressed too); files, directories, patterns.")],
    out: Annotated[Path, typer.Option(help="Directory for vocab.txt, tokenizer_config.json, tokenizer.json.")],
    vocab_size: Annotated[int, typer.Option(help="Vocabulary size, special tokens included.")] = 30522,
    min_frequency: Annotated[int, typer.Option(help="Ignore pairs seen fewer times than this.")] = 2,
    cased: Annotated[bool, typer.Option("--cased", help="Keep case (and accents) instead of lower-casing.")] = False,
    text_column: Annotated[str, typer.Option(help="The column (CSV, TSV, Parquet) or field (JSON lines) holding "
                                                  "the text.")] = "text",
) -> None:
    """Train a WordPiece vocabulary ([PAD] [UNK] [CLS] [SEP] [MASK] reserved, "##" continuations).

    Example: `bertforge tokenizer train --input book1.txt --input book2.txt --out runs/vocab --vocab-size 8000`
    """
    from bertforge.data.sources import input_kind, iter_texts
    from bertforge.tokenizer import BertTokenizer

    options = {"vocab_size": vocab_size, "min_frequency": min_frequency, "lowercase": not cased}
    try:
        if all(path.is_file() and input_kind(path) == "text" and path.suffix not in (".gz", ".bz2", ".xz", ".zst")
               for path in inputs):
            tokenizer = BertTokenizer.train(inputs, **options)  # plain text files: read by the library itself
        else:
            tokenizer = BertTokenizer.train_from_texts(iter_texts(inputs, text_column=text_column), **options)
    except library_errors() as exc:
        raise fail(str(exc)) from exc
    tokenizer.save_pretrained(out)
    typer.echo(f"{tokenizer.vocab_size} pieces -> {out / 'vocab.txt'}")


def tokenizer_encode(
    directory: Annotated[Path, typer.Argument(help="A tokenizer or checkpoint folder (vocab.txt, tokenizer.json, "
                                                    "vocab.json + merges.txt or a SentencePiece model).")],
    text: Annotated[str, typer.Argument(help="The text (segment A).")],
    pair: Annotated[str | None, typer.Option(help="Optional segment B.")] = None,
) -> None:
    """Show the WordPiece tokens, ids, segment ids and character offsets of a text.

    Example: `bertforge tokenizer encode runs/vocab "Unaffable, naïve café!"`
    """
    from bertforge.tokenizer import BertTokenizer

    try:
        encoding = BertTokenizer.from_pretrained(directory).encode(text, pair, truncation=True)
    except (OSError, ValueError) as exc:  # no tokenizer files, or files that are not one (named)
        raise fail(str(exc)) from exc
    for token, token_id, segment, (start, end) in zip(
        encoding.tokens, encoding.input_ids, encoding.token_type_ids, encoding.offsets, strict=True
    ):
        typer.echo(f"{token_id:>7}  {segment}  {start:>4}:{end:<4} {token}")


# ---------------------------------------------------------------------------------------------------
# pre-training data
# ---------------------------------------------------------------------------------------------------
def _prepare(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path,
             overwrite: bool, quiet: bool) -> None:
    import warnings

    from bertforge.data.prepare import DataWarning, prepare
    from bertforge.recipe import resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataWarning)
        try:
            options = resolve(PrepareOptions, config, given, assignments)
            stats = prepare(options, out_dir=out, overwrite=overwrite, progress=not quiet)
        except library_errors() as exc:
            raise fail(str(exc)) from exc
    for warning in caught:
        typer.secho(f"warning: {warning.message}", err=True, fg=typer.colors.YELLOW)
    run = stats["run"]
    nsp = f", IsNext {stats['is_next_fraction']:.1%}" if stats["is_next_fraction"] is not None else ""
    masked = f", masked {stats['masked_fraction']:.1%}" if stats["masked_fraction"] is not None else ""
    typer.echo(f"{stats['documents']:,} documents, {stats['sentences']:,} sentences, {stats['tokens']:,} tokens -> "
               f"{stats['instances']:,} instances (+{stats['validation_instances']:,} validation){masked}{nsp}")
    typer.echo(f"{run['wall_s']:.1f} s, {run['mb_per_s']:.2f} MB/s, {run['docs_per_s']:.1f} docs/s -> {out}")


prepare = recipe_command(
    "prepare", PrepareOptions, _prepare,
    leading=[required_path("out", "Output directory for the shards, stats.json and run_config.yaml."),
             flag("overwrite", "Clear --out and start again (default: resume an interrupted run)."),
             flag("quiet", "No progress bar.")],
    doc="""Turn text into shards of masked-LM + next-sentence instances, in parallel and resumably.

    Inputs: .txt, .jsonl (--text-field) and .parquet (--text-column) files, directories and glob
    patterns; text and JSON lines may be compressed (.gz, .bz2, .xz, .zst).

    Example: `bertforge prepare --input corpus/ --tokenizer runs/vocab --out data/bert128 --workers 4`
    """)


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
    except library_errors() as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"{stats['parts']} parts: {stats['documents']:,} documents, {stats['tokens']:,} tokens -> "
               f"{stats['instances']:,} instances (+{stats['validation_instances']:,} validation) -> {data}")


# ---------------------------------------------------------------------------------------------------
# pre-training
# ---------------------------------------------------------------------------------------------------
def _pretrain(*, given: dict[str, Any], config: Path | None, assignments: list[str], data: Path, out: Path,
              resume: bool, overwrite: bool, init_from: Path | None, quiet: bool) -> None:
    from bertforge.pretrain import pretrain
    from bertforge.recipe import resolve
    from bertforge.train import NonFiniteLossError
    from bertforge.train.distributed import DistributedTimeout

    try:
        recipe = resolve(PretrainRecipe, config, {**given, **({"progress": False} if quiet else {})}, assignments)
        result = pretrain(recipe, data, out, resume=resume, init_from=init_from, overwrite=overwrite)
    except library_errors() as exc:
        raise fail(str(exc)) from exc
    except (NonFiniteLossError, DistributedTimeout) as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=1) from exc
    if result.final is not None:
        metrics = "  ".join(f"{k} {v:.4f}" for k, v in result.train.metrics.items())
        typer.echo(f"step {result.train.step}: {metrics or 'no validation split'}")
        typer.echo(f"final model: {result.final}")


pretrain = recipe_command(
    "pretrain", PretrainRecipe, _pretrain, skip=("source", "progress"),
    leading=[required_path("data", "Shards made by `bertforge prepare`."),
             required_path("out", "Run directory: checkpoints, metrics.jsonl, run_config.yaml, final/."),
             flag("resume", "Continue from the newest checkpoint in --out that loads (same settings and data "
                            "only: a difference is refused, naming it)."),
             flag("overwrite", "Clear --out's checkpoints, metrics and records and start again."),
             pyinspect.Parameter("init_from", pyinspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
                 Path | None, typer.Option("--init-from", help="Start from this checkpoint directory's weights "
                                                               "(continued pre-training; same vocabulary as --data).")]),
             flag("quiet", "No progress bar.")],
    doc="""Pre-train BERT (masked LM + NSP/SOP) on prepared shards; the final model goes to RUN/final.

    --config takes a recipe (YAML), a preset name (tiny, mini, small, medium, base, large), a config.json or
    a checkpoint directory; model settings go through --set (--set hidden_dropout_prob=0). Runs on one
    process as is, and on several under torchrun (DDP, or FSDP with --parallel fsdp; gloo on CPU, NCCL on
    GPU). Checkpoints are full, unsharded files either way, so a run resumes under the other mode or
    another number of processes.

    Example: `bertforge pretrain --config recipes/tiny-cpu.yaml --data data/gutenberg128 --out runs/tiny`
    """)


# ---------------------------------------------------------------------------------------------------
# continued pre-training on your own text
# ---------------------------------------------------------------------------------------------------
def _adapt(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path, resume: bool,
           overwrite: bool, quiet: bool) -> None:
    import warnings

    from bertforge.adapt import adapt
    from bertforge.data.prepare import DataWarning
    from bertforge.recipe import resolve
    from bertforge.train import NonFiniteLossError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataWarning)
        try:
            recipe = resolve(AdaptRecipe, config, {**given, **({"progress": False} if quiet else {})}, assignments)
            result = adapt(recipe, out_dir=out, resume=resume, overwrite=overwrite, echo=typer.echo)
        except library_errors() as exc:
            raise fail(str(exc)) from exc
        except NonFiniteLossError as exc:
            typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
            raise typer.Exit(code=1) from exc
    for warning in caught:
        typer.secho(f"warning: {warning.message}", err=True, fg=typer.colors.YELLOW)
    typer.echo(f"{result.steps} steps; adapted model: {result.final} (scores in {out / 'results.json'})")


adapt = recipe_command(
    "adapt", AdaptRecipe, _adapt, skip=("source", "progress"),
    leading=[required_path("out", "Run directory: data/, checkpoints, metrics.jsonl, results.json, final/."),
             flag("resume", "Continue from the newest checkpoint in --out (same text and settings only: a "
                            "difference is refused, naming it)."),
             flag("overwrite", "Clear --out's shards, checkpoints, metrics and records and start again."),
             flag("quiet", "No progress bar.")],
    doc="""Continue pre-training a checkpoint on your own unlabelled text (task- or domain-adaptive
    pre-training): the family's masked LM with its own tokenizer and mask token (an ELECTRA
    discriminator: replaced-token detection), scored on held-out text before and after.

    Text: .txt (a line each; blank lines between documents), .jsonl, .csv, .tsv or .parquet with
    --text-column (the files `finetune` reads; labels ignored), compressed too. Length: --max-steps,
    --epochs, or --budget-minutes (warm-up and decay fitted to the time). The model goes to OUT/final.

    Example: `bertforge adapt --model path/to/checkpoint --input train.csv --text-column sentence
    --budget-minutes 10 --out runs/adapted`
    """)
