"""How much context does a pre-trained checkpoint use? Held-out masked-LM accuracy three ways.

    python -m experiments.mlm_context_probe --model runs/mini-long/final --data runs/mini/data128 [--batches 4]

Scores the same statically masked validation sequences of `bertforge prepare` shards (the ones the
run evaluated on) with the context as it is; with each sequence's unmasked pieces shuffled among
their positions (same words, no order: what a bag-of-words model sees); and with every unmasked
piece replaced by [MASK] (no context: position and segment only). A model still at the unigram /
bag-of-words stage of pre-training scores about the same on the first two. Results:
experiments/results/mlm_context_probe.json, one entry per checkpoint (a later run of the same
checkpoint replaces its entry).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bertforge import BertForPreTraining
from bertforge.data.loader import PretrainingLoader
from bertforge.pretrain import mlm_context_probe
from bertforge.tokenizer import BertTokenizer
from experiments.common import RESULTS, machine, save_results


def probe(model_dir: Path, data_dir: Path, batches: int, batch_size: int = 128) -> dict[str, float]:
    model = BertForPreTraining.from_pretrained(model_dir).eval()
    tokenizer = BertTokenizer.from_pretrained(model_dir)
    loader = PretrainingLoader(data_dir, batch_size, split="valid", shuffle=False, pad_to_multiple_of=8)
    loader.set_epoch(0)  # the order the run's own evaluations used
    try:
        return mlm_context_probe(model, loader, tokenizer.all_special_ids, tokenizer.mask_token_id,
                                 max_batches=batches)
    except ValueError as error:
        raise SystemExit(f"{data_dir}: {error}") from error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint with the pre-training heads")
    parser.add_argument("--data", type=Path, required=True, help="shards with a validation split")
    parser.add_argument("--batches", type=int, default=4, help="validation batches of 128 (the run's eval_max_batches)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = RESULTS / "mlm_context_probe.json"
    saved = json.loads(path.read_text()) if path.exists() else {"checkpoints": {}}
    saved["checkpoints"][str(args.model)] = probe(args.model, args.data, args.batches)
    saved["machine"] = machine()
    save_results("mlm_context_probe", saved)
    print(json.dumps(saved["checkpoints"], indent=1))


if __name__ == "__main__":
    main()
