"""The BERT model: `layers` (building blocks), `bert` (the encoder), `heads` (task heads on it),
`modern` (ModernBERT's encoder and heads), and `auto.load_any` (the class a checkpoint's config.json
names)."""

from bertforge.model.auto import load_any
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
    label_maps,
    label_names,
    num_labels,
    set_labels,
)
from bertforge.model.modern import (
    ModernBertForMaskedLM,
    ModernBertForMultipleChoice,
    ModernBertForQuestionAnswering,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)

__all__ = [
    "BertModel", "BertPreTrainedModel", "EncoderOutput",
    "BertForMaskedLM", "BertForPreTraining", "MaskedLMHead", "PreTrainingOutput",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "TaskOutput", "SpanOutput", "label_names", "label_maps", "num_labels", "set_labels", "load_any",
    "ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification", "ModernBertForQuestionAnswering", "ModernBertForMultipleChoice",
]
