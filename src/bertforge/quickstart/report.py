"""The quickstart's report: the learning-curve figure, the one-line summaries printed as stages end, and
report.md, which reads the curves in words (which start is ahead where, beyond the seeds' spread or not)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.quickstart.settings import (
    BUDGETS,
    CURVES,
    FINETUNE_BATCH_SIZE,
    MIN_GAP_POINTS,
    MINILM_LR,
    Budget,
    curve_steps,
)


def plot_learning_curve(records: dict[str, dict[str, Any]], out: Path) -> Path:
    """SST-2 dev accuracy against labelled sentences (log scale): each start's mean over the seeds as a
    line, every seed as a dot, and the majority class as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    from bertforge.plot import save_figure

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for stage, (label, _) in CURVES.items():
        points = records[stage].get("points", [])
        if not points:
            continue
        line = ax.plot([p["sentences"] for p in points], [p["mean"] for p in points], marker="o", label=label)[0]
        dots = [(p["sentences"], a) for p in points for a in p["accuracies"]]
        ax.scatter(*zip(*dots, strict=True), s=12, alpha=0.5, color=line.get_color())
    subsamples = records["subsamples"]
    ax.axhline(subsamples["dev_majority_accuracy"], linestyle="--", color="grey", label="majority class")
    sizes = [s["sentences"] for s in subsamples["subsets"]]
    ax.set_xscale("log")
    ax.set_xticks(sizes, [f"{n:,}" for n in sizes])
    ax.minorticks_off()  # the sizes themselves are the ticks
    ax.set(xlabel="labelled SST-2 sentences (log scale)", ylabel="SST-2 dev accuracy",
           title=f"SST-2 dev accuracy ({subsamples['dev_sentences']} sentences); line: mean, dots: seeds")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out)



def summary_line(name: str, record: dict[str, Any]) -> str:
    if name == "tokenizer":
        return f"{record['vocab_size']} WordPiece tokens"
    if name == "data":
        return f"{record['documents']} documents, {record['instances']} instances"
    if name == "pretrain_eval":
        v, probe = record["validation"], record["context_probe"]
        sentence = next((f", {k.split('_')[0].upper()} accuracy {v[k]:.3f}" for k in v
                         if k.endswith("_accuracy") and k != "mlm_accuracy"), "")
        return (f"held-out MLM accuracy {v['mlm_accuracy']:.3f}{sentence}; word order worth "
                f"{word_order_points(probe):.1f} points")
    if name == "subsamples":
        return "nested SST-2 sub-samples of " + ", ".join(f"{s['sentences']:,}" for s in record["subsets"])
    if name == "adapt_minilm":
        before, after = record["before"].get("mlm_accuracy"), record["after"].get("mlm_accuracy")
        scores = f": held-out MLM accuracy {before:.3f} -> {after:.3f}" if None not in (before, after) else ""
        steps = record.get("head_steps", 0) + record["steps"]
        return f"all-MiniLM-L6-v2 adapted {steps} steps on {record['sentences']:,} sentences' text{scores}"
    if name in CURVES:
        return "SST-2 dev accuracy " + "; ".join(f"{p['sentences']:,}: {p['mean']:.3f}" for p in record["points"])
    if name == "report":
        return record["report"]
    return "done"


def word_order_points(probe: dict[str, float]) -> float:
    """What word order is worth to the model: MLM accuracy (points) with the context intact minus shuffled."""
    return probe["context intact"] - probe["shuffled order"]



