"""The BERT paper's fine-tuning procedure: a grid of settings, restarts per setting, the best chosen on dev.

    from bertforge.finetune import build_recipe
    from bertforge.search import search
    recipe = build_recipe("glue", options={"task": "RTE", "model": "models/minilm", "data": "data/glue",
                                           "seeds": [1, 2, 3], "holdout": 250})
    result = search(recipe, "runs/rte-search")              # the paper's grid, as many processes as cores
    result = search(recipe, "runs/rte-search", lrs=(1e-4, 5e-5), batch_sizes=(32,), epochs=(3,), jobs=1)

Devlin et al. (2019, section A.3) fine-tune with the learning rate in {5e-5, 4e-5, 3e-5, 2e-5}, the
batch size in {16, 32} and the epochs in {2, 3, 4}, and keep the configuration that scores best on
the dev set; on the small sets, BERT-large was restarted with several random seeds. `search` runs that
grid (or any given lists), each configuration once per seed of the recipe, as ordinary fine-tuning
runs (`bertforge.finetune.run_finetune`) each in its own directory, so a search that stops half way is
finished by the same call: a finished configuration's seeds are reused, never trained again, and an
interrupted one resumes from its newest checkpoint. Configurations run in parallel processes (`jobs`;
by default one per usable core, each with cores / jobs torch threads).

The choice: the configuration with the highest mean, over its seeds, of the task's main dev metric
(`results.json`'s `selection_metric`: the final model's, after the configuration's last epoch); the
first in grid order on a tie. Its best seed's model is the search's model: `OUT/model` links to that
`seed-N` directory, which `predict`, `pipeline()` and `serve` take as any fine-tuned model.

Choosing on dev flatters the chosen dev score: of 24 configurations, the luckiest on these 872 or 277
sentences wins. With the recipe's `holdout` N (or fraction), every configuration holds the same fixed
N training examples out of training and scores them as the split `holdout` (`split_holdout`); the
chosen configuration's hold-out score is then an estimate the choice did not see.

Files, in `out_dir`:

    configs/lr<LR>-bs<B>-ep<E>/   each configuration's fine-tuning run (seed-N/, results.json, ...)
    model                         a link to the chosen configuration's best seed (a copy where links fail)
    search.json                   the grid, every configuration's dev mean / std / values over seeds (and
                                  hold-out figures), the chosen one and how it was chosen
    search.md                     the same as a markdown table
    run_config.yaml               the search's base recipe (the grid replaces its lr, batch size, epochs)
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge import threads
from bertforge.fileio import run_lock, write_text_atomic
from bertforge.finetune import HOLDOUT_SPLIT, FinetuneRecipe, run_finetune
from bertforge.recipe import RUN_CONFIG_FILE
from bertforge.recipe import override as recipe_override
from bertforge.recipe import save as save_recipe

# the paper's grid (Devlin et al. 2019, A.3)
PAPER_LRS = (5e-5, 4e-5, 3e-5, 2e-5)
PAPER_BATCH_SIZES = (16, 32)
PAPER_EPOCHS = (2.0, 3.0, 4.0)
CONFIGS_DIR = "configs"
MODEL_LINK = "model"
SEARCH_JSON = "search.json"
SEARCH_MD = "search.md"


class SearchError(RuntimeError):
    """Configurations of a search that failed; the others' results are written, and a rerun retries them."""


class DiskSpaceWarning(UserWarning):
    """A search whose models will not fit on the disk it writes to."""


@dataclass(frozen=True)
class Configuration:
    """One point of the grid."""

    lr: float
    batch_size: int
    epochs: float

    @property
    def name(self) -> str:
        """Its directory under configs/: lr5e-05-bs16-ep2."""
        return f"lr{self.lr:g}-bs{self.batch_size}-ep{self.epochs:g}"


def grid(lrs: Sequence[float] = PAPER_LRS, batch_sizes: Sequence[int] = PAPER_BATCH_SIZES,
         epochs: Sequence[float] = PAPER_EPOCHS) -> list[Configuration]:
    """Every combination, learning rate outermost, in the order given; duplicates dropped."""
    for name, values in (("learning rates", lrs), ("batch sizes", batch_sizes), ("epochs", epochs)):
        if not values:
            raise ValueError(f"search: no {name} given")
        if any(v <= 0 for v in values):
            raise ValueError(f"search: {name} must be positive, got {', '.join(map(str, values))}")
    if any(float(b) != int(b) for b in batch_sizes):
        raise ValueError(f"search: batch sizes must be whole numbers, got {', '.join(map(str, batch_sizes))}")
    found = [Configuration(float(lr), int(b), float(e)) for lr, b, e in itertools.product(lrs, batch_sizes, epochs)]
    return list(dict.fromkeys(found))


