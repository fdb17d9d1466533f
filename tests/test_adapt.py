"""`bertforge adapt`: continued pre-training of a checkpoint on the user's own text.

Every family with a masked-LM head adapts from a tiny random checkpoint and writes a directory
transformers loads (an ELECTRA discriminator continues with replaced-token detection); the held-out
text never reaches training; a time budget ends the run where it is spent; a run resumes, is locked
and refuses a changed resume; bad text files get one line and exit 2; `finetune --adapt-on` runs it
first on the training file's own text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from bertforge.adapt import adapt, adaptation_objective, example_texts
from bertforge.cli import app
from bertforge.data.masking import continuation_flags
from bertforge.fileio import RunLockedError, run_lock
from bertforge.model import registry
from bertforge.tokenizer import BertTokenizer
from bertforge.train import loop as loop_module
from test_every_family import FAMILIES, smallest_config

WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
    "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
    "whiskey", "xray", "yankee", "zulu",
)
QUIET = {"progress": False, "max_seq_length": 32, "batch_size": 4, "validation_fraction": 0.1}


def numbered_lines(count: int) -> list[str]:
    """Distinct lines, each with its own two-word name, so a line can be found in a decoded sequence."""
    return [f"line {WORDS[i % 26]} {WORDS[(i // 26) % 26]} says the {WORDS[(3 * i) % 26]} went home ."
            for i in range(count)]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("adapt-text") / "reviews.txt"
    path.write_text("\n".join(numbered_lines(400)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer(text_file: Path) -> BertTokenizer:
    return BertTokenizer.train([text_file], vocab_size=120, min_frequency=1, show_progress=False)


def checkpoint(model_type: str, job: str, tokenizer: BertTokenizer, directory: Path) -> Path:
    """A random checkpoint of the family's class for `job`, with the tokenizer."""
    torch.manual_seed(0)
    config = smallest_config(model_type, tokenizer)
    registry.model_class(model_type, job)(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def bert(tokenizer: BertTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint("bert", "embeddings", tokenizer, tmp_path_factory.mktemp("bert") / "encoder")


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_adapts_and_transformers_loads_the_result(model_type: str, tokenizer: BertTokenizer,
                                                                 text_file: Path, tmp_path: Path) -> None:
    import transformers

    start = checkpoint(model_type, "pretraining", tokenizer, tmp_path / "start")
    result = adapt(start, text_file, tmp_path / "run", max_steps=3, lr=1e-3, **QUIET)
    expected = "rtd" if model_type == "electra" else "mlm"
    assert result.objective == adaptation_objective(start) == expected
    assert result.before and result.after and result.steps == 3
    key = "rtd_loss" if expected == "rtd" else "mlm_loss"
    assert result.after[key] < result.before[key]  # three steps at a high rate learn something
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["before"] == result.before and saved["steps"] == 3

    architecture = json.loads((result.final / "config.json").read_text())["architectures"][0]
    loaded, info = getattr(transformers, architecture).from_pretrained(result.final, output_loading_info=True)
    assert not [k for k in info["missing_keys"] if "position_ids" not in k], info
    batch = BertTokenizer.from_pretrained(result.final).encode_batch(["line alpha says the echo went home ."],
                                                                     return_tensors="pt")
    with torch.no_grad():
        logits = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.isfinite(logits).all()


def test_a_checkpoint_without_a_masked_lm_head_gets_a_new_one(bert: Path, text_file: Path, tmp_path: Path) -> None:
    result = adapt(bert, text_file, tmp_path / "run", max_steps=2, **QUIET)
    assert result.objective == "mlm" and any(name.startswith("mlm.") for name in result.new_heads)
    assert "BertForMaskedLM" in (result.final / "config.json").read_text()


def test_a_new_head_warms_up_alone_before_the_encoder_trains(bert: Path, text_file: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    result = adapt(bert, text_file, tmp_path / "run", max_steps=4, head_warmup=0.5, head_lr=1e-2, **QUIET)
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert saved["head_warmup_steps"] == 2 and result.steps == 2  # the share of the steps, then the rest
    def weights(directory: Path) -> dict[str, torch.Tensor]:  # the encoder's keys without the "bert." prefix
        return {key.removeprefix("bert."): value for key, value in load_file(str(directory / "model.safetensors")).items()}

    start, warmed, final = weights(bert), weights(tmp_path / "run" / "head-warmup" / "final"), weights(result.final)
    encoder = [key for key in start if key in warmed and not key.startswith("pooler.")]
    assert len(encoder) > 10 and all(torch.equal(start[key], warmed[key]) for key in encoder)  # as loaded
    head = [key for key in warmed if key.startswith("cls.") and key in final]
    assert head and all(not torch.equal(warmed[key], final[key]) for key in head if "bias" in key)
    assert any(not torch.equal(final[key], start[key]) for key in encoder)  # then everything trains


def test_held_out_text_never_reaches_training(bert: Path, text_file: Path, tmp_path: Path) -> None:
    from bertforge.data.loader import PretrainingDataset

    adapt(bert, text_file, tmp_path / "run", max_steps=1, line_by_line=True, **{**QUIET, "validation_fraction": 0.2})
    tokenizer = BertTokenizer.from_pretrained(bert)

    def lines(split: str) -> set[str]:
        dataset = PretrainingDataset(tmp_path / "run" / "data", split)
        found = set()
        for index in range(len(dataset)):
            item = dataset[index]
            ids = np.array(item["input_ids"])
            if "mask_positions" in item:  # the held-out split is masked once: put the pieces back
                ids[item["mask_positions"]] = item["mask_targets"]
            found.add(tokenizer.decode(ids.tolist()))
        return found

    train, held_out = lines("train"), lines("valid")
    assert len(held_out) >= 40 and len(train) >= 250  # about a fifth held out, by blocks of lines
    assert not train & held_out
    every = tokenizer.encode_batch(numbered_lines(400))["input_ids"]
    assert train | held_out == {tokenizer.decode(ids) for ids in every}


def test_a_time_budget_ends_the_run_and_its_schedule(bert: Path, text_file: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]

    def clock() -> float:  # each reading moves the clock 3 s: a step (two readings) costs 6 s
        now[0] += 3.0
        return now[0]

    monkeypatch.setattr(loop_module, "clock", clock)
    result = adapt(bert, text_file, tmp_path / "run", budget_minutes=0.5, lr=1e-3, warmup_ratio=0.2, log_every=1,
                   **QUIET)
    assert 4 <= result.steps <= 6  # 30 s at 6 s a step, give or take the clock readings of the first and last
    records = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
               if r.get("split") == "train"]
    assert records[-1]["step"] == result.steps
    rates = [r["lr"] for r in records]
    assert max(rates) <= 1e-3 and rates[-1] < 0.5e-3  # warmed up, then decayed towards zero by the end


def test_resume_lock_and_refusals(bert: Path, text_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = adapt(bert, text_file, out, max_steps=2, save_every=1, **QUIET)
    said: list[str] = []
    rerun = adapt(bert, text_file, out, max_steps=2, save_every=1, echo=said.append, **QUIET)
    assert rerun.after == first.after and rerun.steps == 2  # the same command again: reused, not an error
    assert any("already adapted with these settings" in line for line in said), said
    with pytest.raises(FileExistsError, match="--resume"):  # other settings, not resumed: refused
        adapt(bert, text_file, out, max_steps=3, save_every=1, **QUIET)
    again = adapt(bert, text_file, out, max_steps=2, save_every=1, resume=True, **QUIET)
    assert again.after == first.after and again.steps == 2  # a finished run is reused, not retrained
    with pytest.raises(Exception, match="other options"):  # other text settings: the data differs
        adapt(bert, text_file, out, max_steps=2, save_every=1, resume=True, **{**QUIET, "max_seq_length": 64})
    with pytest.raises(ValueError, match="lr"):  # another rate: the run's settings differ
        adapt(bert, text_file, out, max_steps=2, save_every=1, resume=True, lr=5e-4, **QUIET)
    assert "lr: 0.0001" in (out / "adapt_config.yaml").read_text()  # the refused settings were not recorded
    with run_lock(out, what="test"), pytest.raises(RunLockedError):
        adapt(bert, text_file, out, max_steps=2, resume=True, **QUIET)


def test_tables_are_read_by_their_text_column_and_labels_are_ignored(bert: Path, tmp_path: Path) -> None:
    table = tmp_path / "train.csv"
    table.write_text("label,review\n" + "".join(f'{i % 2},"{line}"\n' for i, line in enumerate(numbered_lines(200))),
                     encoding="utf-8")
    result = adapt(bert, table, tmp_path / "run", max_steps=1, text_column="review", **QUIET)
    stats = json.loads((tmp_path / "run" / "data" / "stats.json").read_text())
    assert stats["documents"] == 200 and result.steps == 1


def test_bad_text_files_get_one_line_and_exit_2(bert: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    table = tmp_path / "train.csv"
    table.write_text("label,sentence\n1,good\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    records = tmp_path / "reviews.jsonl"
    records.write_text('{"review": "a fine film"}\n{"review": "dull"}\n', encoding="utf-8")
    cases = {
        "no column 'text'": ["--input", str(table)],
        "reviews.jsonl:1 (no field 'text'": ["--input", str(records)],
        "no text to prepare": ["--input", str(empty)],
        "no such file or directory": ["--input", str(tmp_path / "missing.txt")],
    }
    for message, arguments in cases.items():
        result = runner.invoke(app, ["adapt", "--model", str(bert), *arguments, "--out", str(tmp_path / "run"),
                                     "--max-steps", "1", "--quiet"])
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["adapt", "--model", str(tmp_path / "nowhere"), "--input", str(table),
                                 "--out", str(tmp_path / "run2")])
    assert result.exit_code == 2 and "no such model directory" in result.output


def test_the_command_line_adapts_and_reports(bert: Path, text_file: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["adapt", "--model", str(bert), "--input", str(text_file), "--out",
                                      str(tmp_path / "run"), "--max-steps", "2", "--max-seq-length", "32",
                                      "--batch-size", "4", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "before: masked-LM accuracy" in result.output and "after:" in result.output
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "adapt_config.yaml").is_file()


def test_finetune_adapts_on_the_training_file_s_own_text_first(bert: Path, tmp_path: Path) -> None:
    from bertforge.finetune import finetune

    lines = numbered_lines(120)
    for name, rows in (("train.csv", lines[:100]), ("dev.csv", lines[100:])):
        (tmp_path / name).write_text("text,label\n" + "".join(f"{line},{'pos' if 'alpha' in line else 'neg'}\n"
                                                             for line in rows), encoding="utf-8")
    settings = {"task_settings": {"train": str(tmp_path / "train.csv"), "dev": str(tmp_path / "dev.csv")},
                "epochs": 1, "batch_size": 8, "max_length": 32, "progress": False, "verbose": False,
                "adapt_on": "train", "adapt_epochs": 1}
    results = finetune("classify", None, bert, None, tmp_path / "out", **settings)
    adapted = tmp_path / "out" / "adapted"
    assert (adapted / "final" / "config.json").is_file() and results["seeds"][0]["metrics"]
    text = (tmp_path / "out" / "adapt-text.txt").read_text(encoding="utf-8").splitlines()
    assert text == lines[:100]  # the training file's text, its labels left out, the dev file unread
    record = json.loads((tmp_path / "out" / "seed-1" / "task.json").read_text())
    assert record["source_model"] == str(adapted / "final")
    again = finetune("classify", None, bert, None, tmp_path / "out", **settings)  # reused: nothing retrained
    assert again["seeds"][0]["metrics"] == results["seeds"][0]["metrics"]


def test_whole_words_follow_each_vocabulary_s_own_marks() -> None:
    wordpiece = {"[PAD]": 0, "[CLS]": 1, "play": 2, "##ing": 3, "the": 4}
    assert continuation_flags(wordpiece, 5).tolist() == [False, False, False, True, False]
    bpe = {"<s>": 0, "</s>": 1, "\u0120play": 2, "ing": 3, "\u0120the": 4, "\u0120a": 5}
    assert continuation_flags(bpe, 6, (0, 1)).tolist() == [False, False, False, True, False, False]
    sentencepiece = {"<pad>": 0, "\u2581play": 1, "ing": 2, "\u2581the": 3}
    assert continuation_flags(sentencepiece, 4, (0,)).tolist() == [False, False, True, False]


def test_example_texts_take_every_task_s_text_and_no_label() -> None:
    from bertforge.tasks.classify import ClassifyExample
    from bertforge.tasks.ner import NerSentence

    examples = [ClassifyExample("a fine film", "with a pair", label="pos"),
                ClassifyExample("a fine film", None, label="neg"),
                NerSentence("s-1", ["Anna", "met", "Bob"], ["B-PER", "O", "B-PER"], [], [], 0)]
    assert example_texts(examples) == ["a fine film", "with a pair", "Anna met Bob"]


def test_from_scratch_on_a_table_with_a_time_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tokenizer train, prepare and pretrain read the same table by its text column; with minutes instead
    of steps the run trains without dropout, and the saved model keeps its rates for fine-tuning."""
    table = tmp_path / "reviews.tsv"
    table.write_text("label\treview\n" + "".join(f"{i % 2}\t{line}\n" for i, line in enumerate(numbered_lines(300))),
                     encoding="utf-8")
    runner = CliRunner()
    done = runner.invoke(app, ["tokenizer", "train", "--input", str(table), "--text-column", "review",
                               "--out", str(tmp_path / "vocab"), "--vocab-size", "120", "--min-frequency", "1"])
    assert done.exit_code == 0, done.output
    vocab = (tmp_path / "vocab" / "vocab.txt").read_text(encoding="utf-8").split()
    assert "bravo" in vocab and "label" not in vocab and "review" not in vocab  # the column, not the header
    done = runner.invoke(app, ["prepare", "--input", str(table), "--text-column", "review", "--tokenizer",
                               str(tmp_path / "vocab"), "--out", str(tmp_path / "data"), "--objective", "none",
                               "--masking", "dynamic", "--max-seq-length", "32", "--quiet"])
    assert done.exit_code == 0, done.output
    now = [0.0]

    def clock() -> float:
        now[0] += 3.0
        return now[0]

    monkeypatch.setattr(loop_module, "clock", clock)
    done = runner.invoke(app, ["pretrain", "--config", "tiny", "--data", str(tmp_path / "data"), "--out",
                               str(tmp_path / "run"), "--budget-minutes", "0.2", "--max-steps", "1000",
                               "--batch-size", "4", "--set", "max_position_embeddings=64", "--quiet"])
    assert done.exit_code == 0, done.output
    trained = json.loads((tmp_path / "run" / "fingerprint.json").read_text())["settings"]
    assert trained["hidden_dropout_prob"] == 0.0 and trained["attention_probs_dropout_prob"] == 0.0
    saved = json.loads((tmp_path / "run" / "final" / "config.json").read_text())
    assert saved["hidden_dropout_prob"] == 0.1 and saved["attention_probs_dropout_prob"] == 0.1
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert 1 < max(steps) < 1000  # the budget ended it, not max_steps


@pytest.mark.parametrize(("family", "kind"), [("roberta", None), ("albert", "unigram")])
def test_a_family_s_own_tokenizer_and_whole_words(family: str, kind: str | None, text_file: Path,
                                                  tmp_path: Path) -> None:
    """Byte-level BPE (RoBERTa) and SentencePiece (ALBERT): the checkpoint's own files tokenize the text,
    whole words follow the vocabulary's word-start marks, and the result ships the same files."""
    import transformers

    from test_tokenizers_families import build_folder

    directory = build_folder(tmp_path / "start", family, kind)
    tokenizer = BertTokenizer.from_pretrained(directory)
    config = smallest_config(family, tokenizer)
    registry.model_class(family, "pretraining")(config).save_pretrained(directory, tokenizer=tokenizer)
    result = adapt(directory, text_file, tmp_path / "run", max_steps=2, whole_word=True, **QUIET)
    continuation = np.load(tmp_path / "run" / "data" / "continuation.npy")
    mark = "\u0120" if family == "roberta" else "\u2581"
    starts = [index for token, index in tokenizer.vocab.items() if token.startswith(mark)]
    assert continuation.any() and not continuation[starts].any()
    assert BertTokenizer.from_pretrained(result.final).vocab == tokenizer.vocab
    architecture = json.loads((result.final / "config.json").read_text())["architectures"][0]
    getattr(transformers, architecture).from_pretrained(result.final)


def test_a_run_that_crashed_resumes_from_its_last_checkpoint(bert: Path, text_file: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    real_step, calls = loop_module._Stepper.step, []

    def crashing_step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(loop_module._Stepper, "step", crashing_step)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        adapt(bert, text_file, out, max_steps=4, save_every=2, **QUIET)
    assert not (out / "final").exists() and (out / "baseline.json").is_file()
    monkeypatch.setattr(loop_module._Stepper, "step", real_step)
    result = adapt(bert, text_file, out, max_steps=4, save_every=2, resume=True, **QUIET)
    assert result.steps == 4 and (out / "final" / "model.safetensors").is_file()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and max(steps) == 4  # the resumed run's records follow the checkpoint's


def test_finetune_adapt_on_a_named_file_from_the_command_line(bert: Path, text_file: Path, tmp_path: Path) -> None:
    lines = numbered_lines(60)
    for name, rows in (("train.csv", lines[:40]), ("dev.csv", lines[40:])):
        (tmp_path / name).write_text("text,label\n" + "".join(f"{line},{'pos' if 'alpha' in line else 'neg'}\n"
                                                             for line in rows), encoding="utf-8")
    train, dev = str(tmp_path / "train.csv"), str(tmp_path / "dev.csv")
    result = CliRunner().invoke(app, ["finetune", "classify", "--model", str(bert), "--train", train, "--dev", dev,
                                      "--out", str(tmp_path / "out"), "--epochs",
                                      "1", "--max-length", "32", "--adapt-on", str(text_file), "--adapt-epochs", "1"])
    assert result.exit_code == 0, result.output
    adapted = json.loads((tmp_path / "out" / "adapted" / "results.json").read_text())
    assert adapted["settings"]["inputs"] == [str(text_file)] and adapted["steps"] >= 1
    assert "adapt_on" in (tmp_path / "out" / "run_config.yaml").read_text()
    assert f"model: {bert}" in (tmp_path / "out" / "run_config.yaml").read_text()  # the model it started from


def test_a_refused_run_leaves_nothing_behind_and_the_fixed_rerun_starts_clean(bert: Path, tmp_path: Path) -> None:
    """A row that is not UTF-8 in a table stops the run naming its file and line; what the run had
    made in --out (its config, half-prepared data) is removed, so the same command after the fix
    trains instead of meeting data "prepared with other inputs"."""
    from bertforge.data.records import RecordError

    lines = numbered_lines(200)
    table = tmp_path / "reviews.csv"
    table.write_bytes(("text\n" + "".join(line + "\n" for line in lines[:5])).encode() + b"caf\xe9 au lait\n"
                      + "".join(line + "\n" for line in lines[5:]).encode())
    out = tmp_path / "run"
    with pytest.raises(RecordError, match=r"reviews\.csv:7: not UTF-8"):
        adapt(bert, table, out, max_steps=1, **QUIET)
    assert not out.exists()
    table.write_text("text\n" + "".join(line + "\n" for line in lines), encoding="utf-8")
    assert adapt(bert, table, out, max_steps=1, **QUIET).steps == 1
    kept = tmp_path / "kept"  # an --out that held something before: only what the run made goes
    kept.mkdir()
    (kept / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(ValueError, match="no such file"):
        adapt(bert, tmp_path / "missing.txt", kept, max_steps=1, **QUIET)
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]


def test_a_line_that_is_not_utf8_in_a_text_file_is_skipped_and_said(bert: Path, tmp_path: Path) -> None:
    lines = numbered_lines(200)
    text = tmp_path / "notes.txt"
    text.write_bytes(("\n".join(lines[:5]) + "\n").encode() + b"caf\xe9 au lait\n" + ("\n".join(lines[5:]) + "\n").encode())
    said: list[str] = []
    result = adapt(bert, text, tmp_path / "run", max_steps=1, echo=said.append, **QUIET)
    assert result.steps == 1
    assert any("skipped 1 line(s) with bytes that are not UTF-8" in line and "notes.txt:6" in line
               for line in said), said


def test_adapting_a_sentence_transformers_model_keeps_its_modules_length_and_prompts(tmp_path: Path,
                                                                                       text_file: Path) -> None:
    """final/ of an adapted sentence-transformers model is one still: sentence-transformers itself
    (the oracle) loads it with the source's pooling, normalisation, length and prompts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    from tests.tiny_models import save_tiny_encoder

    encoder = save_tiny_encoder(tmp_path, " ".join(numbered_lines(60)), vocab_size=120)
    body = Transformer(str(encoder), max_seq_length=24)
    source = SentenceTransformer(modules=[body, Pooling(body.get_embedding_dimension(), pooling_mode="cls"), Normalize()],
                                 prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name="query",
                                 device="cpu")
    source.save(str(tmp_path / "st"))
    said: list[str] = []
    result = adapt(tmp_path / "st", text_file, tmp_path / "run", max_steps=1, echo=said.append, **QUIET)
    assert (result.final / "modules.json").is_file() and any("modules.json" in line for line in said)
    adapted = SentenceTransformer(str(result.final), device="cpu")
    assert adapted.max_seq_length == 24 and adapted.prompts == source.prompts
    assert adapted.default_prompt_name == "query"
    assert [type(m).__name__ for m in adapted] == ["Transformer", "Pooling", "Normalize"]
    assert adapted[1].get_config_dict()["pooling_mode"] == "cls"
    vector = adapted.encode(["line alpha bravo says the charlie went home ."])
    assert np.allclose(np.linalg.norm(vector, axis=1), 1.0, atol=1e-5)
