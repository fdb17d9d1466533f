"""Every command example in README.md and docs/*.md runs, or says why it cannot.

A fenced shell block holding a `bertforge` command is one of three kinds:

- **runnable as written** (```bash test): tests/test_docs.py runs it on the fixtures it names;
- **not run**, with the reason in an HTML comment on the line before its fence, such as
  `<!-- not run: hours of pre-training on ../shared/data -->` (a GPU, the network, a server that
  stays up, a figure that takes hours);
- **an example** (every other block): it runs here, as written, in document order, in a directory
  per document that holds what the examples assume a reader has, in miniature: `models/minilm` (a
  random four-layer BERT in its place), `reviews.csv` and the other files the pages name, made from
  tests/fixtures, `../shared/data` with the GLUE, CoNLL-2003 and SQuAD layouts, and `path/to/glue`. `$MODEL` is
  models/minilm. The pages about the Hub run against a loopback Hub (tests/hub_server.py) that holds
  the repositories they name, in miniature too, and takes their uploads.

What a page assumes was done before (a fine-tuned `runs/reviews/seed-1` for the inference pages, say)
is made first by the commands in PREREQUISITES. Three things change on the way, so that a page runs in
seconds: time budgets are cut (`--budget-minutes` and `--adapt-minutes` to 0.02, i.e. about a second),
pre-training and general distillation stop after 3 steps (`--max-steps 3`; a recipe's vocabulary size
follows the data's tokenizer, since a tiny text gives fewer pieces), and an `--out` directory an
earlier example of the page wrote is removed first, since examples are alternatives unless one reads
another's output (`--resume`, `--overwrite` and `--config run_config.yaml` reruns keep theirs). A command passes when
it exits 0; a console block that shows an `error: ...` line under a command expects exit code 2 and
that line. A `bertforge serve` line is skipped (a server keeps running; tests/test_serve.py runs it),
the rest of its block runs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from tests.hub_server import loopback_hub_fixture  # noqa: F401  (the `loopback_hub` fixture)
from tests.test_docs import (
    DOCS,
    ROOT,
    SHELL_LANGS,
    Block,
    expected_output,
    fenced_blocks,
    in_process_args,
    invocations,
    logical_lines,
)
from tests.tiny_models import save_tiny_encoder

FIXTURES = ROOT / "tests" / "fixtures"
NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
TIME_OPTIONS = re.compile(r"(--(?:budget|adapt)-minutes)[ =]\S+")
MAX_STEPS = re.compile(r"--max-steps[ =]\S+")
CUT_TO_STEPS = (["pretrain"], ["distill", "general"])
_SST2 = "bertforge finetune glue --task SST-2 --model models/minilm --data ../shared/data/glue --out runs/sst2 --epochs 1"
PREREQUISITES = {
    "inference.md": [
        "bertforge finetune classify --model models/minilm --train reviews.csv --dev reviews-dev.csv --out runs/reviews "
        "--epochs 1",
        "bertforge finetune glue --task MRPC --model models/minilm --data ../shared/data/glue --out runs/mrpc --epochs 1",
        "bertforge finetune squad --model models/minilm --data ../shared/data/squad/dev-v2.0.from_explorer.json "
        "--out runs/squad2 --epochs 1",
        "bertforge finetune ner --model models/minilm --data ../shared/data/conll2003 --out runs/ner --epochs 1",
        "mkdir -p runs/mini && cp -r models/minilm runs/mini/final",
        _SST2,
        "bertforge prepare --input corpus/ --tokenizer models/minilm --out data/bert128 --plain-text",
    ],
    "precision.md": [_SST2],
    "recipes.md": ["mkdir -p runs/tiny && cp -r models/minilm runs/tiny/final"],  # README's pre-trained tiny
    "distributed.md": ["bertforge prepare --input books/ --tokenizer runs/vocab --out data/sample128 --plain-text"],
    "guarantees.md": ["bertforge prepare --input books/ --tokenizer runs/vocab --out data/gutenberg128 --plain-text"],
}
WORDS = ("a gripping beautifully acted film dull and far too long clever moving flat slow story what the "
         "of in to is was it for on with as by at from this that cat sleeps sofa stocks fell sharply monday "
         "rained all day june how do vaccines work rainfall where did super bowl take place germany union "
         "john smith lives paris london people places review text label")


def command_blocks(path: Path) -> list[tuple[Block, str | None]]:
    """(block, the reason it is not run or None) for each shell block of `path` with a bertforge command."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for block in fenced_blocks(path):
        if block.lang not in SHELL_LANGS or not any(invocations(text) for _, text in logical_lines(block)):
            continue
        above = lines[block.line - 2].strip() if block.line >= 2 else ""
        reason = NOT_RUN.match(above)
        out.append((block, reason[1] if reason else None))
    return out


