"""The distillation losses, and `Distiller`: the module the training loop trains (student + projection,
with the teacher beside it, frozen and not saved).

Shapes: B rows, T tokens, K classes, H hidden width, A attention heads, V vocabulary.

- soft targets (Hinton et al. 2015): KL(softmax(z_t / T) || softmax(z_s / T)) * T^2, per row (per token
  for tagging, per start / end distribution for span QA); a sigmoid per label for multi-label heads; for
  a regression head, the MSE between the two outputs (a single number has no distribution);
- hard labels: the head's own loss on the rows that have labels (unlabelled rows carry placeholders);
- hidden states (TinyBERT): the MSE between student layer j and its teacher layer, the student's
  vectors mapped to the teacher's width by one learned Linear when the widths differ;
- attention (MiniLM): the KL between the last layer's attention distributions, per query token;
- relation (MiniLM's value relation): the KL between softmax(h h^T / sqrt(d)) of the last layer's
  outputs, which needs no equal widths or head counts;
- masked LM (general distillation): the soft-target KL between the masked-LM distributions at the
  masked positions;
- sentence vectors (sentence distillation, Reimers & Gurevych 2020): 1 - cosine between the student's
  mean-pooled last layer, mapped to the teacher's width by one learned Linear, and the teacher's
  sentence vector of the same text; the two models may tokenize differently.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.config import IGNORE_INDEX
from bertforge.distill.recipe import DistillLosses
from bertforge.model.base import mean_of_real_tokens, sequence_classification_loss, token_classification_loss

# a finite stand-in for "impossible" (padding in a span distribution, a padded key): exp() of it is 0
# in fp32, and unlike -inf (or finfo.min / T) it never makes inf - inf
_NEG = -1e4
_EPS = 1e-12
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` (same shape, 0/1) is set; all of them without one."""
    if mask is None:
        return values.mean()
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def soft_target_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """KL(teacher_T || student_T) * T^2 over the last axis of (..., K) logits, averaged over the rows
    (the positions of the leading axes where `mask`, shape (...), is set)."""
    t = temperature
    log_s = F.log_softmax(student.float() / t, dim=-1)  # (..., K)
    log_t = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)  # (...,)
    return _masked_mean(kl, mask) * t * t


def binary_soft_target_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """Multi-label heads: the KL between the per-label Bernoulli distributions sigmoid(z / T), summed over
    the K labels of (B, K) logits, averaged over the rows, times T^2."""
    t = temperature
    s, z = student.float() / t, teacher.float() / t
    p = torch.sigmoid(z)
    kl = p * (F.logsigmoid(z) - F.logsigmoid(s)) + (1 - p) * (F.logsigmoid(-z) - F.logsigmoid(-s))  # (B, K)
    return kl.sum(-1).mean() * t * t


def hidden_state_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor], layer_map: Sequence[int],
                      mask: torch.Tensor, projection: nn.Module | None = None) -> torch.Tensor:
    """Mean over the mapped layers of the MSE between student hidden state j (B, T, Hs), projected to the
    teacher's width, and teacher hidden state `layer_map[j]` (B, T, Ht), over the real tokens (mask (B, T))."""
    losses = []
    for j, target in enumerate(layer_map):
        mine = student[j].float()
        if projection is not None:
            mine = projection(mine)  # (B, T, Ht)
        per_token = (mine - teacher[target].float()).pow(2).mean(-1)  # (B, T)
        losses.append(_masked_mean(per_token, mask))
    return torch.stack(losses).mean()


def attention_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL between attention distributions (B, A, T, T) per head and query token, averaged over the heads
    and the real query tokens (mask (B, T)). With other head counts both are averaged over their heads
    first (a mean of distributions is one)."""
    if student.shape[1] != teacher.shape[1]:
        student, teacher = student.mean(1, keepdim=True), teacher.mean(1, keepdim=True)  # (B, 1, T, T)
    p_t, p_s = teacher.float(), student.float()
    # padded keys have probability 0 in both: xlogy gives 0 there, and the clamp keeps log finite
    kl = (torch.xlogy(p_t, p_t) - p_t * p_s.clamp(min=_EPS).log()).sum(-1)  # (B, A, T)
    return _masked_mean(kl, mask[:, None, :].expand_as(kl))


def self_relation(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log softmax(h h^T / sqrt(d)) of (B, T, H) vectors over the real keys: (B, T, T) log-probabilities."""
    h = hidden.float()
    scores = h @ h.transpose(1, 2) / math.sqrt(h.shape[-1])  # (B, T, T)
    scores = scores.masked_fill(mask[:, None, :] == 0, _NEG)
    return F.log_softmax(scores, dim=-1)


