"""Evaluation metrics with the official definitions, so that our numbers are the ones users compare.

- GLUE: accuracy, binary F1 (positive class 1), Matthews correlation, Pearson and Spearman, computed by
  scikit-learn and scipy, which is what the GLUE baselines and `transformers`' `run_glue` use. Keys
  follow the Hugging Face GLUE metric: `accuracy`, `f1`, `matthews_correlation`, `pearson`, `spearmanr`.
  Values are fractions in [0, 1] (correlations in [-1, 1]).
- CoNLL: entity-level precision / recall / F1 with the chunk rules of the `conlleval` perl script
  (version 2004-01-26), which reads IOB1 and IOB2 alike. Fractions in [0, 1]; `conlleval_report`
  prints them the way the script does, as percentages.
- SQuAD: exact match and F1 as the official v1.1 and v2.0 evaluation scripts compute them, returned
  under the keys those scripts print, as percentages.
- SWAG: multiple-choice accuracy.
- Your own labels (`tasks.classify`): accuracy, macro / micro F1, per-class precision / recall / F1 and
  the confusion matrix; multi-label micro / macro F1 and subset accuracy; Pearson, Spearman and MSE.
"""

from __future__ import annotations

import math
import re
import string
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------------
# GLUE
# ---------------------------------------------------------------------------------------------------