BLOCKS = {path: command_blocks(path) for path in DOCS}
EXAMPLES = {path: [b for b, reason in blocks if reason is None and not b.runnable]
            for path, blocks in BLOCKS.items()}
EXAMPLES = {path: blocks for path, blocks in EXAMPLES.items() if blocks}


# ------------------------------------------------------------------------------------------------
# a reader's directory in miniature
# ------------------------------------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _jsonl(path: Path, rows: list[dict]) -> None:
    _write(path, "".join(json.dumps(row) + "\n" for row in rows))


def _tag_rows() -> list[dict]:
    return [{"tokens": ["john", "smith", "lives", "in", "paris"], "tags": ["B-PER", "I-PER", "O", "O", "B-LOC"]},
            {"tokens": ["the", "cat", "sleeps", "in", "london"], "tags": ["O", "O", "O", "O", "B-LOC"]},
            {"tokens": ["stocks", "fell", "on", "monday"], "tags": ["O", "O", "O", "O"]}] * 4


def _qa_rows() -> list[dict]:
    context = "super bowl 50 took place in santa clara . it rained all day in june ."
    return [{"id": f"q{i}", "question": question, "context": context,
             "answers": {"text": [answer], "answer_start": [context.index(answer)]}}
            for i, (question, answer) in enumerate([("where did super bowl take place ?", "santa clara"),
                                                    ("when did it rain ?", "june")] * 4)]


def _squad(articles: int, unanswerable: bool) -> dict:
    """A SQuAD file of `articles` one-paragraph articles, as many as the recipes' --train-articles need."""
    data = []
    for number in range(articles):
        rows = _qa_rows()[:2]
        qas = [{"id": f"a{number}-{row['id']}", "question": row["question"],
                "answers": [{"text": t, "answer_start": s} for t, s in zip(row["answers"]["text"],
                                                                            row["answers"]["answer_start"], strict=True)]}
               for row in rows]
        if unanswerable:
            qas.append({"id": f"a{number}-none", "question": "who won the cup ?", "answers": [], "is_impossible": True,
                        "plausible_answers": []})
        data.append({"title": f"article_{number}", "paragraphs": [{"context": rows[0]["context"], "qas": qas}]})
    return {"version": "v2.0" if unanswerable else "1.1", "data": data}


