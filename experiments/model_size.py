"""The BERT paper's Table 6 at one CPU's scale: bigger models at the same number of steps.

    python -m experiments.model_size [--sizes tiny,mini,small] [--steps 1000] [--seeds 1,2,3]
    python -m experiments.model_size --sizes tiny,mini,small,medium      # if the budget allows (+2.5 h)
    python -m experiments.model_size --smoke                             # a minute or two; no docs

BERT's presets tiny (L=2, H=128), mini (4, 256), small (4, 512) and, optionally, medium (8, 512) are
pre-trained with BERT's objective (masked LM + NSP) on the same text, tokenizer and shards as
experiments/pretraining_tasks.py (the shared books + WikiText-2 valid; WikiText-2 test held out),
with the same optimiser, schedule, batch and number of steps: the paper's Table 6 also trains every
size for the same steps (1M) on the same data. The peak learning rate follows the width (1e-3, Table
5's, for mini's H=256, times 256/H; `--pretrain-lr 1e-3` gives every size the same): at 1e-3 BERT-small
(H=512) stayed on the frequent-piece plateau (held-out MLM accuracy 3.7%) for all 1,000 steps. Each
gets its held-out masked-LM perplexity (exp of the mean loss over the same 1,024 held-out sequences)
and SST-2 and MRPC dev scores fine-tuned from it
(3 seeds). A plot (experiments/results/img/model_size.png) shows the three against parameters, and
the table is set beside the paper's Table 6.

Full CPU time (one torch thread on this 2-core machine; seconds per step grow about with the
non-embedding parameters, 1.2 s for mini as measured in experiments/electra_vs_mlm.py): pre-training
1,000 steps each about 0.1 h (tiny) + 0.35 h (mini) + 1 h (small); fine-tuning SST-2 (6,000
sentences) and MRPC x 3 seeds about 0.3 h (tiny) + 0.6 h (mini) + 1.5 h (small): about 4 hours in
all; medium adds about 2 h of pre-training and 2.5 h of fine-tuning. Finished stages in --work are
reused. Results: experiments/results/model_size.json and the `model-size` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
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
from experiments.electra_vs_mlm import majority_baselines
from experiments.pretrain_vs_scratch import with_dropout
from experiments.pretraining_tasks import (
    MODEL,
    SHARED_DATA,
    SMOKE_NOTE,
    TASKS,
    cell,
    clearly_ahead,
    corpus,
    finetune_task,
    pretrain_run,
    shards,
    tokenizer_dir,
)

SIZES = ("tiny", "mini", "small", "medium")
FINETUNE = ("SST-2", "MRPC")
# The paper's Table 6: L, H, A, held-out LM perplexity, dev MNLI-m, MRPC, SST-2 accuracy.
PAPER = [(3, 768, 12, 5.84, 77.9, 79.8, 88.4), (6, 768, 3, 5.24, 80.6, 82.2, 90.7),
         (6, 768, 12, 4.68, 81.9, 84.8, 91.3), (12, 768, 12, 3.99, 84.4, 86.7, 92.9),
         (12, 1024, 16, 3.54, 85.7, 86.9, 93.3), (24, 1024, 16, 3.23, 86.6, 87.8, 93.7)]
PLOT = RESULTS / "img" / "model_size.png"
BASE_LR, BASE_WIDTH = 1e-3, 256  # Table 5's pre-training rate, for BERT-mini's width


def shape(preset: str) -> str:
    from bertforge.model.bert.config import PRESETS

    layers, hidden, heads = PRESETS[preset]
    return f"L={layers}, H={hidden}, A={heads}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="default: runs/model-size (smoke: a scratch dir)")
    parser.add_argument("--sizes", default="tiny,mini,small", help=f"presets, from {', '.join(SIZES)}")
    parser.add_argument("--steps", type=int, default=1000, help="pre-training steps, the same for every size")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--lr", type=float, default=3e-4, help="fine-tuning peak learning rate")
    parser.add_argument("--pretrain-lr", default="width",
                        help="pre-training peak learning rate: a number for every size, or `width`: Table 5's 1e-3 "
                             "for mini's H=256, scaled by 256/H (2e-3 tiny, 5e-4 small and medium)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="fine-tuning precision (pre-training stays fp32; bf16: autocast, 1.5x on avx512_bf16)")
    parser.add_argument("--smoke", action="store_true", help="tiny corpus, vocabulary and steps; tiny and mini only")
    parser.add_argument("--write-doc", action="store_true", help="with --smoke: still rewrite the docs section")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved results")
    args = parser.parse_args()
    if args.summarize:
        payload = json.loads((RESULTS / "model_size.json").read_text())
        work = args.work or ROOT / "runs" / "model-size"
        if not payload["smoke"] and work.is_dir():  # runs at other rates may have finished since
            payload["other_rates"] = other_rates(work, payload["runs"])
            save_results("model_size", payload)
        plot(payload)
        print(write_section(payload))
        return
    import torch

    torch.set_num_threads(args.threads)
    sizes = ["tiny", "mini"] if args.smoke else [s.strip() for s in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {', '.join(unknown)}; choose from {', '.join(SIZES)}")
    seeds = [1] if args.smoke and args.seeds == "1,2,3" else [int(s) for s in args.seeds.split(",")]
    work = args.work or (Path("/tmp/model-size-smoke") if args.smoke else ROOT / "runs" / "model-size")
    steps = 20 if args.smoke else args.steps
    length = 64 if args.smoke else 128
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()

    inputs, held_out = corpus(work, args.smoke)
    vocab = tokenizer_dir(inputs, work / "tokenizer", 2000 if args.smoke else 16000)
    data = shards(inputs, held_out, vocab, work / f"data-nsp{length}", "nsp", length)
    try:
        rates = {size: pretrain_lr(args.pretrain_lr, size) for size in sizes}
    except ValueError as error:
        parser.error(str(error))
    runs, scores = {}, {}
    for size in sizes:
        name = run_name(size, rates[size])
        run = work / f"{name}-pretrain"
        # batch 8 in smoke runs: the model sizes, not the batch, are what the smoke run must exercise
        runs[size] = pretrain_run(f"BERT-{size}", data, run, steps, {**MODEL, "preset": size},
                                  batch_size=8 if args.smoke else None, lr=rates[size])
        start = with_dropout(run / "final", work / f"{name}-finetune-start", 0.1)
        for task in FINETUNE:
            print(f"fine-tuning BERT-{size} on {task}", flush=True)
            scores.setdefault(size, {})[task] = finetune_task(TASKS[task], start, work / f"{task.lower()}-{name}",
                                                              seeds, args.lr, smoke=args.smoke,
                                                              precision=args.precision)
    payload = {"machine": machine(), "smoke": args.smoke, "sizes": sizes, "steps": steps, "max_seq_length": length,
               "threads": args.threads, "seeds": seeds, "lr": args.lr, "precision": args.precision,
               "pretrain_lr": rates, "pretrain_lr_rule": args.pretrain_lr,
               "train_examples": {t: 48 if args.smoke else TASKS[t].train_examples for t in FINETUNE},
               "shapes": {size: shape(size) for size in sizes}, "runs": runs, "finetune": scores,
               "other_rates": other_rates(work, runs), "majority": majority_baselines(SHARED_DATA / "glue"),
               "wall_s": round(time.time() - started, 1)}
    if args.smoke:
        (work / "model_size.json").write_text(json.dumps(payload, indent=2))
        plot(payload, work / "model_size.png")
        print(render(payload))
        if args.write_doc:
            write_section(payload)
        return
    save_results("model_size", payload)
    plot(payload)
    print(write_section(payload))


def pretrain_lr(rule: str, size: str) -> float:
    """The size's peak pre-training learning rate: a number as given, or `width`: 1e-3 (Table 5's rate,
    for BERT-mini's H=256) x 256 / H. One rate for every width left BERT-small (H=512) on the
    frequent-piece plateau for all 1,000 steps at 1e-3; Adam's best rate falls about as 1/width."""
    if rule != "width":
        try:
            return float(rule)
        except ValueError:
            raise ValueError(f"--pretrain-lr {rule!r}: expected a number or `width`") from None
    from bertforge.model.bert.config import PRESETS

    return BASE_LR * BASE_WIDTH / PRESETS[size][1]


