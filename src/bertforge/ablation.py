"""The feature-based NER ablation: a frozen BERT, cached layer activations, a two-layer BiLSTM tagger.

Behind `bertforge ablate-features` and `bertforge finetune ner --frozen`. Not a fine-tuning task (it
trains no BERT parameter and declares no `Task`): it builds on `features` (the layer strategies, the
feature cache), `plot` (the chart) and the CoNLL-2003 task's reader and labels (`tasks.ner`).

The BERT paper's feature-based experiment (section 5.3, Table 7) on CoNLL-2003: no BERT parameter is
fine-tuned; the activations of one or more layers feed a randomly initialised two-layer BiLSTM and a
classification layer, and each strategy of combining layers is scored by dev entity F1. Each word is
represented by its first WordPiece, as in the paper's NER set-up.

The encoder runs once: every hidden state (embeddings and all L layers) of every word's first piece is
cached in fp16 (`features.write_features`, a .npy file with an index). Each strategy then only combines
cached rows (`features.combine_layers`, the same code as `bertforge extract`) and trains the tagger with
the shared training loop (`bertforge.train.train`). `ablate` runs every strategy and writes the table
(markdown, with the paper's BERT-base numbers beside ours) and a bar chart.

Differences from the paper, kept deliberately small: sentence-level context (the paper's Table 7 used
document context), the tagger size is a parameter (the paper used 768 units per direction), and the
"sum" strategies add layers with equal weights (the paper's rows say "weighted sum" without giving the
weights).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.config import IGNORE_INDEX
from bertforge.features import (
    STRATEGIES,
    FeatureExtractor,
    FeatureFile,
    LayerSelection,
    combine_layers,
    resolve_layers,
    write_features,
)
from bertforge.plot import save_figure
from bertforge.tasks.ner import Ner, NerSentence, label_list

# BERT-base, CoNLL-2003 dev F1 (Devlin et al. 2019, Table 7)
PAPER_DEV_F1 = {
    "embeddings": 91.0, "second_to_last": 95.6, "last": 94.9, "sum_last_four": 95.9,
    "concat_last_four": 96.1, "sum_all": 95.5, "finetune_all": 96.4,
}
PAPER_ROWS = {
    "embeddings": "Embeddings", "second_to_last": "Second-to-last hidden", "last": "Last hidden",
    "sum_last_four": "Weighted sum last four hidden", "concat_last_four": "Concat last four hidden",
    "sum_all": "Weighted sum all 12 layers", "finetune_all": "Fine-tune all",
}


# ------------------------------------------------------------------------------------------------
# the tagger
# ------------------------------------------------------------------------------------------------
@dataclass
class TaggerOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # (B, W, num_labels)


class BiLstmTagger(nn.Module):
    """word features (B, W, D) -> dropout -> BiLSTM x num_layers -> dropout -> linear -> tag logits."""

    def __init__(self, input_size: int, num_labels: int, hidden_size: int = 256, num_layers: int = 2,
                 dropout: float = 0.25) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=num_layers, batch_first=True, bidirectional=True,
                            dropout=dropout if num_layers > 1 else 0.0)
        self.classifier = nn.Linear(2 * hidden_size, num_labels)

    def forward(self, features: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None) -> TaggerOutput:
        lengths = attention_mask.sum(dim=1).cpu()  # (B,)
        packed = nn.utils.rnn.pack_padded_sequence(self.dropout(features), lengths, batch_first=True,
                                                   enforce_sorted=False)
        # packing keeps the backward direction from starting on padding
        hidden, _ = self.lstm(packed)
        hidden, _ = nn.utils.rnn.pad_packed_sequence(hidden, batch_first=True,
                                                     total_length=features.shape[1])  # (B, W, 2h)
        logits = self.classifier(self.dropout(hidden))  # (B, W, num_labels)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                               ignore_index=IGNORE_INDEX)
        return TaggerOutput(loss, logits)


# ------------------------------------------------------------------------------------------------
# cached features and batches
# ------------------------------------------------------------------------------------------------
def cache_features(model_dir: str | os.PathLike[str], sentences: Sequence[NerSentence],
                   out: str | os.PathLike[str], *, batch_size: int = 32, progress: bool = True) -> FeatureFile:
    """Every hidden state (0..L) of every word's first piece, fp16, to `out` (.npy + index); reused if there."""
    out = Path(out)
    if out.is_file() and (out.parent / (out.name + ".index.json")).is_file():
        cached = FeatureFile(out)
        if [item.get("words") for item in cached.items] == [list(s.words) for s in sentences]:
            return cached
    from tqdm.auto import tqdm

    # the encoder of any checkpoint, loaded as `bertforge extract` loads it; then every layer selected
    extractor = FeatureExtractor.from_pretrained(model_dir, strategy="embeddings", align="first", dtype="float16",
                                                 batch_size=batch_size)
    num_layers = extractor.model.config.num_hidden_layers
    extractor.selection = resolve_layers(num_layers, layers=list(range(num_layers + 1)), combine="none")
    with tqdm(total=len(sentences), unit="sent", desc=f"features -> {out.name}", disable=not progress) as bar:
        summary = write_features(extractor, [list(s.words) for s in sentences], out, progress=bar)
    if summary["truncated_inputs"]:
        raise ValueError(f"{summary['truncated_inputs']} sentences are longer than the model's "
                         f"{extractor.tokenizer.model_max_length} tokens; their last words would get no features")
    return FeatureFile(out)


