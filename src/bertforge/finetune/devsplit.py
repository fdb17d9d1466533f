"""Parts of the training file held out of training: the dev split drawn when the user has no dev file
(`--dev-fraction`), and the fixed hold-out scored beside the dev split (`holdout`).

Fine-tuning on one's own data often starts from one labelled file. Scoring needs rows the model did
not train on, so a fixed, seeded part of the training rows is held out as the dev split: per class for
single-label classification (each class keeps its share, so a rare class is scored too), whole groups
where rows share an input (a QA context's questions go together, or the dev score would measure
memorised paragraphs), plain random rows otherwise. The held-out rows are written beside the run, so
the split can be inspected and reused as a --dev file.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.fileio import write_text_atomic
from bertforge.tasks.base import Task

DEV_SPLIT_FILE = "dev-split.jsonl"
HOLDOUT_SEED = 20190524
DEFAULT_DEV_FRACTION = 0.1  # when no dev file is given: transformers' examples and sklearn users' usual 10%


def split_dev(examples: Sequence[Any], fraction: float, seed: int, *, strata: Sequence[Hashable] | None = None,
              groups: Sequence[Hashable] | None = None) -> tuple[list[Any], list[Any]]:
    """(training examples, dev examples), each in file order: about `fraction` of `examples` held out,
    drawn with `seed`. `groups` (one key per example) keep examples with one key on one side;
    otherwise `strata` (one key per example) hold out `fraction` of each stratum, at least one of a
    stratum with two or more examples."""
    if not 0 < fraction < 1:
        raise ValueError(f"dev_fraction must be between 0 and 1, got {fraction:g}")
    if len(examples) < 2:
        raise ValueError(f"a dev split needs at least 2 training examples, the training file has {len(examples)}")
    rng = np.random.default_rng(seed)
    if groups is not None:
        held = _held_groups(groups, fraction, rng)
    else:
        keys = strata if strata is not None else [None] * len(examples)
        held = set()
        for members in _by_key(keys).values():
            count = round(fraction * len(members))
            if count == 0 and len(members) >= 2 and strata is not None:
                count = 1  # a rare class is still scored
            held.update(int(i) for i in rng.choice(members, size=count, replace=False))
    if not held or len(held) == len(examples):
        raise ValueError(f"dev_fraction {fraction:g} of {len(examples)} training examples leaves "
                         f"{'no dev' if not held else 'no training'} examples; give a --dev file or another fraction")
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def held_out_dev(spec: Task, examples: list[Any], loop: Any) -> tuple[list[Any], list[Any] | None]:
    """(training examples, the dev split drawn from them or None) per the `FinetuneLoop`'s `dev_fraction`
    and `dev_seed`."""
    if not loop.dev_fraction:
        return examples, None
    strata, groups = spec.dev_split_keys(examples)
    return split_dev(examples, loop.dev_fraction, loop.dev_seed, strata=strata, groups=groups)


def split_holdout(examples: Sequence[Any], holdout: float) -> tuple[list[Any], list[Any]]:
    """(training examples, held-out examples), each in file order: `holdout` examples (a count, or a
    fraction of them when below 1) drawn with the fixed `HOLDOUT_SEED`, so the same ones for every
    configuration that reads the same training split."""
    count = int(holdout) if holdout >= 1 else round(holdout * len(examples))
    if count <= 0:
        return list(examples), []
    if count >= len(examples):
        raise ValueError(f"holdout {holdout:g} leaves no training examples (the training split has {len(examples)})")
    held = set(np.random.default_rng(HOLDOUT_SEED).choice(len(examples), size=count, replace=False).tolist())
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def _by_key(keys: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    members: dict[Hashable, list[int]] = defaultdict(list)
    for index, key in enumerate(keys):
        members[key].append(index)
    return dict(sorted(members.items(), key=lambda item: str(item[0])))  # the draw does not depend on file order


def _held_groups(groups: Sequence[Hashable], fraction: float, rng: np.random.Generator) -> set[int]:
    """Whole groups, in a seeded order, until about `fraction` of the examples are held out."""
    members = _by_key(groups)
    order = rng.permutation(len(members))
    keys = list(members)
    target, held = round(fraction * len(groups)), set()
    for position in order:
        if len(held) >= max(target, 1):
            break
        held.update(members[keys[position]])
    return held


def write_dev_split(path: Path, examples: Sequence[Any]) -> None:
    """The held-out examples as JSON lines, their fields as the task read them (a classification row's
    `text`, `text_pair`, `label`, and its `row` in the training file); the settings that drew them
    are in the run's run_config.yaml."""
    write_text_atomic(path, "".join(json.dumps(_fields(e), ensure_ascii=False, default=str) + "\n" for e in examples))


def _fields(example: Any) -> dict[str, Any]:
    return dataclasses.asdict(example) if dataclasses.is_dataclass(example) else {"example": example}


__all__ = ["DEFAULT_DEV_FRACTION", "DEV_SPLIT_FILE", "HOLDOUT_SEED", "held_out_dev", "split_dev", "split_holdout",
           "write_dev_split"]
