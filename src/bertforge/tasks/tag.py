"""Token tagging on the user's own files: any entity tag set, IOB1, IOB2 (BIO) or BIOES, two file kinds.

`bertforge finetune tag --train F --dev F [--test F]` reads, per file:

- a CoNLL-style column file (`.txt`, `.tsv`, `.conll` or a name no format claims; not compressed): one
  token per line, whitespace-separated columns, a blank line or a `-DOCSTART-` line between sentences.
  The token is the first column and the tag the last unless `token_column` / `tag_column` give 0-based
  indices (negative from the end);
- JSONL or Parquet rows (also .jsonl.gz etc., or `.json` holding JSON lines; read by `bertforge.tables`)
  with a list of tokens and a list of tags (`tokens` and `tags` unless `token_column` / `tag_column` name
  other columns). Tags are strings, or integers with their names given by `tag_names` (comma-separated,
  or a file: one name a line, a JSON list, or a Hugging Face `dataset_info.json`); a Parquet file
  written by `datasets` carries its names itself and needs none (the Hugging Face `ner_tags` convention).

`bertforge.formats` tells the kinds apart (`TAG_FORMATS`); a file of another format (CSV, a JSON
document) is one `DataFormatError` line naming the formats read.

Tag schemes. Tags are `O` or `PREFIX-TYPE`. `tag_scheme` "auto" (the default) detects the scheme from
all the files together: any E- or S- tag means BIOES; an I-X that opens an entity (at a sentence start,
after O or after another type) while no B-X ever does means IOB1; otherwise IOB2. The model is always trained on IOB2 (BIO;
its `id2label` holds O, B-TYPE and I-TYPE for every type of the training file, which is what
transformers' token-classification pipeline groups), and the prediction files give the tags back in
the scheme of the input. With `strict_tags`, a tag sequence that the scheme does not allow (an I-X
after O in IOB2, a B-X not followed by I-X or E-X in BIOES, ...) is an error; without it, it is read
the way conlleval reads it (an I-X or E-X that does not continue an X entity starts one).

Bad input is one `DataFormatError` naming the file, the line (column files and JSONL; the row for
Parquet) and the field: tokens and tags of different lengths, an unknown tag or integer tag, an entity
type in dev or test that the training file does not have, an invalid sequence when strict.

The metric is conlleval's entity-level precision, recall and F1 (`metrics.conll_f1`), per type as
`f1_<TYPE>`, and token accuracy; the main metric is the entity F1. Windows, first-piece labels and
max-context prediction are the CoNLL-2003 task's (`ner.Ner`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.formats import detect_format
from bertforge.tasks.base import DataFormatError, Feature, OwnFiles
from bertforge.tasks.metrics import conll_f1
from bertforge.tasks.ner import Ner, NerSentence, read_conll

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer

SCHEMES = ("iob1", "iob2", "bioes")
_TAG = re.compile(r"O|([BIES])-(\S+)")
TAG_FORMATS = ("jsonl", "parquet", "columns")  # `bertforge.formats` names; a CSV file, say, is refused


@dataclass
class TagSentence(NerSentence):
    """A sentence of a user's file: `labels` in IOB2, `given_tags` as written, and where it came from."""

    path: str = ""
    given_tags: list[str] | None = None  # the tags as the file writes them (None: an unlabelled file)
    row_file: bool = False                # JSONL/Parquet (one row per sentence) rather than a column file

    def where(self, word: int | None = None) -> tuple[int, str]:
        """(line or row, field) of the sentence, or of one of its words."""
        if self.row_file:
            return self.first_line, "tags" if word is None else f"tags[{word}]"
        return self.first_line + (word or 0), "tag"


@dataclass
class TagPrediction:
    """The model's tags for one sentence (IOB2, the model's labels) and each tag's softmax probability."""

    tags: list[str]
    scores: list[float]