def default_jobs(recipe: FinetuneRecipe, runs: int) -> int:
    """Processes to run at once: one per usable core on the CPU (at most one per configuration); one on a GPU,
    which the processes would otherwise share."""
    device = recipe.train.device or ""
    if device.startswith("cuda") or (not device and _cuda_visible()):
        return 1
    return max(1, min(threads.usable_cores(), runs))


def _cuda_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def search(recipe: FinetuneRecipe, out_dir: str | Path, *, lrs: Sequence[float] = PAPER_LRS,
           batch_sizes: Sequence[int] = PAPER_BATCH_SIZES, epochs: Sequence[float] = PAPER_EPOCHS,
           jobs: int | None = None, overwrite: bool = False, progress: bool = False,
           verbose: bool = True) -> dict[str, Any]:
    """Fine-tune `recipe` once per configuration of the grid (and per seed of the recipe), choose the
    best on the dev metric (mean over seeds) and link its best seed as `out_dir/model`; returns (and
    writes) search.json's content. See the module docstring.

    `jobs` processes run configurations at once (None: `default_jobs`); with 1 they run in this
    process, one after another. `overwrite` clears every configuration's earlier run first. A
    configuration that fails does not stop the others: once they are done, `SearchError` names it.
    """
    out_dir = Path(out_dir)
    configurations = grid(lrs, batch_sizes, epochs)
    jobs = jobs or default_jobs(recipe, len(configurations))
    if jobs < 1:
        raise ValueError(f"search: jobs must be at least 1, got {jobs}")
    started = time.perf_counter()
    with run_lock(out_dir, what="search"):
        if overwrite:
            for path in (out_dir / CONFIGS_DIR, out_dir / MODEL_LINK, out_dir / SEARCH_JSON, out_dir / SEARCH_MD):
                _remove(path)
        header = (f"bertforge search {recipe.family} --config {out_dir / RUN_CONFIG_FILE} --lr "
                  f"{','.join(f'{v:g}' for v in lrs)} --batch-size {','.join(map(str, batch_sizes))} --epochs "
                  f"{','.join(f'{v:g}' for v in epochs)} --out {out_dir} repeats this search")
        out_dir.mkdir(parents=True, exist_ok=True)
        save_recipe(recipe, out_dir / RUN_CONFIG_FILE, header=header)
        runs = {c: recipe_override(recipe, {"lr": c.lr, "batch_size": c.batch_size, "epochs": c.epochs},
                                   source="search") for c in configurations}
        to_run = [c for c in configurations if not (out_dir / CONFIGS_DIR / c.name / "results.json").exists()]
        warn_if_short_of_disk(recipe, len(to_run), out_dir)
        results, failures = _run_all(runs, out_dir / CONFIGS_DIR, jobs, progress=progress, verbose=verbose)
        summary = _summarize(recipe, configurations, results, failures, out_dir, lrs, batch_sizes, epochs, jobs)
        summary["wall_s"] = round(time.perf_counter() - started, 1)
        write_text_atomic(out_dir / SEARCH_JSON, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        write_text_atomic(out_dir / SEARCH_MD, markdown(summary) + "\n")
    if failures:
        names = "; ".join(f"{c.name}: {message}" for c, message in failures.items())
        raise SearchError(f"{len(failures)} of {len(configurations)} configuration(s) failed ({names}); the others' "
                          f"results are in {out_dir / SEARCH_JSON}, and rerunning the search retries only these")
    return summary


def saved_model_bytes(model_dir: str | Path) -> int:
    """About what one fine-tuned copy of `model_dir` takes on disk: its weights in float32, counted from
    the safetensors headers (no weights read); 0 where there are none to count."""
    total = 0
    for path in Path(model_dir).glob("*.safetensors"):
        with path.open("rb") as handle:
            header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
        total += sum(4 * math.prod(tensor["shape"]) for name, tensor in header.items() if name != "__metadata__")
    return total


def warn_if_short_of_disk(recipe: FinetuneRecipe, configurations: int, out_dir: Path) -> None:
    """Warn before training when the models the configurations still to run will keep (one per seed, two
    with best/ copies) need more than the free space where they go: a full disk stops the search hours in."""
    per_seed = saved_model_bytes(recipe.model) if recipe.model and Path(recipe.model).is_dir() else 0
    copies = 2 if recipe.train.save_best else 1
    needed = per_seed * copies * len(recipe.seeds) * configurations
    free = shutil.disk_usage(out_dir).free
    if needed > free:
        warnings.warn(f"search: the {configurations} configuration(s) still to run keep about {needed / 1e9:.1f} GB "
                      f"of models ({per_seed / 1e6:.0f} MB per seed x {len(recipe.seeds)} seed(s)"
                      f"{', twice with best/ copies' if copies == 2 else ''}), more than the {free / 1e9:.1f} GB "
                      f"free under {out_dir}"
                      f"{'; --no-save-best halves it' if copies == 2 else ''}", DiskSpaceWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------------
# running the configurations
# ------------------------------------------------------------------------------------------------
def _run_all(runs: dict[Configuration, FinetuneRecipe], root: Path, jobs: int, *, progress: bool,
             verbose: bool) -> tuple[dict[Configuration, dict[str, Any]], dict[Configuration, str]]:
    """Each configuration's results.json content, and the error of each that failed."""
    results: dict[Configuration, dict[str, Any]] = {}
    failures: dict[Configuration, str] = {}
    total = len(runs)

    def done(config: Configuration, result: dict[str, Any] | None, error: BaseException | None) -> None:
        if error is not None:
            failures[config] = f"{type(error).__name__}: {error}"
            _say(f"[{len(results) + len(failures)}/{total}] {config.name}: failed ({error})", verbose)
            return
        assert result is not None
        results[config] = result
        metric = result["selection_metric"]
        row = result["summary"].get(metric, {})
        _say(f"[{len(results) + len(failures)}/{total}] {config.name}: dev {metric} "
             f"{row.get('mean', float('nan')):.4f} ± {row.get('std', float('nan')):.4f} over "
             f"{len(result['seeds'])} seed(s)", verbose)

    if jobs == 1:
        for config, recipe in runs.items():
            try:
                result = run_finetune(recipe, root / config.name, progress=progress, verbose=verbose)
            except Exception as exc:  # reported with the others once every configuration has run
                done(config, None, exc)
            else:
                done(config, result, None)
        return results, failures

    import multiprocessing

    # spawn, not fork: a forked child would inherit torch's thread pools and any locks held mid-operation
    per_job = max(1, threads.usable_cores() // jobs)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_worker, initargs=(per_job,)) as pool:
        futures: dict[Future[dict[str, Any]], Configuration] = {
            pool.submit(run_finetune, recipe, root / config.name, progress=False, verbose=False): config
            for config, recipe in runs.items()}
        for future in as_completed(futures):
            error = future.exception()
            done(futures[future], None if error is not None else future.result(), error)
    return results, failures


def _start_worker(torch_threads: int) -> None:
    """A worker process's thread count: its share of the cores, fixed (before torch loads where it can)."""
    os.environ[threads.THREADS_ENV] = str(torch_threads)
    os.environ["OMP_NUM_THREADS"] = str(torch_threads)
    threads.short_spin_wait()
    threads.install(torch_threads)

    import torch

    torch.set_num_threads(torch_threads)


def _say(message: str, verbose: bool) -> None:
    if verbose:
        print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# the choice and the table
# ------------------------------------------------------------------------------------------------
def _summarize(recipe: FinetuneRecipe, configurations: list[Configuration],
               results: dict[Configuration, dict[str, Any]], failures: dict[Configuration, str], out_dir: Path,
               lrs: Sequence[float], batch_sizes: Sequence[int], epochs: Sequence[float], jobs: int) -> dict[str, Any]:
    rows = []
    metric = next((r["selection_metric"] for r in results.values()), None)
    for config in configurations:
        row: dict[str, Any] = {"name": config.name, "lr": config.lr, "batch_size": config.batch_size,
                               "epochs": config.epochs, "dir": f"{CONFIGS_DIR}/{config.name}"}
        if config in failures:
            rows.append({**row, "error": failures[config]})
            continue
        result = results[config]
        values = [float(s["metrics"][metric]) for s in result["seeds"] if metric in s["metrics"]]
        best = max(range(len(values)), key=values.__getitem__) if values else None
        row.update({"seeds": [s["seed"] for s in result["seeds"]], "values": values,
                    "mean": statistics.fmean(values) if values else None,
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "best_seed": result["seeds"][best]["seed"] if best is not None else None,
                    "steps": result["seeds"][0]["steps"] if result["seeds"] else None})
        held = {key[len(HOLDOUT_SPLIT) + 1:]: {"mean": value["mean"], "std": value["std"], "values": value["values"]}
                for key, value in result["summary"].items() if key.startswith(f"{HOLDOUT_SPLIT}_")}
        if held:
            row["holdout"] = held
        rows.append(row)

    scored = [row for row in rows if row.get("mean") is not None]
    chosen = max(scored, key=lambda row: row["mean"]) if scored else None  # max keeps the first of equals
    summary: dict[str, Any] = {
        "family": recipe.family, "task": recipe.task, "model": recipe.model, "metric": metric,
        "selection": (f"the configuration with the highest mean over its seeds of the final model's dev {metric}; "
                      "its seed with the highest dev score is the search's model"),
        "grid": {"lr": list(lrs), "batch_size": list(batch_sizes), "epochs": list(epochs)},
        "seeds": list(recipe.seeds), "holdout": recipe.train.holdout, "jobs": jobs,
        "configurations": rows, "chosen": None,
    }
    if chosen is not None:
        model_dir = f"{chosen['dir']}/seed-{chosen['best_seed']}"
        _link_model(out_dir, model_dir)
        summary["chosen"] = {**chosen, "model": MODEL_LINK, "model_dir": model_dir}
    return summary


def _link_model(out_dir: Path, target: str) -> None:
    """Point out_dir/model at `target` (relative, so the search directory can move), replaced atomically;
    a copy where the filesystem has no links."""
    link = out_dir / MODEL_LINK
    staging = out_dir / f".{MODEL_LINK}.tmp"
    _remove(staging)
    try:
        os.symlink(target, staging, target_is_directory=True)
    except OSError:
        shutil.copytree(out_dir / target, staging, symlinks=True)
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)  # an earlier copy: os.replace cannot replace a directory with a link
    os.replace(staging, link)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def markdown(summary: dict[str, Any]) -> str:
    """search.md: every configuration's dev score, the chosen one in bold, and its hold-out score."""
    metric = summary["metric"] or "metric"
    has_holdout = any("holdout" in row for row in summary["configurations"])
    lines = [f"# Search: {summary['family']} {summary['task'] or ''} from {summary['model']}".rstrip(), "",
             f"Dev {metric}, mean ± std over seeds {', '.join(map(str, summary['seeds']))} (the final model of each "
             "run). Chosen: the highest mean; its best seed is the search's model.", "",
             "| lr | batch | epochs | dev " + metric + " | per seed | best seed |", "|---|---|---|---|---|---|"]
    chosen = (summary.get("chosen") or {}).get("name")
    for row in summary["configurations"]:
        if "error" in row:
            score, seeds, best = f"failed: {row['error'][:80]}", "", ""
        else:
            score = _mean_std(row["mean"], row["std"])
            seeds = ", ".join(f"{v:.4f}" for v in row["values"])
            best = str(row["best_seed"])
        if row["name"] == chosen:
            score = f"**{score}** (chosen)"
        lines.append(f"| {row['lr']:g} | {row['batch_size']} | {row['epochs']:g} | {score} | {seeds} | {best} |")
    if summary.get("chosen"):
        picked = summary["chosen"]
        lines += ["", f"Chosen: {picked['name']} ({_mean_std(picked['mean'], picked['std'])} on dev, "
                      f"the best of {len(summary['configurations'])}: a score the choosing flatters); model: "
                      f"`{picked['model']}` -> `{picked['model_dir']}`."]
        if picked.get("holdout"):
            held = picked["holdout"].get(metric) or next(iter(picked["holdout"].values()))
            name = metric if metric in picked["holdout"] else next(iter(picked["holdout"]))
            lines.append(f"Hold-out {name} of the chosen configuration (training examples no configuration "
                         f"trained on, unseen by the choice): {_mean_std(held['mean'], held['std'])}.")
    elif has_holdout:
        lines += ["", "No configuration finished."]
    return "\n".join(lines)


def _mean_std(mean: float | None, std: float | None) -> str:
    return "n/a" if mean is None else f"{mean:.4f} ± {std or 0.0:.4f}"


__all__ = ["CONFIGS_DIR", "MODEL_LINK", "PAPER_BATCH_SIZES", "PAPER_EPOCHS", "PAPER_LRS", "SEARCH_JSON",
           "SEARCH_MD", "Configuration", "SearchError", "default_jobs", "grid", "markdown", "search"]
