"""`bertforge distill`: task distillation from a fine-tuned teacher, general distillation on shards, resume,
bad input, and the losses themselves.

Fixtures are generated here: SST-2-like review rows with one clear signal (positive or negative
adjectives), a WordPiece vocabulary trained on their words, and a teacher fine-tuned on them from a random
two-layer encoder (32 wide), so that it is right on dev; the student is a random one-layer encoder.
General distillation reads the tiny pre-training shards of tests/test_pretrain.py.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.cli import app
from bertforge.distill import build_recipe, distill
from bertforge.distill.losses import (
    attention_loss,
    binary_soft_target_loss,
    relation_loss,
    soft_target_loss,
    uniform_layer_map,
)
from bertforge.distill.recipe import teacher_layers
from bertforge.finetune import finetune
from bertforge.tasks.base import TaskBatches
from bertforge.train import read_metrics
from test_pretrain import shards  # noqa: F401  (the module's shards fixture)
from tests.hub_server import loopback_hub_fixture  # noqa: F401  (the `loopback_hub` fixture)

POSITIVE = ["gripping", "moving", "clever", "beautiful", "warm", "funny", "tender", "bold"]
NEGATIVE = ["dull", "slow", "flat", "tedious", "messy", "bland", "clumsy", "stale"]
NOUNS = ["film", "story", "cast", "ending", "script", "movie"]


def _rows(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(["positive", "negative"])
        words = POSITIVE if label == "positive" else NEGATIVE
        rows.append((f"a {rng.choice(words)} and {rng.choice(words)} {rng.choice(NOUNS)}", label))
    return rows


def _write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f"{text},{label}\n" for text, label in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reviews(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Training and dev files, unlabelled texts, a tokenizer and a fine-tuned teacher."""
    root = tmp_path_factory.mktemp("reviews")
    corpus = root / "corpus.txt"
    corpus.write_text((" ".join(["a", "and", *POSITIVE, *NEGATIVE, *NOUNS]) + "\n") * 20, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=120, min_frequency=1, show_progress=False)
    train, dev = _write_csv(root / "train.csv", _rows(208, 1)), _write_csv(root / "dev.csv", _rows(32, 2))
    unlabelled = root / "unlabelled.txt"
    unlabelled.write_text("".join(f"{text}\n" for text, _ in _rows(32, 3)), encoding="utf-8")
    torch.manual_seed(0)
    encoder = root / "encoder"
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(encoder, tokenizer=tokenizer)
    finetune("classify", None, encoder, None, root / "teacher", epochs=10, batch_size=16, max_length=16, lr=1e-3,
             task_settings={"train": str(train), "dev": str(dev)}, progress=False, verbose=False)
    student = root / "student.json"
    BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=64).to_json_file(student)
    return {"teacher": root / "teacher" / "seed-1", "encoder": encoder, "student": student, "train": train,
            "dev": dev, "unlabelled": unlabelled, "root": root}


def _task_recipe(reviews: dict[str, Path], **settings: Any) -> Any:
    options = {"teacher": str(reviews["teacher"]), "student": str(reviews["student"]), "epochs": 6,
               "batch_size": 16, "lr": 2e-3, "progress": False, **settings}
    return build_recipe("task", options=options)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def _assert_same_weights(a: Path, b: Path) -> None:
    mine, theirs = _weights(a), _weights(b)
    assert mine.keys() == theirs.keys()
    for key in mine:
        assert torch.equal(mine[key], theirs[key]), key


# ------------------------------------------------------------------------------------------------
# the losses
# ------------------------------------------------------------------------------------------------
def test_soft_targets_are_hintons_kl_times_t_squared() -> None:
    student, teacher = torch.tensor([[1.0, 0.0, -1.0]]), torch.tensor([[2.0, 0.5, -1.0]])
    t = 2.0
    p_t, p_s = (teacher / t).softmax(-1), (student / t).softmax(-1)
    by_hand = (p_t * (p_t.log() - p_s.log())).sum() * t * t
    torch.testing.assert_close(soft_target_loss(student, teacher, t), by_hand)
    assert soft_target_loss(teacher, teacher, t).abs() < 1e-6
    # masked rows do not count: a wrong second row leaves the mean of the first
    two = soft_target_loss(torch.cat([student, -student]), torch.cat([teacher, teacher]), t, torch.tensor([1, 0]))
    torch.testing.assert_close(two, by_hand)
    assert binary_soft_target_loss(teacher, teacher, t).abs() < 1e-6
    assert binary_soft_target_loss(student, teacher, t) > 0


