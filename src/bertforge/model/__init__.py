"""The BERT model: `layers` (building blocks), `bert` (the encoder), `heads` (task heads on it)."""

from bertforge.model.bert import BertModel, BertPreTrainedModel, EncoderOutput
from bertforge.model.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    MaskedLMHead,
    PreTrainingOutput,
    SpanOutput,
    TaskOutput,
    num_labels,
    set_labels,
)

__all__ = [
    "BertModel", "BertPreTrainedModel", "EncoderOutput",
    "BertForMaskedLM", "BertForPreTraining", "MaskedLMHead", "PreTrainingOutput",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "TaskOutput", "SpanOutput", "num_labels", "set_labels",
]
