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
import time
from pathlib import Path

from experiments.common import RESULTS, ROOT, machine, save_results
from experiments.distill_students_runs import (
    QUICKSTART_BUDGET_MIN,
    SHARED_DATA,
    TASKS,
    run_general_part,
    run_task_part,
    smoke_glue,
)

# render_task and render_general are also how tests/test_generated_sections.py renders the two sections
from experiments.distill_students_sections import render_general, render_task, write_sections

__all__ = ["main", "render_general", "render_task", "write_sections"]


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


if __name__ == "__main__":
    main()
