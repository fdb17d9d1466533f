"""The server's bounds on what a client can make it hold, and its messages for malformed requests."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, httpx) is not installed")
from fastapi.testclient import TestClient  # noqa: E402

from bertforge.model import BertConfig, BertForSequenceClassification, set_labels  # noqa: E402
from bertforge.serve.app import BodyGuard, create_app  # noqa: E402
from bertforge.tokenizer import BertTokenizer  # noqa: E402


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    root = tmp_path_factory.mktemp("limits")
    (root / "corpus.txt").write_text("a gripping film with a terrible ending\n" * 20, encoding="utf-8")
    tokenizer = BertTokenizer.train([root / "corpus.txt"], vocab_size=100, min_frequency=1, show_progress=False)
    config = set_labels(BertConfig.from_preset("tiny", vocab_size=tokenizer.vocab_size), ["neg", "pos"])
    BertForSequenceClassification(config).save_pretrained(root / "model", tokenizer=tokenizer)
    with TestClient(create_app(root / "model", max_body_bytes=50_000)) as test_client:
        yield test_client


def test_a_chunked_body_is_cut_off_at_the_limit(client: TestClient) -> None:
    sent = []

    def chunks():  # no Content-Length: the transfer encoding is chunked
        for _ in range(100):
            sent.append(1)
            yield b"x" * 10_000

    answer = client.post("/classify", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413 and answer.json()["error"] == "too_large"
    assert client.get("/health").json()["limits"]["max_body_bytes"] == 50_000
    assert client.post("/classify", json={"text": "a gripping film"}).status_code == 200  # still serving


def test_a_half_sent_body_times_out() -> None:
    async def app(scope, receive, send):  # never reached
        raise AssertionError("the app saw a half-sent request")

    async def receive():
        if not parts:
            await asyncio.sleep(3600)  # the client stopped sending
        return parts.pop(0)

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    parts = [{"type": "http.request", "body": b'{"text": "a', "more_body": True}]
    guard = BodyGuard(app, max_bytes=1000, timeout_s=0.05)
    asyncio.run(guard({"type": "http", "headers": []}, receive, send))
    assert sent[0]["status"] == 408 and json.loads(sent[1]["body"])["error"] == "body_timeout"


@pytest.mark.parametrize(("body", "headers", "expected"), [
    (b'{"text": "a", ', {"content-type": "application/json"}, "body: not valid JSON ("),
    (b'{"sentence": "a"}', {"content-type": "application/json"},
     "sentence: unknown field; this endpoint accepts text, texts, on_error, text_pair, text_pairs"),
    (b'{"text": "a"}', {}, "Content-Type: application/json (got no Content-Type)"),
])
def test_messages_say_what_was_wrong_and_what_is_accepted(client: TestClient, body: bytes, headers: dict,
                                                          expected: str) -> None:
    answer = client.post("/classify", content=body, headers=headers)
    assert answer.status_code == 422 and expected in answer.json()["message"], answer.json()
