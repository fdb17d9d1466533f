"""GLUE: the nine tasks and the AX diagnostic, read from the GLUE directory layout.

```
glue_dir/CoLA/{train,dev,test}.tsv      glue_dir/MNLI/{train,dev_matched,dev_mismatched,
glue_dir/SST-2/...  MRPC/  STS-B/  QQP/                     test_matched,test_mismatched}.tsv
glue_dir/QNLI/...   RTE/   WNLI/        glue_dir/diagnostic/diagnostic.tsv  (AX; or AX/AX.tsv)
```

Files are tab-separated without quoting (a `"` is part of the text). All have a header line except
CoLA's train and dev files, which hold four columns: source, label, the author's mark, sentence.
Columns are found by their header names, so MNLI's train and dev files (different column counts)
read alike. Test files have no label column; their examples carry `label=None`.

Labels stay as the strings in the file ("0"/"1", "entailment", ...), checked against the task's label
list; `GLUE_TASKS[task].labels` gives the order to map them to class ids. STS-B labels are floats.

For fine-tuning, `Glue(task)` declares the rest (`tasks.base.Task`): sentence (pair) features truncated
BERT's way, the class-id or score label, argmax / the score as the prediction, GLUE's metrics, and the
leaderboard files (`CoLA.tsv`, `SST-2.tsv`, ..., `MNLI-m.tsv`, `MNLI-mm.tsv`, `AX.tsv`: a header
`index<TAB>prediction`, then label names, or STS-B scores).

`DataFormatError` and `read_text_lines` live in `tasks.base`; they are re-exported here.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.hubdata import dataset_name
from bertforge.tasks.base import DataFormatError, Feature, Task, read_text_lines
from bertforge.tasks.metrics import canonical_glue_task, glue_metrics

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer


@dataclass
class GlueExample:
    guid: str                 # "<file stem>-<index column or row number>", e.g. "dev-12"
    text_a: str
    text_b: str | None        # None for single-sentence tasks (CoLA, SST-2)
    label: str | float | None  # label name, STS-B score, or None in test files


@dataclass(frozen=True)
class GlueTask:
    name: str                       # directory name in the GLUE layout
    text_a: str                     # header names of the columns
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None  # class names in class-id order; None = regression (STS-B)
    index: str | None               # the id column of labelled files, if any
    splits: tuple[str, ...] = ("train", "dev", "test")
    # what the classes mean, in class-id order, where the files say only "0"/"1" (the names the Hub's
    # nyu-mll/glue gives them): the fine-tuned head's id2label, so a prediction reads "positive", not "1"
    names: tuple[str, ...] | None = None

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def class_names(self) -> tuple[str, ...] | None:
        return self.names or self.labels


_MNLI_SPLITS = ("train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched")
_NLI = ("contradiction", "entailment", "neutral")
_QNLI = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {
    "cola": GlueTask("CoLA", "sentence", None, "label", ("0", "1"), None, names=("unacceptable", "acceptable")),
    "sst2": GlueTask("SST-2", "sentence", None, "label", ("0", "1"), None, names=("negative", "positive")),
    "mrpc": GlueTask("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), None,
                     names=("not_equivalent", "equivalent")),
    "stsb": GlueTask("STS-B", "sentence1", "sentence2", "score", None, "index"),
    "qqp": GlueTask("QQP", "question1", "question2", "is_duplicate", ("0", "1"), "id",
                    names=("not_duplicate", "duplicate")),
    "mnli": GlueTask("MNLI", "sentence1", "sentence2", "gold_label", _NLI, "index", _MNLI_SPLITS),
    "qnli": GlueTask("QNLI", "question", "sentence", "label", _QNLI, "index"),
    "rte": GlueTask("RTE", "sentence1", "sentence2", "label", _QNLI, "index"),
    "wnli": GlueTask("WNLI", "sentence1", "sentence2", "label", ("0", "1"), "index",
                     names=("not_entailment", "entailment")),
    # the diagnostic set is scored with an MNLI model's predictions; its file has no labels
    "ax": GlueTask("AX", "sentence1", "sentence2", "label", _NLI, "index", ("test",)),
}
# CoLA's train and dev files have no header: (source, label, author's mark, sentence)
_COLA_COLUMNS = ("source", "label", "original_label", "sentence")
_AX_FILES = ("diagnostic/diagnostic.tsv", "AX/AX.tsv", "AX/diagnostic.tsv", "AX/test.tsv")


def glue_task(task: str) -> GlueTask:
    """The task's description; `task` as in `canonical_glue_task` ("SST-2", "sst2", "MNLI-mm" -> MNLI)."""
    key = canonical_glue_task(task)
    return GLUE_TASKS["mnli" if key.startswith("mnli") else key]


