"""ELECTRA's heads on one ElectraModel backbone, with transformers' module names so that their keys
pass through unchanged: the two pre-training halves and the fine-tuning heads.

- the discriminator (`ElectraForPreTraining`): one logit per token, "was this token replaced?",
  trained by binary cross-entropy against 0/1 labels of the replaced positions;
- the generator (`ElectraForMaskedLM`): a masked LM whose output projection is the word-embedding
  matrix (of width E), so a narrow generator still predicts over the shared vocabulary table.

and the joint pre-training model built on the two (`ElectraForJointPreTraining`, no job of its own:
`ElectraForPreTraining.with_generator` makes it): the generator's samples replace the masked tokens,
and the discriminator tells the replaced tokens from the original ones.

Losses are computed here when labels are given (`loss = model(**batch).loss`), with Hugging Face's
label conventions (-100 where a position is not scored).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.checkpoint import LoadReport, load_weights_into
from bertforge.config import IGNORE_INDEX
from bertforge.model.base import (
    EncoderOutput,
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    WeightedClassifier,
    num_labels,
    problem_type_of,
    span_logits_and_loss,
    token_classification_loss,
)
from bertforge.model.electra.config import ElectraConfig
from bertforge.model.electra.modeling import ElectraModel, ElectraPreTrainedModel
from bertforge.model.layers import activation

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer

# Joint pre-training (Clark et al., 2020)
GENERATOR_SIZE = 0.25  # the paper's generator: a quarter of the discriminator's width
DISCRIMINATOR_WEIGHT = 50.0  # lambda in L_MLM + lambda L_Disc
GENERATOR_DIR = "generator"  # where the generator is saved, beside the discriminator's files


def head_dropout(config: ElectraConfig) -> nn.Dropout:
    """The sentence and token heads' dropout: `classifier_dropout`, or hidden_dropout_prob when it is null."""
    rate = config.classifier_dropout
    return nn.Dropout(config.hidden_dropout_prob if rate is None else rate)


def named_activation(name: str | None) -> nn.Module:
    """The feed-forward's activations, plus tanh and none ("linear" or null), which the summary may name."""
    if name is None or name == "linear":
        return nn.Identity()
    return nn.Tanh() if name == "tanh" else activation(name)


# ------------------------------------------------------------------------------------------------
# The discriminator: replaced-token detection
# ------------------------------------------------------------------------------------------------
def replaced_token_detection_loss(
    logits: torch.Tensor,  # (B, T): one "replaced" logit per token
    labels: torch.Tensor,  # (B, T): 1 replaced, 0 original; -100 not scored
    attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
) -> torch.Tensor:
    """The discriminator's loss: the mean binary cross-entropy over the real tokens, as transformers
    computes it (every real token scored, padding never). Labels of -100 leave a position out as well,
    for an objective that would not score the special tokens."""
    scored = labels != IGNORE_INDEX  # (B, T)
    if attention_mask is not None:
        scored = scored & (attention_mask == 1)
    targets = labels[scored].float()  # (N,)
    if not targets.numel():  # nothing to score: a zero that still has a graph
        return logits.sum() * 0.0
    return F.binary_cross_entropy_with_logits(logits[scored].float(), targets)


