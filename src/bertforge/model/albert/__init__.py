"""ALBERT (Lan et al., 2020): its config and presets (`config.py`), the encoder with factorised
embeddings and shared layers (`modeling.py`, on the post-LN layer BERT's families share), the
pre-training and task heads (`heads.py`) and the checkpoint key map (`keys.py`), all under
transformers' names (`model_type: albert`). `FAMILY` is what the registry knows of it; importing this
package imports no torch.
"""

from bertforge.model.albert.config import ALBERT_PRESETS, AlbertConfig
from bertforge.model.registry import Family

FAMILY = Family(
    model_type=AlbertConfig.model_type,
    config_class=AlbertConfig,
    model_modules=("bertforge.model.albert.modeling", "bertforge.model.albert.heads"),
    description="ALBERT: factorised embeddings, layers shared across depth, masked LM + sentence order",
)

__all__ = ["ALBERT_PRESETS", "FAMILY", "AlbertConfig"]