# ------------------------------------------------------------------------------------------------
# schemes
# ------------------------------------------------------------------------------------------------
def split_tag(tag: str) -> tuple[str, str]:
    """("O", "") or (prefix, type); ValueError for anything else."""
    match = _TAG.fullmatch(tag)
    if not match:
        raise ValueError(f"{tag!r} is not O or B-, I-, E-, S- followed by a type")
    return (match.group(1), match.group(2)) if match.group(1) else ("O", "")


def detect_scheme(sentences: Sequence[Sequence[str]]) -> str:
    """"bioes" if any E-/S- tag; "iob1" if some I-X opens an entity and no B-X does (IOB1 uses B- only
    between two entities of one type); else "iob2" (where an I-X opening an entity is a stray)."""
    opens_with_i = opens_with_b = False
    for tags in sentences:
        previous = ("O", "")
        for tag in tags:
            prefix, kind = split_tag(tag)
            if prefix in ("E", "S"):
                return "bioes"
            opens = previous[0] == "O" or previous[1] != kind
            opens_with_i |= prefix == "I" and opens
            opens_with_b |= prefix == "B" and opens
            previous = (prefix, kind)
    return "iob1" if opens_with_i and not opens_with_b else "iob2"


def first_invalid(tags: Sequence[str], scheme: str) -> tuple[int, str] | None:
    """(index, why) of the first tag the scheme does not allow where it stands, or None."""
    previous = ("O", "")
    for i, tag in enumerate([*tags, "O"]):  # the trailing O checks that the last entity is closed
        prefix, kind = split_tag(tag)
        last, last_kind = previous
        if scheme in ("iob1", "iob2") and prefix in ("E", "S"):
            return i, f"{tag!r}: {scheme.upper()} has no {prefix}- tags"
        after = repr(tags[i - 1]) if i else "the sentence start"
        if scheme == "iob2" and prefix == "I" and (last == "O" or last_kind != kind):
            return i, f"{tag!r} follows {after}: in IOB2 an entity starts with B-"
        if scheme == "iob1" and prefix == "B" and (last == "O" or last_kind != kind):
            return i, f"{tag!r} follows {after}: in IOB1 B- only separates two entities of one type"
        if scheme == "bioes":
            open_entity = last in ("B", "I")
            if open_entity and not (prefix in ("I", "E") and kind == last_kind):
                return (i - 1, f"{tags[i - 1]!r} is not followed by I-{last_kind} or E-{last_kind}: "
                               f"in BIOES an entity ends with E- (one-token entities are S-)")
            if not open_entity and prefix in ("I", "E"):
                return i, f"{tag!r} does not continue a B-{kind} ... entity"
        previous = (prefix, kind)
    return None


def to_iob2(tags: Sequence[str], scheme: str) -> list[str]:
    """IOB2 tags of the same entities (read leniently: an I-/E- that does not continue its type opens one)."""
    out: list[str] = []
    previous = ("O", "")
    for tag in tags:
        prefix, kind = split_tag(tag)
        if prefix == "O":
            out.append("O")
        else:
            continues = previous[0] in ("B", "I") and previous[1] == kind
            if scheme == "iob1":
                starts = prefix == "B" or not continues
            else:  # IOB2 and BIOES: B-/S- open an entity; a stray I-/E- opens one too
                starts = prefix in ("B", "S") or not continues
            out.append(("B-" if starts else "I-") + kind)
        # in BIOES, E- and S- close their entity: what follows cannot continue it
        previous = ("O", "") if prefix in ("E", "S") else (prefix, kind)
    return out


def from_iob2(tags: Sequence[str], scheme: str) -> list[str]:
    """IOB2 tags written in `scheme` (the same entities). The input is first read leniently."""
    tags = to_iob2(tags, "iob2")
    if scheme == "iob2":
        return tags
    out = []
    for i, tag in enumerate(tags):
        prefix, kind = split_tag(tag)
        following = tags[i + 1] if i + 1 < len(tags) else "O"
        continued = following == f"I-{kind}"
        if prefix == "O":
            out.append("O")
        elif scheme == "bioes":
            out.append(f"{'B' if continued else 'S'}-{kind}" if prefix == "B" else f"{'I' if continued else 'E'}-{kind}")
        else:  # IOB1: B- only where an entity directly follows one of the same type
            previous_kind = split_tag(tags[i - 1])[1] if i else ""
            out.append(f"B-{kind}" if prefix == "B" and previous_kind == kind else f"I-{kind}")
    return out


