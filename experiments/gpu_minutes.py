"""A small BERT pre-trained on a GPU for a fixed number of minutes: held-out masked-LM accuracy against
training minutes, then GLUE fine-tuning from it beside its random twin (same architecture, vocabulary
and fine-tuning, BERT's random initialisation).

    python -m experiments.gpu_minutes --data DATA --minutes 2 [--preset mini] [--tasks MRPC,SST-2]
    python -m experiments.gpu_minutes --render experiments/results/gpu_minutes.json   # the doc section again

DATA is a `bertforge prepare` output (the study used the shared Gutenberg books and WikiText-2's valid
and test text, BERT's uncased vocabulary, sentence-order prediction, dynamic masking, two pairings,
128 tokens, 1% held out). Each budget is one `pretrain` run with `budget_minutes` (warm-up and decay
fitted to the time, no dropout while pre-training), bf16 autocast, large batches; the run's own
validation records give the accuracy curve. Each task is then fine-tuned from the pre-trained model
and from its random twin with the same settings, once per seed, and scored on the dev split.
Results: experiments/results/gpu_minutes.json and the `gpu-minutes` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from experiments.common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section

SHARED = ROOT.parent / "shared" / "data"
# Per task: the metric read, and the fine-tuning settings (a small model takes a larger rate than
# BERT-base's 2e-5..5e-5; SST-2's 67k rows get one epoch at a larger batch).
TASKS = {"MRPC": {"metric": "f1", "lr": 2e-4, "batch_size": 32, "epochs": 3.0},
         "SST-2": {"metric": "accuracy", "lr": 2e-4, "batch_size": 64, "epochs": 1.0},
         "RTE": {"metric": "accuracy", "lr": 2e-4, "batch_size": 32, "epochs": 3.0}}


def pretrain_for(minutes: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bertforge.pretrain import pretrain
    from bertforge.train.log import read_metrics

    run = work / f"{args.preset}-{minutes:g}min"
    started = time.perf_counter()
    result = pretrain(args.preset, args.data, run, max_steps=10**7, budget_minutes=minutes, resume=True,
                      precision=args.precision, batch_size=args.batch_size, lr=args.lr, warmup_ratio=0.06,
                      eval_every=args.eval_every, eval_batch_size=256, eval_max_batches=args.eval_batches,
                      save_every_minutes=max(1.0, minutes / 2), keep_last=1, num_workers=args.workers,
                      progress=False)
    records = read_metrics(run)
    evals = [r for r in records if r.get("split") == "eval"]
    trained = [r for r in records if r.get("split") == "train"]
    steps = result.train.step
    seconds = result.train.train_seconds or minutes * 60
    curve = [{"step": r["step"], "minutes": round(r["step"] / max(steps, 1) * seconds / 60, 2),
              **{k: r[k] for k in ("mlm_accuracy", "mlm_loss", "sop_accuracy", "nsp_accuracy") if k in r}}
             for r in evals]
    tokens = trained[-1].get("tokens") if trained else None
    return {"minutes": minutes, "run": str(run), "final": str(result.final), "steps": steps,
            "train_seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds if tokens else None,
            "wall_seconds": round(time.perf_counter() - started, 1), "curve": curve,
            "final_eval": curve[-1] if curve else None}


def finetune_task(task: str, model_dir: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    from bertforge.finetune import finetune

    spec = TASKS[task]
    started = time.perf_counter()
    results = finetune("glue", task, model_dir, args.glue, out, seeds=tuple(args.seeds), lr=spec["lr"],
                       batch_size=spec["batch_size"], epochs=spec["epochs"], max_length=128,
                       eval_every_epoch=False, save_best=False, progress=False, verbose=False,
                       precision=args.precision, max_train_examples=args.max_train_examples)
    values = [100 * value for value in results["summary"][spec["metric"]]["values"]]
    return {"metric": spec["metric"], "values": values, "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "seconds": round(time.perf_counter() - started, 1), "settings": spec}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every budget, then its tasks; the payload is written after each step (`--json`), so a run stopped
    by a time limit keeps what it finished."""
    from bertforge.pretrain import random_init_like

    work = args.work
    payload = {"machine": machine(), "preset": args.preset, "data": str(args.data), "batch_size": args.batch_size,
               "lr": args.lr, "precision": args.precision, "seeds": args.seeds, "budgets": [],
               "command": args.command}
    for minutes in args.minutes:
        pretrained = pretrain_for(minutes, args, work)
        budget = {**pretrained, "tasks": {}}
        payload["budgets"].append(budget)
        save(payload, args)
        twin = random_init_like(pretrained["final"], work / f"{args.preset}-{minutes:g}min-random", seed=0)
        for task in args.tasks:
            budget["tasks"][task] = {"pretrained": finetune_task(task, Path(pretrained["final"]),
                                                                 work / f"ft-{minutes:g}-{task}", args),
                                     "random": finetune_task(task, twin, work / f"ft-{minutes:g}-{task}-random", args)}
            save(payload, args)
            print(json.dumps({"task": task, "minutes": minutes,
                              **{k: round(v["mean"], 2) for k, v in budget["tasks"][task].items()}}), flush=True)
    return payload


