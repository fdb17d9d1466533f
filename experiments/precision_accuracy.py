"""What inference at bf16 and int8 costs in dev score: the same fine-tuned weights scored at each precision.

    python -m experiments.precision_accuracy --data ../shared/data \
        --model SST-2=runs/sst2/seed-1 --model MRPC=runs/mrpc/seed-1 --model STS-B=runs/stsb/seed-1 \
        [--model conll2003=runs/ner/seed-1] [--model squad=runs/squad/seed-1]

Each model is scored on its dev set (GLUE dev, CoNLL-2003 testa, SQuAD v1.1 dev) with the official
metric, at fp32, bf16 and int8 exactly as `bertforge predict --precision P` runs it, plus two bf16
variants that answer whether any part needs fp32 for accuracy: LayerNorm computed in fp32 (on fp32
copies of its weights; the residual stream stays bf16), and bf16 autocast (fp32 weights and residual
stream, matrix products in bf16). "points lost" is 100 x (fp32 score - score) for each of the task's
metrics, the largest over them; also given: the share of dev examples whose prediction changed and
the largest change of any output value (logit or regression score).

Results: experiments/results/precision_accuracy.json and the `precision-accuracy` section of
docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from experiments.common import RESULTS, machine, markdown_table, save_results, update_doc_section

FAMILY = {"conll2003": "ner", "squad": "squad", "v1.1": "squad"}
DEV_SPLIT = {"ner": "dev", "squad": "dev", "glue": "dev"}
REGRESSION = {"STS-B"}  # every score moves a little: "predictions changed" says nothing there
VARIANTS = ("fp32", "bf16", "int8", "bf16, fp32 LayerNorm", "bf16 autocast")
# Per task, the metrics the points-lost figure takes the worst of (all of a task's metrics otherwise).
HEADLINE = {"SST-2": ["accuracy"], "MRPC": ["accuracy", "f1"], "STS-B": ["pearson", "spearmanr"],
            "conll2003": ["f1"], "squad": ["exact_match", "f1"]}


def data_path(data: Path, family: str) -> Path:
    if family == "glue":
        return data / "glue"
    if family == "ner":
        return data / "conll2003"
    return data / "squad" / "dev-v1.1.from_explorer.json"


def model_dir(path: Path) -> Path:
    """A fine-tuned model directory, or a run directory holding seed-1/."""
    return path if (path / "config.json").exists() else path / "seed-1"


class Fp32LayerNorm(nn.Module):
    """A LayerNorm computed in fp32 on fp32 weights, its output cast back to its input's dtype."""

    def __init__(self, norm: nn.LayerNorm) -> None:
        super().__init__()
        self.norm = norm.float()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        return F.layer_norm(hidden.float(), norm.normalized_shape, norm.weight, norm.bias, norm.eps).to(hidden.dtype)


def with_fp32_layernorm(model: nn.Module) -> nn.Module:
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.LayerNorm):
                setattr(module, child_name, Fp32LayerNorm(child))
    return model