# ------------------------------------------------------------------------------------------------
# tag names for integer tags
# ------------------------------------------------------------------------------------------------
def read_tag_names(spec: str, tag_column: str = "tags") -> list[str]:
    """Names of integer tags: "O,B-PER,I-PER", or a file: one name a line, a JSON list, or a Hugging
    Face `dataset_info.json` (the names of `tag_column`'s ClassLabel feature)."""
    path = Path(spec)
    if not path.is_file():
        names = [n.strip() for n in spec.split(",")]
        if len(names) < 2 or not all(names):
            raise ValueError(f"tag_names {spec!r}: neither a file nor a comma-separated list of names")
        return names
    text = path.read_text(encoding="utf-8")
    if detect_format(path, ("json", "lines")) == "lines":
        return [line.strip() for line in text.splitlines() if line.strip()]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFormatError(path, exc.lineno, "json", exc.msg) from None
    except RecursionError:
        raise DataFormatError(path, None, "json", "nested too deeply to read") from None
    names = value if isinstance(value, list) else _class_label_names(value, tag_column)
    if not names or not all(isinstance(n, str) for n in names):
        raise DataFormatError(path, None, tag_column, "expected a list of tag names, or a dataset_info.json "
                                                      f"whose feature {tag_column!r} lists them")
    return list(names)


def _class_label_names(info: Any, column: str) -> list[str] | None:
    """`features[column]` (a Sequence of ClassLabel) names in a `datasets` info dictionary."""
    if not isinstance(info, dict):
        return None
    features = info.get("features", info.get("info", {}).get("features") if isinstance(info.get("info"), dict) else None)
    feature = features.get(column) if isinstance(features, dict) else None
    while isinstance(feature, dict):
        if isinstance(feature.get("names"), list):
            return feature["names"]
        feature = feature.get("feature")
    if isinstance(feature, list) and feature and isinstance(feature[0], dict):
        return feature[0].get("names")
    return None


