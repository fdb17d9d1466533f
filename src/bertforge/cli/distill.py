"""`bertforge distill task`, `general` and `sentences`: knowledge distillation, thin over
`bertforge.distill` (every setting of `DistillRecipe` is an option, a line of a --config recipe or a
--set key=value)."""

from __future__ import annotations

import inspect as pyinspect
from pathlib import Path
from typing import Annotated, Any

import typer

from bertforge.cli.common import App, fail, flag, library_errors
from bertforge.cli.options import QUOTING_PARAMETER, reading_tables, recipe_command
from bertforge.distill.recipe import DistillRecipe

_OUT = pyinspect.Parameter(
    "out", pyinspect.Parameter.KEYWORD_ONLY,
    annotation=Annotated[Path, typer.Option("--out", help="Run directory: the student, results.json, run_config.yaml "
                                                          "and the loop's checkpoints (run/).")])
_OVERWRITE = flag("overwrite", "Clear what an earlier run left in --out and start again. Without it, a rerun "
                               "continues --out from its newest checkpoint, if the settings and inputs are the same "
                               "(else it is refused, naming what differs).")
_QUIET = flag("quiet", "No progress bar and no progress lines.")

# settings a mode does not read, left off its command (a recipe file may still hold them)
_TASK_ONLY = ("family", "task", "unlabelled", "alpha", "epochs", "max_length", "max_train_examples",
              "max_unlabelled", "max_eval_examples")
_GENERAL_ONLY = ("mlm_weight", "eval_max_batches")
_SENTENCES_ONLY = ("text_column", "tokenizer", "teacher_precision", "budget_minutes", "max_texts", "heldout_texts")
# what sentence distillation does not read: the logit, layer and masked-LM losses, task data, augmentation
_NOT_SENTENCES = ("family", "task", "unlabelled", "student_layers_from_teacher", "temperature", "alpha",
                  "hidden_weight", "attention_weight", "relation_weight", "mlm_weight", "max_train_examples",
                  "max_unlabelled", "max_eval_examples", "eval_max_batches", "augment", "augment_mask_prob",
                  "augment_ngram_prob")


def _body(mode: str) -> Any:
    def body(*, given: dict[str, Any], config: Path | None, assignments: list[str], out: Path,
             overwrite: bool = False, quiet: bool = False, quoting: bool = False) -> None:
        from bertforge.distill import build_recipe, distill
        from bertforge.train import NonFiniteLossError

        try:
            recipe = build_recipe(mode, config, {**given, **({"progress": False} if quiet else {})}, assignments)
            with reading_tables(quoting):  # sentences: each own file read is reported, rows in
                results = distill(recipe, out, verbose=not quiet, overwrite=overwrite)
        except library_errors() as exc:
            raise fail(" ".join(str(exc).split())) from exc
        except NonFiniteLossError as exc:
            typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
            raise typer.Exit(code=1) from exc
        _report(results, out)

    return body