def other_rates(work: Path, runs: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each size's finished pre-training runs in `work` that differ from the table's only in the peak
    learning rate: the rate and the held-out figures at the end, so the table's rates can be judged."""
    from bertforge.train.rundir import flat_settings, setting_differences

    found: dict[str, list[dict[str, Any]]] = {}
    for size, run in runs.items():
        for study in sorted(work.glob(f"{size}*-pretrain/study.json")):
            facts = json.loads(study.read_text())
            changed = [line.split(" ")[0] for line in setting_differences(flat_settings(run["recipe"]),
                                                                         flat_settings(facts["recipe"]))]
            if changed != ["optim.lr"] or facts["steps"] != run["steps"] or not facts.get("curve"):
                continue
            end, lr = facts["curve"][-1], facts["recipe"]["optim"]["lr"]
            found.setdefault(size, []).append({"lr": lr, "mlm_loss": end["mlm_loss"],
                                               "mlm_accuracy": end.get("mlm_accuracy"),
                                               "finetune": other_finetunes(work, size, lr, run)})
    return found


def other_finetunes(work: Path, size: str, lr: float, table_run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The dev scores fine-tuned from a size's run at another pre-training rate, for each task whose
    fine-tuning settings match the table's own run of that size except for the start."""
    table_lr = table_run["recipe"]["optim"]["lr"]
    scores = {}
    for task in FINETUNE:
        mine, table = work / f"{task.lower()}-{run_name(size, lr)}", work / f"{task.lower()}-{run_name(size, table_lr)}"
        if not ((mine / "results.json").exists() and (table / "fingerprint.json").exists()
                and (mine / "fingerprint.json").exists()):
            continue
        settings = [{k: v for k, v in json.loads((d / "fingerprint.json").read_text())["settings"].items()
                     if k != "model"} for d in (mine, table)]
        if settings[0] != settings[1]:
            continue
        summary = json.loads((mine / "results.json").read_text())["summary"]
        metric = TASKS[task].metric
        scores[task] = {"metric": metric, **{k: TASKS[task].points(summary[metric][k]) for k in ("mean", "std")}}
    return scores


def run_name(size: str, lr: float) -> str:
    """Folders of a size's runs: `small`, or `small-lr0.0005` when its rate is not Table 5's 1e-3 (a
    finished run is reused only under its own name, so runs at other rates never mix)."""
    return size if lr == BASE_LR else f"{size}-lr{lr:g}"


def perplexity(run: dict[str, Any]) -> float:
    return math.exp(run["curve"][-1]["mlm_loss"])


def plot(payload: dict[str, Any], out: Path = PLOT) -> None:
    """Held-out perplexity (left) and the two dev scores (right) against encoder parameters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, runs, scores = payload["sizes"], payload["runs"], payload["finetune"]
    params = [runs[s]["parameters"] / 1e6 for s in sizes]
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    ppl = [perplexity(runs[s]) for s in sizes]
    left.plot(params, ppl, marker="o")
    left.set_ylabel("held-out MLM perplexity")
    for size, x, y in zip(sizes, params, ppl, strict=True):
        left.annotate(size, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    for task in FINETUNE:
        means = [scores[s][task]["mean"] for s in sizes]
        spreads = [scores[s][task]["std"] for s in sizes]
        metric = scores[sizes[0]][task]["metric"]
        line = right.errorbar(params, means, yerr=spreads, marker="o", capsize=3, label=f"{task} ({metric})")
        floor = (payload.get("majority") or {}).get(task, {}).get(metric)
        if floor is not None and 100 * floor > min(means) - 10:  # a floor far below the scores would squash them
            right.axhline(100 * floor, linestyle="--", linewidth=1, color=line[0].get_color(),
                          label=f"{task}: commonest label everywhere")
    right.set_ylabel("dev score (mean ± std over seeds)")
    low, high = right.get_ylim()
    right.set_ylim(low, high + 0.4 * (high - low))  # room for the legend above the lines
    right.legend(fontsize=8, loc="upper right")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xticks(params, [f"{p:.1f}" for p in params])  # the sizes' own counts, not powers of ten
        axis.minorticks_off()
        axis.set_xlabel("encoder parameters (M)")
        axis.grid(alpha=0.3)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)


def write_section(payload: dict[str, Any]) -> str:
    text = render(payload)
    update_doc_section("model-size", text)
    return text


def render(payload: dict[str, Any]) -> str:
    sizes, runs, scores = payload["sizes"], payload["runs"], payload["finetune"]
    rates = {s: runs[s]["recipe"]["optim"]["lr"] for s in sizes}
    rows = [[f"BERT-{s}", payload["shapes"][s], f"{runs[s]['parameters'] / 1e6:.2f} M", f"{rates[s]:g}",
             f"{runs[s]['wall_s'] / 60:.1f}", f"{perplexity(runs[s]):.1f}",
             *(cell(scores[s][t]) for t in FINETUNE)] for s in sizes]
    paper = [[f"L={layers}, H={hidden}, A={heads}", f"{ppl:.2f}", f"{mnli:.1f}", f"{mrpc:.1f}", f"{sst:.1f}"]
             for layers, hidden, heads, ppl, mnli, mrpc, sst in PAPER]
    batch = runs[sizes[0]]["recipe"]["data"]["batch_size"]
    command = "python -m experiments.model_size" + (" --smoke" if payload["smoke"] else
                                                    f" --sizes {','.join(sizes)} --steps {payload['steps']}")
    precision = payload.get("precision", "fp32")
    if precision != "fp32" and not payload["smoke"]:
        command += f" --precision {precision}"
    rule = payload.get("pretrain_lr_rule", "1e-3")
    if rule != "width" and not payload["smoke"]:
        command += f" --pretrain-lr {rule}"
    lr_words = ("peak lr 1e-3 x 256/H (Table 5's rate for mini's width; the best Adam rate falls about as "
                "1/width)" if rule == "width" else f"peak lr {float(rule):g}")
    return "\n".join([
        "### Model size: the paper's Table 6 at one CPU's scale",
        "",
        f"`{command}`. Each size pre-trained with masked LM + NSP for the same {payload['steps']:,} steps "
        f"(batch {batch}, {payload['max_seq_length']}-token sequences, AdamW, {lr_words}, 60 warm-up steps, linear "
        "decay, dropout 0, one torch thread) on the same text and shards (the shared books + WikiText-2 valid; "
        f"the held-out perplexity is over WikiText-2 test), then fine-tuned ({precision} training) with dropout 0.1, lr "
        f"{payload['lr']:g}, batch 32, 3 epochs, seeds {', '.join(map(str, payload['seeds']))} on SST-2 "
        f"({payload['train_examples']['SST-2']:,}-sentence sub-sample; dev accuracy) and MRPC (all pairs; dev F1). "
        "Mean ± std over seeds:",
        "",
        markdown_table(["model", "shape", "encoder params", "pre-training lr", "pre-training min", "held-out MLM ppl",
                        "SST-2 acc. %", "MRPC F1 %"], rows),
        "",
        f"![perplexity and dev scores against parameters](../experiments/results/img/{PLOT.name})",
        "",
        "The paper's Table 6 (every size 1M steps on BERT's data; held-out LM perplexity, dev accuracy), for "
        "the trend: perplexity falls and every task improves with size, MRPC's 3,668 pairs included.",
        "",
        markdown_table(["paper", "LM ppl", "MNLI-m", "MRPC", "SST-2"], paper),
        "",
        *([SMOKE_NOTE, ""] if payload["smoke"] else []),
        verdict(payload),
        "",
        *([text, ""] if (text := reading(payload)) else []),
        machine_line(payload["machine"]),
    ]) + "\n"


def verdict(payload: dict[str, Any]) -> str:
    sizes, runs, scores = payload["sizes"], payload["runs"], payload["finetune"]
    ppl = [perplexity(runs[s]) for s in sizes]
    falling = all(b < a for a, b in zip(ppl, ppl[1:], strict=False))
    parts = [f"held-out perplexity {' -> '.join(f'{p:.1f}' for p in ppl)} from {sizes[0]} to {sizes[-1]} "
             f"({'falling at every step up, as in the paper' if falling else 'not falling at every step up'})"]
    for task in FINETUNE:
        row = [scores[s][task] for s in sizes]
        clear = sum(clearly_ahead(b, a) for a, b in zip(row, row[1:], strict=False))
        means = " -> ".join(f"{r['mean']:.1f}" for r in row)
        judged = (f"{clear} of {len(row) - 1} steps up beyond the seed spread" if len(payload["seeds"]) > 1
                  else "one seed: no spread to judge the steps by")
        parts.append(f"{task} {means} ({judged})")
    biggest = max(sizes, key=lambda s: runs[s]["parameters"])
    return (f"**Verdict.** At {payload['steps']:,} steps: " + "; ".join(parts) + f". The largest ({biggest}) "
            f"took {runs[biggest]['wall_s'] / runs[sizes[0]]['wall_s']:.1f}x the smallest's pre-training time for "
            "the same steps; at a fixed step count the paper's trend holds where perplexity falls and the scores "
            "rise beyond their spreads, and a size whose steps are too few to train it shows as the exception.")


# The paper's pre-training: 1M steps of 256 sequences (90% of them 128 tokens long, the rest 512).
PAPER_SEQUENCES = 1_000_000 * 256


def reading(payload: dict[str, Any]) -> str:
    """Why the table looks as it does at this budget: how far each encoder got on its two objectives, and
    where each task's scores sit against answering every example with the commonest label."""
    sizes, runs, scores = payload["sizes"], payload["runs"], payload["finetune"]
    ends = [runs[s]["curve"][-1] for s in sizes]
    if payload["smoke"] or len(payload["seeds"]) < 2 or any("mlm_accuracy" not in end for end in ends):
        return ""
    accuracy = [100 * end["mlm_accuracy"] for end in ends]
    nsp = [100 * end["nsp_accuracy"] for end in ends if "nsp_accuracy" in end]
    growth = runs[sizes[-1]]["parameters"] / runs[sizes[0]]["parameters"]
    batch = runs[sizes[0]]["recipe"]["data"]["batch_size"]
    words = [f"**Why, at this scale.** After {payload['steps']:,} steps of {batch} sequences (the paper trains "
             f"every size on {PAPER_SEQUENCES / (payload['steps'] * batch):,.0f} times as many) every size is early in "
             f"pre-training: held-out masked-LM accuracy {' / '.join(f'{a:.1f}' for a in accuracy)}% "
             f"({' / '.join(sizes)}), for {growth:.0f}x the parameters from {sizes[0]} to {sizes[-1]}"]
    if nsp:
        words.append(f"; next-sentence accuracy on held-out pairs {min(nsp):.1f}-{max(nsp):.1f}%, chance being 50%, "
                     "so no size has learned how two segments relate.")
    else:
        words.append(".")
    tried = payload.get("other_rates") or {}
    if tried:
        other = "; ".join(f"{size} at {point['lr']:g}: perplexity {math.exp(point['mlm_loss']):.1f}, masked-LM accuracy "
                          f"{100 * point['mlm_accuracy']:.1f}%"
                          + "".join(f", {task} {value['mean']:.1f} ± {value['std']:.1f}"
                                    for task, value in (point.get("finetune") or {}).items())
                          for size in sizes for point in tried.get(size, []))
        best = [min([math.exp(runs[s]["curve"][-1]["mlm_loss"])] + [math.exp(p["mlm_loss"]) for p in tried.get(s, [])])
                for s in sizes]
        falling = all(b < a for a, b in zip(best, best[1:], strict=False))
        words.append(f" Other peak rates tried at the same steps ({other}) show how much of a size's figure is its "
                     f"rate; at each size's best rate tried, perplexity goes {' -> '.join(f'{b:.1f}' for b in best)}"
                     f" ({'still falling with size' if falling else 'no longer falling at every step up'}).")
    majority = payload.get("majority") or {}
    for task in FINETUNE:
        metric = scores[sizes[0]][task]["metric"]
        if task not in majority or metric not in majority[task]:
            continue
        floor = 100 * majority[task][metric]
        row = [scores[s][task] for s in sizes]
        low, high = min(r["mean"] for r in row), max(r["mean"] for r in row)
        at_floor = [s for s, r in zip(sizes, row, strict=True) if r["mean"] - floor <= r["std"]]
        if len(at_floor) == len(sizes):
            words.append(f" On {task} every size scores {low:.1f}-{high:.1f} ({metric}), no better than answering the "
                         f"commonest label everywhere ({floor:.1f}): fine-tuned from these encoders {task} is not "
                         "learned, so size has nothing to show there; the paper's gains on it rest on encoders "
                         "trained far longer.")
        elif at_floor:
            verb = "scores" if len(at_floor) == 1 else "score"
            words.append(f" On {task} {' and '.join(at_floor)} {verb} no better than the commonest label ({floor:.1f} "
                         f"{metric}); the others clear it.")
        else:
            words.append(f" On {task} every size clears the commonest label's {floor:.1f} ({metric}) by "
                         f"{low - floor:.1f}-{high - floor:.1f} points: one sentence's sentiment can be read from its "
                         "words, which even an early encoder represents."
                         if task == "SST-2" else
                         f" On {task} every size clears the commonest label's {floor:.1f} ({metric}) by "
                         f"{low - floor:.1f}-{high - floor:.1f} points.")
    return "".join(words)


if __name__ == "__main__":
    main()