def test_attention_and_relation_losses_vanish_on_the_teacher_and_work_across_shapes() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    bias = (1 - mask[:, None, None, :]) * -1e4
    teacher = (torch.randn(2, 4, 4, 4) + bias).softmax(-1)  # (B, A, T, T), padded keys at 0
    student = (torch.randn(2, 2, 4, 4) + bias).softmax(-1)  # two heads only
    assert attention_loss(teacher, teacher, mask).abs() < 1e-5
    assert attention_loss(student, teacher, mask) > 0
    hidden_t, hidden_s = torch.randn(2, 4, 32), torch.randn(2, 4, 16)
    assert relation_loss(hidden_t, hidden_t, mask).abs() < 1e-5
    assert relation_loss(hidden_s, hidden_t, mask) > 0
    assert uniform_layer_map(2, 4) == [0, 2, 4] and uniform_layer_map(1, 12) == [0, 12]


def test_teacher_layer_choices() -> None:
    assert teacher_layers("2", 6) == [1, 3, 5]
    assert teacher_layers("3", 12) == [2, 5, 8, 11]
    assert teacher_layers("0,5,11", 12) == [0, 5, 11]
    for bad in ("0", "x", "3,1", "0,12"):
        with pytest.raises(ValueError, match="student_layers_from_teacher"):
            teacher_layers(bad, 12)


# ------------------------------------------------------------------------------------------------
# task distillation
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_task_distillation_moves_the_student_to_the_teacher(reviews, tmp_path: Path) -> None:
    from bertforge import pipeline

    out = tmp_path / "kd"
    recipe = _task_recipe(reviews, unlabelled=str(reviews["unlabelled"]), hidden_weight=0.5, attention_weight=0.5,
                          relation_weight=0.5, temperature=1.0, alpha=0.3)
    results = distill(recipe, out, verbose=False)
    assert results["unlabelled_examples"] == 32 and results["train_examples"] == 208
    assert results["teacher_metrics"]["accuracy"] >= 0.9  # a teacher worth copying
    start, end = results["start_metrics"], results["final_metrics"]
    assert end["agreement"] > start["agreement"] and end["agreement"] >= 0.9, (start, end)
    assert end["accuracy"] > start["accuracy"]
    losses = [r["loss"] for r in read_metrics(out / "run") if r.get("split") == "train"]
    assert losses[-1] < 0.5 * losses[0], losses
    assert results["parameters"]["student"] < 0.7 * results["parameters"]["teacher"]

    # OUT/student is an ordinary fine-tuned model directory, run by the pipeline like finetune's
    student = out / "student"
    for name in ("config.json", "model.safetensors", "vocab.txt", "task.json"):
        assert (student / name).is_file(), name
    task = json.loads((student / "task.json").read_text())
    assert task["family"] == "classify" and task["labels"] == ["negative", "positive"]
    assert task["score"] == results["best"]["score"] and task["distilled_from"] == str(reviews["teacher"])
    clf = pipeline(str(student))
    texts = ["a warm and clever film", "a dull and stale story"]
    assert [p["label"] for p in clf(texts)] == ["positive", "negative"]
    assert [p["label"] for p in pipeline(str(reviews["teacher"]))(texts)] == ["positive", "negative"]
    saved = (out / "run_config.yaml").read_text()
    assert "mode: task" in saved and "relation_weight: 0.5" in saved


