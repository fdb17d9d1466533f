"""Where inference time goes: torch.profiler top operators, bertforge vs transformers, same batches.

    python benchmarks/profile_inference.py [--workload mrpc] [--batches 6] [--threads 1]

Runs the speed benchmark's inference workload (dev set tokenised, batch 32, file order, per-batch
padding; see benchmarks/speed.py) through both libraries' BertModel on all-MiniLM-L6-v2 under
`torch.profiler`, after one warm-up batch, and groups self CPU time by operator. The table goes to
the `profile-<workload>` section of docs/benchmarks.md and the raw numbers to
benchmarks/results/profile_<workload>.json. It explains a speed ratio; it is not a timing benchmark
(the profiler adds overhead to every operator).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402
from speed import load_model, make_batches, minilm_dir, prepare_inputs  # noqa: E402

TOP = 10  # operators shown per library
SAVED_OPS = 40  # operators kept per library in the results file, which the section is rendered from


def profile(library: str, batches: list[dict[str, Any]]) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    model = load_model(library, "inference", minilm_dir()).eval()
    with torch.inference_mode():
        model(**batches[0])  # warm-up: oneDNN primitive creation, allocator
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for batch in batches[1:]:
                model(**batch)
    ops = []
    for event in prof.key_averages():
        ops.append({"op": event.key, "self_ms": event.self_cpu_time_total / 1000.0, "calls": event.count})
    ops.sort(key=lambda o: -o["self_ms"])
    total = sum(o["self_ms"] for o in ops)
    return {"total_ms": total, "ops": ops}


def render(workload: str, payload: dict[str, Any], top: int = TOP) -> str:
    """The docs section from the saved results: the figures and the machine they were measured on."""
    results, padding = payload["results"], payload["padding"]
    names = []
    for library in ("transformers", "bertforge"):
        for op in results[library]["ops"][:top]:
            if op["op"] not in names:
                names.append(op["op"])
    by_name = {lib: {o["op"]: o for o in results[lib]["ops"]} for lib in results}
    rows = []
    for name in names:
        cells = []
        for library in ("transformers", "bertforge"):
            op = by_name[library].get(name)
            cells.append(f"{op['self_ms']:.0f} ({100 * op['self_ms'] / results[library]['total_ms']:.0f}%)"
                         if op else "-")
        rows.append([f"`{name}`", *cells])
    rows.append(["**all operators**", f"{results['transformers']['total_ms']:.0f}",
                 f"{results['bertforge']['total_ms']:.0f}"])
    return "\n".join([
        f"### Profile: {workload.upper()} dev inference, all-MiniLM-L6-v2",
        "",
        f"`python benchmarks/profile_inference.py --workload {workload}`: self CPU milliseconds per operator "
        f"over {padding['batches']} batches of 32 in file order ({padding['real_tokens']} real tokens, "
        f"{padding['padded_tokens']} with padding: {100 * padding['fraction']:.0f}% padding), after a warm-up "
        "batch. Profiler overhead inflates small operators; read the shares, not the totals.",
        "",
        markdown_table(["operator", "transformers ms (share)", "bertforge ms (share)"], rows),
        "",
        machine_line(payload["machine"]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--workload", choices=["sst2", "mrpc"], default="mrpc")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=TOP)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    examples = json.loads(prepare_inputs(args.data).read_text())[args.workload]
    batches = make_batches(examples, bucket=False, limit=32 * (args.batches + 1))
    real = sum(int(b["attention_mask"].sum()) for b in batches[1:])
    padded = sum(b["attention_mask"].numel() for b in batches[1:])
    padding = {"batches": len(batches) - 1, "real_tokens": real, "padded_tokens": padded,
               "fraction": 1 - real / padded}
    results = {library: profile(library, batches) for library in ("transformers", "bertforge")}
    payload = {"machine": machine(), "padding": padding,
               "results": {k: {"total_ms": v["total_ms"], "ops": v["ops"][:SAVED_OPS]} for k, v in results.items()}}
    save_results(f"profile_{args.workload}", payload)
    text = render(args.workload, payload, args.top)
    update_doc_section(f"profile-{args.workload}", text)
    print(text)


if __name__ == "__main__":
    main()
