"""What each task does around the model: its inputs checked and turned into features (`prepare`), the
model's outputs turned into results (`finish`), and the row a result becomes in a prediction file.
One runner per pipeline task; `Pipeline` holds one and calls it."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from bertforge.tasks.base import Feature, Task

if TYPE_CHECKING:
    import torch


class InputError(ValueError):
    """An input the pipeline cannot use: `index` is its position in the call, `code` a short name
    (empty_text, no_mask, too_long, empty_context, bad_input) that serve returns as the error code."""

    def __init__(self, index: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"input {index}: {message}")
        self.index, self.code, self.detail, self.field = index, code, message, field


@dataclass
class Prepared:
    """What `prepare` made of the inputs: the task's examples and their model rows."""

    examples: list[Any]
    features: list[Feature]
    info: list[dict[str, Any]] = field(default_factory=list)  # per input: truncated, words, ...


def positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _is_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _text(value: Any, index: int, what: str = "text", *, may_be_empty: bool = False) -> str:
    """`value` checked to be text; an empty (or all-space) one only where the task answers it
    (`may_be_empty`: classification, tagging and embeddings answer "" as transformers' pipelines do)."""
    if not isinstance(value, str):
        raise InputError(index, "bad_input", f"{what} must be a string, got {type(value).__name__}", what)
    if not value.strip() and not may_be_empty:
        raise InputError(index, "empty_text", f"{what} is empty", what)
    return value


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


# ------------------------------------------------------------------------------------------------
# one runner per task: inputs -> task examples -> features; outputs -> task predictions -> results
# ------------------------------------------------------------------------------------------------
class Runner:
    token_outputs: ClassVar[tuple[str, ...]] = ()
    call_options: ClassVar[tuple[str, ...]] = ()  # what a call may change (`pipe(inputs, **options)`)

    def __init__(self, pipe: Any) -> None:  # the Pipeline that holds it
        self.pipe = pipe

    @property
    def spec(self) -> Task:
        assert self.pipe.spec is not None
        return self.pipe.spec

    def prepare(self, inputs: list[Any]) -> Prepared:
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor], **options: Any) -> dict[str, torch.Tensor]:
        if self.pipe.engine is not None:  # the head's graph: its outputs under the same names
            found = self.pipe.engine.run(batch)
            return {name: found[name] for name in self.spec.output_names}
        output = self.pipe.model(**batch)
        return {name: getattr(output, name) for name in self.spec.output_names}

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        raise NotImplementedError

    def public(self, result: Any) -> Any:
        """What `Pipeline.__call__` returns for one result (serve and predict may read more of it)."""
        return result


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


# a call's function_to_apply, as transformers' text-classification pipeline names them: what turns a
# row's logits into its scores
SCORE_FUNCTIONS = {"softmax": _softmax, "sigmoid": _sigmoid, "none": lambda logits: logits}


def _score_function(value: Any) -> str:
    name = str(value).lower()
    if name not in SCORE_FUNCTIONS:
        raise ValueError(f"function_to_apply must be one of {', '.join(SCORE_FUNCTIONS)}, got {value!r}")
    return name


def _top_k(value: Any) -> int | None:
    """A call's top_k for text classification: None (every label, ranked) or a positive count."""
    return None if value is None else positive_int(value, "top_k")


