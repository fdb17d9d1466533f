"""What int8 costs on the labels: every int8 path measures itself against fp32 on a sample.

An int8 model can flip labels that fp32 gave with confidence; a single "max diff" over some hidden
states does not say how many. Each int8 path (`bertforge quantize`, torchao; the onnxruntime
engine at int8; `export-onnx --int8`) runs the fp32 model and the int8 model on the same rows and
writes what it found to `quantization_report.json` beside the int8 model, and prints it:

- the sample: the model's dev file where task.json names one, else rows of its training file (said
  so: the model saw them), else a fixed set of English sentences (`FIXED_SENTENCES`);
- for a classifier (and any head whose outputs are scores over classes: per token for token
  classification, over positions for question answering): label agreement (the share of decisions
  int8 makes as fp32 does), how many flipped, the largest change of a probability, and the task
  metric (accuracy) before and after where the sample has gold labels;
- for a sentence-embedding model: the cosine between each sentence's fp32 and int8 vectors (lowest
  and mean);
- a verdict: below `AGREEMENT_FLOOR` (99%) agreement, or a lowest cosine below `COSINE_FLOOR`, it
  says so plainly and lists what keeps accuracy (`ADVICE`).

`compare_scores` and `compare_vectors` do the arithmetic on arrays, so any runtime can be measured;
`measure` feeds both runtimes the same batches.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPORT_FILE = "quantization_report.json"
AGREEMENT_FLOOR = 0.99  # below this share of unchanged labels the report warns
COSINE_FLOOR = 0.99  # below this lowest cosine (fp32 vs int8 sentence vectors) the report warns
DEFAULT_ROWS = 1000  # rows of a dev file measured at most (SST-2 dev's 872 all count)
ADVICE = (
    "per-token activations: bertforge's torch int8 (torchao; --engine torch --precision int8, or bertforge "
    "quantize) scales each token's activations on its own, ONNX Runtime's int8 one scale per tensor; on a "
    "fine-tuned MiniLM the first flipped 5 of 872 SST-2 dev labels, the second 13",
    "keep the sensitive layers in fp32: the pooler and task head already are; the feed-forward "
    "output projections (ffn.down, whose inputs have the largest outliers) are next; they are a third of "
    "the encoder's matrix work, so int8's gain shrinks by about as much",
    "static calibration: activation ranges measured once on a few hundred of your rows "
    "(onnxruntime.quantization.quantize_static), or SmoothQuant, instead of per call",
    "bf16 (--precision bf16) where the CPU has AMX or AVX512-BF16: the weights keep 8 bits of mantissa "
    "and no scale is shared across tokens",
)

# Used where a model directory names no data: varied everyday sentences, long and short.
FIXED_SENTENCES = (
    "The film was a delight from start to finish.",
    "I would not recommend this restaurant to anyone.",
    "The meeting has been moved to Thursday afternoon.",
    "Our flight was delayed by three hours because of the storm.",
    "The new phone's battery lasts for two full days.",
    "He forgot his keys again, so he waited outside in the rain.",
    "A quiet, thoughtful story that stays with you long after it ends.",
    "The service was slow and the soup arrived cold.",
    "Researchers found that the drug reduced symptoms in most patients.",
    "Please send the signed contract before the end of the month.",
    "What time does the museum open on Sundays?",
    "The plot is predictable, but the actors make it worth watching.",
    "Stock markets fell sharply after the announcement.",
    "She planted tomatoes, basil and peppers in the small garden.",
    "The instructions were confusing and the parts did not fit.",
    "It is the best concert I have been to in years.",
    "The train to Edinburgh leaves from platform four.",
    "Nothing about this sequel improves on the original.",
    "The committee approved the budget after a long debate.",
    "My cat sleeps on the windowsill every afternoon.",
    "An uneven but often funny comedy with a warm heart.",
    "Customer support never answered my emails.",
    "The bridge will be closed for repairs until next spring.",
    "Water boils at a lower temperature at high altitude.",
    "The hotel room was clean, bright and surprisingly quiet.",
    "I can't believe how much time I wasted on this book.",
    "The children built a sandcastle near the water.",
    "Prices rose for the third month in a row.",
    "A tense thriller that never lets go.",
    "The software update fixed the crash but slowed everything down.",
    "They hiked to the summit and watched the sunrise.",
    "Dull, overlong and badly edited.",
)


class QuantizationReportError(ValueError):
    """A sample that cannot be read, or outputs that cannot be compared."""


@dataclass
class Sample:
    """The rows a report measures on: texts (and pairs), gold labels where known, and where they came from."""

    texts: list[str]
    source: str  # said in the report: "dev file PATH", "training file PATH (seen in training)", ...
    pairs: list[str] | None = None
    labels: list[str] | None = None  # gold labels as the file spells them (None: the sample has none)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class QuantizationReport:
    """What int8 changed against fp32 on a sample (see the module docstring)."""

    path: str  # which int8 path: "torch int8 (torchao)", "onnxruntime int8", "export-onnx --int8"
    recipe: str  # what was quantized and how
    sample: str
    rows: int
    outputs: str  # labels, token labels, answer positions, sentence vectors, values
    label_agreement: float | None = None
    decisions: int | None = None  # labels compared (rows, or tokens, or row x label for multi-label)
    flipped: int | None = None
    max_probability_change: float | None = None
    largest_flip: dict[str, Any] | None = None  # the row whose label flipped with the most confidence lost
    metric: str | None = None
    fp32_score: float | None = None
    int8_score: float | None = None
    cosine_min: float | None = None
    cosine_mean: float | None = None
    max_abs_diff: float | None = None  # of the compared outputs (logits or vectors)
    ok: bool = True
    verdict: str = ""
    advice: list[str] = field(default_factory=list)
    weights: str | None = None  # SHA-256 of the fp32 model directory's weights, where a report is reused

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """The report as a user reads it on the console."""
        out = [f"int8 against fp32 ({self.path}; {self.recipe}) on {self.rows} rows of {self.sample}:"]
        if self.label_agreement is not None:
            change = (f", largest probability change {self.max_probability_change:.3f}"
                      if self.max_probability_change is not None else "")
            out.append(f"  label agreement {self.label_agreement:.2%} ({self.flipped} of {self.decisions} "
                       f"{self.outputs} flipped){change}")
        if self.largest_flip:
            flip = self.largest_flip
            out.append(f"  largest flip: row {flip['row']} {flip['fp32_label']} {flip['fp32_probability']:.3f} -> "
                       f"{flip['int8_label']} {flip['int8_probability']:.3f}")
        if self.metric is not None:
            out.append(f"  {self.metric}: fp32 {self.fp32_score:.4f}, int8 {self.int8_score:.4f}")
        if self.outputs == "values" and self.max_abs_diff is not None:
            out.append(f"  largest change of an output: {self.max_abs_diff:.3g}")
        if self.cosine_min is not None:
            out.append(f"  cosine of fp32 and int8 sentence vectors: lowest {self.cosine_min:.4f}, "
                       f"mean {self.cosine_mean:.4f}")
        out.append(f"  {self.verdict}")
        out.extend(f"  - {line}" for line in self.advice)
        return out


# ------------------------------------------------------------------------------------------------
# the arithmetic
# ------------------------------------------------------------------------------------------------
def probabilities(scores: np.ndarray, multi_label: bool = False) -> np.ndarray:
    """Softmax over the last axis (sigmoid per class for multi-label), in float64."""
    scores = np.asarray(scores, dtype=np.float64)
    if multi_label:
        return 1.0 / (1.0 + np.exp(-scores))
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def compare_scores(fp32: np.ndarray, int8: np.ndarray, *, multi_label: bool = False,
                   mask: np.ndarray | None = None, gold: Sequence[int | None] | None = None,
                   label_names: Sequence[str] | None = None) -> dict[str, Any]:
    """Label agreement of two runs' class scores: (N, C), or (N, T, C) per token with a (N, T) `mask`
    of real positions. Single-label decisions are the argmax; multi-label ones each class's sigmoid at
    0.5. `gold` (one class id per row, None where unknown) gives accuracy before and after."""
    fp32, int8 = np.asarray(fp32, dtype=np.float64), np.asarray(int8, dtype=np.float64)
    if fp32.shape != int8.shape:
        raise QuantizationReportError(f"fp32 outputs {fp32.shape} and int8 outputs {int8.shape} differ in shape")
    if mask is not None:  # per token: keep real positions only -> (real tokens, C)
        keep = np.asarray(mask).astype(bool)
        fp32, int8 = fp32[keep], int8[keep]
    p32, p8 = probabilities(fp32, multi_label), probabilities(int8, multi_label)
    labels32, labels8 = p32.argmax(-1), p8.argmax(-1)
    same = (p32 >= 0.5) == (p8 >= 0.5) if multi_label else labels32 == labels8
    found: dict[str, Any] = {"decisions": int(same.size), "flipped": int(same.size - same.sum()),
                             "label_agreement": float(same.mean()) if same.size else 1.0,
                             "max_probability_change": float(np.abs(p32 - p8).max()) if p32.size else 0.0,
                             "max_abs_diff": float(np.abs(fp32 - int8).max()) if fp32.size else 0.0}
    rows = np.flatnonzero(~same.reshape(len(same), -1).all(-1)) if same.size else np.array([], dtype=int)
    if rows.size and mask is None and not multi_label:
        lost = p32[rows, labels32[rows]] - p8[rows, labels32[rows]]  # confidence fp32's label lost
        worst = int(rows[int(lost.argmax())])
        names = list(label_names or [])
        name = {i: names[i] if i < len(names) else str(i) for i in range(p32.shape[-1])}.__getitem__
        found["largest_flip"] = {"row": worst, "fp32_label": name(int(labels32[worst])),
                                 "fp32_probability": round(float(p32[worst, labels32[worst]]), 4),
                                 "int8_label": name(int(labels8[worst])),
                                 "int8_probability": round(float(p8[worst, labels8[worst]]), 4)}
    if gold is not None and mask is None and not multi_label:
        known = [i for i, label in enumerate(gold) if label is not None]
        if known:
            target = np.array([gold[i] for i in known])
            found.update(metric="accuracy", fp32_score=float((labels32[known] == target).mean()),
                         int8_score=float((labels8[known] == target).mean()))
    return found


def compare_vectors(fp32: np.ndarray, int8: np.ndarray) -> dict[str, Any]:
    """The cosine between each row's fp32 and int8 vectors, (N, H) each: lowest and mean."""
    a, b = np.asarray(fp32, dtype=np.float64), np.asarray(int8, dtype=np.float64)
    if a.shape != b.shape:
        raise QuantizationReportError(f"fp32 vectors {a.shape} and int8 vectors {b.shape} differ in shape")
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    cosine = (a * b).sum(-1) / np.maximum(norms, 1e-12)
    return {"cosine_min": float(cosine.min()), "cosine_mean": float(cosine.mean()),
            "max_abs_diff": float(np.abs(a - b).max()) if a.size else 0.0}


