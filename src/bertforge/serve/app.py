"""The HTTP API and demo page for one BERT checkpoint: `create_app(model_dir)` returns a FastAPI app.

    POST /fill-mask  /classify  /qa  /ner  /embed  /attention  /v1/embeddings (OpenAI's)
    GET /health  /  /docs  /openapi.json  /v1/models  /v1/models/{id} (OpenAI's)

Each task endpoint takes one input (`text`, or `question` + `context`) or a list of them (`texts`,
or `questions` + `contexts`, at most `MAX_ITEMS`), and answers with one result or `{"results": [...]}`.
Every list item becomes one queued item of that task's `DynamicBatcher`, so items of one request and
of concurrent requests share model calls.

Three layers, in order of a request:
1. pydantic request models (`bertforge.serve.schemas`: strict types, no unknown fields, character and list limits) reject
   malformed input with 422 before anything else runs;
2. `ModelService.prepare_*` runs the task's inference pipeline (`bertforge.pipeline`) up to its
   model rows in the event loop and raises `ApiError` (a 4xx with a code and a message) for input
   that is well-formed but unusable: no [MASK], too many tokens, a task whose head this model lacks;
3. `ModelService.run_*` runs the rows of a batch of items through the model on the service's single
   model thread and finishes each item with the pipeline's post-processing (the same as `bertforge
   predict`: the model's label names, SQuAD's answer search and tuned null threshold, entity grouping,
   top-k, pooling).

Every error is JSON: `{"error": "<code>", "message": "<what to fix>"}` (+ `details` for 422); under /v1
(OpenAI's API, `bertforge.serve.openai`: /v1/embeddings, /v1/models) it is OpenAI's `{"error": {"message", "type", "param", "code"}}`,
with 400 where the other routes answer 422, so that OpenAI's clients raise their own exceptions.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertforge.engine import EngineChoice
from bertforge.finetuned import TaskRecord, load_for_inference
from bertforge.model.base import label_names_of
from bertforge.pipeline import InputError, Pipeline, Prepared, task_for, use_engine
from bertforge.precision import cpu_description, model_precision
from bertforge.serve import openai as openai_api
from bertforge.serve.batcher import DynamicBatcher
from bertforge.serve.schemas import (
    BODY_TIMEOUT_S,
    MAX_ATTENTION_TOKENS,
    MAX_BODY_BYTES,
    MAX_CONTEXT_CHARS,
    MAX_ITEMS,
    MAX_MASKS,
    MAX_OPENAI_ITEMS,
    MAX_TEXT_CHARS,
    MAX_TOP_K,
    REQUEST_MODELS,
    TASK_HEADS,
    TASK_MODELS,
    TASKS,
    ApiError,
    AttentionRequest,
    AttentionResult,
    Batch,
    ClassifyRequest,
    ClassifyResult,
    EmbedRequest,
    EmbedResult,
    Entity,
    ErrorBody,
    FillMaskRequest,
    FillMaskResult,
    LabelScore,
    MaskPrediction,
    MaskResult,
    NerRequest,
    NerResult,
    OpenAIEmbeddingsRequest,
    QARequest,
    QAResult,
    RowError,
    TokenLabel,
)

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# The model service: prepare (event loop, cheap, raises ApiError) and run (model thread, batched)
# --------------------------------------------------------------------------------------------------
@dataclass
class _Encoded:
    """One row for the model."""

    input_ids: list[int]
    token_type_ids: list[int]


@dataclass
class _TextItem:  # attention
    text: str
    row: _Encoded
    offsets: list[tuple[int, int]]
    tokens: list[str]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    truncated: bool
    options: dict[str, Any]


@dataclass
class _Item:
    """One input of a pipeline task: its examples and model rows, and this request's options."""

    prepared: Prepared
    options: dict[str, Any]

    @property
    def rows(self) -> int:
        return len(self.prepared.features)


# the endpoint -> the pipeline task behind it
PIPELINE_TASKS = {"fill-mask": "fill-mask", "classify": "text-classification", "qa": "question-answering",
                  "ner": "token-classification", "embed": "embeddings"}