class _Classification(Runner):
    """Sentence (pair) classification, multi-label classification and regression, through the task's
    featurize (BERT's truncation) and postprocess (a GLUE task's argmax, or the classify family's
    softmax, per-label sigmoid thresholds tuned on dev, or value). A call's `top_k` (None: every
    label) answers as transformers' text-classification pipeline does: the ranked labels and scores;
    `function_to_apply` ("softmax", "sigmoid", "none") scores every label from the logits with that
    function instead of the model's own rule (the label is then the highest score's)."""

    call_options = ("top_k", "function_to_apply")

    def prepare(self, inputs: list[Any]) -> Prepared:
        pairs = []
        for i, item in enumerate(inputs):
            if isinstance(item, dict):
                text, pair = item.get("text"), item.get("text_pair")
            elif _is_pair(item):
                text, pair = item
            else:
                text, pair = item, None
            pairs.append((_text(text, i, may_be_empty=True),
                          None if pair is None else _text(pair, i, "text_pair", may_be_empty=True)))
        examples = [self.spec.inference_example(i, {"text": text, "text_pair": pair})
                    for i, (text, pair) in enumerate(pairs)]
        if self.pipe.long_text == "windows":
            return self._windows(examples, pairs)
        features = self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length)
        return Prepared(examples, features, [{"truncated": self._truncated(pair, f), "windows": 1}
                                             for pair, f in zip(pairs, features, strict=True)])

    def _windows(self, examples: list[Any], pairs: list[tuple[str, str | None]]) -> Prepared:
        """`[CLS] window [SEP]` rows over each whole text, a window starting every `window_stride` pieces
        until one reaches the text's end; a text that fits gives the one row truncation would give."""
        tokenizer, body = self.pipe.tokenizer, self.pipe.max_length - 2
        features, info = [], []
        for i, (text, pair) in enumerate(pairs):
            if pair is not None:
                raise InputError(i, "bad_input", "long_text='windows' reads single texts; this input has a "
                                 "text_pair (use long_text='truncate' for pairs)", "text_pair")
            pieces = tokenizer.encode(text, max_length=10**9, add_special_tokens=False).input_ids
            starts = list(range(0, max(len(pieces) - body, 0) + 1, self.pipe.window_stride))
            if starts[-1] + body < len(pieces):  # the stride stepped past the last full window: add it
                starts.append(len(pieces) - body)
            for start in starts:
                ids = [tokenizer.cls_token_id, *pieces[start:start + body], tokenizer.sep_token_id]
                features.append(Feature({"input_ids": ids, "token_type_ids": [0] * len(ids)}, i))
            info.append({"truncated": False, "windows": len(starts)})
        return Prepared(examples, features, info)

    def _truncated(self, pair: tuple[str, str | None], feature: Feature) -> bool:
        if feature.length < self.pipe.max_length:
            return False  # shorter than the limit: nothing was cut
        # one token more than the row holds is enough to tell, and keeps a 10 MB text from being encoded whole
        longer = self.pipe.tokenizer.encode(*pair, max_length=feature.length + 1, truncation=True)
        return len(longer) > feature.length

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        asked = {"top_k": _top_k(options["top_k"])} if "top_k" in options else {}
        function = _score_function(options["function_to_apply"]) if "function_to_apply" in options else None
        features = prepared.features
        if len(features) != len(prepared.examples):  # windows: one row per example, its windows' mean logits
            features, outputs = _pool_windows(features, outputs, len(prepared.examples))
        predictions = self.spec.postprocess(prepared.examples, features, outputs, label_names=self.pipe.labels)
        results = []
        for prediction, output, info in zip(predictions, outputs, prepared.info, strict=True):
            result = (self._applied(function, output["logits"]) if function else
                      self._result(prediction, output["logits"]))
            results.append({**result, "truncated": info["truncated"], "windows": info["windows"], **asked})
        return results

    def _applied(self, function: str, logits: np.ndarray) -> dict[str, Any]:
        """Every label scored by `function` over the row's logits, the label the highest score's."""
        if logits.shape[-1] == 1 and function != "sigmoid":
            raise ValueError(f"function_to_apply={function!r} needs several labels; this model predicts one value "
                             "(regression): use 'sigmoid' or leave it out")
        scores = SCORE_FUNCTIONS[function](np.asarray(logits, dtype=np.float64)).tolist()
        names = self.pipe.labels if len(self.pipe.labels) == len(scores) else [str(i) for i in range(len(scores))]
        ranked = sorted(zip(names, scores, strict=True), key=lambda x: -x[1])
        return {"label": ranked[0][0], "score": float(ranked[0][1]),
                "scores": [{"label": n, "score": float(v)} for n, v in ranked]}

    def _result(self, prediction: Any, logits: np.ndarray) -> dict[str, Any]:
        if isinstance(prediction, dict):  # the classify family decides labels and scores itself
            scores = prediction.get("scores") or {}
            ranked = [{"label": n, "score": float(p)} for n, p in sorted(scores.items(), key=lambda x: -x[1])]
            if "labels" in prediction:  # multi-label: every label at or above its tuned threshold
                return {"labels": list(prediction["labels"]), "scores": ranked}
            if "label" in prediction:
                return {"label": prediction["label"], "score": float(prediction["score"]), "scores": ranked}
            return {"value": float(prediction["score"])}  # regression
        if logits.shape[-1] == 1:  # a GLUE regression task (STS-B): the predicted value
            return {"value": float(prediction)}
        probabilities = _softmax(logits)
        ranked = sorted(zip(self.pipe.labels, probabilities.tolist(), strict=True), key=lambda x: -x[1])
        return {"label": self.pipe.labels[int(prediction)], "score": float(probabilities[int(prediction)]),
                "scores": [{"label": n, "score": p} for n, p in ranked]}

    def public(self, result: Any) -> Any:
        if "top_k" in result and "scores" in result:  # asked for at call time: the ranked labels, as transformers
            return result["scores"] if result["top_k"] is None else result["scores"][:result["top_k"]]
        return output_row(self.pipe.task, result, all_scores=self.pipe.all_scores)