def render_report(records: dict[str, dict[str, Any]], budget: Budget, curves: str, learning: str) -> str:
    data, pre, evaluation = records["data"], records["pretrain"], records["pretrain_eval"]
    v, probe = evaluation["validation"], evaluation["context_probe"]
    pair = budget.objective.upper()
    fill = "\n".join(
        f"| `{e['text']}` | " + ", ".join(f"{token} ({p:.2f})" for token, p in e["top5"]) + " |"
        for e in evaluation["fill_mask"]
    )
    stage_times = ", ".join(f"{name} {r['seconds']:.0f} s" for name, r in records.items() if "seconds" in r)
    total = sum(r.get("seconds", 0.0) for r in records.values())
    tokens = f"{pre['tokens']:,} tokens, " if pre.get("tokens") else ""
    rate = f", {pre['tokens'] / pre['seconds']:,.0f} tokens/s" if pre.get("tokens") else ""
    eval_rows = f"| {pair} accuracy (chance: 0.5) | {v[budget.objective + '_accuracy']:.3f} |\n" \
        if budget.objective + "_accuracy" in v else ""
    return f"""# bertforge quickstart report

Budget `{budget_name(budget)}`; stages took {total / 60:.1f} minutes in all (report excluded): {stage_times}.
{load_line(records)}

## 1. WordPiece vocabulary
{records['tokenizer']['vocab_size']} tokens trained on the bundled public-domain novels ({records['tokenizer']['seconds']:.0f} s).

## 2. Pre-training data (masked LM + {SENTENCE_TASKS.get(budget.objective, budget.objective)})
{data['documents']} documents, {data['sentences']} sentences, {data['tokens']} tokens -> {data['instances']} training
instances of up to {budget.max_seq_length} tokens ({budget.dupe_factor} {"pairing" if budget.dupe_factor == 1 else "pairings"} of the text into sentence pairs;
masks drawn afresh every epoch), and {data['validation_instances']} held-out ones from other chapters, masked once ({data['seconds']:.0f} s).

## 3. Pre-training a {pre.get('architecture', budget.model)} BERT
{_pretrain_length(pre)} of batch {budget.pretrain_batch_size} at peak learning rate {budget.pretrain_lr:g}, no
dropout ({tokens}{pre['seconds']:.0f} s{rate}). `pretrain/run_config.yaml` is the resolved recipe:
`bertforge pretrain --config RUN/pretrain/run_config.yaml --data RUN/data --out DIR` repeats it.

![pre-training curves]({curves})

Held-out ({evaluation['validation_sequences']} validation sequences, masked once with a fixed seed):

| metric | value |
|---|---|
| MLM loss | {v['mlm_loss']:.3f} |
| MLM accuracy | {v['mlm_accuracy']:.3f} |
{eval_rows}
Does the model use word order? The same held-out masked pieces, scored three ways:

| context shown to the model | MLM accuracy (%) |
|---|---|
| as it is | {probe['context intact']:.1f} |
| the same words in shuffled order | {probe['shuffled order']:.1f} |
| none (every unmasked piece replaced by [MASK]) | {probe['no context']:.1f} |
| (always guessing the most frequent piece) | {probe['most frequent piece']:.1f} |

{probe_sentence(probe)}

Fill-mask with the pre-trained model (top 5):

| prompt | predictions |
|---|---|
{fill}

{teach_section(records.get("teach", {}))}

## 5. Fine-tuning on SST-2 (sentence sentiment, GLUE layout, bundled sample): accuracy against labelled sentences

{curve_section(records, budget, learning, architecture=pre.get('architecture', budget.model))}
"""


def teach_section(teach: dict[str, Any]) -> str:
    """Section 4: the pre-trained model taught MiniLM's sentence vectors of the bundled in-domain text."""
    if not teach:
        return ""
    texts = teach["texts"]
    length = f"{teach['minutes']:g} minutes ({teach['steps']:,} steps)" if teach.get("minutes") \
        else f"{teach['steps']:,} steps"
    return f"""## 4. Teaching it a sentence encoder's vectors of in-domain text
The pre-trained model continued for {length}: all-MiniLM-L6-v2 encoded {texts['train'] + texts['heldout']:,}
bundled phrases of SST-2's training split (labels dropped, no dev sentence among them; {teach['teacher_seconds']:.0f} s),
and the model learnt to give the same sentence vectors (the mean of its last layer through a learned
Linear, towards MiniLM's vector by 1 - cosine: `bertforge distill sentences`), in its own vocabulary.
On {texts['heldout']:,} phrases held out of training, its vectors' cosine with MiniLM's went from
{teach['cosine_before']:.3f} to {teach['cosine_after']:.3f}. `taught/final/` is the model the curve below starts from first."""


