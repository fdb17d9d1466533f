"""What the HTTP API accepts and answers: its limits, the pydantic request models (strict types, no
unknown fields, character and list limits: malformed input is a 422 before anything runs), the
response models the OpenAPI schema shows, and `ApiError`, the 4xx a service raises for input that is
well-formed but unusable."""

from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

# --------------------------------------------------------------------------------------------------
# Limits. Characters are counted before tokenisation (a cheap bound on work per request); token
# limits come from the model (config.max_tokens) and are checked after tokenisation.
# --------------------------------------------------------------------------------------------------
MAX_TEXT_CHARS = 5_000  # one text (fill-mask, classify, ner, embed, attention, a QA question)
MAX_CONTEXT_CHARS = 20_000  # one QA passage: long passages are read in overlapping windows
MAX_ITEMS = 32  # inputs in one request
# inputs in one /v1/embeddings request, as OpenAI allows; run at most 2 x max_batch_size at a time, so a
# large request holds little more than its own body and answer, and other requests' items run between its batches
MAX_OPENAI_ITEMS = 2_048
MAX_MASKS = 10  # [MASK] tokens in one fill-mask text
MAX_TOP_K = 50
MAX_ATTENTION_TOKENS = 128  # the attention map is T x T numbers in JSON
MAX_BODY_BYTES = 1_000_000  # refused with 413 as soon as more arrives, whatever the transfer encoding
BODY_TIMEOUT_S = 10.0  # a request whose body stops arriving for this long is answered 408

TASKS = ("fill-mask", "classify", "qa", "ner", "embed", "attention")
# which model jobs have the head each task needs (embed and attention need only the encoder)
TASK_MODELS = {
    "fill-mask": ("masked-lm", "pretraining"),
    "classify": ("sequence-classification",),
    "qa": ("question-answering",),
    "ner": ("token-classification",),
}
TASK_HEADS = {"fill-mask": "masked-LM", "classify": "sequence-classification", "qa": "span (QA)",
              "ner": "token-classification"}


class ApiError(Exception):
    """A request the server understood but cannot serve: becomes `{"error": code, "message": ...}`."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.param = param  # the request field at fault, for OpenAI's error body (/v1)


# --------------------------------------------------------------------------------------------------
# Request and response models
# --------------------------------------------------------------------------------------------------
# an empty text is an input like any other where the task answers it (classification, tagging,
# embeddings, as transformers' pipelines do); fill-mask and QA refuse it as the pipeline does
Text = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
Context = Annotated[str, StringConstraints(min_length=1, max_length=MAX_CONTEXT_CHARS)]
Items = Field(default=None, min_length=1, max_length=MAX_ITEMS)


class _Request(BaseModel):
    # strict: "5" is not an int and 5 is not a str; forbid: a misspelt field is an error, not ignored
    model_config = ConfigDict(extra="forbid", strict=True)


def _one_or_many(single: Any, many: Any, names: tuple[str, str]) -> None:
    if (single is None) == (many is None):
        raise ValueError(f"give either '{names[0]}' (one input) or '{names[1]}' (a list of up to {MAX_ITEMS})")


# a batch (`texts`, `questions`): "record" answers every item, one that cannot be answered by an error
# object in its place; "stop" refuses the whole request for it (a single input is always refused alone)
OnError = Literal["record", "stop"]


class _TextsRequest(_Request):
    text: Text | None = None
    texts: list[Text] | None = Items
    on_error: OnError = "record"

    @model_validator(mode="after")
    def _check_inputs(self) -> "_TextsRequest":
        _one_or_many(self.text, self.texts, ("text", "texts"))
        return self

    def inputs(self) -> list[str]:
        return [self.text] if self.text is not None else list(self.texts or [])

    @property
    def batched(self) -> bool:
        return self.texts is not None


class FillMaskRequest(_TextsRequest):
    """Text with one or more [MASK] tokens; each mask gets the model's top-k tokens."""

    top_k: int = Field(default=5, ge=1, le=MAX_TOP_K)


class ClassifyRequest(_TextsRequest):
    """A sentence, or a sentence pair (`text_pair` / `text_pairs`), for a sequence-classification model."""

    text_pair: Text | None = None
    text_pairs: list[Text] | None = Items

    @model_validator(mode="after")
    def _check_pairs(self) -> "ClassifyRequest":
        if self.text_pair is not None and self.text is None:
            raise ValueError("'text_pair' goes with 'text'; with 'texts' give 'text_pairs'")
        if self.text_pairs is not None and (self.texts is None or len(self.text_pairs) != len(self.texts)):
            raise ValueError("'text_pairs' needs 'texts' of the same length")
        return self

    def pairs(self) -> list[str | None]:
        if self.text_pairs is not None:
            return list(self.text_pairs)
        return [self.text_pair] * len(self.inputs())


