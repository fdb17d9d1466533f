"""Fine-tuning code paths side by side: bertforge against transformers' Trainer, piece by piece, without training.

A quality gap between the two on the same data and settings has one of a few causes; this checks the
deterministic ones directly on the real model and data, in about a minute:

    tokenisation   the input ids and segment ids of every training pair
    head and loss  logits, loss and the whole gradient of one batch with the same new-layer weights
                   (eval mode, so dropout is out of the comparison)
    dropout        the same batch in train mode, many draws each side: the mean loss and how far the
                   logits move from their eval-mode values (a dropout missing, doubled or at another
                   rate shows here; the masks themselves cannot match, the two draw them differently)
    new layer      the initial weight scale and bias of the new output layer
    optimiser      class, eps, betas, fused kernel, which parameters get weight decay
    schedule       the learning rate of every step (warm-up rounding included)
    batches        how the training batches are drawn, and what that does to them (label spread per
                   batch, padding), for length-grouped and plain random batches

    python -m experiments.finetune_parity --task STS-B          # writes experiments/results/finetune_parity-STS-B.json

What remains different after this are the random streams themselves (data order, dropout masks, the
new layer's draw), which only many seeds average out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import RESULTS, ROOT, machine

LR, EPOCHS, BATCH, WARMUP, WEIGHT_DECAY, EPS, MAX_LENGTH = 2e-5, 3, 32, 0.1, 0.01, 1e-6, 128
DROPOUT_DRAWS = 100


def _hf_name(ours: str) -> str:
    """Our parameter name in transformers' BertForSequenceClassification naming (the fused qkv excepted)."""
    replace = [("layers.", "layer."), ("attention.out.", "attention.output.dense."),
               ("attention_norm", "attention.output.LayerNorm"), ("ffn.up", "intermediate.dense"),
               ("ffn.down", "output.dense"), ("ffn_norm", "output.LayerNorm"), ("layer_norm", "LayerNorm")]
    for a, b in replace:
        ours = ours.replace(a, b)
    return ours


def dropout_noise(model: Any, batch: dict[str, Any], draws: int = DROPOUT_DRAWS) -> dict[str, float]:
    """Train-mode forward passes of one batch: the loss and the logits' displacement from eval mode."""
    import torch

    with torch.no_grad():
        model.eval()
        reference = model(**batch).logits  # (B, num_labels)
        model.train()
        losses, shifts = [], []
        for _ in range(draws):
            out = model(**batch)
            losses.append(float(out.loss))
            shifts.append(float((out.logits - reference).pow(2).mean().sqrt()))
        model.eval()
    return {"loss_mean": float(np.mean(losses)), "loss_se": float(np.std(losses, ddof=1) / np.sqrt(draws)),
            "logit_shift_rms_mean": float(np.mean(shifts)),
            "logit_shift_rms_se": float(np.std(shifts, ddof=1) / np.sqrt(draws))}


