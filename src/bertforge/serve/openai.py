"""OpenAI's API over one served model: POST /v1/embeddings, GET /v1/models and /v1/models/{id}.

An OpenAI client pointed at `bertforge serve` (base_url .../v1) works unchanged: one string or up to
2,048 texts or token-id lists, `dimensions` (the first N numbers back at unit length, as Matryoshka
models expect), `encoding_format` float or base64, `usage` counted with the model's tokenizer. Errors
under /v1 are OpenAI's `{"error": {"message", "type", "param", "code"}}`, so its client raises its own
exceptions (BadRequestError, NotFoundError, ...). The vectors are /embed's: the model's own pooling
and normalisation, run through the same batcher.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from bertforge.pipeline import InputError, Prepared
from bertforge.serve.schemas import (
    ApiError,
    EmbedResult,
    OpenAIEmbeddingsRequest,
    OpenAIEmbeddingsResult,
    OpenAIErrorBody,
    OpenAIModel,
    OpenAIModelList,
)
from bertforge.tasks.base import Feature


def prepare_inputs(service: Any, req: OpenAIEmbeddingsRequest) -> list[Prepared]:
    """Each input of a /v1/embeddings request as an /embed item, with the model's own pooling: texts
    through the embeddings pipeline, token ids framed by the model's specials. Input longer than the
    model reads (/embed's max_length) is refused, as OpenAI refuses it, unless the request says `truncate`."""
    pipe = service.pipelines["embed"]
    texts = req.texts()
    try:
        prepared = pipe.prepare(texts) if texts is not None else _prepare_token_ids(service, req.token_ids())
    except InputError as exc:
        raise ApiError(400, exc.code, f"input: item {exc.index}: {exc.detail}", param="input") from exc
    except ValueError as exc:  # text the tokenizer refuses (a lone surrogate, say)
        raise ApiError(400, "bad_text", f"input: {exc}", param="input") from exc
    if not req.truncate:
        for index, info in enumerate(prepared.info):
            if info["truncated"]:
                length = _length_of(service, texts[index]) if texts is not None else len(prepared.examples[index])
                raise ApiError(400, "context_length_exceeded", f"input: item {index} is {length} tokens (special tokens "
                               f"included); this model reads at most {pipe.max_length}. Shorten it, or send "
                               f'"truncate": true (the openai client\'s extra_body) to embed its first '
                               f"{pipe.max_length} tokens", param="input")
    return [Prepared([example], [feature], [info])
            for example, feature, info in zip(prepared.examples, prepared.features, prepared.info, strict=True)]

def _length_of(service: Any, text: str) -> int:
    """A text's tokens, special tokens included, as the embeddings pipeline counts them."""
    cased = text.lower() if service.pipelines["embed"].lowercase_inputs else text
    return len(service.tokenizer.encode(cased, max_length=10**9))

def _prepare_token_ids(service: Any, inputs: list[list[int]]) -> Prepared:
    """Token ids as the model's tokenizer gives them for a text, without special tokens (a list that
    already starts with [CLS] and ends with [SEP] is taken as it is); cut to /embed's length, keeping [SEP]."""
    frame = service.tokenizer.encode("").input_ids  # the specials around any text: [CLS] [SEP], <s> </s>, ...
    if len(frame) != 2:
        raise ApiError(400, "token_ids_unsupported", f"this model's tokenizer puts {len(frame)} special tokens "
                       "around a text, so token ids cannot be framed as a text would be; send text", param="input")
    vocab, limit = service.config.vocab_size, service.pipelines["embed"].max_length
    features, info = [], []
    for index, ids in enumerate(inputs):
        bad = next((i for i in ids if i >= vocab), None)
        if bad is not None:
            raise ApiError(400, "bad_token_id", f"input: item {index} holds token id {bad}; this model's token ids "
                           f"are 0..{vocab - 1}", param="input")
        framed = list(ids) if len(ids) >= 2 and [ids[0], ids[-1]] == frame else [frame[0], *ids, frame[1]]
        truncated = len(framed) > limit
        if truncated:
            framed = framed[:limit - 1] + [frame[1]]
        features.append(Feature({"input_ids": framed, "token_type_ids": [0] * len(framed)}, index))
        info.append({"truncated": truncated, "tokens": len(framed)})
    return Prepared([list(ids) for ids in inputs], features, info)


def _encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """A vector as OpenAI's API sends it: floats, or base64 of its little-endian float32 bytes."""
    if encoding_format == "float":
        return vector
    import base64

    import numpy as np

    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _embeddings_response(results: list[EmbedResult], req: OpenAIEmbeddingsRequest, model: str) -> JSONResponse:
    """OpenAI's answer: each vector (shortened to `dimensions` and back at unit length) as floats or
    base64, and the tokens read. Sent as it is: checking 2,048 vectors against the response model would
    take longer than running them."""
    data = []
    for index, result in enumerate(results):
        vector = result.embedding if req.dimensions is None else _shortened(result.embedding, req.dimensions)
        data.append({"object": "embedding", "embedding": _encode_vector(vector, req.encoding_format), "index": index})
    tokens = sum(r.tokens for r in results)
    return JSONResponse({"object": "list", "data": data, "model": req.model or model,
                         "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def _shortened(vector: list[float], dimensions: int) -> list[float]:
    """The first `dimensions` numbers at unit length: what a Matryoshka-trained model's short vector is."""
    import numpy as np

    head = np.asarray(vector[:dimensions], dtype=np.float64)
    norm = float(np.linalg.norm(head))
    return (head / norm if norm > 0 else head).tolist()


def is_openai_route(path: str) -> bool:
    """The routes under /v1 answer errors in OpenAI's shape; the others in bertforge's own."""
    return path == "/v1" or path.startswith("/v1/")


def error_response(status: int, code: str | None, message: str, param: str | None = None) -> JSONResponse:
    """OpenAI's error body: its client reads it into BadRequestError (400), NotFoundError (404), ..."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "param": param,
                                                               "code": code}})


def add_routes(app: FastAPI, service: Any, gather_windowed: Callable[[str, list[Any]], Awaitable[list[Any]]],
               model_name: str, loaded_at: int) -> None:
    """OpenAI's routes on `app`, answered by `service` (the server's ModelService); `gather_windowed`
    runs a long request's items through the /embed batcher a few batches at a time."""
    openai_errors: dict[int | str, dict[str, Any]] = {
        400: {"model": OpenAIErrorBody, "description": "invalid input: types, limits, too many tokens, ..."},
        404: {"model": OpenAIErrorBody, "description": "no such model or route"},
        413: {"model": OpenAIErrorBody, "description": "request body too large"},
    }

    @app.post("/v1/embeddings", response_model=OpenAIEmbeddingsResult, responses=openai_errors)
    async def openai_embeddings(req: OpenAIEmbeddingsRequest) -> Any:
        """OpenAI's embeddings API over /embed's vectors (the model's own pooling and normalisation), so an
        OpenAI client pointed at this server (base_url .../v1) works unchanged: up to 2,048 texts or
        token-id lists, `dimensions`, `encoding_format` float or base64; errors in OpenAI's shape."""
        if req.dimensions is not None and req.dimensions > service.embedding_dim:
            raise ApiError(400, "bad_dimensions", f"dimensions {req.dimensions} is more than this model's "
                           f"{service.embedding_dim}", param="dimensions")
        # tokenising 2,048 texts takes a while: off the event loop, which keeps serving meanwhile
        items = await asyncio.to_thread(service.prepare_openai, req)
        return _embeddings_response(await gather_windowed("embed", items), req, model_name)

    def model_card() -> OpenAIModel:
        return OpenAIModel(id=model_name, created=loaded_at)

    @app.get("/v1/models", response_model=OpenAIModelList, responses=openai_errors)
    async def openai_models() -> Any:
        """OpenAI's model list: the one model this server runs."""
        return OpenAIModelList(data=[model_card()])

    @app.get("/v1/models/{model_id:path}", response_model=OpenAIModel, responses=openai_errors)
    async def openai_model(model_id: str) -> Any:
        """The model, if `model_id` is this server's; else 404 in OpenAI's shape."""
        if model_id != model_name:
            raise ApiError(404, "model_not_found", f"the model {model_id!r} is not on this server; it serves "
                           f"{model_name!r}", param="model")
        return model_card()
