"""The quickstart's stages, one function each: (run directory, budget, echo) -> a small JSON-able record
of what the stage produced, which `run.quickstart` writes to `stages/<stage>.json` (`read_record`
reads one back). `STAGE_FUNCTIONS` maps `settings.STAGES` to them; `STAGE_OUTPUTS` lists what each
writes, cleared before it reruns from scratch.

The full budget's pre-training follows what the CPU studies of docs/research/research-log.md found leaves the
unigram / bag-of-words plateau soonest on two cores: 64-token sequences, sentence-order prediction,
no dropout while pre-training, several pairings of the text (dupe factor), and minutes rather than
steps (the schedule fitted to them), so that the command takes the same time on every machine.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic
from bertforge.quickstart.assets import bundled_books, minilm_dir, sst2_sample, teach_text
from bertforge.quickstart.report import plot_learning_curve, render_report, spread
from bertforge.quickstart.settings import (
    ADAPT_HEAD_WARMUP,
    ADAPT_LR,
    CURVES,
    FILL_MASK_PROMPTS,
    FINETUNE_BATCH_SIZE,
    MINILM_LR,
    STAGES,
    SUBSAMPLE_SEED,
    TEACH_BATCH_SIZE,
    TEACH_HELDOUT,
    TEACH_LR,
    Budget,
    curve_steps,
)


def stage_tokenizer(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.train(bundled_books(budget.books), vocab_size=budget.vocab_size, min_frequency=2)
    tokenizer.save_pretrained(run / "tokenizer")
    return {"vocab_size": tokenizer.vocab_size, "directory": str(run / "tokenizer")}


def stage_data(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    from bertforge.data.prepare import prepare

    stats = prepare(bundled_books(budget.books), run / "tokenizer", run / "data",
                    max_seq_length=budget.max_seq_length, dupe_factor=budget.dupe_factor, plain_text=True,
                    objective=budget.objective, masking="dynamic",
                    validation_fraction=budget.validation_fraction, seed=12345, progress=True)
    if not stats.get("validation_instances"):
        raise RuntimeError(f"{run / 'data'}: no validation instances; raise the budget's validation_fraction")
    keys = ("documents", "sentences", "tokens", "instances", "validation_instances", "is_next_fraction")
    return {key: stats.get(key) for key in keys} | {"directory": str(run / "data")}


def stage_pretrain(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    from bertforge.pretrain import pretrain
    from bertforge.train.log import read_metrics

    dropout = budget.pretrain_dropout
    # by time on the full budget: the same minutes on every machine (a fast CPU takes more steps), the
    # rate warming up over the first 6% of the time and decaying to zero at its end (Cramming's rule;
    # a fixed count of warm-up steps would be half of a minute's run on a slow CPU)
    warmup = ({"warmup_ratio": 0.06} if budget.pretrain_minutes else {"warmup_steps": budget.pretrain_warmup_steps})
    result = pretrain(budget.model, run / "data", run / "pretrain", max_steps=budget.pretrain_steps, resume=True,
                      budget_minutes=budget.pretrain_minutes, batch_size=budget.pretrain_batch_size, lr=budget.pretrain_lr,
                      **warmup, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, eval_every=budget.eval_every,
                      save_every=budget.eval_every, keep_last=1, eval_batch_size=128, eval_max_batches=0)
    # the non-padding pieces trained on (the counters travel in checkpoints, so a resume keeps counting)
    trained = [r for r in read_metrics(run / "pretrain") if r.get("split") == "train" and "tokens" in r]
    config = json.loads((run / "pretrain" / "final" / "config.json").read_text())
    shape = f"L={config['num_hidden_layers']}, H={config['hidden_size']}, A={config['num_attention_heads']}"
    return {"final": str(result.final), "steps": result.train.step, "minutes": budget.pretrain_minutes or None,
            "architecture": f"{budget.model} ({shape})",
            "tokens": trained[-1]["tokens"] if trained else None}


def stage_teach(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """The pre-trained model learns all-MiniLM-L6-v2's sentence vectors of the bundled in-domain text
    (`bertforge distill sentences`: its mean-pooled last layer, through a Linear, towards MiniLM's
    vector by 1 - cosine); its own vocabulary stays. Writes `taught/final/`."""
    from bertforge.distill import build_recipe, distill

    length = ({"budget_minutes": budget.teach_minutes, "warmup_ratio": 0.06} if budget.teach_minutes
              else {"max_steps": budget.teach_steps, "warmup_ratio": 0.1})
    recipe = build_recipe("sentences", options={
        "teacher": str(minilm_dir()), "student": str(run / "pretrain" / "final"), "data": str(teach_text()),
        "max_texts": budget.teach_texts, "heldout_texts": TEACH_HELDOUT, "max_length": budget.max_seq_length,
        "lr": TEACH_LR, "batch_size": TEACH_BATCH_SIZE, "teacher_precision": "auto", "progress": False, **length})
    results = distill(recipe, run / "taught", verbose=False)
    return {"final": str(run / "taught" / "final"), "steps": results["steps"], "texts": results["texts"],
            "minutes": budget.teach_minutes or None, "teacher_seconds": results["teacher_seconds"],
            "teacher_precision": results["teacher_precision"],
            "cosine_before": results["start_metrics"].get("cosine"),
            "cosine_after": results["final_metrics"].get("cosine")}


def stage_pretrain_eval(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """Held-out MLM and sentence-pair accuracy of the final model, the context probe, fill-mask examples."""
    from bertforge.data.loader import PretrainingLoader
    from bertforge.model.auto import load_for_job
    from bertforge.pretrain import mlm_context_probe, pretraining_metrics
    from bertforge.tokenizer import BertTokenizer

    final = run / "pretrain" / "final"
    model = load_for_job(final, "pretraining").eval()
    tokenizer = BertTokenizer.from_pretrained(final)
    loader = PretrainingLoader(run / "data", 128, split="valid", shuffle=False, pad_to_multiple_of=8)
    loader.set_epoch(0)  # the batches every evaluation of the run used
    metrics = pretraining_metrics(model, loader, objective=budget.objective)
    probe = mlm_context_probe(model, loader, tokenizer.all_special_ids, tokenizer.mask_token_id)
    examples = [{"text": text, "top5": fill_mask(model, tokenizer, text)} for text in FILL_MASK_PROMPTS]
    return {"validation": metrics, "validation_sequences": len(loader.dataset), "context_probe": probe,
            "fill_mask": examples}


def fill_mask(model: Any, tokenizer: Any, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """The top-k tokens (with probabilities) for the first [MASK] of `text`."""
    import torch

    encoding = tokenizer.encode(text, truncation=True)
    position = encoding.input_ids.index(tokenizer.mask_token_id)
    with torch.no_grad():
        logits = model(torch.tensor([encoding.input_ids]), torch.tensor([encoding.attention_mask])).mlm_logits
    probs = logits[0, position].softmax(-1)
    top = probs.topk(top_k)
    return [(tokenizer.convert_ids_to_tokens([i])[0], round(p, 4)) for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)]


def epochs_for(steps: int, size: int) -> float:
    """The `epochs` that makes `finetune` run exactly `steps` steps on `size` sentences (it runs
    ceil(batches per epoch x epochs)); nudged down where floating point would round up one step more."""
    per_epoch = math.ceil(size / FINETUNE_BATCH_SIZE)
    epochs = steps / per_epoch
    while math.ceil(per_epoch * epochs) > steps:
        epochs = math.nextafter(epochs, 0.0)
    return epochs


def stage_subsamples(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """The labelled sentences of each curve size, written as GLUE SST-2 folders under `sst2-subsets/`.

    One fixed random order of the 4,000 sentences, cut at each size: the 100 are the first 100 of the
    300, and so on, so a larger size only adds sentences, and every model at a size sees the same ones.
    Each subset keeps the file's order (the fine-tuning seed shuffles the batches)."""
    import numpy as np

    header, *rows = (sst2_sample() / "train.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
    order = np.random.default_rng(SUBSAMPLE_SEED).permutation(len(rows)).tolist()
    subsets = []
    for size in sorted(set(budget.curve_sizes)):
        chosen = sorted(order[:size])
        folder = run / "sst2-subsets" / f"n-{len(chosen)}" / "SST-2"
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / "train.tsv", header + "".join(rows[i] for i in chosen))
        shutil.copyfile(sst2_sample() / "dev.tsv", folder / "dev.tsv")
        positive = sum(rows[i].rstrip("\n").rsplit("\t", 1)[-1] == "1" for i in chosen)
        subsets.append({"size": size, "sentences": len(chosen), "positive": positive,
                        "data": str(folder.parent)})
    dev_labels = [line.rstrip("\n").rsplit("\t", 1)[-1]
                  for line in (sst2_sample() / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]]
    dev_labels = dev_labels[:budget.finetune_eval_examples] if budget.finetune_eval_examples else dev_labels
    majority = max(dev_labels.count("0"), dev_labels.count("1")) / len(dev_labels)
    return {"subsets": subsets, "available": len(rows), "seed": SUBSAMPLE_SEED, "dev_sentences": len(dev_labels),
            "dev_majority_accuracy": majority}


