"""The BERT model: `layers` (building blocks), `bert` (the encoder), `heads` (task heads on it)."""

from bertforge.model.bert import BertModel, BertPreTrainedModel, EncoderOutput
from bertforge.model.heads import BertForMaskedLM, BertForPreTraining, MaskedLMHead, PreTrainingOutput

__all__ = [
    "BertModel", "BertPreTrainedModel", "EncoderOutput",
    "BertForMaskedLM", "BertForPreTraining", "MaskedLMHead", "PreTrainingOutput",
]
