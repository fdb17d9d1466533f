"""ELECTRA's replaced-token detection against masked LM at one size, one data set and one wall clock.

    python -m experiments.electra_vs_mlm --data runs/electra-vs-mlm/data128 --budget-min 20

Both runs train the same encoder: ELECTRA-Small's width (H=256, 4 heads, feed-forward 1024, embedding
tables E=128 projected to H) at 4 layers, the same 16,000-piece tokenizer and data (prepared with
`--objective none --masking dynamic`: the shared books + WikiText-2 valid; WikiText-2 test held out),
15% of the tokens masked, AdamW lr 1e-3 with 60 warm-up steps and linear decay, batch 32, fp32, one
thread. They differ in the objective only:

- masked LM: the encoder predicts the masked tokens (ELECTRA's masked-LM head, tied to the embeddings);
- replaced-token detection (objective rtd): a generator a quarter as wide, sharing the embedding tables,
  fills the masked places with sampled tokens, and the encoder (the discriminator) says for every token
  whether it is the original; loss = generator MLM + 50 x discriminator.

The encoder fine-tuned afterwards has the same parameters either way (the generator and the heads are
dropped). Each run gets the same wall-clock budget: a 40-step calibration run measures its seconds per
step and its step count is set so that its schedule ends at the budget (an rtd step also runs the
generator, so it gets fewer steps). Then SST-2 and MRPC are fine-tuned from each checkpoint and from
the architecture's random initialisation, with the same seeds and settings. Results:
experiments/results/electra_vs_mlm.json and the `electra-vs-mlm` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

from experiments.common import (
    RESULTS,
    ROOT,
    machine,
    machine_line,
    markdown_table,
    save_results,
    update_doc_section,
)
from experiments.modern_vs_bert import calibration, records
from experiments.pretrain_vs_scratch import mean_std

MODEL = {"preset": "electra-small-discriminator", "num_hidden_layers": 4}
SHARED = {
    "data": {"batch_size": 32, "eval_batch_size": 128, "eval_max_batches": 8, "mask_rate": 0.15},
    "optim": {"optimizer": "adamw", "lr": 1.0e-3, "weight_decay": 0.01, "warmup_steps": 60, "schedule": "linear"},
    "train": {"precision": "fp32", "keep_last": 1, "log_every": 10, "progress": False},
}
# The objective each run adds to SHARED["data"]: the data's own (masked LM alone) or replaced-token detection.
OBJECTIVES = {
    "MLM": {},
    "ELECTRA (rtd)": {"objective": "rtd", "generator_size": 0.25, "discriminator_weight": 50.0},
}
CALIBRATION_STEPS = 40
EVALUATIONS = 10
TASKS = {"SST-2": "accuracy", "MRPC": "f1"}  # the metric each task's table leads with


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-").replace("--", "-")


def recipe(name: str, vocab_size: int, max_steps: int, evaluations: int = EVALUATIONS) -> dict[str, Any]:
    shared = json.loads(json.dumps(SHARED))
    shared["data"].update(OBJECTIVES[name])
    every = max(max_steps // evaluations, 1)
    shared["train"].update(max_steps=max_steps, eval_every=every, save_every=every)
    return {"model": {**MODEL, "vocab_size": vocab_size}, **shared, "source": f"experiments/electra_vs_mlm.py ({name})"}


HELD_OUT = ("mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy_replaced", "rtd_accuracy_original",
            "replaced_fraction")


def curve(run: Path) -> list[dict[str, Any]]:
    """Held-out points with the minutes since the run started (its own clock, evaluations included)."""
    rows = records(run)
    start = next(r["time"] for r in rows if r.get("split") in ("run", "train"))
    return [{"step": r["step"], "minutes": round((r["time"] - start) / 60, 2),
             **{key: r[key] for key in HELD_OUT if key in r}}
            for r in rows if r.get("split") == "eval"]


def pretrain_one(name: str, data: Path, work: Path, budget_s: float, vocab_size: int) -> dict[str, Any]:
    from bertforge.pretrain import pretrain, recipe_from_dict

    run = work / f"{slug(name)}-pretrain"
    if (run / "final" / "config.json").exists() and (run / "study.json").exists():
        return json.loads((run / "study.json").read_text())
    probe = work / f"{slug(name)}-calibration"
    shutil.rmtree(probe, ignore_errors=True)
    pretrain(recipe_from_dict(recipe(name, vocab_size, CALIBRATION_STEPS, evaluations=1)), data, probe)
    step_s, eval_s = calibration(probe)
    steps = max(int((budget_s - EVALUATIONS * eval_s) / step_s), EVALUATIONS)
    print(f"{name}: {step_s:.3f} s/step, {eval_s:.1f} s per evaluation -> {steps} steps", flush=True)
    shutil.rmtree(probe, ignore_errors=True)
    started = time.time()
    pretrain(recipe_from_dict(recipe(name, vocab_size, steps)), data, run)
    facts = {"calibrated_step_s": round(step_s, 4), "calibrated_eval_s": round(eval_s, 2), "steps": steps,
             "wall_s": round(time.time() - started, 1), "curve": curve(run), "recipe": recipe(name, vocab_size, steps)}
    (run / "study.json").write_text(json.dumps(facts, indent=2))
    return facts


def encoder_parameters(checkpoint: Path) -> int:
    """Parameters of the encoder that fine-tuning starts from (no pre-training heads, no generator)."""
    from bertforge.model.auto import load_for_job

    model = load_for_job(checkpoint, "embeddings")
    return sum(p.numel() for p in model.parameters())


def finetune_all(starts: dict[str, Path], glue: Path, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from bertforge.finetune import finetune

    results: dict[str, Any] = {}
    for task in TASKS:
        for label, model_dir in starts.items():
            out = work / f"{task.lower()}-{slug(label)}"
            summary = finetune("glue", task, model_dir, glue, out, seeds=args.seeds, lr=args.lr, epochs=args.epochs,
                               max_train_examples=args.train_examples if task == "SST-2" else None,
                               max_length=args.max_length, progress=False, verbose=True)
            wall_s = sum(seed["wall_s"] or 0.0 for seed in summary["seeds"])
            metrics = {key: summary["summary"][key] for key in ("accuracy", "f1") if key in summary["summary"]}
            results.setdefault(task, {})[label] = {**metrics, "wall_s": round(wall_s, 1)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="prepared shards (--objective none --masking dynamic)")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "electra-vs-mlm")
    parser.add_argument("--glue", type=Path, default=ROOT.parent / "shared" / "data" / "glue")
    parser.add_argument("--budget-min", type=float, default=20.0, help="pre-training wall clock per objective")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--train-examples", type=int, default=6000, help="SST-2 sentences (MRPC uses all 3,668 pairs)")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved results")
    args = parser.parse_args()
    if args.summarize:
        payload = json.loads((RESULTS / "electra_vs_mlm.json").read_text())
        payload.setdefault("majority", majority_baselines(args.glue))
        save_results("electra_vs_mlm", payload)
        plot_curves(payload)
        print(write_section(payload))
        return
    import torch

    from bertforge.pretrain import random_init_like

    torch.set_num_threads(args.threads)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    vocab_size = json.loads((args.data / "dataset.json").read_text())["tokenizer"]["vocab_size"]
    runs = {name: pretrain_one(name, args.data, args.work, 60 * args.budget_min, vocab_size) for name in OBJECTIVES}
    starts = {f"{name} pre-trained": args.work / f"{slug(name)}-pretrain" / "final" for name in OBJECTIVES}
    first = next(iter(starts.values()))
    starts["random weights"] = random_init_like(first, args.work / "random", seed=0)
    scores = finetune_all(starts, args.glue, args.work, args)
    payload = {"machine": machine(), "budget_min": args.budget_min, "threads": args.threads, "runs": runs,
               "encoder_parameters": {label: encoder_parameters(path) for label, path in starts.items()},
               "finetune": scores, "train_examples": args.train_examples, "lr": args.lr, "epochs": args.epochs,
               "max_length": args.max_length, "seeds": args.seeds, "majority": majority_baselines(args.glue)}
    save_results("electra_vs_mlm", payload)
    plot_curves(payload)
    print(write_section(payload))


CURVES = RESULTS / "img" / "electra_vs_mlm_curves.png"


def plot_curves(payload: dict[str, Any]) -> None:
    """Held-out figures against minutes: each objective's own task (the figure it is trained to improve)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    mlm, rtd = payload["runs"]["MLM"]["curve"], payload["runs"]["ELECTRA (rtd)"]["curve"]
    axis.plot([p["minutes"] for p in mlm], [100 * p["mlm_accuracy"] for p in mlm], marker="o",
              label="MLM run: masked-token accuracy")
    axis.plot([p["minutes"] for p in rtd], [100 * p["mlm_accuracy"] for p in rtd], marker="s",
              label="ELECTRA run: its generator's masked-token accuracy")
    axis.plot([p["minutes"] for p in rtd], [100 * p["rtd_accuracy_replaced"] for p in rtd], marker="^",
              label="ELECTRA run: replaced tokens detected")
    axis.set_xlabel("pre-training wall clock (minutes, one core)")
    axis.set_ylabel("held-out figure (%)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    CURVES.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(CURVES, dpi=120)
    plt.close(figure)


def write_section(payload: dict[str, Any]) -> str:
    text = render(payload)
    update_doc_section("electra-vs-mlm", text)
    return text


def _percent(point: dict[str, Any], key: str) -> str:
    return f"{100 * point[key]:.1f}" if key in point else "-"


def render(payload: dict[str, Any]) -> str:
    runs, scores = payload["runs"], payload["finetune"]
    setup = [[name, f"{runs[name]['calibrated_step_s']:.3f}", runs[name]["steps"], f"{runs[name]['wall_s'] / 60:.1f}"]
             for name in runs]
    mlm, rtd = runs["MLM"]["curve"], runs["ELECTRA (rtd)"]["curve"]
    curve_rows = []
    for index in range(max(len(mlm), len(rtd))):
        row: list[Any] = []
        row += [f"{mlm[index]['minutes']:.1f}", _percent(mlm[index], "mlm_accuracy")] if index < len(mlm) else ["-", "-"]
        row += ([f"{rtd[index]['minutes']:.1f}", _percent(rtd[index], "mlm_accuracy"),
                 _percent(rtd[index], "rtd_accuracy_replaced"), _percent(rtd[index], "rtd_accuracy_original")]
                if index < len(rtd) else ["-"] * 4)
        curve_rows.append(row)
    finetune_rows = []
    baseline = payload.get("majority")
    if baseline:
        finetune_rows.append(["(the commonest label everywhere)", f"{100 * baseline['SST-2']['accuracy']:.1f}",
                              f"{100 * baseline['MRPC']['f1']:.1f}", f"{100 * baseline['MRPC']['accuracy']:.1f}", "-"])
    for label in next(iter(scores.values())):
        sst2, mrpc = scores["SST-2"][label], scores["MRPC"][label]
        finetune_rows.append([label, mean_std(sst2["accuracy"]), mean_std(mrpc["f1"]), mean_std(mrpc["accuracy"]),
                              f"{(sst2['wall_s'] + mrpc['wall_s']) / 60:.0f}"])
    parameters = payload["encoder_parameters"]
    return "\n".join([
        "### ELECTRA's replaced-token detection against masked LM at one budget",
        "",
        f"`python -m experiments.electra_vs_mlm --data DATA --budget-min {payload['budget_min']:g}` (DATA prepared "
        "as in the script's docstring). One encoder, ELECTRA-Small's width at 4 layers (H=256, 4 heads, "
        f"feed-forward 1024, embeddings E=128; {next(iter(parameters.values())) / 1e6:.2f} M parameters as fine-tuned, "
        "the same for both), the same 16,000-piece tokenizer and data (the shared books + WikiText-2 valid, "
        "128-token sequences; WikiText-2 test held out, the same 1,024 masked sequences scored at every "
        "evaluation), 15% of the tokens masked, AdamW lr 1e-3 (60 warm-up steps, linear decay), batch 32, fp32, "
        f"one torch thread, and the same {payload['budget_min']:g}-minute pre-training budget: each run's step "
        "count comes from a 40-step calibration so that its schedule ends at the budget. Masked LM predicts the "
        "masked tokens; ELECTRA's objective trains a generator a quarter as wide (sharing the embeddings) to fill "
        "them and the encoder to tell every token's original from a replacement (loss = generator MLM + 50 x "
        "detection).",
        "",
        markdown_table(["objective", "s/step (calibration)", "steps in budget", "wall min"], setup),
        "",
        overrun_words(payload),
        "",
        f"![held-out figures against minutes]({Path('../experiments/results/img') / CURVES.name})",
        "",
        "Held-out figures against minutes (the two objectives train different tasks, so each curve is its own "
        "objective's figure; the downstream scores below are the common measure):",
        "",
        markdown_table(["MLM min", "MLM masked-token acc. %", "ELECTRA min", "generator masked-token acc. %",
                        "replaced tokens detected %", "originals kept %"], curve_rows),
        "",
        f"Fine-tuned from each start, lr {payload['lr']:g}, batch 32, {payload['epochs']:g} epochs, at most "
        f"{payload['max_length']} pieces, seeds {', '.join(map(str, payload['seeds']))}: SST-2 on a fixed "
        f"{payload['train_examples']:,}-sentence sub-sample (dev: 872 sentences), MRPC on its full training set "
        "(dev: 408 pairs). Mean ± std over seeds:",
        "",
        markdown_table(["starting point", "SST-2 accuracy %", "MRPC F1 %", "MRPC accuracy %", "fine-tuning min (all)"],
                       finetune_rows),
        "",
        verdict(payload),
        "",
        machine_line(payload["machine"]),
    ]) + "\n"


def majority_baselines(glue: Path) -> dict[str, dict[str, float]]:
    """Dev scores of always answering the commonest label: SST-2 and RTE accuracy, MRPC accuracy and F1 (a
    model that has learned nothing of MRPC says "paraphrase" to every pair and scores F1 about 81)."""
    def labels(path: Path, column: int) -> list[str]:
        rows = path.read_text(encoding="utf-8-sig").splitlines()[1:]
        return [row.split("\t")[column] for row in rows if row.strip()]

    sst2 = labels(glue / "SST-2" / "dev.tsv", -1)
    mrpc = labels(glue / "MRPC" / "dev.tsv", 0)
    rte = labels(glue / "RTE" / "dev.tsv", -1)
    sst2_common = max(set(sst2), key=sst2.count)
    positive = mrpc.count("1") / len(mrpc)  # answering 1 everywhere: precision = that share, recall 1
    return {"SST-2": {"accuracy": sst2.count(sst2_common) / len(sst2)},
            "RTE": {"accuracy": max(rte.count(label) for label in set(rte)) / len(rte)},
            "MRPC": {"accuracy": max(positive, 1 - positive), "f1": 2 * positive / (positive + 1)}}


def verdict(payload: dict[str, Any]) -> str:
    scores, runs = payload["finetune"], payload["runs"]
    electra, mlm, random = "ELECTRA (rtd) pre-trained", "MLM pre-trained", "random weights"
    sentences = []
    for task, metric in TASKS.items():
        rows = scores[task]
        gap = 100 * (rows[electra][metric]["mean"] - rows[mlm][metric]["mean"])
        spread = 100 * max(rows[electra][metric]["std"], rows[mlm][metric]["std"])
        over_random = {label: 100 * (rows[label][metric]["mean"] - rows[random][metric]["mean"]) for label in (electra, mlm)}
        size = "within the spread over seeds" if abs(gap) <= spread else "more than the spread over seeds"
        sentences.append(f"on {task} ({metric}) the ELECTRA encoder scored {gap:+.1f} points against the masked-LM "
                         f"one ({size}, {spread:.1f}), {over_random[electra]:+.1f} against random weights (masked LM "
                         f"{over_random[mlm]:+.1f})")
    step_cost = runs["ELECTRA (rtd)"]["calibrated_step_s"] / runs["MLM"]["calibrated_step_s"]
    detection = detection_words(runs["ELECTRA (rtd)"]["curve"][-1], runs["ELECTRA (rtd)"]["steps"])
    # A task where neither pre-trained start beat the commonest label by a point says nothing about them.
    informative = [task for task in TASKS if not at_floor(payload, task, electra) or not at_floor(payload, task, mlm)]
    wins = [task for task in informative
            if scores[task][electra][TASKS[task]]["mean"] - scores[task][mlm][TASKS[task]]["mean"]
            > max(scores[task][electra][TASKS[task]]["std"], scores[task][mlm][TASKS[task]]["std"])]
    losses = [task for task in informative
              if scores[task][mlm][TASKS[task]]["mean"] - scores[task][electra][TASKS[task]]["mean"]
              > max(scores[task][electra][TASKS[task]]["std"], scores[task][mlm][TASKS[task]]["std"])]
    beaten_by_random = [task for task in informative
                        if all(scores[task][random][TASKS[task]]["mean"] >= scores[task][start][TASKS[task]]["mean"]
                               for start in (electra, mlm))]
    if wins and not losses:
        call = f"ELECTRA's objective wins at this budget on {' and '.join(wins)}, as the paper finds at small compute"
    elif losses and not wins:
        call = (f"ELECTRA's objective does not reproduce its advantage at this budget: masked LM is ahead on "
                f"{' and '.join(losses)}")
    elif wins and losses:
        call = f"the result is mixed: ELECTRA ahead on {' and '.join(wins)}, masked LM on {' and '.join(losses)}"
    elif informative:
        call = "the two objectives cannot be told apart at this budget with three seeds"
    else:
        call = "no task here separates the two objectives: neither start beat the commonest label by a point"
    if beaten_by_random:
        call += (f"; and on {' and '.join(beaten_by_random)} random weights scored at least as well as either "
                 "pre-trained start, so at this budget neither objective has yet bought anything there")
    return (f"**Verdict.** Each ELECTRA step cost {step_cost:.2f}x a masked-LM step (the generator runs too), so it "
            f"took {runs['ELECTRA (rtd)']['steps']} steps to masked LM's {runs['MLM']['steps']} in the same minutes; "
            + "; ".join(sentences) + f". {call[0].upper() + call[1:]}. {majority_words(payload)}{detection}")


def overrun_words(payload: dict[str, Any]) -> str:
    """Whether a run took more than its budget (its steps slower than calibrated), and where it stood then."""
    budget = payload["budget_min"]
    words = []
    for name, run in payload["runs"].items():
        minutes = run["wall_s"] / 60
        if minutes > 1.05 * budget:
            within = [p for p in run["curve"] if p["minutes"] <= budget]
            at_budget = (f"; at {within[-1]['minutes']:.1f} minutes its held-out masked-token accuracy was "
                         f"{100 * within[-1]['mlm_accuracy']:.1f}%" if within else "")
            words.append(f"The {name} run took {minutes:.1f} minutes, {100 * (minutes / budget - 1):.0f}% over its "
                         f"budget (its steps ran slower than in its calibration){at_budget}.")
    return " ".join(words) or "Both runs ended within 5% of the budget."


def at_floor(payload: dict[str, Any], task: str, label: str) -> bool:
    """Whether `label`'s mean on `task` is within a point of answering the commonest label everywhere."""
    baseline = payload.get("majority")
    metric = TASKS[task]
    return bool(baseline) and payload["finetune"][task][label][metric]["mean"] <= baseline[task][metric] + 0.01


def majority_words(payload: dict[str, Any]) -> str:
    """Which starts did no better than answering the commonest label (within a point), per task."""
    baseline = payload.get("majority")
    if not baseline:
        return ""
    found = []
    for task, metric in TASKS.items():
        floor = baseline[task][metric]
        stuck = [label for label in payload["finetune"][task] if at_floor(payload, task, label)]
        if stuck:
            found.append(f"on {task}, {', '.join(stuck)} did not beat answering the commonest label everywhere "
                         f"({metric} {100 * floor:.1f}) by more than a point, so the gaps there are noise about "
                         "the floor")
    return ("Mind the floor: " + "; ".join(found) + ". ") if found else ""


PAPER_SMALL_TOKENS = 1_000_000 * 128 * 128  # ELECTRA-Small: 1M steps of 128 sequences of 128 tokens


def detection_words(last: dict[str, Any], steps: int) -> str:
    """What the discriminator learned by the end, against always answering "original": the loss of that
    constant answer is the entropy of the replaced share."""
    share = last["replaced_fraction"]
    prior_loss = -(share * math.log(share) + (1 - share) * math.log(1 - share))
    found = 100 * last["rtd_accuracy_replaced"]
    if found < 5:
        return (f"Held out, the discriminator never left the base rate: at the end it flagged {found:.1f}% of the "
                f"replaced tokens, and its loss ({last['rtd_loss']:.3f}) is that of always answering \"original\" "
                f"({prior_loss:.3f} at {100 * share:.1f}% replaced): at this budget the encoder had not learned "
                "enough language to tell a sampled token from the original (the paper's ELECTRA-Small trained on about "
                f"{PAPER_SMALL_TOKENS / (steps * SHARED['data']['batch_size'] * 128):,.0f} times this run's tokens).")
    return (f"Held out, the discriminator flagged {found:.1f}% of the replaced tokens at the end (loss "
            f"{last['rtd_loss']:.3f} against {prior_loss:.3f} for always answering \"original\").")


if __name__ == "__main__":
    main()