def _pool_windows(features: Sequence[Feature], outputs: Sequence[dict[str, np.ndarray]],
                  examples: int) -> tuple[list[Feature], list[dict[str, np.ndarray]]]:
    """Per example, its first window's feature and the mean of its windows' logits (pooled logits: the
    class evidence of every part of the text counts alike, wherever it sits)."""
    sums: list[np.ndarray | None] = [None] * examples
    counts = [0] * examples
    first: list[Feature | None] = [None] * examples
    for feature, output in zip(features, outputs, strict=True):
        i = feature.example
        logits = np.asarray(output["logits"], dtype=np.float64)
        sums[i] = logits if sums[i] is None else sums[i] + logits
        counts[i] += 1
        first[i] = first[i] or feature
    pooled = [{"logits": (total / count).astype(np.float32)} for total, count in zip(sums, counts, strict=True)]
    return [f for f in first if f is not None], pooled


AGGREGATIONS = ("simple", "none")  # a call's aggregation_strategy for tagging


class _TokenClassification(Runner):
    """Words found by BERT's pre-tokeniser (with their characters), tagged by the NER task's word
    windows; entities grouped from the word tags (transformers' aggregation "simple", word level). A
    call's `aggregation_strategy="none"` answers one row per word instead, in transformers' shape
    (entity, score, index, word, start, end)."""

    token_outputs = ("logits",)
    call_options = ("aggregation_strategy",)

    def prepare(self, inputs: list[Any]) -> Prepared:
        pre_tokenize = self.pipe.tokenizer.words  # words with their characters (byte-level BPE's without the space)
        examples, info = [], []
        for i, item in enumerate(inputs):
            value = item.get("text") if isinstance(item, dict) else item
            if isinstance(value, (list, tuple)):  # words split already (a tagging file's tokens): tagged as given
                text, words = _presplit(value, i)
            else:
                text = _text(value, i, may_be_empty=True)
                words = pre_tokenize(text)  # [(word, (start, end))]
            examples.append(self.spec.inference_example(i, {"words": [w for w, _ in words]}))
            info.append({"text": text, "spans": [span for _, span in words], "presplit": not isinstance(value, str)})
        features = self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length)
        return Prepared(examples, features, info)

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        predictions = self.spec.postprocess(prepared.examples, prepared.features, outputs,
                                            label_names=self.pipe.labels)
        tags = [getattr(p, "tags", p) for p in predictions]  # the tag family gives tags with scores
        scores = [[0.0] * len(e.words) for e in prepared.examples]
        for feature, output in zip(prepared.features, outputs, strict=True):
            window = feature.meta  # the word's score comes from the window its tag came from
            probabilities = _softmax(output["logits"])  # (T, num_labels)
            for offset, (position, chosen) in enumerate(zip(window.token_of_word, window.max_context, strict=True)):
                if chosen:
                    scores[feature.example][window.first_word + offset] = float(probabilities[position].max())
        results = []
        for example_tags, example_scores, info in zip(tags, scores, prepared.info, strict=True):
            text = info["text"]
            words = [{"word": text[s:e], "label": tag, "score": score, "start": s, "end": e}
                     for tag, score, (s, e) in zip(example_tags, example_scores, info["spans"], strict=True)]
            result = {"entities": group_entities(text, words), "words": words}
            if info["presplit"]:  # a tagging file's words: its tags as the tag family writes them, in the files' scheme
                in_scheme = getattr(self.spec, "file_tags", list)
                result.update(tags=in_scheme([w["label"] for w in words]), scores=[w["score"] for w in words])
            results.append(result)
        if "aggregation_strategy" in options:
            strategy = str(options["aggregation_strategy"]).lower()
            if strategy not in AGGREGATIONS:
                raise ValueError(f"aggregation_strategy must be one of {', '.join(AGGREGATIONS)} (tags are given per "
                                 f"word already), got {options['aggregation_strategy']!r}")
            for result in results:
                result["aggregation"] = strategy
        return results

    def public(self, result: Any) -> Any:
        if result.get("aggregation") == "none":
            return [{"entity": w["label"], "score": w["score"], "index": i, "word": w["word"], "start": w["start"],
                     "end": w["end"]} for i, w in enumerate(result["words"])]
        return result["entities"]


