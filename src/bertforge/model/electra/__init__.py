"""ELECTRA (Clark et al., 2020): its config and presets (`config.py`), the encoder (`modeling.py`,
on the post-LN layer BERT's families share, after a projection from the embedding width), the
discriminator, generator and task heads (`heads.py`) and the checkpoint key map (`keys.py`).
`FAMILY` is what the registry knows of it; importing this package imports no torch.
"""

from bertforge.model.electra.config import ELECTRA_PRESETS, ElectraConfig
from bertforge.model.registry import Family

FAMILY = Family(
    model_type=ElectraConfig.model_type,
    config_class=ElectraConfig,
    model_modules=("bertforge.model.electra.modeling", "bertforge.model.electra.heads"),
    description="ELECTRA: BERT's layers on embeddings of their own width; replaced-token detection",
)

__all__ = ["ELECTRA_PRESETS", "FAMILY", "ElectraConfig"]