class NerRequest(_TextsRequest):
    """Text for a token-classification model; answers entities with character spans."""


class EmbedRequest(_TextsRequest):
    """Text to embed: mean of the final token vectors (default), the [CLS] vector, or the pooler's."""

    pooling: Literal["mean", "cls", "max", "pooler"] | None = None  # default: the model's modules.json, else mean
    normalize: bool | None = None  # default: the model's modules.json, else true


TokenIds = list[Annotated[int, Field(ge=0)]]
OpenAIInput = str | list[str] | TokenIds | list[TokenIds]


def _describe_input(value: Any) -> Any:
    """`input` checked by hand before pydantic sees it, so that a wrong one gets one sentence that says what
    is accepted (a union's errors would list every branch it failed). Messages follow "input: "."""
    accepted = ("give a string, a list of strings, a list of token ids or a list of lists of token ids (at "
                f"most {MAX_OPENAI_ITEMS:,} items; token ids are integers from 0)")
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("invalid_input", f"a {type(value).__name__}; {accepted}")
    if not value:
        raise PydanticCustomError("invalid_input", "an empty list; give at least one text")
    if all(_is_token_id(v) for v in value):  # one input given as token ids: its length is checked in tokens
        return value
    if len(value) > MAX_OPENAI_ITEMS:
        raise PydanticCustomError("too_many_items", f"{len(value):,} items; at most {MAX_OPENAI_ITEMS:,} in one "
                                  "request (send the rest in another)")
    if all(isinstance(v, str) for v in value):
        return value
    for index, item in enumerate(value):
        if not isinstance(item, list) or not all(_is_token_id(v) for v in item):
            raise PydanticCustomError("invalid_input", f"item {index} is a {type(item).__name__}; {accepted}")
        if not item:
            raise PydanticCustomError("invalid_input", f"item {index} is an empty list of token ids")
    return value


def _is_token_id(value: Any) -> bool:
    return type(value) is int and value >= 0  # not a bool (JSON true)