def _presplit(words: Sequence[Any], index: int) -> tuple[str, list[tuple[str, tuple[int, int]]]]:
    """Words given one by one -> the text they make, joined by single spaces, and each word's span in it."""
    spans, start = [], 0
    for word in words:
        if not isinstance(word, str) or not word or any(c.isspace() for c in word):
            raise InputError(index, "bad_input", f"a word must be non-empty text without spaces, got {word!r:.60}",
                             "text")
        spans.append((word, (start, start + len(word))))
        start += len(word) + 1
    return " ".join(words), spans


def split_tag(label: str) -> tuple[str, str | None]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', None); a bare 'PER' (IO tagging) -> ('I', 'PER')."""
    if label == "O" or not label:
        return "O", None
    if len(label) > 2 and label[1] in "-_" and label[0] in "BIESbies":
        return label[0].upper(), label[2:]
    return "I", label


def group_entities(text: str, words: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tagged words -> entities: a B- or S- tag (or a change of type) starts one, I- and E- of the same
    type continue it; the score is the mean of its words' scores (transformers' "simple" aggregation)."""
    entities: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None

    def close() -> None:
        if current is not None:
            start, end = current["start"], current["end"]
            entities.append({"label": current["label"], "text": text[start:end], "start": start, "end": end,
                             "score": sum(current["scores"]) / len(current["scores"])})

    for word in words:
        tag, kind = split_tag(word["label"])
        if kind is None:
            close()
            current = None
        elif current is not None and tag in ("I", "E") and kind == current["label"]:
            current["end"] = word["end"]
            current["scores"].append(word["score"])
        else:
            close()
            current = {"label": kind, "start": word["start"], "end": word["end"], "scores": [word["score"]]}
    close()
    return entities


class _QuestionAnswering(Runner):
    """SQuAD's windows and answer search (tasks/squad.py) with the model's saved settings: doc stride,
    max query length and, for a SQuAD v2.0 model, the null threshold tuned on dev."""

    call_options = ("allow_no_answer", "max_answer_tokens")

    token_outputs = ("start_logits", "end_logits")

    def prepare(self, inputs: list[Any]) -> Prepared:
        examples = []
        for i, item in enumerate(inputs):
            if isinstance(item, dict):
                question, context = item.get("question"), item.get("context")
            elif isinstance(item, tuple | list) and len(item) == 2:
                question, context = item
            else:
                raise InputError(i, "bad_input", "a question-answering input is {'question': ..., 'context': ...} "
                                                 "or a (question, context) pair")
            examples.append(self.spec.inference_example(i, {"question": _text(question, i, "question"),
                                                             "context": _text(context, i, "context")}))
        features = self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length)
        for feature in features:
            if feature.meta.length == 0:
                raise InputError(feature.example, "empty_context",
                                 "the context has no tokens (only control or unknown characters?)", "context")
        return Prepared(examples, features, [{} for _ in examples])

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], *,
               allow_no_answer: bool | None = None, max_answer_tokens: int | None = None, **options: Any) -> list[Any]:
        spec = self._variant(allow_no_answer, max_answer_tokens)
        predictions = spec.postprocess(prepared.examples, prepared.features, outputs)
        return [self._result(p, spec.version == "2.0" and allow_no_answer is not False) for p in predictions]

    def _variant(self, allow_no_answer: bool | None, max_answer_tokens: int | None) -> Task:
        """The task with this call's answer rules: a v1.1 model asked to allow no answer is read as a
        v2.0 one with threshold 0 (no answer when [CLS] outscores the best span)."""
        changes: dict[str, Any] = {}
        if max_answer_tokens is not None:
            changes["max_answer_length"] = positive_int(max_answer_tokens, "max_answer_tokens")
        if allow_no_answer and self.spec.version != "2.0":
            changes.update(version="2.0", null_threshold=0.0)
        if not changes:
            return self.spec
        return dataclasses.replace(self.spec, settings={**self.spec.settings, **changes})

    @staticmethod
    def _result(prediction: Any, may_abstain: bool) -> dict[str, Any]:
        """The answer with the softmax probability of its span among the n-best; with no answer, the
        probability of [CLS] among [CLS] and those spans."""
        best = prediction.nbest[0] if prediction.nbest else None
        null_odds = prediction.null_odds
        if best is None or (may_abstain and prediction.text == "" and null_odds is not None):
            score = 1.0
            if best is not None and null_odds is not None:  # null score = best span score + odds
                spans = np.array([c["score"] for c in prediction.nbest]) - best["score"] - null_odds
                score = float(1.0 / (1.0 + np.exp(spans).sum()))
            return {"answer": "", "score": score, "start": None, "end": None, "no_answer": True,
                    "null_odds": null_odds}
        return {"answer": best["text"], "score": float(best["probability"]), "start": best["start"],
                "end": best["end"], "no_answer": False, "null_odds": null_odds}

    def public(self, result: Any) -> Any:
        return {k: v for k, v in result.items() if k != "null_odds" or v is not None}


class _FillMask(Runner):
    """The top-k tokens for every [MASK] of a text (special tokens never predicted)."""

    token_outputs = ("mask_scores", "mask_ids")
    call_options = ("top_k",)

    def prepare(self, inputs: list[Any]) -> Prepared:
        tok = self.pipe.tokenizer
        features, info = [], []
        for i, item in enumerate(inputs):
            text = _text(item.get("text") if isinstance(item, dict) else item, i)
            encoding = tok.encode(text, max_length=10**9)
            if len(encoding) > self.pipe.max_length:
                raise InputError(i, "too_long", f"the text is {len(encoding)} tokens (special tokens included); "
                                                f"at most {self.pipe.max_length}", "text")
            masks = [(p, *encoding.offsets[p]) for p, t in enumerate(encoding.input_ids) if t == tok.mask_token_id]
            if not masks:
                raise InputError(i, "no_mask", f"the text has no {tok.mask_token} token; put {tok.mask_token} "
                                               f"where a word should be predicted", "text")
            features.append(Feature({"input_ids": encoding.input_ids, "token_type_ids": encoding.token_type_ids}, i))
            info.append({"text": text, "masks": masks})
        return Prepared(list(inputs), features, info)

    def forward(self, batch: dict[str, torch.Tensor], *, top_k: int | None = None,
                **options: Any) -> dict[str, torch.Tensor]:
        import torch

        model = self.pipe.model
        k = min(top_k or self.pipe.top_k, self.pipe.config.vocab_size)
        if self.pipe.engine is not None:  # the graph's top tokens at every position; the masks' are read
            return self._from_graph(batch, k)
        hidden = model.base_model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).last_hidden_state
        masked = batch["input_ids"] == self.pipe.tokenizer.mask_token_id  # (B, T)
        # only the masked positions go through the vocabulary projection: (N, H) -> (N, V)
        logits = model.masked_lm_logits(hidden[masked]).float()
        logits[:, sorted(set(self.pipe.tokenizer.all_special_ids))] = -math.inf
        top = logits.softmax(-1).topk(k, dim=-1)
        shape = (*masked.shape, k)
        scores = torch.zeros(shape, device=logits.device)
        ids = torch.zeros(shape, dtype=torch.long, device=logits.device)
        scores[masked], ids[masked] = top.values, top.indices
        return {"mask_scores": scores, "mask_ids": ids}  # (B, T, k) each; zero off the masks

    def _from_graph(self, batch: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
        from bertforge.engine import FILL_MASK_TOP_K

        assert self.pipe.engine is not None
        if k > FILL_MASK_TOP_K:
            raise ValueError(f"top_k {k}: the onnxruntime engine gives at most {FILL_MASK_TOP_K} tokens per "
                             "[MASK]; use the torch engine for more")
        found = self.pipe.engine.run(batch)
        masked = (batch["input_ids"] == self.pipe.tokenizer.mask_token_id).unsqueeze(-1).cpu()  # (B, T, 1)
        return {"mask_scores": found["mask_scores"][..., :k] * masked,
                "mask_ids": found["mask_ids"][..., :k] * masked}

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], *, top_k: int | None = None,
               **options: Any) -> list[Any]:
        tok, k = self.pipe.tokenizer, top_k or self.pipe.top_k
        results = []
        for output, info in zip(outputs, prepared.info, strict=True):
            text, found = info["text"], []
            for position, start, end in info["masks"]:
                predictions = []
                for score, token_id in zip(output["mask_scores"][position][:k].tolist(),
                                           output["mask_ids"][position][:k].astype(int).tolist(), strict=True):
                    token = tok.convert_ids_to_tokens(token_id)
                    word = token[2:] if token.startswith("##") else token
                    predictions.append({"token": token, "token_id": token_id, "score": score,
                                        "sequence": text[:start] + word + text[end:]})
                found.append({"position": position, "start": start, "end": end, "predictions": predictions})
            results.append(found)
        return results

    def public(self, result: Any) -> Any:
        return [mask["predictions"] for mask in result]


class _Embeddings(Runner):
    """One vector per text from the final layer: the [CLS] vector, the mean or the maximum over the real
    tokens (specials included, as sentence-transformers does), or the pooler's output."""

    call_options = ("pooling", "normalize")

    def prepare(self, inputs: list[Any]) -> Prepared:
        texts = [_text(item.get("text") if isinstance(item, dict) else item, i, may_be_empty=True)
                 for i, item in enumerate(inputs)]
        cased = [text.lower() for text in texts] if self.pipe.lowercase_inputs else texts
        encoded = self.pipe.tokenizer.encode_batch(cased, max_length=10**9)
        features, info = [], []
        for i, encoding in enumerate(encoded["encodings"]):
            ids, types = encoding.input_ids, encoding.token_type_ids
            truncated = len(ids) > self.pipe.max_length
            if truncated:  # keep the head, end with [SEP]
                ids = ids[:self.pipe.max_length - 1] + [self.pipe.tokenizer.sep_token_id]
                types = types[:self.pipe.max_length]
            features.append(Feature({"input_ids": ids, "token_type_ids": types}, i))
            info.append({"truncated": truncated, "tokens": len(ids)})
        return Prepared(texts, features, info)

    def forward(self, batch: dict[str, torch.Tensor], **options: Any) -> dict[str, torch.Tensor]:
        if self.pipe.engine is not None:  # the pooled graph: cls, mean (and pooler) computed inside it
            return self.pipe.engine.run(batch)
        backbone = getattr(self.pipe.model, "base_model", self.pipe.model)
        out = backbone(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        hidden = out.last_hidden_state.float()  # (B, T, H)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        vectors = {"cls": hidden[:, 0], "mean": (hidden * mask).sum(1) / mask.sum(1),
                   "max": hidden.masked_fill(mask == 0, float("-inf")).amax(1)}
        if out.pooled_output is not None:
            vectors["pooler"] = out.pooled_output
        return vectors

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], *, pooling: str | None = None,
               normalize: bool | None = None, **options: Any) -> list[Any]:
        pooling = pooling or self.pipe.pooling
        normalize = self.pipe.normalize if normalize is None else normalize
        results = []
        for output, info in zip(outputs, prepared.info, strict=True):
            if pooling not in output:
                raise ValueError("this model has no pooler; use pooling 'mean' or 'cls'" if pooling == "pooler" else
                                 f"pooling {pooling} is not in the {self.pipe.engine_name} engine's graph; use the torch engine")
            vector = output[pooling].astype(np.float64)
            if normalize:
                vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
            results.append({"embedding": vector.tolist(), "pooling": pooling, **info})
        return results

    def public(self, result: Any) -> Any:
        return {"embedding": result["embedding"]}


