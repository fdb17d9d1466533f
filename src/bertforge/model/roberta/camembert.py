"""CamemBERT (Martin et al., 2020): RoBERTa's classes under config.json's `model_type: camembert`.

The architecture, weights' names and numerics are RoBERTa's; these subclasses only carry the
model_type and config class, so that the registry finds them for such a checkpoint and
config.json's `architectures` names them as transformers does (CamembertForMaskedLM, ...).
"""

from __future__ import annotations

from typing import ClassVar

from bertforge.model.roberta.config import CamembertConfig
from bertforge.model.roberta.heads import (
    RobertaForMaskedLM,
    RobertaForMultipleChoice,
    RobertaForQuestionAnswering,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
)
from bertforge.model.roberta.modeling import RobertaModel


class _Camembert:
    """What sets the French RoBERTa apart: its model_type and config class (listed first among the bases)."""

    model_type: ClassVar[str] = "camembert"
    config_class: ClassVar[type[CamembertConfig]] = CamembertConfig


class CamembertModel(_Camembert, RobertaModel):
    job: ClassVar[str | None] = "embeddings"


class CamembertForMaskedLM(_Camembert, RobertaForMaskedLM):
    job: ClassVar[str | None] = "masked-lm"


class CamembertForSequenceClassification(_Camembert, RobertaForSequenceClassification):
    job: ClassVar[str | None] = "sequence-classification"


class CamembertForTokenClassification(_Camembert, RobertaForTokenClassification):
    job: ClassVar[str | None] = "token-classification"


class CamembertForQuestionAnswering(_Camembert, RobertaForQuestionAnswering):
    job: ClassVar[str | None] = "question-answering"


class CamembertForMultipleChoice(_Camembert, RobertaForMultipleChoice):
    job: ClassVar[str | None] = "multiple-choice"