def curve_section(records: dict[str, dict[str, Any]], budget: Budget, plot: str, *, architecture: str) -> str:
    """The learning curve in the report: how it was run, the plot, the table, and its reading in words."""
    subsamples = records["subsamples"]
    by_stage = {stage: {p["size"]: p for p in records[stage].get("points", [])} for stage in CURVES}
    rows = []
    for subset in subsamples["subsets"]:
        size, sentences = subset["size"], subset["sentences"]
        steps = curve_steps(sentences, budget)
        cells = [_cell(by_stage[stage].get(size), steps) for stage in CURVES]
        epochs = steps / math.ceil(sentences / FINETUNE_BATCH_SIZE)
        rows.append(f"| {sentences:,} ({subset['positive']:,} positive) | {steps} ({epochs:.3g}) | " + " | ".join(cells) + " |")
    seeds = len(budget.curve_seeds)
    dev = (f"the first {subsamples['dev_sentences']}" if budget.finetune_eval_examples else "all")
    paragraph = curve_paragraph(
        records["curve_taught"]["points"], records["curve_random"]["points"], records["curve_minilm"]["points"],
        majority=subsamples["dev_majority_accuracy"], eval_examples=subsamples["dev_sentences"])
    lever = lever_paragraph(records["curve_taught"]["points"], records["curve_pretrained"]["points"],
                            records["curve_random"]["points"])
    epochs = f"{budget.curve_epochs:g} {'epoch' if budget.curve_epochs == 1 else 'epochs'}"
    if budget.curve_min_steps == budget.curve_max_steps:
        steps_rule = (f"Every size gets the same {budget.curve_min_steps} updates (many passes over the small sets, "
                      "fewer over the large ones), so a size differs from another only in its sentences.")
    else:
        steps_rule = (f"Steps at a size: {epochs} over the sentences, but at least {budget.curve_min_steps} and at "
                      f"most {budget.curve_max_steps} (fewer passes at the large sizes, to fit the budget).")
    adaptation = adaptation_paragraph(records.get("adapt_minilm", {}), records["curve_minilm"].get("points", []),
                                      records.get("curve_minilm_adapted", {}).get("points", []))
    return f"""Five starts: the {architecture} BERT pre-trained and taught above, the same model after
masked LM alone (section 3), the same architecture and vocabulary with random weights (the three at
learning rate {budget.finetune_lr:g}), and all-MiniLM-L6-v2 (pre-trained at scale; 6 layers, H=384;
learning rate {MINILM_LR:g}), as released and adapted here to the task's own text. The new output layer
reads the {POOLING_WORDS.get(budget.finetune_pooling, budget.finetune_pooling)} for every start. Each is fine-tuned on nested random
sub-samples of the {subsamples['available']:,} bundled training sentences (the smaller sets lie inside the
larger, and every start sees the same sentences at a size), {seeds} {"seed" if seeds == 1 else "seeds"} at each size (the seed sets
the new output layer's initialisation and the batch order), in batches of {FINETUNE_BATCH_SIZE} of up to
{budget.max_seq_length} tokens, and scored once, after the last step, on {dev} of SST-2's 872 dev sentences.
{steps_rule} MiniLM costs about 14 times
the tiny model per step, so it runs only at the sizes up to {budget.minilm_max_size:,}, for at most
{budget.minilm_max_steps} {"step" if budget.minilm_max_steps == 1 else "steps"}.

![SST-2 dev accuracy against labelled sentences]({plot})

| labelled sentences | steps (epochs) | {" | ".join(label for label, _ in CURVES.values())} |
|---|---|{"---|" * len(CURVES)}
{chr(10).join(rows)}

Each cell: mean SST-2 dev accuracy over the seeds (lowest - highest seed). Always answering the
majority class scores {subsamples['dev_majority_accuracy']:.3f}. For scale: BERT-base scores 93.5 on the GLUE test set in the paper.

{paragraph}

{lever}

{adaptation}"""