def judge(report: QuantizationReport) -> QuantizationReport:
    """Set the verdict: fine, or below the floor with what keeps accuracy."""
    problems = []
    if report.label_agreement is not None and report.label_agreement < AGREEMENT_FLOOR:
        problems.append(f"label agreement {report.label_agreement:.2%} is below {AGREEMENT_FLOOR:.0%}: int8 changes "
                        f"{report.flipped} of {report.decisions} {report.outputs} fp32 gives")
    if report.cosine_min is not None and report.cosine_min < COSINE_FLOOR:
        problems.append(f"the lowest cosine {report.cosine_min:.4f} is below {COSINE_FLOOR}: some int8 sentence "
                        "vectors point elsewhere than fp32's")
    if report.metric is not None and report.fp32_score is not None and report.int8_score is not None:
        lost = report.fp32_score - report.int8_score
        if lost > 0.005:
            problems.append(f"{report.metric} drops by {lost * 100:.2f} points")
    report.ok = not problems
    if problems:
        report.verdict = ("WARNING: " + "; ".join(problems) +
                          ". Use fp32 where these answers matter, or try what keeps accuracy:")
        report.advice = list(ADVICE)
    else:
        what = (f"{report.label_agreement:.2%} of labels unchanged" if report.label_agreement is not None
                else f"lowest cosine {report.cosine_min:.4f}" if report.cosine_min is not None else "outputs compared")
        report.verdict = f"int8 keeps fp32's answers on this sample ({what})"
        report.advice = []
    return report


