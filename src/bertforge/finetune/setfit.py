"""Few-shot classification the SetFit way (Tunstall et al. 2022): `finetune classify --method setfit`.

With tens of labelled rows per class, fine-tuning all weights under a new output layer has little to
learn from; SetFit instead (1) makes pairs from the labels, two rows of one class (or a row with
itself) a positive pair (cosine target 1) and rows of two classes a negative one (target 0),
`PAIR_ITERATIONS` of each per row, cycling through every pair; (2) trains the sentence encoder on
them (`finetune embed` with the cosine loss, through the one training loop, in
`seed-N/setfit-body/`); (3) fits a logistic regression on the encoder's mean-pooled vectors of the
training rows, scaled to unit length as the encoder's embeddings are. The classifier it writes is the
trained encoder under a linear head on the unit-length mean of the final token vectors whose weights
are the regression's, so `predict`, `pipeline()` and `serve` run it like any fine-tuned classifier.

Multi-label rows (a set of labels each) pair as the setfit package pairs them: two rows that share a
label are a positive pair, two that share none a negative one; the head is then one logistic
regression per label (one-vs-rest), whose logits the classifier's sigmoid turns into the
regressions' probabilities, and the labels' thresholds are tuned on dev as for any multi-label model.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

PAIR_ITERATIONS = 20  # SetFit's num_iterations: rounds of one positive and one negative pair per row
# the setfit package's defaults for the encoder's training on the pairs; a run's own --lr, --batch-size
# and --epochs replace them, and its records (run_config.yaml, results.json, task.json, the card) say
# which ran (`FinetuneRecipe.resolved`)
BODY_BATCH_SIZE = 16  # pairs per batch
BODY_LR = 2e-5
BODY_EPOCHS = 1.0  # passes over the pairs
BODY_DIR = "setfit-body"
# the run's settings the encoder's training on the pairs takes (the rest are the head's or the run's)
BODY_SETTINGS = ("optimizer", "lr", "weight_decay", "beta1", "beta2", "adam_eps", "warmup_steps", "warmup_ratio",
                 "schedule", "min_lr_ratio", "epochs", "batch_size", "precision", "max_grad_norm", "device",
                 "group_by_length")


def pair_count(rows: int) -> int:
    """The pairs `sentence_pairs` makes of `rows` training rows: a positive and a negative per row and round."""
    return 2 * PAIR_ITERATIONS * rows


def body_steps_per_epoch(rows: int, batch_size: int) -> int:
    """The encoder's optimiser steps per pass over the pairs of `rows` training rows."""
    return max(1, math.ceil(pair_count(rows) / batch_size))


def sentence_pairs(texts: Sequence[str], labels: Sequence[str | Sequence[str]], iterations: int,
                   seed: int) -> list[dict[str, Any]]:
    """Rows {sentence1, sentence2, score}: `iterations` x len(texts) positive pairs (two rows of one
    class, score 1) and as many negative ones (two classes, score 0), alternating. A row's label is a
    class name, or a list of names (multi-label: rows that share a name are a positive pair, rows
    that share none a negative one).

    Every unordered pair of rows is listed once, a row with itself among the positives (as the
    setfit package lists them: with dropout on, the two passes over one row differ, SimCSE's
    positive; measured, they are worth about a point at 16 per class), shuffled with `seed`; each
    kind is cycled through, so that every negative is seen before any is seen twice, and the
    positives (fewer in a few-shot file) as evenly. Above MAX_LISTED_ROWS rows each row's partners
    are drawn at random instead."""
    rng = random.Random(seed)
    label_sets = [_label_set(label) for label in labels]
    by_label: dict[str, list[int]] = defaultdict(list)
    for i, names in enumerate(label_sets):
        for name in sorted(names):
            by_label[name].append(i)
    if len(by_label) < 2:
        raise ValueError("setfit needs at least two labels in the training file")
    wanted = iterations * len(texts)
    if len(texts) <= MAX_LISTED_ROWS:
        positives, negatives = _listed_pairs(label_sets, rng)
        if not negatives:
            raise ValueError("setfit needs rows that share no label: every two rows of the training file share one")
        positives, negatives = _cycle(positives, wanted), _cycle(negatives, wanted)
    else:
        positives, negatives = _drawn_pairs(label_sets, by_label, wanted, rng)
    pairs = []
    for (a, b), (c, d) in zip(positives, negatives, strict=True):
        pairs.append({"sentence1": texts[a], "sentence2": texts[b], "score": 1.0})
        pairs.append({"sentence1": texts[c], "sentence2": texts[d], "score": 0.0})
    return pairs


def _label_set(label: str | Sequence[str]) -> frozenset[str]:
    """A row's labels as a set: one class name, or a multi-label row's list of names."""
    return frozenset([label]) if isinstance(label, str) else frozenset(str(name) for name in label)


MAX_LISTED_ROWS = 1000  # 1,000 rows make about half a million pairs to list; above it, partners are drawn


