"""The demo page in a real browser: headless Chromium drives each tab of a live server on localhost.

The QA check is end to end: a tiny QA model is first fitted (a few hundred steps, seconds) to answer
questions about one passage, the test types that passage and a question into the page, and the
answer the page highlights must be the right span. Screenshots of every tab go to BERTFORGE_SCREENSHOTS (docs/img when refreshing them).

Needs Playwright (pip) and a Chromium on the machine (Debian's `chromium` package, at
/usr/bin/chromium, or BERTFORGE_CHROMIUM=/path); nothing is downloaded at run time. Without a
browser the test is skipped and says why.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi, uvicorn) is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
playwright_sync = pytest.importorskip("playwright.sync_api", reason="playwright (pip) is not installed")

import torch  # noqa: E402

from bertforge.model import (  # noqa: E402
    BertConfig,  # noqa: E402
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    set_labels,
)
from bertforge.serve.app import create_app  # noqa: E402
from bertforge.tokenizer import BertTokenizer  # noqa: E402

CHROMIUM = os.environ.get("BERTFORGE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium installed (apt-get install chromium, or set BERTFORGE_CHROMIUM); the test downloads none",
)
# Screenshots go to a temporary folder, so a test run leaves the checkout clean; to refresh the ones
# committed in docs/img, run with BERTFORGE_SCREENSHOTS=docs/img.
SHOTS = Path(os.environ.get("BERTFORGE_SCREENSHOTS") or tempfile.mkdtemp(prefix="bertforge-screens-"))

PASSAGE = ("BERT comes in two sizes. BERT-base has 12 layers, a hidden size of 768, 12 attention heads and "
           "110M parameters. BERT-large has 24 layers, a hidden size of 1024, 16 attention heads and 340M parameters.")
QUESTIONS = {  # question -> answer, both about PASSAGE: the model must read the question to tell them apart
    "How many parameters does BERT-large have?": "340M",
    "How many parameters does BERT-base have?": "110M",
}
MLM_TEXTS = ["the cat sat on the mat .", "the dog sat on the rug .", "paris is the capital of france .",
             "berlin is the capital of germany ."]
SENTIMENT = [("a gripping , beautifully acted film", 1), ("a wonderful and moving story", 1),
             ("a dull , lifeless and boring film", 0), ("a terrible waste of time", 0)]
NER_TEXT = "jacob devlin wrote bert at google in mountain view ."
NER_TAGS = {"jacob": "B-PER", "devlin": "I-PER", "google": "B-ORG", "mountain": "B-LOC", "view": "I-LOC"}
NER_LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]


def _fit(model: torch.nn.Module, batch: dict[str, torch.Tensor], lr: float, max_steps: int = 800) -> float:
    """Overfit a tiny model to a handful of examples (dropout off), so the page shows sensible output."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is faster, and fair to a busy machine
    try:
        for _ in range(max_steps):
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < 0.02:
                break
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return loss.item()


def _answer_positions(tokenizer: BertTokenizer, question: str, answer: str) -> tuple[int, int]:
    enc = tokenizer.encode(question, PASSAGE)
    start_char = PASSAGE.index(answer)
    end_char = start_char + len(answer)
    tokens = [i for i, (seq, (s, e)) in enumerate(zip(enc.sequence_ids, enc.offsets, strict=True))
              if seq == 1 and s < end_char and e > start_char]
    return tokens[0], tokens[-1]


def _word_vocab(lines: list[str]) -> dict[str, int]:
    """Every word and punctuation mark of `lines` as a whole piece, plus single characters.

    Built, not trained: every word a whole piece gives the tiny models below one id per word, so
    what they fit does not depend on how a trained vocabulary splits the words.
    """
    words = sorted({w for line in lines for w in re.findall(r"\w+|[^\w\s]", line.lower())})
    chars = sorted({c for w in words for c in w})
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *chars, *(f"##{c}" for c in chars)]
    return {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("browser")
    lines = [PASSAGE, *QUESTIONS, *MLM_TEXTS, *(t for t, _ in SENTIMENT), NER_TEXT]
    tok = BertTokenizer(_word_vocab(lines))
    torch.manual_seed(0)

    def config(labels: list[str] | None = None) -> BertConfig:
        cfg = BertConfig.from_preset("tiny", vocab_size=tok.vocab_size, max_position_embeddings=128)
        return set_labels(cfg, labels) if labels else cfg

    qa = BertForQuestionAnswering(config())
    batch = tok.encode_batch([(q, PASSAGE) for q in QUESTIONS], padding=True, return_tensors="pt")
    spans = [_answer_positions(tok, q, a) for q, a in QUESTIONS.items()]
    loss = _fit(qa, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "token_type_ids": batch["token_type_ids"], "start_positions": torch.tensor([s for s, _ in spans]),
              "end_positions": torch.tensor([e for _, e in spans])}, lr=3e-4, max_steps=1000)
    assert loss < 0.1, f"the tiny QA model did not fit its two questions (loss {loss:.3f}); the test needs it to"

    mlm = BertForMaskedLM(config())
    enc = tok.encode_batch(MLM_TEXTS, padding=True, return_tensors="pt")
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    masked = enc["input_ids"].clone()
    masked[:, 3] = tok.mask_token_id  # the 3rd word of each sentence ("sat", "the", ...) is hidden
    _fit(mlm, {"input_ids": masked, "attention_mask": enc["attention_mask"], "labels": labels}, lr=1e-3)

    cls = BertForSequenceClassification(config(["negative", "positive"]))
    enc = tok.encode_batch([t for t, _ in SENTIMENT], padding=True, return_tensors="pt")
    _fit(cls, {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
               "labels": torch.tensor([y for _, y in SENTIMENT])}, lr=1e-3)

    ner = BertForTokenClassification(config(NER_LABELS))
    one = tok.encode(NER_TEXT)
    words = NER_TEXT.split()
    tags = [-100 if w is None else NER_LABELS.index(NER_TAGS.get(words[w], "O")) for w in one.word_ids]
    _fit(ner, {"input_ids": torch.tensor([one.input_ids]), "labels": torch.tensor([tags])}, lr=1e-3)

    out = {}
    for name, model in {"qa": qa, "mlm": mlm, "cls": cls, "ner": ner}.items():
        model.save_pretrained(root / name, tokenizer=tok)
        out[name] = root / name
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _serving(model_dir: Path) -> Iterator[str]:
    """uvicorn in a thread on a free localhost port; yields the base URL."""
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(model_dir), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    with playwright_sync.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


