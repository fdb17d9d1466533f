"""`finetune classify --method setfit` against the `setfit` package on the same rows, checkpoint and
settings: the wall time from loading the checkpoint to scored dev rows, side by side, as a ratio.

    python benchmarks/setfit_speed.py [--per-class 16] [--dev 200] [--rounds 3] [--threads 2]

Both train all-MiniLM-L6-v2 on the same SST-2 sample (`--per-class` sentences of each label, drawn
with seed 1 as `experiments.few_shot` draws them) with the package's defaults that bertforge's method
copies: 20 positive and 20 negative pairs per sentence, batch 16, one epoch, body rate 2e-5, cosine
loss, a logistic head; then both label the first `--dev` SST-2 dev sentences. What is timed is one
call each, after the libraries are imported: `bertforge.finetune.finetune(..., method="setfit")`,
which also writes its run directory (the classifier, the encoder, predictions, the report), and the
package's `SetFitModel.from_pretrained` + `Trainer.train` + `predict`. The two draw and batch their
pairs each their own way, and bertforge encodes each distinct sentence of a batch once where the
package encodes both sentences of every pair, so the dev accuracy of each round is kept beside its
time. Each run is a fresh process; the libraries alternate over `--rounds` rounds
and the median is kept.

Requires the bench extra (`pip install -e ".[bench]"`: setfit). Results go to
benchmarks/results/setfit_speed.json and the `setfit-speed` section of docs/benchmarks.md.
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

LIBRARIES = ("bertforge", "setfit")
SEED = 1


def child(args: argparse.Namespace) -> None:
    """One timed run in this process; prints its result as the last line of stdout."""
    import torch

    torch.set_num_threads(args.threads)
    from experiments import few_shot

    if args.child == "bertforge":
        import bertforge.finetune  # noqa: F401  (imported before the clock starts, as the package below)
    else:
        import setfit  # noqa: F401
    train_rows, dev_rows = few_shot.load("sst2")
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        train = few_shot.write(work / "train.csv", few_shot.sample(train_rows, args.per_class, SEED))
        dev = few_shot.write(work / "dev.csv", dev_rows[:args.dev])
        result = (few_shot.one_run("setfit", train, dev, work / "run", SEED) if args.child == "bertforge"
                  else few_shot.library_run(train, dev, SEED, work / "run"))
    print(json.dumps({"seconds": result["wall_s"], "accuracy": result["accuracy"]}))


def measure(library: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", library, "--per-class", str(args.per_class), "--dev",
               str(args.dev), "--threads", str(args.threads)]
    env = {**os.environ, "BERTFORGE_THREADS": str(args.threads), "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{library} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def render(payload: dict) -> str:
    ours, theirs = payload["bertforge"]["seconds"], payload["setfit"]["seconds"]
    ratio = theirs / ours
    rows = [["bertforge `finetune classify --method setfit`", f"{ours:.1f}", f"{ratio:.2f}x",
             " / ".join(f"{100 * r['accuracy']:.1f}" for r in payload["bertforge"]["runs"])],
            [f"setfit package ({payload['setfit_version']})", f"{theirs:.1f}", "1.00x",
             " / ".join(f"{100 * r['accuracy']:.1f}" for r in payload["setfit"]["runs"])]]
    target = "met" if ratio >= 1.5 else f"missed by {1.5 - ratio:.2f}x"
    return "\n".join([
        "## Few-shot training (`--method setfit`) against the setfit package", "",
        f"`python benchmarks/setfit_speed.py {payload['arguments']}`: all-MiniLM-L6-v2, "
        f"{payload['per_class']} SST-2 sentences per class (seed {SEED}), 20 positive and 20 negative pairs "
        "per sentence, batch 16, one epoch, body rate 2e-5, a logistic head; wall time from loading the "
        f"checkpoint to {payload['dev']} labelled dev sentences (bertforge also writes its run directory), "
        f"{payload['threads']} threads, median of {payload['rounds']} rounds (a fresh process each, "
        "libraries alternating).", "",
        markdown_table(["library", "seconds", "speed vs the package", "dev accuracy per round"], rows), "",
        f"Target (>= 1.5x the package's speed): {target}. Per round (bertforge / package seconds): "
        + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in payload["per_round"]) + ".", "",
        machine_line(payload["machine"]), ""])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-class", type=int, default=16)
    parser.add_argument("--dev", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=LIBRARIES)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    import setfit

    results: dict[str, list[dict[str, float]]] = {library: [] for library in LIBRARIES}
    for round_number in range(args.rounds):
        for library in (LIBRARIES if round_number % 2 == 0 else LIBRARIES[::-1]):
            started = time.time()
            results[library].append(measure(library, args))
            print(f"round {round_number + 1} {library}: {results[library][-1]['seconds']:.1f} s "
                  f"(process {time.time() - started:.0f} s)", flush=True)
    payload = {"per_class": args.per_class, "dev": args.dev, "threads": args.threads, "rounds": args.rounds,
               "arguments": " ".join(sys.argv[1:]), "machine": machine(), "setfit_version": setfit.__version__,
               "per_round": [[a["seconds"], b["seconds"]]
                             for a, b in zip(results["bertforge"], results["setfit"], strict=True)]}
    for library, runs in results.items():
        payload[library] = {"seconds": statistics.median(r["seconds"] for r in runs), "runs": runs}
    save_results("setfit_speed", payload)
    text = render(payload)
    update_doc_section("setfit-speed", text)
    print(text)


if __name__ == "__main__":
    main()