class ModelService:
    """One checkpoint, its tokenizer, and a batcher per task, sharing one model thread.

    The task endpoints run the inference pipeline (`bertforge.pipeline`) of their task, with the
    settings saved in the model's task.json (`task_info`): the same features and post-processing as
    `bertforge predict` and Python's `pipeline()`, the model's own label names, SQuAD's windows and the
    tuned null threshold.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 16,
        max_wait_ms: float = 5.0,
        device: str = "cpu",
        task_info: dict[str, Any] | None = None,
        long_text: str = "truncate",
    ) -> None:
        self._model = model.to(device).eval()
        self.precision = model_precision(model)  # fp32, bf16 or int8, read from the weights (see from_dir)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.kind = type(model).__name__
        self.backbone = model.base_model  # the BertModel inside
        self.config = model.config
        self.max_tokens = min(self.config.max_tokens, tokenizer.model_max_length)
        self.job = getattr(model, "job", None)
        self.tasks = [t for t in TASKS if t not in TASK_MODELS or self.job in TASK_MODELS[t]]
        if not hasattr(model, "masked_lm_logits") and "fill-mask" in self.tasks:  # a discriminator, not an MLM
            self.tasks.remove("fill-mask")
        self.long_text = long_text  # /classify: truncate, or read long texts in windows (bertforge.pipeline)
        self.pipelines = {task: self._pipeline(task, task_info or {}, max_batch_size) for task in self.tasks
                          if task in PIPELINE_TASKS}
        if not getattr(model, "supports_attention_maps", False):  # fused attention only: no probabilities
            self.tasks.remove("attention")
        self.labels = label_names_of(model)
        self.model_calls = 0
        # the engine the task endpoints run on (attention maps always come from the torch model)
        self.engine_choice = EngineChoice("torch", self.precision, "asked for")
        # one thread: the model runs one batch at a time; torch parallelises inside the call
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-model")
        runners = {"fill-mask": self.run_fill_mask, "classify": self.run_classify, "qa": self.run_qa,
                   "ner": self.run_ner, "embed": self.run_embed, "attention": self.run_attention}
        self.batchers: dict[str, DynamicBatcher[Any, Any]] = {
            task: DynamicBatcher(
                runners[task], max_batch_size=max_batch_size, max_wait_ms=max_wait_ms, executor=self.executor,
                weight=(lambda item: item.rows) if task == "qa" else None, name=task,
            )
            for task in self.tasks
        }

    def _pipeline(self, task: str, info: dict[str, Any], batch_size: int) -> Pipeline:
        """The pipeline of one endpoint: the model's fine-tuning task and settings where task.json has them."""
        kind = PIPELINE_TASKS[task]
        spec = task_for(kind, TaskRecord.from_dict(info) if info else None)
        max_length = info.get("max_length") if spec is not None else None
        extra: dict[str, Any] = {"long_text": self.long_text} if kind == "text-classification" else {}
        if kind == "embeddings":
            extra["normalize"] = True  # /embed's default (a sentence-transformers directory says its own)
        return Pipeline(self._model, self.tokenizer, kind, spec=spec, max_length=max_length, batch_size=batch_size,
                        device=str(self.device), **extra)

    def follow_sentence_config(self, model_dir: str | Path) -> None:
        """/embed's defaults from a sentence-transformers directory's modules.json (pooling, Normalize,
        max_seq_length, do_lower_case), so that it answers `SentenceTransformer.encode`'s vectors; a
        modules.json it cannot follow leaves the defaults, as a request's own pooling would."""
        from bertforge.sentence_config import SentenceConfigError, read_sentence_embedding

        pipe = self.pipelines.get("embed")
        try:
            sentence = read_sentence_embedding(model_dir) if pipe is not None else None
        except SentenceConfigError as exc:
            log.warning("/embed keeps its defaults: %s", exc)
            return
        if pipe is None or sentence is None:
            return
        pipe.pooling, pipe.normalize, pipe.lowercase_inputs = sentence.pooling, sentence.normalize, sentence.lowercase
        pipe.max_length = min(sentence.max_length or pipe.max_length, pipe.max_length)
        pipe.embedding_source = sentence.describe()

    @property
    def model(self) -> Any:
        return self._model

    @model.setter
    def model(self, model: Any) -> None:  # a stand-in model (tests) goes to every pipeline
        self._model = model
        for pipe in self.pipelines.values():
            pipe.model = model

    @classmethod
    def from_dir(cls, model_dir: str | Path, *, precision: str = "fp32", engine: str = "torch",
                 engine_calibrate: bool = False, **kwargs: Any) -> "ModelService":
        """The service for a checkpoint directory, its weights at `precision` (`bertforge.precision`),
        its task endpoints run by `engine` (torch, onnxruntime or auto: `bertforge.engine`)."""
        from bertforge.engine import ENGINES, EngineError

        if engine not in ENGINES:
            raise EngineError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
        # an engine other than torch may export the model: its fp32 weights first, the precision after
        loaded = load_for_inference(model_dir, precision if engine == "torch" else "fp32")
        record = loaded.record.to_dict() if loaded.record is not None else {}
        service = cls(loaded.model, loaded.tokenizer, task_info=record, **kwargs)
        service.follow_sentence_config(model_dir)
        if engine != "torch":
            service.use_engine(engine, precision, model_dir=model_dir, calibrate=engine_calibrate)
        return service

    def use_engine(self, engine: str, precision: str, *, model_dir: str | Path | None = None,
                   calibrate: bool = False) -> EngineChoice:
        """Choose the engine once for the service (from its main endpoint: the head's, else /embed) and
        give every pipeline its graph (`bertforge.pipeline.use_engine`); dynamic batches make the
        shape class "batch" unless batching is off."""
        from bertforge.engine import OnnxEngine, graph_for_task

        pipes = list(self.pipelines.values())
        main = next((p for p in pipes if graph_for_task(p.task) == "head"), pipes[0])
        choice = use_engine(main, engine, precision, model_dir=model_dir, device=str(self.device),
                            calibrate=calibrate)
        for pipe in pipes:
            if pipe is main:
                continue
            pipe.engine_choice, pipe.precision = choice, main.precision
            if main.engine is not None:
                pipe.engine = OnnxEngine(self._model, graph_for_task(pipe.task), choice.precision, model_dir=model_dir,
                                         excluded_ids=sorted(set(self.tokenizer.all_special_ids))).prepare()
        self.engine_choice, self.precision = choice, main.precision
        return choice

    async def close(self) -> None:
        for batcher in self.batchers.values():
            await batcher.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _class_names(self, jobs: tuple[str, ...]) -> list[str]:
        """The classes of this model's family that do these jobs, for messages."""
        from bertforge.model.registry import class_names

        return class_names(self.config.model_type, jobs)

    def require(self, task: str) -> DynamicBatcher[Any, Any]:
        if task not in self.batchers and task not in TASK_MODELS:  # attention, refused by a fused-attention model
            raise ApiError(400, "unsupported_task", f"this server's {self.kind} gives no attention maps (fused "
                           f"attention only). This model serves: {', '.join('/' + t for t in self.tasks)}")
        if task not in self.batchers:
            raise ApiError(
                400, "unsupported_task",
                f"this server's model is a {self.kind}, which has no {TASK_HEADS[task]} head; /{task} needs "
                f"{' or '.join(self._class_names(TASK_MODELS[task]))}. This model serves: {', '.join('/' + t for t in self.tasks)}",
            )
        return self.batchers[task]

    # ---------------------------------------------------------------------------- the pipeline tasks

    def prepare(self, task: str, value: Any, **options: Any) -> _Item:
        """One input of an endpoint as the pipeline's examples and rows; unusable input is a 422."""
        try:
            return _Item(self.pipelines[task].prepare([value]), options)
        except InputError as exc:
            raise ApiError(422, exc.code, f"{exc.field or 'input'}: {exc.detail}") from exc
        except ValueError as exc:  # text the tokenizer refuses (a lone surrogate, say)
            raise ApiError(422, "bad_text", str(exc)) from exc

    def _run(self, task: str, items: list[_Item], **forward: Any) -> list[Any]:
        """Every item's rows in one pipeline run (length-sorted batches), then each item's results."""
        self.model_calls += 1
        pipe = self.pipelines[task]
        outputs = pipe.run([f for it in items for f in it.prepared.features], **forward)
        results, first = [], 0
        for it in items:
            results.append(pipe.finish(it.prepared, outputs[first:first + it.rows], **it.options)[0])
            first += it.rows
        return results

    def prepare_fill_mask(self, text: str, top_k: int) -> _Item:
        item = self.prepare("fill-mask", text, top_k=min(top_k, self.config.vocab_size))
        masks = len(item.prepared.info[0]["masks"])
        if masks > MAX_MASKS:
            raise ApiError(422, "too_many_masks", f"the text has {masks} {self.tokenizer.mask_token} tokens; "
                           f"at most {MAX_MASKS}")
        return item

    def run_fill_mask(self, items: list[_Item]) -> list[FillMaskResult]:
        found = self._run("fill-mask", items, top_k=max(it.options["top_k"] for it in items))
        return [FillMaskResult(masks=[MaskResult(position=m["position"], start=m["start"], end=m["end"],
                                                 predictions=[MaskPrediction(**p) for p in m["predictions"]])
                                      for m in masks]) for masks in found]

    def prepare_classify(self, text: str, pair: str | None = None) -> _Item:
        return self.prepare("classify", text if pair is None else (text, pair))

    def run_classify(self, items: list[_Item]) -> list[ClassifyResult]:
        results = []
        for r in self._run("classify", items):
            if "value" in r:  # regression
                results.append(ClassifyResult(label=None, score=None, value=r["value"], scores=[],
                                              truncated=r["truncated"]))
            elif "labels" in r:  # multi-label
                results.append(ClassifyResult(label=None, score=None, labels=r["labels"], truncated=r["truncated"],
                                              scores=[LabelScore(**s) for s in r["scores"]]))
            else:
                results.append(ClassifyResult(label=r["label"], score=r["score"], truncated=r["truncated"],
                                              scores=[LabelScore(**s) for s in r["scores"]]))
        return results

    def prepare_ner(self, text: str) -> _Item:
        return self.prepare("ner", text)

    def run_ner(self, items: list[_Item]) -> list[NerResult]:
        return [NerResult(entities=[Entity(**e) for e in r["entities"]],
                          tokens=[TokenLabel(token=w["word"], label=w["label"], score=w["score"], start=w["start"],
                                             end=w["end"]) for w in r["words"]],
                          truncated=False)  # long texts are read in windows of whole words
                for r in self._run("ner", items)]

    def prepare_embed(self, text: str, pooling: str | None = None, normalize: bool | None = None) -> _Item:
        return self.prepare("embed", text, pooling=pooling, normalize=normalize)

    def run_embed(self, items: list[_Item]) -> list[EmbedResult]:
        return [EmbedResult(embedding=r["embedding"], dim=len(r["embedding"]), pooling=r["pooling"],
                            tokens=r["tokens"], truncated=r["truncated"]) for r in self._run("embed", items)]

    @property
    def embedding_dim(self) -> int:
        """How many numbers /embed's vectors have (every pooling gives the encoder's width)."""
        return int(self.config.hidden_size)

    def prepare_openai(self, req: OpenAIEmbeddingsRequest) -> list[_Item]:
        """Each input of a /v1/embeddings request as one /embed item (`bertforge.serve.openai`)."""
        return [_Item(prepared, {}) for prepared in openai_api.prepare_inputs(self, req)]

    def prepare_qa(self, question: str, context: str, allow_no_answer: bool | None,
                   max_answer_tokens: int) -> _Item:
        return self.prepare("qa", {"question": question, "context": context}, allow_no_answer=allow_no_answer,
                            max_answer_tokens=max_answer_tokens)

    def run_qa(self, items: list[_Item]) -> list[QAResult]:
        return [QAResult(**r) for r in self._run("qa", items)]

    # ---------------------------------------------------------------------------- attention

    def _encode(self, text: str, pair: str | None = None, *, limit: int | None = None,
                truncate: bool = True, what: str = "text") -> tuple[Any, bool]:
        """Tokenise; over the limit, either truncate (and say so) or raise a 422 that gives the numbers."""
        limit = limit or self.max_tokens
        try:
            encoding = self.tokenizer.encode(text, pair, max_length=10**9)  # no limit yet: measure first
        except ValueError as exc:  # text the tokenizer refuses (a lone surrogate, say)
            raise ApiError(422, "bad_text", f"{what}: {exc}") from exc
        if len(encoding) <= limit:
            return encoding, False
        if not truncate:
            raise ApiError(422, "too_long", f"{what} is {len(encoding)} tokens (special tokens included); "
                           f"this endpoint takes at most {limit}")
        return self.tokenizer.encode(text, pair, max_length=limit, truncation=True), True

    def prepare_text(self, text: str, pair: str | None = None, *, limit: int | None = None,
                     truncate: bool = True, **options: Any) -> _TextItem:
        """One text (or pair) for the attention map; `options` ride along to the runner."""
        enc, truncated = self._encode(text, pair, limit=limit, truncate=truncate)
        return _TextItem(text, _Encoded(enc.input_ids, enc.token_type_ids), list(enc.offsets), list(enc.tokens),
                         list(enc.word_ids), list(enc.sequence_ids), truncated, options)

    def _tensors(self, rows: Sequence[_Encoded]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-pad rows to the longest: (B, T) input_ids, attention_mask, token_type_ids."""
        length = max(len(r.input_ids) for r in rows)
        pad = self.tokenizer.pad_token_id
        ids = torch.full((len(rows), length), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        types = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row.input_ids)
            ids[i, :n] = torch.tensor(row.input_ids)
            mask[i, :n] = 1
            types[i, :n] = torch.tensor(row.token_type_ids)
        return ids.to(self.device), mask.to(self.device), types.to(self.device)

    @torch.inference_mode()
    def run_attention(self, items: list[_TextItem]) -> list[AttentionResult]:
        self.model_calls += 1
        ids, mask, types = self._tensors([it.row for it in items])
        attentions = self.backbone(ids, mask, types, output_attentions=True).attentions  # L x (B, A, T, T)
        results = []
        for b, it in enumerate(items):
            layer, head, n = it.options["layer"], it.options["head"], len(it.row.input_ids)
            probs = attentions[layer][b, :, :n, :n].float()  # (A, n, n)
            matrix = probs.mean(0) if head is None else probs[head]
            results.append(AttentionResult(
                tokens=it.tokens, layer=layer, head=head, num_layers=len(attentions), num_heads=probs.size(0),
                weights=[[round(x, 5) for x in row] for row in matrix.tolist()],
            ))
        return results


# --------------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------------
class BodyGuard:
    """ASGI middleware that reads each request body itself, bounded in size and in time, before the app
    sees it: at most `max_bytes` (413 as soon as more arrives, with a Content-Length or chunked alike)
    and no wait longer than `timeout_s` for the next part of a body (408), so a client can neither
    make the server hold a large body in memory nor hold a connection open with a half-sent one. The
    app then gets the body as one message."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app, self.max_bytes, self.timeout_s = app, max_bytes, timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        path = scope.get("path", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, "too_large", f"the request body is {int(declared):,} bytes; "
                               f"at most {self.max_bytes:,}", path)
            return
        body, more = bytearray(), True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                await self._refuse(send, 408, "body_timeout", f"the request body stopped arriving for "
                                   f"{self.timeout_s:g} s; send it whole", path)
                return
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(send, 413, "too_large", f"the request body is over {self.max_bytes:,} bytes", path)
                return
        delivered = False

        async def replay() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Any, status: int, code: str, message: str, path: str) -> None:
        response = openai_api.error_response(status, code, message) if openai_api.is_openai_route(path) else _error(status, code, message)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(response.body)).encode())]})
        await send({"type": "http.response.body", "body": response.body})


