"""What does a frozen encoder know about SST-2? A linear probe on each layer, pre-trained vs random weights.

    python -m experiments.sst2_frozen_probe --model runs/mini64/pretrain/final [--train-examples 6000]

Encodes SST-2 sentences (the same fixed training sub-sample `finetune` uses, and the whole dev set)
once with the encoder frozen, takes per layer the [CLS] vector and the mean of the real tokens'
vectors (layer 0 = the embeddings output, so its mean is a bag of the input embeddings), plus the
pooler's output, and fits scikit-learn's logistic regression on standardised features. The same is
done for the model of the same config with BERT's random initialisation (seed 0, as
`pretrain_vs_scratch.py` makes it), so the table says what pre-training put into each layer.
Results: experiments/results/sst2_frozen_probe.json, one entry per checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from experiments.common import RESULTS, ROOT, machine, save_results
from experiments.pretrain_vs_scratch import random_twin


def encode(model_dir: Path, texts: list[str], max_length: int, batch_size: int = 128) -> dict[str, np.ndarray]:
    """Feature name ("cls1", "mean0", ..., "pooler") -> (N, H) matrix, from the frozen encoder."""
    from bertforge.features import pool
    from bertforge.model import BertModel
    from bertforge.tokenizer import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(model_dir)
    model = BertModel.from_pretrained(model_dir).eval()
    parts: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(texts), batch_size):
        batch = tokenizer.encode_batch(texts[start:start + batch_size], max_length=max_length, truncation=True,
                                       padding=True, return_tensors="pt")
        with torch.no_grad():
            out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                        output_hidden_states=True)
        for layer, hidden in enumerate(out.hidden_states):  # (B, T, H) each
            parts.setdefault(f"mean{layer}", []).append(pool(hidden, batch["attention_mask"], "mean").numpy())
            if layer > 0:  # the embeddings output at [CLS] is the same vector for every sentence
                parts.setdefault(f"cls{layer}", []).append(hidden[:, 0].numpy())
        if out.pooled_output is not None:
            parts.setdefault("pooler", []).append(out.pooled_output.numpy())
    return {name: np.concatenate(chunks) for name, chunks in parts.items()}


def probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, dev_x: np.ndarray, dev_y: np.ndarray) -> float:
    from sklearn.linear_model import LogisticRegression

    mean, std = train_x.mean(0), train_x.std(0) + 1e-6
    classifier = LogisticRegression(max_iter=2000).fit((train_x - mean) / std, train_y)
    return float(classifier.score((dev_x - mean) / std, dev_y))


def probe(model_dir: Path, glue: Path, train_examples: int, max_length: int) -> dict[str, float]:
    from bertforge.tasks.base import subsample
    from bertforge.tasks.glue import read_glue

    train = subsample(read_glue(glue, "sst2", "train"), train_examples)
    dev = read_glue(glue, "sst2", "dev")
    train_y = np.array([int(e.label) for e in train])
    dev_y = np.array([int(e.label) for e in dev])
    train_x = encode(model_dir, [e.text_a for e in train], max_length)
    dev_x = encode(model_dir, [e.text_a for e in dev], max_length)
    return {name: round(100 * probe_accuracy(train_x[name], train_y, dev_x[name], dev_y), 1) for name in train_x}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint directory (config, weights, tokenizer)")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "glue")
    parser.add_argument("--train-examples", type=int, default=6000)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="frozen-probe-"))
    try:
        entry: dict[str, Any] = {
            "pre-trained": probe(args.model, args.data, args.train_examples, args.max_length),
            "random initialisation": probe(random_twin(args.model, work / "random"), args.data,
                                           args.train_examples, args.max_length),
            "train_examples": args.train_examples, "max_length": args.max_length,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    path = RESULTS / "sst2_frozen_probe.json"
    saved = json.loads(path.read_text()) if path.exists() else {"checkpoints": {}}
    saved["checkpoints"][str(args.model)] = entry
    saved["machine"] = machine()
    save_results("sst2_frozen_probe", saved)
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    main()
