"""The HTTP API: every endpoint, bad input -> 4xx JSON with a message, model-type checks, dynamic batching."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
import httpx  # noqa: E402
import torch  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from bertforge.model import (  # noqa: E402
    BertConfig,  # noqa: E402
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    SpanOutput,
    set_labels,
)
from bertforge.pipeline import group_entities  # noqa: E402
from bertforge.serve.app import MAX_ITEMS, create_app  # noqa: E402
from bertforge.serve.batcher import DynamicBatcher  # noqa: E402
from bertforge.tokenizer import BertTokenizer  # noqa: E402

CORPUS = [
    "the cat sat on the mat and the dog sat on the rug .",
    "jacob devlin and ming wei chang wrote bert at google in mountain view .",
    "bert large has 24 layers , 1024 hidden units and 340m parameters .",
    "a gripping , beautifully acted film with a terrible ending .",
    "paris is the capital of france and berlin is the capital of germany .",
]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 20) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=300, min_frequency=1, show_progress=False)
    torch.manual_seed(0)

    def config(labels: list[str] | None = None) -> BertConfig:
        cfg = BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size, max_position_embeddings=128)
        return set_labels(cfg, labels) if labels else cfg

    built = {
        "mlm": BertForMaskedLM(config()),
        "qa": BertForQuestionAnswering(config()),
        "cls": BertForSequenceClassification(config(["negative", "positive"])),
        "ner": BertForTokenClassification(config(NER_LABELS)),
        "bare": BertModel(config()),
    }
    for name, model in built.items():
        model.save_pretrained(root / name, tokenizer=tokenizer)
    return {name: root / name for name in built}


@pytest.fixture(scope="module")
def mlm(models: dict[str, Path]):
    with TestClient(create_app(models["mlm"])) as client:
        yield client


def _assert_error(response: httpx.Response, status: int | tuple[int, ...] = 422) -> dict:
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, response.text
    body = response.json()
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["message"], str) and len(body["message"]) > 5
    assert len(response.text) < 5_000  # the offending input is not echoed back
    return body


# ------------------------------------------------------------------------------------------ basics


def test_health_openapi_and_page(mlm: TestClient) -> None:
    health = mlm.get("/health").json()
    assert health["status"] == "ok"
    assert health["model"] == "BertForMaskedLM"
    assert health["tasks"] == ["fill-mask", "embed", "attention"]
    assert health["num_layers"] == 2 and health["num_heads"] == 2
    paths = mlm.get("/openapi.json").json()["paths"]
    for path in ("/fill-mask", "/classify", "/qa", "/ner", "/embed", "/attention", "/health"):
        assert path in paths
    page = mlm.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for tab in ("tab-fill-mask", "tab-qa", "tab-classify", "tab-ner", "tab-attention"):
        assert f'id="{tab}"' in page.text
    _assert_error(mlm.get("/nowhere"), 404)
    _assert_error(mlm.get("/fill-mask"), 405)


def test_fill_mask(mlm: TestClient) -> None:
    text = "the cat [MASK] on the mat ."
    result = mlm.post("/fill-mask", json={"text": text, "top_k": 3}).json()
    (mask,) = result["masks"]
    assert text[mask["start"]:mask["end"]] == "[MASK]"
    scores = [p["score"] for p in mask["predictions"]]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1 + 1e-6
    for p in mask["predictions"]:
        assert not p["token"].startswith("[")  # special tokens are never predicted
        assert p["sequence"] == text.replace("[MASK]", p["token"].removeprefix("##"))

    two = mlm.post("/fill-mask", json={"text": "[MASK] sat on the [MASK] ."}).json()
    assert [len(m["predictions"]) for m in two["masks"]] == [5, 5]
    batch = mlm.post("/fill-mask", json={"texts": [text, "the [MASK] sat"], "top_k": 2}).json()
    assert len(batch["results"]) == 2
    batched, alone = batch["results"][0]["masks"][0]["predictions"], result["masks"][0]["predictions"][:2]
    assert [p["token"] for p in batched] == [p["token"] for p in alone]  # batching with padding: same tokens, same scores up to rounding
    assert all(math.isclose(a["score"], b["score"], rel_tol=1e-4) for a, b in zip(batched, alone, strict=True))


def test_a_batch_answers_every_item_and_records_the_bad_one(models: dict[str, Path], mlm: TestClient) -> None:
    """One unanswerable item of a batch is an error object in its place (on_error "record", the default);
    the others are answered. on_error "stop" refuses the batch, as a single bad input always is. An empty
    text is answered where the task answers it."""
    batch = mlm.post("/fill-mask", json={"texts": ["the [MASK] sat", "no mask here", "a [MASK]"]})
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert "masks" in results[0] and "masks" in results[2]
    assert results[1]["error"] == "no_mask" and results[1]["message"].startswith("item 1:")
    _assert_error(mlm.post("/fill-mask", json={"texts": ["the [MASK] sat", "no mask here"], "on_error": "stop"}))
    with TestClient(create_app(models["cls"])) as client:
        answered = client.post("/classify", json={"texts": ["a gripping film", ""]}).json()["results"]
        assert [r["label"] in ("negative", "positive") for r in answered] == [True, True]
        assert client.post("/classify", json={"text": ""}).status_code == 200


BAD_FILL_MASK = {
    "empty text": {"text": ""},
    "blank text": {"text": "   \n\t"},
    "no mask": {"text": "the cat sat on the mat"},
    "100k characters": {"text": "the [MASK] " + "x" * 100_000},
    "text is a number": {"text": 42},
    "text is a list of numbers": {"texts": [1, 2]},
    "top_k is a string": {"text": "the [MASK]", "top_k": "5"},
    "top_k zero": {"text": "the [MASK]", "top_k": 0},
    "top_k huge": {"text": "the [MASK]", "top_k": 10_000},
    "unknown field": {"text": "the [MASK]", "tpo_k": 5},
    "text and texts": {"text": "the [MASK]", "texts": ["a [MASK]"]},
    "neither": {"top_k": 5},
    "too many items": {"texts": ["the [MASK]"] * (MAX_ITEMS + 1)},
    "empty list": {"texts": []},
    "too many masks": {"text": " ".join(["[MASK]"] * 11)},
    "too many tokens": {"text": "the [MASK] " + "cat " * 200},
    "body is a list": ["the [MASK]"],
    "body is null": None,
}


@pytest.mark.parametrize("body", BAD_FILL_MASK.values(), ids=BAD_FILL_MASK.keys())
def test_fill_mask_bad_input(mlm: TestClient, body: object) -> None:
    _assert_error(mlm.post("/fill-mask", json=body))
    assert mlm.post("/fill-mask", json={"text": "the [MASK] sat"}).status_code == 200  # still answering


def test_malformed_and_oversized_bodies(mlm: TestClient) -> None:
    body = _assert_error(mlm.post("/fill-mask", content=b'{"text": "the [MASK]"', headers={"content-type": "application/json"}))
    assert body["error"] == "invalid_request"
    _assert_error(mlm.post("/fill-mask", content=b"text=hello", headers={"content-type": "text/plain"}))
    huge = json.dumps({"text": "x" * 2_000_000}).encode()
    assert _assert_error(mlm.post("/fill-mask", content=huge, headers={"content-type": "application/json"}),
                         413)["error"] == "too_large"
    surrogate = b'{"text": "the [MASK] \\ud800 sat"}'  # a lone surrogate is valid JSON but not Unicode
    _assert_error(mlm.post("/fill-mask", content=surrogate, headers={"content-type": "application/json"}))
    assert mlm.get("/health").json()["status"] == "ok"


def test_messages_name_the_field(mlm: TestClient) -> None:
    body = _assert_error(mlm.post("/fill-mask", json={"text": "x" * 100_000}))
    assert "text" in body["message"] and "5000" in body["message"]
    body = _assert_error(mlm.post("/fill-mask", json={"text": "the [MASK]", "colour": "red"}))
    assert "colour" in body["message"]
    body = _assert_error(mlm.post("/fill-mask", json={"text": "no mask here"}))
    assert body["error"] == "no_mask" and "[MASK]" in body["message"]


# ------------------------------------------------------------------------------------- other tasks


def test_model_type_check(models: dict[str, Path], mlm: TestClient) -> None:
    body = _assert_error(mlm.post("/qa", json={"question": "who?", "context": "the cat"}), 400)
    assert body["error"] == "unsupported_task"
    assert "BertForMaskedLM" in body["message"] and "BertForQuestionAnswering" in body["message"]
    _assert_error(mlm.post("/classify", json={"text": "the cat"}), 400)
    _assert_error(mlm.post("/ner", json={"text": "the cat"}), 400)
    with TestClient(create_app(models["bare"])) as bare:
        body = _assert_error(bare.post("/fill-mask", json={"text": "the [MASK]"}), 400)
        assert "masked-LM" in body["message"]
        assert bare.post("/embed", json={"text": "the cat", "pooling": "pooler"}).status_code == 200


def test_classify(models: dict[str, Path]) -> None:
    with TestClient(create_app(models["cls"])) as client:
        result = client.post("/classify", json={"text": "a gripping film"}).json()
        assert {s["label"] for s in result["scores"]} == {"negative", "positive"}
        assert math.isclose(sum(s["score"] for s in result["scores"]), 1.0, rel_tol=1e-5)
        assert result["label"] == result["scores"][0]["label"] and not result["truncated"]
        pair = client.post("/classify", json={"text": "the cat sat", "text_pair": "the dog sat"})
        assert pair.status_code == 200
        batch = client.post("/classify", json={"texts": ["a", "b"], "text_pairs": ["c", "d"]}).json()
        assert len(batch["results"]) == 2
        long = client.post("/classify", json={"text": "the cat sat on the mat " * 60}).json()
        assert long["truncated"]
        _assert_error(client.post("/classify", json={"texts": ["a", "b"], "text_pairs": ["c"]}))
        _assert_error(client.post("/classify", json={"texts": ["a"], "text_pair": "c"}))


def test_ner(models: dict[str, Path]) -> None:
    text = "jacob devlin wrote bert at google in mountain view ."
    with TestClient(create_app(models["ner"])) as client:
        result = client.post("/ner", json={"text": text}).json()
        assert [t["token"] for t in result["tokens"]][:2] == ["jacob", "devlin"]
        assert all(t["label"] in NER_LABELS for t in result["tokens"])
        for entity in result["entities"]:
            assert entity["label"] in {"PER", "LOC"} and text[entity["start"]:entity["end"]] == entity["text"]
        assert len(client.post("/ner", json={"texts": [text, "paris"]}).json()["results"]) == 2


def test_entity_grouping() -> None:
    text = "Jacob Devlin works at Google in Mountain View"

    def words(*rows: tuple) -> list[dict]:
        return [{"label": label, "score": score, "start": start, "end": end} for label, score, start, end in rows]

    entities = group_entities(text, words(("B-PER", 0.9, 0, 5), ("I-PER", 0.7, 6, 12), ("O", 0.9, 13, 18),
                                          ("O", 0.9, 19, 21), ("B-ORG", 0.8, 22, 28), ("O", 0.9, 29, 31),
                                          ("I-LOC", 0.6, 32, 40), ("I-LOC", 0.8, 41, 45)))
    assert [(e["label"], e["text"]) for e in entities] == [("PER", "Jacob Devlin"), ("ORG", "Google"),
                                                           ("LOC", "Mountain View")]
    assert math.isclose(entities[0]["score"], 0.8)
    # B- always starts a new entity, even right after one of the same type; a bare label is IO tagging
    split = group_entities("a b", words(("B-PER", 1.0, 0, 1), ("B-PER", 1.0, 2, 3)))
    assert [e["text"] for e in split] == ["a", "b"]
    assert [e["label"] for e in group_entities("a b", words(("PER", 1.0, 0, 1), ("PER", 1.0, 2, 3)))] == ["PER"]


class _PointingQA(torch.nn.Module):
    """A stand-in QA head whose logits peak at chosen token ids (or at [CLS]), to check the span logic."""

    def __init__(self, config: BertConfig, start_id: int | None, end_id: int | None) -> None:
        super().__init__()
        self.config, self.start_id, self.end_id = config, start_id, end_id

    def forward(self, input_ids, attention_mask=None, token_type_ids=None) -> SpanOutput:
        def peak(token_id: int | None) -> torch.Tensor:
            logits = torch.zeros(input_ids.shape)
            if token_id is None:
                logits[:, 0] = 20.0
            else:
                logits[input_ids == token_id] = 20.0
            return logits

        return SpanOutput(None, peak(self.start_id), peak(self.end_id))


def test_qa_spans_windows_and_no_answer(models: dict[str, Path]) -> None:
    app = create_app(models["qa"])
    service = app.state.service
    real = service.model
    with TestClient(app) as client:
        context = "BERT large has 24 layers, 1024 hidden units and 340M parameters."
        question = "How many parameters does BERT large have?"
        result = client.post("/qa", json={"question": question, "context": context}).json()
        assert not result["no_answer"] and context[result["start"]:result["end"]] == result["answer"]

        tok = service.tokenizer
        service.model = _PointingQA(real.config, tok.convert_tokens_to_ids("24"), tok.convert_tokens_to_ids("layers"))
        result = client.post("/qa", json={"question": question, "context": context}).json()
        assert result["answer"] == "24 layers" and (result["start"], result["end"]) == (15, 24)

        # a passage longer than one window: the answer sits in a later window
        filler = "the cat sat on the mat . " * 120
        long = client.post("/qa", json={"question": question, "context": filler + context}).json()
        assert long["answer"] == "24 layers" and long["start"] == len(filler) + 15
        assert service.batchers["qa"].stats.rows > service.batchers["qa"].stats.requests  # several windows

        service.model = _PointingQA(real.config, None, None)  # every window says "no answer"
        none = client.post("/qa", json={"question": question, "context": context, "allow_no_answer": True}).json()
        assert none["no_answer"] and none["answer"] == "" and none["start"] is None
        forced = client.post("/qa", json={"question": question, "context": context}).json()
        assert not forced["no_answer"]  # a SQuAD 1.1 model always answers

        service.model = real
        batch = client.post("/qa", json={"questions": [question, "who?"], "contexts": [context, "the cat"]}).json()
        assert len(batch["results"]) == 2
        _assert_error(client.post("/qa", json={"question": question}))
        _assert_error(client.post("/qa", json={"questions": ["a", "b"], "contexts": ["c"]}))
        _assert_error(client.post("/qa", json={"question": "", "context": context}))
        _assert_error(client.post("/qa", json={"question": "a", "context": "x" * 100_000}))


def test_a_crash_is_a_json_500_and_the_server_goes_on(models: dict[str, Path]) -> None:
    app = create_app(models["cls"])
    service = app.state.service
    real = service.model

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    with TestClient(app, raise_server_exceptions=False) as client:
        service.model = broken
        body = _assert_error(client.post("/classify", json={"text": "the cat"}), 500)
        assert body["error"] == "internal_error" and "RuntimeError" in body["message"]
        service.model = real
        assert client.post("/classify", json={"text": "the cat"}).status_code == 200


def test_embed(models: dict[str, Path], mlm: TestClient) -> None:
    one = mlm.post("/embed", json={"text": "the cat sat on the mat"}).json()
    assert one["dim"] == 128 and math.isclose(sum(x * x for x in one["embedding"]), 1.0, rel_tol=1e-4)
    # padding in a batch must not change a vector
    batch = mlm.post("/embed", json={"texts": ["the cat", "the cat sat on the mat"]}).json()["results"]
    assert max(abs(a - b) for a, b in zip(batch[1]["embedding"], one["embedding"], strict=True)) < 1e-5
    raw = mlm.post("/embed", json={"text": "the cat", "pooling": "cls", "normalize": False}).json()
    assert raw["pooling"] == "cls" and not math.isclose(sum(x * x for x in raw["embedding"]), 1.0)
    body = _assert_error(mlm.post("/embed", json={"text": "the cat", "pooling": "pooler"}))
    assert body["error"] == "no_pooler"
    largest = mlm.post("/embed", json={"text": "the cat", "pooling": "max", "normalize": False}).json()
    mean = mlm.post("/embed", json={"text": "the cat", "pooling": "mean", "normalize": False}).json()
    assert largest["pooling"] == "max" and all(a >= b - 1e-6 for a, b in zip(largest["embedding"], mean["embedding"],
                                                                              strict=True))
    _assert_error(mlm.post("/embed", json={"text": "the cat", "pooling": "median"}))


def test_openai_embeddings(mlm: TestClient) -> None:
    """/v1/embeddings answers OpenAI's request and response shapes with /embed's vectors."""
    import base64

    import numpy as np

    texts = ["the cat", "the cat sat on the mat"]
    ours = mlm.post("/embed", json={"texts": texts}).json()["results"]
    body = mlm.post("/v1/embeddings", json={"input": texts, "model": "my-model"}).json()
    assert body["object"] == "list" and body["model"] == "my-model"
    assert [d["index"] for d in body["data"]] == [0, 1] and all(d["object"] == "embedding" for d in body["data"])
    assert [d["embedding"] for d in body["data"]] == [r["embedding"] for r in ours]
    assert body["usage"]["prompt_tokens"] == sum(r["tokens"] for r in ours) == body["usage"]["total_tokens"]
    packed = mlm.post("/v1/embeddings", json={"input": "the cat", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(packed["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, ours[0]["embedding"], atol=1e-6)  # alone vs. padded in a batch of two
    assert packed["model"]  # the served model's name when the request names none
    short = mlm.post("/v1/embeddings", json={"input": texts, "dimensions": 8}).json()["data"][0]["embedding"]
    assert len(short) == 8 and math.isclose(sum(x * x for x in short), 1.0, rel_tol=1e-6)  # the head, renormalised


def test_attention(mlm: TestClient) -> None:
    result = mlm.post("/attention", json={"text": "the cat sat", "layer": 1, "head": 0}).json()
    assert result["tokens"][0] == "[CLS]" and result["tokens"][-1] == "[SEP]"
    n = len(result["tokens"])
    assert len(result["weights"]) == n and all(len(row) == n for row in result["weights"])
    assert all(math.isclose(sum(row), 1.0, abs_tol=1e-3) for row in result["weights"])
    mean = mlm.post("/attention", json={"text": "the cat sat", "text_pair": "on the mat"}).json()
    assert mean["head"] is None and mean["num_layers"] == 2
    assert _assert_error(mlm.post("/attention", json={"text": "the cat", "layer": 2}))["error"] == "bad_layer"
    assert _assert_error(mlm.post("/attention", json={"text": "the cat", "head": 5}))["error"] == "bad_head"
    _assert_error(mlm.post("/attention", json={"text": "the cat", "layer": -1}))
    assert _assert_error(mlm.post("/attention", json={"text": "cat " * 200}))["error"] == "too_long"


# --------------------------------------------------------------------------------- dynamic batching


def _count_calls(module: torch.nn.Module) -> list[int]:
    """Wrap module.forward; the returned list gets the batch size of each call."""
    calls: list[int] = []
    forward = module.forward

    def counting(input_ids, *args, **kwargs):
        calls.append(int(input_ids.shape[0]))
        return forward(input_ids, *args, **kwargs)

    module.forward = counting
    return calls


async def _concurrent(app, path: str, bodies: list[dict]) -> list[httpx.Response]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return list(await asyncio.gather(*(client.post(path, json=body) for body in bodies)))


@pytest.mark.parametrize("max_batch_size", [8, 1])
def test_concurrent_requests_share_model_calls(models: dict[str, Path], max_batch_size: int) -> None:
    app = create_app(models["mlm"], max_batch_size=max_batch_size, max_wait_ms=200)
    service = app.state.service
    texts = [("the cat sat on the mat " * (i + 1)).strip() for i in range(8)]
    expected = [service.run_embed([service.prepare_embed(t, "mean", True)])[0].embedding
                for t in texts]
    calls = _count_calls(service.backbone)
    responses = asyncio.run(_concurrent(app, "/embed", [{"text": t} for t in texts]))
    assert [r.status_code for r in responses] == [200] * 8
    for response, reference in zip(responses, expected, strict=True):  # each got its own answer
        assert max(abs(a - b) for a, b in zip(response.json()["embedding"], reference, strict=True)) < 1e-5
    assert sum(calls) == 8
    if max_batch_size == 1:
        assert calls == [1] * 8
    else:
        assert len(calls) <= 2 and max(calls) >= 4, calls  # 8 requests in one or two model calls
    stats = service.batchers["embed"].stats
    assert stats.requests == 8 and stats.batches == len(calls)


def test_batcher_limits_order_and_isolation() -> None:
    seen: list[list[int]] = []

    def run(items: list[int]) -> list[int]:
        seen.append(list(items))
        if 13 in items:
            raise ValueError("thirteen")
        return [x * 10 for x in items]

    async def main() -> list[object]:
        batcher = DynamicBatcher(run, max_batch_size=4, max_wait_ms=50, weight=lambda x: 2 if x >= 100 else 1)
        jobs = [batcher.submit(x) for x in [*range(10), 13, 100, 101]]
        out = await asyncio.gather(*jobs, return_exceptions=True)
        await batcher.close()
        return out

    results = asyncio.run(main())
    assert results[:10] == [x * 10 for x in range(10)]
    assert isinstance(results[10], ValueError)  # only the bad item fails ...
    assert results[11:] == [1000, 1010]  # ... its batch-mates were run again without it
    assert all(sum(2 if x >= 100 else 1 for x in batch) <= 4 for batch in seen)
    assert max(len(b) for b in seen) == 4
