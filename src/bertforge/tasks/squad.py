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
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bertforge.tasks.glue import DataFormatError
from bertforge.tasks.metrics import detect_squad_version


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
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise DataFormatError(path, line, None, f"not UTF-8 text (byte offset {exc.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, "json", f"{exc.msg} (column {exc.colno})") from None
    except (RecursionError, ValueError) as exc:  # nesting too deep, integers too long to convert
        raise DataFormatError(path, None, "json", str(exc) or type(exc).__name__) from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise DataFormatError(path, 1, "data", "not a SQuAD file: expected an object with a 'data' list")
    return text, data


def read_squad(path: str | Path, *, on_misaligned: Literal["raise", "skip"] = "raise") -> list[SquadExample]:
    """Read a SQuAD v1.1 or v2.0 file into one example per question, in file order.

    Raises `DataFormatError` for malformed JSON, a missing or mistyped field (named by its JSON path,
    e.g. `data[3].paragraphs[0].qas[7].answers[0].answer_start`), a duplicate question id, an
    answerable question without answers, an unanswerable one with answers, and (unless
    `on_misaligned="skip"`) an answer that is not at its `answer_start` in the context. Skipped answers
    are counted in a warning; a question left without answers is dropped with them.
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
            for q, qa in enumerate(need(paragraph, "qas", list, where_p)):
                where_q = f"{where_p}.qas[{q}]"
                qid = qa.get("id") if isinstance(qa, Mapping) else None
                qid = need(qa, "id", str, where_q, qid)
                line = locate.line_of(qid)
                if qid in seen:
                    raise DataFormatError(path, line, f"{where_q}.id", f"duplicate question id {qid!r}")
                seen.add(qid)
                question = need(qa, "question", str, where_q, qid)
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
                    if qa["answers"] and on_misaligned == "skip":
                        dropped_questions += 1
                        continue
                    raise DataFormatError(path, line, f"{where_q}.answers",
                                          f"question {qid} has no answers and is not marked is_impossible"
                                          + ("" if version == "2.0" else " (SQuAD v1.1 has no such questions)"))
                examples.append(SquadExample(qid, title, question, context, answers, impossible))
    if skipped_answers:
        warnings.warn(f"{path}: skipped {skipped_answers} answers not found at their answer_start; "
                      f"{dropped_questions} questions were left without answers and dropped", stacklevel=2)
    return examples
