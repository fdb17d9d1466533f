"""bertforge: BERT end to end, with Hugging Face-compatible checkpoints.

The public names are the BERT family's classes (every family's are importable from
`bertforge.model`) and the tokenizer, imported lazily so that `import bertforge` (and the CLI's `--help`) stays fast
and does not pull in torch until a model is actually used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_PUBLIC = {
    "BertConfig": "bertforge.model", "PRESETS": "bertforge.model", "BertTokenizer": "bertforge.tokenizer",
    "BertModel": "bertforge.model", "BertForPreTraining": "bertforge.model", "BertForMaskedLM": "bertforge.model",
    "BertForSequenceClassification": "bertforge.model", "BertForTokenClassification": "bertforge.model",
    "BertForQuestionAnswering": "bertforge.model", "BertForMultipleChoice": "bertforge.model",
    "LoadReport": "bertforge.checkpoint",
}
# public modules that are called like functions: `from bertforge import pipeline; pipeline("runs/x")`
_CALLABLE_MODULES = ("pipeline",)

__all__ = [
    "__version__", "BertConfig", "PRESETS", "BertTokenizer", "BertModel", "BertForPreTraining",
    "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
    "BertForQuestionAnswering", "BertForMultipleChoice", "LoadReport", "pipeline",
]


def __getattr__(name: str) -> Any:
    if name in _CALLABLE_MODULES:
        return importlib.import_module(f"bertforge.{name}")
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from bertforge.checkpoint import LoadReport
    from bertforge.model import (
        PRESETS,
        BertConfig,
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForPreTraining,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )
    from bertforge.tokenizer import BertTokenizer
