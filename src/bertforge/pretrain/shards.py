"""The prepared shards a pre-training run reads: their dataset.json, the tokenizer they were made with,
the training batches (BERT's two phases of sequence length, a position that survives a new world size)
and the metrics on their validation split."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.pretrain.metrics import pretraining_metrics
from bertforge.pretrain.recipe import DataOptions, Recipe

if TYPE_CHECKING:
    from torch import nn

    from bertforge.train.distributed import DistContext
    from bertforge.train.loop import Batch, EvalFn


class ShardBatches:
    """A `PretrainingLoader` as the loop's `ResumableBatches`, whose position survives a new world size.

    The loader deals each epoch's permutation round-robin to the ranks, so after every rank took `o`
    instances the first `o x W` of the permutation are used, whatever W was. On another world size W'
    a rank therefore continues at offset `o x W / W'` (exact when it divides).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        world = self.loader.world_size
        saved_world = state.get("world_size", world)
        if saved_world != world:
            state = {**state, "offset": state["offset"] * saved_world // world, "world_size": world,
                     "rank": self.loader.rank}
        self.loader.load_state_dict(state)


class PhasedBatches:
    """BERT's schedule of sequence lengths: `first` for `switch_at` micro-batches, then `second`."""

    def __init__(self, first: Any, second: Any, switch_at: int) -> None:
        self.first, self.second, self.switch_at = first, second, switch_at
        self.fetched = 0

    def __iter__(self) -> Iterator[Batch]:
        if self.fetched < self.switch_at:
            for batch in self.first:
                self.fetched += 1
                yield batch
                if self.fetched >= self.switch_at:
                    return  # the loop asks again, and gets the second phase
        else:
            for batch in self.second:
                self.fetched += 1
                yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"fetched": self.fetched, "first": self.first.state_dict(), "second": self.second.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fetched = state["fetched"]
        self.first.load_state_dict(state["first"])
        self.second.load_state_dict(state["second"])


def read_dataset_info(data_dir: Path) -> dict[str, Any]:
    path = data_dir / "dataset.json"
    if not path.is_file():
        raise ValueError(f"{data_dir}: no dataset.json; make shards with `bertforge prepare` first")
    return json.loads(path.read_text(encoding="utf-8"))


def training_batches(data_dir: Path, recipe: Recipe, ctx: DistContext) -> ShardBatches | PhasedBatches:
    from bertforge.data.loader import PretrainingLoader

    def loader(directory: Path) -> ShardBatches:
        # even + drop_last: every rank gets as many batches of the same size, so ranks stay in step
        return ShardBatches(PretrainingLoader(
            directory, recipe.data.batch_size, split="train", seed=recipe.train.seed, rank=ctx.rank,
            world_size=ctx.world_size, drop_last=True, even=True, num_workers=recipe.data.num_workers,
            pad_to_multiple_of=recipe.data.pad_to_multiple_of, pin_memory=ctx.device.type == "cuda",
            mask_rate=recipe.data.mask_rate, next_token=recipe.data.objective == "ltr"))

    first = loader(data_dir)
    if not recipe.data.long_data or recipe.data.long_fraction <= 0:
        return first
    long_dir = path_beside(data_dir, recipe.data.long_data)
    switch_step = round((1 - recipe.data.long_fraction) * recipe.train.max_steps)
    return PhasedBatches(first, loader(long_dir), switch_step * recipe.train.grad_accum)


def path_beside(data_dir: Path, other: str) -> Path:
    path = Path(other)
    return path if path.is_absolute() else data_dir.parent / path


def validation_evaluator(data_dir: Path, options: DataOptions, objective: str) -> EvalFn | None:
    """Metrics on the fixed, statically masked validation split (None when the data has none); for
    objective ltr on the same sequences with their masks undone, as next-token prediction."""
    from bertforge.data.loader import PretrainingLoader

    if options.objective == "ltr":  # the recipe's choice, whatever the data was prepared for
        objective = "ltr"
    loader = PretrainingLoader(data_dir, options.eval_batch_size, split="valid", shuffle=False,
                               pad_to_multiple_of=options.pad_to_multiple_of, next_token=objective == "ltr")
    if len(loader.dataset) == 0:
        return None

    def evaluate(model: nn.Module) -> dict[str, float]:
        loader.set_epoch(0)  # the same batches every time
        return pretraining_metrics(model, loader, options.eval_max_batches, objective)

    return evaluate


def find_tokenizer(data_dir: Path, info: dict[str, Any], explicit: str | None) -> Path | None:
    """The tokenizer the shards were made with: given, recorded in dataset.json, or DATA/tokenizer.

    A candidate whose vocabulary differs from the one the data records (by SHA-1) is refused.
    """
    candidates = [explicit, info.get("tokenizer_dir"), info.get("tokenizer", {}).get("directory"),
                  str(data_dir / "tokenizer")]
    for candidate in candidates:
        if candidate and has_tokenizer(Path(candidate)):
            path = Path(candidate)
            recorded = info.get("tokenizer", {}).get("vocab_sha1")
            if recorded and vocab_sha1(path) != recorded:
                if candidate == explicit:
                    raise ValueError(f"{path}: its vocabulary is not the one the data in {data_dir} was made with")
                continue
            return path
    return None


# the files a tokenizer directory of some family holds (WordPiece, byte-level BPE, SentencePiece, any tokenizer.json)
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "vocab.json", "sentencepiece.bpe.model", "spiece.model", "spm.model")


def has_tokenizer(directory: Path) -> bool:
    """Whether `directory` holds a tokenizer's files, of any family."""
    return any((directory / name).is_file() for name in TOKENIZER_FILES)


def vocab_sha1(directory: Path) -> str:
    """The digest `prepare` records: the tokens in id order, joined by newlines."""
    from bertforge.tokenizer import BertTokenizer

    vocab = BertTokenizer.from_pretrained(directory).vocab
    return hashlib.sha1("\n".join(sorted(vocab, key=vocab.__getitem__)).encode("utf-8")).hexdigest()
