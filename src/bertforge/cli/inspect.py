"""Looking at models and runs: a checkpoint's config and load report, a run's curves, attention maps and
per-head statistics, the feature-based NER ablation, and the official SQuAD scores of a predictions file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bertforge.cli.common import MODEL_NAME_HELP, RevisionOption, fail, hub_model, text_lines


def inspect_command(
    model_dir: Annotated[Path, typer.Argument(help="A Hugging Face-format BERT directory." + MODEL_NAME_HELP)],
    revision: RevisionOption = None,
) -> None:
    """Load a checkpoint and print its config, parameter count and key report.

    Example: `bertforge inspect runs/tiny/final`
    """
    model_dir = hub_model(model_dir, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    from bertforge.checkpoint import CheckpointError
    from bertforge.model import load_any

    try:
        model, report = load_any(model_dir)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    config = model.config
    n_params = sum(p.numel() for p in model.parameters())
    typer.echo(f"{type(model).__name__}  L={config.num_hidden_layers} H={config.hidden_size} "
               f"A={config.num_attention_heads} I={config.intermediate_size} vocab={config.vocab_size}")
    typer.echo(f"parameters: {n_params:,}")
    typer.echo(report.summary())


def plot_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holds metrics.jsonl).")],
    out: Annotated[Path | None, typer.Option(help="PNG to write (default RUN_DIR/curves.png).")] = None,
) -> None:
    """Draw a run's loss and accuracy curves (training and validation) to a PNG.

    Example: `bertforge plot runs/tiny` (writes runs/tiny/curves.png)
    """
    from bertforge.plot import plot_run

    if not (run_dir / "metrics.jsonl").is_file():
        raise fail(f"{run_dir}: no metrics.jsonl (is it a run directory of `bertforge pretrain`?)")
    try:
        path = plot_run(run_dir, out)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"wrote {path}")


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
    from bertforge.tasks.base import DataFormatError
    from bertforge.tasks.metrics import squad_evaluate
    from bertforge.tasks.squad import load_squad_json

    def load_object(path: Path) -> dict:
        try:
            value = json.loads(path.read_text(encoding="utf-8-sig"))
        except OSError as exc:
            raise fail(f"{path}: {exc.strerror or exc}") from exc
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise fail(f"{path}: not valid JSON ({exc})") from exc
        if not isinstance(value, dict):
            raise fail(f"{path}: expected a JSON object mapping question ids to values")
        return value

    try:
        dataset = load_squad_json(data)
    except OSError as exc:
        raise fail(f"{data}: {exc.strerror or exc}") from exc
    except DataFormatError as exc:
        raise fail(str(exc)) from exc
    try:
        result = squad_evaluate(dataset, load_object(predictions),
                                load_object(na_probs) if na_probs is not None else None, na_prob_thresh)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    text = json.dumps(result, indent=2)
    typer.echo(text)
    if out is not None:
        write_text_atomic(out, text + "\n")


def attention_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory." + MODEL_NAME_HELP)],
    text: Annotated[str, typer.Option("--text", help="The text to look at.")],
    png: Annotated[Path, typer.Option("--png", help="The PNG to write.")],
    pair: Annotated[str | None, typer.Option(help="Optional second segment.")] = None,
    layer: Annotated[int | None, typer.Option(help="Layer, from 1 (default: every layer).")] = None,
    head: Annotated[int | None, typer.Option(help="Head, from 1 (default: every head).")] = None,
    max_length: Annotated[int, typer.Option(help="Pieces kept, specials included.")] = 64,
    revision: RevisionOption = None,
) -> None:
    """Heat map of attention: one head (--layer and --head), one layer's heads, or the layers x heads grid.

    Example: `bertforge attention --model models/minilm --text "The cat sat on the mat." --layer 2 --head 9 --png att.png`
    """
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    from bertforge.analysis import attention_maps, plot_attention
    from bertforge.checkpoint import CheckpointError
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    try:
        encoder = load_for_job(model, "embeddings")
        tokens, maps = attention_maps(encoder, BertTokenizer.from_pretrained(model), text, pair, max_length=max_length)
        path = plot_attention(tokens, maps, png, layer=layer, head=head)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"{len(tokens)} tokens, {maps.shape[0]} layers x {maps.shape[1]} heads -> {path}")


def attention_stats_command(
    model: Annotated[Path, typer.Option("--model", help="A Hugging Face-format BERT directory." + MODEL_NAME_HELP)],
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
    revision: RevisionOption = None,
) -> None:
    """Per head, over a corpus: average attention to [CLS], [SEP], punctuation, the next and previous
    token, and attention entropy (Clark et al. 2019), as a table and a layers x heads PNG grid.

    Example: `bertforge attention-stats --model models/minilm --input sentences.txt --png stats.png --table stats.md`
    """
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    import json

    from tqdm.auto import tqdm

    from bertforge.analysis import STATS, attention_stats, plot_head_stats
    from bertforge.checkpoint import CheckpointError
    from bertforge.fileio import write_text_atomic
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    if not input_file.is_file():
        raise fail(f"--input {input_file}: no such file")
    texts = [t for t in text_lines(input_file, pairs) if (t if isinstance(t, str) else t[0]).strip()]
    texts = texts[:max_texts] if max_texts else texts
    if not texts:
        raise fail(f"{input_file}: no text")
    try:
        encoder = load_for_job(model, "embeddings")
        tokenizer = BertTokenizer.from_pretrained(model)
        with tqdm(total=len(texts), unit="text", disable=quiet) as bar:
            stats = attention_stats(encoder, tokenizer, texts, batch_size=batch_size, max_length=max_length,
                                    progress=bar)
    except (CheckpointError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
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
    threads: Annotated[int | None, typer.Option(help="torch CPU threads (default: a fair share of the cores other "
                                                     "jobs leave idle).")] = None,
    name: Annotated[str | None, typer.Option(help="The model's name in the table and chart (default: the "
                                                  "folder's name).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bars.")] = False,
    revision: RevisionOption = None,
) -> None:
    """The paper's feature-based NER ablation: cache every layer of a frozen encoder once, train a
    two-layer BiLSTM tagger per layer strategy, score CoNLL-2003 dev entity F1 (conlleval), write a
    markdown table beside the paper's BERT-base numbers and a bar chart.

    Example: `bertforge ablate-features --model models/minilm --data data/conll2003 --out runs/ablation --train-sentences 4000`
    """
    model = hub_model(model, revision)  # a Hub name (org/name[@revision]): its cached snapshot
    import torch

    from bertforge.ablation import FrozenNerConfig, ablate
    from bertforge.checkpoint import CheckpointError
    from bertforge.features import STRATEGIES
    from bertforge.tasks.base import DataFormatError

    if threads is not None:
        if threads < 1:
            raise fail(f"--threads must be at least 1, got {threads}")
        from bertforge import threads as thread_policy

        thread_policy.install(threads)
        torch.set_num_threads(threads)
    if epochs < 1 or batch_size < 1 or lstm_size < 1 or lr <= 0:
        raise fail("--epochs, --batch-size and --lstm-size must be at least 1 and --lr positive")
    config = FrozenNerConfig(epochs=epochs, batch_size=batch_size, lr=lr, lstm_size=lstm_size, seed=seed,
                             progress=not quiet)
    try:
        results = ablate(model, data, out, strategies=tuple(strategy) if strategy else STRATEGIES,
                         train_sentences=train_sentences, config=config, finetune_f1=finetune_f1, model_name=name)
    except (CheckpointError, DataFormatError, OSError, ValueError) as exc:
        raise fail(str(exc)) from exc
    for row in results:
        typer.echo(f"{row['strategy']:>17}: hidden states {row['layers']} ({row['combine']}) -> dev F1 "
                   f"{100 * row['dev_f1']:.2f}  ({row['seconds']:.0f} s)")
    typer.echo(f"wrote {out / 'ablation.md'}, {out / 'ablation.png'}")

