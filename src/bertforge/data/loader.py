"""Batches for pre-training: a Dataset over the shards, a collator, rank splitting and a resumable position.

    loader = PretrainingLoader("data/bert128", batch_size=256, seed=0, rank=rank, world_size=world)
    loader.load_state_dict(checkpoint["data"])      # resume: same epoch, next unseen batch
    for batch in loader:                             # one epoch from the current position
        out = model(**batch)                         # input_ids, token_type_ids, attention_mask,
        ...                                          # labels (the MLM labels), next_sentence_label
        checkpoint["data"] = loader.state_dict()

Batch keys are the model's arguments, so `model(**batch)` works (the training loop calls it so):
`BertForPreTraining(input_ids, token_type_ids, attention_mask, labels=<MLM labels>, next_sentence_label=...)`.
`labels` holds the masked-LM labels: the original token where a prediction is made, -100 elsewhere.
`next_sentence_label` follows Hugging Face: 0 = IsNext (or, for SOP, in order), 1 = NotNext
(swapped); it is absent for objective "none".

Dynamic masking draws each batch's masks from a stream seeded by (seed, epoch, rank, batch number),
so a resumed run masks exactly as an uninterrupted one would, and every epoch masks afresh.

`next_token=True` reads the same shards, whatever objective they were prepared for, as a left-to-right
language model does: the original ids (a static mask undone), no masking and no sentence label, and
`labels` = the ids themselves with -100 at padding, aligned with `input_ids` as transformers'
BertLMHeadModel takes them (the model shifts: position i is scored against the token at i + 1, so the
position after the last real token, padding, is not scored).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bertforge.data.corpus import DataError
from bertforge.data.masking import IGNORE_INDEX, Masker
from bertforge.data.shards import list_shards, read_json

__all__ = ["PretrainingCollator", "PretrainingDataset", "PretrainingLoader", "rank_indices"]


class PretrainingDataset(Dataset):
    """Map-style dataset over the finished shards of one split (`"train"` or `"valid"`).

    An item is a dict of numpy arrays: `input_ids`, `segment_b` (where token type 1 starts), `nsp_label`,
    and for statically masked data `mask_positions` / `mask_targets`. An index may also be an
    `(index, mask_key)` pair; the key is passed through to the collator (dynamic masking).
    """

    def __init__(self, data_dir: str | Path, split: str = "train"):
        self.data_dir = Path(data_dir)
        if not (self.data_dir / "dataset.json").is_file():
            raise DataError(f"{self.data_dir}: no dataset.json; make the data with `bertforge prepare` first")
        if not (self.data_dir / "stats.json").is_file():
            raise DataError(f"{self.data_dir}: prepare has not finished (no stats.json); run it again with the "
                            "same arguments to complete it")
        self.info = read_json(self.data_dir / "dataset.json")
        self.split = split
        # the parts of `prepare --part`, joined by `prepare-merge`: their shards in place, part after part
        parts = [self.data_dir / part for part in self.info.get("parts", [])] or [self.data_dir]
        self.shards = [s for part in parts for s in list_shards(part / split) if len(s)]
        self.cumulative = np.cumsum([0] + [len(s) for s in self.shards])
        if split == "valid" or self.info["options"]["masking"] == "static":
            self.static = True
        else:
            self.static = False
        if self.shards and any(s.static != self.static for s in self.shards):
            raise DataError(f"{self.data_dir / split}: shards disagree on static masking")

    @property
    def objective(self) -> str:
        return self.info["options"]["objective"]

    def __len__(self) -> int:
        return int(self.cumulative[-1])

    def __getitem__(self, key: int | tuple[int, Any]) -> dict[str, Any]:
        index, mask_key = (key if isinstance(key, tuple) else (key, None))
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} out of range ({len(self)} instances)")
        shard = int(np.searchsorted(self.cumulative, index, side="right")) - 1
        item = self.shards[shard].instance(index - int(self.cumulative[shard]))
        if mask_key is not None:
            item["mask_key"] = mask_key
        return item

    def masker(self, **overrides: Any) -> Masker:
        """The dynamic-masking Masker for this data (from dataset.json and continuation.npy)."""
        o, t = self.info["options"], self.info["tokenizer"]
        continuation = np.load(self.data_dir / "continuation.npy")
        options = {"prob": o["masked_lm_prob"], "max_predictions": o["max_predictions_per_seq"],
                   "whole_word": o["whole_word"], "span": o["span"], **overrides}
        return Masker(vocab_size=t["vocab_size"], mask_id=t["mask_id"],
                      special_ids=(t["cls_id"], t["sep_id"], t["pad_id"], t["mask_id"]),
                      exclude_from_random=tuple(t["special_ids"]), is_continuation=continuation, **options)


class PretrainingCollator:
    """Pads a list of dataset items into a batch of tensors, masking them when the data is dynamic.

    `masker=None` means the items are already masked (static data, the validation split).
    """

    def __init__(self, pad_id: int, *, masker: Masker | None = None, seed: int = 0, with_nsp: bool = True,
                 pad_to_multiple_of: int | None = None, next_token: bool = False):
        if next_token and (masker is not None or with_nsp):
            raise ValueError("next-token batches take neither masking nor a sentence label")
        self.pad_id = pad_id
        self.next_token = next_token
        self.masker = masker
        self.seed = seed
        self.with_nsp = with_nsp
        self.pad_to_multiple_of = pad_to_multiple_of
        self._fallback_rng = np.random.default_rng(seed)

    @classmethod
    def for_dataset(cls, dataset: PretrainingDataset, *, seed: int = 0, pad_to_multiple_of: int | None = None,
                    mask_rate: float | None = None, next_token: bool = False) -> PretrainingCollator:
        """The collator of a dataset; `mask_rate` replaces the masking rate the data was prepared with
        (dynamic masking only: static data was masked once and for all by `prepare`); `next_token`
        gives left-to-right LM batches instead (see the module docstring)."""
        if next_token:
            if mask_rate is not None:
                raise ValueError("mask_rate is a masked-LM setting; next-token prediction masks nothing")
            return cls(dataset.info["tokenizer"]["pad_id"], seed=seed, with_nsp=False,
                       pad_to_multiple_of=pad_to_multiple_of, next_token=True)
        masker = None
        if mask_rate is not None:
            if not 0.0 < mask_rate < 1.0:
                raise ValueError(f"mask_rate must be in (0, 1), not {mask_rate}")
            if dataset.static:
                raise ValueError(f"{dataset.data_dir}: mask_rate needs data prepared with masking 'dynamic' "
                                 "(these shards were masked once, at the rate they were prepared with)")
            max_length = dataset.info["options"]["max_seq_length"]
            masker = dataset.masker(prob=mask_rate, max_predictions=math.ceil(mask_rate * max_length))
        elif not dataset.static:
            masker = dataset.masker()
        return cls(dataset.info["tokenizer"]["pad_id"], masker=masker,
                   seed=seed, with_nsp=dataset.objective != "none", pad_to_multiple_of=pad_to_multiple_of)

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        B = len(items)
        lengths = np.fromiter((len(it["input_ids"]) for it in items), dtype=np.int64, count=B)
        T = int(lengths.max())
        if self.pad_to_multiple_of:
            T = math.ceil(T / self.pad_to_multiple_of) * self.pad_to_multiple_of
        ids = np.full((B, T), self.pad_id, dtype=np.int64)
        for row, it in enumerate(items):
            ids[row, :lengths[row]] = it["input_ids"]
        positions = np.arange(T)
        attention = positions[None, :] < lengths[:, None]
        segment_b = np.fromiter((it["segment_b"] for it in items), dtype=np.int64, count=B)
        token_type = (positions[None, :] >= segment_b[:, None]) & attention

        if self.next_token:
            for row, it in enumerate(items):
                if "mask_positions" in it:  # statically masked shards: put the original tokens back
                    ids[row, it["mask_positions"]] = it["mask_targets"]
            labels = np.where(attention, ids, IGNORE_INDEX)  # (B, T): shifted by the model, -100 at padding
        elif self.masker is None:
            labels = np.full((B, T), IGNORE_INDEX, dtype=np.int64)
            for row, it in enumerate(items):
                labels[row, it["mask_positions"]] = it["mask_targets"]
        else:
            key = items[0].get("mask_key")
            rng = np.random.default_rng(key) if key is not None else self._fallback_rng
            ids, labels = self.masker(ids, rng)[:2]
        batch = {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(token_type.astype(np.int64)),
            "attention_mask": torch.from_numpy(attention.astype(np.int64)),
            "labels": torch.from_numpy(labels),  # MLM labels (-100 where nothing is predicted), or the ids
        }
        if self.with_nsp:
            nsp = np.fromiter((it["nsp_label"] for it in items), dtype=np.int64, count=B)
            batch["next_sentence_label"] = torch.from_numpy(nsp)
        return batch


def rank_indices(num_instances: int, *, epoch: int, seed: int, rank: int, world_size: int, shuffle: bool = True,
                 even: bool = False) -> np.ndarray:
    """The instances rank `rank` reads in `epoch`, in order.

    One permutation per epoch (seeded by `seed` and `epoch`) dealt round-robin to the ranks: every
    instance goes to exactly one rank and rank sizes differ by at most one. `even=True` drops the last
    `num_instances % world_size` of the permutation so that all ranks have the same count (what DDP needs
    to keep ranks in step); the dropped ones change from epoch to epoch.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), not {rank}")
    order = (np.random.default_rng([seed, epoch]).permutation(num_instances) if shuffle
             else np.arange(num_instances))
    if even:
        order = order[:num_instances - num_instances % world_size]
    return order[rank::world_size]