class DiscriminatorPredictions(nn.Module):
    """dense + the encoder's activation + `dense_prediction`: H -> H -> one logit per token."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (...)
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class ElectraForPreTraining(ElectraPreTrainedModel):
    """The discriminator: for every token, the logit that it was replaced (by the generator's sample).

    With `labels` (B, T) of 1 at replaced and 0 at original tokens, the loss is their binary
    cross-entropy over the real tokens (`replaced_token_detection_loss`). This is the model that
    fine-tuning starts from; its head goes unused under a task head.
    """

    job: ClassVar[str | None] = "pretraining"
    head_prefixes = ("discriminator_predictions.",)
    # ONNX outputs (name, output attribute, per token): not BERT's pre-training pair (mlm_logits,
    # nsp_logits) that export reads for this job, but the one logit per token.
    onnx_outputs: ClassVar[tuple[tuple[str, str, bool], ...]] = (("logits", "logits", True),)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.discriminator_predictions = DiscriminatorPredictions(config)
        self.init_modules(self.discriminator_predictions)

    def replaced_token_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (...)
        """The discriminator head on final token vectors."""
        return self.discriminator_predictions(vectors)

    @classmethod
    def with_generator(cls, config: ElectraConfig, *, generator_size: float = GENERATOR_SIZE,
                       discriminator_weight: float = DISCRIMINATOR_WEIGHT) -> ElectraForJointPreTraining:
        """This discriminator and a generator `generator_size` as wide sharing its embeddings: ELECTRA's
        joint pre-training model (`bertforge pretrain` with objective rtd asks for it here)."""
        return ElectraForJointPreTraining(config, generator_size=generator_size,
                                          discriminator_weight=discriminator_weight)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T): the corrupted input (original tokens with some replaced)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T): 1 replaced, 0 original (-100 not scored)
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.replaced_token_logits(encoded.last_hidden_state)  # (B, T)
        loss = None if labels is None else replaced_token_detection_loss(logits, labels, attention_mask)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


# ------------------------------------------------------------------------------------------------
# The generator: a masked LM
# ------------------------------------------------------------------------------------------------
class GeneratorPredictions(nn.Module):
    """dense H -> E, GELU, LayerNorm: the generator's vectors brought to the embedding width. The
    activation is always exact GELU, whatever `hidden_act` says (as in transformers)."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.layer_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., E)
        return self.layer_norm(F.gelu(self.dense(hidden)))


class TiedVocabularyProjection(nn.Module):
    """E -> V onto the word-embedding matrix, passed in at call time so that the tie cannot come
    undone and the state dict holds the matrix once; only the bias is this module's own."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, vectors: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:  # (..., E) -> (..., V)
        return F.linear(vectors, word_embeddings, self.bias)


class ElectraForMaskedLM(ElectraPreTrainedModel):
    """The generator: masked LM (fill-mask), its logits projected onto the word embeddings.

    Without labels the logits are (B, T, V); with labels only the N labelled positions go through
    the vocabulary projection, and the logits are (N, V) in row-major order of `labels != -100`.
    """

    job: ClassVar[str | None] = "masked-lm"
    head_prefixes = ("generator_predictions.", "generator_lm_head.")
    # transformers' projection weight is the word-embedding matrix: a file's copy repeats it.
    keys_redundant_on_load = (*ElectraPreTrainedModel.keys_redundant_on_load, r"^generator_lm_head\.weight$")

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.generator_predictions = GeneratorPredictions(config)
        self.generator_lm_head = TiedVocabularyProjection(config)
        self.init_modules(self.generator_predictions)

    def masked_lm_logits(self, vectors: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., V)
        """The generator head on final token vectors (fill-mask on chosen positions)."""
        word_embeddings = self.electra.embeddings.word_embeddings.weight  # (V, E)
        return self.generator_lm_head(self.generator_predictions(vectors), word_embeddings)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) token ids to predict, -100 elsewhere
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> PreTrainingOutput:
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        sequence = encoded.last_hidden_state  # (B, T, H)
        loss = None
        if labels is None:
            logits = self.masked_lm_logits(sequence)  # (B, T, V)
        else:  # the V-wide projection costs more than a layer: only the labelled positions pay for it
            predicted = labels != IGNORE_INDEX  # (B, T)
            logits = self.masked_lm_logits(sequence[predicted])  # (N, V)
            targets = labels[predicted]  # (N,)
            # nothing masked in this batch: a zero that still has a graph
            loss = F.cross_entropy(logits.float(), targets) if targets.numel() else logits.sum() * 0.0
        return PreTrainingOutput(loss=loss, mlm_loss=loss, nsp_loss=None, mlm_logits=logits, nsp_logits=None,
                                 hidden_states=encoded.hidden_states, attentions=encoded.attentions)


# ------------------------------------------------------------------------------------------------
# Joint pre-training: the generator's samples, the discriminator's verdicts (Clark et al., 2020)
# ------------------------------------------------------------------------------------------------


def generator_config(config: ElectraConfig, size: float = GENERATOR_SIZE) -> ElectraConfig:
    """The generator's config for a discriminator's: hidden and feed-forward sizes times `size`, the
    heads too (at least one, and a divisor of the new hidden size); depth, embedding width, vocabulary,
    positions and token types as the discriminator's, whose embedding tables it shares."""
    if isinstance(size, bool) or not isinstance(size, int | float) or not 0 < size <= 1:
        raise ValueError(f"generator_size must be a fraction in (0, 1], got {size!r}")
    hidden = max(1, round(config.hidden_size * size))
    heads = max(1, min(hidden, round(config.num_attention_heads * size)))
    while hidden % heads:
        heads -= 1
    inner = max(1, round(config.intermediate_size * size))
    return dataclasses.replace(config, hidden_size=hidden, num_attention_heads=heads, intermediate_size=inner,
                               extra=dict(config.extra))


def sample_tokens(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row drawn from softmax(logits), by the Gumbel-max trick (as the ELECTRA code
    samples); no gradient flows through the draw. (N, V) -> (N,)."""
    with torch.no_grad():
        uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
        gumbel = -torch.log(-torch.log(uniform + 1e-9) + 1e-9)
        return (logits.detach().float() + gumbel).argmax(-1)


def replace_masked(
    input_ids: torch.Tensor,  # (B, T): the generator's input ([MASK] and the other corruptions)
    labels: torch.Tensor,  # (B, T): the original id where a token was masked, -100 elsewhere
    sampled: torch.Tensor,  # (N,): a token per masked position, in row-major order of `labels != -100`
    attention_mask: torch.Tensor | None = None,  # (B, T): 1 real token, 0 padding
) -> tuple[torch.Tensor, torch.Tensor]:
    """The discriminator's input and labels: `input_ids` with each masked position holding its sample,
    and per token 1 where that differs from the original token, 0 at every other real token (a sample
    equal to the original counts as original, as in the paper), -100 at padding."""
    masked = labels != IGNORE_INDEX
    corrupted = input_ids.masked_scatter(masked, sampled.to(input_ids.dtype))
    originals = torch.where(masked, labels, input_ids)
    replaced = (corrupted != originals).long()
    if attention_mask is not None:
        replaced = replaced.masked_fill(attention_mask == 0, IGNORE_INDEX)
    return corrupted, replaced


@dataclass
class JointPreTrainingOutput:
    loss: torch.Tensor  # mlm_loss + discriminator_weight x rtd_loss
    mlm_loss: torch.Tensor  # the generator's masked-LM loss
    rtd_loss: torch.Tensor  # the discriminator's binary cross-entropy over the real tokens
    mlm_logits: torch.Tensor  # (N, V): the generator's, at the masked positions (row-major order)
    rtd_logits: torch.Tensor  # (B, T): the discriminator's "replaced" logit per token
    rtd_labels: torch.Tensor  # (B, T): 1 replaced, 0 original, -100 padding
    nsp_logits: None = None  # no sentence objective (read by code that serves every pre-training model)


class ElectraForJointPreTraining(nn.Module):
    """ELECTRA's pre-training pair (Clark et al., 2020): a generator (a masked LM, `generator_size` of
    the discriminator's width) fills the masked positions with tokens drawn from its softmax, and the
    discriminator says for every real token whether it was replaced.

        loss = MLM loss of the generator + discriminator_weight x replaced-token detection loss

    The two share one embedding module (word, position and token-type tables and their LayerNorm): it
    is registered under the discriminator only, so the state dict and the optimiser hold it once and
    both losses reach it; the generator projects it to its own width (`embeddings_project`). No job:
    `bertforge pretrain` builds it (objective rtd), trains it as any model, and `save_pretrained`
    writes the discriminator (the model fine-tuning starts from) with the generator beside it.
    Sampling draws from torch's global RNG in training (a checkpoint's RNG states make a resume
    bit-exact) and from a fixed seed in eval mode, so that every evaluation sees the same corruption.
    """

    def __init__(self, config: ElectraConfig, *, generator_size: float = GENERATOR_SIZE,
                 discriminator_weight: float = DISCRIMINATOR_WEIGHT) -> None:
        super().__init__()
        if isinstance(discriminator_weight, bool) or not isinstance(discriminator_weight, int | float) \
                or not discriminator_weight >= 0:
            raise ValueError(f"discriminator_weight must be a number >= 0, got {discriminator_weight!r}")
        self.config = config
        self.generator_size, self.discriminator_weight = generator_size, float(discriminator_weight)
        self.eval_seed = 0
        self.discriminator = ElectraForPreTraining(config)
        self.generator = ElectraForMaskedLM(generator_config(config, generator_size))
        # one embedding module: the generator's own (freshly made) goes, and it reads the discriminator's
        # through a plain attribute, which state_dict, parameters() and the optimiser do not visit
        backbone = self.generator.electra
        del backbone.embeddings
        object.__setattr__(backbone, "embeddings", self.discriminator.electra.embeddings)

    @property
    def embeddings(self) -> nn.Module:
        """The embedding module both halves read."""
        return self.discriminator.electra.embeddings

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T): masked input, as for BERT's masked LM
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T): the original ids at the masked positions, -100 elsewhere
    ) -> JointPreTrainingOutput:
        if labels is None:
            raise ValueError("joint pre-training needs labels: the original ids of the masked positions")
        generated = self.generator(input_ids, attention_mask, token_type_ids, position_ids, labels=labels)
        seed = None if self.training else torch.Generator(device=input_ids.device).manual_seed(self.eval_seed)
        sampled = sample_tokens(generated.mlm_logits, seed)  # (N,)
        corrupted, replaced = replace_masked(input_ids, labels, sampled, attention_mask)
        judged = self.discriminator(corrupted, attention_mask, token_type_ids, position_ids, labels=replaced)
        assert generated.loss is not None and judged.loss is not None
        return JointPreTrainingOutput(loss=generated.loss + self.discriminator_weight * judged.loss,
                                      mlm_loss=generated.loss, rtd_loss=judged.loss, mlm_logits=generated.mlm_logits,
                                      rtd_logits=judged.logits, rtd_labels=replaced)

    def standalone_generator(self) -> ElectraForMaskedLM:
        """A copy of the generator holding a copy of the shared embeddings as its own (to save or serve)."""
        copied = copy.deepcopy(self.generator)
        embeddings = copied.electra.__dict__.pop("embeddings")
        copied.electra.embeddings = embeddings  # registered again: saved with the rest
        return copied

    def save_pretrained(self, directory: str | os.PathLike[str], tokenizer: BertTokenizer | None = None) -> None:
        """The discriminator in `directory` (transformers' ElectraForPreTraining), the generator in
        `directory/generator` (ElectraForMaskedLM); each with the tokenizer's files when given."""
        self.discriminator.save_pretrained(directory, tokenizer=tokenizer)
        self.standalone_generator().save_pretrained(Path(directory) / GENERATOR_DIR, tokenizer=tokenizer)

    def load_weights(self, directory: str | os.PathLike[str]) -> LoadReport:
        """Start from a checkpoint's weights: the discriminator's from `directory`, and the generator's
        from `directory/generator` where there is one (a run's final/); else the generator keeps its own,
        on the checkpoint's embeddings. Returns the discriminator's load report, with a new generator
        listed among its new heads."""
        report = load_weights_into(self.discriminator, directory)
        saved = Path(directory) / GENERATOR_DIR
        if (saved / "config.json").is_file():
            generator = self.standalone_generator()
            load_weights_into(generator, saved)
            state = {key: value for key, value in generator.state_dict().items()
                     if not key.startswith("electra.embeddings.")}
            self.generator.load_state_dict(state, strict=True)
        else:
            report.new_heads.append("generator")
        return report


# ------------------------------------------------------------------------------------------------
# Fine-tuning heads
# ------------------------------------------------------------------------------------------------
class ElectraClassificationHead(nn.Module):
    """ELECTRA's sentence head on the first token's vector: dropout, dense + GELU, dropout, out_proj.
    GELU rather than BERT's pooler tanh, as the ELECTRA authors fine-tuned."""

    def __init__(self, config: ElectraConfig, outputs: int) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = head_dropout(config)
        self.out_proj = nn.Linear(config.hidden_size, outputs)

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, outputs)
        first = self.dropout(sequence[:, 0])  # (B, H): [CLS]
        return self.out_proj(self.dropout(F.gelu(self.dense(first))))


class ElectraForSequenceClassification(WeightedClassifier, ElectraPreTrainedModel):
    """A sentence or sentence-pair label (or a score, with one output) from the final [CLS] vector.

    The loss follows config.json's `problem_type`, as in `transformers`: "regression" (mean squared
    error), "single_label_classification" (cross-entropy over class ids) or
    "multi_label_classification" (sigmoid + binary cross-entropy over (B, num_labels) 0/1 targets);
    without one it is inferred from the labels the same way. `label_weights` (num_labels,) weighs the
    loss for imbalanced data (a training setting, not saved with the model).
    """

    job: ClassVar[str | None] = "sequence-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.problem_type = problem_type_of(config)
        self.electra = ElectraModel(config)
        self.classifier = ElectraClassificationHead(config, self.num_labels)
        self.register_buffer("label_weights", None, persistent=False)
        self.init_modules(self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) class ids, (B,) floats for regression, (B, L) 0/1 multi-label
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(encoded.last_hidden_state)  # (B, num_labels)
        loss = None if labels is None else self.loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)



