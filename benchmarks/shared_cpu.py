"""Throughput on a shared CPU: each job kind alone and beside one and two copies of itself.

    python benchmarks/shared_cpu.py [--kinds pretrain,finetune,predict,serve] [--warmup 10] [--window 20]

A machine that runs several jobs at once gives each a share of its cores; a job whose threads wait
for one another at every parallel region (OpenMP's barriers) can get far less than that share. For
each job kind this starts 1, 2 and 3 identical worker processes at once and measures each worker's
throughput over the same window (after a warm-up), for three setups:

- transformers: its model classes, torch's default threads (one per usable core) and OpenMP's default
  wait policy, as a user gets them;
- bertforge-fixed: bertforge's models with the same defaults (what bertforge did before its thread
  policy);
- bertforge: what its command line does: OpenMP threads that spin only briefly at barriers before
  they sleep (GOMP_SPINCOUNT=10000; a wait policy set in the environment is kept, for trials of
  another) and the thread count kept at the cores the other processes leave idle (`bertforge.threads`, one `tick()` per step or batch,
  as the training loop and inference batches call it).

Job kinds (random weights and token ids: the figures are about speed): pretrain = masked-LM steps of
BERT-mini (L=4, H=256) on 32 x 128 tokens, 15% of them scored; finetune = sequence-classification steps of the same model
on 32 x 128; predict = inference batches of a MiniLM-sized encoder (L=6, H=384) on 32 x 128;
serve = single requests of 1 x 64 on the same encoder. The fair share of a job beside k others is
1/(k+1) of its figure alone. Results: benchmarks/results/shared_cpu.json and the `shared-cpu`
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

SETUPS = ("transformers", "bertforge-fixed", "bertforge")
KINDS = {  # kind -> (model shape, batch, sequence length, what one item is)
    "pretrain": ({"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
                 32, 128, "sequences"),
    "finetune": ({"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
                 32, 128, "sequences"),
    "predict": ({"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
                32, 128, "sequences"),
    "serve": ({"num_hidden_layers": 6, "hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
              1, 64, "requests"),
}
VOCAB = 30522


def _model(setup: str, kind: str) -> Any:
    shape = KINDS[kind][0]
    if setup == "transformers":
        import transformers

        config = transformers.BertConfig(vocab_size=VOCAB, **shape, num_labels=2)
        cls = {"pretrain": transformers.BertForMaskedLM, "finetune": transformers.BertForSequenceClassification}
        return cls.get(kind, transformers.BertModel)(config)
    from bertforge.model import BertConfig, BertForMaskedLM, BertForSequenceClassification, BertModel

    config = BertConfig(vocab_size=VOCAB, **shape)  # two labels by default
    cls = {"pretrain": BertForMaskedLM, "finetune": BertForSequenceClassification}
    return cls.get(kind, BertModel)(config)


def worker(setup: str, kind: str, warmup_s: float, window_s: float, start_at: float) -> dict[str, Any]:
    """Run `kind` until the window closes; count the items finished inside [start + warmup, + window]."""
    if setup == "bertforge":
        from bertforge import threads

        threads.short_spin_wait()  # before torch loads, as the command line does
        threads.install()
        tick = threads.tick
    else:
        def tick() -> None:
            return None
    import torch

    torch.manual_seed(0)
    model = _model(setup, kind)
    _, batch, length, _ = KINDS[kind]
    ids = torch.randint(5, VOCAB, (batch, length))
    mask = torch.ones_like(ids)
    training = kind in ("pretrain", "finetune")
    if kind == "pretrain":  # 15% of the tokens scored, as masked LM pre-training scores them
        labels = ids.masked_fill(torch.rand(ids.shape, generator=torch.Generator().manual_seed(0)) >= 0.15, -100)
    else:
        labels = torch.zeros(batch, dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if training else None
    model.train(training)
    while time.time() < start_at:  # every worker of a scenario starts together
        time.sleep(0.01)
    window_start, window_end = start_at + warmup_s, start_at + warmup_s + window_s
    done, threads_seen = 0, []
    while True:
        tick()
        if training:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode():
                model(input_ids=ids, attention_mask=mask)
        now = time.time()
        if window_start <= now <= window_end:
            done += batch
            threads_seen.append(torch.get_num_threads())
        if now > window_end:
            break
    return {"items_per_s": done / window_s, "threads": sorted(set(threads_seen))}


def scenario(setup: str, kind: str, jobs: int, warmup_s: float, window_s: float) -> dict[str, Any]:
    start_at = time.time() + 8.0  # time for every process to import and build its model
    # torch's defaults for the other setups; bertforge's keeps a wait policy set here (a trial of another)
    policy = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if setup != "bertforge" else ()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "BERTFORGE_THREADS", *policy)}
    processes = [subprocess.Popen([sys.executable, __file__, "--worker", setup, kind, str(warmup_s), str(window_s),
                                   str(start_at)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                 for _ in range(jobs)]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in processes]
    rates = [r["items_per_s"] for r in results]
    return {"jobs": jobs, "per_job": rates, "mean": sum(rates) / len(rates), "min": min(rates),
            "threads": sorted({t for r in results for t in r["threads"]})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the window (the policy settles)")
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--max-jobs", type=int, default=3)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--summarize", action="store_true")
    parser.add_argument("--no-save", action="store_true", help="print the table only (trying a setting)")
    args = parser.parse_args()
    if args.worker:
        setup, kind, warmup, window, start = args.worker
        print(json.dumps(worker(setup, kind, float(warmup), float(window), float(start))))
        return
    if args.summarize:
        payload = json.loads((ROOT / "benchmarks" / "results" / "shared_cpu.json").read_text())
    else:
        load_before = os.getloadavg()[0]
        rows: dict[str, Any] = {}
        for kind in args.kinds.split(","):
            for setup in args.setups.split(","):
                rows.setdefault(kind, {})[setup] = [scenario(setup, kind, jobs, args.warmup, args.window)
                                                    for jobs in range(1, args.max_jobs + 1)]
                print(kind, setup, [round(s["mean"], 1) for s in rows[kind][setup]], flush=True)
        payload = {"machine": machine(), "warmup_s": args.warmup, "window_s": args.window,
                   "load_before": round(load_before, 2), "results": rows}
        if args.no_save:
            print(render(payload))
            return
        save_results("shared_cpu", payload)
    text = render(payload)
    update_doc_section("shared-cpu", text)
    print(text)


def render(payload: dict[str, Any]) -> str:
    rows = []
    for kind, setups in payload["results"].items():
        unit = KINDS[kind][3]
        for setup, scenarios in setups.items():
            alone = scenarios[0]["mean"]
            cells = [kind, setup, f"{alone:.1f} {unit}/s"]
            for s in scenarios[1:]:
                if alone <= 0:  # nothing finished inside the window: no ratio to give
                    cells.append(f"{s['min']:.1f}")
                    continue
                share = s["min"] / alone * s["jobs"]  # the slowest job's figure against its fair share
                cells.append(f"{s['min']:.1f} ({share:.2f}x fair share)")
            cells.append(", ".join(str(t) for t in scenarios[-1]["threads"]))
            rows.append(cells)
    jobs = len(next(iter(next(iter(payload["results"].values())).values())))
    header = ["job", "setup", "alone"] + [f"beside {k} other{'s' if k > 1 else ''} (slowest job)" for k in range(1, jobs)]
    return "\n".join([
        "### Sharing the CPU: each job kind alone and beside copies of itself",
        "",
        f"`python benchmarks/shared_cpu.py --warmup {payload['warmup_s']:g} --window {payload['window_s']:g}`: "
        "1, 2 and 3 identical jobs started together, each job's throughput over the same "
        f"{payload['window_s']:g}-second window after a {payload['warmup_s']:g}-second warm-up; the fair share "
        "beside k others is 1/(k+1) of the figure alone (1.00x fair share = exactly that). transformers and "
        "bertforge-fixed run with torch's default threads and OpenMP's default waiting; 'bertforge' with its "
        "command line's policy (threads spin briefly and then sleep at barriers, thread count = the cores other processes leave "
        "idle). pretrain/finetune: BERT-mini steps on 32 x 128 tokens; predict: a MiniLM-sized encoder on "
        "32 x 128; serve: the same encoder on 1 x 64 requests. Last column: the thread counts the jobs ran "
        "at in the busiest scenario. Counts are whole batches inside the window, so a figure's resolution is "
        f"one batch per window (32 / {payload['window_s']:g} s = {32 / payload['window_s']:.1f} sequences/s for "
        "the batched kinds): the slow rows are coarse, the gaps between setups are not.",
        "",
        markdown_table(header + ["threads (busiest)"], rows),
        "",
        verdict(payload),
        "",
        machine_line(payload["machine"]) + f" Load average before the run: {payload['load_before']}.",
    ]) + "\n"


def verdict(payload: dict[str, Any]) -> str:
    """The targets: every bertforge job at least its fair share beside others, its quiet figure unchanged."""
    results = payload["results"]
    if not all({"bertforge", "bertforge-fixed"} <= set(setups) for setups in results.values()):
        return ""
    shares = {kind: min(s["min"] / setups["bertforge"][0]["mean"] * s["jobs"] for s in setups["bertforge"][1:])
              for kind, setups in results.items()}
    quiet = {kind: setups["bertforge"][0]["mean"] / setups["bertforge-fixed"][0]["mean"] - 1
             for kind, setups in results.items()}
    worst = min(shares, key=shares.get)
    fair = (f"every job kind got at least its fair share (lowest: {worst}, {shares[worst]:.2f}x)" if shares[worst] >= 1
            else f"{worst} got {shares[worst]:.2f}x its fair share (target 1.00x: missed)")
    changes = ", ".join(f"{kind} {100 * change:+.0f}%" for kind, change in quiet.items())
    return (f"**Targets.** With the thread policy {fair}. Alone, its figures against the same models with torch's "
            f"defaults: {changes} (one batch in the window is {100 * 32 / payload['window_s'] / 30:.0f}% of a "
            "30 sequences/s figure; serve counts single requests, so its change is finer than that).")


if __name__ == "__main__":
    main()