def test_augmented_copies_are_labelled_by_the_teacher_and_counted_in_every_epoch(reviews, tmp_path: Path) -> None:
    recipe = _task_recipe(reviews, augment=2, epochs=3, temperature=1.0, alpha=0.3)
    results = distill(recipe, tmp_path / "kd", verbose=False)
    augmented = results["augmented_examples"]
    assert 208 < augmented <= 2 * 208  # short reviews: a few give fewer than two distinct copies
    assert results["steps"] == 3 * -(-(208 + augmented) // 16)
    assert results["final_metrics"]["agreement"] > results["start_metrics"]["agreement"]
    assert "augment: 2" in (tmp_path / "kd" / "run_config.yaml").read_text()
    # another augmentation is another run: continuing this one with it is refused, naming the setting
    with pytest.raises(ValueError, match="augment"):
        distill(_task_recipe(reviews, augment=3, epochs=1, alpha=0.5), tmp_path / "kd", verbose=False)


def test_student_from_the_teachers_layers_copies_them() -> None:
    from bertforge.distill.run import build_student
    from bertforge.model.registry import model_class

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=4, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    config.extra.update(id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1})
    teacher = model_class(config.model_type, "sequence-classification")(config)
    recipe = build_recipe("task", options={"teacher": "t", "student_layers_from_teacher": "2"})
    student, layer_map, description, _ = build_student(recipe, teacher, Path("t"), None, "sequence-classification")
    assert student.config.num_hidden_layers == 2 and layer_map == [0, 2, 4] and "[1, 3]" in description
    mine, theirs = student.transformer_layers(), teacher.transformer_layers()
    for j, i in enumerate([1, 3]):
        for (name, a), b in zip(mine[j].state_dict().items(), theirs[i].state_dict().values(), strict=True):
            assert torch.equal(a, b), name
    student_weights, teacher_weights = student.state_dict(), teacher.state_dict()
    shared = [k for k in student_weights if "layers." not in k]
    assert any("embeddings" in k for k in shared) and any("classifier" in k for k in shared)
    for key in shared:
        assert torch.equal(student_weights[key], teacher_weights[key]), key


def test_a_saved_layer_student_is_the_teachers_layers_and_head_with_its_labels(tmp_path: Path) -> None:
    from bertforge.distill.run import save_layer_student
    from bertforge.model import load_any
    from bertforge.model.registry import model_class

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    config.extra.update(id2label={"0": "neg", "1": "pos"}, label2id={"neg": 0, "pos": 1})
    teacher = model_class(config.model_type, "sequence-classification")(config)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(45)]) + "\n")
    teacher.save_pretrained(tmp_path / "teacher", tokenizer=BertTokenizer(str(vocab)))
    out = save_layer_student(tmp_path / "teacher", [0, 2], tmp_path / "student", "sequence-classification")
    student, _ = load_any(out)
    assert student.config.num_hidden_layers == 2 and student.config.extra["id2label"] == {"0": "neg", "1": "pos"}
    theirs = teacher.transformer_layers()
    for j, i in enumerate([0, 2]):
        for (name, a), b in zip(student.transformer_layers()[j].state_dict().items(), theirs[i].state_dict().values(),
                                strict=True):
            assert torch.equal(a, b), name
    assert torch.equal(student.state_dict()["classifier.weight"], teacher.state_dict()["classifier.weight"])
    assert (out / "vocab.txt").exists()
    assert save_layer_student(tmp_path / "teacher", [1], out) == out  # a folder with a model in it is kept


def test_an_interrupted_distillation_resumes_bit_exactly(reviews, tmp_path: Path, monkeypatch) -> None:
    recipe = _task_recipe(reviews, unlabelled=str(reviews["unlabelled"]), epochs=2, save_every_steps=3,
                          hidden_weight=0.5, relation_weight=0.5)
    distill(recipe, tmp_path / "straight", verbose=False)

    real_iter, fetched = TaskBatches.__iter__, []

    def dying_iter(self):
        for batch in real_iter(self):
            if len(fetched) == 4:
                raise KeyboardInterrupt("killed")
            fetched.append(1)
            yield batch

    monkeypatch.setattr(TaskBatches, "__iter__", dying_iter)
    with pytest.raises(KeyboardInterrupt):
        distill(recipe, tmp_path / "crashed", verbose=False)
    monkeypatch.setattr(TaskBatches, "__iter__", real_iter)
    assert not (tmp_path / "crashed" / "final").exists()
    assert [p.name for p in (tmp_path / "crashed" / "run" / "checkpoints").iterdir()] == ["step-000003"]
    resumed = distill(recipe, tmp_path / "crashed", verbose=False)
    straight = json.loads((tmp_path / "straight" / "results.json").read_text())
    _assert_same_weights(tmp_path / "crashed" / "final", tmp_path / "straight" / "final")
    _assert_same_weights(tmp_path / "crashed" / "student", tmp_path / "straight" / "student")
    assert resumed["final_metrics"] == straight["final_metrics"] and resumed["best"] == straight["best"]
    assert resumed["start_metrics"] == straight["start_metrics"]