class _MultipleChoice(Runner):
    """SWAG's four endings: each `[CLS] context [SEP] start ending [SEP]`, a softmax over their scores."""

    def prepare(self, inputs: list[Any]) -> Prepared:
        choices = self.spec.num_choices  # type: ignore[attr-defined]
        examples = []
        for i, item in enumerate(inputs):
            if not isinstance(item, dict) or not isinstance(item.get("endings"), list | tuple):
                raise InputError(i, "bad_input", "a multiple-choice input is {'context': ..., 'start': ... "
                                                 "(optional), 'endings': [four texts]}")
            endings = [_text(e, i, f"ending{k}") for k, e in enumerate(item["endings"])]
            if len(endings) != choices:
                raise InputError(i, "bad_input", f"{len(endings)} endings; the model chooses among {choices}",
                                 "endings")
            examples.append(self.spec.inference_example(i, {"context": _text(item.get("context"), i, "context"),
                                                             "start": item.get("start") or "", "endings": endings}))
        return Prepared(examples, self.spec.featurize(examples, self.pipe.tokenizer, self.pipe.max_length))

    def finish(self, prepared: Prepared, outputs: list[dict[str, np.ndarray]], **options: Any) -> list[Any]:
        choices = self.spec.postprocess(prepared.examples, prepared.features, outputs)
        results = []
        for example, choice, output in zip(prepared.examples, choices, outputs, strict=True):
            probabilities = _softmax(output["logits"])
            results.append({"choice": int(choice), "ending": example.endings[choice],
                            "score": float(probabilities[choice]), "scores": probabilities.tolist()})
        return results

    def public(self, result: Any) -> Any:
        return {k: result[k] for k in ("choice", "ending", "score")}


