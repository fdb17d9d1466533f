"""Pre-training step throughput and memory: bertforge vs transformers.BertForPreTraining, in one run.

    python benchmarks/pretrain_bench.py [--presets mini,base] [--seq 128] [--batch N] [--dtype fp32|bf16]
                                        [--steps 3] [--rounds 3] [--threads 2] [--device auto|cpu|cuda]

One step is what pre-training does: forward with masked-LM and next-sentence labels (loss = MLM + NSP),
backward, AdamW step. Both libraries get the same architecture (a bertforge preset, vocabulary 30,522;
the same config in transformers, SDPA attention), the same batches (full-length sequences, exactly
15% of the positions labelled per row, random NSP labels) and the same dtype: fp32, or bf16 autocast
over fp32 weights (mixed precision, as `bertforge pretrain --precision bf16` trains). Weights are
random (seeded): throughput does not depend on their values.

Every measurement runs in a fresh process: a warm-up step, then `--steps` timed steps. The libraries
alternate over `--rounds` rounds (the order flips every round), so load on the machine affects both,
and the median of the rounds is reported.

Memory. On CPU: the growth of the process's peak resident set during the steps, over its resident set
just before them (the model, its batches and the imports). The kernel's high-water mark is reset just
before the warm-up step (writing 5 to /proc/self/clear_refs), so `ru_maxrss` afterwards is the peak
of the steps alone; it covers gradients, AdamW's two moments, activations and whatever the allocator
keeps. Where the reset is refused, the growth of `ru_maxrss` is reported instead (a lower bound, since
an earlier peak may hide it) and the method says so. On GPU: `torch.cuda.max_memory_allocated` over the
steps, which includes weights, gradients and optimizer state.

On GPU with bf16 the model FLOP utilisation is reported too: MFU = achieved model FLOP/s / the GPU's
dense bf16 peak, with model FLOPs per token = 6 x non-embedding parameters + 12 x layers x sequence
length x hidden size (attention scores and their weighted sum, forward and backward). The tied MLM
decoder counts as embedding and is left out, so this MFU is conservative, and the same for both.

Results go to benchmarks/results/pretrain_bench.json and the `pretrain-bench` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

FRAMEWORKS = ("transformers", "bertforge")
DEFAULT_BATCH = {"tiny": 32, "mini": 32, "small": 32, "medium": 16, "base": 8, "large": 4}
MASKED_FRACTION = 0.15
VOCAB = 30522
# Dense (no sparsity) bf16 tensor-core peaks from the vendor's data sheets, FLOP/s. Matched in order
# against torch.cuda.get_device_name(): the PCIe H100 is slower than the SXM one.
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12))


# ------------------------------------------------------------------------------------------------
# one measurement, in a fresh process
# ------------------------------------------------------------------------------------------------
def bertforge_config(preset: str) -> Any:
    from bertforge import BertConfig

    return BertConfig.from_preset(preset, vocab_size=VOCAB)


def build_model(framework: str, preset: str) -> Any:
    config = bertforge_config(preset)
    if framework == "bertforge":
        from bertforge import BertForPreTraining

        return BertForPreTraining(config)
    import transformers

    fields = {k: v for k, v in config.to_dict().items() if k != "model_type"}
    return transformers.BertForPreTraining(transformers.BertConfig(**fields, attn_implementation="sdpa"))


def make_batches(count: int, batch: int, seq: int, device: Any) -> list[dict[str, Any]]:
    """Full-length pairs with exactly 15% of each row's positions labelled (as prepare's masking does)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    masked = max(1, round(MASKED_FRACTION * seq))
    out = []
    for _ in range(count):
        ids = torch.randint(1000, VOCAB, (batch, seq), generator=gen)
        picked = torch.rand(batch, seq, generator=gen).argsort(dim=1)[:, :masked]
        labels = torch.full_like(ids, -100).scatter(1, picked, ids.gather(1, picked))
        cpu = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
               "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous(),
               "labels": labels, "next_sentence_label": torch.randint(0, 2, (batch,), generator=gen)}
        out.append({k: v.to(device) for k, v in cpu.items()})
    return out


