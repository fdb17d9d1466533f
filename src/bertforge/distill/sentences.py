"""Sentence distillation: a sentence encoder teaches a student its sentence vectors on unlabelled text.

    from bertforge.distill import build_recipe, distill
    recipe = build_recipe("sentences", options={"teacher": "models/minilm", "student": "tiny",
                                                "tokenizer": "runs/tok", "data": "reviews.txt",
                                                "budget_minutes": 3, "lr": 1e-3})
    distill(recipe, "runs/tiny-reviews")   # -> runs/tiny-reviews/final/: an encoder for `finetune`

The teacher (any encoder bertforge loads; pooled as its sentence-transformers files say, else by the
mean, unit length) encodes every text of the file once, before training. The student (a preset or
config.json with random weights in the vocabulary of `tokenizer`, or a checkpoint with its own) then
learns to give the same vectors: the mean of its last layer, mapped to the teacher's width by one
Linear, trained towards the teacher's vector by 1 - cosine (Reimers & Gurevych 2020, who distil a
teacher's sentence vectors into a student with other tokens). The two models never need the same
vocabulary, only the same texts, so a tokenizer trained on the user's own text works.

Why: masked LM on a few million tokens does not give a from-scratch encoder features worth more than
random weights (docs/research/research-log-2026-11-27.md); a released sentence encoder's vectors on the task's
own unlabelled text do, in minutes (docs/results-pretraining.md). What the student learns is the
teacher's, so its quality is bounded by the teacher's on that text.

A fixed random `heldout_texts` of the texts is never trained on; the student's mean cosine with the
teacher on them is scored before and after (`start_metrics.json`, `results.json`). The teacher's
vectors are kept in OUT/teacher_vectors.npy, so a resumed run does not encode again. OUT/final/ is
the student alone (the projection is dropped), in its family's Hugging Face layout with its tokenizer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.distill.cards import write_student_cards
from bertforge.distill.recipe import DistillRecipe
from bertforge.distill.run import (
    FINAL_DIR,
    RESULTS_FILE,
    RUN_SUBDIR,
    TEACHER_VECTORS,
    check_model_dir,
    open_run,
    parameter_count,
    run_settings,
    say,
    start_metrics,
    student_path,
    write_json,
)
from bertforge.fileio import DataFormatError, atomic_path, run_lock
from bertforge.hub import local_or_hub
from bertforge.precision import choose_precision
from bertforge.tasks.base import Feature, TaskBatches, collate
from bertforge.train.config import TrainConfig
from bertforge.train.rundir import directory_input, file_input

DEFAULT_MAX_LENGTH = 128  # pieces per text, for the teacher and the student alike
ENCODE_CHUNK = 2048  # texts per call to the teacher's pipeline (a progress line each)
SPLIT_SEED = 0  # the held-out choice and the `max_texts` sample do not move with the training seed


def read_texts(path: str | Path, column: str = "text") -> tuple[list[str], int]:
    """The texts of `path` (`bertforge.tables`: a .txt file one a line, a table's `column`), and how many
    were blank and skipped. A cell that is not text is a `DataFormatError` naming the file, line and
    column; a file with no text at all is one too."""
    from bertforge.tables import iter_rows
    from bertforge.vectorindex import row_text

    path = Path(path)
    texts, blank = [], 0
    for row in iter_rows(path, [column]):
        text = row_text(path, row, column).strip()
        if text:
            texts.append(text)
        else:
            blank += 1
    if not texts:
        raise DataFormatError(path, None, column, "no text to learn from: every row is blank")
    return texts, blank


def split_texts(texts: Sequence[str], heldout: int, max_texts: int | None) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts) of the distinct texts: a fixed random order, cut to `max_texts`,
    the first `heldout` of it held out (at most a fifth, so a small file still trains). Repeats are
    dropped first, so no held-out text is also trained on."""
    texts = list(dict.fromkeys(texts))
    order = np.random.default_rng(SPLIT_SEED).permutation(len(texts))
    if max_texts:
        order = order[:max_texts]
    held = min(heldout, len(order) // 5)
    chosen = [texts[i] for i in order.tolist()]
    return chosen[held:], chosen[:held]


def teacher_vectors(teacher_dir: Path, texts: Sequence[str], cache: Path, *, max_length: int, batch_size: int,
                    device: str | None, verbose: bool, precision: str = "fp32") -> np.ndarray:
    """(len(texts), D) float32 unit vectors from the teacher, read back from `cache` when it holds as
    many rows (the run record has checked that the teacher and the file are the same)."""
    if cache.is_file():
        vectors = np.load(cache, allow_pickle=False)
        if vectors.ndim == 2 and len(vectors) == len(texts):
            return vectors
    from bertforge.vectorindex import Embedder

    embedder = Embedder.open(teacher_dir, batch_size=batch_size, device=device, max_length=max_length,
                             precision=precision)
    started, chunks = time.perf_counter(), []
    for start in range(0, len(texts), ENCODE_CHUNK):
        chunks.append(embedder(texts[start:start + ENCODE_CHUNK]))
        done = min(start + ENCODE_CHUNK, len(texts))
        say(f"teacher: {done:,} of {len(texts):,} texts encoded ({time.perf_counter() - started:.0f} s)", verbose)
    vectors = np.concatenate(chunks).astype(np.float32)
    with atomic_path(cache) as staging, open(staging, "wb") as handle:
        np.save(handle, vectors, allow_pickle=False)
    return vectors


def build_sentence_student(recipe: DistillRecipe, teacher_dir: Path) -> tuple[Any, Any, str, Path | None]:
    """(student encoder, its tokenizer, how it was made, its checkpoint directory or None)."""
    from bertforge.model.auto import load_for_job
    from bertforge.model.registry import model_class, resolve_config
    from bertforge.tokenizer import BertTokenizer

    if recipe.student is None:
        raise ValueError("no student: give --student (a preset, a config.json or a checkpoint directory)")
    spec = student_path(recipe.student)
    if spec.is_dir():
        check_model_dir(spec, "student")
        if recipe.tokenizer is not None:
            raise ValueError(f"{spec}: a checkpoint student brings its own vocabulary; --tokenizer is for a preset "
                             "or config.json student")
        return load_for_job(spec, "embeddings"), BertTokenizer.from_pretrained(spec), str(spec), spec
    vocabulary = Path(recipe.tokenizer) if recipe.tokenizer is not None else teacher_dir
    if not vocabulary.is_dir():
        raise FileNotFoundError(f"{vocabulary}: no such tokenizer directory (--tokenizer)")
    tokenizer = BertTokenizer.from_pretrained(vocabulary)
    config = resolve_config(recipe.student)  # a preset or a config.json; a bad name fails in one line
    config = config.with_overrides(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id or 0)
    return model_class(config.model_type, "embeddings")(config), tokenizer, recipe.student, None


def text_features(texts: Sequence[str], vectors: np.ndarray, tokenizer: Any, max_length: int) -> list[Feature]:
    """One feature a text: its pieces in the student's vocabulary, the teacher's vector as `labels`."""
    ids = tokenizer(list(texts), truncation=True, max_length=max_length)["input_ids"]
    return [Feature(inputs={"input_ids": row, "token_type_ids": [0] * len(row), "labels": vector.tolist()},
                    example=index) for index, (row, vector) in enumerate(zip(ids, vectors, strict=True))]


def agreement(features: Sequence[Feature], pad_id: int, batch_size: int) -> Any:
    """evaluate(model) -> {"cosine": the mean cosine of the student's mapped vectors with the teacher's}."""
    def evaluate(model: Any) -> dict[str, float]:
        device = next(model.parameters()).device
        total = 0.0
        for start in range(0, len(features), batch_size):
            chunk = features[start:start + batch_size]
            batch = {key: value.to(device) for key, value in collate(chunk, pad_id).items()}
            total += float(model(**batch).parts["cosine"]) * len(chunk)
        return {"cosine": total / len(features)}

    return evaluate


def _steps(recipe: DistillRecipe, batches_per_epoch: int) -> int:
    """max_steps as given; with a time budget a ceiling the budget ends first; else `epochs` of batches."""
    loop = recipe.train
    if loop.max_steps:
        return loop.max_steps
    if loop.budget_minutes:
        return 10**9
    return max(1, int(np.ceil(loop.epochs * batches_per_epoch)))


def distill_sentences(recipe: DistillRecipe, out_dir: str | Path, *, verbose: bool = True,
                      overwrite: bool = False) -> dict[str, Any]:
    """Teach a student the teacher's sentence vectors (see the module docstring); OUT/final/ is the
    student. Returns results.json's content."""
    import torch

    from bertforge.distill.losses import SentenceDistiller
    from bertforge.train import train
    from bertforge.train.state import latest_checkpoint, seed_everything

    started = time.perf_counter()
    out_dir, loop = Path(out_dir), recipe.train
    if recipe.teacher is None or recipe.data is None:
        raise ValueError("sentence distillation needs --teacher (a sentence encoder) and --data (a file of texts)")
    teacher_dir, data = local_or_hub(recipe.teacher), Path(recipe.data)
    check_model_dir(teacher_dir, "teacher")
    texts, blank = read_texts(data, recipe.text_column)
    train_texts, heldout_texts = split_texts(texts, loop.heldout_texts, loop.max_texts)
    max_length = loop.max_length or DEFAULT_MAX_LENGTH
    seed_everything(loop.seed)
    student, tokenizer, student_from, student_dir = build_sentence_student(recipe, teacher_dir)
    if student.config.max_tokens < max_length:
        raise ValueError(f"max_length {max_length} is more than the student's {student.config.max_tokens} positions")

    inputs = [directory_input("teacher", teacher_dir), file_input("data", data)]
    if student_dir is not None:
        inputs.append(directory_input("student", student_dir))
    if recipe.tokenizer is not None:
        inputs.append(directory_input("tokenizer", recipe.tokenizer, ("vocab.txt", "tokenizer.json", "*.model")))
    with run_lock(out_dir, what="distillation run"):
        open_run(out_dir, recipe, run_settings(recipe, None), inputs, overwrite, mode="sentences")
        teacher_started = time.perf_counter()
        vectors = teacher_vectors(teacher_dir, train_texts + heldout_texts, out_dir / TEACHER_VECTORS,
                                  max_length=max_length, batch_size=loop.eval_batch_size, device=loop.device,
                                  verbose=verbose, precision=recipe.teacher_precision)
        teacher_seconds = time.perf_counter() - teacher_started
        features = text_features(train_texts + heldout_texts, vectors, tokenizer, max_length)
        train_features, heldout = features[:len(train_texts)], features[len(train_texts):]
        model = SentenceDistiller(student, vectors.shape[1])
        pad_id = tokenizer.pad_token_id or 0
        batches = TaskBatches(train_features, loop.batch_size, seed=loop.seed, pad_id=pad_id)
        evaluate = agreement(heldout, pad_id, loop.eval_batch_size) if heldout else None
        run_dir = out_dir / RUN_SUBDIR
        fresh = latest_checkpoint(run_dir) is None
        start = start_metrics(out_dir, fresh, lambda: evaluate(model)) if evaluate is not None else {}
        config = TrainConfig(max_steps=_steps(recipe, len(batches)), budget_minutes=loop.budget_minutes,
                             seed=loop.seed, precision=loop.precision, device=loop.device,
                             max_grad_norm=loop.max_grad_norm, eval_every=loop.eval_every_steps,
                             save_every=loop.save_every_steps, save_every_minutes=loop.save_every_minutes,
                             keep_last=loop.keep_last, log_every=50, progress=loop.progress)
        length = f"{loop.budget_minutes:g} minutes" if loop.budget_minutes and not loop.max_steps \
            else f"{config.max_steps:,} steps"
        say(f"sentence distillation on {len(train_texts):,} texts of {data} ({len(heldout):,} held out): teacher "
            f"vectors of width {vectors.shape[1]}, student {parameter_count(student):,} parameters ({student_from}); "
            f"{length} -> {out_dir}", verbose)
        result = train(model, batches, run_dir, config, recipe.optim, evaluate=evaluate, resume=True)
        with torch.no_grad():
            final = evaluate(model.eval()) if evaluate is not None else {}
            student.save_pretrained(out_dir / FINAL_DIR, tokenizer=tokenizer)
        results = {
            "mode": "sentences", "teacher": str(teacher_dir), "data": str(data), "student": student_from,
            "texts": {"train": len(train_texts), "heldout": len(heldout), "blank_skipped": blank,
                      "repeats_dropped": len(texts) - len(set(texts))},
            "teacher_width": int(vectors.shape[1]), "max_length": max_length,
            "parameters": {"teacher": _teacher_size(teacher_dir), "student": parameter_count(student)},
            "steps": result.step, "start_metrics": start, "final_metrics": final, "final": FINAL_DIR,
            "teacher_seconds": round(teacher_seconds, 1),
            "teacher_precision": choose_precision(recipe.teacher_precision, device=loop.device or "cpu"),
            "wall_s": round(time.perf_counter() - started, 1),
        }
        write_json(out_dir / RESULTS_FILE, results)
        write_student_cards([out_dir / FINAL_DIR], recipe, results)
        return results


def _teacher_size(teacher_dir: Path) -> int:
    """The teacher's parameter count, from its weights file's header (the model is not loaded again)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(teacher_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
                total += int(np.prod(weights.get_slice(name).get_shape()))
    return total


__all__ = ["build_sentence_student", "distill_sentences", "read_texts", "split_texts",
           "teacher_vectors", "text_features"]
