"""DeBERTa-v2 and v3 (He et al., 2021; DeBERTaV3, 2023): its config and presets (`config.py`), the
encoder with disentangled attention and its heads (`modeling.py`) and the checkpoint key map
(`keys.py`). `FAMILY` is what the registry knows of it; importing this package imports no torch.
"""

from bertforge.model.deberta.config import DEBERTA_PRESETS, DebertaV2Config
from bertforge.model.registry import Family

FAMILY = Family(
    model_type=DebertaV2Config.model_type,
    config_class=DebertaV2Config,
    model_modules=("bertforge.model.deberta.modeling",),
    job_fallbacks={"pretraining": "masked-lm"},  # the masked LM (v3's replaced-token detection is not here)
    description="DeBERTa-v2/v3: disentangled attention over relative positions in log buckets, post-LN layers",
)

__all__ = ["DEBERTA_PRESETS", "FAMILY", "DebertaV2Config"]