def read_glue(glue_dir: str | Path, task: str, split: str) -> list[GlueExample]:
    """Read one split of one task from the GLUE layout under `glue_dir`.

    `split` is train / dev / test, or for MNLI train / dev_matched / dev_mismatched / test_matched /
    test_mismatched; AX has only test.
    """
    spec = glue_task(task)
    if split not in spec.splits:
        raise ValueError(f"{spec.name} has no split {split!r}; it has {', '.join(spec.splits)}")
    root = Path(glue_dir)
    if spec.name == "AX":
        candidates = [root / name for name in _AX_FILES]
        path = next((p for p in candidates if p.is_file()), candidates[0])
    else:
        path = root / spec.name / f"{split}.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file (expected the GLUE layout under {root})")
    return read_glue_file(path, task, labelled=not split.startswith("test"))


def read_glue_file(path: str | Path, task: str, *, labelled: bool | None = None,
                   skip_malformed: bool = False) -> list[GlueExample]:
    """Read one GLUE .tsv file of `task`.

    `labelled` says whether the file has labels; by default, files whose name starts with "test" or
    "diagnostic" (and AX's) have none. Every row must have as many fields as the header. With
    `skip_malformed=True`, rows with a wrong field count are skipped and counted in a warning instead
    of raising (Hugging Face's reader does the same for QQP); unknown labels always raise.
    """
    path = Path(path)
    spec = glue_task(task)
    if labelled is None:
        labelled = spec.name != "AX" and not path.stem.lower().startswith(("test", "diagnostic"))
    lines = read_text_lines(path)
    if spec.name == "CoLA" and labelled:
        header, first_row_line, header_text = _COLA_COLUMNS, None, ""
    else:
        first = next(lines, None)
        if first is None:
            raise DataFormatError(path, 1, None, "empty file; expected a header line")
        first_row_line, header_text = first
        header = tuple(header_text.split("\t"))
    columns = {name: i for i, name in enumerate(header)}
    wanted = [spec.text_a] + ([spec.text_b] if spec.text_b else []) + ([spec.label] if labelled else [])
    for name in wanted:
        if name not in columns:
            raise DataFormatError(path, first_row_line, name,
                                  f"missing column for {spec.name}; header is {header_text!r}")
    id_column = columns.get("index", columns.get("id")) if not labelled else columns.get(spec.index or "")

    examples: list[GlueExample] = []
    skipped: list[int] = []
    for number, text in lines:
        if not text.strip():
            continue
        fields = text.split("\t")
        if len(fields) != len(header):
            if skip_malformed:
                skipped.append(number)
                continue
            raise DataFormatError(path, number, None, f"{len(fields)} tab-separated fields, expected "
                                                      f"{len(header)} ({', '.join(header)})")
        label: str | float | None = None
        if labelled:
            label = _parse_label(spec, fields[columns[spec.label]], path, number)
        row_id = fields[id_column] if id_column is not None else str(len(examples) + len(skipped))
        examples.append(GlueExample(
            guid=f"{path.stem}-{row_id}",
            text_a=fields[columns[spec.text_a]],
            text_b=fields[columns[spec.text_b]] if spec.text_b else None,
            label=label,
        ))
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} malformed rows (lines {skipped[:10]})", stacklevel=2)
    return examples


# the Hub's nyu-mll/glue: the text columns tried in order, and the class names where the local files
# hold names rather than ids (its ids are those of the local "0"/"1" files everywhere else)
_HUB_TEXT_A = ("sentence", "sentence1", "question1", "premise", "question")
_HUB_TEXT_B = ("sentence2", "question2", "hypothesis", "sentence")
_HUB_CLASS_NAMES = {"mnli": ("entailment", "neutral", "contradiction"), "ax": ("entailment", "neutral", "contradiction"),
                    "qnli": ("entailment", "not_entailment"), "rte": ("entailment", "not_entailment")}


