"""Continued pre-training of a checkpoint on the user's own unlabelled text ("task-adaptive" or
"domain-adaptive" pre-training, Gururangan et al. 2020).

    from bertforge.adapt import adapt
    result = adapt("path/to/checkpoint", ["reviews.csv"], "runs/adapted", text_column="review",
                   budget_minutes=10)
    result.final      # runs/adapted/final: the checkpoint's family, masked-LM head included
    result.before, result.after   # held-out masked-LM accuracy and perplexity, before and after

The path is the one every pre-training run takes, with the checkpoint's own tokenizer and masking:

1. `prepare` turns the text into shards under `OUT/data/` with the checkpoint's tokenizer: lines packed
   into sequences of `max_seq_length` (or one line a sequence, `line_by_line`), masked dynamically
   (a fresh mask every epoch) with the family's mask token at `mask_prob`, whole words where its
   vocabulary marks them (`whole_word`). A share of the text (`validation_fraction`, by blocks of
   lines chosen by a hash of their text) is held out in `OUT/data/valid/`, masked once, and never
   trained on.
2. The checkpoint is scored on the held-out text as it is (`before`).
3. `pretrain` continues it through the one training loop (`OUT/checkpoints/`, `OUT/metrics.jsonl`),
   for `max_steps`, `epochs` or `budget_minutes` (warm-up and decay then fitted to the time), and
   scores it again (`after`); the model goes to `OUT/final/`, with the tokenizer's files and a model
   card (README.md: the model adapted, by its Hub name and commit where it came from the Hub, the
   settings, the scores before and after).

The objective is the family's masked LM; an ELECTRA discriminator (which has no masked-LM head)
continues with replaced-token detection, a generator a quarter as wide beside it (from the
checkpoint's `generator/` when it has one, else new). A checkpoint without a masked-LM head
(a sentence-embedding model, a bare encoder) gets a new one, tied to its word embeddings; the report
names it, and its `before` scores are a new head's.

OUT holds `adapt_config.yaml` (this run's settings: `bertforge adapt --config OUT/adapt_config.yaml`
repeats it), `results.json` (before, after, the steps, minutes and tokens), and what `prepare` and
`pretrain` keep in any run directory. The run holds OUT's lock; `resume` continues it from its last
checkpoint, and a resume with other text or settings is refused, naming the difference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertforge.fileio import LOCK_FILE, run_lock, write_text_atomic
from bertforge.hub import ResolvedModel, resolve_local_or_hub
from bertforge.model.sentence_files import carry_sentence_files
from bertforge.recipe import resolve, setting
from bertforge.recipe import save as save_recipe
from bertforge.train.config import OptimConfig, TrainConfig

__all__ = ["AdaptRecipe", "AdaptResult", "AdaptText", "adapt", "adaptation_objective"]

CONFIG_FILE = "adapt_config.yaml"
RESULTS_FILE = "results.json"
BASELINE_FILE = "baseline.json"  # the checkpoint's held-out scores before training, kept for a resume
DATA_DIR = "data"
HEAD_DIR = "head-warmup"  # the new head's warm-up run, when there is one
HELD_OUT_BLOCK = 8  # lines per held-out unit: few, so that a small file still holds some out


@dataclass
class AdaptText:
    """The user's text and how it is turned into masked-LM sequences; one section of the recipe."""

    inputs: list[str] = setting(default_factory=list, aliases=("--input", "-i"),
                                help="Text to adapt on (repeat): .txt (a line each, blank lines between documents), "
                                     ".jsonl, .csv, .tsv or .parquet (with --text-column), compressed too; files, "
                                     "directories or glob patterns. A dev or test file is read only if named here.")
    text_column: str = setting("text", help="The column (CSV, TSV, Parquet) or field (JSON lines) holding the text; "
                                            "other columns, labels among them, are ignored.")
    max_seq_length: int = setting(128, help="Tokens per sequence, special tokens included.")
    mask_prob: float = setting(0.15, help="Share of the tokens masked (BERT: 0.15; budget recipes use more).")
    whole_word: bool = setting(False, help="Mask whole words (where the tokenizer marks them: WordPiece ##, "
                                           "byte-level BPE and SentencePiece word starts).")
    line_by_line: bool = setting(False, help="Each line its own sequence (padded) instead of lines packed up to "
                                             "max_seq_length.")
    validation_fraction: float = setting(0.05, help="Share of the text held out to score the model before and after "
                                                    "(never trained on).")
    batch_size: int = setting(32, help="Sequences per optimiser step.")
    epochs: float | None = setting(None, help="Passes over the text; sets max_steps from the text's size "
                                              "(ignored with budget_minutes).")
    workers: int = setting(1, help="Processes that tokenize the text.")

    def __post_init__(self) -> None:
        if not 0 < self.mask_prob < 1:
            raise ValueError(f"mask_prob must be in (0, 1), not {self.mask_prob}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"epochs must be positive, not {self.epochs}")
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), not {self.validation_fraction}")