def sentence_inputs(cache: FeatureFile, index: int, selection: LayerSelection) -> torch.Tensor:
    """(n_words, D) float32 tagger inputs of sentence `index` under a layer selection."""
    rows = torch.from_numpy(np.asarray(cache.matrix[cache.rows(index)], dtype=np.float32))  # (n, L+1, H)
    return combine_layers(rows.unbind(dim=1), selection)  # (L+1) x (n, H) -> (n, D)


def collate_tags(inputs: Sequence[torch.Tensor], labels: Sequence[Sequence[int]] | None = None) -> dict[str, torch.Tensor]:
    """Pad sentences to the longest: features (B, W, D), attention_mask (B, W), labels (B, W) with -100."""
    width = max(x.shape[0] for x in inputs)
    features = inputs[0].new_zeros((len(inputs), width, inputs[0].shape[-1]))
    mask = torch.zeros((len(inputs), width), dtype=torch.long)
    for row, x in enumerate(inputs):
        features[row, :x.shape[0]] = x
        mask[row, :x.shape[0]] = 1
    batch = {"features": features, "attention_mask": mask}
    if labels is not None:
        batch["labels"] = torch.full((len(inputs), width), IGNORE_INDEX, dtype=torch.long)
        for row, tags in enumerate(labels):
            batch["labels"][row, :len(tags)] = torch.tensor(tags, dtype=torch.long)
    return batch