def _error(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"error": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse(status_code=status, content=body)


def _validation_details(exc: RequestValidationError, accepted: Sequence[str] = (),
                        content_type: str = "") -> list[dict[str, Any]]:
    """One entry per error, saying what was wrong and what is accepted; without the offending input (it
    may be 100k characters) and without pydantic's internals."""
    details = []
    for err in exc.errors():
        kind, loc = str(err.get("type", "")), list(err.get("loc", ()))
        field = ".".join(str(part) for part in loc if part != "body") or "body"
        message = str(err.get("msg", ""))
        if kind == "json_invalid":  # loc is ("body", character offset)
            position = loc[-1] if loc and isinstance(loc[-1], int) else None
            error = (err.get("ctx") or {}).get("error", "not valid JSON")
            field, message = "body", f"not valid JSON ({error}" + (f" at character {position})" if position is not None else ")")
        elif kind == "extra_forbidden":
            message = f"unknown field; this endpoint accepts {', '.join(accepted)}"
        elif field == "body" and "json" not in content_type:
            message = (f"the body must be a JSON object sent with Content-Type: application/json (got "
                       f"{content_type or 'no Content-Type'}); fields: {', '.join(accepted)}")
        details.append({"field": field, "message": message, "type": kind})
    return details


OPENAI_ROUTES = "POST /v1/embeddings, GET /v1/models and GET /v1/models/{model}"

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "this model has no head for the task"},
    408: {"model": ErrorBody, "description": "the request body stopped arriving"},
    413: {"model": ErrorBody, "description": "request body too large"},
    422: {"model": ErrorBody, "description": "invalid input: types, unknown fields, limits, no [MASK], ..."},
}