def build_home(root: Path) -> Path:
    """The directory the examples run in (`root/work`), with `root/shared/data` beside it."""
    work = root / "work"
    work.mkdir()
    for name in ("tests", "recipes", ".venv"):
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    (root / "encoder-src").mkdir()
    # four layers and heads: the feature-based examples take the last four layers, attention shows head 3
    encoder = save_tiny_encoder(root / "encoder-src", WORDS, vocab_size=300, max_positions=512, num_layers=4,
                                num_heads=4)
    shutil.copytree(encoder, work / "models" / "minilm")
    classify = FIXTURES / "classify"
    for name, source in {"reviews.csv": "reviews.csv", "reviews-dev.csv": "reviews-dev.csv", "train.csv": "reviews.csv",
                         "dev.csv": "reviews-dev.csv", "few.csv": "reviews.csv", "new-reviews.csv": "reviews-dev.csv",
                         "new.csv": "new.csv", "new_reviews.csv": "new.csv"}.items():
        shutil.copy(classify / source, work / name)
    texts = [line.split(",")[0].strip('"') for line in (classify / "reviews.csv").read_text().splitlines()[1:]]
    for name in ("sentences.txt", "lines.txt", "questions.txt", "more-reviews.txt", "texts.txt", "reviews.txt"):
        _write(work / name, "\n".join(texts) + "\n")
    _jsonl(work / "long_reviews.jsonl", [{"text": " ".join(texts * 3)}, {"text": texts[0]}])
    # multi-label rows: each review's label, and "long" beside it for the longer ones
    labelled = [line.rsplit(",", 1) for line in (classify / "reviews.csv").read_text().splitlines()[1:]]
    tagged = [{"text": text.strip('"'), "tags": [label] + (["long"] if len(text.split()) > 6 else [])}
              for text, label in labelled]
    _jsonl(work / "tagged.jsonl", tagged)
    _jsonl(work / "tagged-dev.jsonl", tagged)
    _write(work / "pairs.csv", "anchor,positive\n" + "".join(f'"{a}","{b}"\n' for a, b in zip(texts[:-1], texts[1:], strict=True)))
    shutil.copy(work / "pairs.csv", work / "pairs-dev.csv")
    _write(work / "sts.csv", "sentence1,sentence2,score\n"
           + "".join(f'"{a}","{b}",{i % 5}\n' for i, (a, b) in enumerate(zip(texts[:-1], texts[1:], strict=True))))
    shutil.copy(work / "sts.csv", work / "sts-dev.csv")
    _write(work / "pairs.tsv", "sentence1\tsentence2\n" + "".join(f"{a}\t{b}\n" for a, b in zip(texts[:-1], texts[1:], strict=True)))
    # the text twice: embeddings.md names its column (body), README.md leaves the default (text)
    _write(work / "corpus.csv", "doc_id,body,text\n" + "".join(f'd{i},"{t}","{t}"\n' for i, t in enumerate(texts)))
    tags = _tag_rows()
    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
    for name in ("train.jsonl", "dev.jsonl"):
        _jsonl(work / name, [{"tokens": r["tokens"], "ner_tags": [names.index(t) for t in r["tags"]]} for r in tags])
    _jsonl(work / "new-sentences.jsonl", [{"tokens": r["tokens"]} for r in tags[:3]])
    own = work / "runs" / "own-data-tag-qa" / "data"
    for split in ("train", "dev"):
        _jsonl(own / f"people-places-{split}.jsonl", tags)
        _jsonl(own / f"squad-{split}.jsonl", _qa_rows())
    _jsonl(work / "questions.jsonl", [{k: r[k] for k in ("id", "question", "context")} for r in _qa_rows()[:2]])
    book = (FIXTURES / "gutenberg_sample.txt").read_text(encoding="utf-8")
    for folder in ("corpus", "books"):
        _write(work / folder / "book1.txt", book)
        _write(work / folder / "book2.txt", book)
    shutil.copytree(encoder, work / "runs" / "vocab")
    _write_compressed_and_columnar(work, texts)
    shared = root / "shared" / "data"
    shutil.copytree(FIXTURES / "tasks" / "glue", shared / "glue")
    # recipes.md's search holds 250 training pairs out: RTE's rows repeated past that
    rte = (shared / "glue" / "RTE" / "train.tsv").read_text(encoding="utf-8").splitlines()
    _write(shared / "glue" / "RTE" / "train.tsv", "\n".join([rte[0], *(rte[1:] * 130)]) + "\n")
    shutil.copytree(FIXTURES / "tasks" / "glue", work / "data" / "glue")
    shutil.copytree(FIXTURES / "tasks" / "glue", work / "path" / "to" / "glue")  # README's placeholder
    conll = (FIXTURES / "tasks" / "conll" / "with_docstart.txt").read_text(encoding="utf-8")
    for name in ("eng.train", "eng.testa", "eng.testb"):
        _write(shared / "conll2003" / name, conll)
    for name in ("gutenberg/Emma_158.txt", "gutenberg/Middlemarch_145.txt", "wikitext-2/valid.txt",
                 "wikitext-2/test.txt"):
        _write(shared / "pretrain_text" / name, book)
    shutil.copytree(encoder, shared / "weights" / "bert-base-uncased")
    swag = work / "data" / "swag"
    shutil.copytree(FIXTURES / "tasks" / "swag", swag)
    shutil.copy(swag / "train.csv", swag / "val.csv")
    _write(work / "data" / "squad" / "dev-v2.0.json", json.dumps(_squad(35, unanswerable=True)))
    _write(shared / "squad" / "dev-v1.1.from_explorer.json", json.dumps(_squad(48, unanswerable=False)))
    _write(shared / "squad" / "dev-v2.0.from_explorer.json", json.dumps(_squad(35, unanswerable=True)))
    return work


