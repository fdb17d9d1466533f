"""Extractive question answering on the user's own files: SQuAD JSON or rows, v1 or v2 detected.

`bertforge finetune qa --train F --dev F [--test F]` reads, per file:

- a SQuAD-format JSON file (`.json`, v1.1 or v2.0 layout, `tasks.squad.read_squad`); a question with an
  empty `answers` list counts as unanswerable whether or not it says `is_impossible`;
- JSONL or Parquet rows (also .jsonl.gz etc., read by `bertforge.tables`) in the Hugging Face `squad`
  convention: `{"id", "question", "context", "answers": {"text": [...], "answer_start": [...]}}`, empty
  lists for a question without an answer. `id` may be left out (the row number is used); other column
  names by `id_column`, `question_column`, `context_column`, `answers_column`.

`bertforge.formats` tells them apart (`QA_FORMATS`): by the name, and by the content for a `.json` file
(a JSON document is SQuAD JSON, JSON lines are rows) or a name that says no format (`train.txt`); any
other file (CSV, say) is one `DataFormatError` line naming the formats read.

The data is SQuAD v2.0-like (questions may have no answer: the null score, and the no-answer threshold
tuned on dev and saved with the model) when any question of the train, dev or test file has none, else
v1.1-like. Every answer must sit in its context where its `answer_start` says; an empty question or
context is an error. Each problem is one `DataFormatError` naming the file, the line (JSON: the line
of the question's id; JSONL: the row's line; Parquet: the row) and the field.

Windows, max-context spans, answer decoding and the metrics (the official SQuAD EM / F1; v2.0 also
HasAns / NoAns and the best threshold) are the SQuAD task's (`squad.Squad`); the main metric is F1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bertforge.formats import detect_format
from bertforge.tasks.base import DataFormatError, OwnFiles
from bertforge.tasks.squad import SQUAD_DEFAULTS, Squad, SquadAnswer, SquadExample, read_squad

QA_SETTINGS: dict[str, Any] = {
    "train": None, "dev": None, "test": None,
    "id_column": "id", "question_column": "question", "context_column": "context", "answers_column": "answers",
}
QA_FORMATS = ("json", "jsonl", "parquet")  # `bertforge.formats` names, SQuAD JSON first where in doubt


@dataclass
class Qa(OwnFiles, Squad):
    """Span QA on the user's files (see the module docstring)."""

    name: str = "qa"
    family: ClassVar[str] = "qa"
    command_help: ClassVar[str] = """Fine-tune extractive QA on your own files: SQuAD-format .json (v1 or v2) or .jsonl / .parquet rows
    {id, question, context, answers: {text: [...], answer_start: [...]}} (empty lists: no answer). Reports
    SQuAD EM / F1; with unanswerable questions the no-answer threshold is tuned on dev and saved.

    Example: `bertforge finetune qa --train train.jsonl --dev dev.jsonl --model models/minilm --out runs/qa`
    """
    main_metric: ClassVar[str] = "f1"
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {
        "train": (str, "Training file: SQuAD-format .json, or .jsonl / .parquet rows {id, question, context, "
                       "answers: {text, answer_start}}. Or a Hub data set: org/name[@revision][:config][:split]."),
        "dev": (str, "Dev file (same kinds), scored after every epoch; a v2 no-answer threshold is tuned on it. Or a Hub data set: org/name[@revision][:config][:split]."),
        "test": (str, "Test file (same kinds), scored (if answered) and predicted at the end. Or a Hub data set: org/name[@revision][:config][:split]."),
        "question_column": (str, "Question column of rows (default question)."),
        "context_column": (str, "Context column of rows (default context)."),
        "answers_column": (str, "Answers column of rows (default answers)."),
        "id_column": (str, "Id column of rows (default id; without it the row number is the id)."),
        **{k: v for k, v in Squad.setting_options.items() if k != "train_articles"},
    }

    def __post_init__(self) -> None:
        if self.name != "qa":
            raise ValueError(f"the qa family has one task, 'qa' (files come from --train/--dev/--test), "
                             f"not {self.name!r}")
        self.settings = {**SQUAD_DEFAULTS, **QA_SETTINGS,
                         **{k: v for k, v in self.settings.items() if v is not None}}
        self._read: dict[str, list[SquadExample]] = {}

    # ---- reader

    def dev_split_keys(self, examples: Sequence[SquadExample]) -> tuple[list[Any] | None, list[Any] | None]:
        return None, [e.context for e in examples]  # a paragraph's questions together: no context seen in training

    def read(self, data_dir: str | Path | None, split: str) -> list[SquadExample]:  # type: ignore[override]
        path = self.file_of(data_dir, split)
        if not self.settings.get("version"):
            named = [f for s in ("train", "dev", "test") if (f := self.named_file(s)) is not None]
            every = [e for p in dict.fromkeys([*named, path]) for e in self._examples(p)]
            self.settings["version"] = "2.0" if any(e.is_impossible for e in every) else "1.1"
        return self._examples(path)

    def _examples(self, path: Path) -> list[SquadExample]:
        key = str(path)
        if key not in self._read:
            fmt = detect_format(path, QA_FORMATS)
            if fmt == "json":
                self._read[key] = read_squad(path, empty_means_impossible=True, require_text=True)
            else:
                self._read[key] = self._read_rows(path, fmt)
        return self._read[key]

    def _read_rows(self, path: Path, fmt: str) -> list[SquadExample]:
        from bertforge.tables import iter_rows

        id_col, question_col = str(self.settings["id_column"]), str(self.settings["question_column"])
        context_col, answers_col = str(self.settings["context_column"]), str(self.settings["answers_column"])
        examples: list[SquadExample] = []
        seen: dict[str, int] = {}
        labelled = self._is_labelled_split(path)  # train and dev must have answers; test may not
        columns = [question_col, context_col, *([answers_col] if labelled else [])]
        for row in iter_rows(path, columns, fmt=fmt):
            values, line = row.values, row.number
            qid = str(values.get(id_col, f"row-{line}"))
            if qid in seen:
                raise DataFormatError(path, line, id_col, f"duplicate id {qid!r} (first at {seen[qid]})")
            seen[qid] = line
            question, context = (_text(path, line, col, values[col]) for col in (question_col, context_col))
            # no answers column: an unlabelled row (to predict); an empty answer list: no answer (v2)
            answers = _answers(path, line, answers_col, values[answers_col], context) if answers_col in values else None
            examples.append(SquadExample(qid, str(values.get("title") or ""), question, context, answers or [],
                                         is_impossible=answers == [], article=len(examples)))
        return examples

    def _is_labelled_split(self, path: Path) -> bool:
        return any(self.named_file(s) == path for s in ("train", "dev"))

    def has_labels(self, examples: Sequence[Any]) -> bool:
        return bool(examples) and all(e.answers or e.is_impossible for e in examples)