class PeakMemory:
    """Peak memory of the steps: CUDA's allocator counter, or the process's resident set on CPU."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.method = "cuda.max_memory_allocated"

    def start(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            return
        self.before_kb = _current_rss_kb()
        try:
            with open("/proc/self/clear_refs", "w") as handle:  # reset the high-water mark (Linux)
                handle.write("5")
            self.method = "peak RSS growth (high-water mark reset before the steps)"
        except OSError:
            self.before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.method = "ru_maxrss growth (no reset: a lower bound)"

    def result_mb(self) -> dict[str, float]:
        import torch

        if self.device.type == "cuda":
            return {"peak_mb": torch.cuda.max_memory_allocated() / 2**20}
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
        return {"step_mb": (peak_kb - self.before_kb) / 1024, "peak_rss_mb": peak_kb / 1024}


def _current_rss_kb() -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    torch.manual_seed(0)
    model = build_model(spec["framework"], spec["preset"]).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if spec.get("compile"):
        model = torch.compile(model)  # both libraries alike; the warm-up step pays the compilation
    batches = make_batches(spec["steps"] + 1, spec["batch"], spec["seq"], device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=spec["dtype"] == "bf16")

    def step(batch: dict[str, Any]) -> float:
        with autocast:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()  # also waits for the GPU

    memory = PeakMemory(device)
    memory.start()
    step(batches[0])  # warm-up: allocator, kernels, AdamW's state
    start = time.perf_counter()
    losses = [step(batch) for batch in batches[1:]]
    seconds = time.perf_counter() - start
    tokens = spec["steps"] * spec["batch"] * spec["seq"]
    return {"seconds": seconds, "tokens_per_s": tokens / seconds, "step_s": seconds / spec["steps"],
            "loss": statistics.fmean(losses), "parameters": sum(p.numel() for p in model.parameters()),
            "memory_method": memory.method, **memory.result_mb()}


# ------------------------------------------------------------------------------------------------
# the parent: alternate the libraries over rounds, take medians, write the table
# ------------------------------------------------------------------------------------------------
def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                          text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed for {spec}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def model_flops_per_token(preset: str, seq: int) -> float:
    """6 x non-embedding parameters + 12 x layers x sequence x hidden (attention), forward and backward."""
    import torch

    from bertforge import BertForPreTraining

    config = bertforge_config(preset)
    with torch.device("meta"):  # shapes only, no memory
        model = BertForPreTraining(config)
    non_embedding = sum(p.numel() for name, p in model.named_parameters() if ".embeddings." not in f".{name}")
    return 6 * non_embedding + 12 * config.num_hidden_layers * seq * config.hidden_size


def decoder_shares(preset: str, seq: int) -> dict[str, float]:
    """The vocabulary projection's share of each library's step FLOPs (every position vs the 15% labelled)."""
    config = bertforge_config(preset)
    decoder = 6 * config.hidden_size * config.vocab_size  # per projected position, forward and backward
    rest = model_flops_per_token(preset, seq)
    shares = {"transformers": decoder / (rest + decoder)}
    shares["bertforge"] = MASKED_FRACTION * decoder / (rest + MASKED_FRACTION * decoder)
    shares["flop_ratio"] = (rest + decoder) / (rest + MASKED_FRACTION * decoder)
    return shares


def result_name(gpu: bool, compiled: bool) -> str:
    """The JSON file's stem; with "_" as "-", the docs section's name (CPU, GPU and compiled kept apart)."""
    return "pretrain_bench" + ("_gpu" if gpu else "") + ("_compiled" if compiled else "")


def peak_bf16(device_name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16 if key in device_name), None)


def benchmark(preset: str, seq: int, batch: int | None, args: argparse.Namespace, device: str) -> dict[str, Any]:
    batch = batch or DEFAULT_BATCH.get(preset, 8)
    spec = {"preset": preset, "seq": seq, "batch": batch, "dtype": args.dtype, "steps": args.steps,
            "threads": args.threads, "device": device, "compile": args.compile}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in FRAMEWORKS}
    for round_number in range(args.rounds):
        order = FRAMEWORKS if round_number % 2 == 0 else FRAMEWORKS[::-1]
        for framework in order:
            runs[framework].append(run_worker({**spec, "framework": framework}))
            last = runs[framework][-1]
            print(f"{preset} seq {seq} round {round_number + 1} {framework}: {last['tokens_per_s']:.0f} tok/s",
                  flush=True)
    median = {name: {key: statistics.median(r[key] for r in rs) for key, value in rs[0].items()
                     if isinstance(value, (int, float))} for name, rs in runs.items()}
    result = {"settings": spec, "median": median, "runs": runs,
              "speedup": median["bertforge"]["tokens_per_s"] / median["transformers"]["tokens_per_s"],
              # each round's two runs are neighbours in time, so their ratio shows how much load moved things
              "round_speedups": [ours["tokens_per_s"] / theirs["tokens_per_s"]
                                 for ours, theirs in zip(runs["bertforge"], runs["transformers"], strict=True)],
              "decoder_flop_share": decoder_shares(preset, seq)}
    if device.startswith("cuda") and args.dtype == "bf16":
        import torch

        peak = peak_bf16(torch.cuda.get_device_name(0))
        flops = model_flops_per_token(preset, seq)
        result["model_flops_per_token"] = flops
        result["peak_flops"] = peak
        for name in FRAMEWORKS:
            median[name]["mfu"] = median[name]["tokens_per_s"] * flops / peak if peak else None
    return result


def table(results: list[dict[str, Any]], gpu: bool) -> str:
    header = ["preset", "seq x batch", "dtype", "transformers tok/s", "bertforge tok/s", "speed-up", "per round"]
    header += ["peak allocated MB (HF / ours)"] if gpu else ["step memory MB (HF / ours)", "peak RSS MB (HF / ours)"]
    if gpu:
        header += ["MFU (HF / ours)"]
    rows = []
    for result in results:
        s, hf, ours = result["settings"], result["median"]["transformers"], result["median"]["bertforge"]
        row = [s["preset"], f"{s['seq']} x {s['batch']}", s["dtype"], f"{hf['tokens_per_s']:,.0f}",
               f"{ours['tokens_per_s']:,.0f}", f"**{result['speedup']:.2f}x**",
               ", ".join(f"{x:.2f}x" for x in result["round_speedups"])]
        if gpu:
            row.append(f"{hf['peak_mb']:,.0f} / {ours['peak_mb']:,.0f}")
            mfu = (hf.get("mfu"), ours.get("mfu"))
            row.append(f"{mfu[0]:.1%} / {mfu[1]:.1%}" if None not in mfu else "n/a (fp32 or unknown GPU)")
        else:
            row += [f"{hf['step_mb']:,.0f} / {ours['step_mb']:,.0f}",
                    f"{hf['peak_rss_mb']:,.0f} / {ours['peak_rss_mb']:,.0f}"]
        rows.append(row)
    return markdown_table(header, rows)


def load_sentence(gpu: bool, load_before: float) -> str:
    if gpu:
        return "Nothing else ran on the GPU; the libraries alternate, so the ratio is the figure to read."
    return (f"The 1-minute load average was {load_before} when the run started: other work shared the machine, "
            "so\nabsolute rates are low and noisy; the libraries alternate, so the ratio is the figure to read.")


def targets(results: list[dict[str, Any]]) -> str:
    """The GPU targets, each met or missed by how much: 2x transformers' tokens/s and 50% MFU."""
    lines = []
    for result in results:
        s, ours = result["settings"], result["median"]["bertforge"]
        speed = "met" if result["speedup"] >= 2 else f"missed by {2 - result['speedup']:.2f}x"
        mfu = ours.get("mfu")
        mfu_text = ("n/a" if mfu is None else "met" if mfu >= 0.5 else f"missed by {100 * (0.5 - mfu):.1f} points")
        lines.append(f"{s['preset']} at {s['seq']}: >= 2x transformers {speed} ({result['speedup']:.2f}x); "
                     f"MFU >= 50% {mfu_text} ({'?' if mfu is None else f'{mfu:.1%}'})")
    return "Targets: " + "; ".join(lines) + "."