def relation_loss(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL between the teacher's and the student's self-relations of their last layer's outputs
    ((B, T, Ht) and (B, T, Hs), any widths), averaged over the real query tokens."""
    log_t, log_s = self_relation(teacher, mask), self_relation(student, mask)  # (B, T, T)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)  # (B, T)
    return _masked_mean(kl, mask)


def sentence_vector_loss(student_vectors: torch.Tensor, teacher_vectors: torch.Tensor) -> torch.Tensor:
    """Mean over rows of 1 - cos(student row, teacher row): (B, D) and (B, D) -> a scalar."""
    return (1.0 - F.cosine_similarity(student_vectors.float(), teacher_vectors.float(), dim=-1, eps=1e-8)).mean()


class SentenceDistiller(nn.Module):
    """The student encoder and the Linear that maps its mean-pooled vector to the teacher's width.

    The teacher is not here at all: its sentence vectors are computed once before training and arrive
    as the batch's `labels` (B, D), so a step costs the student's forward and backward only. The loop
    checkpoints the student and the projection; only the student is saved as the result."""

    def __init__(self, student: nn.Module, teacher_width: int) -> None:
        super().__init__()
        self.student = student
        self.projection = nn.Linear(student.config.hidden_size, teacher_width)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                **_: Any) -> DistillOutput:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.student(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state  # (B, T, H)
        vectors = self.projection(mean_of_real_tokens(hidden, attention_mask))  # (B, D)
        if labels is None:
            return DistillOutput(loss=vectors.new_zeros(()), parts={"vectors": vectors.detach()})
        loss = sentence_vector_loss(vectors, labels)
        return DistillOutput(loss=loss, parts={"cosine": (1.0 - loss).detach()})


def uniform_layer_map(student_layers: int, teacher_layers: int) -> list[int]:
    """Teacher hidden state (0: embeddings, i: layer i's output) for each student hidden state 0..Ls:
    spread evenly, the embeddings to the embeddings and the top to the top (TinyBERT's mapping)."""
    return [round(j * teacher_layers / student_layers) for j in range(student_layers + 1)]


def _zero(like: torch.Tensor) -> torch.Tensor:
    """0 that still belongs to the graph (a batch with nothing to score must backpropagate too)."""
    return like.float().sum() * 0.0


@dataclass
class DistillOutput:
    loss: torch.Tensor  # the weighted sum the loop minimises
    parts: dict[str, torch.Tensor] = field(default_factory=dict)  # each term before weighting, detached


class Distiller(nn.Module):
    """The student, the projection of the hidden-state loss, and (not a submodule) the frozen teacher.

    The loop trains, checkpoints and restores only this module's own parameters, so a checkpoint holds
    the student and the projection; the teacher stays in eval mode, without gradients, outside the
    state dict. `forward(**batch).loss` is the distillation loss of a batch.

    `job` is the head's job (registry.JOBS) in task mode, None in general mode; `problem_type` the
    sequence classifier's (single-label, multi-label or regression).
    """

    def __init__(self, student: nn.Module, teacher: nn.Module, losses: DistillLosses, *, job: str | None,
                 problem_type: str | None = None, layer_map: Sequence[int] = ()) -> None:
        super().__init__()
        self.student = student
        self._frozen = [teacher.eval().requires_grad_(False)]  # a list: not registered, not saved, not trained
        self.losses, self.job, self.problem_type = losses, job, problem_type
        self.layer_map = list(layer_map)
        widths = (student.config.hidden_size, teacher.config.hidden_size)
        self.projection = nn.Linear(*widths) if losses.hidden_weight > 0 and widths[0] != widths[1] else None

    @property
    def teacher(self) -> nn.Module:
        return self._frozen[0]

    def train(self, mode: bool = True) -> Distiller:
        super().train(mode)
        self.teacher.eval()  # whatever the loop asks of the student, the teacher predicts without dropout
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                start_positions: torch.Tensor | None = None, end_positions: torch.Tensor | None = None,
                **_: Any) -> DistillOutput:
        w = self.losses
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if self.job is None and labels is not None and w.mlm_weight == 0:
            # general distillation without the MLM term: both read the original text, not the masked copy
            input_ids = torch.where(labels != IGNORE_INDEX, labels, input_ids)
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            inputs["token_type_ids"] = token_type_ids
        extras = {"output_hidden_states": w.hidden_weight > 0 or w.relation_weight > 0,
                  "output_attentions": w.attention_weight > 0}
        if self.teacher.device != input_ids.device:
            self.teacher.to(input_ids.device)
        with torch.no_grad():
            teacher = self.teacher(**inputs, **extras)
        student = self.student(**inputs, **extras)
        mask = attention_mask.reshape(-1, attention_mask.shape[-1])  # (B, T); multiple choice: (B * C, T)

        parts: dict[str, torch.Tensor] = {}
        if self.job is not None:
            soft, hard = self._soft(student, teacher, mask), self._hard(student, labels, start_positions, end_positions)
            parts.update(soft_loss=soft, hard_loss=hard)
            loss = (1 - w.alpha) * soft + w.alpha * hard
        else:
            loss = _zero(student.hidden_states[-1] if student.hidden_states else input_ids.float())
            if w.mlm_weight > 0:
                scored = labels != IGNORE_INDEX  # (B, T): the masked positions
                parts["mlm_kl"] = soft_target_loss(student.mlm_logits, teacher.mlm_logits, w.temperature, scored)
                loss = loss + w.mlm_weight * parts["mlm_kl"]
        if w.hidden_weight > 0:
            parts["hidden_loss"] = hidden_state_loss(student.hidden_states, teacher.hidden_states, self.layer_map,
                                                     mask, self.projection)
            loss = loss + w.hidden_weight * parts["hidden_loss"]
        if w.attention_weight > 0:
            parts["attention_loss"] = attention_loss(student.attentions[-1], teacher.attentions[-1], mask)
            loss = loss + w.attention_weight * parts["attention_loss"]
        if w.relation_weight > 0:
            parts["relation_loss"] = relation_loss(student.hidden_states[-1], teacher.hidden_states[-1], mask)
            loss = loss + w.relation_weight * parts["relation_loss"]
        return DistillOutput(loss, {name: value.detach() for name, value in parts.items()})

    # ---- task distillation's two terms
    def _soft(self, student: Any, teacher: Any, mask: torch.Tensor) -> torch.Tensor:
        t = self.losses.temperature
        if self.job == "question-answering":  # a distribution over the T positions, padding impossible
            terms = []
            for name in ("start_logits", "end_logits"):
                mine, theirs = (getattr(out, name).float().masked_fill(mask == 0, _NEG) for out in (student, teacher))
                terms.append(soft_target_loss(mine, theirs, t))
            return torch.stack(terms).mean()
        if self.job == "token-classification":  # (B, T, K): one distribution per real token
            return soft_target_loss(student.logits, teacher.logits, t, mask)
        if self.problem_type == "regression" or student.logits.shape[-1] == 1:
            return F.mse_loss(student.logits.float(), teacher.logits.float())
        if self.problem_type == "multi_label_classification":
            return binary_soft_target_loss(student.logits, teacher.logits, t)
        return soft_target_loss(student.logits, teacher.logits, t)  # (B, K); multiple choice (B, C)

    def _hard(self, student: Any, labels: torch.Tensor | None, start: torch.Tensor | None,
              end: torch.Tensor | None) -> torch.Tensor:
        """The head's loss on the labelled rows; unlabelled ones carry -100 (classes, tags, spans) or NaN
        (regression values, multi-label vectors), and a batch without labels adds 0."""
        if self.job == "question-answering":
            if start is None or end is None:
                return _zero(student.start_logits)
            length = student.start_logits.shape[1]
            terms = []
            for logits, positions in ((student.start_logits, start), (student.end_logits, end)):
                positions = positions.masked_fill(positions >= length, IGNORE_INDEX)  # outside the window
                if not bool((positions != IGNORE_INDEX).any()):
                    return _zero(student.start_logits)
                terms.append(F.cross_entropy(logits.float(), positions, ignore_index=IGNORE_INDEX))
            return torch.stack(terms).mean()
        logits = student.logits
        if labels is None:
            return _zero(logits)
        if self.job == "token-classification":
            return token_classification_loss(logits, labels) if bool((labels != IGNORE_INDEX).any()) else _zero(logits)
        if labels.is_floating_point():  # regression values (B,) or multi-label rows (B, K)
            known = ~torch.isnan(labels) if labels.dim() == 1 else ~torch.isnan(labels).any(-1)
        else:
            known = labels != IGNORE_INDEX  # (B,)
        if not bool(known.any()):
            return _zero(logits)
        own_loss = getattr(self.student, "loss", None)  # a sequence classifier's, with its label weights
        if self.job == "sequence-classification" and callable(own_loss):
            return own_loss(logits[known], labels[known])
        if self.job == "sequence-classification":
            return sequence_classification_loss(logits[known], labels[known], self.problem_type)
        return F.cross_entropy(logits[known].float(), labels[known])  # multiple choice: (B, C)


__all__ = ["MODEL_INPUTS", "DistillOutput", "Distiller", "SentenceDistiller", "attention_loss",
           "binary_soft_target_loss", "hidden_state_loss", "relation_loss", "self_relation", "sentence_vector_loss",
           "soft_target_loss", "uniform_layer_map"]