def save(payload: dict[str, Any], args: argparse.Namespace) -> None:
    if args.json:
        args.json.write_text(json.dumps(payload, indent=2))


def unique_steps(curve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per tenth of a minute shown (the run's last evaluation comes a few steps after the one before)."""
    return list({round(point["minutes"], 1): point for point in curve}.values())


def verdict(payload: dict[str, Any]) -> str:
    parts = []
    for budget in payload["budgets"]:
        for task, starts in budget["tasks"].items():
            ours, twin = starts["pretrained"], starts["random"]
            above = sum(all(value > other for other in twin["values"]) for value in ours["values"])
            beyond = "beyond the seed spread" if above == len(ours["values"]) else "within the seed spread"
            parts.append(f"{task} {ours['mean'] - twin['mean']:+.1f} after {budget['minutes']:g} minutes ({beyond}: "
                         f"{above} of {len(ours['values'])} seeds above every twin seed)")
    return "Verdict: " + "; ".join(parts) + "."


def render(payload: dict[str, Any]) -> str:
    rows = []
    for budget in payload["budgets"]:
        final = budget["final_eval"] or {}
        for task, starts in budget["tasks"].items():
            ours, twin = starts["pretrained"], starts["random"]
            above = sum(all(value > other for other in twin["values"]) for value in ours["values"])
            rows.append([f"{budget['minutes']:g}", f"{budget['steps']:,}",
                         f"{budget['tokens_per_s']:,.0f}" if budget.get("tokens_per_s") else "?",
                         f"{100 * final.get('mlm_accuracy', float('nan')):.1f}", task,
                         f"{ours['mean']:.1f} ± {ours['std']:.1f}", f"{twin['mean']:.1f} ± {twin['std']:.1f}",
                         f"{ours['mean'] - twin['mean']:+.1f}", f"{above} of {len(ours['values'])}"])
    header = ["minutes", "steps", "tokens/s", "held-out MLM acc. %", "task", "pre-trained", "random twin",
              "difference", "seeds above every twin seed"]
    curves = "; ".join(
        f"{b['minutes']:g} min: " + ", ".join(f"{p['minutes']:.1f} min {100 * p['mlm_accuracy']:.1f}%"
                                              for p in unique_steps(b["curve"]) if "mlm_accuracy" in p)
        for b in payload["budgets"])
    return f"""## BERT-{payload['preset']} pre-trained for minutes on a GPU

`{payload['command']}`

{machine_line(payload['machine'])}

Pre-training: the shared Gutenberg books and WikiText-2 text, BERT's uncased vocabulary, masked LM with
sentence-order prediction, dynamic masking, 128 tokens, {payload['precision']} autocast, batch
{payload['batch_size']}, peak rate {payload['lr']:g}, warm-up and linear decay fitted to the minutes,
no dropout while pre-training. Fine-tuning (dev scores, seeds {", ".join(map(str, payload['seeds']))}):
each task from the pre-trained model and from its random twin with the same settings (MRPC: F1).

{markdown_table(header, rows)}

Held-out masked-LM accuracy along each run: {curves}.

{verdict(payload)}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path)
    parser.add_argument("--minutes", default="2", help="pre-training budgets in minutes, comma-separated")
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--eval-batches", type=int, default=20)
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers for pre-training")
    parser.add_argument("--tasks", default="MRPC,SST-2")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--max-train-examples", type=int, default=0, help="0: the whole training split")
    parser.add_argument("--glue", type=Path, default=SHARED / "glue")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gpu-minutes")
    parser.add_argument("--json", type=Path, help="also write the payload here")
    parser.add_argument("--render", type=Path, help="rewrite the doc section from a saved payload and stop")
    args = parser.parse_args()
    if args.render:
        payload = json.loads(args.render.read_text())
        save_results("gpu_minutes", payload)
        update_doc_section("gpu-minutes", render(payload))
        print(render(payload))
        return
    args.command = ("python -m experiments.gpu_minutes --data DATA " + f"--minutes {args.minutes} --preset {args.preset} "
                    f"--batch-size {args.batch_size} --lr {args.lr:g} --tasks {args.tasks} --seeds {args.seeds}")
    args.minutes = [float(m) for m in args.minutes.split(",")]
    args.tasks = args.tasks.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    print(render(run(args)))


if __name__ == "__main__":
    main()
