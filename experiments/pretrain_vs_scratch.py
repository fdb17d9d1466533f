"""Does our pre-training help? A pre-training run's held-out curves, and SST-2 from it vs from random weights.

    python -m experiments.pretrain_vs_scratch --run runs/mini/pretrain [--train-examples 6000[,2000,1000]] [--seeds 1,2,3]

Reads RUN/metrics.jsonl (held-out MLM and NSP accuracy at every evaluation) and draws RUN's curves
to experiments/results/img/<name>_pretrain_curves.png; then fine-tunes SST-2 (GLUE layout, ../shared/data/glue) twice
per seed with identical settings: once from RUN/final, once from a model of the same config with
BERT's random initialisation (same tokenizer). The first `--train-examples` size is the comparison the
verdict is about; further sizes (fewer labelled sentences, the same epochs) are scored the same way and
tabulated under it, with how many random-weights seeds never left the majority class. Results:
experiments/results/pretrain_vs_scratch.json and the `pretrain-run` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from experiments.common import (
    DOC,
    RESULTS,
    ROOT,
    machine,
    machine_line,
    markdown_table,
    save_results,
    update_doc_section,
)


def random_twin(final: Path, out: Path, seed: int = 0) -> Path:
    """A checkpoint with `final`'s config and tokenizer and BERT's initialisation instead of its weights."""
    from bertforge.pretrain import random_init_like

    return out if (out / "config.json").exists() else random_init_like(final, out, seed)


# Settings that change what a run shows, not what it computes (`pretrain --quiet` turns the bar off).
DISPLAY_ONLY = {("train", "progress")}


def recorded_recipe(run: Path) -> dict[str, Any]:
    """The resolved recipe a pre-training run recorded: run_config.yaml (run_config.json before it)."""
    from bertforge.recipe import read_mapping

    path = run / "run_config.yaml"
    return read_mapping(path if path.is_file() else run / "run_config.json")


def recipe_differences(recipe_file: Path, run_config: dict[str, Any]) -> list[str]:
    """Where a recipe file disagrees with the settings a run recorded (run_config.yaml), as "section.key"
    names; empty when the file describes the run, so a report can name it as the run's recipe."""
    from bertforge.model import BertConfig
    from bertforge.pretrain import load_recipe, model_config

    recipe = load_recipe(recipe_file)
    settings = recipe.to_dict()
    differences = [f"{section}.{key}" for section in ("data", "optim", "train")
                   for key in sorted(set(settings[section]) | set(run_config.get(section, {})))
                   if settings[section].get(key) != run_config.get(section, {}).get(key)
                   and (section, key) not in DISPLAY_ONLY]
    recorded = BertConfig.from_dict(run_config["model"]).to_dict()
    facts = {"vocab_size": recorded["vocab_size"], "pad_id": recorded.get("pad_token_id", 0)}
    try:
        built = model_config(recipe, facts, 0).to_dict()
    except ValueError as error:  # e.g. a vocab_size that differs from the run's tokenizer
        return differences + [f"model ({error})"]
    differences += [f"model.{key}" for key in sorted(set(built) | set(recorded)) if built.get(key) != recorded.get(key)]
    return differences


def with_dropout(final: Path, out: Path, dropout: float) -> Path:
    """A copy of checkpoint `final` whose config sets both dropout rates to `dropout`: a run pre-trained
    without dropout is fine-tuned, like the random twin made from the copy, with BERT's usual 0.1."""
    out.mkdir(parents=True, exist_ok=True)
    for item in final.iterdir():
        if item.is_file():
            shutil.copy2(item, out / item.name)
    config = json.loads((final / "config.json").read_text())
    config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


DEFAULT_COMPUTE = ("on one core (torch 1 thread) of the 2-core machine below, which shared it with one other "
                   "single-threaded job")


def held_out_curve(run: Path) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("split") == "eval"]