def glue_hub_examples(rows: Sequence[dict[str, Any]], task: str, split: str, source: str) -> list[GlueExample]:
    """GLUE examples from the rows of the Hub's nyu-mll/glue (one config's split), labelled as the local
    files are: "0"/"1", the NLI class names, STS-B's score; -1 (a test row) is no label."""
    spec, key = glue_task(task), canonical_glue_task(task)
    key = "mnli" if key.startswith("mnli") else key
    first = rows[0] if rows else {}
    text_a = next((c for c in _HUB_TEXT_A if c in first), None)
    text_b = next((c for c in _HUB_TEXT_B if c in first and c != text_a), None) if spec.text_b else None
    if rows and (text_a is None or (spec.text_b and text_b is None) or "label" not in first):
        raise DataFormatError(source, 1, text_a or "sentence", f"not {spec.name} rows: columns are {', '.join(first)}")
    examples = []
    for number, row in enumerate(rows, start=1):
        label: str | float | None = None
        value = row["label"]
        if value is not None and value != -1:
            if spec.labels is None:
                label = float(value)
            elif key in _HUB_CLASS_NAMES:
                label = _HUB_CLASS_NAMES[key][int(value)]
            else:
                label = str(int(value))
        examples.append(GlueExample(guid=f"{split}-{row.get('idx', number - 1)}", text_a=str(row[text_a]),
                                    text_b=str(row[text_b]) if text_b else None, label=label))
    return examples


def _parse_label(spec: GlueTask, value: str, path: Path, line: int) -> str | float:
    if spec.labels is None:
        try:
            score = float(value)
        except ValueError:
            raise DataFormatError(path, line, spec.label, f"{value!r} is not a number") from None
        if not 0.0 <= score <= 5.0:
            raise DataFormatError(path, line, spec.label, f"{score} is outside STS-B's range 0..5")
        return score
    if value not in spec.labels:
        raise DataFormatError(path, line, spec.label,
                              f"unknown label {value!r} for {spec.name}; expected one of {', '.join(spec.labels)}")
    return value


# ------------------------------------------------------------------------------------------------
# fine-tuning: what a GLUE task declares
# ------------------------------------------------------------------------------------------------
# canonical task -> the metric that selects the best model, where it is not accuracy
MAIN_METRICS = {"mrpc": "f1", "stsb": "pearson", "cola": "matthews_correlation"}
# canonical task -> the file name stem the GLUE leaderboard expects
LEADERBOARD_FILES = {
    "cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP", "qnli": "QNLI",
    "rte": "RTE", "wnli": "WNLI", "test_matched": "MNLI-m", "test_mismatched": "MNLI-mm", "ax": "AX",
}