class PretrainingLoader:
    """Iterates batches of one rank's share of a split, one epoch per `for` loop, from a resumable position.

    The position (`state_dict()`: epoch and the number of instances this rank has consumed in it)
    counts only batches handed to the caller, so prefetching by DataLoader workers does not move it.
    """

    def __init__(self, data_dir: str | Path, batch_size: int, *, split: str = "train", seed: int = 0,
                 rank: int = 0, world_size: int = 1, shuffle: bool | None = None, drop_last: bool = False,
                 even: bool = False, num_workers: int = 0, pad_to_multiple_of: int | None = None,
                 pin_memory: bool = False, mask_rate: float | None = None, next_token: bool = False):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.dataset = PretrainingDataset(data_dir, split)
        self.collator = PretrainingCollator.for_dataset(self.dataset, seed=seed, pad_to_multiple_of=pad_to_multiple_of,
                                                        mask_rate=mask_rate, next_token=next_token)
        self.batch_size = batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.shuffle = split == "train" if shuffle is None else shuffle
        self.drop_last, self.even = drop_last, even
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.epoch = 0
        self.offset = 0  # instances of this epoch already handed out to the caller
        rank_indices(0, epoch=0, seed=seed, rank=rank, world_size=world_size)  # checks rank

    def indices(self, epoch: int | None = None) -> np.ndarray:
        return rank_indices(len(self.dataset), epoch=self.epoch if epoch is None else epoch, seed=self.seed,
                            rank=self.rank, world_size=self.world_size, shuffle=self.shuffle, even=self.even)

    def __len__(self) -> int:
        """Batches in a whole epoch for this rank."""
        n = len(self.indices())
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _batches(self) -> list[list[tuple[int, tuple]]]:
        mine = self.indices()
        stop = len(mine) - len(mine) % self.batch_size if self.drop_last else len(mine)
        batches = []
        for start in range(self.offset, stop, self.batch_size):
            number = start // self.batch_size
            key = (self.seed, self.epoch, self.rank, number)
            batches.append([(int(i), key) for i in mine[start:min(start + self.batch_size, stop)]])
        return batches

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = self._batches()
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collator,
                            num_workers=self.num_workers, pin_memory=self.pin_memory,
                            persistent_workers=False)
        for batch in loader:
            self.offset += int(batch["input_ids"].shape[0])
            yield batch
        self.epoch += 1
        self.offset = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.offset = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "rank": self.rank,
                "world_size": self.world_size, "batch_size": self.batch_size, "num_instances": len(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "world_size", "num_instances"):
            mine = self.seed if key == "seed" else self.world_size if key == "world_size" else len(self.dataset)
            if key in state and state[key] != mine:
                raise ValueError(f"cannot resume: the saved data position has {key}={state[key]}, this loader "
                                 f"{mine}; the order of instances would differ")
        if state.get("batch_size", self.batch_size) != self.batch_size and self.collator.masker is not None:
            raise ValueError(f"cannot resume dynamic masking with batch_size {self.batch_size} "
                             f"(saved with {state['batch_size']}): the masks would differ")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