@dataclass
class AdaptRecipe:
    """Everything an adaptation run depends on; OUT/adapt_config.yaml holds it resolved."""

    model: str | None = setting(None, help="The checkpoint directory to continue (any family bertforge loads).")
    text: AdaptText = field(default_factory=AdaptText)
    # Gururangan et al.'s task-adaptive rate (1e-4) with a short warm-up
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4, warmup_ratio=0.06))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=1000, save_every_minutes=10.0))
    head_warmup: float = setting(0.0, help="A checkpoint without a masked-LM head: the share of the run (its steps "
                                           "or minutes) spent first training the new head alone, the encoder as "
                                           "loaded, at head_lr; the rest trains everything.")
    head_lr: float = setting(1e-3, help="The rate of the head's warm-up (head_warmup).")
    train_dropout: str = setting("auto", help="Dropout while adapting: auto (off with budget_minutes, else the "
                                              "checkpoint's), off, or model; the adapted model keeps the "
                                              "checkpoint's rates for fine-tuning.")
    source: str | None = setting(None, help="Where the recipe came from (recorded in adapt_config.yaml).")

    def __post_init__(self) -> None:
        if not 0 <= self.head_warmup < 1:
            raise ValueError(f"head_warmup must be in [0, 1), not {self.head_warmup}")
        if self.head_lr <= 0:
            raise ValueError(f"head_lr must be positive, not {self.head_lr}")


@dataclass
class AdaptResult:
    final: Path  # OUT/final
    before: dict[str, float]  # held-out scores of the checkpoint as given ({} without held-out text)
    after: dict[str, float]  # the same after adaptation
    steps: int
    objective: str  # "mlm" or "rtd"
    new_heads: list[str]  # heads the checkpoint lacked, started afresh
    head_steps: int = 0  # steps that trained the new head alone before those (head_warmup)


def adaptation_objective(checkpoint: str | os.PathLike[str]) -> str:
    """"mlm" for a family's masked LM, "rtd" for an ELECTRA discriminator (no masked-LM head of its own),
    decided by the checkpoint's config.json (`model_type`, `architectures`)."""
    from bertforge.checkpoint import read_architectures
    from bertforge.model.registry import model_class, read_config_file

    config = read_config_file(Path(checkpoint) / "config.json")
    pretraining = model_class(config.model_type, "pretraining")
    masked_lm = model_class(config.model_type, "masked-lm")  # raises, naming the family, where there is none
    if getattr(pretraining, "with_generator", None) is not None and \
            masked_lm.__name__ not in read_architectures(checkpoint):
        return "rtd"
    return "mlm"


