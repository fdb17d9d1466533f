"""Text classification on your own files: single-label, multi-label, regression, sentences or pairs.

    bertforge finetune classify --model models/minilm --train reviews.csv --dev reviews-dev.csv --out runs/reviews

The train, dev and (optional) test files are any table `bertforge.tables` reads: CSV, TSV, JSONL
(also compressed) or Parquet, with the text in `text_column` (default `text`), an optional second
text in `pair_column` and the label in `label_column` (default `label`). Their paths and every
column and label choice are task settings, so they are saved in `run_config.yaml` and a run repeats
with `--config`.

What the labels are (`problem_type`, the names `transformers` writes in config.json):

- `single_label_classification`: one class per row, string or integer labels. The classes are the
  distinct labels of the training file, sorted (numerically when every label is an integer), and
  become config.json's `id2label` / `label2id`. Softmax + cross-entropy.
- `multi_label_classification`: a set of labels per row, as a list (JSONL, Parquet, or a JSON list in a
  CSV cell) or one string joined by `label_delimiter`. Sigmoid + binary cross-entropy per label; each
  label's decision threshold is tuned on the dev file (the F1 of that label) and saved with the model.
- `regression`: one number per row. Mean squared error on one output.

`problem_type: auto` (the default) decides from the training labels: lists or a delimiter give
multi-label, a number with a fractional part (3.5) regression, anything else single-label.
`class_weights: balanced` weighs the loss by inverse class frequency (single-label) or each label's
negatives-to-positives ratio (multi-label), as scikit-learn's "balanced" does.

Bad input is refused before anything is written, as one `DataFormatError` naming the file, the row's
line and the column: a missing column, an empty file, a non-UTF-8 line (all found by `tables`), an
empty text, an empty or non-numeric label, and a dev or test label the training file does not have.

Metrics (scikit-learn and scipy): accuracy, macro and micro F1 (single-label; the main metric is
macro F1, which a majority-class guess cannot win on imbalanced data); micro and macro F1 and subset
accuracy (multi-label; main: micro F1); Pearson, Spearman and MSE (regression; main: Pearson). Per
class precision / recall / F1 / support and the confusion matrix go to `report-<split>.json` (and
`confusion-<split>.png`) beside the predictions, `predictions-<split>.jsonl` (or .csv): one row per
input row, in input order, with the predicted label name(s) and scores.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.tasks.base import DataFormatError, Feature, Task

if TYPE_CHECKING:
    import torch

    from bertforge.tokenizer import BertTokenizer

SINGLE, MULTI, REGRESSION = "single_label_classification", "multi_label_classification", "regression"
PROBLEM_TYPES = (SINGLE, MULTI, REGRESSION)
_PROBLEM_ALIASES = {"single_label": SINGLE, "single": SINGLE, "multi_label": MULTI, "multi": MULTI}
PREDICTION_FORMATS = ("jsonl", "csv")
MAIN_METRICS = {SINGLE: "macro_f1", MULTI: "micro_f1", REGRESSION: "pearson"}
DEFAULT_THRESHOLD = 0.5
_THRESHOLD_GRID = np.round(np.arange(0.05, 0.951, 0.05), 2)

# every setting, with its default; all of them are written to run_config.yaml resolved
DEFAULT_SETTINGS: dict[str, Any] = {
    "train": None, "dev": None, "test": None,
    "text_column": "text", "pair_column": None, "label_column": "label",
    "problem_type": "auto", "label_delimiter": None, "class_weights": "none", "predictions_format": "jsonl",
}
_FILE_SPLITS = ("train", "dev", "test")


@dataclass
class ClassifyExample:
    """One row of a user's file. `label` is a class name, a list of names (multi-label), a number
    (regression) or None (no label column); `source` and `row` locate it for messages."""

    text: str
    text_pair: str | None = None
    label: str | list[str] | float | None = None
    row: int = 0
    source: str = ""


@dataclass
class Classify(Task):
    """Text classification on the user's own files (see the module docstring)."""

    name: str = "classify"
    settings: dict[str, Any] = field(default_factory=dict)

    family: ClassVar[str] = "classify"
    command_help: ClassVar[str] = """Fine-tune text classification on your own CSV / TSV / JSONL / Parquet files: single-label
    (string or integer labels), multi-label (a list, or --label-delimiter), regression (numbers), sentence
    pairs (--pair-column). Writes per-class scores, a confusion matrix and predictions with label names.

    Example: `bertforge finetune classify --model models/minilm --train reviews.csv --dev reviews-dev.csv --out runs/reviews`
    Pairs, multi-label: `bertforge finetune classify --model models/minilm --train train.jsonl --dev dev.jsonl --text-column question --pair-column answer --label-column tags --label-delimiter , --out runs/tags`
    """
    reads_data_dir: ClassVar[bool] = False  # the files are settings (--train/--dev/--test), not a data directory
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {
        "train": (str, "Training file: .csv, .tsv, .jsonl (also .gz/.bz2/.xz/.zst) or .parquet. Or a Hub data set: org/name[@revision][:config][:split]."),
        "dev": (str, "Dev file, same columns: scored every epoch; multi-label thresholds are tuned on it. Or a Hub data set: org/name[@revision][:config][:split]."),
        "test": (str, "Optional test file, predicted (and scored, if it has labels) by the final model. Or a Hub data set: org/name[@revision][:config][:split]."),
        "text_column": (str, "The column holding the text (default text)."),
        "pair_column": (str, "A second text column for sentence pairs (default: none)."),
        "label_column": (str, "The column holding the label (default label)."),
        "problem_type": (str, "auto, single_label_classification, multi_label_classification or regression "
                              "(default auto: from the training labels)."),
        "label_delimiter": (str, "Multi-label: the labels of a row are one string joined by this (e.g. '|')."),
        "class_weights": (str, "none or balanced: weigh the loss by inverse label frequency (default none)."),
        "predictions_format": (str, "jsonl or csv: the format of the prediction files (default jsonl)."),
    }

    def __post_init__(self) -> None:
        unknown = set(self.settings) - set(DEFAULT_SETTINGS) - {"thresholds"}
        if unknown:
            raise ValueError(f"unknown classify setting(s): {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(DEFAULT_SETTINGS)}")
        self.settings = {**DEFAULT_SETTINGS, **{k: v for k, v in self.settings.items() if v is not None}}
        problem = str(self.settings["problem_type"])
        problem = _PROBLEM_ALIASES.get(problem, problem)
        if problem != "auto" and problem not in PROBLEM_TYPES:
            raise ValueError(f"problem_type {problem!r} is not auto or one of {', '.join(PROBLEM_TYPES)}")
        self.settings["problem_type"] = problem
        if self.settings["class_weights"] not in ("none", "balanced"):
            raise ValueError(f"class_weights {self.settings['class_weights']!r} is not none or balanced")
        if self.settings["predictions_format"] not in PREDICTION_FORMATS:
            raise ValueError(f"predictions_format {self.settings['predictions_format']!r} is not jsonl or csv")
        if self.settings["label_delimiter"] == "":
            raise ValueError("label_delimiter must not be empty")

    # ---- the head
    job = "sequence-classification"  # the model the task fine-tunes: the encoder plus this job's output layer
    inference_task = "text-classification"

    def inference_example(self, index: int, fields: dict[str, Any]) -> ClassifyExample:
        return ClassifyExample(fields["text"], fields.get("text_pair"))

    def inference_fields(self, example: ClassifyExample) -> dict[str, Any]:
        return {"text": example.text, "text_pair": example.text_pair}

    @property
    def problem_type(self) -> str:
        """The resolved problem type ("auto" until the training file has been read)."""
        return str(self.settings["problem_type"])

    @property
    def main_metric(self) -> str:
        """The metric that ranks checkpoints: macro F1, micro F1 (multi-label) or Pearson (regression)."""
        return MAIN_METRICS.get(self.problem_type, MAIN_METRICS[SINGLE])

    def config_overrides(self) -> dict[str, Any]:
        """config.json's `problem_type`, so that `transformers` picks the same loss and pipeline scores."""
        return {"problem_type": self.problem_type}

    def label_names(self, train_examples: Sequence[ClassifyExample]) -> list[str] | int:
        if self.problem_type == REGRESSION:
            return 1
        if self.problem_type == MULTI:
            names = sorted({name for e in train_examples for name in e.label or []})  # type: ignore[union-attr]
        else:
            names = sorted({str(e.label) for e in train_examples})
            if len(names) < 2:
                where = train_examples[0].source if train_examples else self.settings["train"]
                raise DataFormatError(where, None, self.settings["label_column"],
                                      f"only one label ({', '.join(names) or 'none'}) in the training file; "
                                      "classification needs at least two")
        if not names:
            raise DataFormatError(self.settings["train"], None, self.settings["label_column"],
                                  "no labels in the training file")
        if all(_is_integer_text(n) for n in names):
            names.sort(key=int)
        return names

    def configure_model(self, model: torch.nn.Module, train_examples: Sequence[ClassifyExample],
                        label_names: Sequence[str] | None) -> None:
        """Give the head its loss weights when `class_weights` is balanced."""
        if self.settings["class_weights"] == "none":
            return
        if self.problem_type == REGRESSION or not label_names:
            raise ValueError("class_weights balanced needs class labels; this is a regression task")
        import torch

        model.set_label_weights(torch.tensor(self.label_weights(train_examples, label_names)))  # type: ignore[operator]

    def label_weights(self, examples: Sequence[ClassifyExample], label_names: Sequence[str]) -> list[float]:
        """scikit-learn's "balanced": n / (K * count_k) per class; multi-label, negatives / positives per label."""
        total = len(examples)
        if self.problem_type == MULTI:
            positives = Counter(name for e in examples for name in e.label or [])  # type: ignore[union-attr]
            # a label on every row has no negatives: keep its weight neutral rather than zero
            return [max(total - positives[n], 1) / positives[n] if positives[n] < total else 1.0
                    for n in label_names]
        counts = Counter(str(e.label) for e in examples)
        return [total / (len(label_names) * counts[n]) for n in label_names]

    # ---- the reader
    def eval_splits(self) -> tuple[str, ...]:
        return ("dev",)

    def test_splits(self) -> tuple[str, ...]:
        return ("test",)

    def final_splits(self) -> tuple[str, ...]:
        return ("test",) if self.settings["test"] else ()

    def dev_split_keys(self, examples: Sequence[ClassifyExample]) -> tuple[list[Any] | None, list[Any] | None]:
        if self.problem_type == "single_label_classification":
            return [e.label for e in examples], None  # each class keeps its share of the rows
        return None, None

    def read(self, data_dir: str | Path | None, split: str) -> list[ClassifyExample]:
        """The rows of the `split` file ("train", "dev" or "test"; `data_dir` is not used).

        The training file decides the problem type when it is "auto". Train and dev must have the
        label column; a test file may lack it (then its examples carry no label).
        """
        if split not in _FILE_SPLITS:
            raise ValueError(f"classify has the splits {', '.join(_FILE_SPLITS)}, not {split!r}")
        if not self.settings[split]:
            raise ValueError(f"classify needs a {split} file (--{split} FILE, or {split}: in task_settings)")
        return self.read_file(self.file_of(None, split), labelled=None if split == "test" else True)

    def read_file(self, path: str | Path, *, labelled: bool | None = True) -> list[ClassifyExample]:
        """Examples from any table with this task's columns; `labelled` None: if it has the label column."""
        from bertforge.tables import column_names, iter_rows

        text_col, pair_col, label_col = (self.settings[k] for k in ("text_column", "pair_column", "label_column"))
        if labelled is None:
            labelled = label_col in column_names(path)
        columns = [text_col, *([pair_col] if pair_col else []), *([label_col] if labelled else [])]
        rows = [(row.number, row.values) for row in iter_rows(path, columns)]
        if labelled and self.problem_type == "auto":
            self.settings["problem_type"] = _detect_problem_type([v[label_col] for _, v in rows],
                                                                 self.settings["label_delimiter"])
        return [ClassifyExample(text=_text(values[text_col], path, number, text_col),
                                text_pair=_text(values[pair_col], path, number, pair_col) if pair_col else None,
                                label=self._label(values[label_col], path, number) if labelled else None,
                                row=number, source=str(path))
                for number, values in rows]

    def _label(self, value: Any, path: str | Path, row: int) -> str | list[str] | float:
        column = self.settings["label_column"]
        problem = self.problem_type
        if problem == REGRESSION:
            return _number(value, path, row, column)
        if problem == MULTI:
            return _label_set(value, self.settings["label_delimiter"], path, row, column)
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataFormatError(path, row, column, "empty label")
        if isinstance(value, list | dict):
            raise DataFormatError(path, row, column, f"a {type(value).__name__} label in single-label "
                                  "classification; for several labels per row use --problem-type "
                                  "multi_label_classification")
        return _label_name(value)

    # ---- features
    def featurize(self, examples: Sequence[ClassifyExample], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        texts: list[Any] = [e.text if e.text_pair is None else (e.text, e.text_pair) for e in examples]
        encoded = tokenizer.encode_batch(texts, max_length=max_length, truncation=True)
        index = {name: i for i, name in enumerate(label_names or [])}
        features = []
        for i, example in enumerate(examples):
            inputs: dict[str, Any] = {"input_ids": encoded["input_ids"][i],
                                      "token_type_ids": encoded["token_type_ids"][i]}
            if example.label is not None:
                inputs["labels"] = self._label_target(example, index)
            features.append(Feature(inputs, i))
        return features

    def _label_target(self, example: ClassifyExample, index: dict[str, int]) -> int | float | list[float]:
        if self.problem_type == REGRESSION:
            return float(example.label)  # type: ignore[arg-type]
        names = example.label if isinstance(example.label, list) else [str(example.label)]
        for name in names:
            if name not in index:
                known = ", ".join(index) if len(index) <= 20 else ", ".join(list(index)[:20]) + ", ..."
                raise DataFormatError(example.source, example.row, self.settings["label_column"],
                                      f"label {name!r} does not occur in the training file (its labels: {known})")
        if self.problem_type == MULTI:
            target = [0.0] * len(index)
            for name in names:
                target[index[name]] = 1.0
            return target
        return index[names[0]]

    # ---- post-processing and metrics
    def postprocess(self, examples: Sequence[ClassifyExample], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Per example: {"label", "score", "scores"} (single-label: softmax), {"labels", "scores"}
        (multi-label: sigmoid, labels at or above their threshold) or {"score"} (regression)."""
        return [self.decide(out["logits"], label_names) for out in outputs]

    def decide(self, logits: np.ndarray, label_names: Sequence[str] | None) -> dict[str, Any]:
        """One prediction from one row's logits (num_labels,), the way `postprocess` makes it."""
        logits = np.asarray(logits, dtype=np.float64).reshape(-1)
        if self.problem_type == REGRESSION:
            return {"score": float(logits[0])}
        names = list(label_names or [f"LABEL_{i}" for i in range(len(logits))])
        if self.problem_type == MULTI:
            probs = 1.0 / (1.0 + np.exp(-logits))
            thresholds = self.settings.get("thresholds") or {}
            chosen = [n for n, p in zip(names, probs, strict=True) if p >= thresholds.get(n, DEFAULT_THRESHOLD)]
            return {"labels": chosen, "scores": dict(zip(names, map(float, probs), strict=True))}
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        best = int(np.argmax(probs))
        return {"label": names[best], "score": float(probs[best]),
                "scores": dict(zip(names, map(float, probs), strict=True))}

    def metric(self, examples: Sequence[ClassifyExample], predictions: Sequence[dict[str, Any]]) -> dict[str, float]:
        return self.report(examples, predictions)["metrics"]

    def report(self, examples: Sequence[ClassifyExample], predictions: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """The metrics, and per class (or label) precision / recall / F1 / support and the confusion matrix."""
        from bertforge.tasks.metrics import classification_report, multi_label_report, regression_metrics

        if self.problem_type == REGRESSION:
            return {"metrics": regression_metrics([p["score"] for p in predictions],
                                                  [float(e.label) for e in examples])}  # type: ignore[arg-type]
        names = list(predictions[0]["scores"]) if predictions else []
        if self.problem_type == MULTI:
            return multi_label_report([p["labels"] for p in predictions],
                                      [e.label for e in examples], names)  # type: ignore[misc]
        return classification_report([p["label"] for p in predictions], [str(e.label) for e in examples], names)

    def tune(self, examples: Sequence[ClassifyExample], predictions: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Multi-label: each label's threshold, the one of 0.05, 0.10, ..., 0.95 with the best F1 of that
        label on dev (ties: the one nearest 0.5; a label with no dev positive keeps 0.5)."""
        if self.problem_type != MULTI or not examples:
            return {}
        from sklearn.metrics import f1_score

        names = list(predictions[0]["scores"])
        thresholds = {}
        for name in names:
            gold = np.array([name in (e.label or []) for e in examples])
            probs = np.array([p["scores"][name] for p in predictions])
            if not gold.any():
                thresholds[name] = DEFAULT_THRESHOLD
                continue
            scores = [f1_score(gold, probs >= t, zero_division=0.0) for t in _THRESHOLD_GRID]
            best = max(scores)
            candidates = [t for t, s in zip(_THRESHOLD_GRID, scores, strict=True) if s == best]
            thresholds[name] = float(min(candidates, key=lambda t: abs(t - DEFAULT_THRESHOLD)))
        return {"thresholds": thresholds}

    # ---- prediction files
    def write_predictions(self, examples: Sequence[ClassifyExample], predictions: Sequence[dict[str, Any]],
                          out_dir: Path, split: str) -> list[Path]:
        """`predictions-<split>.jsonl` (or .csv): per input row, in order, its line or row number, the text(s),
        the prediction and the gold label when the file has one; with labels also `report-<split>.json`
        and, single-label, `confusion-<split>.png`."""
        from bertforge.fileio import write_text_atomic
        from bertforge.tables import write_all

        out_dir = Path(out_dir)
        path = out_dir / f"predictions-{split}.{self.settings['predictions_format']}"
        write_all(path, (self.prediction_row(e, p) for e, p in zip(examples, predictions, strict=True)))
        files = [path]
        if self.has_labels(examples):
            report = self.report(examples, predictions)
            if self.settings.get("thresholds"):
                report["thresholds"] = self.settings["thresholds"]
            report_path = out_dir / f"report-{split}.json"
            write_text_atomic(report_path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
            files.append(report_path)
            if "confusion_matrix" in report:
                files.append(plot_confusion(report["confusion_matrix"], out_dir / f"confusion-{split}.png",
                                            title=f"{self.name} {split}"))
        return files

    def prediction_row(self, example: ClassifyExample, prediction: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"row": example.row, "text": example.text}
        if example.text_pair is not None:
            row["text_pair"] = example.text_pair
        row.update(prediction)
        if isinstance(prediction.get("scores"), dict):  # every label ranked, best first: predict's and serve's shape
            row["scores"] = [{"label": name, "score": score}
                             for name, score in sorted(prediction["scores"].items(), key=lambda x: -x[1])]
        if example.label is not None:
            row["gold"] = example.label
        return row


# ------------------------------------------------------------------------------------------------
# reading values
# ------------------------------------------------------------------------------------------------
def _text(value: Any, path: str | Path, row: int, column: str) -> str:
    """A text cell. A number (JSONL, Parquet) is refused as predict refuses it, rather than trained on as
    its digits: a numeric column named as the text is a wrong column far more often than text."""
    if value is not None and not isinstance(value, str):
        raise DataFormatError(path, row, column, f"not text ({type(value).__name__}); name the column that "
                                                 "holds the text")
    text = "" if value is None else value
    if not text.strip():
        raise DataFormatError(path, row, column, "empty text")
    return text


def _number(value: Any, path: str | Path, row: int, column: str) -> float:
    if isinstance(value, bool) or value is None:
        raise DataFormatError(path, row, column, f"{value!r} is not a number (regression labels are numbers)")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DataFormatError(path, row, column,
                              f"{value!r} is not a number (regression labels are numbers)") from None
    if not math.isfinite(number):
        raise DataFormatError(path, row, column, f"{value!r} is not a finite number")
    return number


def _label_name(value: Any) -> str:
    """A class label as its name: strings as they are (stripped), numbers and booleans as JSON writes them."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # a Parquet or JSON 1.0 is the class "1", as in a CSV
    return str(value)


def _json_list(value: str) -> list[Any] | None:
    """A JSON list written in a text cell (as `tables.write_rows` writes lists to CSV), else None."""
    text = value.strip()
    if not text.startswith("["):
        return None
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, RecursionError):  # not a list of labels: the cell is one label's text
        return None
    return parsed if isinstance(parsed, list) else None


def _label_set(value: Any, delimiter: str | None, path: str | Path, row: int, column: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        listed = _json_list(value) if delimiter is None else None
        if listed is None:
            parts = value.split(delimiter) if delimiter else [value]
            listed = [p for p in parts if p.strip()]
        value = listed
    if not isinstance(value, list | tuple):
        value = [value]
    names: list[str] = []
    for item in value:
        if item is None or isinstance(item, list | dict) or not str(item).strip():
            raise DataFormatError(path, row, column, f"{item!r} is not a label name")
        name = _label_name(item)
        if name not in names:
            names.append(name)
    return names


def _is_integer_text(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _is_fractional(value: Any) -> bool:
    """A number with a fractional part (3.5, "0.25"): what makes an auto-detected label column regression."""
    if isinstance(value, bool) or value is None:
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and not number.is_integer()


def _detect_problem_type(values: Sequence[Any], delimiter: str | None) -> str:
    if delimiter is not None or any(isinstance(v, list | tuple) or (isinstance(v, str) and _json_list(v) is not None)
                                    for v in values):
        return MULTI
    if any(_is_fractional(v) for v in values):
        return REGRESSION
    return SINGLE


def plot_confusion(confusion: dict[str, Any], out: Path, *, title: str = "") -> Path:
    """The confusion matrix (rows: gold, columns: predicted) as a PNG heat map with the counts."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    from bertforge.fileio import atomic_path

    labels, matrix = confusion["labels"], np.array(confusion["matrix"])
    size = max(3.0, 0.5 * len(labels) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(len(labels)), yticks=range(len(labels)), xlabel="predicted", ylabel="gold", title=title)
    ax.set_xticklabels(labels, rotation=45, ha="right")
    ax.set_yticklabels(labels)
    if len(labels) <= 30:
        limit = matrix.max() / 2 if matrix.size else 0
        for (i, j), count in np.ndenumerate(matrix):
            ax.text(j, i, str(count), ha="center", va="center", color="white" if count > limit else "black")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


__all__ = ["MAIN_METRICS", "MULTI", "PROBLEM_TYPES", "REGRESSION", "SINGLE", "Classify", "ClassifyExample",
           "plot_confusion"]
