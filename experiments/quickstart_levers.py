"""The quickstart's levers one at a time: what would make its own BERT-tiny fine-tune better than its
random twin from 100 to 4,000 labelled SST-2 sentences, at the quickstart's budget?

    python -m experiments.quickstart_levers --quickstart runs/quickstart     # after `bertforge quickstart`
    python -m experiments.quickstart_levers --render                          # the section from the JSON

Each variant changes one thing against the quickstart (BERT-tiny, vocabulary of 8,000 pieces trained
on the pre-training text, 64 tokens, batch 32, peak rate 1e-3 after 300 warm-up steps, linear decay, no
dropout) and is fine-tuned exactly like the quickstart's curve: the same nested SST-2 samples of the
quickstart run, 200 steps at every size, lr 3e-4 (unless the variant is the rate), batch 32, seeds 1-3,
scored on the 872 dev sentences; each pre-trained model beside its own random twin (same vocabulary
and shape, BERT's initialisation, seed 0):
- `finetune-lr-1e-3` / `finetune-lr-1e-4` / `finetune-lr-3e-5`: the quickstart's own model and twin
  (of the run in `--quickstart`; its steps and held-out MLM accuracy are recorded), fine-tuned at that
  rate: a pre-trained start may keep what it learnt only at a lower rate than random weights need;
- `finetune-mean-pooling` / `finetune-mean-pooling-lr-1e-3`: the quickstart's own model and twin with
  the classifier on the mean of the final token vectors (`--pooling mean`) instead of [CLS] through
  the pooler, at 3e-4 / 1e-3: masked LM trains the token vectors, while [CLS] is trained only by the
  sentence-order task;
- `sst2-text-mask-0.15` / `sst2-text-mask-0.3`: pre-trained on SST-2's 67,349 training sentences with
  their labels dropped (in-domain text; 50 sentences a document, the dev split never read), masked LM
  only, 3,000 steps, 15% / 30% of the pieces masked, its own vocabulary;
- `books-mask-0.4` / `books-mask-0.15`: the bundled novels with sentence-order prediction as the
  quickstart, 3,000 steps, 40% (Wettig et al. 2023) / 15% masked; the latter is the out-of-domain
  contrast to `sst2-text-mask-0.15` at the same budget and size;
- `books-vocab-2000`: as `books-mask-0.15` with a vocabulary of 2,000 pieces instead of 8,000 (cheaper
  steps, more pieces per word, a softmax with fewer rare classes);
- `books-tiny-4min` / `books-mini-4min`: the model's shape at equal wall clock: BERT-tiny (L2/H128) and
  BERT-mini (L4/H256) each pre-trained for the quickstart's 4 training minutes (warm-up over the first
  6% of the time, then linear decay to zero at its end), one thread each, run side by side so that both see the same machine;
- `sst2-text-4min-combined`: the levers that helped anywhere, together: SST-2's own text (as above),
  30% masked (left the plateau sooner there), masked LM only, the quickstart's 4 training minutes
  with the schedule fitted to them (enough steps on an AVX-512 core to leave the plateau), then
  fine-tuned with mean pooling at 1e-3 (the best fine-tuning for both starts in the rows above).
- `teach-8k-2min` / `teach-16k-2min` / `teach-32k-2min`: the quickstart's own model (of the run in
  `--quickstart`) taught all-MiniLM-L6-v2's sentence vectors of 8,000 / 16,000 / 32,000 distinct SST-2
  training phrases (labels dropped, no dev sentence; `bertforge distill sentences`: its mean-pooled last
  layer through a Linear, 1 - cosine, batch 64, lr 1e-3, 2 minutes with the schedule fitted to them, 500
  phrases held out), then fine-tuned with mean pooling at 3e-4 beside the quickstart's random twin
  alike: how much in-domain text the teaching wants;
- `teach-from-random-16k-2min`: as `teach-16k-2min`, taught from the random twin instead (no masked LM
  at all): what masked LM adds underneath.
`--probe` adds a frozen check: logistic regression on the mean-pooled vectors of each layer.
Results: experiments/results/quickstart_levers.json and the `quickstart-levers` section of docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import RESULTS, ROOT, machine, machine_line, markdown_table, publish

SHARED = ROOT.parent / "shared" / "data"
SIZES = (100, 300, 1000, 4000)
SEEDS = (1, 2, 3)
CURVE_STEPS, FINETUNE_LR, BATCH = 200, 3e-4, 32
VARIANTS: dict[str, dict[str, Any]] = {
    "finetune-lr-1e-3": {"text": None, "finetune_lr": 1e-3},
    "finetune-lr-1e-4": {"text": None, "finetune_lr": 1e-4},
    "finetune-lr-3e-5": {"text": None, "finetune_lr": 3e-5},
    "finetune-mean-pooling": {"text": None, "pooling": "mean"},
    "finetune-mean-pooling-lr-1e-3": {"text": None, "pooling": "mean", "finetune_lr": 1e-3},
    "sst2-text-mask-0.15": {"text": "sst2", "mask": 0.15, "objective": "none", "steps": 3000},
    "sst2-text-mask-0.3": {"text": "sst2", "mask": 0.3, "objective": "none", "steps": 3000},
    "books-mask-0.4": {"text": "books", "mask": 0.4, "objective": "sop", "steps": 3000},
    # the in-domain text's contrast at the same budget and size: the novels, 15% masked, 3,000 steps
    "books-mask-0.15": {"text": "books", "mask": 0.15, "objective": "sop", "steps": 3000},
    "books-vocab-2000": {"text": "books", "mask": 0.15, "objective": "sop", "steps": 3000, "vocab": 2000},
    "books-tiny-4min": {"text": "books", "mask": 0.15, "objective": "sop", "minutes": 4.0, "preset": "tiny"},
    "books-mini-4min": {"text": "books", "mask": 0.15, "objective": "sop", "minutes": 4.0, "preset": "mini"},
    "sst2-text-4min-combined": {"text": "sst2", "mask": 0.3, "objective": "none", "minutes": 4.0, "preset": "tiny",
                                "pooling": "mean", "finetune_lr": 1e-3},
    "teach-8k-2min": {"text": None, "teach_texts": 8000, "teach_minutes": 2.0, "pooling": "mean"},
    "teach-16k-2min": {"text": None, "teach_texts": 16000, "teach_minutes": 2.0, "pooling": "mean"},
    "teach-32k-2min": {"text": None, "teach_texts": 32000, "teach_minutes": 2.0, "pooling": "mean"},
    "teach-from-random-16k-2min": {"text": None, "teach_texts": 16000, "teach_minutes": 2.0, "pooling": "mean",
                                   "teach_from": "random"},
}
TEACH_LR, TEACH_BATCH, TEACH_HELDOUT = 1e-3, 64, 500


def sst2_text(out: Path) -> Path:
    """SST-2's training sentences, labels dropped, in BERT's layout (a blank line every 50 sentences)."""
    rows = (SHARED / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    lines = []
    for index, row in enumerate(rows):
        lines.append(row.rsplit("\t", 1)[0].strip())
        if index % 50 == 49:
            lines.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def sst2_phrases(out: Path) -> Path:
    """SST-2's distinct training phrases, labels dropped and dev sentences left out, one a line."""
    def texts(split: str) -> list[str]:
        rows = (SHARED / "glue" / "SST-2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
        return [row.rsplit("\t", 1)[0].strip() for row in rows]

    dev = set(texts("dev"))
    phrases = [text for text in dict.fromkeys(texts("train")) if text and text not in dev]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(phrases) + "\n", encoding="utf-8")
    return out