class CachedTagBatches:
    """Training batches of cached word features, reshuffled each epoch; resumable (`ResumableBatches`).

    `rows[k]` is the cached sentence that `labels[k]` belongs to (default: sentence k), so a sub-sample
    of the training set trains from the cache of the whole set.
    """

    def __init__(self, cache: FeatureFile, labels: Sequence[Sequence[int]], selection: LayerSelection,
                 batch_size: int, *, rows: Sequence[int] | None = None, seed: int = 0) -> None:
        self.rows = list(range(len(labels))) if rows is None else list(rows)
        if len(self.rows) != len(labels) or (self.rows and not 0 <= min(self.rows) <= max(self.rows) < len(cache)):
            raise ValueError(f"{len(labels)} label lists for {len(self.rows)} rows of a {len(cache)}-sentence cache")
        self.cache, self.labels, self.selection = cache, list(labels), selection
        self.batch_size, self.seed = batch_size, seed
        self.epoch, self.position = 0, 0

    def __len__(self) -> int:
        return math.ceil(len(self.labels) / self.batch_size)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.labels))
        while self.position < len(self):
            chosen = order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
            self.position += 1
            yield collate_tags([sentence_inputs(self.cache, self.rows[int(i)], self.selection) for i in chosen],
                               [self.labels[int(i)] for i in chosen])
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def predict_tags(model: BiLstmTagger, cache: FeatureFile, selection: LayerSelection, label_names: Sequence[str],
                 *, batch_size: int = 64) -> list[list[str]]:
    """One tag per word of each cached sentence."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    tags: list[list[str]] = []
    try:
        with torch.no_grad():
            for start in range(0, len(cache), batch_size):
                inputs = [sentence_inputs(cache, i, selection) for i in range(start, min(start + batch_size, len(cache)))]
                batch = collate_tags(inputs)
                best = model(batch["features"].to(device), batch["attention_mask"].to(device)).logits.argmax(-1)
                for row, x in enumerate(inputs):
                    tags.append([label_names[int(k)] for k in best[row, :x.shape[0]].tolist()])
    finally:
        model.train(was_training)
    return tags


# ------------------------------------------------------------------------------------------------
# one strategy
# ------------------------------------------------------------------------------------------------
@dataclass
class FrozenNerConfig:
    """The tagger and its training; the defaults are sized for a CPU run."""

    epochs: int = 4
    batch_size: int = 32
    lr: float = 2e-3
    lstm_size: int = 256  # units per direction (the paper: 768)
    lstm_layers: int = 2
    dropout: float = 0.25
    seed: int = 0
    eval_every_epoch: bool = False  # dev F1 after each epoch (costs a pass over dev each), else at the end only
    progress: bool = True


def train_frozen_ner(train_cache: FeatureFile, train_sentences: Sequence[NerSentence], dev_cache: FeatureFile,
                     dev_sentences: Sequence[NerSentence], strategy: str | None, run_dir: str | os.PathLike[str],
                     config: FrozenNerConfig | None = None, *, train_rows: Sequence[int] | None = None,
                     layers: Sequence[int] | None = None, combine: str | None = None,
                     resume: bool = True) -> dict[str, Any]:
    """Train the BiLSTM tagger on one layer strategy with the shared loop; dev entity F1 (conlleval) at the end.

    The caches are those of `cache_features`, each aligned with its sentence list; `train_rows` picks
    the training sentences used (default all). Returns (and writes to RUN/result.json) the scores, the
    hidden states used, the steps and the seconds taken.
    """
    from bertforge.train import OptimConfig, TrainConfig, train

    config = config or FrozenNerConfig()
    num_layers = int(train_cache.index["num_hidden_layers"])
    selection = resolve_layers(num_layers, strategy, layers, combine)
    rows = list(range(len(train_sentences))) if train_rows is None else list(train_rows)
    train_sentences = [train_sentences[i] for i in rows]
    label_names = label_list(train_sentences)
    label_ids = {name: i for i, name in enumerate(label_names)}
    unknown = {t for s in dev_sentences for t in s.labels} - set(label_names)
    if unknown:
        raise ValueError(f"dev labels not seen in training: {sorted(unknown)}")
    hidden = int(train_cache.matrix.shape[-1])
    torch.manual_seed(config.seed)
    model = BiLstmTagger(selection.dim(hidden), len(label_names), config.lstm_size, config.lstm_layers, config.dropout)
    batches = CachedTagBatches(train_cache, [[label_ids[t] for t in s.labels] for s in train_sentences], selection,
                               config.batch_size, rows=rows, seed=config.seed)

    def evaluate(tagger: nn.Module) -> dict[str, float]:
        predicted = predict_tags(tagger, dev_cache, selection, label_names)  # type: ignore[arg-type]
        return Ner().metric(dev_sentences, predicted)  # conlleval: precision, recall, f1, accuracy

    steps = config.epochs * len(batches)
    started = time.perf_counter()
    result = train(model, batches, run_dir,
                   TrainConfig(max_steps=steps, eval_every=len(batches) if config.eval_every_epoch else 0,
                               log_every=50, seed=config.seed,
                               device="cpu", progress=config.progress, keep_last=1),
                   OptimConfig(lr=config.lr, weight_decay=0.0, warmup_ratio=0.05, schedule="linear"),
                   evaluate=evaluate, resume=resume)
    summary = {
        "strategy": selection.name or "layers", "layers": list(selection.layers), "combine": selection.combine,
        "input_size": selection.dim(hidden), "dev_f1": result.metrics.get("f1", math.nan),
        "dev_precision": result.metrics.get("precision", math.nan), "dev_recall": result.metrics.get("recall", math.nan),
        "steps": result.step, "train_sentences": len(train_sentences), "dev_sentences": len(dev_sentences),
        "seconds": round(time.perf_counter() - started, 1), "config": asdict(config),
    }
    Path(run_dir, "result.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


# ------------------------------------------------------------------------------------------------
# the ablation
# ------------------------------------------------------------------------------------------------
def training_subset(count: int, limit: int | None, seed: int = 0) -> list[int]:
    """The indices of `bertforge finetune --max-train-examples`'s sub-sample: `limit` of `count`, file order."""
    from bertforge.tasks.base import subsample

    return subsample(list(range(count)), limit, seed)