def _text(path: Path, line: int, column: str, value: Any) -> str:
    if not isinstance(value, str):
        raise DataFormatError(path, line, column, f"expected text, got {type(value).__name__} {value!r:.60}")
    if not value.strip():
        raise DataFormatError(path, line, column, f"empty {column}")
    return value


def _answers(path: Path, line: int, column: str, value: Any, context: str) -> list[SquadAnswer]:
    """The answers of a row, each checked to sit in `context` at its `answer_start`."""
    if value is None:
        return []
    if not isinstance(value, dict) or not {"text", "answer_start"} <= set(value):
        raise DataFormatError(path, line, column, "expected {\"text\": [...], \"answer_start\": [...]}, "
                                                  f"got {value!r:.80}")
    texts, starts = value["text"], value["answer_start"]
    if not isinstance(texts, list) or not isinstance(starts, list):
        raise DataFormatError(path, line, column, "text and answer_start must be lists (empty: no answer)")
    if len(texts) != len(starts):
        raise DataFormatError(path, line, f"{column}.answer_start",
                              f"{len(starts)} answer_start values for {len(texts)} answer texts")
    answers = []
    for k, (text, start) in enumerate(zip(texts, starts, strict=True)):
        if not isinstance(text, str) or not text.strip():
            raise DataFormatError(path, line, f"{column}.text[{k}]", f"expected a non-empty answer, got {text!r:.60}")
        if not isinstance(start, int) or isinstance(start, bool):
            raise DataFormatError(path, line, f"{column}.answer_start[{k}]", f"expected an integer, got {start!r:.40}")
        if not 0 <= start <= len(context) - len(text):
            raise DataFormatError(path, line, f"{column}.answer_start[{k}]",
                                  f"answer {text!r:.60} at {start} lies outside its context "
                                  f"({len(context)} characters)")
        found = context[start:start + len(text)]
        if found != text:
            raise DataFormatError(path, line, f"{column}.answer_start[{k}]",
                                  f"answer {text!r:.60} is not at {start}: the context there reads {found!r:.60}")
        answers.append(SquadAnswer(text, start))
    return answers


__all__ = ["Qa"]