def test_distill_task_command_line_with_a_generally_distilled_student(reviews, tmp_path: Path) -> None:
    """A student checkpoint with the teacher's vocabulary (here the teacher's own encoder, untrained)."""
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["distill", "task", "--teacher", str(reviews["teacher"]), "--student",
                                      str(reviews["encoder"]), "--out", str(out), "--max-steps", "4",
                                      "--batch-size", "16", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "student at end" in result.output and (out / "student" / "task.json").is_file()
    again = CliRunner().invoke(app, ["distill", "task", "--teacher", str(reviews["teacher"]), "--student",
                                     str(reviews["encoder"]), "--out", str(out), "--max-steps", "5", "--quiet"])
    assert again.exit_code == 2 and "max_steps 4 -> 5" in again.output, again.output


# ------------------------------------------------------------------------------------------------
# bad input: one line naming the file, exit 2, nothing written
# ------------------------------------------------------------------------------------------------
def _refused(args: list[str], out: Path, names: str) -> None:
    result = CliRunner().invoke(app, ["distill", "task", *args, "--out", str(out), "--max-steps", "2", "--quiet"])
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2, result.output
    assert len(errors) == 1 and names in errors[0], result.output
    assert not out.exists()


def test_bad_inputs_are_refused_before_anything_is_written(reviews, tmp_path: Path) -> None:
    teacher = reviews["teacher"]
    # a student whose vocabulary is not the teacher's
    corpus = tmp_path / "other.txt"
    corpus.write_text("entirely different words here for another vocabulary\n" * 10, encoding="utf-8")
    other = BertTokenizer.train([corpus], vocab_size=60, min_frequency=1, show_progress=False)
    stranger = tmp_path / "stranger"
    BertModel(BertConfig(vocab_size=other.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=64)).save_pretrained(stranger, tokenizer=other)
    _refused(["--teacher", str(teacher), "--student", str(stranger)], tmp_path / "o1", str(stranger / "vocab.txt"))
    # a teacher that was never fine-tuned: no task.json
    _refused(["--teacher", str(reviews["encoder"]), "--student", "tiny"], tmp_path / "o2",
             str(reviews["encoder"] / "task.json"))
    # a task.json beside a bare encoder: no trained head
    headless = tmp_path / "headless"
    shutil.copytree(reviews["encoder"], headless)
    shutil.copy(teacher / "task.json", headless / "task.json")
    _refused(["--teacher", str(headless), "--student", "tiny"], tmp_path / "o3", str(headless / "model.safetensors"))
    # no teacher at all
    _refused(["--teacher", str(tmp_path / "nowhere"), "--student", "tiny"], tmp_path / "o4", str(tmp_path / "nowhere"))


# ------------------------------------------------------------------------------------------------
# token classification
# ------------------------------------------------------------------------------------------------
SENTENCES = [
    (["anna", "smith", "flew", "from", "paris", "to", "rome", "."], ["B-PER", "I-PER", "O", "O", "B-LOC", "O", "B-LOC", "O"]),
    (["bob", "met", "maria", "in", "madrid", "."], ["B-PER", "O", "B-PER", "O", "B-LOC", "O"]),
    (["john", "lives", "in", "berlin", "."], ["B-PER", "O", "O", "B-LOC", "O"]),
]


def test_token_classification_teacher_distils_with_unlabelled_sentences(tmp_path: Path) -> None:
    from bertforge import pipeline

    words = sorted({w for tokens, _ in SENTENCES for w in tokens})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((" ".join(words) + "\n") * 10, encoding="utf-8")
    tokenizer = BertTokenizer.train([corpus], vocab_size=80, min_frequency=1, show_progress=False)
    torch.manual_seed(0)
    encoder = tmp_path / "encoder"
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(encoder, tokenizer=tokenizer)
    columns = tmp_path / "train.conll"
    columns.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(tokens, tags, strict=True)) + "\n"
                               for tokens, tags in SENTENCES * 4), encoding="utf-8")
    finetune("tag", None, encoder, None, tmp_path / "teacher", epochs=6, batch_size=4, max_length=16, lr=2e-3,
             task_settings={"train": str(columns), "dev": str(columns)}, progress=False, verbose=False)
    unlabelled = tmp_path / "words.txt"
    unlabelled.write_text("maria flew to rome .\nanna lives in paris .\n", encoding="utf-8")
    recipe = build_recipe("task", options={"teacher": str(tmp_path / "teacher" / "seed-1"), "student": "tiny",
                                           "unlabelled": str(unlabelled), "epochs": 3, "batch_size": 4,
                                           "progress": False, "attention_weight": 1.0})
    results = distill(recipe, tmp_path / "kd", verbose=False)
    assert results["unlabelled_examples"] == 2 and "f1" in results["final_metrics"]
    assert results["final_metrics"]["agreement"] >= results["start_metrics"]["agreement"]
    entities = pipeline(str(tmp_path / "kd" / "student"))("anna smith flew to rome")
    assert isinstance(entities, list)


