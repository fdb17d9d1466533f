"""XLM-RoBERTa (Conneau et al., 2020): RoBERTa's classes under config.json's `model_type: xlm-roberta`.

The architecture, weights' names and numerics are RoBERTa's; these subclasses only carry the
model_type and config class, so that the registry finds them for such a checkpoint and
config.json's `architectures` names them as transformers does (XLMRobertaForMaskedLM, ...).
"""

from __future__ import annotations

from typing import ClassVar

from bertforge.model.roberta.config import XLMRobertaConfig
from bertforge.model.roberta.heads import (
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
)
from bertforge.model.roberta.modeling import RobertaModel


class _XLMRoberta:
    """What sets the multilingual RoBERTa apart: its model_type and config class (listed first among the bases)."""

    model_type: ClassVar[str] = "xlm-roberta"
    config_class: ClassVar[type[XLMRobertaConfig]] = XLMRobertaConfig


class XLMRobertaModel(_XLMRoberta, RobertaModel):
    job: ClassVar[str | None] = "embeddings"


class XLMRobertaForMaskedLM(_XLMRoberta, RobertaForMaskedLM):
    job: ClassVar[str | None] = "masked-lm"


class XLMRobertaForSequenceClassification(_XLMRoberta, RobertaForSequenceClassification):
    job: ClassVar[str | None] = "sequence-classification"


class XLMRobertaForTokenClassification(_XLMRoberta, RobertaForTokenClassification):
    job: ClassVar[str | None] = "token-classification"


class XLMRobertaForQuestionAnswering(_XLMRoberta, RobertaForQuestionAnswering):
    job: ClassVar[str | None] = "question-answering"


class XLMRobertaForMultipleChoice(_XLMRoberta, RobertaForMultipleChoice):
    job: ClassVar[str | None] = "multiple-choice"
