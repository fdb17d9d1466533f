"""SQuAD v1.1 and v2.0: the reader.

Both versions share one JSON layout:

```
{"version": "1.1" | "v2.0", "data": [
  {"title": ..., "paragraphs": [
    {"context": ..., "qas": [
      {"id": ..., "question": ..., "answers": [{"text": ..., "answer_start": <char offset>}, ...],
       "is_impossible": <bool, v2.0 only>, "plausible_answers": [... v2.0, unanswerable only]}]}]}]}
```

The version is detected as `metrics.squad_evaluate` detects it (the `version` field, or any
`is_impossible` key). Each answer must sit in its context where it says: `context[answer_start:
answer_start + len(text)] == text`. A mismatch is reported with the article, the question id and the
line of that id in the file; `on_misaligned="skip"` drops such answers instead and reports how many.

For fine-tuning, `Squad()` declares the rest (`tasks.base.Task`), following the BERT paper:

- Windows. A feature is `[CLS] question [SEP] window [SEP]`: the question cut to `max_query_length`
  (64) pieces, the window a run of context pieces filling the rest of `max_length` (384). A context
  that does not fit is covered by overlapping windows whose starts are `doc_stride` (128) pieces
  apart, so every piece is seen with at least some context around it. For training, a window that
  holds the whole first answer points at it; any other window (and an unanswerable question) points
  at [CLS], position 0.
- Max context. A piece in several windows is only allowed to start an answer in the window where it
  has the most context on both sides (`base.max_context_score`).
- Spans. Per window, the 20 best start and 20 best end pieces (`n_best`) inside the context form
  candidate spans (end >= start, at most `max_answer_length` = 30 pieces, start in its max-context
  window), scored start logit + end logit. The answer text is cut from the original context with the
  tokenizer's character offsets, so accents, case and punctuation come out as written.
- No answer (v2.0). The null score is the lowest [CLS] start + end logit over the windows; the
  question is answered "" when null score - best span score exceeds `null_threshold`. That difference
  is written to `null_odds.json`; the threshold that maximises dev F1 (the official script's sweep)
  is tuned after fine-tuning and saved with the model.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from bertforge.fileio import NotUtf8Error, decode_utf8
from bertforge.hubdata import dataset_name
from bertforge.tasks.base import DataFormatError, Feature, Task, max_context_score
from bertforge.tasks.metrics import detect_squad_version, squad_evaluate

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer


@dataclass
class SquadAnswer:
    text: str
    answer_start: int  # character offset into the context


@dataclass
class SquadExample:
    id: str
    title: str
    question: str
    context: str
    answers: list[SquadAnswer] = field(default_factory=list)  # empty when unanswerable
    is_impossible: bool = False
    article: int = 0  # index of its article in the file's `data` list


class _Locator:
    """Finds the line of a question id in the raw text, to point errors at it."""

    def __init__(self, text: str) -> None:
        self.text = text

    def line_of(self, qid: Any) -> int | None:
        if not isinstance(qid, str):
            return None
        for needle in (json.dumps(qid, ensure_ascii=False), json.dumps(qid)):
            position = self.text.find(needle)
            if position >= 0:
                return self.text.count("\n", 0, position) + 1
        return None


def load_squad_json(path: str | Path) -> dict[str, Any]:
    """Parse a SQuAD file, turning bad bytes and bad JSON into `DataFormatError` with the line."""
    return _parse(Path(path))[1]


def _parse(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = decode_utf8(path.read_bytes(), path).removeprefix("\ufeff")
    except NotUtf8Error as exc:
        raise DataFormatError(path, exc.line, None, f"not UTF-8 text ({exc.detail})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, "json", f"{exc.msg} (column {exc.colno})") from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, integers too long to convert
        raise DataFormatError(path, None, "json", str(exc) or type(exc).__name__) from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataFormatError(path, 1, "data", "not a SQuAD file: expected an object with a 'data' list")
    return text, data


def squad_hub_examples(rows: Sequence[dict[str, Any]], source: str) -> list[SquadExample]:
    """Examples from the rows of a Hub data set in rajpurkar/squad's layout (id, title, context,
    question, answers {text: [...], answer_start: [...]}); no answers is unanswerable (v2.0). Articles
    are numbered by title in order, as the file reader numbers them."""
    examples: list[SquadExample] = []
    articles: dict[str, int] = {}
    for number, row in enumerate(rows, start=1):
        missing = [c for c in ("id", "context", "question", "answers") if c not in row]
        if missing:
            raise DataFormatError(source, number, missing[0], f"not SQuAD rows: columns are {', '.join(row)}")
        context, answers = str(row["context"]), row["answers"] or {}
        spans = []
        for text, start in zip(answers.get("text") or [], answers.get("answer_start") or [], strict=True):
            if context[start:start + len(text)] != text:
                raise DataFormatError(source, number, "answers", f"answer {text!r} is not at {start} in the context")
            spans.append(SquadAnswer(text, int(start)))
        title = str(row.get("title") or "")
        article = articles.setdefault(title, len(articles))
        examples.append(SquadExample(str(row["id"]), title, str(row["question"]), context, spans,
                                     is_impossible=not spans, article=article))
    return examples


def read_squad(path: str | Path, *, on_misaligned: Literal["raise", "skip"] = "raise",
               empty_means_impossible: bool = False, require_text: bool = False) -> list[SquadExample]:
    """Read a SQuAD v1.1 or v2.0 file into one example per question, in file order.

    Raises `DataFormatError` for malformed JSON, a missing or mistyped field (named by its JSON path,
    e.g. `data[3].paragraphs[0].qas[7].answers[0].answer_start`), a duplicate question id, an
    answerable question without answers, an unanswerable one with answers, and (unless
    `on_misaligned="skip"`) an answer that is not at its `answer_start` in the context. Skipped answers
    are counted in a warning; a question left without answers is dropped with them.
    `empty_means_impossible` reads a question with an empty `answers` list as unanswerable whether or
    not it says `is_impossible`; `require_text` rejects an empty (or all-space) question or context.
    """
    path = Path(path)
    text, data = _parse(path)
    version = detect_squad_version(data)
    locate = _Locator(text)

    def need(obj: Any, key: str, kind: type | tuple[type, ...], where: str, qid: Any = None) -> Any:
        if not isinstance(obj, Mapping):
            raise DataFormatError(path, locate.line_of(qid), where, f"expected an object, got {type(obj).__name__}")
        if key not in obj:
            raise DataFormatError(path, locate.line_of(qid), f"{where}.{key}", "missing")
        value = obj[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise DataFormatError(path, locate.line_of(qid), f"{where}.{key}",
                                  f"expected {names}, got {type(value).__name__} {value!r:.60}")
        return value

    examples: list[SquadExample] = []
    seen: set[str] = set()
    skipped_answers = dropped_questions = 0
    for a, article in enumerate(data["data"]):
        where_a = f"data[{a}]"
        title = article.get("title", "") if isinstance(article, Mapping) else ""
        if not isinstance(title, str):
            raise DataFormatError(path, None, f"{where_a}.title", f"expected str, got {type(title).__name__}")
        for p, paragraph in enumerate(need(article, "paragraphs", list, where_a)):
            where_p = f"{where_a}.paragraphs[{p}]"
            context = need(paragraph, "context", str, where_p)
            if require_text and not context.strip():
                raise DataFormatError(path, None, f"{where_p}.context", "empty context")
            for q, qa in enumerate(need(paragraph, "qas", list, where_p)):
                where_q = f"{where_p}.qas[{q}]"
                qid = qa.get("id") if isinstance(qa, Mapping) else None
                qid = need(qa, "id", str, where_q, qid)
                line = locate.line_of(qid)
                if qid in seen:
                    raise DataFormatError(path, line, f"{where_q}.id", f"duplicate question id {qid!r}")
                seen.add(qid)
                question = need(qa, "question", str, where_q, qid)
                if require_text and not question.strip():
                    raise DataFormatError(path, line, f"{where_q}.question", f"question {qid}: empty question")
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise DataFormatError(path, line, f"{where_q}.is_impossible",
                                          f"expected true or false, got {impossible!r:.60}")
                answers = []
                for k, answer in enumerate(need(qa, "answers", list, where_q, qid)):
                    where_k = f"{where_q}.answers[{k}]"
                    answer_text = need(answer, "text", str, where_k, qid)
                    start = need(answer, "answer_start", int, where_k, qid)
                    found = context[start:start + len(answer_text)] if start >= 0 else None
                    if found != answer_text:
                        if on_misaligned == "skip":
                            skipped_answers += 1
                            continue
                        raise DataFormatError(
                            path, line, where_k,
                            f"article {title!r}, question {qid}: answer {answer_text!r} is not at "
                            f"answer_start {start} (the context there reads {found!r})")
                    answers.append(SquadAnswer(answer_text, start))
                if impossible and answers:
                    raise DataFormatError(path, line, f"{where_q}.answers",
                                          f"question {qid} is marked is_impossible but has answers")
                if not impossible and not answers:
                    if not qa["answers"] and empty_means_impossible:
                        examples.append(SquadExample(qid, title, question, context, [], True, a))
                        continue
                    if qa["answers"] and on_misaligned == "skip":
                        dropped_questions += 1
                        continue
                    raise DataFormatError(path, line, f"{where_q}.answers",
                                          f"question {qid} has no answers and is not marked is_impossible"
                                          + ("" if version == "2.0" else " (SQuAD v1.1 has no such questions)"))
                examples.append(SquadExample(qid, title, question, context, answers, impossible, a))
    if skipped_answers:
        warnings.warn(f"{path}: skipped {skipped_answers} answers not found at their answer_start; "
                      f"{dropped_questions} questions were left without answers and dropped", stacklevel=2)
    return examples


# ------------------------------------------------------------------------------------------------
# fine-tuning: what the SQuAD task declares
# ------------------------------------------------------------------------------------------------
SQUAD_DEFAULTS: dict[str, Any] = {
    "doc_stride": 128,         # pieces between the starts of two consecutive windows of a context
    "max_query_length": 64,    # question pieces kept
    "n_best": 20,              # start and end candidates per window, and answers kept per question
    "max_answer_length": 30,   # pieces in an answer, at most
    "null_threshold": 0.0,     # v2.0: answer "" when null score - best span score is above this
}


@dataclass
class SquadWindow:
    """Where a feature's window sits in its example's context."""

    context_start: int                  # token position of the window's first context piece
    first_piece: int                    # index of that piece among the context's pieces
    length: int                         # context pieces in the window
    offsets: list[tuple[int, int]]      # (start, end) characters of every context piece (shared)
    max_context: list[bool]             # per window piece: may an answer start here?


@dataclass
class SquadPrediction:
    text: str                           # the answer ("" = no answer)
    null_odds: float | None             # v2.0: null score - best span score; None for v1.1
    best_span: str                      # the best non-empty span, whatever the null score says
    nbest: list[dict[str, Any]] = field(default_factory=list)  # text, score, probability, char start/end


def context_windows(n_pieces: int, budget: int, doc_stride: int) -> list[tuple[int, int]]:
    """(first piece, length) of each window over a context of `n_pieces` pieces, `budget` per window.

    Windows start 0, doc_stride, 2 doc_stride, ... (a stride longer than a window is cut to the
    window, so no piece is skipped) until one reaches the end of the context.
    """
    if budget < 1 or doc_stride < 1:
        raise ValueError(f"window budget and doc_stride must be positive, got {budget} and {doc_stride}")
    windows, start = [], 0
    while True:
        length = min(budget, n_pieces - start)
        windows.append((start, length))
        if start + length >= n_pieces:
            return windows
        start += min(length, doc_stride)


def char_span_to_pieces(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The first and last piece overlapping characters [start, end) of the context; None if none do."""
    first = next((i for i, (_, e) in enumerate(offsets) if e > start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


@dataclass
class Squad(Task):
    """Extractive QA (SQuAD v1.1 / v2.0): start and end logits over the context pieces of each window.

    `name` is "squad" (version read from the data), "v1.1" or "v2.0". `settings` may hold
    `doc_stride`, `max_query_length`, `n_best`, `max_answer_length`, `null_threshold` (defaults in
    `SQUAD_DEFAULTS`) and `train_articles`: N splits one file (or the directory's dev file) by
    article, the first N for training and the rest for evaluation (there is no public test set).
    """

    name: str = "squad"
    family: ClassVar[str] = "squad"
    command_help: ClassVar[str] = """Fine-tune span QA on SQuAD v1.1 or v2.0 and report the official EM / F1 (v2.0: also the tuned
    no-answer threshold, saved with the model).

    Example: `bertforge finetune squad --model models/minilm --data data/squad/dev-v1.1.json --train-articles 38 --out runs/squad`
    """
    default_max_length: ClassVar[int] = 384
    default_lr: ClassVar[float] = 5e-5
    output_names: ClassVar[tuple[str, ...]] = ("start_logits", "end_logits")
    token_outputs: ClassVar[tuple[str, ...]] = ("start_logits", "end_logits")
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {
        "doc_stride": (int, f"Pieces between window starts (default {SQUAD_DEFAULTS['doc_stride']})."),
        "max_query_length": (int, f"Question pieces kept (default {SQUAD_DEFAULTS['max_query_length']})."),
        "train_articles": (int, "Train on the first N articles of the (dev) file, evaluate on the rest."),
        "n_best": (int, f"Start and end candidates per window (default {SQUAD_DEFAULTS['n_best']})."),
        "max_answer_length": (int, f"Answer pieces at most (default {SQUAD_DEFAULTS['max_answer_length']})."),
    }

    def __post_init__(self) -> None:
        versions = {"squad": None, "v1.1": "1.1", "1.1": "1.1", "v2.0": "2.0", "2.0": "2.0",
                    "squad1.1": "1.1", "squad2.0": "2.0", "squad_v2": "2.0"}
        key = self.name.lower().replace("-", "")
        if key not in versions:
            raise ValueError(f"unknown SQuAD task {self.name!r}; use squad (auto), v1.1 or v2.0")
        self.settings = {**SQUAD_DEFAULTS, **self.settings}
        if versions[key] and not self.settings.get("version"):
            self.settings["version"] = versions[key]

    job = "question-answering"  # the model the task fine-tunes: the encoder plus this job's output layer
    inference_task = "question-answering"
    hub_dataset = "rajpurkar/squad"
    inference_default = True

    @classmethod
    def for_inference(cls, labels: Sequence[str], config: Any) -> Squad:
        return cls("v2.0" if config.extra.get("version_2_with_negative") else "v1.1")

    def inference_example(self, index: int, fields: dict[str, Any]) -> SquadExample:
        return SquadExample(str(index), "", fields["question"], fields["context"])

    @property
    def version(self) -> str:
        return self.settings.get("version") or "1.1"

    # ---- reader
    def data_file(self, data_dir: str | Path, split: str) -> Path:
        """The json file of `split`: `data_dir` itself if it is a file, else `<split>*.json` in it
        (`<split>-v<version>*.json` when the version is known, e.g. dev-v1.1.json)."""
        root = Path(data_dir)
        if root.is_file():
            return root
        if self.settings.get("train_articles"):
            split = "dev"
        version = self.settings.get("version")
        pattern = f"{split}-v{version}*.json" if version else f"{split}*.json"
        found = sorted(root.glob(pattern))
        if len(found) != 1:
            what = "no file" if not found else f"{len(found)} files ({', '.join(p.name for p in found)})"
            raise FileNotFoundError(f"{root}: {what} matching {pattern}; name the file, or the version "
                                    f"(task v1.1 / v2.0)")
        return found[0]

    def read(self, data_dir: str | Path, split: str) -> list[SquadExample]:
        hub = dataset_name(data_dir)
        n_train = self.settings.get("train_articles")
        if hub is not None:  # a Hub data set: rajpurkar/squad (v1.1) or rajpurkar/squad_v2
            source = str(hub)
            examples = squad_hub_examples(self.hub_split(hub, "dev" if n_train else split).rows(), source)
            version = "2.0" if any(e.is_impossible for e in examples) else "1.1"
        else:
            path = self.data_file(data_dir, split)
            source, examples = str(path), read_squad(path)
            version = None if self.settings.get("version") else detect_squad_version(load_squad_json(path))
        if not self.settings.get("version"):
            self.settings["version"] = version
        if n_train:
            keep = (lambda a: a < n_train) if split == "train" else (lambda a: a >= n_train)
            examples = [e for e in examples if keep(e.article)]
            if not examples:
                raise ValueError(f"{source}: no questions left for {split} with train_articles={n_train}")
        return examples

    def has_labels(self, examples: Sequence[Any]) -> bool:
        return bool(examples) and all(e.answers or e.is_impossible for e in examples)

    # ---- features
    def featurize(self, examples: Sequence[SquadExample], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        """Windows of every example; `meta` is a `SquadWindow`. Answers whose characters no piece
        covers (whitespace only) are skipped for training, with a count in a warning."""
        if not examples:
            return []
        doc_stride, max_query = int(self.settings["doc_stride"]), int(self.settings["max_query_length"])
        unlimited = 10**9  # the context is windowed here, so no tokenizer length limit applies
        questions = tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False,
                                           max_length=unlimited)["input_ids"]
        contexts = list(dict.fromkeys(e.context for e in examples))
        encoded = tokenizer.encode_batch(contexts, add_special_tokens=False, max_length=unlimited)["encodings"]
        by_context = dict(zip(contexts, encoded, strict=True))
        cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
        features, unaligned = [], 0
        for index, example in enumerate(examples):
            query = questions[index][:max_query]
            context = by_context[example.context]
            offsets = [tuple(o) for o in context.offsets]
            budget = max_length - len(query) - 3
            if budget < 1:
                raise ValueError(f"max_length {max_length} leaves no room for the context after a "
                                 f"{len(query)}-piece question; raise max_length or lower max_query_length")
            windows = context_windows(len(context.input_ids), budget, doc_stride)
            best = _best_window_per_piece(windows, len(context.input_ids))
            answer = None
            if example.answers:
                first = example.answers[0]
                answer = char_span_to_pieces(offsets, first.answer_start, first.answer_start + len(first.text))
                unaligned += answer is None
            for k, (first_piece, length) in enumerate(windows):
                ids = [cls_id, *query, sep_id, *context.input_ids[first_piece:first_piece + length], sep_id]
                context_start = len(query) + 2
                inputs: dict[str, Any] = {"input_ids": ids,
                                          "token_type_ids": [0] * context_start + [1] * (length + 1)}
                if example.is_impossible or answer is not None:
                    start = end = 0
                    if answer is not None and first_piece <= answer[0] and answer[1] < first_piece + length:
                        start = context_start + answer[0] - first_piece
                        end = context_start + answer[1] - first_piece
                    inputs["start_positions"], inputs["end_positions"] = start, end
                window = SquadWindow(context_start, first_piece, length, offsets,  # type: ignore[arg-type]
                                     [best[first_piece + i] == k for i in range(length)])
                features.append(Feature(inputs, index, window))
        if unaligned:
            warnings.warn(f"{unaligned} answers cover no context piece (whitespace only?) and are not "
                          f"trained on", stacklevel=2)
        return features

    # ---- post-processing
    def postprocess(self, examples: Sequence[SquadExample], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[SquadPrediction]:
        n_best, max_answer = int(self.settings["n_best"]), int(self.settings["max_answer_length"])
        threshold = float(self.settings["null_threshold"])
        per_example: list[list[tuple[Feature, dict[str, np.ndarray]]]] = [[] for _ in examples]
        for feature, output in zip(features, outputs, strict=True):
            per_example[feature.example].append((feature, output))

        predictions = []
        for example, pairs in zip(examples, per_example, strict=True):
            candidates: dict[tuple[int, int], float] = {}  # (first piece, last piece) -> best score
            null_score = math.inf
            for feature, output in pairs:
                window: SquadWindow = feature.meta
                starts, ends = output["start_logits"], output["end_logits"]
                null_score = min(null_score, float(starts[0] + ends[0]))
                lo, hi = window.context_start, window.context_start + window.length
                start_scores, end_scores = starts[lo:hi], ends[lo:hi]
                top_starts = np.argsort(-start_scores, kind="stable")[:n_best]
                top_ends = np.argsort(-end_scores, kind="stable")[:n_best]
                for a in top_starts.tolist():
                    if not window.max_context[a]:
                        continue
                    for b in top_ends.tolist():
                        if b < a or b - a + 1 > max_answer:
                            continue
                        span = (window.first_piece + a, window.first_piece + b)
                        score = float(start_scores[a] + end_scores[b])
                        if score > candidates.get(span, -math.inf):
                            candidates[span] = score
            offsets = pairs[0][0].meta.offsets if pairs else []
            predictions.append(self._answer(example, offsets, candidates, null_score, n_best, threshold))
        return predictions

    def _answer(self, example: SquadExample, offsets: Sequence[tuple[int, int]],
                candidates: dict[tuple[int, int], float], null_score: float, n_best: int,
                threshold: float) -> SquadPrediction:
        ranked = sorted(candidates.items(), key=lambda item: -item[1])
        nbest: list[dict[str, Any]] = []
        seen: set[str] = set()
        for (first, last), score in ranked:
            start, end = offsets[first][0], offsets[last][1]
            text = example.context[start:end]
            if text in seen:  # two piece spans with the same text (e.g. around a dropped character)
                continue
            seen.add(text)
            nbest.append({"text": text, "score": score, "start": start, "end": end})
            if len(nbest) == n_best:
                break
        if nbest:
            scores = np.array([c["score"] for c in nbest])
            probabilities = np.exp(scores - scores.max())
            probabilities /= probabilities.sum()
            for candidate, probability in zip(nbest, probabilities.tolist(), strict=True):
                candidate["probability"] = probability
        best_text = nbest[0]["text"] if nbest else ""
        best_score = nbest[0]["score"] if nbest else -math.inf
        if self.version != "2.0":
            return SquadPrediction(best_text, None, best_text, nbest)
        odds = null_score - best_score if nbest else math.inf
        odds = min(odds, 1e9)  # JSON has no infinity; no span at all is as sure a "no answer" as it gets
        return SquadPrediction("" if odds > threshold else best_text, float(odds), best_text, nbest)

    # ---- metrics and files
    def dataset_json(self, examples: Sequence[SquadExample]) -> dict[str, Any]:
        """The gold answers of `examples` in the SQuAD layout that `squad_evaluate` reads."""
        qas = [{"id": e.id, "answers": [{"text": a.text} for a in e.answers],
                **({"is_impossible": e.is_impossible} if self.version == "2.0" else {})} for e in examples]
        return {"version": "v2.0" if self.version == "2.0" else "1.1", "data": [{"paragraphs": [{"qas": qas}]}]}

    @property
    def main_metric(self) -> str:
        """F1; for v2.0 the F1 at the best null threshold, the one the saved model predicts with once tuned."""
        return "best_f1" if self.version == "2.0" else "f1"

    def metric(self, examples: Sequence[SquadExample], predictions: Sequence[SquadPrediction]) -> dict[str, float]:
        """The official script's numbers. v1.1: exact_match, f1. v2.0: exact, f1, HasAns_*, NoAns_* for
        the predictions as made (threshold `null_threshold`), and best_exact / best_f1 with their
        thresholds from the official sweep over null_odds on the best non-empty spans."""
        dataset = self.dataset_json(examples)
        answers = {e.id: p.text for e, p in zip(examples, predictions, strict=True)}
        result = squad_evaluate(dataset, answers)
        if self.version == "2.0":
            spans = {e.id: p.best_span for e, p in zip(examples, predictions, strict=True)}
            odds = {e.id: float(p.null_odds) for e, p in zip(examples, predictions, strict=True)}  # type: ignore[arg-type]
            swept = squad_evaluate(dataset, spans, odds, na_prob_thresh=math.inf)
            result.update({k: v for k, v in swept.items() if k.startswith("best_")})
        return {k: float(v) for k, v in result.items()}

    def tune(self, examples: Sequence[SquadExample], predictions: Sequence[SquadPrediction]) -> dict[str, Any]:
        """v2.0: the null threshold that maximises F1 on these (dev) examples."""
        if self.version != "2.0":
            return {}
        scores = self.metric(examples, predictions)
        threshold = scores["best_f1_thresh"]
        if predictions and self._f1_at(examples, predictions, threshold) < scores["best_f1"] - 1e-6:
            # the sweep peaked at its start, "no answer" everywhere, which the official script reports as
            # threshold 0.0 (its na_probs are probabilities); with null odds that is a threshold below all of them
            threshold = min(float(p.null_odds) for p in predictions) - 1.0  # type: ignore[arg-type]
        return {"null_threshold": threshold}

    def _f1_at(self, examples: Sequence[SquadExample], predictions: Sequence[SquadPrediction],
               threshold: float) -> float:
        """v2.0 F1 when "no answer" is predicted where the null odds exceed `threshold`."""
        answers = {e.id: "" if float(p.null_odds) > threshold else p.best_span  # type: ignore[arg-type]
                   for e, p in zip(examples, predictions, strict=True)}
        return float(squad_evaluate(self.dataset_json(examples), answers)["f1"])

    def write_predictions(self, examples: Sequence[SquadExample], predictions: Sequence[SquadPrediction],
                          out_dir: Path, split: str) -> list[Path]:
        """`predictions.json` (id -> answer, the official scripts' input), `nbest_predictions.json`, and
        for v2.0 `null_odds.json` (id -> null score - best span score, the scripts' --na-prob-file).
        Splits other than test get their name in the file names (`predictions-dev.json`)."""
        from bertforge.fileio import write_text_atomic

        suffix = "" if split == "test" else f"-{split}"
        out_dir = Path(out_dir)
        files = {f"predictions{suffix}.json": {e.id: p.text for e, p in zip(examples, predictions, strict=True)},
                 f"nbest_predictions{suffix}.json": {e.id: p.nbest for e, p in zip(examples, predictions,
                                                                                  strict=True)}}
        if self.version == "2.0":
            files[f"null_odds{suffix}.json"] = {e.id: p.null_odds for e, p in zip(examples, predictions, strict=True)}
        paths = []
        for name, content in files.items():
            write_text_atomic(out_dir / name, json.dumps(content, indent=1, ensure_ascii=False) + "\n")
            paths.append(out_dir / name)
        return paths


def _best_window_per_piece(windows: list[tuple[int, int]], n_pieces: int) -> list[int]:
    """For each context piece, the window (index) where it has the most context."""
    best, best_score = [0] * n_pieces, [-math.inf] * n_pieces
    for k, (first, length) in enumerate(windows):
        for piece in range(first, first + length):
            score = max_context_score(piece, first, length)
            if score > best_score[piece]:
                best[piece], best_score[piece] = k, score
    return best