def compare(task: str, model_dir: Path, data: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

    from bertforge.finetune import FinetuneOptim, load_for_task
    from bertforge.model import label_maps
    from bertforge.tasks import make_task
    from bertforge.tasks.base import TaskBatches, collate
    from bertforge.tokenizer import BertTokenizer
    from bertforge.train.optim import build_optimizer, build_scheduler

    spec = make_task("glue", task)
    examples = spec.read(data, "train")
    features = spec.featurize(examples, BertTokenizer.from_pretrained(model_dir), MAX_LENGTH)
    hf_tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pairs = examples[0].text_b is not None
    encoded = hf_tokenizer([e.text_a for e in examples], [e.text_b for e in examples] if pairs else None,
                           truncation=True, max_length=MAX_LENGTH)
    token_mismatches = sum(f.inputs["input_ids"] != ids or f.inputs["token_type_ids"] != types for f, ids, types
                           in zip(features, encoded["input_ids"], encoded["token_type_ids"], strict=True))

    labels = spec.label_names(examples)
    regression = labels == 1
    torch.manual_seed(0)
    ours = load_for_task(spec.job, model_dir, **label_maps(labels))
    theirs = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=1 if regression else len(labels), problem_type="regression" if regression else None)
    new_layer = {"ours_weight_std": float(ours.classifier.weight.detach().std()),
                 "theirs_weight_std": float(theirs.classifier.weight.detach().std()),
                 "ours_bias_abs_max": float(ours.classifier.bias.detach().abs().max()),
                 "theirs_bias_abs_max": float(theirs.classifier.bias.detach().abs().max())}
    with torch.no_grad():
        ours.classifier.weight.copy_(theirs.classifier.weight)
        ours.classifier.bias.copy_(theirs.classifier.bias)
    batch = collate(features[:BATCH], 0)
    ours.eval()
    theirs.eval()
    out_ours, out_theirs = ours(**batch), theirs(**batch)
    out_ours.loss.backward()
    out_theirs.loss.backward()
    grads_theirs = {n: p.grad for n, p in theirs.named_parameters()}
    worst_grad = 0.0
    for name, param in ours.named_parameters():
        if ".qkv." in name:  # ours is one fused projection: theirs is query, key and value stacked
            stem = _hf_name(name).replace("qkv.", "self.")
            kind = name.rsplit(".", 1)[1]
            reference = torch.cat([grads_theirs[stem.replace(f"self.{kind}", f"self.{q}.{kind}")]
                                   for q in ("query", "key", "value")])
        else:
            reference = grads_theirs[_hf_name(name)]
        worst_grad = max(worst_grad, float((param.grad - reference).abs().max() / (reference.abs().max() + 1e-12)))
    head = {"loss_ours": float(out_ours.loss), "loss_theirs": float(out_theirs.loss),
            "logits_max_abs_diff": float((out_ours.logits - out_theirs.logits).abs().max()),
            "gradient_max_relative_diff": worst_grad}
    torch.manual_seed(1)
    dropout = {"draws": DROPOUT_DRAWS, "ours": dropout_noise(ours, batch), "theirs": dropout_noise(theirs, batch)}

    steps = EPOCHS * -(-len(features) // BATCH)
    args = TrainingArguments(output_dir=str(ROOT / ".parity-tmp"), learning_rate=LR, weight_decay=WEIGHT_DECAY,
                             adam_epsilon=EPS, num_train_epochs=EPOCHS, warmup_steps=WARMUP,
                             lr_scheduler_type="linear", use_cpu=True, report_to="none",
                             per_device_train_batch_size=BATCH, save_strategy="no")
    trainer = Trainer(model=theirs, args=args)
    trainer.create_optimizer_and_scheduler(steps)
    config = FinetuneOptim(lr=LR, warmup_ratio=WARMUP, weight_decay=WEIGHT_DECAY, adam_eps=EPS)
    optimizer_ours = build_optimizer(ours, config)
    scheduler_ours = build_scheduler(optimizer_ours, config, steps)

    def decayed(optimizer: Any, model: Any, rename: Any) -> list[str]:
        names = {id(p): rename(n) for n, p in model.named_parameters()}
        return sorted({names[id(p)] for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]})

    def rates(optimizer: Any, scheduler: Any) -> list[float]:
        out = []
        for _ in range(steps):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    def fuse_qkv(name: str) -> str:  # theirs: three projections, ours: one
        for part in ("self.query.", "self.key.", "self.value."):
            name = name.replace(part, "qkv.")
        return name

    ours_decayed = decayed(optimizer_ours, ours, _hf_name)
    theirs_decayed = sorted(set(decayed(trainer.optimizer, theirs, fuse_qkv)))
    lr_ours, lr_theirs = rates(optimizer_ours, scheduler_ours), rates(trainer.optimizer, trainer.lr_scheduler)
    differing_steps = [i for i, (a, b) in enumerate(zip(lr_ours, lr_theirs, strict=True)) if abs(a - b) > 1e-12]
    optimiser = {
        "ours": {k: optimizer_ours.defaults[k] for k in ("eps", "betas", "weight_decay", "fused")},
        "theirs": {k: trainer.optimizer.defaults[k] for k in ("eps", "betas", "weight_decay", "fused")},
        "classes": [type(optimizer_ours).__name__, type(trainer.optimizer).__name__],
        "decayed_tensors": len(ours_decayed), "same_decay_set": ours_decayed == theirs_decayed,
        "decayed_only_ours": sorted(set(ours_decayed) - set(theirs_decayed)),
        "decayed_only_theirs": sorted(set(theirs_decayed) - set(ours_decayed)),
    }
    schedule = {"steps": steps, "differing_steps": differing_steps[:10], "n_differing": len(differing_steps),
                "lr_ours_first3": lr_ours[:3], "lr_theirs_first3": lr_theirs[:3],
                "sum_ratio": sum(lr_ours) / sum(lr_theirs)}

    gold = np.asarray(spec.gold(examples), dtype=float)
    lengths = np.array([f.length for f in features])
    batching = {}
    for name, groups in (("grouped", 50), ("random", 1)):
        order = TaskBatches(features, BATCH, seed=1, bucket_batches=groups).order(0)
        padded = sum(int(lengths[b].max()) * len(b) for b in order)
        batching[name] = {"std_of_batch_mean_label": float(np.std([gold[b].mean() for b in order])),
                          "padding_fraction": 1 - float(lengths.sum()) / padded}
    batching["length_label_correlation"] = float(np.corrcoef(lengths, gold)[0, 1])
    return {"task": task, "train_examples": len(examples), "token_mismatches": token_mismatches,
            "new_layer": new_layer, "head": head, "dropout": dropout, "optimiser": optimiser, "schedule": schedule,
            "batching": batching, "machine": machine()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="STS-B")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "glue")
    parser.add_argument("--model", type=Path, default=None, help="default: all-MiniLM-L6-v2 from PyPI")
    args = parser.parse_args()
    import torch

    from experiments.hf_finetune_baseline import default_model

    torch.set_num_threads(1)
    result = compare(args.task, args.model or default_model(), args.data)
    path = RESULTS / f"finetune_parity-{args.task}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))


if __name__ == "__main__":
    main()