def ablate(model_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
           strategies: Sequence[str] = STRATEGIES, train_sentences: int | None = None,
           config: FrozenNerConfig | None = None, finetune_f1: float | None = None,
           model_name: str | None = None) -> list[dict[str, Any]]:
    """Cache features once, train the tagger per strategy, write OUT/ablation.md, ablation.png, results.json.

    `train_sentences` trains on a fixed random sub-sample of N sentences, the same one as
    `bertforge finetune ner --max-train-examples N` (None: all). A strategy whose
    OUT/runs/<strategy>/result.json exists is not run again. `finetune_f1` (dev F1 of the whole model
    fine-tuned, in %) fills the "fine-tune all" row; without it the row says "not run".
    """
    config = config or FrozenNerConfig()
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    task = Ner()
    full_train = task.read(data_dir, "train")
    rows = training_subset(len(full_train), train_sentences)
    dev_set = task.read(data_dir, "dev")
    started = time.perf_counter()
    # the whole training set is cached once; a run on a sub-sample reads its rows from that cache
    train_cache = cache_features(model_dir, full_train, out_dir / "cache" / "train.npy", progress=config.progress)
    dev_cache = cache_features(model_dir, dev_set, out_dir / "cache" / "dev.npy", progress=config.progress)
    cache_seconds = time.perf_counter() - started

    results = []
    for strategy in strategies:
        run_dir = out_dir / "runs" / strategy
        done = run_dir / "result.json"
        if done.is_file():
            previous = json.loads(done.read_text(encoding="utf-8"))
            if previous["config"] != asdict(config) or previous["train_sentences"] != len(rows):
                raise ValueError(f"{run_dir} holds a run with other settings; choose another output "
                                 "directory or remove that run")
            results.append(previous)
            continue
        results.append(train_frozen_ner(train_cache, full_train, dev_cache, dev_set, strategy, run_dir, config,
                                        train_rows=rows))
    name = model_name or Path(model_dir).name
    meta = {"model": name, "num_hidden_layers": int(train_cache.index["num_hidden_layers"]),
            "train_sentences": len(rows), "dev_sentences": len(dev_set), "cache_seconds": round(cache_seconds, 1),
            "finetune_f1": finetune_f1}
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n",
                                          encoding="utf-8")
    (out_dir / "ablation.md").write_text(ablation_table(results, meta), encoding="utf-8")
    plot_ablation(results, out_dir / "ablation.png", meta)
    return results


def _layers_text(layers: Sequence[int], num_layers: int) -> str:
    names = ["embeddings" if i == 0 else str(i) for i in layers]
    if len(names) > 2 and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{names[0]}-{names[-1]}"
    return ", ".join(names)


def ablation_table(results: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """Markdown: our strategy, the paper's row, the hidden states used, the paper's BERT-base dev F1, ours."""
    num_layers = meta["num_hidden_layers"]
    model = meta["model"]
    lines = [f"| strategy | paper's row | {model} hidden states used | paper: BERT-base dev F1 | ours: {model} dev F1 |",
             "|---|---|---|---|---|"]
    for r in results:
        how = "" if len(r["layers"]) == 1 else f" ({r['combine']})"
        lines.append(f"| {r['strategy']} | {PAPER_ROWS.get(r['strategy'], '')} | "
                     f"{_layers_text(r['layers'], num_layers)}{how} | {PAPER_DEV_F1.get(r['strategy'], math.nan):.1f} "
                     f"| {100 * r['dev_f1']:.1f} |")
    finetune = meta.get("finetune_f1")
    lines.append(f"| finetune_all | {PAPER_ROWS['finetune_all']} | all, fine-tuned | {PAPER_DEV_F1['finetune_all']:.1f} "
                 f"| {'not run' if finetune is None else f'{finetune:.1f}'} |")
    return "\n".join(lines) + "\n"


def plot_ablation(results: Sequence[dict[str, Any]], out: str | os.PathLike[str], meta: dict[str, Any]) -> Path:
    """Grouped bars per strategy: the paper's BERT-base dev F1 and ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["strategy"] for r in results] + ["finetune_all"]
    ours = [100 * r["dev_f1"] for r in results] + [meta.get("finetune_f1") or math.nan]
    paper = [PAPER_DEV_F1.get(n, math.nan) for n in names]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(1.3 * len(names) + 2, 4.2))
    bars_paper = ax.bar(x - 0.2, paper, 0.4, label="paper: BERT-base", color="#9ecae1")
    bars_ours = ax.bar(x + 0.2, ours, 0.4, label=f"ours: {meta['model']}", color="#3182bd")
    for bars in (bars_paper, bars_ours):
        for bar in bars:
            height = bar.get_height()
            label = "not run" if math.isnan(height) else f"{height:.1f}"
            ax.text(bar.get_x() + bar.get_width() / 2, 0 if math.isnan(height) else height, label,
                    ha="center", va="bottom", fontsize=7)
    low = np.nanmin([v for v in ours + paper if not math.isnan(v)])
    ax.set_ylim(max(0.0, 5 * math.floor((low - 5) / 5)), 100)
    ax.set_xticks(x, [n.replace("_", "\n") for n in names], fontsize=8)
    ax.set_ylabel("CoNLL-2003 dev entity F1")
    ax.set_title(f"feature-based NER: frozen encoder + BiLSTM ({meta['train_sentences']} training sentences)",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside: no bar is hidden
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out)


__all__ = [
    "PAPER_DEV_F1", "BiLstmTagger", "CachedTagBatches", "FrozenNerConfig", "TaggerOutput", "ablate",
    "ablation_table", "cache_features", "collate_tags", "plot_ablation", "predict_tags", "sentence_inputs",
    "train_frozen_ner",
]