# ------------------------------------------------------------------------------------------------
# the sample
# ------------------------------------------------------------------------------------------------
def sample_for(directory: str | os.PathLike[str] | None, *, limit: int = DEFAULT_ROWS,
               data: str | os.PathLike[str] | None = None) -> Sample:
    """The rows to measure `directory`'s model on: `data` if given (a file with the model's columns), else
    the dev file its task.json names, else its training file (the first `limit` rows: seen in training,
    and said so), else `FIXED_SENTENCES`."""
    settings = _task_json(directory).get("settings") or {}
    candidates = [(data, "file")] if data is not None else []
    candidates += [(settings.get("dev"), "dev file"), (settings.get("train"), "training file")]
    for path, role in candidates:
        if path and Path(path).is_file():
            sample = _read_sample(Path(path), settings, limit)
            seen = " (rows the model was trained on: agreement only, the metric is not a dev score)" \
                if role == "training file" else ""
            sample.source = f"{role} {path}{seen}"
            return sample
        if role == "file":
            raise QuantizationReportError(f"{path}: no such file to measure int8 on")
    return Sample(list(FIXED_SENTENCES), f"{len(FIXED_SENTENCES)} fixed English sentences (no data named)")


def _task_json(directory: str | os.PathLike[str] | None) -> dict[str, Any]:
    """A model directory's task.json as it is (its settings and max_length), or {} without a readable one."""
    if directory is None:
        return {}
    try:
        found = json.loads((Path(directory) / "task.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _read_sample(path: Path, settings: dict[str, Any], limit: int) -> Sample:
    from bertforge.tables import column_names, iter_rows

    if settings.get("anchor_column"):  # a sentence encoder trained on pairs: each text of a row alone
        return _read_embedding_sample(path, settings, limit)
    text_column = settings.get("text_column") or "text"
    pair_column = settings.get("pair_column")
    label_column = settings.get("label_column") or "label"
    found = column_names(path)
    if text_column not in found:
        raise QuantizationReportError(f"{path}: no column {text_column!r} to measure int8 on "
                                      f"(columns: {', '.join(found)})")
    texts, pairs, labels = [], [], []
    for row in iter_rows(path):
        if len(texts) >= limit:
            break
        texts.append(str(row.values[text_column]))
        if pair_column:
            pairs.append(str(row.values.get(pair_column, "")))
        value = row.values.get(label_column)
        labels.append(None if value is None or isinstance(value, list) else str(value))
    has_labels = label_column in found and any(label is not None for label in labels)
    return Sample(texts, str(path), pairs if pair_column else None, labels if has_labels else None)


def _read_embedding_sample(path: Path, settings: dict[str, Any], limit: int) -> Sample:
    """The texts of a pair file (`finetune embed`'s anchor, positive and negative columns), each on its
    own: an embedding model is measured by the cosine of each text's vector, not on pairs or labels."""
    from bertforge.tables import column_names, iter_rows

    columns = [settings.get(key) for key in ("anchor_column", "positive_column", "negative_column")]
    found = column_names(path)
    present = [column for column in columns if column and column in found]
    if not present:
        raise QuantizationReportError(f"{path}: none of the columns {', '.join(c for c in columns if c)} to "
                                      f"measure int8 on (columns: {', '.join(found)})")
    texts: list[str] = []
    for row in iter_rows(path):
        texts += [str(row.values[column]) for column in present if row.values.get(column) is not None]
        if len(texts) >= limit:
            break
    return Sample(texts[:limit], str(path), None, None)


def encode_batches(tokenizer: Any, sample: Sample, max_length: int,
                   batch_size: int = 32) -> list[dict[str, Any]]:
    """The sample as padded int64 batches (torch tensors) of at most `batch_size` rows, texts cut to
    `max_length` pieces."""
    batches = []
    for start in range(0, len(sample), batch_size):
        texts = sample.texts[start:start + batch_size]
        pairs = sample.pairs[start:start + batch_size] if sample.pairs is not None else None
        batches.append(dict(tokenizer(texts, pairs, padding=True, truncation=True, max_length=max_length,
                                      return_tensors="pt").items()))
    return batches


# ------------------------------------------------------------------------------------------------
# measuring two runtimes
# ------------------------------------------------------------------------------------------------
Runner = Callable[[dict[str, Any]], np.ndarray]  # a batch -> the compared output as an array


def measure(fp32: Runner, int8: Runner, batches: Sequence[dict[str, Any]], *, path: str, recipe: str,
            sample: Sample | str, kind: str, multi_label: bool = False,
            label_names: Sequence[str] | None = None) -> QuantizationReport:
    """Run both runtimes on `batches` and compare: `kind` is "labels" (one score row per input),
    "token labels" (scores per position; padding left out), "answer positions" (scores over positions),
    "sentence vectors" (cosine) or "values" (a regression: the largest change only)."""
    outputs32, outputs8, masks = [], [], []
    for batch in batches:
        outputs32.append(np.asarray(fp32(batch), dtype=np.float64))
        outputs8.append(np.asarray(int8(batch), dtype=np.float64))
        masks.append(np.asarray(batch["attention_mask"]))
    source, rows = (sample.source, len(sample)) if isinstance(sample, Sample) else (sample, sum(len(m) for m in masks))
    report = QuantizationReport(path=path, recipe=recipe, sample=source, rows=rows, outputs=kind)
    if kind == "sentence vectors":
        found = compare_vectors(np.concatenate(outputs32), np.concatenate(outputs8))
    elif kind == "values":
        a, b = np.concatenate(outputs32), np.concatenate(outputs8)
        found = {"max_abs_diff": float(np.abs(a - b).max()) if a.size else 0.0}
    elif kind in ("token labels", "answer positions"):
        found = _per_position(outputs32, outputs8, masks, kind)
    else:
        gold = _gold_ids(sample, label_names) if isinstance(sample, Sample) else None
        found = compare_scores(np.concatenate(outputs32), np.concatenate(outputs8), multi_label=multi_label,
                               gold=gold, label_names=label_names)
    for name, value in found.items():
        setattr(report, name, value)
    return judge(report)


def _per_position(outputs32: list[np.ndarray], outputs8: list[np.ndarray], masks: list[np.ndarray],
                  kind: str) -> dict[str, Any]:
    """Token labels: (B, T, C) per batch, compared at real positions. Answer positions: (B, T) start
    (or end) scores, a softmax over the real positions, one decision per row."""
    if kind == "token labels":
        width = max(m.shape[1] for m in masks)  # batches are padded to their own longest row

        def widen(array: np.ndarray) -> np.ndarray:
            return np.pad(array, [(0, 0), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2))

        a, b = np.concatenate([widen(x) for x in outputs32]), np.concatenate([widen(x) for x in outputs8])
        mask = np.concatenate([widen(m) for m in masks])
        return compare_scores(a, b, mask=mask)
    found: dict[str, Any] = {"decisions": 0, "flipped": 0, "max_probability_change": 0.0, "max_abs_diff": 0.0}
    for a, b, m in zip(outputs32, outputs8, masks, strict=True):
        hidden = np.where(m.astype(bool), 0.0, -math.inf)
        part = compare_scores(a + hidden, b + hidden)
        for key in ("decisions", "flipped"):
            found[key] += part[key]
        found["max_probability_change"] = max(found["max_probability_change"], part["max_probability_change"])
        real = m.astype(bool)
        found["max_abs_diff"] = max(found["max_abs_diff"], float(np.abs(a - b)[real].max()) if real.any() else 0.0)
    found["label_agreement"] = 1 - found["flipped"] / found["decisions"] if found["decisions"] else 1.0
    return found


def _gold_ids(sample: Sample, label_names: Sequence[str] | None) -> list[int | None] | None:
    """The sample's gold labels as class ids by the model's label names (None where a label is unknown)."""
    if sample.labels is None or not label_names:
        return None
    index = {name: i for i, name in enumerate(label_names)}
    return [index.get(label) if label is not None else None for label in sample.labels]


# ------------------------------------------------------------------------------------------------
# a model's compared output, and runners for torch and ONNX Runtime
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Compared:
    """Which output of a model a report compares, and how."""

    onnx_name: str  # the output's name in bertforge's ONNX graphs (`export.OUTPUTS`)
    attr: str  # the attribute of the PyTorch model's output
    kind: str  # see `measure`
    multi_label: bool = False


def compared_output(model: Any) -> Compared:
    """The output that decides a model's answers: the logits of a classifier (labels, or values for a
    regression), per token for token classification and masked LM, start positions for question
    answering, the sentence vector for a sentence encoder (`export.SentenceEncoder`), and the final hidden
    states' [CLS] vector for a bare encoder."""
    job = getattr(model, "job", None)
    if job == "sentence-embedding":
        return Compared("sentence_embedding", "sentence_embedding", "sentence vectors")
    if job == "sentence-embeddings":  # the engine's embeddings graph: mean pooling is the usual one
        return Compared("mean", "mean", "sentence vectors")
    if job == "fill-mask":  # the engine's fill-mask graph: top-k probabilities
        return Compared("mask_scores", "mask_scores", "values")
    if job in ("sequence-classification", "multiple-choice"):
        problem = getattr(model, "problem_type", None)
        if problem == "regression" or (problem is None and getattr(model, "num_labels", 2) == 1):
            return Compared("logits", "logits", "values")
        return Compared("logits", "logits", "labels", multi_label=problem == "multi_label_classification")
    if job == "token-classification":
        return Compared("logits", "logits", "token labels")
    if job == "masked-lm":
        return Compared("logits", "mlm_logits", "token labels")
    if job == "pretraining":
        return Compared("mlm_logits", "mlm_logits", "token labels")
    if job == "question-answering":
        return Compared("start_logits", "start_logits", "answer positions")
    return Compared("last_hidden_state", "last_hidden_state", "sentence vectors")


def torch_runner(model: Any, compared: Compared) -> Runner:
    """A batch -> the compared output of a PyTorch model (a bare encoder's: the [CLS] vector)."""
    import torch

    from bertforge.model.inputs import INPUTS

    def run(batch: dict[str, Any]) -> np.ndarray:
        with torch.inference_mode():
            out = getattr(model(*(batch[name] for name in INPUTS)), compared.attr).float()
        return (out[:, 0] if compared.attr == "last_hidden_state" else out).numpy()
    return run


def onnx_runner(session: Any, compared: Compared) -> Runner:
    """A batch -> the compared output of an ONNX Runtime session over one of bertforge's graphs."""
    from bertforge.model.inputs import INPUTS

    def run(batch: dict[str, Any]) -> np.ndarray:
        feed = {name: np.asarray(batch[name], dtype=np.int64) for name in INPUTS}
        out = session.run([compared.onnx_name], feed)[0]
        return out[:, 0] if compared.onnx_name == "last_hidden_state" else out
    return run


def sample_batches(model: Any, directory: str | os.PathLike[str] | None, tokenizer: Any = None, *,
                   data: str | os.PathLike[str] | None = None, max_length: int | None = None,
                   limit: int = DEFAULT_ROWS) -> tuple[Sample | str, list[dict[str, Any]]]:
    """The sample for `model` (`sample_for`) as batches; without a tokenizer (or for multiple choice,
    whose rows are sets of choices) random ids in the model's vocabulary, said so."""
    from bertforge.model.inputs import sample_inputs

    if tokenizer is None and directory is not None:
        try:
            from bertforge.tokenizer import BertTokenizer

            tokenizer = BertTokenizer.from_pretrained(directory)
        except (OSError, ValueError):
            tokenizer = None
    if tokenizer is None or getattr(model, "job", None) == "multiple-choice":
        batches = [sample_inputs(model, batch=8, length=32, seed=seed) for seed in range(4)]
        return "random token ids (no tokenizer to read text with)", batches
    if getattr(model, "job", None) in ("masked-lm", "pretraining"):
        limit = min(limit, 64)  # scores over the whole vocabulary at every position: a few rows say enough
    sample = sample_for(directory, limit=limit, data=data)
    length = max_length or _task_json(directory).get("max_length") or 128
    length = min(length, model.config.max_tokens)
    return sample, encode_batches(tokenizer, sample, length)


def measure_model(model: Any, fp32: Runner, int8: Runner, compared: Compared, sample: Sample | str,
                  batches: Sequence[dict[str, Any]], *, path: str, recipe: str) -> QuantizationReport:
    """`measure` for a model's compared output, with its label names."""
    from bertforge.model.base import label_names_of

    try:
        names = label_names_of(model)
    except AttributeError:
        names = []
    return measure(fp32, int8, batches, path=path, recipe=recipe, sample=sample, kind=compared.kind,
                   multi_label=compared.multi_label, label_names=names)


def int8_report(fp32_model: Any, int8_model: Any, directory: str | os.PathLike[str] | None = None,
                tokenizer: Any = None, *, data: str | os.PathLike[str] | None = None) -> Any:
    """What torchao's int8 changed against fp32: both models run on the
    sample of `directory` (its dev file, training rows or fixed sentences; `data` to name a file)."""
    from bertforge.precision import TORCH_INT8_PATH, TORCH_INT8_RECIPE

    compared = compared_output(fp32_model)
    sample, batches = sample_batches(fp32_model, directory, tokenizer, data=data)
    return measure_model(fp32_model, torch_runner(fp32_model, compared), torch_runner(int8_model, compared),
                            compared, sample, batches, path=TORCH_INT8_PATH, recipe=TORCH_INT8_RECIPE)



def fp32_copy_to_measure(model: Any, directory: str | os.PathLike[str], precision: str,
                         device: str | None = None) -> Any:
    """An fp32 copy of `model` when it is about to be quantized in memory and its directory has no torchao
    report for these weights yet (`report_int8`); None otherwise (one report per weights, not per load)."""
    import copy

    from bertforge.checkpoint import CheckpointError, weights_digest
    from bertforge.precision import TORCH_INT8_PATH, is_quantized

    if precision != "int8" or is_quantized(model) or (device and not str(device).startswith("cpu")):
        return None

    try:
        digest = weights_digest(directory)
    except (CheckpointError, OSError):  # no weights file to tell one model from another: measure anyway
        digest = None
    stored = read_reports(directory).get(TORCH_INT8_PATH, {})
    if digest is not None and stored.get("weights") == digest:
        return None
    return copy.deepcopy(model)


def report_int8(fp32: Any, int8: Any, directory: str | os.PathLike[str], tokenizer: Any = None) -> None:
    """torchao's int8 measured against fp32 on the directory's sample, written to its
    quantization_report.json and logged (a warning below 99% agreement)."""
    import logging

    from bertforge.checkpoint import CheckpointError, weights_digest

    log = logging.getLogger(__name__)
    report = int8_report(fp32, int8, directory, tokenizer)
    for line in report.lines():
        (log.info if report.ok else log.warning)("%s", line)
    try:
        report.weights = weights_digest(directory)
    except (CheckpointError, OSError):
        report.weights = None
    try:
        write_report(report, directory)
    except OSError as exc:  # a read-only model directory: the log said it
        log.info("could not write the int8 report into %s: %s", directory, exc)


# ------------------------------------------------------------------------------------------------
# the file
# ------------------------------------------------------------------------------------------------
def report_path(target: str | os.PathLike[str]) -> Path:
    """Where the report of an int8 model goes: DIR/quantization_report.json for a model directory,
    NAME.quantization_report.json beside an .onnx file."""
    target = Path(target)
    if target.suffix == ".onnx":
        return target.with_name(target.stem + "." + REPORT_FILE)
    return target / REPORT_FILE


def write_report(report: QuantizationReport, target: str | os.PathLike[str]) -> Path:
    """Write the report (atomically) for the int8 model at `target`; a directory's file keeps one report per
    int8 path, so the onnxruntime engine's and a torchao copy's stand side by side."""
    from bertforge.fileio import write_text_atomic

    path = report_path(target)
    try:
        kept = json.loads(path.read_text(encoding="utf-8")).get("reports", {})
    except (OSError, ValueError, AttributeError):
        kept = {}
    kept[report.path] = report.as_dict()
    body = {"ok": all(entry.get("ok", True) for entry in kept.values()), "reports": kept}
    write_text_atomic(path, json.dumps(body, indent=2) + "\n")
    return path


def read_reports(target: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The reports written for `target` by int8 path ({} when there is none)."""
    try:
        return json.loads(report_path(target).read_text(encoding="utf-8")).get("reports", {})
    except (OSError, ValueError, AttributeError):
        return {}


__all__ = ["ADVICE", "AGREEMENT_FLOOR", "COSINE_FLOOR", "FIXED_SENTENCES", "REPORT_FILE", "QuantizationReport",
           "Sample", "compare_scores", "compare_vectors", "encode_batches", "judge", "measure", "read_reports",
           "report_path", "sample_for", "write_report"]