def pretrain_wall_s(run: Path) -> float:
    """Seconds the run spent training, by its own clock (metrics.jsonl): each start or resume writes a
    "run" record, and a segment lasts from it to the segment's last record, so the time a stopped run
    waited before its resume is not counted."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    total, start, last = 0.0, None, None
    for record in records:
        if record.get("split") == "run" or start is None:
            total += (last - start) if start is not None else 0.0
            start = record["time"]
        last = record["time"]
    total += (last - start) if start is not None else 0.0
    return round(total, 1)


def run_name(run: Path) -> str:
    """runs/mini/pretrain -> "mini"; any other run directory keeps its own name."""
    return run.parent.name if run.name == "pretrain" else run.name


def curves_path(run: Path) -> Path:
    return RESULTS / "img" / f"{run_name(run)}_pretrain_curves.png"


def write_section(run: Path, payload: dict[str, Any]) -> str:
    """The `pretrain-run` section of docs/results.md, rewritten from `payload`; returns its text."""
    text = render(run_name(run), payload, curves_path(run))
    update_doc_section("pretrain-run", text, DOC)
    return text


def int_list(minimum: int) -> Callable[[str], list[int]]:
    """An argparse type: "6000,2000,1000" -> [6000, 2000, 1000]; a bad item is named in the usage error."""
    def parse(text: str) -> list[int]:
        items = text.split(",")
        bad = next((i for i in items if not i.strip().isdigit() or int(i) < minimum), None)
        if bad is not None:
            raise argparse.ArgumentTypeError(f"{bad!r} in {text!r} is not a whole number >= {minimum}")
        return [int(i) for i in items]
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a finished bertforge pretrain run directory")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "glue")
    parser.add_argument("--train-examples", type=int_list(1), default=[6000],
                        help="SST-2 training sentences, a fixed sub-sample; a comma list adds smaller sizes, "
                             "e.g. 6000,2000,1000 (the first is the one the verdict is about)")
    parser.add_argument("--seeds", type=int_list(0), default=[1, 2, 3])
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--recipe", type=Path, default=None,
                        help="the committed recipe file the run was made with: checked against RUN/run_config.yaml "
                             "and named in the report instead of the path the run recorded")
    parser.add_argument("--finetune-dropout", type=float, default=None,
                        help="dropout of both starting points while fine-tuning (default: the run's config)")
    parser.add_argument("--max-length", type=int, default=None,
                        help="SST-2 pieces per sentence (default: the pre-training sequence length, so that "
                             "fine-tuning uses only position embeddings the run trained)")
    parser.add_argument("--work", type=Path, default=None, help="fine-tuning runs (default RUN/../sst2-*)")
    parser.add_argument("--compute", default=DEFAULT_COMPUTE,
                        help="how the pre-training run used the machine, for the results text")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved results")
    args = parser.parse_args()
    if args.summarize:
        payload = json.loads((RESULTS / "pretrain_vs_scratch.json").read_text())
        write_section(Path(payload["run"]), payload)
        return
    if args.run is None:
        parser.error("--run is required (unless --summarize)")

    import torch

    from bertforge.finetune import finetune
    from bertforge.plot import plot_run

    torch.set_num_threads(args.threads)
    run, final = args.run, args.run / "final"
    work = args.work or run.parent
    plot_run(run, curves_path(run))
    config = json.loads((final / "config.json").read_text())
    run_config = recorded_recipe(run)
    if args.recipe is not None:
        differences = recipe_differences(args.recipe, run_config)
        if differences:
            raise SystemExit(f"{args.recipe} does not describe {run}: it differs in {', '.join(differences)}")
        run_config["source"] = str(args.recipe)
    max_length = args.max_length or run_config.get("dataset_options", {}).get("max_seq_length", 128)
    start = final if args.finetune_dropout is None else with_dropout(final, work / "pretrained-start",
                                                                     args.finetune_dropout)
    starts = {"pre-trained (ours)": start, "random initialisation": random_twin(start, work / "random-init")}
    sizes, seeds = args.train_examples, args.seeds
    by_size = []
    for index, size in enumerate(sizes):
        suffix = "" if index == 0 else f"-n{size}"  # the headline size keeps the plain directory names
        results: dict[str, Any] = {}
        for label, model_dir in starts.items():
            out = work / (("sst2-pretrained" if model_dir == start else "sst2-random") + suffix)
            summary = finetune("glue", "SST-2", model_dir, args.data, out, seeds=seeds, lr=args.lr,
                               epochs=args.epochs, max_train_examples=size, max_length=max_length,
                               progress=False, verbose=True)
            # Per-seed wall times as each seed recorded them: a seed that finetune() reused from an earlier
            # run in `out` (same hyper-parameters) keeps the time it took then.
            wall_s = sum(seed["wall_s"] or 0.0 for seed in summary["seeds"])
            results[label] = {"accuracy": summary["summary"]["accuracy"], "wall_s": round(wall_s, 1)}
        by_size.append({"train_examples": size, "sst2": results})
    curve = held_out_curve(run)
    payload = {"machine": machine(), "run": str(run), "config": config, "recipe": run_config,
               "held_out": curve, "pretrain_wall_s": pretrain_wall_s(run), "sst2": by_size[0]["sst2"],
               "train_examples": sizes[0], "fewer_examples": by_size[1:], "majority_share": majority_share(args.data),
               "lr": args.lr, "max_length": max_length, "finetune_dropout": args.finetune_dropout,
               "epochs": args.epochs, "compute": args.compute}
    save_results("pretrain_vs_scratch", payload)
    print(write_section(run, payload))
    shutil.rmtree(work / "random-init", ignore_errors=True)
    shutil.rmtree(work / "pretrained-start", ignore_errors=True)


def render(name: str, payload: dict[str, Any], curves: Path) -> str:
    config, recipe, curve = payload["config"], payload["recipe"], payload["held_out"]
    steps = curve[-1]["step"] if curve else 0
    train = recipe.get("train", {})
    data = recipe.get("data", {})
    optim = recipe.get("optim", {})
    dataset = recipe.get("dataset_options", {})
    seq_length = dataset.get("max_seq_length", 128)
    objective = {"nsp": "masked LM + NSP", "sop": "masked LM + SOP"}.get(dataset.get("objective", "nsp"), "masked LM only")
    scored = data.get("eval_max_batches", 0) * data.get("eval_batch_size", 0)
    held_out = f"the same first {scored} statically masked sequences" if scored else "all its statically masked sequences"
    pair_task = sentence_task(payload)
    rows = [[r["step"], f"{r['mlm_loss']:.3f}", f"{100 * r['mlm_accuracy']:.1f}",
             f"{100 * r[f'{pair_task}_accuracy']:.1f}" if f"{pair_task}_accuracy" in r else "-"] for r in curve]
    sst2 = []
    for label, result in payload["sst2"].items():
        acc = result["accuracy"]
        values = ", ".join(f"{100 * v:.1f}" for v in acc["values"])
        sst2.append([label, mean_std(acc), values, f"{result['wall_s']:.0f}"])
    return "\n".join([
        f"### Pre-training from scratch: BERT-{name} on the shared books + WikiText-2 (CPU budget run)",
        "",
        f"L={config['num_hidden_layers']}, H={config['hidden_size']}, A={config['num_attention_heads']}, "
        f"vocabulary {config['vocab_size']} WordPiece pieces trained here; {steps} steps of batch "
        f"{data.get('batch_size')} x {seq_length} tokens, AdamW lr {optim.get('lr')} ({optim.get('warmup_steps')} warm-up "
        f"steps, linear decay), {objective}, dynamic masking, dropout {config.get('hidden_dropout_prob', 0.1):g} "
        f"({train.get('precision', 'fp32')}). Training text: "
        "the 19 Gutenberg novels of `../shared/data/pretrain_text` (headers stripped) and WikiText-2 valid; "
        "held out: WikiText-2 test, whole (`prepare --validation-input`), scored on "
        f"{held_out} at every evaluation (`eval_max_batches`). Recipe: "
        f"`{recipe.get('source', 'recipes/mini-cpu.yaml')}` (its header has the tokenizer and prepare commands; the "
        "figures here are the run's own, from its `run_config.json`). Pre-training wall time: "
        f"{payload.get('pretrain_wall_s', 0) / 60:.0f} min {payload.get('compute', DEFAULT_COMPUTE)}.",
        "",
        f"![pre-training curves]({Path(os.path.relpath(curves, DOC.parent)).as_posix()})",
        "",
        markdown_table(["step", "held-out MLM loss", "MLM accuracy %", f"{pair_task.upper()} accuracy %"], rows),
        "",
        f"SST-2 dev accuracy (872 sentences) after fine-tuning on a fixed {payload['train_examples']}-sentence "
        f"sub-sample of SST-2 train, lr {payload['lr']:g}, batch 32, {payload['epochs']:g} epochs, at most "
        f"{payload.get('max_length', 128)} pieces per sentence{dropout_note(payload)}, same seeds, "
        "from the checkpoint above vs from the same architecture with BERT's random initialisation:",
        "",
        markdown_table(["starting point", "accuracy % (mean ± std)", "per seed", "wall s (all seeds)"], sst2),
        "",
        verdict(payload),
        *fewer_examples_table(payload),
        "",
        machine_line(payload["machine"]),
    ]) + "\n"


def majority_share(glue_dir: Path) -> float:
    """The share of SST-2 dev's most frequent label: the accuracy of a model that learned nothing."""
    from collections import Counter

    from bertforge.tasks.glue import read_glue

    counts = Counter(example.label for example in read_glue(glue_dir, "sst2", "dev"))
    return max(counts.values()) / sum(counts.values())