def _write_compressed_and_columnar(work: Path, texts: list[str]) -> None:
    """web/*.jsonl.gz and wiki.parquet, the mixed inputs of data.md."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    (work / "web").mkdir()
    with gzip.open(work / "web" / "part-0.jsonl.gz", "wt", encoding="utf-8") as sink:
        sink.writelines(json.dumps({"text": t, "article": t}) + "\n" for t in texts)
    pq.write_table(pa.table({"article": texts}), work / "wiki.parquet")


HUB_PAGES = ("README.md", "hub.md", "checkpoints.md")
HUB_ENCODERS = ("google-bert/bert-base-uncased", "sentence-transformers/all-MiniLM-L6-v2",
                "google/bert_uncased_L-2_H-128_A-2")
HUB_CLASSIFIERS = ("textattack/bert-base-uncased-SST-2", "distilbert/distilbert-base-uncased-finetuned-sst-2-english")


def _parquet(rows: list[dict], label_names: list[str]) -> bytes:
    """A Parquet file as `datasets` writes it, the label names in its schema metadata."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    features = {"label": {"names": label_names, "_type": "ClassLabel"}}
    table = pa.Table.from_pylist(rows).replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def fill_hub(hub, work: Path) -> None:
    """The repositories the Hub pages name: models/minilm's encoder, a two-label classifier on it, GLUE's
    SST-2 and a user's reviews data set, each as the Hub lays it out."""
    from bertforge import BertForSequenceClassification, BertModel
    from bertforge.model.base import set_labels

    def files(directory: Path) -> dict[str, bytes]:
        return {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}

    encoder = work / "models" / "minilm"
    config = BertModel.from_pretrained(encoder).config
    classifier = work.parent / "hub-classifier"
    BertForSequenceClassification(set_labels(config, ["NEGATIVE", "POSITIVE"])).save_pretrained(classifier)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (encoder / name).is_file():
            shutil.copy(encoder / name, classifier / name)
    for name in HUB_ENCODERS:
        hub.commit(name, files(encoder))
    for name in HUB_CLASSIFIERS:
        hub.commit(name, files(classifier))
    rows = [line.rsplit(",", 1) for line in (work / "reviews.csv").read_text(encoding="utf-8").splitlines()[1:]]
    labelled = [{"text": text.strip('"'), "label": int(label == "positive")} for text, label in rows]
    sst2 = [{"sentence": r["text"], "label": r["label"], "idx": i} for i, r in enumerate(labelled)]
    hub.commit("nyu-mll/glue", {f"sst2/{split}-00000-of-00001.parquet": _parquet(part, ["negative", "positive"])
                                for split, part in (("train", sst2), ("validation", sst2[:4]),
                                                    ("test", [{**r, "label": -1} for r in sst2[:2]]))},
               repo_type="dataset")
    hub.commit("me/reviews", {f"data/{split}-00000-of-00001.parquet": _parquet(part, ["negative", "positive"])
                              for split, part in (("train", labelled), ("validation", labelled[:4]))},
               repo_type="dataset")