def adapt(
    model: str | os.PathLike[str] | AdaptRecipe | None,
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
    out_dir: str | os.PathLike[str] = "runs/adapt",
    *,
    resume: bool = False,
    overwrite: bool = False,
    echo: Callable[[str], None] | None = None,
    **settings: Any,
) -> AdaptResult:
    """Continue pre-training `model` (a checkpoint directory, or a whole `AdaptRecipe`) on `inputs`.

    `settings` name any recipe field (`text_column`, `mask_prob`, `epochs`, `budget_minutes`, `lr`,
    `max_steps`, `precision`, ...). See the module docstring for what is written where.
    """
    given = dict(settings)
    if model is not None and not isinstance(model, AdaptRecipe):
        given["model"] = str(model)
    if inputs is not None:
        given["inputs"] = [str(inputs)] if isinstance(inputs, str | os.PathLike) else [str(p) for p in inputs]
    recipe = resolve(AdaptRecipe, model if isinstance(model, AdaptRecipe) else None, given,
                     given_as="adapt(): {name}")
    source = _checkpoint(recipe.model)  # a Hub name: its snapshot, repository and commit
    checkpoint = source.path
    if not recipe.text.inputs:
        raise ValueError("no text to adapt on: give --input FILE (or inputs in the recipe)")
    objective = adaptation_objective(checkpoint)
    out = Path(out_dir)
    say = echo or (lambda message: None)
    with run_lock(out, what="adaptation run"), _removed_if_refused(out):
        if overwrite or not (out / CONFIG_FILE).is_file():  # a resume refused for other settings keeps the old
            _save_config(recipe, out)
        stats = _prepare_text(recipe, checkpoint, out / DATA_DIR, overwrite=overwrite, said=echo is not None)
        say(f"{stats['tokens']:,} tokens -> {stats['instances']:,} sequences for training, "
            f"{stats['validation_instances']:,} held out")
        for warning in stats.get("warnings", []):  # skipped lines (not UTF-8) and records, with file:line
            say(f"note: {warning}")
        finished = None if overwrite else _finished(out, recipe)
        if finished is not None:  # the same run finished before (same text and settings): nothing to train
            say(f"{out}: already adapted with these settings ({finished.steps} steps), reusing {finished.final}; "
                f"after: {_describe(finished.after)} (--overwrite trains it again)")
            return finished
        pretrain_recipe = _pretrain_recipe(recipe, checkpoint, objective, stats)
        before, new_heads = _baseline(pretrain_recipe, checkpoint, out, objective, overwrite=overwrite)
        if before:
            say(f"before: {_describe(before)}" + (f" (new {', '.join(new_heads)})" if new_heads else ""))
        elif recipe.text.validation_fraction > 0:
            say(f"no held-out text: the text is too small to hold out {recipe.text.validation_fraction:.0%} of "
                f"it by blocks of {HELD_OUT_BLOCK} lines; raise validation_fraction to score the model")
        result = _train(recipe, pretrain_recipe, checkpoint, out, objective, before, new_heads, stats,
                        resume=resume, overwrite=overwrite, say=say)
        _write_card(result, recipe, source, pretrain_recipe.data.batch_size * pretrain_recipe.train.grad_accum)
        return result


def _train(recipe: AdaptRecipe, pretrain_recipe: Any, checkpoint: Path, out: Path, objective: str,
           before: dict[str, float], new_heads: list[str], stats: dict[str, Any], *, resume: bool,
           overwrite: bool, say: Callable[[str], None]) -> AdaptResult:
    """The pre-training run itself (the caller holds OUT's lock), after the new head's warm-up where
    there is one, then results.json."""
    from bertforge.pretrain import pretrain

    start, head_steps = checkpoint, 0
    if new_heads and recipe.head_warmup > 0 and objective == "mlm":
        warmup, pretrain_recipe = _split_for_head_warmup(recipe, pretrain_recipe)
        head = pretrain(warmup, out / DATA_DIR, out / HEAD_DIR, init_from=checkpoint, overwrite=overwrite,
                        resume=(out / HEAD_DIR / "checkpoints").is_dir() and not overwrite)
        start, head_steps = head.final or out / HEAD_DIR / "final", head.train.step
        say(f"new head warmed up alone for {head_steps} steps: {_describe(_scores(head.train.metrics))}")
    result = pretrain(pretrain_recipe, out / DATA_DIR, out, init_from=start, resume=resume,
                      overwrite=overwrite, lock=False)
    after = _scores(result.train.metrics) if before else {}
    if after:
        say(f"after:  {_describe(after)}")
    report = {
        "checkpoint": str(checkpoint.resolve()), "objective": objective, "new_heads": new_heads,
        "before": before, "after": after, "steps": result.train.step,
        "train_minutes": round(getattr(result.train, "train_seconds", math.nan) / 60, 3),
        "head_warmup_steps": head_steps, "tokens": stats["tokens"], "train_sequences": stats["instances"],
        "held_out_sequences": stats["validation_instances"], "settings": _flat_settings(recipe),
    }
    final = result.final if result.final is not None else out / "final"
    kept = carry_sentence_files(checkpoint, final)  # a sentence-transformers model stays one, prompts and all
    if kept:
        report["sentence_transformers_files"] = kept
        say(f"kept the model's sentence-transformers files in {final}: {', '.join(kept)}")
    write_text_atomic(out / RESULTS_FILE, json.dumps(report, indent=1, default=str) + "\n")
    _save_config(recipe, out)
    return AdaptResult(final=final, before=before, after=after, steps=result.train.step, objective=objective,
                       new_heads=new_heads, head_steps=head_steps)