@dataclass
class Glue(Task):
    """A GLUE task: `[CLS] a [SEP] (b [SEP])` -> a class (or STS-B's score) from the pooled [CLS].

    Labels map to class ids in `GLUE_TASKS[task].labels` order, which is also the head's id2label.
    An MNLI model is scored on dev_matched and dev_mismatched, and predicts test_matched,
    test_mismatched and the AX diagnostic (split "ax").
    """

    family: ClassVar[str] = "glue"
    command_help: ClassVar[str] = """Fine-tune on a GLUE task (sequence classification; STS-B regression) and score its dev set.

    Example: `bertforge finetune glue --task RTE --model models/minilm --data data/glue --out runs/rte --seeds 1,2,3`
    From a bundled recipe: `bertforge finetune glue --config recipes/finetune/mrpc.yaml --set lr=3e-5 --model models/minilm --data data/glue --out runs/mrpc`
    """
    default_max_length: ClassVar[int] = 128

    def __post_init__(self) -> None:
        key = canonical_glue_task(self.name)
        self.name = "mnli" if key.startswith("mnli") else key
        if self.name == "ax":
            raise ValueError("AX is not trained on: fine-tune MNLI, whose predict() also writes AX.tsv")
        self.spec = GLUE_TASKS[self.name]

    job = "sequence-classification"  # the model the task fine-tunes: the encoder plus this job's output layer
    inference_task = "text-classification"
    hub_dataset = "nyu-mll/glue"
    inference_default = True
    requires_name = "a GLUE task needs its name (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI)"

    @classmethod
    def for_inference(cls, labels: Sequence[str], config: Any) -> Glue:
        return cls("stsb" if len(labels) == 1 else "sst2")  # one output: a score, as STS-B

    def inference_example(self, index: int, fields: dict[str, Any]) -> GlueExample:
        return GlueExample(str(index), fields["text"], fields.get("text_pair"), None)

    def inference_fields(self, example: GlueExample) -> dict[str, Any]:
        return {"text": example.text_a, "text_pair": example.text_b}

    @property
    def main_metric(self) -> str:
        """The figure GLUE ranks the task by: F1 for MRPC, Pearson for STS-B, Matthews for CoLA, else accuracy."""
        return MAIN_METRICS.get(self.name, "accuracy")

    def read(self, data_dir: str | Path, split: str) -> list[GlueExample]:
        hub = dataset_name(data_dir)
        if hub is not None:  # a Hub data set: the task's config, unless the name gives one
            task = "ax" if split == "ax" else self.name
            found = self.hub_split(hub, "test" if split == "ax" else split, config=task)
            return glue_hub_examples(found.rows(), task, split, str(hub))
        if split == "ax":
            return read_glue(data_dir, "ax", "test")
        return read_glue(data_dir, self.name, split)

    def eval_splits(self) -> tuple[str, ...]:
        return ("dev_matched", "dev_mismatched") if self.name == "mnli" else ("dev",)

    def test_splits(self) -> tuple[str, ...]:
        return ("test_matched", "test_mismatched", "ax") if self.name == "mnli" else ("test",)

    def label_names(self, train_examples: Sequence[Any]) -> list[str] | int:
        return 1 if self.spec.class_names is None else list(self.spec.class_names)

    def featurize(self, examples: Sequence[GlueExample], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        texts: list[Any] = [e.text_a if e.text_b is None else (e.text_a, e.text_b) for e in examples]
        encoded = tokenizer.encode_batch(texts, max_length=max_length, truncation=True)
        features = []
        for i, example in enumerate(examples):
            inputs: dict[str, Any] = {"input_ids": encoded["input_ids"][i],
                                      "token_type_ids": encoded["token_type_ids"][i]}
            if example.label is not None:
                inputs["labels"] = (float(example.label) if self.spec.labels is None
                                    else self.spec.labels.index(str(example.label)))
            features.append(Feature(inputs, i))
        return features

    def postprocess(self, examples: Sequence[GlueExample], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[int | float]:
        """A class id (argmax) per example, or STS-B's predicted score."""
        if self.spec.labels is None:
            return [float(out["logits"].reshape(-1)[0]) for out in outputs]
        return [int(np.argmax(out["logits"])) for out in outputs]

    def gold(self, examples: Sequence[GlueExample]) -> list[int | float]:
        if self.spec.labels is None:
            return [float(e.label) for e in examples]  # type: ignore[arg-type]
        return [self.spec.labels.index(str(e.label)) for e in examples]

    def metric(self, examples: Sequence[GlueExample], predictions: Sequence[int | float]) -> dict[str, float]:
        return glue_metrics(self.name, list(predictions), self.gold(examples))

    def write_predictions(self, examples: Sequence[GlueExample], predictions: Sequence[int | float],
                          out_dir: Path, split: str) -> list[Path]:
        """The leaderboard's .tsv: `index<TAB>prediction`, label names, STS-B scores clipped to 0..5.

        Test splits get the leaderboard's file names (SST-2.tsv, MNLI-m.tsv, AX.tsv, ...); other
        splits are written as `<Task>-<split>.tsv`.
        """
        from bertforge.fileio import write_text_atomic

        if split.startswith("test") or split == "ax":
            stem = LEADERBOARD_FILES[split if self.name == "mnli" else self.name]
        else:
            stem = f"{self.spec.name}-{split}"
        lines = ["index\tprediction"]
        for example, prediction in zip(examples, predictions, strict=True):
            index = example.guid.rsplit("-", 1)[-1]
            if self.spec.labels is None:
                value = f"{min(5.0, max(0.0, float(prediction))):.3f}"
            else:
                value = self.spec.labels[int(prediction)]
            lines.append(f"{index}\t{value}")
        path = Path(out_dir) / f"{stem}.tsv"
        write_text_atomic(path, "\n".join(lines) + "\n")
        return [path]


__all__ = [
    "GLUE_TASKS", "LEADERBOARD_FILES", "MAIN_METRICS", "DataFormatError", "Glue", "GlueExample", "GlueTask", "glue_task",
    "read_glue", "read_glue_file", "read_text_lines",
]
