"""BERT (Devlin et al., 2019), and the switches that give RoBERTa-, ALBERT- and SpanBERT-style
models on the same classes: its config and presets (`config.py`), building blocks (`layers.py`),
the encoder (`modeling.py`), the pre-training and task heads (`heads.py`), and the checkpoint key
map (`keys.py`). `FAMILY` is what the registry knows of it; importing this package imports no torch.
"""

from bertforge.model.bert.config import FAMILY_DEFAULTS, PRESETS, BertConfig
from bertforge.model.registry import Family

FAMILY = Family(
    model_type=BertConfig.model_type,
    config_class=BertConfig,
    model_modules=("bertforge.model.bert.modeling", "bertforge.model.bert.heads"),
    description="BERT, with RoBERTa-, ALBERT- and SpanBERT-style switches",
)

__all__ = ["FAMILY", "FAMILY_DEFAULTS", "PRESETS", "BertConfig"]