def _report(results: dict[str, Any], out: Path) -> None:
    sizes = results["parameters"]
    typer.echo(f"student {sizes['student']:,} parameters ({sizes['teacher'] / max(sizes['student'], 1):.1f}x fewer "
               f"than the teacher's {sizes['teacher']:,}), {results['steps']} steps, {results['wall_s']:.0f} s")
    rows = [("teacher", results.get("teacher_metrics")), ("student at start", results.get("start_metrics")),
            ("student at end", results.get("final_metrics"))]
    for name, metrics in rows:
        if metrics:
            typer.echo(f"  {name:>16}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    if results["mode"] == "sentences":
        texts = results["texts"]
        typer.echo(f"  {texts['train']:,} texts trained on, {texts['heldout']:,} held out; the teacher encoded them in "
                   f"{results['teacher_seconds']:.0f} s at {results['teacher_precision']} (cosine: the student's "
                   "agreement with it on the held-out texts)")
    where = out / ("student" if results["mode"] == "task" else "final")
    typer.echo(f"wrote {where}, {out / 'results.json'}, {out / 'run_config.yaml'}")


task_command = recipe_command(
    "distill-task", DistillRecipe, _body("task"),
    skip=("mode", "task_settings", "progress", *_GENERAL_ONLY, *_SENTENCES_ONLY), leading=[_OUT, _OVERWRITE, _QUIET],
    doc="""Distil a fine-tuned teacher's task into a smaller, faster student.

    The teacher is a directory written by `bertforge finetune` (its task.json names the task, its data
    files and max length); the student a preset (tiny, mini, small, ...), a config.json, a checkpoint with
    the teacher's vocabulary, or the teacher's own layers (--student-layers-from-teacher 2: every other
    one). Loss: (1 - alpha) x soft targets at --temperature + alpha x hard labels, plus --hidden-weight,
    --attention-weight and --relation-weight terms. --unlabelled adds inputs the teacher labels. Scored on
    dev every epoch; OUT/student/ is the best student, a fine-tuned model directory that predict, serve and
    export-onnx take.

    Example: `bertforge distill task --teacher runs/sst2/seed-1 --student mini --data glue/SST-2 --out runs/sst2-mini`
    """)

general_command = recipe_command(
    "distill-general", DistillRecipe, _body("general"),
    skip=("mode", "task_settings", "progress", *_TASK_ONLY, *_SENTENCES_ONLY), leading=[_OUT, _OVERWRITE, _QUIET],
    doc="""Distil a teacher encoder into a small pre-trained student on prepared shards.

    The student learns the teacher's last-layer attention (--attention-weight), self-relations
    (--relation-weight), hidden states (--hidden-weight, projected when the widths differ) and, when both
    have masked-LM heads, its masked-LM distributions (--mlm-weight), on the shards `bertforge prepare`
    made with the teacher's vocabulary. OUT/final/ is the student in Hugging Face layout, for
    `bertforge finetune` or `bertforge distill task --student`.

    Example: `bertforge distill general --teacher models/minilm --student tiny --data data/bert128 --out runs/tiny-kd --max-steps 2000 --attention-weight 1 --relation-weight 1`
    """)

sentences_command = recipe_command(
    "distill-sentences", DistillRecipe, _body("sentences"),
    skip=("mode", "task_settings", "progress", *_NOT_SENTENCES), leading=[_OUT, _OVERWRITE, _QUIET, QUOTING_PARAMETER],
    doc="""Teach a small student a sentence encoder's vectors on your unlabelled text.

    The teacher (all-MiniLM-L6-v2, say) encodes every text of --data once; the student (a preset with
    random weights in the vocabulary of --tokenizer, or a checkpoint) learns to give the same vectors
    (its mean-pooled last layer through a learned Linear, by 1 - cosine). The vocabularies may differ,
    so a tokenizer trained on your own text works. --budget-minutes fits warm-up and decay to the time.
    Texts held out of training (--heldout-texts) score the student's agreement with the teacher before
    and after. OUT/final/ is the student encoder, for `bertforge finetune` like any checkpoint: at a few
    minutes of CPU it is a far better start than masked LM on the same text (docs/results-pretraining.md).

    Example: `bertforge distill sentences --teacher models/minilm --student tiny --tokenizer runs/tok --data reviews.txt --budget-minutes 3 --lr 1e-3 --batch-size 64 --out runs/tiny-reviews`
    """)

app = App(help="Knowledge distillation: a teacher teaches a smaller student (task: a fine-tuned teacher's "
                       "task; general: an encoder on raw-text shards; sentences: a sentence encoder's vectors on "
                       "your text).", no_args_is_help=True)
app.command("task")(task_command)
app.command("general")(general_command)
app.command("sentences")(sentences_command)

__all__ = ["app", "general_command", "sentences_command", "task_command"]
