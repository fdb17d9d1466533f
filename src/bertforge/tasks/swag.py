"""SWAG (Situations With Adversarial Generations): the reader.

Each example is a context sentence (`sent1`), the start of the next sentence (`sent2`) and four
candidate endings; the label says which ending really follows. Two file formats:

- the official csv, with a header naming the columns (the released files also have an unnamed
  pandas index column first): `video-id, fold-ind, startphrase, sent1, sent2, gold-source,
  ending0, ending1, ending2, ending3, label`; the test file has no `label`.
- jsonl, one object per line with at least `sent1, sent2, ending0..ending3` and `label` (an integer
  0..3), the layout of the `transformers` SWAG test fixture.

The format is chosen by the extension (.csv, or .jsonl/.json), else by the first character.

For fine-tuning, `Swag()` declares the rest (`tasks.base.Task`): each of the four endings makes the
pair `[CLS] sent1 [SEP] sent2 ending [SEP]` (truncated BERT's way), the four rows go through the
encoder together ((B, 4, T)), and a softmax over their [CLS] scores picks the ending.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.fileio import NotUtf8Error, decode_utf8
from bertforge.hubdata import dataset_name
from bertforge.tasks.base import DataFormatError, Feature, Task
from bertforge.tasks.metrics import multiple_choice_accuracy

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer

NUM_CHOICES = 4
_ENDINGS = tuple(f"ending{i}" for i in range(NUM_CHOICES))
_REQUIRED = ("sent1", "sent2", *_ENDINGS)


@dataclass
class SwagExample:
    guid: str
    context: str          # sent1
    start_ending: str     # sent2, the start of the sentence each ending completes
    endings: list[str]    # the four candidates
    label: int | None     # index of the true ending; None in the test file


def read_swag(path: str | Path) -> list[SwagExample]:
    """Read a SWAG csv or jsonl file. Missing columns or keys, labels outside 0..3 and malformed
    lines raise `DataFormatError` with the file, the 1-based line and the field."""
    path = Path(path)
    try:
        text = decode_utf8(path.read_bytes(), path).removeprefix("\ufeff")
    except NotUtf8Error as exc:
        raise DataFormatError(path, exc.line, None, f"not UTF-8 text ({exc.detail})") from None
    suffix = path.suffix.lower()
    is_json = suffix in (".jsonl", ".json") or (suffix != ".csv" and text.lstrip().startswith("{"))
    return _read_jsonl(path, text) if is_json else _read_csv(path, text)


def _parse_label(value: Any, path: Path, line: int) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < NUM_CHOICES:
        raise DataFormatError(path, line, "label", f"{value!r:.40} is not an ending index 0..{NUM_CHOICES - 1}")
    return value


def _read_jsonl(path: Path, text: str) -> list[SwagExample]:
    examples = []
    for number, line_text in enumerate(text.split("\n"), start=1):
        if not line_text.strip():
            continue
        try:
            record = json.loads(line_text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(path, number, "json", f"{exc.msg} (column {exc.colno})") from None
        except (RecursionError, ValueError) as exc:  # nesting too deep, integers too long to convert
            raise DataFormatError(path, number, "json", str(exc) or type(exc).__name__) from None
        if not isinstance(record, Mapping):
            raise DataFormatError(path, number, None, f"expected a JSON object, got {type(record).__name__}")
        examples.append(_example(record, path, number, default_id=f"{path.stem}-{len(examples)}"))
    return examples


def _read_csv(path: Path, text: str) -> list[SwagExample]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise DataFormatError(path, 1, None, "empty file; expected a header line")
        for name in _REQUIRED:
            if name not in header:
                raise DataFormatError(path, 1, name, f"missing column; header is {','.join(header)!r:.200}")
        examples = []
        start = reader.line_num + 1
        for row in reader:
            if not row or not any(cell.strip() for cell in row):
                start = reader.line_num + 1
                continue
            if len(row) != len(header):
                raise DataFormatError(path, start, None, f"{len(row)} fields, expected {len(header)}")
            record = dict(zip(header, row, strict=True))
            if "label" in record and record["label"] == "":
                raise DataFormatError(path, start, "label", "empty")
            examples.append(_example(record, path, start, default_id=f"{path.stem}-{len(examples)}"))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise DataFormatError(path, reader.line_num, None, f"malformed csv: {exc}") from None
    return examples


def _example(record: Mapping[str, Any], path: Path, line: int, default_id: str) -> SwagExample:
    for name in _REQUIRED:
        if name not in record:
            raise DataFormatError(path, line, name, "missing")
        if not isinstance(record[name], str):
            raise DataFormatError(path, line, name, f"expected a string, got {type(record[name]).__name__}")
    label = _parse_label(record["label"], path, line) if "label" in record else None
    guid = record.get("fold-ind") or record.get("id") or default_id
    return SwagExample(
        guid=str(guid),
        context=record["sent1"],
        start_ending=record["sent2"],
        endings=[record[name] for name in _ENDINGS],
        label=label,
    )


# ------------------------------------------------------------------------------------------------
# fine-tuning: what the SWAG task declares
# ------------------------------------------------------------------------------------------------
# split -> file names tried in the data directory (the official release's names first)
SWAG_FILES = {
    "train": ("train.csv", "train.jsonl"),
    "dev": ("val.csv", "dev.csv", "val.jsonl", "dev.jsonl"),
    "test": ("test.csv", "test.jsonl"),
}


@dataclass
class Swag(Task):
    """Multiple choice over SWAG's four endings."""

    name: str = "swag"
    family: ClassVar[str] = "swag"
    command_help: ClassVar[str] = """Fine-tune multiple choice on SWAG (four endings, softmax over their [CLS] scores); reports accuracy.

    Example: `bertforge finetune swag --model models/minilm --data data/swag --out runs/swag`
    """
    single_task: ClassVar[bool] = True
    default_batch_size: ClassVar[int] = 16  # four (context, ending) rows per example

    job = "multiple-choice"  # the model the task fine-tunes: the encoder plus this job's output layer
    inference_task = "multiple-choice"
    hub_dataset = "allenai/swag"
    inference_default = True
    num_choices: ClassVar[int] = NUM_CHOICES

    def inference_example(self, index: int, fields: dict[str, Any]) -> SwagExample:
        return SwagExample(str(index), fields["context"], fields.get("start") or "", list(fields["endings"]), None)

    def read(self, data_dir: str | Path, split: str) -> list[SwagExample]:
        hub = dataset_name(data_dir)
        if hub is not None:  # a Hub data set in allenai/swag's layout (its config "regular" by default)
            found = self.hub_split(hub, split, config=None if hub.config else "regular")
            return [_example({k: v for k, v in row.items() if not (k == "label" and v in (-1, None))},
                             Path(str(hub)), number, default_id=f"{split}-{number - 1}")
                    for number, row in enumerate(found.rows(), start=1)]
        root = Path(data_dir)
        names = SWAG_FILES.get(split, (split,))
        for name in names:
            if (root / name).is_file():
                return read_swag(root / name)
        raise FileNotFoundError(f"{root}: no {split} file (looked for {', '.join(names)})")

    def featurize(self, examples: Sequence[SwagExample], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        pairs = [(e.context, f"{e.start_ending} {ending}".strip()) for e in examples for ending in e.endings]
        encoded = tokenizer.encode_batch(pairs, max_length=max_length, truncation=True) if pairs else {}
        features = []
        for i, example in enumerate(examples):
            rows = slice(i * NUM_CHOICES, (i + 1) * NUM_CHOICES)
            inputs: dict[str, Any] = {"input_ids": encoded["input_ids"][rows],
                                      "token_type_ids": encoded["token_type_ids"][rows]}
            if example.label is not None:
                inputs["labels"] = example.label
            features.append(Feature(inputs, i))
        return features

    def postprocess(self, examples: Sequence[SwagExample], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[int]:
        return [int(np.argmax(out["logits"])) for out in outputs]

    def metric(self, examples: Sequence[SwagExample], predictions: Sequence[int]) -> dict[str, float]:
        return multiple_choice_accuracy(list(predictions), [e.label for e in examples])  # type: ignore[misc]

    def write_predictions(self, examples: Sequence[SwagExample], predictions: Sequence[int],
                          out_dir: Path, split: str) -> list[Path]:
        """`predictions-<split>.csv`: `id,label` rows, the chosen ending's index."""
        from bertforge.fileio import write_text_atomic

        lines = ["id,label"] + [f"{e.guid},{p}" for e, p in zip(examples, predictions, strict=True)]
        path = Path(out_dir) / f"predictions-{split}.csv"
        write_text_atomic(path, "\n".join(lines) + "\n")
        return [path]