def write_doc(results: list[dict[str, Any]], info: dict[str, Any], args: argparse.Namespace, gpu: bool,
              load_before: float) -> None:
    text = render(results, info, args, gpu, load_before)
    update_doc_section(result_name(gpu, args.compile).replace("_", "-"), text)


def render(results: list[dict[str, Any]], info: dict[str, Any], args: argparse.Namespace, gpu: bool,
           load_before: float) -> str:
    if gpu:
        memory = ("Peak allocated: `torch.cuda.max_memory_allocated` over the steps (weights, gradients, AdamW "
                  "state and activations).")
        mfu = ("MFU = achieved model FLOP/s / the GPU's dense bf16 peak (H100 SXM and H200 989e12, A100 312e12), "
               "with 6 x non-embedding parameters + 12 x layers x seq x hidden FLOPs per token; the tied MLM "
               "decoder is not counted, so MFU is conservative.")
    else:
        method = results[0]["runs"]["bertforge"][0]["memory_method"]
        memory = (f"Step memory: {method}, in a fresh process per measurement: what gradients, AdamW's moments, "
                  "activations and the allocator add to the model and its batches. Peak RSS is the whole "
                  "process (Python, torch, the library, the model, the batches).")
        mfu = ("On a GPU the script reports peak allocated memory and MFU instead (bf16 by default); that "
               "has not been run for this table.")
    shares = "; ".join(
        f"{r['settings']['preset']}: the projection is {r['decoder_flop_share']['transformers']:.0%} of "
        f"transformers' step and {r['decoder_flop_share']['bertforge']:.0%} of bertforge's, "
        f"{r['decoder_flop_share']['flop_ratio']:.2f}x fewer FLOPs in all" for r in results)
    autocast = " (autocast over fp32 weights)" if args.dtype == "bf16" else ""
    steps = f"{args.steps} timed step{'s' if args.steps != 1 else ''}"
    where = (" on a GPU" if gpu else "") + (", both compiled" if args.compile else "")
    return f"""## Pre-training step{where}: bertforge vs transformers.BertForPreTraining

`python benchmarks/pretrain_bench.py --presets {",".join(args.presets)} --seq {args.seq} \
{f"--batch {args.batch} " if args.batch else ""}--dtype {args.dtype} --steps {args.steps} --rounds {args.rounds} \
--threads {args.threads}{" --compile" if args.compile else ""}`

{machine_line(info)}
{load_sentence(gpu, load_before)}

One step: forward with MLM + NSP labels, backward, AdamW.
Same config (bertforge preset, vocabulary 30,522, SDPA attention in transformers), same batches
(full-length pairs, exactly 15% of each row's positions labelled), random weights, {args.dtype}{autocast}.
Median of {args.rounds} alternating rounds, each a fresh process with one warm-up step and {steps};
"speed-up" is the ratio of the medians, "per round" the ratio within each round.
{memory}
{mfu}
bertforge projects onto the vocabulary only the labelled 15% of positions; transformers projects every
position. By FLOP count: {shares}.

{table(results, gpu)}
{targets(results) if gpu else ""}
"""