def _listed_pairs(label_sets: Sequence[frozenset[str]],
                  rng: random.Random) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(positives, negatives): every unordered pair of rows once (a row with itself too), in random order."""
    positives, negatives = [], []
    for i in range(len(label_sets)):
        for j in range(i, len(label_sets)):
            shared = i == j or not label_sets[i].isdisjoint(label_sets[j])
            (positives if shared else negatives).append((i, j))
    rng.shuffle(positives)
    rng.shuffle(negatives)
    return positives, negatives


def _cycle(pairs: list[tuple[int, int]], count: int) -> list[tuple[int, int]]:
    """The first `count` of `pairs` repeated end to end."""
    return [pairs[k % len(pairs)] for k in range(count)]


def _drawn_pairs(label_sets: Sequence[frozenset[str]], by_label: dict[str, list[int]], count: int,
                 rng: random.Random) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """`count` positives and negatives, a row and a random partner, row by row in turn (large files).

    A positive partner shares a label of the row (one of its labels drawn first, then a row of it);
    a negative one shares none, for each row in turn that has such a partner."""
    anchors = _rows_with_negatives(label_sets)
    if not anchors:
        raise ValueError("setfit needs rows that share no label: every two rows of the training file share one")
    positives, negatives = [], []
    for k in range(count):
        i = k % len(label_sets)
        names = sorted(label_sets[i])
        if names:
            same = by_label[names[0] if len(names) == 1 else names[rng.randrange(len(names))]]
            positives.append((i, same[rng.randrange(len(same))]))  # the row itself as likely as any other
        else:  # a multi-label row without a label: only the row itself is sure to be like it
            positives.append((i, i))
        a = anchors[k % len(anchors)]
        other = rng.randrange(len(label_sets))
        while other == a or not label_sets[other].isdisjoint(label_sets[a]):
            other = rng.randrange(len(label_sets))
        negatives.append((a, other))
    return positives, negatives


def _rows_with_negatives(label_sets: Sequence[frozenset[str]]) -> list[int]:
    """The rows that share no label with at least one other row (every row, in single-label files)."""
    distinct = set(label_sets)
    has_partner = {names: any(names.isdisjoint(other) for other in distinct) if names else len(label_sets) > 1
                   for names in distinct}
    return [i for i, names in enumerate(label_sets) if has_partner[names]]


def train_setfit(examples: Sequence[Any], label_list: Sequence[str], model_dir: Path, seed_dir: Path, *,
                 seed: int, max_length: int, settings: dict[str, Any], overwrite: bool,
                 progress: bool, verbose: bool, finetune: Callable[..., dict[str, Any]],
                 config: dict[str, Any] | None = None) -> tuple[torch.nn.Module, int]:
    """The SetFit classifier for one seed, and the body's optimiser steps. `finetune` is
    `bertforge.finetune.finetune`, which trains the body as an embedding task with the run's resolved
    `settings` (by name; those of BODY_SETTINGS are used); `config` goes into the classifier's
    config.json (the task's `problem_type`)."""
    from bertforge.tasks import FAMILIES

    # the family that trains sentence encoders: the one whose fine-tuned models answer embeddings
    embedding_family = next(name for name, family in FAMILIES.items() if family.inference_task == "embeddings")
    if any(getattr(e, "text_pair", True) is not None or not isinstance(getattr(e, "label", None), str | list)
           for e in examples):
        raise ValueError("--method setfit is for classify: single- or multi-label classification of one text per row")
    texts = [e.text for e in examples]
    labels: list[str | list[str]] = [e.label if isinstance(e.label, list) else str(e.label) for e in examples]
    body_out = seed_dir / BODY_DIR
    body_out.mkdir(parents=True, exist_ok=True)
    pairs = body_out / "pairs.jsonl"
    rows = sentence_pairs(texts, labels, PAIR_ITERATIONS, seed)
    pairs.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    dev = body_out / "pairs-dev.jsonl"  # the body is judged by the classifier's dev score, not its own
    dev.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows[:BODY_BATCH_SIZE]), encoding="utf-8")
    body_settings = {name: settings[name] for name in BODY_SETTINGS if settings.get(name) is not None}
    body = finetune(embedding_family, None, model_dir, None, body_out / "run", seeds=[seed], **body_settings,
                    max_length=max_length, eval_every_epoch=False, save_best=False, overwrite=overwrite,
                    progress=progress, verbose=verbose,
                    task_settings={"train": str(pairs), "dev": str(dev), "loss": "cosine"})
    body_dir = body_out / "run" / f"seed-{seed}"
    weights, bias = _logistic_head(body_dir, texts, labels, label_list, max_length, seed)
    return _classifier(body_dir, label_list, weights, bias, config or {}, max_length), int(body["seeds"][0]["steps"])