def parquet_tag_names(path: Path, column: str) -> list[str] | None:
    """The ClassLabel names a Parquet file written by `datasets` keeps in its schema metadata."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    raw = metadata.get(b"huggingface")
    if not raw:
        return None
    try:
        return _class_label_names(json.loads(raw), column)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------
# the task
# ------------------------------------------------------------------------------------------------
TAG_SETTINGS: dict[str, Any] = {
    "train": None, "dev": None, "test": None,
    "token_column": None, "tag_column": None,  # defaults: first/last column; `tokens`/`tags` rows
    "tag_scheme": "auto", "tag_names": None, "strict_tags": False,
}


@dataclass
class Tag(OwnFiles, Ner):
    """Token classification on the user's files (see the module docstring); one IOB2 tag per word."""

    name: str = "tag"
    family: ClassVar[str] = "tag"
    command_help: ClassVar[str] = """Fine-tune token tagging on your own files: CoNLL-style column files or .jsonl / .parquet rows of
    tokens and tags, any entity types, IOB1, IOB2 (BIO) or BIOES (detected). The model trains on IOB2;
    dev is scored with conlleval's entity F1 (per type too) and token accuracy.

    Example: `bertforge finetune tag --train train.jsonl --dev dev.jsonl --model models/minilm --out runs/tag`
    Integer tags: `bertforge finetune tag --train train.parquet --dev dev.parquet --tag-column ner_tags --tag-names O,B-PER,I-PER --model models/minilm --out runs/tag`
    """
    main_metric: ClassVar[str] = "f1"
    setting_options: ClassVar[dict[str, tuple[type, str]]] = {
        "train": (str, "Training file: a CoNLL-style column file, or .jsonl / .parquet rows of tokens and tags. Or a Hub data set: org/name[@revision][:config][:split]."),
        "dev": (str, "Dev file (same kinds), scored after every epoch. Or a Hub data set: org/name[@revision][:config][:split]."),
        "test": (str, "Test file (same kinds), scored (if tagged) and predicted at the end. Or a Hub data set: org/name[@revision][:config][:split]."),
        "token_column": (str, "The token column: a 0-based index in a column file (default 0, the first), "
                              "a name in rows (default tokens)."),
        "tag_column": (str, "The tag column: a 0-based index in a column file (default -1, the last), "
                            "a name in rows (default tags)."),
        "tag_scheme": (str, "auto, iob1, iob2 (BIO) or bioes: how the files write entities (default auto: "
                            "detected). The model trains on IOB2; predictions are written in the files' scheme."),
        "tag_names": (str, "Names of integer tags: comma-separated, or a file (one a line, a JSON list, "
                           "or a datasets dataset_info.json)."),
        "strict_tags": (bool, "Reject a tag sequence the scheme does not allow (default: read it as conlleval does)."),
        **Ner.setting_options,
    }

    def __post_init__(self) -> None:
        if self.name != "tag":
            raise ValueError(f"the tag family has one task, 'tag' (files come from --train/--dev/--test), "
                             f"not {self.name!r}")
        self.settings = {**TAG_SETTINGS, **self.settings}
        scheme = str(self.settings["tag_scheme"]).lower()
        if scheme == "bio":
            scheme = "iob2"
        if scheme not in ("auto", *SCHEMES):
            raise ValueError(f"tag_scheme {self.settings['tag_scheme']!r}: use auto, iob1, iob2 (bio) or bioes")
        self.settings["tag_scheme"] = scheme
        self._read: dict[str, list[TagSentence]] = {}

    # ---- reader

    def read(self, data_dir: str | Path | None, split: str) -> list[TagSentence]:
        path = self.file_of(data_dir, split)
        if self.settings["tag_scheme"] == "auto":
            self.settings["tag_scheme"] = self._detect_scheme(data_dir, path)
        return self._convert(self._raw(path))

    def _raw(self, path: Path) -> list[TagSentence]:
        key = str(path)
        if key not in self._read:
            self._read[key] = self._read_file(path)
        return self._read[key]

    def _detect_scheme(self, data_dir: str | Path | None, path: Path) -> str:
        """The scheme of all the labelled files named in the settings (and `path`) together."""
        paths = [f for s in ("train", "dev", "test") if (f := self.named_file(s)) is not None]
        tags = [s.given_tags for p in dict.fromkeys([*paths, path]) for s in self._raw(p) if s.given_tags]
        return detect_scheme(tags)

    def _read_file(self, path: Path) -> list[TagSentence]:
        fmt = detect_format(path, TAG_FORMATS)
        return self._read_columns(path) if fmt == "columns" else self._read_rows(path, fmt)

    def _read_columns(self, path: Path) -> list[TagSentence]:
        token_column = _index(self.settings.get("token_column"), 0, "token_column")
        tag_column = _index(self.settings.get("tag_column"), -1, "tag_column")
        sentences = read_conll(path, n_columns=None, scheme="keep", token_column=token_column,
                               tag_column=tag_column)
        return [TagSentence(s.guid, s.words, [], [], [], s.doc_index, s.first_line, path=str(path),
                            given_tags=list(s.labels)) for s in sentences]

    def _read_rows(self, path: Path, fmt: str) -> list[TagSentence]:
        from bertforge.tables import iter_rows

        token_column = str(self.settings.get("token_column") or "tokens")
        tag_column = str(self.settings.get("tag_column") or "tags")
        names = self._names(path, tag_column, fmt)
        sentences = []
        labelled = any(self.named_file(s) == path for s in ("train", "dev"))
        for row in iter_rows(path, [token_column, *([tag_column] if labelled else [])], fmt=fmt):
            tokens = row.values[token_column]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
                raise DataFormatError(path, row.number, token_column, f"expected a list of strings, got {tokens!r:.80}")
            if not tokens:
                raise DataFormatError(path, row.number, token_column, "no tokens")
            if any(not t or t.isspace() for t in tokens):
                raise DataFormatError(path, row.number, token_column, "an empty token")
            given = None
            if tag_column in row.values:
                given = self._row_tags(path, row.number, tag_column, row.values[tag_column], names)
                if len(given) != len(tokens):
                    raise DataFormatError(path, row.number, tag_column,
                                          f"{len(given)} tags for {len(tokens)} tokens in {token_column}")
            sentences.append(TagSentence(f"{path.name}-{len(sentences)}", list(tokens), [], [], [], 0, row.number,
                                         path=str(path), given_tags=given, row_file=True))
        return sentences

    def _names(self, path: Path, tag_column: str, fmt: str) -> list[str] | None:
        spec = self.settings.get("tag_names")
        if spec:
            return read_tag_names(str(spec), tag_column)
        if fmt == "parquet":
            return parquet_tag_names(path, tag_column)
        return None

    @staticmethod
    def _row_tags(path: Path, line: int, column: str, value: Any, names: list[str] | None) -> list[str]:
        if not isinstance(value, list):
            raise DataFormatError(path, line, column, f"expected a list of tags, got {value!r:.80}")
        tags = []
        for k, tag in enumerate(value):
            if isinstance(tag, int) and not isinstance(tag, bool):
                if names is None:
                    raise DataFormatError(path, line, f"{column}[{k}]", f"integer tag {tag} but no tag names: "
                                                                        "give --tag-names")
                if not 0 <= tag < len(names):
                    raise DataFormatError(path, line, f"{column}[{k}]", f"tag id {tag} is not in the "
                                                                        f"{len(names)} tag names")
                tag = names[tag]
            if not isinstance(tag, str):
                raise DataFormatError(path, line, f"{column}[{k}]", f"expected a string or integer tag, got {tag!r:.40}")
            tags.append(tag)
        return tags

    def _convert(self, sentences: list[TagSentence]) -> list[TagSentence]:
        """Check every tag against the scheme and fill `labels` with the IOB2 tags."""
        scheme, strict = self.settings["tag_scheme"], bool(self.settings.get("strict_tags"))
        for sentence in sentences:
            if sentence.given_tags is None:
                sentence.labels = []
                continue
            for k, tag in enumerate(sentence.given_tags):
                try:
                    split_tag(tag)
                except ValueError as exc:
                    raise DataFormatError(sentence.path, *sentence.where(k), str(exc)) from None
            bad = first_invalid(sentence.given_tags, scheme)
            foreign = bad is not None and scheme != "bioes" and sentence.given_tags[bad[0]][0] in "ES"
            if bad is not None and (strict or foreign):  # an E-/S- tag in IOB files is never read leniently
                raise DataFormatError(sentence.path, *sentence.where(bad[0]),
                                      f"{bad[1]} (tag scheme {scheme}{', strict' if strict else ''})")
            sentence.labels = to_iob2(sentence.given_tags, scheme)
        return sentences

    def has_labels(self, examples: Sequence[Any]) -> bool:
        return bool(examples) and all(e.given_tags is not None for e in examples)

    # ---- head and features
    def label_names(self, train_examples: Sequence[TagSentence]) -> list[str]:
        """O, then B-TYPE and I-TYPE for every type in the training file (types in the order of the tag
        names when given, else sorted)."""
        if not self.has_labels(train_examples):
            raise ValueError("the training file has no tags")
        kinds = {split_tag(t)[1] for s in train_examples for t in s.labels} - {""}
        order = self._type_order()
        ordered = sorted(kinds, key=lambda k: (order.get(k, len(order)), k))
        return ["O"] + [f"{p}-{k}" for k in ordered for p in ("B", "I")]

    def _type_order(self) -> dict[str, int]:
        spec = self.settings.get("tag_names")
        if not spec:
            return {}
        try:
            names = read_tag_names(str(spec), str(self.settings.get("tag_column") or "tags"))
        except (ValueError, OSError):
            return {}
        kinds = [split_tag(n)[1] for n in names if _TAG.fullmatch(n)]
        return {k: i for i, k in enumerate(dict.fromkeys(k for k in kinds if k))}

    def featurize(self, examples: Sequence[TagSentence], tokenizer: BertTokenizer, max_length: int, *,
                  label_names: Sequence[str] | None = None) -> list[Feature]:
        if label_names is not None and self.has_labels(examples):
            self._check_known(examples, label_names)
        elif label_names is not None:  # an unlabelled file: features without labels
            return super().featurize(examples, tokenizer, max_length)
        return super().featurize(examples, tokenizer, max_length, label_names=label_names)

    def _check_known(self, examples: Sequence[TagSentence], label_names: Sequence[str]) -> None:
        known = set(label_names)
        for sentence in examples:
            for k, tag in enumerate(sentence.labels):
                if tag not in known:
                    kinds = sorted({split_tag(n)[1] for n in label_names} - {""})
                    train = Path(self.settings["train"]).name if self.settings.get("train") else "training"
                    raise DataFormatError(sentence.path, *sentence.where(k),
                                          f"tag {sentence.given_tags[k]!r}: type {split_tag(tag)[1]} does not "  # type: ignore[index]
                                          f"occur in the {train} file (its types: {', '.join(kinds)})")

    # ---- post-processing, metric, files
    def postprocess(self, examples: Sequence[TagSentence], features: Sequence[Feature],
                    outputs: Sequence[dict[str, np.ndarray]], *,
                    label_names: Sequence[str] | None = None) -> list[TagPrediction]:
        if label_names is None:
            raise ValueError("tag post-processing needs the model's label names")
        predictions = []
        for logits in self.word_logits(examples, features, outputs):  # (n_words, num_labels)
            if not len(logits):
                predictions.append(TagPrediction([], []))
                continue
            shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probabilities = shifted / shifted.sum(axis=-1, keepdims=True)
            best = probabilities.argmax(axis=-1)
            predictions.append(TagPrediction([label_names[i] for i in best.tolist()],
                                             probabilities[np.arange(len(best)), best].tolist()))
        return predictions

    def metric(self, examples: Sequence[TagSentence], predictions: Sequence[TagPrediction]) -> dict[str, float]:
        """conlleval's entity precision, recall, F1 (and F1 per type, `f1_<TYPE>`), and token accuracy."""
        result = conll_f1([e.labels for e in examples], [p.tags for p in predictions])
        scores = {key: float(result[key]) for key in ("precision", "recall", "f1", "accuracy")}
        scores.update({f"f1_{kind}": float(row["f1"]) for kind, row in result["per_type"].items()})
        return scores

    def file_tags(self, tags: Sequence[str]) -> list[str]:
        """The model's IOB2 tags written in the training files' scheme (IOB2 when it is not known)."""
        return from_iob2(tags, self.settings["tag_scheme"] if self.settings["tag_scheme"] in SCHEMES else "iob2")

    def write_predictions(self, examples: Sequence[TagSentence], predictions: Sequence[TagPrediction],
                          out_dir: Path, split: str) -> list[Path]:
        """`predictions-<split>.jsonl`: per sentence `tokens`, the predicted `tags` in the files' scheme, each
        tag's `scores`, and the file's own tags as `gold` when it has them."""
        from bertforge.tables import write_all

        rows = []
        for example, prediction in zip(examples, predictions, strict=True):
            row: dict[str, Any] = {"tokens": example.words, "tags": self.file_tags(prediction.tags),
                                   "scores": [round(s, 6) for s in prediction.scores]}
            if example.given_tags is not None:
                row["gold"] = example.given_tags
            rows.append(row)
        path = Path(out_dir) / f"predictions-{split}.jsonl"
        write_all(path, rows)
        return [path]


def _index(value: Any, default: int, name: str) -> int:
    """A column index from a setting ("2", -1, None)."""
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} {value!r}: a column file's columns are numbered (0 = first, -1 = last)") from None


__all__ = ["SCHEMES", "Tag", "TagPrediction", "TagSentence", "detect_scheme", "first_invalid", "from_iob2",
           "read_tag_names", "split_tag", "to_iob2"]