def render_saved(path: Path) -> None:
    """The docs section again from a results file (e.g. one a GPU machine wrote), with its own settings."""
    name, text = saved_section(json.loads(path.read_text()))
    update_doc_section(name, text)


def saved_section(payload: dict[str, Any]) -> tuple[str, str]:
    """The docs section's name and text from a saved results payload, the run's settings read from it."""
    results = payload["results"]
    first = results[0]["settings"]
    args = argparse.Namespace(presets=sorted({r["settings"]["preset"] for r in results}),
                              seq=",".join(str(r["settings"]["seq"]) for r in results),
                              batch=",".join(str(r["settings"]["batch"]) for r in results),
                              dtype=first["dtype"], steps=first["steps"], threads=first["threads"],
                              rounds=len(results[0]["runs"]["bertforge"]), compile=bool(first.get("compile")))
    gpu = first["device"].startswith("cuda")
    text = render(results, payload["machine"], args, gpu, payload.get("load_average_1min_at_start", 0.0))
    return result_name(gpu, args.compile).replace("_", "-"), text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="mini,base", help="bertforge presets, comma-separated")
    parser.add_argument("--seq", default="128", help="sequence lengths, comma-separated (e.g. 128,512)")
    parser.add_argument("--batch", default=None,
                        help="batch size per sequence length, comma-separated (default: 32 for mini, 8 for base)")
    parser.add_argument("--compile", action="store_true", help="torch.compile both libraries' models")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="default: bf16 on GPU, fp32 on CPU")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per measurement (after one warm-up)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu or cuda")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--render", type=Path, help="rewrite the docs section from a saved results JSON and stop")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return
    if args.render:
        render_saved(args.render)
        return

    import torch

    torch.set_num_threads(args.threads)  # what machine() records
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    gpu = device.startswith("cuda")
    args.dtype = args.dtype or ("bf16" if gpu else "fp32")
    args.presets = args.presets.split(",")
    seqs = [int(seq) for seq in args.seq.split(",")]
    batches = [int(b) for b in args.batch.split(",")] if args.batch else [None] * len(seqs)
    if len(batches) != len(seqs):
        parser.error("--batch needs one size per --seq length")
    load_before = round(os.getloadavg()[0], 2)
    results = [benchmark(preset, seq, batch, args, device) for preset in args.presets
               for seq, batch in zip(seqs, batches, strict=True)]
    info = machine()
    # CPU and GPU figures are kept apart: a GPU run does not replace the CPU table, nor the other way
    save_results(result_name(gpu, args.compile),
                 {"machine": info, "load_average_1min_at_start": load_before, "results": results})
    write_doc(results, info, args, gpu, load_before)
    for result in results:
        settings = result["settings"]
        print(f"{settings['preset']} seq {settings['seq']}: bertforge {result['speedup']:.2f}x transformers", flush=True)


if __name__ == "__main__":
    main()