class Autocast(nn.Module):
    """The model under bf16 autocast: fp32 weights and residual stream, matrix products in bf16."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.model(*args, **kwargs)


def prepared(model_path: Path, job: str, variant: str) -> nn.Module:
    from bertforge.model import load_for_job
    from bertforge.precision import apply_precision

    model = load_for_job(model_path, job).eval()
    if variant == "bf16 autocast":
        return Autocast(model)
    precision = "bf16" if variant.startswith("bf16") else variant
    model, used = apply_precision(model, precision)
    assert used == precision
    return with_fp32_layernorm(model) if variant == "bf16, fp32 LayerNorm" else model


def score(task: str, path: Path, data: Path, max_examples: int | None) -> dict[str, Any]:
    from bertforge.model import label_names as config_label_names
    from bertforge.tasks import make_task
    from bertforge.tasks.base import run_model
    from bertforge.tokenizer import BertTokenizer

    family = FAMILY.get(task, "glue")
    task_file = path / "task.json"
    saved = json.loads(task_file.read_text(encoding="utf-8")) if task_file.exists() else {}
    spec = make_task(family, task, saved.get("settings", {}))
    tokenizer = BertTokenizer.from_pretrained(path)
    examples = spec.read(data_path(data, family), DEV_SPLIT[family])[:max_examples]
    max_length = saved.get("max_length") or spec.default_max_length
    outputs, metrics, predictions, seconds = {}, {}, {}, {}
    for variant in VARIANTS:
        model = prepared(path, spec.job, variant)
        labels = config_label_names(model.config if hasattr(model, "config") else model.model.config) or None
        features = spec.featurize(examples, tokenizer, max_length, label_names=labels)
        start = time.perf_counter()
        outputs[variant] = run_model(model, features, spec.output_names, token_outputs=spec.token_outputs,
                                     batch_size=64, pad_id=tokenizer.pad_token_id)
        seconds[variant] = time.perf_counter() - start
        predictions[variant] = spec.postprocess(examples, features, outputs[variant], label_names=labels)
        metrics[variant] = spec.metric(examples, predictions[variant])
        print(f"{task} {variant}: {metrics[variant]} ({seconds[variant]:.1f} s)", flush=True)
    headline = HEADLINE.get(task) or list(metrics["fp32"])
    row: dict[str, Any] = {"task": task, "model": str(path), "training": recorded_training(path),
                           "examples": len(examples), "metrics": metrics, "headline_metrics": headline, "seconds": seconds, "points_lost": {},
                           "changed_predictions": {}, "max_output_change": {}}
    for variant in VARIANTS[1:]:
        row["points_lost"][variant] = max(100 * (metrics["fp32"][m] - metrics[variant][m]) for m in headline)
        row["changed_predictions"][variant] = changed_share(predictions["fp32"], predictions[variant])
        row["max_output_change"][variant] = max(
            float(np.abs(a[name] - b[name]).max()) for a, b in zip(outputs["fp32"], outputs[variant], strict=True)
            for name in a)
    return row


def changed_share(reference: Any, other: Any) -> float | None:
    """The share of examples whose prediction differs at all; None for regression scores (all differ)."""
    if isinstance(reference, dict):  # SQuAD: id -> answer text
        return sum(reference[k] != other[k] for k in reference) / max(len(reference), 1)
    if reference and isinstance(reference[0], float):
        return None
    pairs = list(zip(reference, other, strict=True))
    return sum(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs) / max(len(pairs), 1)


def render(payload: dict[str, Any], command: str) -> str:
    info = payload["machine"]
    rows = []
    for row in payload["rows"]:
        for variant in VARIANTS:
            metrics = row["metrics"][variant]
            scores = ", ".join(f"{m} {100 * metrics[m]:.2f}" for m in row["headline_metrics"])
            lost = "" if variant == "fp32" else f"{row['points_lost'][variant]:+.2f}"
            share = None if row["task"] in REGRESSION else row["changed_predictions"].get(variant)
            changed = "" if variant == "fp32" else ("n/a (scores)" if share is None else f"{100 * share:.1f}%")
            biggest = "" if variant == "fp32" else f"{row['max_output_change'][variant]:.3f}"
            bound = "" if variant not in ("bf16", "int8") else (
                "met" if row["points_lost"][variant] <= 0.5 else f"missed by {row['points_lost'][variant] - 0.5:.2f}")
            rows.append([row["task"], row["examples"], variant, scores, lost, bound, changed, biggest])
    missing = payload.get("not_measured", [])
    note = ""
    if missing:
        note = "\nNot measured: " + "; ".join(missing) + ".\n"
    flags = ", ".join(info.get("cpu_flags", [])) or "none of them"
    table = markdown_table(["task", "dev examples", "precision", "score", "points lost", "<= 0.5 points",
                            "predictions changed", "largest output change"], rows)
    return f"""## Accuracy at bf16 and int8 inference