def _write_card(result: AdaptResult, recipe: AdaptRecipe, source: ResolvedModel, batch_size: int) -> Path:
    """README.md in OUT/final: the model adapted (a Hub model by its repository and commit), the text and
    settings, and the held-out scores before and after."""
    from bertforge.modelcard import command_line, write_model_card

    text = recipe.text
    settings: dict[str, Any] = {
        "objective": result.objective, "steps": result.steps, "batch_size": batch_size, "lr": recipe.optim.lr,
        "max_seq_length": text.max_seq_length, "mask_prob": text.mask_prob, "whole_word": text.whole_word,
        "line_by_line": text.line_by_line, "precision": recipe.train.precision, "seed": recipe.train.seed}
    if result.new_heads:
        settings.update(new_heads=result.new_heads, head_warmup_steps=result.head_steps)
    if recipe.train.budget_minutes > 0:
        settings["budget_minutes"] = recipe.train.budget_minutes
    return write_model_card(result.final, kind="adapted", base_model=source.repo_id or source.path,
                            base_revision=source.commit, command=command_line(), metrics=result.after,
                            baseline=result.before, data=", ".join(Path(p).name for p in text.inputs),
                            settings=settings)


def _save_config(recipe: AdaptRecipe, out: Path) -> None:
    save_recipe(recipe, out / CONFIG_FILE, header=f"bertforge adapt --config {out / CONFIG_FILE} --out DIR repeats "
                                                  "this run")


def _finished(out: Path, recipe: AdaptRecipe) -> AdaptResult | None:
    """The result of a finished run in `out` with the same settings (its results.json), or None."""
    path = out / RESULTS_FILE
    if not path.is_file() or not (out / "final" / "config.json").is_file():
        return None
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("settings") != json.loads(json.dumps(_flat_settings(recipe), default=str)):
        return None  # the pre-training run's own check names what differs
    return AdaptResult(final=out / "final", before=saved["before"], after=saved["after"], steps=saved["steps"],
                       objective=saved["objective"], new_heads=saved["new_heads"],
                       head_steps=saved.get("head_warmup_steps", 0))


@contextlib.contextmanager
def _removed_if_refused(out: Path) -> Iterator[None]:
    """Remove what the run made in `out` when it fails before its first checkpoint: a refused run (text
    that cannot be read, too little of it, a model that does not load) leaves --out as it found it, so
    the same command after the fix starts clean instead of meeting half-prepared data. A run stopped
    after a checkpoint keeps everything, for --resume."""
    found = {path.name for path in out.iterdir()}
    try:
        yield
    except BaseException:
        if not any(next((out / where / "checkpoints").glob("step-*"), None) for where in (".", HEAD_DIR)):
            for path in out.iterdir():
                if path.name in found or path.name == LOCK_FILE:
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        raise


def _checkpoint(model: str | None) -> ResolvedModel:
    if model is None:
        raise ValueError("no checkpoint: give --model DIR (or model in the recipe)")
    source = resolve_local_or_hub(model)
    if not (source.path / "config.json").is_file():
        raise ValueError(f"--model {model}: no such model directory (expected a directory with config.json)")
    return source


def _prepare_text(recipe: AdaptRecipe, checkpoint: Path, data_dir: Path, *, overwrite: bool,
                  said: bool = False) -> dict[str, Any]:
    """The text as shards of the checkpoint's tokenizer, masked dynamically; some of it held out. `said`:
    the caller reports the data's warnings (stats["warnings"]) itself, so they are not raised as well."""
    import warnings

    from bertforge.data.prepare import DataWarning, prepare

    text = recipe.text
    with warnings.catch_warnings():
        # one-sentence documents matter to a sentence objective only; adaptation packs lines
        warnings.filterwarnings("ignore", message=".*one-sentence documents.*", category=DataWarning)
        if said:
            warnings.filterwarnings("ignore", category=DataWarning)
        stats = prepare(text.inputs, checkpoint, data_dir, overwrite=overwrite, progress=recipe.train.progress,
                        objective="none", masking="dynamic", masked_lm_prob=text.mask_prob,
                        whole_word=text.whole_word, line_by_line=text.line_by_line,
                        max_seq_length=text.max_seq_length, validation_fraction=text.validation_fraction,
                        block_sentences=HELD_OUT_BLOCK, text_field=text.text_column,
                        text_column=text.text_column, workers=text.workers)
    return stats


