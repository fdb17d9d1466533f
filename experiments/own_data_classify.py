"""Fine-tune on your own file: SST-2 as `reviews.csv`, bertforge `finetune classify` against transformers' Trainer.

The walk-through of docs/own-data.md, measured. SST-2 (../shared/data/glue/SST-2) becomes what a user
would have: `reviews.csv` with columns `text,label` and labels `positive` / `negative` (a fixed random
sub-sample of the 67,349 training phrases, 2,000 by default, so that a run fits a busy 2-core CPU), and
`reviews-dev.csv` (all 872 dev sentences). Then the same file is fine-tuned twice from
all-MiniLM-L6-v2, with the same hyper-parameters (those of `experiments.hf_finetune_baseline`):

- bertforge: `finetune("classify", ...)`, what `bertforge finetune classify --train reviews.csv
  --dev reviews-dev.csv` runs;
- transformers: the recipe of its `run_glue.py` example for a user's CSV (`datasets`' csv loader, the
  label list sorted from the training file, `label2id` / `id2label` in the config, dynamic padding,
  `Trainer`), with plain random batches (the Trainer's default, and bertforge's).

Both are scored on the dev file by the same code (`bertforge.tasks.metrics.classification_report`).
Wall time is the whole job as a user waits for it, file reading and tokenising included, imports not.
The two runs of a seed go back to back (who goes first alternates with the seed) while holding
/work/bench.lock, so no other timed run overlaps them; each records the load average at its start and end.

    python -m experiments.own_data_classify                      # seeds 1,2,3, both frameworks
    python -m experiments.own_data_classify --seeds 1 --train-rows 2000
    python -m experiments.own_data_classify --summarize          # table from the finished runs

Per-run files: experiments/results/own_data_classify/<framework>-seed<N>.json; the summary:
experiments/results/own_data_classify.json and the `own-data-classify` section of docs/own-data.md.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from experiments.common import RESULTS, ROOT, machine, machine_line, update_doc_section
from experiments.hf_finetune_baseline import HYPER, default_model

RUNS = RESULTS / "own_data_classify"
DOC = ROOT / "docs" / "own-data.md"
LOCK = Path("/work/bench.lock")
USE_LOCK = True
NAMES = {"0": "negative", "1": "positive"}
TRAIN_ROWS = 2000


# ---------------------------------------------------------------------------------------------------
# the user's files
# ---------------------------------------------------------------------------------------------------
def make_files(glue: Path, out: Path, train_rows: int, seed: int = 0) -> tuple[Path, Path]:
    """reviews.csv (a random `train_rows` of SST-2's training phrases, in file order) and reviews-dev.csv.

    SST-2's .tsv files are read with the GLUE reader (tab-separated without quoting), then written as
    ordinary quoted CSV, as a spreadsheet would save them.
    """
    from bertforge.tasks.base import subsample
    from bertforge.tasks.glue import read_glue

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, name, limit in (("train", "reviews.csv", train_rows), ("dev", "reviews-dev.csv", None)):
        examples = subsample(read_glue(glue, "SST-2", split), limit, seed)
        path = out / name
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label"])
            writer.writerows([e.text_a.strip(), NAMES[str(e.label)]] for e in examples)
        paths.append(path)
    return paths[0], paths[1]


# ---------------------------------------------------------------------------------------------------
# the two sides
# ---------------------------------------------------------------------------------------------------
def run_bertforge(train: Path, dev: Path, seed: int, model: Path, work: Path) -> dict[str, Any]:
    from bertforge.finetune import finetune

    result = finetune("classify", "reviews", model, None, work, seeds=(seed,), lr=HYPER["lr"],
                      batch_size=HYPER["batch_size"], epochs=HYPER["epochs"], warmup_ratio=HYPER["warmup"],
                      max_length=HYPER["max_length"], weight_decay=HYPER["weight_decay"],
                      eval_batch_size=HYPER["eval_batch_size"], eval_every_epoch=False,
                      task_settings={"train": str(train), "dev": str(dev)}, progress=False, verbose=False)
    run = result["seeds"][0]
    config = json.loads((work / f"seed-{seed}" / "config.json").read_text())
    return {"metrics": run["metrics"], "steps": run["steps"], "train_examples": result["train_examples"],
            "id2label": config["id2label"]}


def run_transformers(train: Path, dev: Path, seed: int, model: Path, work: Path) -> dict[str, Any]:
    """run_glue.py's path for `--train_file reviews.csv --validation_file reviews-dev.csv`."""
    import numpy as np
    import torch
    import transformers
    from datasets import load_dataset
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from bertforge.tasks.metrics import classification_report
    from experiments.hf_finetune_baseline import _in_order_evaluation

    transformers.logging.set_verbosity_error()
    transformers.set_seed(seed)
    raw = load_dataset("csv", data_files={"train": str(train), "validation": str(dev)},
                       cache_dir=str(work / "datasets-cache"))
    label_list = sorted(raw["train"].unique("label"))  # as run_glue does for a user's CSV
    label_to_id = {label: i for i, label in enumerate(label_list)}
    config = AutoConfig.from_pretrained(model, num_labels=len(label_list), finetuning_task="text-classification")
    config.label2id, config.id2label = label_to_id, dict(enumerate(label_list))
    tokenizer = AutoTokenizer.from_pretrained(model)
    net = AutoModelForSequenceClassification.from_pretrained(model, config=config)

    def preprocess(batch: dict[str, list[Any]]) -> dict[str, Any]:
        encoded = tokenizer(batch["text"], truncation=True, max_length=HYPER["max_length"])
        encoded["labels"] = [label_to_id[label] for label in batch["label"]]
        return encoded

    data = raw.map(preprocess, batched=True, remove_columns=["text", "label"], load_from_cache_file=False)
    gold = [label_list[i] for i in data["validation"]["labels"]]

    def compute_metrics(prediction: Any) -> dict[str, float]:
        predicted = [label_list[i] for i in np.asarray(prediction.predictions).argmax(-1)]
        return classification_report(predicted, gold, label_list)["metrics"]

    args = TrainingArguments(
        output_dir=str(work), per_device_train_batch_size=HYPER["batch_size"],
        per_device_eval_batch_size=HYPER["eval_batch_size"], learning_rate=HYPER["lr"],
        num_train_epochs=HYPER["epochs"], warmup_steps=HYPER["warmup"], lr_scheduler_type="linear",
        weight_decay=HYPER["weight_decay"], adam_epsilon=HYPER["adam_eps"], max_grad_norm=HYPER["max_grad_norm"],
        seed=seed, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True)
    trainer = _in_order_evaluation(Trainer)(model=net, args=args, train_dataset=data["train"],
                                            eval_dataset=data["validation"], data_collator=DataCollatorWithPadding(tokenizer),
                                            compute_metrics=compute_metrics)
    output = trainer.train()
    final = trainer.evaluate()
    metrics = {k[len("eval_"):]: float(v) for k, v in final.items()
               if k[len("eval_"):] in ("accuracy", "macro_f1", "micro_f1")}
    return {"metrics": metrics, "steps": int(output.global_step), "train_examples": len(data["train"]),
            "id2label": {str(k): v for k, v in net.config.id2label.items()}}


RUNNERS = {"bertforge": run_bertforge, "transformers": run_transformers}


# ---------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------
@contextmanager
def bench_lock() -> Iterator[None]:
    """Hold /work/bench.lock (as `flock /work/bench.lock CMD` does) so timed runs never overlap."""
    if USE_LOCK is False:  # smoke runs (--results) are not timings anyone reports
        yield
        return
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_job(framework: str, seed: int, train: Path, dev: Path, model: Path, train_rows: int) -> None:
    path = RUNS / f"{framework}-seed{seed}.json"
    if path.exists():
        return
    print(f"{framework} seed {seed} ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix=f"own-data-{framework}-") as work:
        load_start = os.getloadavg()
        started = time.perf_counter()
        record = RUNNERS[framework](train, dev, seed, model, Path(work))
        wall = time.perf_counter() - started
        load_end = os.getloadavg()
    record.update({"framework": framework, "seed": seed, "wall_s": round(wall, 1), "train_rows": train_rows,
                   "hyperparameters": HYPER, "load_average_start": load_start, "load_average_end": load_end,
                   "machine": machine()})
    RUNS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"{framework} seed {seed}: macro F1 {record['metrics']['macro_f1']:.4f}, accuracy "
          f"{record['metrics']['accuracy']:.4f} in {wall:.0f} s", file=sys.stderr, flush=True)


def summarize() -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for framework in RUNNERS:
        records = [json.loads(p.read_text()) for p in sorted(RUNS.glob(f"{framework}-seed*.json"))]
        cell: dict[str, Any] = {"seeds": [r["seed"] for r in records]}
        for key in ("accuracy", "macro_f1"):
            values = [r["metrics"][key] for r in records]
            cell[key] = {"values": values, "mean": statistics.fmean(values) if values else None,
                         "std": statistics.stdev(values) if len(values) > 1 else None}
        walls = [r["wall_s"] for r in records]
        cell["wall_s"] = {"values": walls, "mean": statistics.fmean(walls) if walls else None}
        cell["train_rows"] = records[-1]["train_rows"] if records else None
        cell["machine"] = records[-1]["machine"] if records else None
        cell["load_average"] = [[r["load_average_start"][0], r["load_average_end"][0]] for r in records]
        rows[framework] = cell
    ours, theirs = rows["bertforge"], rows["transformers"]
    if ours["wall_s"]["mean"] and theirs["wall_s"]["mean"]:
        rows["speedup"] = theirs["wall_s"]["mean"] / ours["wall_s"]["mean"]
    summary = {"hyperparameters": HYPER, **rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "own_data_classify.json").write_text(json.dumps(summary, indent=2) + "\n")
    if DOC.exists():
        update_doc_section("own-data-classify", render(summary), DOC)
    return summary


def _cell(cell: dict[str, Any]) -> str:
    if cell["mean"] is None:
        return "not run"
    std = f" ± {100 * cell['std']:.1f}" if cell["std"] is not None else ""
    return f"{100 * cell['mean']:.1f}{std}"


def render(summary: dict[str, Any]) -> str:
    ours, theirs = summary["bertforge"], summary["transformers"]
    rows = ours["train_rows"] or theirs["train_rows"]
    lines = [
        f"Made by `python -m experiments.own_data_classify` ({rows} training rows; dev: all 872 sentences; "
        f"seeds {', '.join(map(str, ours['seeds'] or theirs['seeds']))}; raw figures in "
        "`experiments/results/own_data_classify/`). Dev scores after the last epoch, mean ± sample standard "
        "deviation over seeds, both scored by bertforge's metric code; wall time per run, from reading the "
        "CSV to the dev scores.",
        "",
        "| | accuracy | macro F1 | wall time per run |",
        "|---|---|---|---|",
    ]
    for name, cell in (("bertforge `finetune classify`", ours), ("transformers `Trainer` (run_glue recipe)", theirs)):
        wall = f"{cell['wall_s']['mean']:.0f} s" if cell["wall_s"]["mean"] else "-"
        lines.append(f"| {name} | {_cell(cell['accuracy'])} | {_cell(cell['macro_f1'])} | {wall} |")
    if "speedup" in summary:
        lines += ["", f"bertforge takes {1 / summary['speedup']:.2f}x the Trainer's wall time "
                      f"(the Trainer takes {summary['speedup']:.2f}x bertforge's)."]
    info = ours["machine"] or theirs["machine"]
    if info:
        loads = [f"{a:.1f}-{b:.1f}" for c in (ours, theirs) for a, b in c["load_average"]]
        lines += ["", machine_line(info) + f" 1-minute load average at the start and end of each run: "
                                           f"{', '.join(loads)}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"), help="the shared data folder")
    parser.add_argument("--model", type=Path, default=None, help="default: all-MiniLM-L6-v2 from PyPI")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "own-data-classify",
                        help="where reviews.csv and reviews-dev.csv are written")
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--frameworks", default="bertforge,transformers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--summarize", action="store_true", help="only rebuild the table from finished runs")
    parser.add_argument("--results", type=Path, default=None,
                        help="smoke runs: put the run files and summary here, and leave docs/own-data.md alone")
    args = parser.parse_args()
    if args.results is not None:
        global RUNS, RESULTS, DOC, USE_LOCK
        RUNS, RESULTS, DOC = args.results / "runs", args.results, args.results / "own-data.md"
        USE_LOCK = False
    if not args.summarize:
        import torch

        torch.set_num_threads(args.threads)
        train, dev = make_files(args.data / "glue", args.work, args.train_rows)
        model = args.model or default_model()
        frameworks = args.frameworks.split(",")
        for seed in (int(s) for s in args.seeds.split(",")):
            with bench_lock():  # both frameworks of a seed back to back, under the same machine load
                for framework in (frameworks if seed % 2 else frameworks[::-1]):  # alternate who goes first
                    run_job(framework, seed, train, dev, model, args.train_rows)
                    summarize()
    print(render(summarize()))


if __name__ == "__main__":
    main()