`{command}`. CPU: {info['cpu']} (flags of note: {flags}); torch {info['torch']}, torchao
{payload['torchao']}; {info['date']}. all-MiniLM-L6-v2 fine-tuned on each task (how, below the table),
then the same weights scored on dev at each precision with the official metric,
as `bertforge predict --precision P --split dev` does. "points lost" is 100 x (fp32 - this) for the
worse of the headline metrics (a negative value is a gain); the target is at most 0.5 points for
bf16 and int8. "predictions changed" is the share of dev examples whose predicted label (or score,
for STS-B) differs from fp32's at all; "largest output change" is the largest absolute change of any
logit or score. The two extra bf16 rows say whether any part needs fp32: LayerNorm computed in fp32
(the residual stream stays bf16) and bf16 autocast (fp32 weights and residual stream, bf16 matrix
products, the weights cast again on every call).
{note}
{table}

Models (all-MiniLM-L6-v2 fine-tuned with `bertforge finetune`, seed 1): {"; ".join(training_of(row) for row in payload['rows'])}.
"""


def recorded_training(path: Path) -> dict[str, Any] | None:
    """How a model was fine-tuned, from the run_config.yaml beside its seed directory: kept in the results,
    so that the section is rendered from them alone (the model directories are not in the repository)."""
    import yaml

    config_file = next((p / "run_config.yaml" for p in (path, path.parent) if (p / "run_config.yaml").exists()), None)
    if config_file is None:
        return None
    recipe = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    train, optim = recipe.get("train", {}), recipe.get("optim", {})
    return {"max_train_examples": train.get("max_train_examples"), "epochs": train.get("epochs"),
            "lr": optim.get("lr"), "max_length": train.get("max_length")}


def training_of(row: dict[str, Any]) -> str:
    """How a row's model was fine-tuned, as its results recorded it (rows saved before that: the path only)."""
    path, training = row["model"], row.get("training")
    if not training:
        return f"{row['task']}: `{path}`"
    examples = training["max_train_examples"]
    amount = f"a fixed random {examples:,} training examples" if examples else "the full training set"
    return (f"{row['task']}: {amount}, {training['epochs']} epoch(s), lr {training['lr']}, "
            f"max length {training['max_length'] or 'the task default'} (`{path}`)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--model", action="append", default=[], help="TASK=DIR (a fine-tuned model or run dir)")
    parser.add_argument("--not-measured", action="append", default=[], help="a line saying what was not measured")
    parser.add_argument("--max-examples", type=int, default=None, help="score only the first N dev examples")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--merge", action="store_true",
                        help="keep the saved rows of tasks not scored in this run (tasks can be run one by one)")
    parser.add_argument("--render-only", action="store_true", help="rewrite the docs section from the saved JSON")
    args = parser.parse_args()
    if args.render_only:
        payload = json.loads((RESULTS / "precision_accuracy.json").read_text(encoding="utf-8"))
        command = "python -m experiments.precision_accuracy " + " ".join(
            f"--model {row['task']}={row['model']}" for row in payload["rows"])
        update_doc_section("precision-accuracy", render(payload, command))
        return
    import torchao

    from bertforge.precision import cpu_description

    torch.set_num_threads(args.threads)
    rows = []
    for entry in args.model:
        task, _, directory = entry.partition("=")
        rows.append(score(task, model_dir(Path(directory)), args.data, args.max_examples))
    models = list(args.model)
    if args.merge and (RESULTS / "precision_accuracy.json").exists():
        saved = json.loads((RESULTS / "precision_accuracy.json").read_text(encoding="utf-8"))
        kept = [row for row in saved["rows"] if row["task"] not in {row["task"] for row in rows}]
        rows = kept + rows
        models = [f"{row['task']}={row['model']}" for row in rows]
    info = {**machine(), **cpu_description(), "load_average_1m_end": round(os.getloadavg()[0], 2)}
    payload = {"machine": info, "torchao": torchao.__version__, "rows": rows, "not_measured": args.not_measured}
    save_results("precision_accuracy", payload)
    command = "python -m experiments.precision_accuracy " + " ".join(f"--model {m}" for m in models)
    update_doc_section("precision-accuracy", render(payload, command))


if __name__ == "__main__":
    main()