# ------------------------------------------------------------------------------------------------
# running a page
# ------------------------------------------------------------------------------------------------
def _prepared(command: str, work: Path) -> str:
    """The command as it runs here: time budgets cut, an earlier alternative's --out cleared."""
    command = TIME_OPTIONS.sub(r"\1 0.02", command).replace("$MODEL", "models/minilm")
    if any(invocations(command)[0][:len(c)] == c for c in CUT_TO_STEPS if invocations(command)):
        command = re.sub(r"\s+#[^'\"]*$", "", command)  # the options go before a trailing comment, not into it
        command = MAX_STEPS.sub("", command) + " --max-steps 3" + _vocab_of_the_data(invocations(command)[0], work)
    for args in invocations(command):
        keeps = {"--resume", "--overwrite"} & set(args) or any(a.endswith("run_config.yaml") for a in args)
        if "--out" in args[:-1] and not keeps:
            target = work / args[args.index("--out") + 1]
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    return command


def _vocab_of_the_data(args: list[str], work: Path) -> str:
    """A recipe's vocabulary size (16,000) is more than a tiny text gives: follow the data's tokenizer."""
    if "--data" not in args[:-1] or "--config" not in args:
        return ""
    vocab = work / args[args.index("--data") + 1] / "tokenizer" / "vocab.txt"
    return f" --set vocab_size={len(vocab.read_text(encoding='utf-8').splitlines())}" if vocab.is_file() else ""


def run_line(command: str, where: str, work: Path, env: dict[str, str], runner: CliRunner,
             error: str | None = None) -> None:
    """Run one command; it exits 0, or with `error` (a console block's `error: ...` line) exits 2 printing it."""
    command = _prepared(command, work)
    if any(found[:1] == ["serve"] for found in invocations(command)):
        return
    args = in_process_args(command)
    if args is not None:
        result = runner.invoke(app, args)
        code, output = result.exit_code, result.output
        detail = "".join(traceback.format_exception(result.exception)) \
            if result.exception and not isinstance(result.exception, SystemExit) else ""
    else:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=work, env=env, capture_output=True,
                              text=True, timeout=300)
        code, output, detail = done.returncode, done.stdout + done.stderr, ""
    if error is None and code != 0:
        pytest.fail(f"{where}: `{command}` exited {code}\n{output[-2000:]}\n{detail[-3000:]}")
    if error is not None and (code != 2 or error not in [line.strip() for line in output.splitlines()]):
        pytest.fail(f"{where}: `{command}` should exit 2 with `{error}`; it exited {code}:\n{output[-2000:]}")


def expected_errors(block: Block) -> dict[int, str]:
    """Console blocks: line of a `$ ` command -> the `error: ...` line shown under it."""
    return {number: lines[0] for number, lines in expected_output(block).items()
            if lines and lines[0].startswith("error:")}


@pytest.mark.slow
@pytest.mark.parametrize("path", list(EXAMPLES), ids=lambda p: str(p.relative_to(ROOT)))
def test_command_examples_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              request: pytest.FixtureRequest):
    work = build_home(tmp_path)
    if path.name in HUB_PAGES:
        hub = request.getfixturevalue("loopback_hub")
        fill_hub(hub, work)
        monkeypatch.setenv("HF_TOKEN", hub.token)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MODEL": "models/minilm"}
    monkeypatch.chdir(work)
    monkeypatch.setenv("MODEL", "models/minilm")
    runner = CliRunner()
    for command in PREREQUISITES.get(path.name, []):
        run_line(command, f"{path.name}'s prerequisite", work, env, runner)
    for block in EXAMPLES[path]:
        errors = expected_errors(block) if block.lang == "console" else {}
        for number, command in logical_lines(block):
            run_line(command, f"{path.relative_to(ROOT)}:{number}", work, env, runner, errors.get(number))


def test_blocks_not_run_say_why():
    """A reason is a sentence, not a tag: what the example needs that a test cannot have."""
    short = [f"{b.where}: {reason!r}" for blocks in BLOCKS.values() for b, reason in blocks
             if reason is not None and len(reason.split()) < 3]
    assert not short, "say what the example needs:\n" + "\n".join(short)


def test_most_command_examples_run():
    blocks = [(b, reason) for found in BLOCKS.values() for b, reason in found]
    running = sum(reason is None for _, reason in blocks)
    assert running >= len(blocks) // 2, f"only {running} of {len(blocks)} command blocks run"