class OpenAIEmbeddingsRequest(_Request):
    """OpenAI's embeddings request: `input` is one text, a list of texts, one list of token ids or a list of
    them (the model's own tokenizer's ids, [CLS] and [SEP] added as for text); `model` is echoed (this
    server runs one model); `dimensions` keeps the first that many numbers of each vector and scales them
    back to unit length (Matryoshka); vectors come as floats or, with `encoding_format` base64, as
    little-endian float32 bytes. Input longer than the model reads is refused, as OpenAI refuses it,
    unless `truncate` (not OpenAI's; send it with the openai client's `extra_body`) asks to cut it."""

    input: Annotated[OpenAIInput, BeforeValidator(_describe_input)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None  # accepted, as OpenAI's clients may send it; not used
    truncate: bool = False

    def texts(self) -> list[str] | None:
        """The texts, or None when the input is token ids."""
        if isinstance(self.input, str):
            return [self.input]
        return self.input if all(isinstance(item, str) for item in self.input) else None  # type: ignore[return-value]

    def token_ids(self) -> list[list[int]]:
        """The inputs given as token ids (one list, or a list of lists)."""
        if self.input and all(isinstance(item, int) for item in self.input):
            return [self.input]  # type: ignore[list-item]
        return list(self.input)  # type: ignore[arg-type]


class QARequest(_Request):
    """A question and a passage (or lists of both); the answer is a span of the passage."""

    question: Text | None = None
    context: Context | None = None
    questions: list[Text] | None = Items
    contexts: list[Context] | None = Items
    # None: the model's own setting (config.json "version_2_with_negative"), else False
    allow_no_answer: bool | None = None
    max_answer_tokens: int = Field(default=30, ge=1, le=128)
    on_error: OnError = "record"

    @model_validator(mode="after")
    def _check_inputs(self) -> "QARequest":
        _one_or_many(self.question, self.questions, ("question", "questions"))
        _one_or_many(self.context, self.contexts, ("context", "contexts"))
        if (self.question is None) != (self.context is None):
            raise ValueError("'question' goes with 'context', 'questions' with 'contexts'")
        if self.questions is not None and len(self.questions) != len(self.contexts or []):
            raise ValueError("'questions' and 'contexts' must have the same length")
        return self

    def inputs(self) -> list[tuple[str, str]]:
        if self.question is not None and self.context is not None:
            return [(self.question, self.context)]
        return list(zip(self.questions or [], self.contexts or [], strict=True))

    @property
    def batched(self) -> bool:
        return self.questions is not None


class AttentionRequest(_Request):
    """One text (or pair); the answer is the attention of one layer and head (or the mean of the heads)."""

    text: Text
    text_pair: Text | None = None
    layer: int = Field(default=0, ge=0)
    head: int | None = Field(default=None, ge=0, description="None: the mean over the layer's heads")


# each endpoint's request model, for messages that list the accepted fields
REQUEST_MODELS: dict[str, type[BaseModel]] = {
    "/fill-mask": FillMaskRequest, "/classify": ClassifyRequest, "/qa": QARequest, "/ner": NerRequest,
    "/embed": EmbedRequest, "/attention": AttentionRequest, "/v1/embeddings": OpenAIEmbeddingsRequest,
}


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


R = TypeVar("R")


class RowError(_Response):
    """An item of a batch that could not be answered, in its place among the results."""

    error: str  # the code a single request would get
    message: str  # which item, and what is wrong with it


class Batch(_Response, Generic[R]):
    results: list[R | RowError]


class MaskPrediction(_Response):
    token: str
    token_id: int
    score: float
    sequence: str  # the input text with this mask filled in


class MaskResult(_Response):
    position: int  # token index of the [MASK] in the encoded sequence
    start: int  # its characters in the text
    end: int
    predictions: list[MaskPrediction]


class FillMaskResult(_Response):
    masks: list[MaskResult]


class LabelScore(_Response):
    label: str
    score: float


class ClassifyResult(_Response):
    label: str | None  # None for a regression head (one output) and a multi-label model
    score: float | None
    value: float | None = None  # the regression output
    labels: list[str] | None = None  # a multi-label model: every label at or above its threshold
    scores: list[LabelScore]
    truncated: bool


class QAResult(_Response):
    answer: str  # "" when no_answer
    score: float  # the span's probability among the n-best spans; with no answer, [CLS]'s among [CLS] and them
    start: int | None  # characters of the passage; None when no_answer
    end: int | None
    no_answer: bool
    # SQuAD v2.0: null score - best span score (logits); no answer when above the model's tuned threshold
    null_odds: float | None = None


class Entity(_Response):
    label: str
    text: str
    start: int
    end: int
    score: float


class TokenLabel(_Response):
    token: str
    label: str
    score: float
    start: int
    end: int


class NerResult(_Response):
    entities: list[Entity]
    tokens: list[TokenLabel]
    truncated: bool


class EmbedResult(_Response):
    embedding: list[float]
    dim: int
    pooling: str
    tokens: int
    truncated: bool


class OpenAIEmbedding(_Response):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class OpenAIEmbeddingsResult(_Response):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: dict[str, int]  # prompt_tokens and total_tokens, special tokens included


class AttentionResult(_Response):
    tokens: list[str]
    layer: int
    head: int | None
    num_layers: int
    num_heads: int
    weights: list[list[float]]  # (T, T): row = query token, column = key token


class ErrorBody(_Response):
    error: str
    message: str
    details: list[dict[str, Any]] | None = None


class OpenAIErrorDetail(_Response):
    message: str
    type: str  # invalid_request_error (4xx) or server_error (5xx), as OpenAI's
    param: str | None  # the request field at fault
    code: str | None  # the short name /embed's errors carry too (too_long, not_found, ...)


class OpenAIErrorBody(_Response):
    """Every error of a /v1 route, in OpenAI's shape, so that its client raises BadRequestError & co."""

    error: OpenAIErrorDetail


class OpenAIModel(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int  # when the server loaded it (Unix seconds)
    owned_by: str = "bertforge"


class OpenAIModelList(_Response):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]



__all__ = ["REQUEST_MODELS", "ApiError", "AttentionRequest", "AttentionResult", "BODY_TIMEOUT_S", "Batch", "ClassifyRequest", "ClassifyResult", "EmbedRequest", "EmbedResult", "Entity", "ErrorBody", "FillMaskRequest", "FillMaskResult", "LabelScore", "MAX_ATTENTION_TOKENS", "MAX_BODY_BYTES", "MAX_CONTEXT_CHARS", "MAX_ITEMS", "MAX_MASKS", "MAX_OPENAI_ITEMS", "MAX_TEXT_CHARS", "MAX_TOP_K", "MaskPrediction", "MaskResult", "NerRequest", "NerResult", "OpenAIEmbedding", "OpenAIEmbeddingsRequest", "OpenAIEmbeddingsResult", "OpenAIErrorBody", "OpenAIErrorDetail", "OpenAIModel", "OpenAIModelList", "QARequest", "QAResult", "TASKS", "TASK_HEADS", "TASK_MODELS", "TokenLabel"]