def _pretrain_recipe(recipe: AdaptRecipe, checkpoint: Path, objective: str, stats: dict[str, Any]) -> Any:
    """The pre-training recipe that continues the checkpoint: its own config (read from its directory,
    a Hub model's snapshot), the data's masking, the steps that `epochs` asks for (or `max_steps`, or the
    time budget with a cap no run reaches)."""
    from bertforge.pretrain import DataOptions
    from bertforge.pretrain import Recipe as PretrainRecipe

    text = recipe.text
    sequences = int(stats["instances"])
    if sequences < 1:
        raise ValueError(f"{', '.join(text.inputs)}: no text left to train on after holding out "
                         f"{stats['validation_instances']} sequences; give more text or a lower validation_fraction")
    batch_size = min(text.batch_size, sequences)
    train = recipe.train
    if train.budget_minutes > 0:
        train = dataclasses.replace(train, max_steps=10**9)  # the budget ends the run
    elif text.epochs is not None:
        train = dataclasses.replace(train, max_steps=max(1, math.ceil(text.epochs * (sequences // batch_size))))
    data = DataOptions(batch_size=batch_size, objective="rtd" if objective == "rtd" else None)
    return PretrainRecipe(model={"config": str(checkpoint)}, data=data, optim=recipe.optim, train=train,
                          train_dropout=recipe.train_dropout, source=recipe.source)


def _split_for_head_warmup(recipe: AdaptRecipe, main: Any) -> tuple[Any, Any]:
    """The head's warm-up run (heads alone, at head_lr) and the rest of the run, sharing its steps or minutes."""
    share, train = recipe.head_warmup, main.train
    if train.budget_minutes > 0:
        head_train = dataclasses.replace(train, budget_minutes=share * train.budget_minutes)
        rest_train = dataclasses.replace(train, budget_minutes=(1 - share) * train.budget_minutes)
    else:
        head_steps = max(1, round(share * train.max_steps))
        head_train = dataclasses.replace(train, max_steps=head_steps)
        rest_train = dataclasses.replace(train, max_steps=max(1, train.max_steps - head_steps))
    head_optim = dataclasses.replace(main.optim, lr=recipe.head_lr)
    head = dataclasses.replace(main, train=head_train, optim=head_optim, train_only="heads")
    return head, dataclasses.replace(main, train=rest_train)


def _baseline(pretrain_recipe: Any, checkpoint: Path, out: Path, objective: str, *,
              overwrite: bool) -> tuple[dict[str, float], list[str]]:
    """The checkpoint's held-out scores as it is, and the heads it lacked; computed once per run
    directory (kept in OUT/baseline.json for a resume)."""
    path = out / BASELINE_FILE
    if path.is_file() and not overwrite:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("checkpoint") == str(checkpoint.resolve()):
            return saved["before"], saved["new_heads"]
    import torch

    from bertforge.pretrain import (
        initialise_from,
        model_config,
        pretraining_model,
        read_dataset_info,
        validation_evaluator,
    )

    data_dir = out / DATA_DIR
    info = read_dataset_info(data_dir)
    config = model_config(pretrain_recipe, info["tokenizer"], info["options"]["max_seq_length"])
    torch.manual_seed(pretrain_recipe.train.seed)  # the same new head as the run starts with
    model = pretraining_model(pretrain_recipe.data, config, "none")()
    report = initialise_from(model, checkpoint, info)
    new_heads = list(getattr(report, "new_heads", []) or [])
    evaluate = validation_evaluator(data_dir, pretrain_recipe.data, "none")
    before: dict[str, float] = {}
    if evaluate is not None:
        model.eval()
        with torch.no_grad():
            before = _scores(evaluate(model))
    write_text_atomic(path, json.dumps({"checkpoint": str(checkpoint.resolve()), "objective": objective,
                                        "before": before, "new_heads": new_heads}, indent=1) + "\n")
    return before, new_heads


def _scores(metrics: dict[str, float]) -> dict[str, float]:
    """The held-out metrics with the masked-LM perplexity (exp of the loss over the masked pieces)."""
    scores = dict(metrics)
    if "mlm_loss" in scores:
        scores["mlm_perplexity"] = math.exp(min(scores["mlm_loss"], 700.0))
    return scores


def _describe(scores: dict[str, float]) -> str:
    shown = []
    if "mlm_accuracy" in scores:
        shown.append(f"masked-LM accuracy {100 * scores['mlm_accuracy']:.1f}%, "
                     f"perplexity {scores['mlm_perplexity']:.1f}")
    if "rtd_loss" in scores:
        right = scores.get("rtd_accuracy_replaced", math.nan), scores.get("rtd_accuracy_original", math.nan)
        shown.append(f"replaced-token detection loss {scores['rtd_loss']:.3f} (replaced found {100 * right[0]:.1f}%, "
                     f"originals kept {100 * right[1]:.1f}%)")
    return "; ".join(shown) or "no held-out scores"


def _flat_settings(recipe: AdaptRecipe) -> dict[str, Any]:
    return {"model": recipe.model, "train_dropout": recipe.train_dropout, "head_warmup": recipe.head_warmup,
            "head_lr": recipe.head_lr, **dataclasses.asdict(recipe.text),
            **dataclasses.asdict(recipe.optim), **dataclasses.asdict(recipe.train)}


# ------------------------------------------------------------------------------------------------
# adaptation before fine-tuning (`finetune --adapt-on`)
# ------------------------------------------------------------------------------------------------
ADAPT_ON_TRAIN = "train"  # `--adapt-on train`: the training file's own text
ADAPTED_DIR = "adapted"  # OUT/adapted: the adaptation run a fine-tuning run starts from
_TEXT_FIELDS = ("text", "text_pair", "text_a", "text_b", "question", "context", "start_ending")
_LIST_FIELDS = ("words", "tokens", "endings")


def example_texts(examples: Sequence[Any]) -> list[str]:
    """The unlabelled text of any task's examples, each distinct text once, in order: the text fields
    (a sentence, its pair, a question, a passage), a tagged sentence's words joined by spaces, a
    multiple-choice question's endings. Labels are never read."""
    seen: dict[str, None] = {}
    for example in examples:
        for name in _TEXT_FIELDS:
            value = getattr(example, name, None)
            if isinstance(value, str) and value.strip():
                seen.setdefault(" ".join(value.split()), None)
        for name in _LIST_FIELDS:
            value = getattr(example, name, None)
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                pieces = [" ".join(value)] if name != "endings" else value
                for piece in pieces:
                    if piece.strip():
                        seen.setdefault(" ".join(piece.split()), None)
    return list(seen)


def adapt_before_finetuning(model: str | os.PathLike[str], source: str, out_dir: Path, *,
                            train_examples: Callable[[], Sequence[Any]], text_column: str = "text",
                            budget_minutes: float = 0.0, epochs: float | None = None, seed: int = 0,
                            overwrite: bool = False, progress: bool = True,
                            echo: Callable[[str], None] | None = None) -> Path:
    """Adapt `model` on `source` into `out_dir/adapted` and return the adapted model's directory.

    `source` is "train" (the training examples' own text, labels dropped: `example_texts`) or a file
    `adapt` reads (with `text_column`). A finished adaptation with the same settings and text is
    reused; an interrupted one resumes; one with other settings is refused (as any resume), unless
    `overwrite`, which starts it again.
    """
    run = out_dir / ADAPTED_DIR
    if source == ADAPT_ON_TRAIN:
        texts = example_texts(train_examples())
        if not texts:
            raise ValueError("adapt_on train: the training examples hold no text")
        text_file = run.parent / "adapt-text.txt"
        body = "".join(text + "\n" for text in texts)
        if not text_file.is_file() or text_file.read_text(encoding="utf-8") != body:
            write_text_atomic(text_file, body)
        inputs, column = [str(text_file)], "text"
    else:
        inputs, column = [source], text_column
    settings: dict[str, Any] = {"text_column": column, "seed": seed, "progress": progress}
    if budget_minutes > 0:
        settings["budget_minutes"] = budget_minutes
    else:
        settings["epochs"] = epochs if epochs is not None else DEFAULT_TASK_EPOCHS
    resume = (run / "checkpoints").is_dir() and not overwrite
    return adapt(model, inputs, run, resume=resume, overwrite=overwrite, echo=echo, **settings).final


DEFAULT_TASK_EPOCHS = 3.0  # `finetune --adapt-on` without a length: passes over the task's text