def fewer_examples_table(payload: dict[str, Any]) -> list[str]:
    """Lines for the smaller training sets (none when only the headline size was run): both starts' mean
    accuracy, the gap, seeds above their twins, and how many random-weights seeds never left the majority
    class (a "win" over a model that learned nothing says less than one over a model that learned)."""
    rows = []
    chance = payload.get("majority_share")
    for entry in payload.get("fewer_examples", []):
        ours = entry["sst2"]["pre-trained (ours)"]["accuracy"]
        scratch = entry["sst2"]["random initialisation"]["accuracy"]
        stuck = "-" if chance is None else sum(v < chance + 0.02 for v in scratch["values"])
        rows.append([entry["train_examples"], mean_std(ours), mean_std(scratch),
                     f"{100 * (ours['mean'] - scratch['mean']):+.1f}", f"{seeds_ahead(ours, scratch)} of {len(ours['values'])}",
                     f"{stuck} of {len(scratch['values'])}"])
    if not rows:
        return []
    majority = f"; {100 * chance:.1f}% of dev is the majority class" if chance is not None else ""
    return ["", "With fewer labelled sentences: the same protocol and seeds on a smaller fixed sub-sample (not "
                f"what the verdict above is about{majority}):", "",
            markdown_table(["training sentences", "pre-trained (ours)", "random initialisation", "gap (points)",
                            "seeds above their twins",
                            "random-start seeds that never left the majority class (within 2 points)"], rows)]