POOLING_WORDS = {"mean": "mean of the last layer's token vectors (`--pooling mean`)",
                 "cls": "[CLS] vector through the pooler"}


def lever_paragraph(taught: Sequence[dict[str, Any]], pretrained: Sequence[dict[str, Any]],
                    random: Sequence[dict[str, Any]]) -> str:
    """Which stage made the difference: masked LM alone against random weights, and what teaching added."""
    if not taught or not pretrained:
        return ""
    twin = {p["size"]: p for p in random}
    alone = {p["size"]: p for p in pretrained}
    rows = [(p, alone[p["size"]], twin[p["size"]]) for p in taught if p["size"] in alone and p["size"] in twin]
    mlm = "; ".join(f"{a['sentences']:,}: {spread(a)} against {spread(r)} "
                    f"({VERDICT_WORDS[compare_starts(a['accuracies'], r['accuracies'])]})" for _, a, r in rows)
    gains = ", ".join(f"{100 * (t['mean'] - a['mean']):+.1f}" for t, a, _ in rows)
    sizes = ", ".join(f"{t['sentences']:,}" for t, _, _ in rows)
    return (f"Which stage did it: masked LM alone (the model of section 3, fine-tuned alike) against random "
            f"weights: {mlm}. Teaching it MiniLM's sentence vectors of the in-domain text added {gains} points "
            f"at {sizes} sentences. In the studies behind this (docs/results-pretraining.md, \"The quickstart's "
            "levers\"), masked LM at a few CPU minutes learnt which words fit a context but gave no better start "
            "for sentiment than random weights, in domain or not, while a released encoder's sentence vectors of "
            "the task's own unlabelled text carried what it learnt at scale into the small model; taught from "
            "random weights instead, the same teaching did as well, so at this budget the masked-LM minute "
            "shows the paper's pre-training end to end and the teaching is what pays.")


VERDICT_WORDS = {"better": "better beyond the seed spread", "worse": "worse beyond the seed spread",
                 "tie": "no clear difference"}


def adaptation_paragraph(adapted: dict[str, Any], minilm: Sequence[dict[str, Any]],
                         minilm_adapted: Sequence[dict[str, Any]]) -> str:
    """What adapting MiniLM to the task's unlabelled text bought, size by size, in the curve's terms."""
    if not adapted or not minilm_adapted:
        return ""
    before, after = adapted["before"].get("mlm_accuracy"), adapted["after"].get("mlm_accuracy")
    scores = (f"; held-out masked-LM accuracy on that text {before:.3f} before and {after:.3f} after"
              if None not in (before, after) else "")
    head_steps = adapted.get("head_steps", 0)
    head = (f" (MiniLM ships no masked-LM head: a new one trained alone for the first {head_steps} steps)"
            if head_steps else " (its masked-LM head is new: MiniLM ships none)" if adapted.get("new_heads") else "")
    released = {p["size"]: p for p in minilm}
    verdicts = [f"{p['sentences']:,} sentences: {spread(p)} against {spread(released[p['size']])} as released, "
                f"{100 * (p['mean'] - released[p['size']]['mean']):+.1f} points "
                f"({VERDICT_WORDS[compare_starts(p['accuracies'], released[p['size']]['accuracies'])]})"
                for p in minilm_adapted if p["size"] in released]
    return (f"Adapted here: all-MiniLM-L6-v2 continued with masked LM for {head_steps + adapted['steps']} steps on "
            f"the text of the {adapted['sentences']:,} bundled training sentences, labels dropped, dev sentences never read"
            f"{head}{scores}. Fine-tuned alike: " + "; ".join(verdicts) + ".")


def _pretrain_length(pre: dict[str, Any]) -> str:
    """"3,912 steps (5 minutes of training)", or the steps alone for a run by steps."""
    steps = f"{pre['steps']:,} steps"
    if not pre.get("minutes"):
        return steps
    return f"{steps} ({pre['minutes']:g} {'minute' if pre['minutes'] == 1 else 'minutes'} of training, the schedule fitted to them)"