class ElectraForTokenClassification(ElectraPreTrainedModel):
    """A label per token (NER) from each final token vector after dropout; labels -100 are not scored."""

    job: ClassVar[str | None] = "token-classification"
    head_prefixes = ("classifier.",)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.num_labels = num_labels(config)
        self.electra = ElectraModel(config)
        self.dropout = head_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, self.num_labels)
        self.init_modules(self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T), -100 for sub-word continuations, specials, padding
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.classifier(self.dropout(encoded.last_hidden_state))  # (B, T, H) -> (B, T, num_labels)
        loss = None if labels is None else token_classification_loss(logits, labels)
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


class ElectraForQuestionAnswering(ElectraPreTrainedModel):
    """Span QA: a start and an end score for every token."""

    job: ClassVar[str | None] = "question-answering"
    head_prefixes = ("qa_outputs.",)

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # rows: start, end
        self.init_modules(self.qa_outputs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,  # (B,) token index; 0 ([CLS]) = no answer in window
        end_positions: torch.Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> SpanOutput:
        encoded = self.electra(input_ids, attention_mask, token_type_ids, position_ids,
                               output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        logits = self.qa_outputs(encoded.last_hidden_state)  # (B, T, 2)
        start_logits, end_logits, loss = span_logits_and_loss(logits, attention_mask, start_positions, end_positions)
        return SpanOutput(loss, start_logits, end_logits, encoded.hidden_states, encoded.attentions)


class SequenceSummary(nn.Module):
    """The multiple-choice summary of a sequence: its first token's vector, through an optional H -> H
    projection (`summary_use_proj`) and activation (`summary_activation`), between dropouts
    (`summary_first_dropout`, a key transformers reads when config.json has it, and
    `summary_last_dropout`)."""

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__()
        first_rate = float(config.extra.get("summary_first_dropout", 0.0))
        self.first_dropout = nn.Dropout(first_rate) if first_rate > 0 else nn.Identity()
        self.summary = nn.Linear(config.hidden_size, config.hidden_size) if config.summary_use_proj else nn.Identity()
        self.act = named_activation(config.summary_activation)
        rate = config.summary_last_dropout
        self.last_dropout = nn.Dropout(rate) if rate > 0 else nn.Identity()

    def forward(self, sequence: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H)
        first = self.first_dropout(sequence[:, 0])  # (B, H): [CLS]
        return self.last_dropout(self.act(self.summary(first)))


class ElectraForMultipleChoice(ElectraPreTrainedModel):
    """SWAG-style: score each (context, choice) pair from the summary of its [CLS] vector, softmax
    over the choices."""

    job: ClassVar[str | None] = "multiple-choice"
    head_prefixes = ("sequence_summary.", "classifier.")

    def __init__(self, config: ElectraConfig) -> None:
        super().__init__(config)
        self.electra = ElectraModel(config)
        self.sequence_summary = SequenceSummary(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.init_modules(self.sequence_summary, self.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, C, T)
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B,) index of the right choice
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> TaskOutput:
        batch, choices, length = input_ids.shape

        def flat(x: torch.Tensor | None) -> torch.Tensor | None:  # (B, C, T) -> (B*C, T)
            return None if x is None else x.reshape(batch * choices, length)

        encoded: EncoderOutput = self.electra(
            flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
            output_hidden_states=output_hidden_states, output_attentions=output_attentions)
        scores = self.classifier(self.sequence_summary(encoded.last_hidden_state))  # (B*C, 1)
        logits = scores.view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return TaskOutput(loss, logits, encoded.hidden_states, encoded.attentions)


__all__ = ["DISCRIMINATOR_WEIGHT", "GENERATOR_DIR", "GENERATOR_SIZE", "DiscriminatorPredictions",
           "ElectraClassificationHead", "ElectraForJointPreTraining", "ElectraForMaskedLM",
           "ElectraForMultipleChoice", "ElectraForPreTraining", "ElectraForQuestionAnswering",
           "ElectraForSequenceClassification", "ElectraForTokenClassification", "GeneratorPredictions",
           "JointPreTrainingOutput", "SequenceSummary", "TiedVocabularyProjection", "generator_config",
           "replace_masked", "replaced_token_detection_loss", "sample_tokens"]