def _pair(predictions: Sequence[Any], labels: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    preds, golds = np.asarray(predictions), np.asarray(labels)
    if preds.shape[0] != golds.shape[0]:
        raise ValueError(f"{preds.shape[0]} predictions but {golds.shape[0]} labels")
    if preds.shape[0] == 0:
        raise ValueError("no predictions to score")
    return preds, golds


def accuracy(predictions: Sequence[Any], labels: Sequence[Any]) -> float:
    """The fraction of predictions equal to their label."""
    preds, golds = _pair(predictions, labels)
    return float(np.mean(preds == golds))


def binary_f1(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """F1 of the positive class 1 (MRPC: paraphrase, QQP: duplicate), as GLUE reports it.

    0.0 when neither the predictions nor the labels contain a positive.
    """
    from sklearn.metrics import f1_score

    preds, golds = _pair(predictions, labels)
    return float(f1_score(golds, preds, pos_label=1, average="binary", zero_division=0.0))


def matthews_corr(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation (CoLA; for more than two classes, the R_K of the AX diagnostic).

    0.0 when it is undefined, e.g. when every prediction is the same class.
    """
    from sklearn.metrics import matthews_corrcoef

    preds, golds = _pair(predictions, labels)
    return float(matthews_corrcoef(golds, preds))


def pearson_spearman(predictions: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation (STS-B). NaN when either side is constant."""
    from scipy.stats import pearsonr, spearmanr

    preds, golds = _pair(predictions, labels)
    preds, golds = preds.astype(np.float64), golds.astype(np.float64)
    if preds.shape[0] < 2 or np.all(preds == preds[0]) or np.all(golds == golds[0]):
        return {"pearson": math.nan, "spearmanr": math.nan}
    return {
        "pearson": float(pearsonr(preds, golds)[0]),
        "spearmanr": float(spearmanr(preds, golds)[0]),
    }


def mnli_accuracy(matched_predictions: Sequence[Any], matched_labels: Sequence[Any],
                  mismatched_predictions: Sequence[Any], mismatched_labels: Sequence[Any]) -> dict[str, float]:
    """MNLI's two dev/test sets, reported side by side as MNLI-m and MNLI-mm."""
    return {
        "accuracy_matched": accuracy(matched_predictions, matched_labels),
        "accuracy_mismatched": accuracy(mismatched_predictions, mismatched_labels),
    }


# canonical task name -> the metrics GLUE reports for it
GLUE_METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "qqp": ("accuracy", "f1"),
    "mnli": ("accuracy",),
    "mnli_matched": ("accuracy",),
    "mnli_mismatched": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
    "ax": ("matthews_correlation",),
}
_GLUE_ALIASES = {"mnlim": "mnli_matched", "mnlimatched": "mnli_matched",
                 "mnlimm": "mnli_mismatched", "mnlimismatched": "mnli_mismatched", "diagnostic": "ax"}


def canonical_glue_task(task_name: str) -> str:
    """`"SST-2"`, `"sst_2"`, `"sst2"` -> `"sst2"`; `"MNLI-mm"` -> `"mnli_mismatched"`."""
    key = re.sub(r"[-_ ]", "", task_name.lower())
    key = _GLUE_ALIASES.get(key, key)
    if key not in GLUE_METRIC_NAMES:
        raise ValueError(f"unknown GLUE task {task_name!r}; known: {', '.join(sorted(GLUE_METRIC_NAMES))}")
    return key


def glue_metrics(task_name: str, predictions: Sequence[Any], labels: Sequence[Any]) -> dict[str, float]:
    """The metrics GLUE reports for `task_name`, keyed as the Hugging Face GLUE metric keys them.

    Classification tasks take class ids (`predictions` may also be a (N, C) array of scores, reduced by
    argmax); STS-B takes the predicted and gold similarity scores.

    >>> glue_metrics("MRPC", [1, 0, 1, 1], [1, 0, 0, 1])
    {'accuracy': 0.75, 'f1': 0.8}
    """
    task = canonical_glue_task(task_name)
    if task == "stsb":
        return pearson_spearman(np.asarray(predictions, dtype=np.float64).reshape(-1), labels)
    preds = np.asarray(predictions)
    if preds.ndim == 2:
        preds = preds.argmax(axis=-1)
    out: dict[str, float] = {}
    for name in GLUE_METRIC_NAMES[task]:
        if name == "accuracy":
            out[name] = accuracy(preds, labels)
        elif name == "f1":
            out[name] = binary_f1(preds, labels)
        else:
            out[name] = matthews_corr(preds, labels)
    return out


# ---------------------------------------------------------------------------------------------------
# your own classification data (tasks.classify): scikit-learn's definitions, labels by name
# ---------------------------------------------------------------------------------------------------
def _per_label(precision: Any, recall: Any, f1: Any, support: Any, names: Sequence[str]) -> dict[str, dict]:
    return {name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(n)}
            for name, p, r, f, n in zip(names, precision, recall, f1, support, strict=True)}


def classification_report(predictions: Sequence[str], labels: Sequence[str],
                          names: Sequence[str]) -> dict[str, Any]:
    """Single-label scores over the classes `names`: {"metrics": {accuracy, macro_f1, micro_f1},
    "per_class": {name: {precision, recall, f1, support}}, "confusion_matrix": {labels, matrix}}.

    Macro F1 averages the classes' F1 equally (a class never predicted counts 0); micro F1 pools
    every decision, which for one label per row equals accuracy. Matrix rows are gold classes,
    columns predicted ones, both in `names` order.
    """
    from sklearn.metrics import confusion_matrix, f1_score, precision_recall_fscore_support

    preds, golds = _pair(predictions, labels)
    names = list(names)
    scores = precision_recall_fscore_support(golds, preds, labels=names, zero_division=0.0)
    return {
        "metrics": {"accuracy": accuracy(preds, golds),
                    "macro_f1": float(f1_score(golds, preds, labels=names, average="macro", zero_division=0.0)),
                    "micro_f1": float(f1_score(golds, preds, labels=names, average="micro", zero_division=0.0))},
        "per_class": _per_label(*scores, names),
        "confusion_matrix": {"labels": names,
                             "matrix": confusion_matrix(golds, preds, labels=names).tolist()},
    }


def multi_label_report(predictions: Sequence[Sequence[str]], labels: Sequence[Sequence[str]],
                       names: Sequence[str]) -> dict[str, Any]:
    """Multi-label scores over the labels `names`: {"metrics": {micro_f1, macro_f1, subset_accuracy},
    "per_label": {name: {precision, recall, f1, support}}}. Subset accuracy counts a row right only
    when its whole predicted set equals its gold set."""
    from sklearn.metrics import accuracy_score, f1_score, precision_recall_fscore_support
    from sklearn.preprocessing import MultiLabelBinarizer

    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions but {len(labels)} labels")
    if not labels:
        raise ValueError("no predictions to score")
    binarizer = MultiLabelBinarizer(classes=list(names))
    preds, golds = binarizer.fit_transform(predictions), binarizer.transform(labels)
    return {
        "metrics": {"micro_f1": float(f1_score(golds, preds, average="micro", zero_division=0.0)),
                    "macro_f1": float(f1_score(golds, preds, average="macro", zero_division=0.0)),
                    "subset_accuracy": float(accuracy_score(golds, preds))},
        "per_label": _per_label(*precision_recall_fscore_support(golds, preds, zero_division=0.0), names),
    }


def regression_metrics(predictions: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    """Pearson and Spearman correlation (NaN when either side is constant) and the mean squared error."""
    from sklearn.metrics import mean_squared_error

    correlations = pearson_spearman(predictions, labels)
    return {"pearson": correlations["pearson"], "spearman": correlations["spearmanr"],
            "mse": float(mean_squared_error(np.asarray(labels, dtype=np.float64),
                                            np.asarray(predictions, dtype=np.float64)))}


# ---------------------------------------------------------------------------------------------------
# SWAG / multiple choice
# ---------------------------------------------------------------------------------------------------


def multiple_choice_accuracy(predictions: Sequence[Any], labels: Sequence[int]) -> dict[str, float]:
    """SWAG accuracy. `predictions` are chosen indices, or (N, C) choice scores reduced by argmax."""
    preds = np.asarray(predictions)
    if preds.ndim == 2:
        preds = preds.argmax(axis=-1)
    return {"accuracy": accuracy(preds, labels)}


# ---------------------------------------------------------------------------------------------------
# CoNLL: conlleval's chunk rules
#
# conlleval reads one token per line (gold tag, then guessed tag) and decides, between the previous
# token and the current one, whether a chunk ended and whether one started. A tag is split at its
# first hyphen into a prefix (B, I, O, and the E, [, ], . of other representations) and a type.
# Because a type change or an I- after O starts a chunk, the same rules read IOB1 and IOB2: in both,
# "O I-PER" starts a PER chunk and "I-PER B-PER" starts a second one. A gold chunk is found correctly
# when the guess starts a chunk of the same type on the same token and ends it on the same token.
# Sentence boundaries count as an O for both sides, so no chunk crosses one.
# ---------------------------------------------------------------------------------------------------

_ENDS = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")}
_STARTS = {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")}


def _split_tag(tag: str) -> tuple[str, str]:
    prefix, hyphen, kind = tag.partition("-")
    if not hyphen:
        return tag, ""
    return prefix, ("" if kind == "0" else kind)  # the script reads the type "0" as false, i.e. none


def _chunk_ends(prev: str, cur: str, prev_type: str, cur_type: str) -> bool:
    return ((prev, cur) in _ENDS or prev in ("[", "]")
            or (prev not in ("O", ".") and prev_type != cur_type))


def _chunk_starts(prev: str, cur: str, prev_type: str, cur_type: str) -> bool:
    return ((prev, cur) in _STARTS or cur in ("[", "]")
            or (cur not in ("O", ".") and prev_type != cur_type))


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float]:
    precision = correct / guessed if guessed else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def conll_f1(gold_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> dict[str, Any]:
    """Entity-level precision, recall and F1 as `conlleval` computes them, overall and per type.

    Takes one tag list per sentence (a single flat list is read as one sentence); IOB1 and IOB2 tags
    may be mixed freely. Returns fractions in [0, 1]:

        {"precision", "recall", "f1", "accuracy" (token tags), "n_gold", "n_predicted", "n_correct",
         "n_tokens", "per_type": {type: {"precision", "recall", "f1", "n_gold", "n_predicted", "n_correct"}}}
    """
    if gold_tags and isinstance(gold_tags[0], str):
        gold_tags, predicted_tags = [gold_tags], [predicted_tags]  # type: ignore[list-item]
    if len(gold_tags) != len(predicted_tags):
        raise ValueError(f"{len(gold_tags)} gold sentences but {len(predicted_tags)} predicted")
    found_gold: Counter[str] = Counter()
    found_guess: Counter[str] = Counter()
    correct_chunks: Counter[str] = Counter()
    correct_tags = n_tokens = 0
    last_gold, last_gold_type, last_guess, last_guess_type = "O", "", "O", ""
    in_correct = False  # gold and guess started the same chunk and neither has ended yet

    for index, (gold_sentence, guess_sentence) in enumerate(zip(gold_tags, predicted_tags, strict=True)):
        if len(gold_sentence) != len(guess_sentence):
            raise ValueError(f"sentence {index}: {len(gold_sentence)} gold tags "
                             f"but {len(guess_sentence)} predicted")
        # the sentence's tokens, then a boundary that reads as O on both sides and is not a token
        steps = [(g, p, True) for g, p in zip(gold_sentence, guess_sentence, strict=True)]
        steps.append(("O", "O", False))
        for gold_tag, guess_tag, is_token in steps:
            gold, gold_type = _split_tag(gold_tag)
            guess, guess_type = _split_tag(guess_tag)
            gold_ends = _chunk_ends(last_gold, gold, last_gold_type, gold_type)
            guess_ends = _chunk_ends(last_guess, guess, last_guess_type, guess_type)
            if in_correct:
                if gold_ends and guess_ends and last_guess_type == last_gold_type:
                    in_correct = False
                    correct_chunks[last_gold_type] += 1
                elif gold_ends != guess_ends or guess_type != gold_type:
                    in_correct = False
            gold_starts = _chunk_starts(last_gold, gold, last_gold_type, gold_type)
            guess_starts = _chunk_starts(last_guess, guess, last_guess_type, guess_type)
            if gold_starts and guess_starts and guess_type == gold_type:
                in_correct = True
            if gold_starts:
                found_gold[gold_type] += 1
            if guess_starts:
                found_guess[guess_type] += 1
            if is_token:
                n_tokens += 1
                correct_tags += gold == guess and gold_type == guess_type
            last_gold, last_gold_type, last_guess, last_guess_type = gold, gold_type, guess, guess_type
    if in_correct:  # unreachable after a boundary step for B/I/O tags; kept for the bracket forms
        correct_chunks[last_gold_type] += 1

    n_correct, n_gold, n_guess = sum(correct_chunks.values()), sum(found_gold.values()), sum(found_guess.values())
    result: dict[str, Any] = _prf(n_correct, n_guess, n_gold)
    result.update(accuracy=correct_tags / n_tokens if n_tokens else 0.0, n_gold=n_gold, n_predicted=n_guess,
                  n_correct=n_correct, n_tokens=n_tokens)
    result["per_type"] = {
        kind: {**_prf(correct_chunks[kind], found_guess[kind], found_gold[kind]), "n_gold": found_gold[kind],
               "n_predicted": found_guess[kind], "n_correct": correct_chunks[kind]}
        for kind in sorted(set(found_gold) | set(found_guess))
    }
    return result


def conlleval_report(result: Mapping[str, Any]) -> str:
    """`conll_f1`'s result as the lines conlleval prints (percentages, two decimals)."""
    lines = [f"processed {result['n_tokens']} tokens with {result['n_gold']} phrases; "
             f"found: {result['n_predicted']} phrases; correct: {result['n_correct']}."]
    if result["n_tokens"]:
        lines.append(f"accuracy: {100 * result['accuracy']:6.2f}%; precision: {100 * result['precision']:6.2f}%; "
                     f"recall: {100 * result['recall']:6.2f}%; FB1: {100 * result['f1']:6.2f}")
    for kind, row in result["per_type"].items():
        lines.append(f"{kind:>17}: precision: {100 * row['precision']:6.2f}%; recall: {100 * row['recall']:6.2f}%; "
                     f"FB1: {100 * row['f1']:6.2f}  {row['n_predicted']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# SQuAD: the official evaluation scripts' definitions
#
# Both versions normalise an answer the same way: lower-case, drop ASCII punctuation (Python's
# `string.punctuation`; other Unicode punctuation stays), drop the words a/an/the, collapse whitespace.
# EM is equality of normalised strings, F1 the harmonic mean of token precision and recall (tokens =
# the normalised string split on whitespace, counted as a multiset), each maximised over the gold
# answers. They differ on empty answers: v1.1 scores an empty token list 0 F1; v2.0 scores it 1 when
# both sides are empty (the "no answer" match) and 0 otherwise, and uses [""] as the gold of a question
# whose gold answers are all empty after normalisation.
# ---------------------------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """The official normalisation: lower, remove punctuation, remove a/an/the, fix whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(prediction: str, gold: str) -> int:
    """1 if the normalised strings are equal, else 0 (same in v1.1 and v2.0)."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str, *, version: str = "2.0") -> float:
    """Token F1 between normalised answers; `version` decides how an empty answer scores (see above)."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version.startswith("2") and (not pred_tokens or not gold_tokens):
        return float(pred_tokens == gold_tokens)
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def detect_squad_version(dataset_json: Mapping[str, Any]) -> str:
    """"2.0" if the file says so or any question has `is_impossible`, else "1.1"."""
    if str(dataset_json.get("version", "")).startswith("2"):
        return "2.0"
    for article in dataset_json.get("data", []):
        for paragraph in article.get("paragraphs", []) if isinstance(article, Mapping) else []:
            for qa in paragraph.get("qas", []) if isinstance(paragraph, Mapping) else []:
                if isinstance(qa, Mapping) and "is_impossible" in qa:
                    return "2.0"
    return "1.1"


def _questions(dataset_json: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """(question id, gold answer texts) in file order."""
    if not isinstance(dataset_json.get("data"), list):
        raise ValueError("not a SQuAD dataset: no 'data' list at the top level")
    out = []
    try:
        for article in dataset_json["data"]:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    golds = [answer["text"] for answer in qa["answers"]]
                    if not isinstance(qa["id"], str) or not all(isinstance(gold, str) for gold in golds):
                        raise TypeError(f"question id and answer texts must be strings (question {qa['id']!r})")
                    out.append((qa["id"], golds))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed SQuAD dataset: {type(exc).__name__} {exc}") from None
    if not out:
        raise ValueError("the dataset has no questions")
    return out


def squad_evaluate(dataset_json: Mapping[str, Any], predictions: Mapping[str, str],
                   na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, Any]:
    """Score `predictions` (question id -> answer text) as the official script of the file's version does.

    v1.1 returns `{"exact_match", "f1"}`; a question without a prediction scores 0 (with a warning),
    as in the official script.
    v2.0 returns `exact, f1, total`, then `HasAns_*` and `NoAns_*` when such questions exist, and, when
    `na_probs` (question id -> probability of no answer) is given, `best_exact, best_exact_thresh,
    best_f1, best_f1_thresh`: the scores at the no-answer threshold that maximises them. A question
    whose `na_probs` exceeds `na_prob_thresh` counts as answered "no answer". Every question needs a
    prediction (and an `na_probs` entry when given); the official script fails otherwise, and so do we,
    with the missing ids. All scores are percentages.
    """
    version = detect_squad_version(dataset_json)
    questions = _questions(dataset_json)
    for qid, _ in questions:
        if qid in predictions and not isinstance(predictions[qid], str):
            raise ValueError(f"the prediction for {qid} is a {type(predictions[qid]).__name__}, not a string")
        if na_probs is not None and qid in na_probs and (
                isinstance(na_probs[qid], bool) or not isinstance(na_probs[qid], int | float)):
            raise ValueError(f"the na_prob for {qid} is {na_probs[qid]!r:.40}, not a number")
    if version == "1.1":
        if na_probs is not None:
            raise ValueError("na_probs apply to SQuAD v2.0 only; this dataset is v1.1")
        return _evaluate_v1(questions, predictions)
    return _evaluate_v2(questions, predictions, na_probs, na_prob_thresh)


def _evaluate_v1(questions: list[tuple[str, list[str]]], predictions: Mapping[str, str]) -> dict[str, float]:
    exact = f1 = 0.0
    missing = [qid for qid, _ in questions if qid not in predictions]
    if missing:
        warnings.warn(f"{len(missing)} questions have no prediction and score 0 (first: {missing[0]})",
                      stacklevel=3)
    for qid, golds in questions:
        if qid in predictions:
            exact += max((squad_exact(predictions[qid], gold) for gold in golds), default=0)
            f1 += max((squad_f1(predictions[qid], gold, version="1.1") for gold in golds), default=0.0)
    return {"exact_match": 100.0 * exact / len(questions), "f1": 100.0 * f1 / len(questions)}


def _missing(ids: list[str], table: Mapping[str, Any], what: str) -> None:
    absent = [qid for qid in ids if qid not in table]
    if absent:
        shown = ", ".join(absent[:5]) + (", ..." if len(absent) > 5 else "")
        raise ValueError(f"{len(absent)} of {len(ids)} questions have no {what}: {shown}")


def _evaluate_v2(questions: list[tuple[str, list[str]]], predictions: Mapping[str, str],
                 na_probs: Mapping[str, float] | None, na_prob_thresh: float) -> dict[str, Any]:
    ids = [qid for qid, _ in questions]
    _missing(ids, predictions, "prediction")
    if na_probs is not None:
        _missing(ids, na_probs, "na_prob")
    has_answer = {qid: bool(golds) for qid, golds in questions}

    # raw scores: best over the non-empty gold answers, or against "" when there are none
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for qid, golds in questions:
        golds = [gold for gold in golds if normalize_answer(gold)] or [""]
        exact_raw[qid] = max(squad_exact(predictions[qid], gold) for gold in golds)
        f1_raw[qid] = max(squad_f1(predictions[qid], gold, version="2.0") for gold in golds)

    # a question predicted unanswerable scores 1 if it is, 0 if it is not
    probs = na_probs if na_probs is not None else dict.fromkeys(ids, 0.0)
    exact = {q: float(not has_answer[q]) if probs[q] > na_prob_thresh else s for q, s in exact_raw.items()}
    f1 = {q: float(not has_answer[q]) if probs[q] > na_prob_thresh else s for q, s in f1_raw.items()}

    def summary(qids: list[str]) -> tuple[float, float, int]:
        return (100.0 * sum(exact[q] for q in qids) / len(qids), 100.0 * sum(f1[q] for q in qids) / len(qids),
                len(qids))

    out: dict[str, Any] = dict(zip(("exact", "f1", "total"), summary(ids), strict=True))
    for prefix, qids in (("HasAns", [q for q in ids if has_answer[q]]),
                         ("NoAns", [q for q in ids if not has_answer[q]])):
        if qids:
            out.update(zip((f"{prefix}_exact", f"{prefix}_f1", f"{prefix}_total"), summary(qids), strict=True))
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_threshold(exact_raw, predictions, na_probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = _best_threshold(f1_raw, predictions, na_probs, has_answer)
    return out


def _best_threshold(raw: Mapping[str, float], predictions: Mapping[str, str], na_probs: Mapping[str, float],
                    has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """The official sweep: start with every question answered "no answer" (score = #unanswerable), then
    answer them one by one in increasing order of na_prob; an answerable question gains its raw score,
    an unanswerable one loses 1 if its prediction is non-empty. The threshold is the na_prob of the
    question after which the running score peaked (first peak; 0.0 if nothing beats the start).
    Ties in na_prob are taken in the order of the `na_probs` mapping, as the script's stable sort does.
    """
    score = best = float(sum(not answerable for answerable in has_answer.values()))
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in raw:
            continue
        if has_answer[qid]:
            score += raw[qid]
        elif predictions[qid]:
            score -= 1
        if score > best:
            best, best_thresh = score, float(na_probs[qid])
    return 100.0 * best / len(raw), best_thresh
