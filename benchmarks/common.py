"""Shared by the benchmark scripts: the machine description, result files, and docs/benchmarks.md sections.

Each script owns one section of docs/benchmarks.md between `<!-- name -->` and `<!-- /name -->`
markers and rewrites only that section, so scripts can be rerun independently.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
DOC_HEADER = """# Benchmarks

Every figure is measured by a script in `benchmarks/`, bertforge side by side with Hugging Face
`transformers` on the same weights, inputs and machine in one run, and given as a ratio. Rerun a
script to refresh its section; raw results are in `benchmarks/results/`.
"""


def machine() -> dict[str, Any]:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {
        "date": dt.date.today().isoformat(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "cpu_flags": _cpu_flags(),
        # Other work on the machine skews timings (on 2 cores, badly): say how busy it was.
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    if torch.cuda.is_available():
        info.update(_gpu())
    return info


def _gpu() -> dict[str, Any]:
    """The GPU, its memory, driver and CUDA versions: what a GPU figure is named with."""
    import subprocess

    import torch

    properties = torch.cuda.get_device_properties(0)
    found = {"device": torch.cuda.get_device_name(0), "gpu_memory_gib": round(properties.total_memory / 2**30, 1),
             "cuda": torch.version.cuda, "driver": "?"}
    try:
        query = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
        found["driver"] = query.stdout.strip().splitlines()[0] if query.returncode == 0 else "?"
    except (OSError, IndexError, subprocess.TimeoutExpired):
        pass
    return found


def _cpu_flags() -> str:
    """The CPU's flags that decide the fast paths (bf16, int8): named beside every figure."""
    from bertforge.precision import RELEVANT_FLAGS, cpu_flags

    flags = [flag for flag in RELEVANT_FLAGS if flag in cpu_flags()]
    vector = [flag for flag in flags if flag.startswith(("avx512", "amx", "avx_vnni"))]
    return ", ".join(flags) if vector else "AVX2 only" if "avx2" in flags else "no AVX2"


def machine_line(info: dict[str, Any]) -> str:
    flags = f" ({info['cpu_flags']})" if info.get("cpu_flags") else ""
    gpu = (f" ({info['gpu_memory_gib']} GiB, driver {info['driver']}, CUDA {info['cuda']})"
           if info.get("cuda") else "")
    # Results saved before the load was recorded re-render as they were first written, without a "?".
    load = (f"; 1-minute load average {info['load_average_1min']} when the run ended"
            if "load_average_1min" in info else "")
    return (f"Machine: {info['cpu']}{flags}, {info['cores']} cores, torch threads {info['torch_threads']}, "
            f"device {info['device']}{gpu}; torch {info['torch']}, transformers {info['transformers']}; {info['date']}"
            f"{load}.")


def save_results(name: str, payload: dict[str, Any], results: Path = RESULTS) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# docs/benchmarks.md and its topic pages; a benchmark's section lives on one of them
BENCHMARK_PAGES = (DOC, ROOT / "docs" / "benchmarks-engines.md", ROOT / "docs" / "benchmarks-training.md")


def page_holding(name: str, pages: tuple[Path, ...]) -> Path:
    """The first of `pages` that holds section `name` (its <!-- name --> marker), else the first page."""
    for page in pages:
        if page.is_file() and f"<!-- {name} -->" in page.read_text(encoding="utf-8"):
            return page
    return pages[0]


def update_doc_section(name: str, body: str, doc: Path | None = None, header: str = DOC_HEADER) -> None:
    """Replace (or append) the section between <!-- name --> and <!-- /name --> in `doc`: by default the
    benchmarks page that holds it (docs/benchmarks.md for a new section)."""
    doc = page_holding(name, BENCHMARK_PAGES) if doc is None else doc
    text = doc.read_text() if doc.exists() else header
    block = f"<!-- {name} -->\n{body.strip()}\n<!-- /{name} -->"
    pattern = re.compile(rf"<!-- {re.escape(name)} -->.*?<!-- /{re.escape(name)} -->", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
