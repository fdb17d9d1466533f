"""ModernBERT (Warner et al., 2024): its config and presets (`config.py`), the encoder and heads
(`modeling.py`) and the checkpoint key map (`keys.py`). `FAMILY` is what the registry knows of it;
importing this package imports no torch.
"""

from bertforge.model.modernbert.config import MODERN_PRESETS, ModernBertConfig
from bertforge.model.registry import Family

FAMILY = Family(
    model_type=ModernBertConfig.model_type,
    config_class=ModernBertConfig,
    model_modules=("bertforge.model.modernbert.modeling",),
    job_fallbacks={"pretraining": "masked-lm"},  # ModernBERT pre-trains with masked LM alone
    description="ModernBERT: rotary positions, GeGLU, alternating global and sliding-window attention",
)

__all__ = ["FAMILY", "MODERN_PRESETS", "ModernBertConfig"]
