"""The `bertforge` command line: a thin typer shell over importable library functions.

Each command parses its arguments, calls library functions and prints the result; the commands live by
workflow in `train` (tokenizer, prepare, pretrain, quickstart), `finetune` (one subcommand per task
family), `predict` (predict, serve, quantize, export-onnx, extract) and `inspect` (inspect, plot,
attention, ablation, evaluate). `options` generates the options of `prepare`, `pretrain` and
`finetune` from their recipes' fields. `commands` makes the app and registers the commands, in the
order `bertforge --help` lists them; this package exports the app. Heavy modules (torch, tokenizers)
are imported inside the commands, so that `bertforge --help` stays instant.
"""

from bertforge.cli.commands import app

__all__ = ["app"]