def _cell(point: dict[str, Any] | None, steps: int) -> str:
    """A table cell: the point's scores, with its steps where they are fewer than the row's (MiniLM)."""
    if point is None:
        return "not run (cost)"
    fewer = point["steps"] != steps
    return spread(point) + (f", {point['steps']} step{'s' if point['steps'] > 1 else ''}" if fewer else "")


def spread(point: dict[str, Any]) -> str:
    """A curve point as the report shows it: the mean over the seeds, then the lowest and highest seed."""
    values = point["accuracies"]
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{point['mean']:.3f} ({min(values):.3f} - {max(values):.3f})"


def compare_starts(first: Sequence[float], second: Sequence[float]) -> str:
    """"better", "worse" or "tie" for the first start's seeds against the second's: a gap counts only
    when every seed of one scores above every seed of the other and the means differ by at least
    MIN_GAP_POINTS (with 3 seeds each, a complete separation arises by chance 1 time in 10)."""
    gap = 100 * (sum(first) / len(first) - sum(second) / len(second))
    if min(first) > max(second) and gap >= MIN_GAP_POINTS:
        return "better"
    if max(first) < min(second) and -gap >= MIN_GAP_POINTS:
        return "worse"
    return "tie"


def _sizes(sizes: Sequence[int]) -> str:
    """100, 300 and 1,000 sentences."""
    words = [f"{n:,}" for n in sizes]
    return (", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]) + " sentences"


def curve_paragraph(pretrained: Sequence[dict[str, Any]], random: Sequence[dict[str, Any]],
                    minilm: Sequence[dict[str, Any]], *, majority: float, eval_examples: int) -> str:
    """What the learning curve says, size by size, written from its numbers (each point: `sentences`,
    `accuracies` over the seeds, `mean`): where pre-training helps, where it makes no clear difference,
    where it hurts, where neither tiny start learns, and what MiniLM's points add."""
    ours = {p["sentences"]: p for p in pretrained}
    twin = {p["sentences"]: p for p in random}
    sizes = sorted(set(ours) & set(twin))
    verdict = {n: compare_starts(ours[n]["accuracies"], twin[n]["accuracies"]) for n in sizes}
    helps = [n for n in sizes if verdict[n] == "better"]
    hurts = [n for n in sizes if verdict[n] == "worse"]
    ties = [n for n in sizes if verdict[n] == "tie"]
    if helps and not ties and not hurts:
        lead = "Pre-training helps at every size here"
    elif not helps:
        lead = ("At this scale pre-training never helps: "
                + ("; ".join(part for part in (
                    f"the two starts are within their seeds' spread at {_sizes(ties)}" if ties else "",
                    f"random weights do better at {_sizes(hurts)}" if hurts else "") if part)))
    elif max(helps) < min(ties + hurts):
        rest = ("random weights catch up" if not hurts else
                "random weights do better" if not ties else "random weights catch up, then do better")
        lead = (f"Pre-training helps only with few labelled sentences: at {_sizes(helps)}; "
                f"from {min(ties + hurts):,} on {rest}")
    else:
        lead = "; ".join(part for part in (
            f"Pre-training helps at {_sizes(helps)}",
            f"makes no clear difference at {_sizes(ties)}" if ties else "",
            f"hurts at {_sizes(hurts)}" if hurts else "") if part)
    seeds = len(pretrained[0]["accuracies"]) if pretrained else 0
    numbers = "; ".join(
        f"{n:,}: {spread(ours[n])} against {spread(twin[n])}, {100 * (ours[n]['mean'] - twin[n]['mean']):+.1f} points"
        for n in sizes)
    binomial = 100 * (0.25 / eval_examples) ** 0.5  # the standard error of one accuracy, at most (p = 50%)
    text = [f"{lead} (pre-trained and taught here against random weights, mean of {seeds} {'seed' if seeds == 1 else 'seeds'}"
            f"{' with the lowest and highest' if seeds > 1 else ''}: {numbers}).",
            f"A gap counts here only when every seed of one start scores above every seed of the other and the "
            f"means differ by at least {MIN_GAP_POINTS:g} point; the binomial error of one score on {eval_examples} "
            f"dev sentences alone is about {binomial:.1f} points."]
    stuck = [n for n in sizes if max(ours[n]["mean"], twin[n]["mean"]) < majority + 0.02]
    if stuck:
        text.append(f"At {_sizes(stuck)} neither tiny start gets clear of the majority class ({majority:.3f}), so "
                    "those points say little either way.")
    if not helps:
        text.append("Masked LM alone at this budget never made a better start than random weights, whatever the "
                    "lever (in-domain text, masking rate, vocabulary, model shape, fine-tuning rate, pooling: "
                    "docs/results-pretraining.md, \"The quickstart's levers\"); teaching it MiniLM's sentence vectors "
                    "of the in-domain text (section 4) is the stage that turned it around in the runs measured "
                    "there, so a run where it does not is worth a look at that stage's cosine and steps.")
    if minilm:
        text.append(_minilm_sentence(minilm, ours, twin, majority))
    return " ".join(text)


def _minilm_sentence(minilm: Sequence[dict[str, Any]], ours: dict[int, dict[str, Any]],
                     twin: dict[int, dict[str, Any]], majority: float) -> str:
    """MiniLM's points against the tiny model: the lectures' claim (better results from less labelled
    data) at the scale of a real pre-training run, stated only as far as the numbers bear it out."""
    scores = "; ".join(f"{spread(p)} with {p['sentences']:,} sentences" for p in minilm)
    first = minilm[0]
    n = first["sentences"]
    tiny_there = max((d[n]["mean"] for d in (ours, twin) if n in d), default=None)
    sentence = f"all-MiniLM-L6-v2, pre-trained at scale, scores {scores}"
    if tiny_there is not None:
        sentence += f" ({100 * (first['mean'] - tiny_there):+.1f} points from the better tiny start at {n:,})"
    if first["mean"] < majority + 0.02:
        return sentence + f"; with {n:,} sentences it does not get clear of the majority class either."
    largest = max(set(ours) & set(twin), default=None)
    if largest is None or largest <= n:
        return sentence + "."
    best_large = max(ours[largest]["mean"], twin[largest]["mean"])
    if first["mean"] >= best_large:
        return (sentence + f": with {n:,} labelled sentences it already does as well as the tiny model does with "
                f"{largest:,} from either start ({best_large:.3f}). That is the lectures' claim, at the scale of a "
                "real pre-training run: better results from less labelled data.")
    return (sentence + f"; with {n:,} labelled sentences it stays below the {best_large:.3f} the tiny model reaches "
            f"with {largest:,}.")


def load_line(records: dict[str, dict[str, Any]]) -> str:
    """The machine's 1-minute load average at the stages' starts and ends: on a busy machine wall times grow."""
    loads = [x for r in records.values() for x in r.get("load_average", [])]
    if not loads:
        return ""
    return (f"The 1-minute load average ranged from {min(loads):.1f} to {max(loads):.1f} at the stages' starts "
            f"and ends, on {os.cpu_count()} CPU cores.")


SENTENCE_TASKS = {"sop": "sentence-order prediction", "nsp": "next-sentence prediction"}


def probe_sentence(probe: dict[str, float]) -> str:
    """What the context probe says, in words."""
    points = word_order_points(probe)
    if points >= 5:
        return (f"Word order is worth {points:.1f} points: the model predicts masked pieces from their "
                "neighbours, not only from which words occur in the sequence.")
    return (f"Word order is worth {points:.1f} points: the model is still at the bag-of-words stage of "
            "pre-training (it predicts from which words occur, not from where).")


def budget_name(budget: Budget) -> str:
    return next((name for name, b in BUDGETS.items() if b == budget), "custom")