def _open(browser, url: str, tab: str):
    page = browser.new_page(viewport={"width": 1100, "height": 760})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/#{tab}")
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    page.click(f"#tab-{tab}")
    return page, errors


@pytest.mark.slow
def test_qa_tab_highlights_the_answer(checkpoints: dict[str, Path], browser) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with _serving(checkpoints["qa"]) as url:
        page, errors = _open(browser, url, "qa")
        assert page.is_visible("#panel-qa") and not page.is_visible("#panel-fill-mask")
        page.fill("#qa-passage", PASSAGE)
        for question in ("How many parameters does BERT-base have?", "How many parameters does BERT-large have?"):
            page.fill("#qa-question", question)
            page.click("#qa-submit")
            page.wait_for_function(
                "q => document.querySelector('#qa-answer') && document.querySelector('#qa-summary') "
                "&& !document.querySelector('#qa-submit').disabled", arg=question, timeout=15_000)
            page.wait_for_timeout(50)
            assert page.text_content("#qa-answer") == QUESTIONS[question]
            # the highlight sits inside the whole passage, at the answer's place
            assert page.text_content("#qa-highlight") == PASSAGE
            before = page.evaluate("document.querySelector('#qa-answer').previousSibling.textContent")
            assert before == PASSAGE[:PASSAGE.index(QUESTIONS[question])]
        page.screenshot(path=str(SHOTS / "serve-qa.png"), full_page=True)

        # a request the API refuses shows its message on the page, and the page keeps working
        page.fill("#qa-question", "   ")
        page.click("#qa-submit")
        page.wait_for_function("document.querySelector('#qa-error').textContent.length > 0", timeout=15_000)
        assert "422" in page.text_content("#qa-error") and "empty" in page.text_content("#qa-error")
        # a tab whose head this model lacks says so and disables its button
        page.click("#tab-fill-mask")
        assert "has no head for this task" in page.text_content("#panel-fill-mask .notice")
        assert page.is_disabled("#fm-submit")
        assert errors == []
        page.close()


@pytest.mark.slow
def test_other_tabs_render(checkpoints: dict[str, Path], browser) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with _serving(checkpoints["mlm"]) as url:
        page, errors = _open(browser, url, "fill-mask")
        page.fill("#fm-text", "the cat [MASK] on the mat .")
        page.click("#fm-submit")
        page.wait_for_selector("#fm-output table.bars tr", timeout=15_000)
        assert page.locator("#fm-output table.bars tr").count() == 5
        assert page.text_content("#fm-output td.tok") == "sat"  # the fitted model's top prediction
        page.screenshot(path=str(SHOTS / "serve-fill-mask.png"), full_page=True)

        page.click("#tab-attention")
        page.fill("#att-text", "the cat sat on the mat .")
        page.select_option("#att-layer", "1")
        page.select_option("#att-head", "0")
        page.click("#att-submit")
        # changing the layer and the head each start a request too: wait for the one that answers the last choice
        page.wait_for_function("document.querySelector('#att-hover').textContent.includes('head 0')", timeout=15_000)
        assert page.evaluate("document.querySelector('#att-canvas').width") > 100
        assert "layer 1, head 0" in page.text_content("#att-hover")
        page.screenshot(path=str(SHOTS / "serve-attention.png"), full_page=True)
        assert errors == []
        page.close()

    with _serving(checkpoints["cls"]) as url:
        page, errors = _open(browser, url, "classify")
        page.fill("#cls-text", "a wonderful and moving story")
        page.click("#cls-submit")
        page.wait_for_selector("#cls-output strong", timeout=15_000)
        assert page.text_content("#cls-output strong") == "positive"
        page.screenshot(path=str(SHOTS / "serve-classify.png"), full_page=True)
        assert errors == []
        page.close()

    with _serving(checkpoints["ner"]) as url:
        page, errors = _open(browser, url, "ner")
        page.fill("#ner-text", NER_TEXT)
        page.click("#ner-submit")
        page.wait_for_selector("#ner-highlight .ent", timeout=15_000)
        spans = page.eval_on_selector_all(
            "#ner-highlight .ent", "els => els.map(e => [e.firstChild.textContent, e.lastChild.textContent, "
            "getComputedStyle(e).backgroundColor])")
        assert [s[:2] for s in spans] == [["jacob devlin", "PER"], ["google", "ORG"], ["mountain view", "LOC"]]
        assert len({s[2] for s in spans}) == 3  # each type its own colour
        assert page.text_content("#ner-highlight").replace("PER", "").replace("ORG", "").replace("LOC", "") == NER_TEXT
        page.screenshot(path=str(SHOTS / "serve-ner.png"), full_page=True)
        assert errors == []
        page.close()