def teach_variant(name: str, spec: dict[str, Any], start: Path, work: Path) -> Path:
    """`start` taught MiniLM's sentence vectors of the variant's share of SST-2's phrases; the taught model."""
    from bertforge.distill import build_recipe, distill
    from bertforge.quickstart import minilm_dir

    run = work / name
    recipe = build_recipe("sentences", options={
        "teacher": str(minilm_dir()), "student": str(start), "data": str(sst2_phrases(run / "sst2-phrases.txt")),
        "max_texts": spec["teach_texts"], "heldout_texts": TEACH_HELDOUT, "max_length": 64, "lr": TEACH_LR,
        "batch_size": TEACH_BATCH, "budget_minutes": spec["teach_minutes"], "warmup_ratio": 0.06, "progress": False})
    results = distill(recipe, run / "taught", verbose=False, overwrite=True)
    spec.update(teach_steps=results["steps"], teacher_seconds=results["teacher_seconds"],
                cosine_before=results["start_metrics"]["cosine"], cosine_after=results["final_metrics"]["cosine"])
    return run / "taught" / "final"


def pretrain_variant(name: str, spec: dict[str, Any], work: Path) -> tuple[Path, float]:
    """(the pre-trained model, its final held-out masked-LM accuracy) of one variant."""
    from bertforge.data.prepare import prepare
    from bertforge.pretrain import pretrain
    from bertforge.quickstart import bundled_books
    from bertforge.tokenizer import BertTokenizer
    from bertforge.train.log import read_metrics

    run = work / name
    books = spec["text"] == "books"
    texts = [Path(p) for p in bundled_books()] if books else [sst2_text(run / "sst2-train.txt")]
    BertTokenizer.train(texts, vocab_size=spec.get("vocab", 8000), min_frequency=2).save_pretrained(run / "tokenizer")
    prepare(texts, run / "tokenizer", run / "data", max_seq_length=64, dupe_factor=5, plain_text=books,
            objective=spec["objective"], masking="dynamic", masked_lm_prob=spec["mask"], validation_fraction=0.05,
            seed=12345, progress=False, overwrite=True)
    # by steps, or by training minutes with the schedule fitted to them (the quickstart's own way)
    # (a time budget warms up over its first 6%: a fixed 300 steps would outlast a larger model's budget)
    length = ({"max_steps": 20000, "budget_minutes": spec["minutes"], "warmup_ratio": 0.06} if "minutes" in spec
              else {"max_steps": spec["steps"], "warmup_steps": 300})
    result = pretrain(spec.get("preset", "tiny"), run / "data", run / "pretrain", **length, batch_size=BATCH, lr=1e-3,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, eval_every=500,
                      save_every=500, keep_last=1, eval_batch_size=128, eval_max_batches=0, overwrite=True)
    evaluations = [r for r in read_metrics(run / "pretrain") if r.get("split") == "eval"]
    spec["steps_trained"] = result.train.step
    return run / "pretrain" / "final", evaluations[-1]["mlm_accuracy"]