def mean_std(accuracy: dict[str, Any]) -> str:
    return f"{100 * accuracy['mean']:.1f} ± {100 * accuracy['std']:.1f}"


def seeds_ahead(ours: dict[str, Any], scratch: dict[str, Any]) -> int:
    """Seeds whose pre-trained run beat the random-start run of the same seed (values are in seed order)."""
    return sum(o > s for o, s in zip(ours["values"], scratch["values"], strict=True))


def dropout_note(payload: dict[str, Any]) -> str:
    dropout = payload.get("finetune_dropout")
    return "" if dropout is None else f", dropout {dropout:g} in both (whatever the pre-training used)"


def sentence_task(payload: dict[str, Any]) -> str:
    """"nsp" or "sop": the sentence-pair task the run trained (the metric key prefix in metrics.jsonl)."""
    return "sop" if payload["recipe"].get("dataset_options", {}).get("objective") == "sop" else "nsp"


def verdict(payload: dict[str, Any]) -> str:
    """Does the checkpoint fine-tune better than random weights? Said plainly, with the held-out curve's end."""
    ours = payload["sst2"]["pre-trained (ours)"]["accuracy"]
    scratch = payload["sst2"]["random initialisation"]["accuracy"]
    gap = 100 * (ours["mean"] - scratch["mean"])
    pair_task = sentence_task(payload)
    last = payload["held_out"][-1] if payload["held_out"] else {}
    curve = f"held-out MLM accuracy {100 * last.get('mlm_accuracy', 0):.1f}%"
    if f"{pair_task}_accuracy" in last:
        curve += f" and {pair_task.upper()} accuracy {100 * last[f'{pair_task}_accuracy']:.1f}%"
    curve += " at the last evaluation"
    if round(gap, 1) == 0:  # before the sign test, so that +0.04 is not reported as "helps by 0.0"
        return (f"**Pre-training does not help measurably: the checkpoint fine-tunes to the same mean accuracy "
                f"as random initialisation on SST-2** ({curve}).")
    spread = 100 * max(ours["std"], scratch["std"])
    ahead = f"{seeds_ahead(ours, scratch)} of {len(ours['values'])} seeds above their random-start twins"
    if 0 < gap <= spread:  # as strict as the negative side: a lead inside the noise is not a win
        return (f"**Pre-training does not help measurably: the checkpoint fine-tunes {gap:.1f} points above "
                f"random initialisation on SST-2, within the spread over seeds** ({ahead}; {curve}).")
    if gap > 0:
        return (f"**Pre-training helps**: the checkpoint fine-tunes {gap:.1f} points above random initialisation "
                f"on SST-2, more than the spread over seeds ({ahead}; {curve}).")
    if -gap <= spread:
        return (f"**Pre-training does not help measurably: the checkpoint fine-tunes {-gap:.1f} points below "
                f"random initialisation on SST-2, within the spread over seeds** ({curve}).")
    mlm = [r["mlm_accuracy"] for r in payload["held_out"]]
    nsp = [r[f"{pair_task}_accuracy"] for r in payload["held_out"] if f"{pair_task}_accuracy" in r]
    signs = []
    if len(mlm) >= 3 and mlm[-1] - mlm[len(mlm) // 2] < 0.01:
        signs.append("held-out MLM accuracy stopped rising in the second half of the run")
    if nsp and max(nsp) < 0.55:
        signs.append(f"held-out {pair_task.upper()} accuracy never left chance")
    joined = "; ".join(signs)
    seen = f" {joined[:1].upper()}{joined[1:]}." if signs else ""
    return (f"**At this budget pre-training does not help: the checkpoint fine-tunes {-gap:.1f} points below "
            f"random initialisation on SST-2** ({curve}).{seen} This run is a measured negative result, not a "
            "useful encoder.")


if __name__ == "__main__":
    main()
