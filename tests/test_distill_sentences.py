"""Sentence distillation (`bertforge distill sentences`): a teacher's sentence vectors taught to a
student of another vocabulary, on a file of unlabelled text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.distill import build_recipe, distill
from bertforge.distill.losses import sentence_vector_loss
from bertforge.distill.sentences import read_texts, split_texts
from bertforge.model.base import mean_of_real_tokens as mean_pool
from bertforge.tokenizer import BertTokenizer
from bertforge.train import loop as loop_module
from tests.tiny_models import save_tiny_encoder

WORDS = ("the film is warm and funny", "a dull and tired story", "great acting , great music",
         "the plot goes nowhere", "a small gem of a movie", "boring , long and loud")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sentences")
    teacher = save_tiny_encoder(root, " ".join(WORDS), num_layers=2)
    texts = root / "texts.txt"
    n = len(WORDS)
    lines = [f"{WORDS[i % n]} {WORDS[i // n % n]} {WORDS[i // n // n]}" for i in range(120)]  # all distinct
    texts.write_text("\n".join(lines[:60]) + "\n\n" + "\n".join(lines[60:]) + "\n", encoding="utf-8")
    # the student's own vocabulary: another size, trained on the same words
    vocabulary = BertTokenizer.train([texts], vocab_size=80, min_frequency=1, show_progress=False)
    vocabulary.save_pretrained(root / "student-tok")
    config = root / "student.json"
    config.write_text(json.dumps({"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 32,
                                  "max_position_embeddings": 64}), encoding="utf-8")
    return {"root": root, "teacher": teacher, "texts": texts, "tokenizer": root / "student-tok", "config": config}


def options(setup: dict[str, Path], **extra) -> dict:
    return {"teacher": str(setup["teacher"]), "student": str(setup["config"]), "tokenizer": str(setup["tokenizer"]),
            "data": str(setup["texts"]), "max_length": 32, "lr": 3e-3, "batch_size": 16, "progress": False,
            "heldout_texts": 20, **extra}


def test_sentence_vector_loss_and_mean_pool_by_hand() -> None:
    student = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    teacher = torch.tensor([[2.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    # 1 - cos per row: 0 (same direction), 1 (orthogonal), 0 (same direction) -> mean 1/3
    assert sentence_vector_loss(student, teacher).item() == pytest.approx(1 / 3)
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # (1, 3, 2), the last token padding
    assert mean_pool(hidden, torch.tensor([[1, 1, 0]])).tolist() == [[2.0, 3.0]]


def test_texts_are_read_blank_lines_skipped_and_held_out_apart(setup: dict[str, Path]) -> None:
    texts, blank = read_texts(setup["texts"])
    assert len(texts) == 120 and blank == 1
    train, heldout = split_texts(texts, 20, None)
    assert len(heldout) == 20 and len(train) == 100
    assert split_texts(texts, 20, None) == (train, heldout)  # a fixed choice
    sample_train, sample_heldout = split_texts(texts, 500, 50)
    assert len(sample_train) + len(sample_heldout) == 50 and len(sample_heldout) == 10  # a fifth at most
    # a text written twice is one text: it is never both held out and trained on
    repeated_train, repeated_heldout = split_texts(texts + texts[:60], 20, None)
    assert len(repeated_train) == 100 and not set(repeated_train) & set(repeated_heldout)


def test_a_student_with_its_own_vocabulary_learns_the_teacher_s_vectors(setup: dict[str, Path],
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "run"
    results = distill(build_recipe("sentences", options=options(setup, max_steps=60)), out, verbose=False)
    assert results["steps"] == 60 and results["texts"] == {"train": 100, "heldout": 20, "blank_skipped": 1,
                                                                 "repeats_dropped": 0}
    before, after = results["start_metrics"]["cosine"], results["final_metrics"]["cosine"]
    assert after > before + 0.2 and after > 0.5, (before, after)
    # the held-out texts never reached training: the features the loop read are the training texts'
    texts, _ = read_texts(setup["texts"])
    train, heldout = split_texts(texts, 20, None)
    assert not set(heldout) & set(train)
    # the student is its own vocabulary's encoder, loadable by transformers, the projection left out
    student = transformers.AutoModel.from_pretrained(out / "final")
    assert student.config.vocab_size == BertTokenizer.from_pretrained(setup["tokenizer"]).vocab_size
    assert student.config.hidden_size == 16
    assert (out / "final" / "README.md").is_file() and (out / "teacher_vectors.npy").is_file()
    # the same command again continues nothing and gives the same results; other settings are refused
    again = distill(build_recipe("sentences", options=options(setup, max_steps=60)), out, verbose=False)
    assert again["final_metrics"] == results["final_metrics"]
    with pytest.raises(ValueError, match="max_steps 60 -> 61"):
        distill(build_recipe("sentences", options=options(setup, max_steps=61)), out, verbose=False)


def test_the_teacher_encodes_at_the_precision_asked(setup: dict[str, Path], tmp_path: Path) -> None:
    import numpy as np

    vectors = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        results = distill(build_recipe("sentences", options=options(setup, max_steps=1, teacher_precision=precision)),
                          out, verbose=False)
        assert results["teacher_precision"] == precision
        vectors[precision] = np.load(out / "teacher_vectors.npy", allow_pickle=False)
    # bf16 rounds the teacher's weights and activations: the same directions, not the same numbers
    agreement = (vectors["fp32"] * vectors["bf16"]).sum(axis=1)
    assert agreement.min() > 0.99 and not np.array_equal(vectors["fp32"], vectors["bf16"])
    with pytest.raises(ValueError, match="teacher_precision 'fp16' is not one of"):
        build_recipe("sentences", options=options(setup, teacher_precision="fp16"))


def test_a_time_budget_ends_the_run(setup: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]

    def clock() -> float:  # each reading moves the clock 3 s: a step (two readings) costs 6 s
        now[0] += 3.0
        return now[0]

    monkeypatch.setattr(loop_module, "clock", clock)
    results = distill(build_recipe("sentences", options=options(setup, budget_minutes=0.5)), tmp_path / "run",
                      verbose=False)
    assert 4 <= results["steps"] <= 6  # 30 s at 6 s a step


def test_command_line_and_bad_input(setup: dict[str, Path], tmp_path: Path) -> None:
    common = ["--teacher", str(setup["teacher"]), "--student", str(setup["config"]), "--tokenizer",
              str(setup["tokenizer"]), "--max-length", "32", "--quiet"]
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["distill", "sentences", *common, "--data", str(setup["texts"]),
                                      "--max-steps", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "texts trained on" in result.output and (out / "final" / "config.json").is_file()

    table = tmp_path / "reviews.csv"
    table.write_text("review,label\ngood film,1\nbad film,0\n", encoding="utf-8")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n", encoding="utf-8")
    cases = [
        (["--data", str(table)], f"{table}:2: text: no such column"),  # the default column, at the first row
        (["--data", str(blank)], f"{blank}"),
    ]
    for args, named in cases:
        bad_out = tmp_path / "bad"
        refused = CliRunner().invoke(app, ["distill", "sentences", *common, *args, "--max-steps", "2",
                                           "--out", str(bad_out)])
        errors = [line for line in refused.output.splitlines() if line.startswith("error:")]
        assert refused.exit_code == 2 and len(errors) == 1 and named in errors[0], refused.output
        assert not bad_out.exists()
    # a checkpoint student brings its own vocabulary
    refused = CliRunner().invoke(app, ["distill", "sentences", "--teacher", str(setup["teacher"]), "--student",
                                       str(setup["teacher"]), "--tokenizer", str(setup["tokenizer"]), "--data",
                                       str(setup["texts"]), "--max-steps", "2", "--quiet", "--out",
                                       str(tmp_path / "bad2")])
    assert refused.exit_code == 2 and "brings its own vocabulary" in refused.output, refused.output
