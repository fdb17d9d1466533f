"""Scores of a pre-training model on held-out batches: masked-LM loss and accuracy over every predicted
token, the sentence task's, replaced-token detection's and next-token prediction's, and a probe of how
much the masked-LM predictions use the context and its order."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from bertforge.config import IGNORE_INDEX

if TYPE_CHECKING:
    import torch
    from torch import nn


def pretraining_metrics(model: nn.Module, batches: Any, max_batches: int = 0, objective: str = "nsp") -> dict[str, float]:
    """MLM loss and accuracy over all predicted tokens (not a mean of batch means); NSP/SOP loss and accuracy;
    the span-boundary loss when the model has that head. With replaced-token detection (objective rtd)
    the MLM figures are the generator's, and the discriminator's are added over all real tokens: its loss
    (`rtd_loss`), its accuracy on the replaced and on the original tokens (`rtd_accuracy_replaced`,
    `rtd_accuracy_original`) and the share of tokens replaced (`replaced_fraction`). A left-to-right LM
    (objective ltr) has no MLM figures but its own, over every scored next token: `next_token_loss`,
    `next_token_accuracy` and `perplexity` (exp of the loss)."""
    import torch

    from bertforge.train.loop import to_device

    if objective == "ltr":
        return _next_token_metrics(model, batches, max_batches)
    device = next(model.parameters()).device
    mlm = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    sentence = torch.zeros(3, dtype=torch.float64)
    sbo = torch.zeros(2, dtype=torch.float64)  # sum of batch losses, batches (a mean of batch means)
    rtd = torch.zeros(5, dtype=torch.float64)  # loss sum, replaced right, replaced, originals right, originals
    for number, cpu_batch in enumerate(batches):
        if max_batches and number >= max_batches:
            break
        batch = to_device(cpu_batch, device)
        out = model(**batch)
        targets = batch["labels"][batch["labels"] != IGNORE_INDEX]  # (N,) in the order of out.mlm_logits
        mlm += _sums(out.mlm_logits.float(), targets)  # logits (N, V)
        if "next_sentence_label" in batch and out.nsp_logits is not None:
            sentence += _sums(out.nsp_logits.float(), batch["next_sentence_label"])  # logits (B, 2)
        if getattr(out, "sbo_loss", None) is not None:
            sbo += torch.tensor([out.sbo_loss.item(), 1.0], dtype=torch.float64)
        if getattr(out, "rtd_logits", None) is not None:
            rtd += _detection_sums(out.rtd_logits.float(), out.rtd_labels)  # (B, T) each
    metrics = {"mlm_loss": (mlm[0] / mlm[2].clamp(min=1)).item(), "mlm_accuracy": (mlm[1] / mlm[2].clamp(min=1)).item()}
    if sentence[2] > 0:
        metrics[f"{objective}_loss"] = (sentence[0] / sentence[2]).item()
        metrics[f"{objective}_accuracy"] = (sentence[1] / sentence[2]).item()
    if sbo[1] > 0:
        metrics["sbo_loss"] = (sbo[0] / sbo[1]).item()
    if rtd[2] + rtd[4] > 0:
        metrics["rtd_loss"] = (rtd[0] / (rtd[2] + rtd[4])).item()
        if rtd[2] > 0:
            metrics["rtd_accuracy_replaced"] = (rtd[1] / rtd[2]).item()
        if rtd[4] > 0:
            metrics["rtd_accuracy_original"] = (rtd[3] / rtd[4]).item()
        metrics["replaced_fraction"] = (rtd[2] / (rtd[2] + rtd[4])).item()
    return metrics


def _next_token_metrics(model: nn.Module, batches: Any, max_batches: int) -> dict[str, float]:
    """Next-token loss, accuracy and perplexity of a left-to-right LM over all scored positions (not a
    mean of batch means). With labels the model returns logits for the scored positions only, in the
    row-major order of `labels[:, 1:] != -100` (position i is scored against the token at i + 1)."""
    import math

    import torch

    from bertforge.train.loop import to_device

    device = next(model.parameters()).device
    sums = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    for number, cpu_batch in enumerate(batches):
        if max_batches and number >= max_batches:
            break
        batch = to_device(cpu_batch, device)
        out = model(**batch)
        following = batch["labels"][:, 1:]  # (B, T - 1)
        sums += _sums(out.logits.float(), following[following != IGNORE_INDEX])  # logits (N, V)
    loss = (sums[0] / sums[2].clamp(min=1)).item()
    return {"next_token_loss": loss, "next_token_accuracy": (sums[1] / sums[2].clamp(min=1)).item(),
            "perplexity": math.exp(min(loss, 700.0))}  # exp overflows a float past ~709


def _detection_sums(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Replaced-token detection on one batch's scored tokens (labels 1 replaced, 0 original, -100 not
    scored): (loss sum, replaced called replaced, replaced, originals called original, originals)."""
    import torch
    import torch.nn.functional as F

    scored = labels != IGNORE_INDEX
    said, replaced = logits[scored] > 0, labels[scored] == 1
    loss = F.binary_cross_entropy_with_logits(logits[scored], replaced.float(), reduction="sum")
    return torch.tensor([loss.item(), (said & replaced).sum().item(), replaced.sum().item(),
                         (~said & ~replaced).sum().item(), (~replaced).sum().item()], dtype=torch.float64)