def curve(model: Path, subsets: Path, out: Path, lr: float, pooling: str = "cls") -> list[dict[str, Any]]:
    """The quickstart's fine-tuning curve from `model`: each size, 200 steps, seeds 1-3."""
    from bertforge.finetune import finetune

    points = []
    for size in SIZES:
        result = finetune("glue", "SST-2", model, subsets / f"n-{size}", out / f"n-{size}", seeds=SEEDS, lr=lr,
                          batch_size=BATCH, epochs=CURVE_STEPS / math.ceil(size / BATCH), max_length=64,
                          eval_every_epoch=False, save_best=False, progress=False, verbose=False, overwrite=True,
                          pooling=pooling)
        accuracy = result["summary"]["accuracy"]
        points.append({"size": size, "values": [round(v, 4) for v in accuracy["values"]],
                       "mean": round(accuracy["mean"], 4)})
    return points


def frozen_probe(model: Path, subsets: Path) -> list[list[float]]:
    """Dev accuracy of logistic regression on each layer's mean-pooled vectors, at each size."""
    import torch
    from sklearn.linear_model import LogisticRegression

    from bertforge.model.auto import load_for_job
    from bertforge.quickstart import sst2_sample
    from bertforge.tokenizer import BertTokenizer

    def rows(path: Path) -> tuple[list[str], np.ndarray]:
        pairs = [line.rsplit("\t", 1) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
        return [text for text, _ in pairs], np.array([int(label) for _, label in pairs])

    encoder, tokenizer = load_for_job(model, "embeddings").eval(), BertTokenizer.from_pretrained(model)

    def vectors(texts: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(texts), 256):
            batch = tokenizer(texts[start:start + 256], padding=True, truncation=True, max_length=64,
                              return_tensors="pt")
            with torch.no_grad():
                states = encoder(batch["input_ids"], batch["attention_mask"], output_hidden_states=True).hidden_states
            mask = batch["attention_mask"].unsqueeze(-1).float()
            out.append(torch.stack([(h * mask).sum(1) / mask.sum(1) for h in states], 1))
        return torch.cat(out).numpy()

    train_texts, train_labels = rows(subsets / "n-4000" / "SST-2" / "train.tsv")
    dev_texts, dev_labels = rows(sst2_sample() / "dev.tsv")
    train, dev = vectors(train_texts), vectors(dev_texts)
    return [[round(LogisticRegression(max_iter=2000).fit(train[:n, layer], train_labels[:n])
                   .score(dev[:, layer], dev_labels), 3) for n in SIZES] for layer in range(train.shape[1])]


TWIN_CURVES: dict[tuple[str, float, str], list[dict[str, Any]]] = {}  # fine-tuning is seeded: one run per twin


def run_variant(name: str, args: argparse.Namespace, where: str) -> dict[str, Any]:
    from bertforge.pretrain import random_init_like

    spec, subsets = VARIANTS[name], args.quickstart / "sst2-subsets"
    if spec["text"] is None:
        model, twin = args.quickstart / "pretrain" / "final", args.quickstart / "random-init"
        stages = args.quickstart / "stages"
        mlm = json.loads((stages / "pretrain_eval.json").read_text())["validation"]["mlm_accuracy"]
        spec = {**spec, "steps_trained": json.loads((stages / "pretrain.json").read_text())["steps"]}
        if "teach_texts" in spec:
            from_random = spec.get("teach_from") == "random"
            model = teach_variant(name, spec, twin if from_random else model, args.work)
            mlm = None if from_random else mlm
    else:
        model, mlm = pretrain_variant(name, spec, args.work)
        twin = random_init_like(model, args.work / name / "random-init", seed=0)
    lr, pooling = spec.get("finetune_lr", FINETUNE_LR), spec.get("pooling", "cls")
    twin_key = (str(twin), lr, pooling)  # the quickstart's own twin, fine-tuned alike, is the same curve each time
    if twin_key not in TWIN_CURVES:
        TWIN_CURVES[twin_key] = curve(twin, subsets, args.work / name / "ft-random", lr, pooling)
    row = {"variant": name, "settings": spec, "heldout_mlm_accuracy": mlm, "machine_line": where,
           "pretrained": curve(model, subsets, args.work / name / "ft-pretrained", lr, pooling),
           "random": TWIN_CURVES[twin_key]}
    if args.probe:
        row["probe"] = {"pretrained": frozen_probe(model, subsets), "random": frozen_probe(twin, subsets)}
    return row


def _label(variant: dict[str, Any]) -> str:
    """The variant's name, with the model it started from and, for teaching, what the teaching did."""
    settings = variant["settings"]
    steps = settings.get("steps_trained") if settings["text"] is None else None
    if "teach_texts" in settings:
        start = "the random twin" if settings.get("teach_from") == "random" else f"the {steps:,}-step model"
        return (f"{variant['variant']} (from {start}; {settings['teach_steps']:,} steps, held-out cosine "
                f"{settings['cosine_before']:.2f} -> {settings['cosine_after']:.2f})")
    return variant["variant"] + (f" (the quickstart's {steps:,}-step model)" if steps else "")


def _model_of(variant: dict[str, Any]) -> str:
    if variant["settings"]["text"] is None:
        steps = variant["settings"].get("steps_trained")
        return "the quickstart's own model" + (f" ({steps:,} steps)" if steps else "")
    return variant["variant"]


def render(payload: dict[str, Any]) -> str:
    rows = []
    for variant in payload["variants"]:
        mlm = variant["heldout_mlm_accuracy"]
        cells = []
        for ours, twin in zip(variant["pretrained"], variant["random"], strict=True):
            above = sum(min(ours["values"]) > t for t in twin["values"]) == len(twin["values"])
            cells.append(f"{ours['mean']:.3f} / {twin['mean']:.3f}{' (every seed above)' if above else ''}")
        label = _label(variant)
        rows.append([label, "" if mlm is None else f"{100 * mlm:.1f}", *cells])
    table = markdown_table(["variant", "held-out MLM acc. %", *(f"{n:,} labels: pre-trained / twin" for n in SIZES)],
                           rows)
    probes = [f"- {_model_of(v)}: last layer, pre-trained / twin at {', '.join(f'{n:,}' for n in SIZES)}: "
              + ", ".join(f"{a:.3f} / {b:.3f}" for a, b in zip(v["probe"]["pretrained"][-1], v["probe"]["random"][-1],
                                                             strict=True))
              for v in payload["variants"] if "probe" in v]
    probe_text = ("\n\nFrozen probe (logistic regression on mean-pooled vectors, same samples):\n" + "\n".join(probes)
                  if probes else "")
    return (f"## The quickstart's levers, one at a time\n\n`python -m experiments.quickstart_levers --quickstart "
            f"runs/quickstart --probe`. SST-2 dev accuracy (mean of seeds 1-3), each pre-trained model against its "
            f"own random twin; the quickstart itself is in the [quickstart section](#quickstart). Variants as in the "
            f"script's docstring; 'every seed above' marks a size where every pre-trained seed beat every twin "
            f"seed (answering the majority class scores 0.509).\n\n{table}{probe_text}\n\n{_machines(payload)}\n")


def _machines(payload: dict[str, Any]) -> str:
    """Each machine the variants ran on, with the variants it ran (the rows were filled in over time)."""
    machines: dict[str, list[str]] = {}
    for variant in payload["variants"]:
        machines.setdefault(variant.get("machine_line", payload["machine_line"]), []).append(variant["variant"])
    if len(machines) == 1:
        return next(iter(machines))
    return "\n".join(f"- {', '.join(names)}: {where}" for where, names in machines.items())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quickstart", type=Path, default=ROOT / "runs" / "quickstart")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "quickstart-levers")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one job per core).")
    parser.add_argument("--probe", action="store_true", help="Also the frozen probe of each start.")
    parser.add_argument("--render", action="store_true", help="Rewrite the section from the saved JSON only.")
    parser.add_argument("--fresh", action="store_true", help="Drop the saved variants instead of adding to them.")
    args = parser.parse_args(argv)
    if args.render:
        payload = json.loads((RESULTS / "quickstart_levers.json").read_text())
        publish("quickstart_levers", "quickstart-levers", payload, render)
        return
    if not (args.quickstart / "sst2-subsets").is_dir():
        sys.exit(f"{args.quickstart}: run `bertforge quickstart --out {args.quickstart}` first")
    import torch

    torch.set_num_threads(args.threads)
    info = machine()
    fresh = [run_variant(name, args, machine_line(info)) for name in args.variants]
    saved = RESULTS / "quickstart_levers.json"
    earlier = [] if args.fresh or not saved.is_file() else json.loads(saved.read_text())["variants"]
    names = {variant["variant"] for variant in fresh}  # a variant run again replaces its earlier row
    payload = {"machine": info, "machine_line": machine_line(info),
               "variants": [v for v in earlier if v["variant"] not in names] + fresh}
    publish("quickstart_levers", "quickstart-levers", payload, render)


if __name__ == "__main__":
    main()
