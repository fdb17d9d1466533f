"""The `distill-students` and `distill-general` sections of docs/results.md, from the saved results.

Rendering only: everything here reads the payload that experiments/distill_students_runs.py's runs
filled in (experiments/results/distill_students.json), so `--summarize` rewrites the sections without
training anything.
"""

from __future__ import annotations

from typing import Any

from experiments.common import machine_line, markdown_table, update_doc_section
from experiments.distill_students_runs import CALIBRATION_STEPS, DISTILL_LOSSES, RUNTIMES, TASKS

REFERENCE = "torch fp32"  # the teacher as fine-tuned and served by default: what the targets compare with
LATENCY_TARGET = 0.25
POINTS_TARGET = 1.5


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
