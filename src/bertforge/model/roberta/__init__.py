"""RoBERTa (Liu et al., 2019) and the model_types that share its architecture, XLM-RoBERTa and
CamemBERT: the configs and presets (`config.py`), the encoder (`modeling.py`), the masked-LM and task
heads (`heads.py`), the checkpoint key map (`keys.py`), and the classes under the other two
model_types (`xlm_roberta.py`, `camembert.py`).

Each model_type is its own `Family` (config.json's `model_type` picks one, and transformers writes
that model_type back), all three listed in `FAMILIES`; `FAMILY` is RoBERTa's. Importing this package
imports no torch.
"""

from bertforge.model.registry import Family
from bertforge.model.roberta.config import (
    CAMEMBERT_PRESETS,
    ROBERTA_PRESETS,
    XLM_ROBERTA_PRESETS,
    CamembertConfig,
    RobertaConfig,
    XLMRobertaConfig,
)

_MASKED_LM_ONLY = {"pretraining": "masked-lm"}  # RoBERTa pre-trains without a sentence objective

FAMILY = Family(
    model_type=RobertaConfig.model_type,
    config_class=RobertaConfig,
    model_modules=("bertforge.model.roberta.modeling", "bertforge.model.roberta.heads"),
    job_fallbacks=dict(_MASKED_LM_ONLY),
    description="RoBERTa: BERT's layers, positions offset past padding, masked LM alone",
)
XLM_ROBERTA_FAMILY = Family(
    model_type=XLMRobertaConfig.model_type,
    config_class=XLMRobertaConfig,
    model_modules=("bertforge.model.roberta.xlm_roberta",),
    job_fallbacks=dict(_MASKED_LM_ONLY),
    description="XLM-RoBERTa: RoBERTa's architecture, multilingual",
)
CAMEMBERT_FAMILY = Family(
    model_type=CamembertConfig.model_type,
    config_class=CamembertConfig,
    model_modules=("bertforge.model.roberta.camembert",),
    job_fallbacks=dict(_MASKED_LM_ONLY),
    description="CamemBERT: RoBERTa's architecture, French",
)
FAMILIES = (FAMILY, XLM_ROBERTA_FAMILY, CAMEMBERT_FAMILY)

__all__ = ["CAMEMBERT_FAMILY", "CAMEMBERT_PRESETS", "FAMILIES", "FAMILY", "ROBERTA_PRESETS", "XLM_ROBERTA_FAMILY",
           "XLM_ROBERTA_PRESETS", "CamembertConfig", "RobertaConfig", "XLMRobertaConfig"]