def _logistic_head(body_dir: Path, texts: Sequence[str], labels: Sequence[str | list[str]],
                   label_list: Sequence[str], max_length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(C, H) weights and (C,) biases of a logistic regression on the body's unit-length mean vectors, as
    logits of the classes in `label_list` order (a two-class regression's one logit becomes [0, z]).
    Multi-label rows (lists): one regression per label, each label's logit its own."""
    from sklearn.linear_model import LogisticRegression

    vectors = _mean_vectors(body_dir, texts, max_length)
    if any(isinstance(label, list) for label in labels):
        return _one_vs_rest(vectors, [_label_set(label) for label in labels], label_list, seed)
    regression = LogisticRegression(max_iter=1000, random_state=seed).fit(vectors, list(labels))
    order = [list(regression.classes_).index(name) for name in label_list]
    if len(regression.classes_) == 2:
        positive = np.concatenate([regression.coef_, regression.intercept_[:, None]], axis=1)[0]  # for classes_[1]
        rows = np.stack([np.zeros_like(positive), positive])  # logits [0, z]: softmax = the regression's sigmoid
        rows = rows[order]
    else:
        rows = np.concatenate([regression.coef_, regression.intercept_[:, None]], axis=1)[order]
    return rows[:, :-1], rows[:, -1]


def _one_vs_rest(vectors: np.ndarray, label_sets: Sequence[frozenset[str]], label_list: Sequence[str],
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(C, H) weights and (C,) biases: a logistic regression per label, whose logit the sigmoid turns into
    its probability. A label on every training row has nothing to tell apart: it keeps a zero weight
    and the log-odds of its (smoothed) rate as its bias."""
    from sklearn.linear_model import LogisticRegression

    weights, biases = np.zeros((len(label_list), vectors.shape[1])), np.zeros(len(label_list))
    for c, name in enumerate(label_list):
        target = np.array([name in names for names in label_sets], dtype=int)
        if target.min() == target.max():
            rate = (target.sum() + 0.5) / (len(target) + 1.0)
            biases[c] = np.log(rate / (1.0 - rate))
            continue
        regression = LogisticRegression(max_iter=1000, random_state=seed).fit(vectors, target)
        weights[c], biases[c] = regression.coef_[0], regression.intercept_[0]
    return weights, biases


def _mean_vectors(body_dir: Path, texts: Sequence[str], max_length: int, batch_size: int = 64) -> np.ndarray:
    """(N, H) means of the body's final token vectors over each text's real tokens, scaled to unit length:
    what the classifier's head reads (`model.base.mean_of_real_tokens`, then normalised). On unit
    vectors the regression's fixed L2 penalty weighs the same for every encoder, whatever its scale."""
    import torch

    from bertforge.model.auto import load_for_job
    from bertforge.model.base import mean_of_real_tokens
    from bertforge.tasks.base import Feature, collate
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(body_dir)
    encoder = load_for_job(body_dir, "embeddings").eval()
    encoded = tokenizer.encode_batch(list(texts), max_length=max_length, truncation=True)
    features = [Feature({"input_ids": ids, "token_type_ids": types}, i)
                for i, (ids, types) in enumerate(zip(encoded["input_ids"], encoded["token_type_ids"], strict=True))]
    vectors = []
    with torch.no_grad():
        for start in range(0, len(features), batch_size):
            batch = collate(features[start:start + batch_size], tokenizer.pad_token_id, with_labels=False)
            hidden = encoder(**batch).last_hidden_state
            mean = mean_of_real_tokens(hidden, batch["attention_mask"])
            vectors.append(torch.nn.functional.normalize(mean, dim=-1).double().numpy())
    return np.concatenate(vectors)


def _classifier(body_dir: Path, label_list: Sequence[str], weights: np.ndarray, bias: np.ndarray,
                config: dict[str, Any], max_length: int) -> torch.nn.Module:
    """The body under a linear head on the mean of its final token vectors, the regression's weights in it."""
    import torch

    from bertforge.model import label_maps
    from bertforge.model.auto import load_for_job
    from bertforge.model.task_heads import TASK_HEAD_KEY, TaskHead

    head = TaskHead("sequence-classification", pooling="mean", normalize=True)
    model = load_for_job(body_dir, "sequence-classification", **label_maps(list(label_list)), **config,
                         **{TASK_HEAD_KEY: head.to_dict()})
    output = next(module.output for module in model.modules()
                  if hasattr(module, "mean_pooling") and isinstance(getattr(module, "output", None), torch.nn.Linear))
    with torch.no_grad():
        output.weight.copy_(torch.as_tensor(weights, dtype=output.weight.dtype))
        output.bias.copy_(torch.as_tensor(bias, dtype=output.bias.dtype))
    model.max_length = max_length  # the setfit files' max_seq_length: what the head was fitted on
    return model.eval()


__all__ = ["BODY_BATCH_SIZE", "BODY_DIR", "BODY_EPOCHS", "BODY_LR", "BODY_SETTINGS", "PAIR_ITERATIONS",
           "body_steps_per_epoch", "pair_count", "sentence_pairs", "train_setfit"]