def _sums(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(loss sum, correct, count) of one batch, as float64 on the CPU."""
    import torch
    import torch.nn.functional as F

    return torch.tensor([F.cross_entropy(logits, targets, reduction="sum").item(),
                         (logits.argmax(-1) == targets).sum().item(), targets.numel()], dtype=torch.float64)


# The three ways `mlm_context_probe` shows the model its held-out sequences.
CONTEXT_VARIANTS = ("context intact", "shuffled order", "no context")


def context_variants(batch: dict[str, torch.Tensor], special_ids: list[int], mask_id: int,
                     generator: torch.Generator) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, labels) for: the context intact, its order shuffled, and the context removed."""
    import torch

    ids, labels = batch["input_ids"], batch["labels"]  # (B, T) each
    words = (batch["attention_mask"] == 1) & ~torch.isin(ids, torch.tensor(special_ids))  # (B, T)
    no_context = ids.masked_fill(words & (labels == IGNORE_INDEX), mask_id)
    shuffled_ids, shuffled_labels = ids.clone(), labels.clone()
    for row in range(ids.shape[0]):
        positions = words[row].nonzero().squeeze(1)  # masked pieces move with their labels
        order = positions[torch.randperm(len(positions), generator=generator)]
        shuffled_ids[row, positions], shuffled_labels[row, positions] = ids[row, order], labels[row, order]
    return dict(zip(CONTEXT_VARIANTS, ((ids, labels), (shuffled_ids, shuffled_labels), (no_context, labels)),
                    strict=True))


def mlm_context_probe(model: nn.Module, batches: Any, special_ids: list[int], mask_id: int,
                      max_batches: int = 0, seed: int = 0) -> dict[str, float]:
    """How much context the model uses: held-out MLM accuracy (%) three ways, on the same masked pieces.

    "context intact" is the usual score; "shuffled order" moves each sequence's unmasked pieces among
    their positions (the same words, no order: what a bag-of-words model sees); "no context" replaces
    every unmasked piece by [MASK] (position and segment only). A model still at the unigram /
    bag-of-words stage of pre-training scores about the same on the first two; the difference is what
    word order is worth to it. Also: the share of the most frequent target piece, and the pieces scored.
    `batches` are statically masked validation batches (a `PretrainingLoader` over split "valid").
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    variants: dict[str, list[dict[str, torch.Tensor]]] = defaultdict(list)  # variant -> its batches
    targets: Counter[int] = Counter()
    for number, batch in enumerate(batches):
        if max_batches and number >= max_batches:
            break
        for name, (ids, labels) in context_variants(batch, special_ids, mask_id, generator).items():
            variants[name].append({**batch, "input_ids": ids, "labels": labels})
        targets.update(batch["labels"][batch["labels"] != IGNORE_INDEX].tolist())
    scored = sum(targets.values())
    if scored == 0:
        raise ValueError("no masked validation pieces to score")
    with torch.no_grad():
        result = {name: round(100 * pretraining_metrics(model, variants[name])["mlm_accuracy"], 2)
                  for name in CONTEXT_VARIANTS}
    result["most frequent piece"] = round(100 * targets.most_common(1)[0][1] / scored, 2)
    result["scored pieces"] = scored
    return result