def _curve(run: Path, budget: Budget, stage: str, model_dir: Path, lr: float, sizes: Sequence[int],
           echo: Callable[[str], None], max_steps: int | None = None) -> dict[str, Any]:
    """Fine-tune `model_dir` on SST-2 at each size, once per curve seed; one `finetune` run per size.

    Scored once, at the end (no dev-based model selection, so every start is scored alike), on the
    same dev sentences; the fine-tuned models stay in `<curve folder>/n-<size>/seed-<seed>/`."""
    from bertforge.finetune import finetune

    subsets = {s["size"]: s for s in read_record(run, "subsamples")["subsets"]}
    folder, points = run / CURVES[stage][1], []
    for size in sizes:
        subset = subsets[size]
        steps = min(curve_steps(subset["sentences"], budget), max_steps or budget.curve_max_steps)
        started = time.perf_counter()
        results = finetune("glue", "SST-2", model_dir, subset["data"], folder / f"n-{size}",
                           seeds=tuple(budget.curve_seeds), lr=lr, batch_size=FINETUNE_BATCH_SIZE,
                           pooling=budget.finetune_pooling,
                           epochs=epochs_for(steps, subset["sentences"]), max_length=budget.max_seq_length,
                           max_eval_examples=budget.finetune_eval_examples, eval_every_epoch=False,
                           save_best=False, progress=False, verbose=False)
        accuracy = results["summary"]["accuracy"]
        points.append({"size": size, "sentences": subset["sentences"], "steps": results["seeds"][0]["steps"],
                       "epochs": round(steps / math.ceil(subset["sentences"] / FINETUNE_BATCH_SIZE), 2),
                       "seeds": list(budget.curve_seeds), "accuracies": accuracy["values"],
                       "mean": accuracy["mean"], "std": accuracy["std"], "data": subset["data"],
                       "seconds": round(time.perf_counter() - started, 1)})
        echo(f"    {size:>5} sentences, {steps} steps: SST-2 dev accuracy {spread(points[-1])} "
             f"({points[-1]['seconds']:.0f} s)")
    return {"model": str(model_dir), "lr": lr, "pooling": budget.finetune_pooling, "points": points,
            "directory": str(folder)}