# ------------------------------------------------------------------------------------------------
# general distillation
# ------------------------------------------------------------------------------------------------
def test_general_distillation_on_shards_lowers_its_loss(shards, tmp_path: Path) -> None:  # noqa: F811
    from bertforge.model.registry import model_class

    data, tokenizer_dir = shards
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    teacher = tmp_path / "teacher"
    model_class(config.model_type, "masked-lm")(config).save_pretrained(teacher, tokenizer=tokenizer)
    student = tmp_path / "student.json"
    BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=64).to_json_file(student)
    out = tmp_path / "general"
    result = CliRunner().invoke(app, [
        "distill", "general", "--teacher", str(teacher), "--student", str(student), "--data", str(data),
        "--out", str(out), "--max-steps", "16", "--batch-size", "8", "--lr", "3e-3", "--eval-every-steps", "8",
        "--eval-max-batches", "2", "--attention-weight", "1", "--relation-weight", "1", "--hidden-weight", "1",
        "--mlm-weight", "1", "--quiet"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    start, end = results["start_metrics"], results["final_metrics"]
    assert {"distill_loss", "mlm_kl", "attention_loss", "relation_loss", "hidden_loss"} <= set(end)
    assert end["distill_loss"] < start["distill_loss"], (start, end)
    losses = [r["loss"] for r in read_metrics(out / "run") if r.get("split") == "train"]
    assert losses[-1] < losses[0], losses
    final = out / "final"
    encoder = BertModel.from_pretrained(final)  # a pre-trained student for later fine-tuning
    assert encoder.config.hidden_size == 16 and (final / "vocab.txt").is_file()
    assert json.loads((final / "config.json").read_text())["architectures"][0].endswith("ForMaskedLM")

    # shards made with another vocabulary are refused, naming the teacher's vocabulary file
    corpus = tmp_path / "other.txt"
    corpus.write_text("entirely different words here for another vocabulary\n" * 10, encoding="utf-8")
    stranger = tmp_path / "stranger"
    other = BertTokenizer.train([corpus], vocab_size=60, min_frequency=1, show_progress=False)
    model_class(config.model_type, "masked-lm")(config.with_overrides(vocab_size=other.vocab_size)).save_pretrained(
        stranger, tokenizer=other)
    refused = CliRunner().invoke(app, ["distill", "general", "--teacher", str(stranger), "--student", "tiny",
                                       "--data", str(data), "--out", str(tmp_path / "no"), "--max-steps", "2",
                                       "--attention-weight", "1", "--quiet"])
    assert refused.exit_code == 2 and str(stranger / "vocab.txt") in refused.output, refused.output
    assert not (tmp_path / "no").exists()

    # the masked-LM term needs a teacher with a trained masked-LM head
    bare = tmp_path / "bare"
    BertModel(config).save_pretrained(bare, tokenizer=tokenizer)
    refused = CliRunner().invoke(app, ["distill", "general", "--teacher", str(bare), "--student", "tiny",
                                       "--data", str(data), "--out", str(tmp_path / "no"), "--max-steps", "2",
                                       "--mlm-weight", "1", "--quiet"])
    assert refused.exit_code == 2 and str(bare / "model.safetensors") in refused.output, refused.output
    assert not (tmp_path / "no").exists()


@pytest.mark.slow
def test_a_teacher_by_hub_name(reviews, loopback_hub, tmp_path: Path) -> None:
    files = {p.relative_to(reviews["teacher"]).as_posix(): p.read_bytes()
             for p in reviews["teacher"].rglob("*") if p.is_file() and "run" not in p.relative_to(reviews["teacher"]).parts}
    loopback_hub.commit("org/teacher", files)
    recipe = _task_recipe(reviews, teacher="org/teacher", epochs=1)
    results = distill(recipe, tmp_path / "kd", verbose=False)
    local = distill(_task_recipe(reviews, epochs=1), tmp_path / "kd-local", verbose=False)
    assert results["teacher_metrics"] == local["teacher_metrics"]
    assert (tmp_path / "kd" / "student" / "README.md").is_file()