RUNNERS: dict[str, type[Runner]] = {
    "text-classification": _Classification, "token-classification": _TokenClassification,
    "question-answering": _QuestionAnswering, "fill-mask": _FillMask, "embeddings": _Embeddings,
    "multiple-choice": _MultipleChoice,
}


def output_row(task: str, result: Any, *, all_scores: bool = False) -> dict[str, Any]:
    """The row `predict_file` writes for one result (lists are JSON text in a CSV file)."""
    if task == "text-classification":
        keys = ("label", "labels", "score", "value") + (("scores",) if all_scores else ())
        return {k: result[k] for k in keys if k in result}
    if task == "token-classification":
        if "tags" in result:  # words given one by one: a tag and a score for each, as `predict tag --data` writes
            return {"tags": result["tags"], "scores": result["scores"], "entities": result["entities"]}
        return {"entities": result["entities"]}
    if task == "question-answering":
        return {k: result[k] for k in ("answer", "score", "start", "end", "no_answer")}
    if task == "fill-mask":
        return {"predictions": [mask["predictions"] for mask in result]}
    if task == "multiple-choice":
        return {k: result[k] for k in ("choice", "score")}
    return {"embedding": result["embedding"]}


def count_truncated(results: Sequence[Any]) -> int:
    """How many results say their input was cut to max_length."""
    return sum(1 for r in results if isinstance(r, dict) and r.get("truncated"))
