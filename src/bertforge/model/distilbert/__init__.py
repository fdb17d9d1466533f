"""DistilBERT (Sanh et al., 2019): its config and presets (`config.py`), the encoder and heads
(`modeling.py`, on the post-LN layer BERT's families share) and the checkpoint key map (`keys.py`).
`FAMILY` is what the registry knows of it; importing this package imports no torch.
"""

from bertforge.model.distilbert.config import DISTIL_PRESETS, DistilBertConfig
from bertforge.model.registry import Family

FAMILY = Family(
    model_type=DistilBertConfig.model_type,
    config_class=DistilBertConfig,
    model_modules=("bertforge.model.distilbert.modeling",),
    job_fallbacks={"pretraining": "masked-lm"},  # distilled with masked LM alone: no sentence objective
    description="DistilBERT: BERT's post-LN encoder at half the depth, no token types, no pooler",
)

__all__ = ["DISTIL_PRESETS", "FAMILY", "DistilBertConfig"]