def stage_curve_taught(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    return _curve(run, budget, "curve_taught", run / "taught" / "final", budget.finetune_lr, budget.curve_sizes, echo)


def stage_curve_pretrained(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    # A small model takes a larger rate than BERT-base's 2e-5..5e-5 (3e-4 was the best for BERT-mini
    # from both starts in the CPU studies).
    sizes = [size for size in budget.curve_sizes if size <= budget.mlm_alone_max_size]
    return _curve(run, budget, "curve_pretrained", run / "pretrain" / "final", budget.finetune_lr, sizes, echo)


def stage_curve_random(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """The same fine-tuning from the same architecture and vocabulary, with BERT's random initialisation."""
    from bertforge.pretrain import random_init_like

    start = random_init_like(run / "pretrain" / "final", run / "random-init", seed=0)
    return _curve(run, budget, "curve_random", start, budget.finetune_lr, budget.curve_sizes, echo)


def stage_curve_minilm(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    sizes = [size for size in budget.curve_sizes if size <= budget.minilm_max_size]
    return _curve(run, budget, "curve_minilm", minilm_dir(), MINILM_LR, sizes, echo, budget.minilm_max_steps)


def stage_adapt_minilm(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """all-MiniLM-L6-v2 adapted (`bertforge adapt`) on the text of the bundled training sentences, labels
    dropped and the dev sentences never read: the task-adaptive pre-training a user would run first."""
    from bertforge.adapt import adapt

    rows = (sst2_sample() / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    text = run / "sst2-text" / "train-sentences.txt"
    text.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(text, "".join(row.rsplit("\t", 1)[0] + "\n" for row in rows))
    result = adapt(minilm_dir(), text, run / "minilm-adapted", resume=True, max_steps=budget.adapt_steps,
                   max_seq_length=budget.max_seq_length, batch_size=FINETUNE_BATCH_SIZE, lr=ADAPT_LR,
                   head_warmup=ADAPT_HEAD_WARMUP, progress=False, echo=echo)
    return {"final": str(result.final), "sentences": len(rows), "steps": result.steps, "head_steps": result.head_steps,
            "before": result.before, "after": result.after, "new_heads": result.new_heads}


def stage_curve_minilm_adapted(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    sizes = [size for size in budget.curve_sizes if size <= budget.minilm_max_size]
    adapted = Path(read_record(run, "adapt_minilm")["final"])
    return _curve(run, budget, "curve_minilm_adapted", adapted, MINILM_LR, sizes, echo, budget.minilm_max_steps)


def stage_report(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    from bertforge.plot import plot_run

    records = {name: read_record(run, name) for name in STAGES if name != "report"}
    curves = plot_run(run / "pretrain", run / "pretrain_curves.png")
    learning = plot_learning_curve(records, run / "learning_curve.png")
    write_text_atomic(run / "report.md", render_report(records, budget, curves.name, learning.name))
    return {"report": str(run / "report.md"), "curves": str(curves), "learning_curve": str(learning)}


STAGE_FUNCTIONS: dict[str, Callable[[Path, Budget, Callable[[str], None]], dict[str, Any]]] = {
    "tokenizer": stage_tokenizer, "data": stage_data, "pretrain": stage_pretrain,
    "pretrain_eval": stage_pretrain_eval, "teach": stage_teach, "subsamples": stage_subsamples,
    "curve_taught": stage_curve_taught, "curve_pretrained": stage_curve_pretrained, "curve_random": stage_curve_random,
    "curve_minilm": stage_curve_minilm, "adapt_minilm": stage_adapt_minilm,
    "curve_minilm_adapted": stage_curve_minilm_adapted, "report": stage_report,
}


# What each stage writes, cleared before it reruns from scratch.
STAGE_OUTPUTS = {
    "tokenizer": ("tokenizer",), "data": ("data",), "pretrain": ("pretrain",), "teach": ("taught",),
    "subsamples": ("sst2-subsets",), "curve_taught": ("curve-taught",),
    "curve_pretrained": ("curve-pretrained",), "curve_random": ("random-init", "curve-random"),
    "curve_minilm": ("curve-minilm",), "adapt_minilm": ("sst2-text", "minilm-adapted"),
    "curve_minilm_adapted": ("curve-minilm-adapted",),
}


def read_record(run: Path, name: str) -> dict[str, Any]:
    path = run / "stages" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}
