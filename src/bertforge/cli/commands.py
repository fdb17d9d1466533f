"""The `bertforge` app: made here, with every command registered in the order `bertforge --help` lists
them, the subcommand groups (tokenizer, evaluate, finetune, distill, search, cache) added, and the
callback that sets the thread settings before torch loads.
"""

from __future__ import annotations

from bertforge.cli import cache, distill, finetune, hub, inspect, predict, search, train, vectorindex
from bertforge.cli.common import App

app = App(
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
    from bertforge import threads

    # Before torch loads: OpenMP threads that spin only briefly at barriers, and torch's thread count
    # kept at a fair share of the cores other jobs leave (BERTFORGE_THREADS=N fixes it).
    threads.short_spin_wait()
    threads.install()


for _name, _command in [
    ("inspect", inspect.inspect_command),
    ("quickstart", train.quickstart),
    ("serve", predict.serve_command),
    ("quantize", predict.quantize_command),
    ("export-onnx", predict.export_onnx_command),
    ("prepare", train.prepare),
    ("prepare-merge", train.prepare_merge),
    ("pretrain", train.pretrain),
    ("adapt", train.adapt),
    ("plot", inspect.plot_command),
    ("predict", predict.predict_command),
    ("extract", predict.extract_command),
    ("index", vectorindex.index_command),
    ("query", vectorindex.query_command),
    ("attention", inspect.attention_command),
    ("attention-stats", inspect.attention_stats_command),
    ("ablate-features", inspect.ablate_features_command),
    ("push", hub.push_command),
]:
    app.command(_name)(_command)

tokenizer_app = App(help="WordPiece vocabularies: train one from text, try one on a sentence.",
                            no_args_is_help=True)
tokenizer_app.command("train")(train.tokenizer_train)
tokenizer_app.command("encode")(train.tokenizer_encode)
app.add_typer(tokenizer_app, name="tokenizer")

evaluate_app = App(help="Score predictions with the official metrics.", no_args_is_help=True)
evaluate_app.command("squad")(inspect.evaluate_squad)
app.add_typer(evaluate_app, name="evaluate")

# one subcommand per family registered in bertforge.tasks.FAMILIES, made when asked for
finetune_app = App(cls=finetune.FamilyGroup, help=finetune.HELP, no_args_is_help=True)
app.add_typer(finetune_app, name="finetune")
app.add_typer(distill.app, name="distill")
app.add_typer(App(cls=search.SearchGroup, help=search.HELP, no_args_is_help=True), name="search")
app.add_typer(cache.app, name="cache")