def create_app(
    model_dir: str | Path | None = None,
    *,
    max_batch_size: int = 16,
    max_wait_ms: float = 5.0,
    device: str = "cpu",
    precision: str = "fp32",
    long_text: str = "truncate",
    service: ModelService | None = None,
    engine: str = "torch",
    engine_calibrate: bool = False,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = BODY_TIMEOUT_S,
    model_name: str | None = None,
) -> FastAPI:
    """The API and demo page for the checkpoint in `model_dir` (any bertforge / Hugging Face BERT dir).

    `max_batch_size` rows share one model call, collected for at most `max_wait_ms` after the first
    arrives; `max_batch_size=1` turns dynamic batching off. `precision` is fp32, bf16, int8 or auto
    (`bertforge.precision`); `engine` is torch, onnxruntime or auto (`bertforge.engine`; /health says which
    ran and why). `long_text="windows"` classifies texts longer than the model's length by
    overlapping windows (`bertforge.pipeline`). `service` replaces `model_dir` when the caller has
    already loaded a model. A request body is read whole before the app sees it, at most
    `max_body_bytes` (413 beyond) with no pause longer than `body_timeout_s` (408). `model_name` is the
    id /v1/models lists (default: the directory's name).

    Example:
        uvicorn.run(create_app("runs/squad/seed-1"), host="127.0.0.1", port=8000)
    """
    if service is None:
        if model_dir is None:
            raise ValueError("create_app needs model_dir (or a ModelService)")
        service = ModelService.from_dir(model_dir, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
                                        device=device, precision=precision, long_text=long_text, engine=engine,
                                        engine_calibrate=engine_calibrate)
    page = resources.files("bertforge.serve").joinpath("static/index.html").read_text(encoding="utf-8")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        await service.close()

    app = FastAPI(
        title="bertforge",
        version="0.1.0",
        summary=f"BERT inference: {service.kind} ({', '.join(service.tasks)})",
        lifespan=lifespan,
        responses=ERRORS,
    )
    app.state.service = service
    if model_name is None:  # what /v1/models lists and /v1/embeddings answers when a request names none
        model_name = Path(model_dir).name if model_dir is not None else service.kind
    loaded_at = int(time.time())

    app.add_middleware(BodyGuard, max_bytes=max_body_bytes, timeout_s=body_timeout_s)

    # OpenAI's clients read a 400 for any request they sent wrong (bertforge's own routes answer 422)
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if openai_api.is_openai_route(request.url.path):
            return openai_api.error_response(400 if exc.status == 422 else exc.status, exc.code, exc.message, exc.param)
        return _error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        model = REQUEST_MODELS.get(request.url.path)
        accepted = list(model.model_fields) if model is not None else []
        details = _validation_details(exc, accepted, request.headers.get("content-type", ""))
        message = "; ".join(f"{d['field']}: {d['message']}" for d in details) or "invalid request"
        if openai_api.is_openai_route(request.url.path):
            param = details[0]["field"] if details and details[0]["field"] != "body" else None
            return openai_api.error_response(400, "invalid_request", message, param)
        return _error(422, "invalid_request", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        if openai_api.is_openai_route(request.url.path):
            return openai_api.error_response(exc.status_code, code, f"{exc.detail}: {request.method} {request.url.path}; under "
                                 f"/v1 this server answers {OPENAI_ROUTES}")
        return _error(exc.status_code, code, str(exc.detail))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:  # a bug, not bad input
        log.exception("%s %s failed", request.method, request.url.path)
        message = f"the server failed on this request ({type(exc).__name__}); see its log"
        if openai_api.is_openai_route(request.url.path):
            return openai_api.error_response(500, "internal_error", message)
        return _error(500, "internal_error", message)

    async def gather(task: str, items: list[Any]) -> list[Any]:
        batcher = service.require(task)
        return list(await asyncio.gather(*(batcher.submit(item) for item in items)))

    async def gather_windowed(task: str, items: list[Any]) -> list[Any]:
        """`gather`, with at most two batches of this request queued at a time: the model always has its
        next batch waiting, and other requests' items queue between this request's batches rather than
        behind all 2,048 of them."""
        batcher = service.require(task)
        window = asyncio.Semaphore(2 * batcher.max_batch_size)

        async def one(item: Any) -> Any:
            async with window:
                return await batcher.submit(item)

        return list(await asyncio.gather(*(one(item) for item in items)))

    def answer(results: list[Any], batched: bool) -> Any:
        return {"results": results} if batched else results[0]

    async def answer_each(task: str, req: Any, makers: list[Callable[[], Any]]) -> Any:
        """Every input prepared and run; in a batch with on_error "record", an input that cannot be
        answered becomes a RowError in its place and the others are answered (a single input, or
        on_error "stop", refuses the request instead)."""
        prepared: dict[int, Any] = {}
        failed: dict[int, RowError] = {}
        for index, make in enumerate(makers):
            try:
                prepared[index] = make()
            except ApiError as exc:
                if not req.batched or req.on_error == "stop":
                    raise
                failed[index] = RowError(error=exc.code, message=f"item {index}: {exc.message}")
        answered = dict(zip(prepared, await gather(task, list(prepared.values())), strict=True)) if prepared else {}
        return answer([answered[i] if i in answered else failed[i] for i in range(len(makers))], req.batched)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, the model and its tasks, the limits, and batching counters."""
        config = service.config
        return {
            "status": "ok",
            "model": service.kind,
            "family": config.model_type,  # config.json's model_type: bert, roberta, modernbert, ...
            "precision": service.precision,
            "engine": service.engine_choice.as_dict(),  # which engine runs the task endpoints, and why
            **cpu_description(),
            "tasks": service.tasks,
            "labels": service.labels,
            "num_layers": config.num_hidden_layers,
            "num_heads": config.num_attention_heads,
            "max_tokens": service.max_tokens,  # the model's own limit
            # what each endpoint reads: the fine-tuned length from task.json, modules.json's for /embed
            "max_length": {task: pipe.max_length for task, pipe in service.pipelines.items()},
            "mask_token": service.tokenizer.mask_token,
            "limits": {"max_text_chars": MAX_TEXT_CHARS, "max_context_chars": MAX_CONTEXT_CHARS,
                       "max_items": MAX_ITEMS, "max_openai_items": MAX_OPENAI_ITEMS, "max_masks": MAX_MASKS,
                       "max_top_k": MAX_TOP_K, "max_attention_tokens": MAX_ATTENTION_TOKENS, "max_body_bytes": max_body_bytes,
                       "body_timeout_s": body_timeout_s},
            "batching": {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms,
                         "model_calls": service.model_calls,
                         "tasks": {t: b.stats.as_dict() for t, b in service.batchers.items()}},
        }

    @app.post("/fill-mask", response_model=FillMaskResult | Batch[FillMaskResult])
    async def fill_mask(req: FillMaskRequest) -> Any:
        """Top-k tokens for each [MASK] of the text (special tokens excluded), with probabilities."""
        service.require("fill-mask")
        return await answer_each("fill-mask", req, [lambda t=text: service.prepare_fill_mask(t, req.top_k)
                                                    for text in req.inputs()])

    @app.post("/classify", response_model=ClassifyResult | Batch[ClassifyResult])
    async def classify(req: ClassifyRequest) -> Any:
        """Label probabilities (or the regression value) for a text or text pair; long input is truncated."""
        service.require("classify")
        return await answer_each("classify", req, [lambda t=t, p=p: service.prepare_classify(t, p)
                                                   for t, p in zip(req.inputs(), req.pairs(), strict=True)])

    @app.post("/qa", response_model=QAResult | Batch[QAResult])
    async def qa(req: QARequest) -> Any:
        """The answer span of the passage with its score and characters; or no answer (SQuAD 2.0 models)."""
        service.require("qa")
        return await answer_each("qa", req, [
            lambda q=q, c=c: service.prepare_qa(q, c, req.allow_no_answer, req.max_answer_tokens)
            for q, c in req.inputs()])

    @app.post("/ner", response_model=NerResult | Batch[NerResult])
    async def ner(req: NerRequest) -> Any:
        """Entities (label, text, characters, score) and every token's label; long input is truncated."""
        service.require("ner")
        return await answer_each("ner", req, [lambda t=text: service.prepare_ner(t) for text in req.inputs()])

    @app.post("/embed", response_model=EmbedResult | Batch[EmbedResult])
    async def embed(req: EmbedRequest) -> Any:
        """A sentence vector from the encoder; works with every model. Long input is truncated."""
        if req.pooling == "pooler" and service.backbone.pooler is None:
            raise ApiError(422, "no_pooler", f"this {service.kind} has no pooler; use pooling 'mean' or 'cls'")
        return await answer_each("embed", req, [lambda t=text: service.prepare_embed(t, req.pooling, req.normalize)
                                                for text in req.inputs()])

    openai_api.add_routes(app, service, gather_windowed, model_name, loaded_at)

    @app.post("/attention", response_model=AttentionResult)
    async def attention(req: AttentionRequest) -> Any:
        """The attention probabilities of one layer and head (or the mean of its heads) as a T x T matrix."""
        config = service.config
        if req.layer >= config.num_hidden_layers:
            raise ApiError(422, "bad_layer", f"layer {req.layer} does not exist; this model has layers "
                           f"0..{config.num_hidden_layers - 1}")
        if req.head is not None and req.head >= config.num_attention_heads:
            raise ApiError(422, "bad_head", f"head {req.head} does not exist; this model has heads "
                           f"0..{config.num_attention_heads - 1}")
        item = service.prepare_text(req.text, req.text_pair, limit=MAX_ATTENTION_TOKENS, truncate=False,
                                  layer=req.layer, head=req.head)
        return (await gather("attention", [item]))[0]

    return app
