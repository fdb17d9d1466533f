"""Distilled students against their teacher and against transformers on the students' own shape.

    python benchmarks/student_speed.py [--threads 1,N] [--repeats 30] [--students DIR,DIR]
    python benchmarks/student_speed.py --quick      # one thread, a few calls: checks it runs (< 2 min)

`bertforge distill task` makes students of all-MiniLM-L6-v2 with 2 and 3 of its 6 layers
(experiments/distill_students.py measures what they keep of the teacher's dev score). Their speed
depends on their shape only, so by default the students are cut from the teacher itself (its
embeddings, its layers 3 and 6, or 2, 4 and 6, as `--student-layers-from-teacher 3` and `2` pick
them, and its classifier); `--students` times given directories instead (any fine-tuned
sequence-classification directory, e.g. the study's distilled students).

Every model runs every path of benchmarks/onnx_anchor.py (transformers eager fp32, bertforge on torch
at fp32 / bf16 where the CPU has it / int8, bertforge on ONNX Runtime fp32 / int8, and ONNX Runtime on
transformers' own graph) on one sequence of 16 and of 128 pieces and on the SST-2 and MRPC dev sets
bucketed by length in batches of 32, at 1 thread and at all the cores. Reported per model: each path's
median ms per call, and two ratios: against transformers eager on the same model (is bertforge faster
on a small model too?) and the 1 x 128 latency against the teacher at torch fp32 (what distillation
buys a request). Results go to benchmarks/results/student_speed.json and the `student-speed` section
of docs/benchmarks.md (--quick writes benchmarks/.cache/onnx_anchor/student_speed_quick.json only).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402
from onnx_anchor import CACHE, classifier_dir, minilm_dir, read_dev, time_model, workloads  # noqa: E402

from bertforge.distill.recipe import teacher_layers  # noqa: E402
from bertforge.distill.run import save_layer_student  # noqa: E402

TEACHER = "all-MiniLM-L6-v2"
STUDENT_EVERY = ("3", "2")  # every k-th teacher layer, as the distillation study picks its 2- and 3-layer students
WORKLOADS = ("1x16", "1x128", "sst2-bucketed", "mrpc-bucketed")
REFERENCE = "torch-fp32"  # the teacher as fine-tuned and served without options


def models_to_time(students: list[Path] | None, quick: bool) -> dict[str, Path]:
    teacher = classifier_dir("tiny" if quick else TEACHER, quick)
    found = {"tiny" if quick else TEACHER: teacher}
    if students:
        found.update({path.name if path.name not in ("best", "final") else path.parent.name: path
                      for path in students})
        return found
    from bertforge.model.registry import read_config_file

    depth = read_config_file(teacher / "config.json").num_hidden_layers
    for every in STUDENT_EVERY:  # the quick run's 2-layer teacher gets a 1-layer student
        try:
            layers = teacher_layers(every, depth)
        except ValueError:  # k above the teacher's depth
            continue
        if 0 < len(layers) < depth:
            out = CACHE / f"{teacher.name}-layers-{'-'.join(map(str, layers))}"
            found[f"{len(layers)}-layer student"] = save_layer_student(teacher, layers, out, "sequence-classification")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny random teacher, one thread, a few calls")
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all cores)")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per path and workload (at least)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--students", default=None,
                        help="comma-separated classifier directories to time instead of students cut from the teacher")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the docs section from the saved results")
    args = parser.parse_args()
    if args.summarize:
        import json

        update_doc_section("student-speed", render(json.loads((RESULTS / "student_speed.json").read_text())))
        return


    from bertforge.precision import choose_precision
    from bertforge.threads import usable_cores
    from bertforge.tokenizer import BertTokenizer

    cores = usable_cores()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, cores})
    examples = None
    if args.quick:
        threads, args.repeats, args.warmup, examples = [1], 3, 1, 64
    precisions = ["fp32", *(["bf16"] if choose_precision("auto") == "bf16" else []), "int8"]
    students = [Path(p.strip()) for p in args.students.split(",")] if args.students else None
    models = models_to_time(students, args.quick)
    from onnx_anchor import ROOT

    dev = read_dev(ROOT.parent / "shared" / "data" / "glue", examples)
    every = workloads(dev, BertTokenizer.from_pretrained(minilm_dir()), args.quick)
    batches = {name: every[name] for name in WORKLOADS}
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for name, model_dir in models.items():
        rows += time_model(name, model_dir, threads, precisions, batches, args.repeats, args.warmup)
    payload = {"machine": machine(), "quick": args.quick, "threads": threads, "repeats": args.repeats,
               "teacher": next(iter(models)), "models": {k: str(v) for k, v in models.items()}, "rows": rows,
               "seconds": round(time.perf_counter() - started, 1)}
    out = save_results("student_speed_quick", payload, CACHE) if args.quick else save_results("student_speed", payload)
    print(render(payload))
    print(f"wrote {out} in {payload['seconds']} s")
    if not args.quick:
        update_doc_section("student-speed", render(payload))


def median(rows: list[dict[str, Any]], model: str, threads: int, workload: str, path: str) -> float | None:
    found = [r["median_ms"] for r in rows
             if (r["model"], r["threads"], r["workload"], r["path"]) == (model, threads, workload, path)]
    return found[0] if found else None


def render(payload: dict[str, Any]) -> str:
    rows, teacher = payload["rows"], payload["teacher"]
    lines = ["## Distilled students: against the teacher and against transformers (CPU)", "",
             "`python benchmarks/student_speed.py`. all-MiniLM-L6-v2 under a classification head and students "
             "with 2 and 3 of its layers (the shapes `bertforge distill task` makes; the speed depends on the shape "
             "only). Each path of the ONNX Runtime anchor comparison on one sequence of 16 and of 128 pieces and on "
             "the SST-2 and MRPC dev sets bucketed by length in batches of 32; median ms per call. \"vs transformers\": "
             "transformers eager fp32 on the same model over the path's time (above 1: faster); \"1x128 vs "
             f"teacher\": the path's 1 x 128 latency over the teacher's at {REFERENCE} (the distillation study's "
             "latency target is 0.25).", "",
             machine_line(payload["machine"]) + " Nothing else ran on the machine.", ""]
    for threads in payload["threads"]:
        reference = median(rows, teacher, threads, "1x128", REFERENCE)
        table = []
        for model in dict.fromkeys(r["model"] for r in rows):
            for path in dict.fromkeys(r["path"] for r in rows if r["model"] == model):
                cells = []
                for workload in WORKLOADS:
                    ms = median(rows, model, threads, workload, path)
                    eager = median(rows, model, threads, workload, "transformers-eager-fp32")
                    cells.append("" if ms is None else f"{ms:.2f}" + ("" if path.startswith("transformers-eager")
                                                                       or eager is None else f" ({eager / ms:.2f}x)"))
                ms128 = median(rows, model, threads, "1x128", path)
                ratio = f"{ms128 / reference:.2f}" if ms128 and reference else ""
                table.append([model, path, *cells, ratio])
        lines += [f"**{threads} thread{'s' if threads > 1 else ''}**: median ms per call (vs transformers)", "",
                  markdown_table(["model", "path", *WORKLOADS, "1x128 vs teacher"], table), ""]
    return "\n".join(lines + [reading(payload)]).rstrip()


def reading(payload: dict[str, Any]) -> str:
    """Per model and thread count at 1 x 128: bertforge's fastest path against transformers' fastest (eager or
    on ONNX Runtime), and the fastest path's latency against the teacher's."""
    rows, teacher = payload["rows"], payload["teacher"]
    parts = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for threads in payload["threads"]:
            times = {r["path"]: r["median_ms"] for r in rows
                     if (r["model"], r["threads"], r["workload"]) == (model, threads, "1x128")}
            ours = min((p for p in times if not p.startswith("transformers-")), key=times.__getitem__)
            theirs = min((p for p in times if p.startswith("transformers-")), key=times.__getitem__)
            reference = median(rows, teacher, threads, "1x128", REFERENCE)
            parts.append(f"{model} at {threads} thread{'s' if threads > 1 else ''}: {ours} {times[ours]:.2f} ms "
                         f"({times[theirs] / times[ours]:.2f}x transformers' fastest, {theirs}; "
                         f"{times[ours] / reference:.2f}x the teacher at {REFERENCE})")
    return "At 1 x 128, each model's fastest bertforge path: " + "; ".join(parts) + "."


if __name__ == "__main__":
    main()
