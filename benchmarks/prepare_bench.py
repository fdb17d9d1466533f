"""Pre-training data preparation, side by side with the approach of transformers' `run_mlm.py` example.

    flock /work/bench.lock python benchmarks/prepare_bench.py [--data ../shared/data] [--base-mb 10]

Corpus: files of `pretrain_text` (the 19 Gutenberg novels, then WikiText-2 valid/test; in name order,
whole files, until `--base-mb` megabytes; 0 for all 25 MB), and the same twice over, written three ways: the text files; JSON lines compressed with gzip (one `.jsonl.gz` per source
file, a record per 100 lines); Parquet (one file per copy, a record per 100 lines, row groups of 256
records). A 30,522-piece WordPiece vocabulary is trained on the corpus first (not timed).

The two approaches do the same work: tokenize every line and pack the tokens into 128-token
sequences, unmasked (masking happens at training time), all of it written to disk:

* **bertforge**: `prepare(..., objective="none", masking="dynamic", dupe_factor=1)`, `workers` processes;
* **run_mlm approach** (written here after the example's recipe): `datasets.load_dataset` ("text",
  "json" or "parquet"), `map` with the fast tokenizer (`return_special_tokens_mask=True`, batched,
  `num_proc` workers), then `map(group_texts)` into 128-token blocks; a fresh cache directory each run.

Each run is its own process, timed from the outside (wall clock, start to exit), with
`TOKENIZERS_PARALLELISM=false` so one worker is one core. Peak memory is the peak of the summed RSS
of the run's process tree (the process and all its children), sampled every 0.2 s from /proc.
MB/s counts the text's bytes (uncompressed), the same for every format. Each setting runs at the
corpus size and at twice it (1 worker): bounded memory means the peak does not grow with the input.
Writes benchmarks/results/prepare.json and the `prepare` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

MAX_SEQ_LENGTH = 128
LINES_PER_RECORD = 100
ROWS_PER_GROUP = 256
FORMATS = ("text", "jsonl.gz", "parquet")
FLAT = 1.15  # "memory flat": the doubled input's peak within 15% of the single input's

OURS = """
import json, sys, warnings
from bertforge.data.prepare import prepare
warnings.simplefilter("ignore")
a = json.loads(sys.argv[1])
stats = prepare(a["inputs"], a["tokenizer"], a["out"], workers=a["workers"], objective="none", masking="dynamic",
                dupe_factor=1, validation_fraction=0.0, max_seq_length=a["length"], shard_mb=64, progress=False)
print(json.dumps({"sequences": stats["instances"], "tokens": stats["tokens"]}))
"""

# The recipe of transformers' examples/pytorch/language-modeling/run_mlm.py (line_by_line=False).
REFERENCE = """
import json, sys, warnings
from itertools import chain
warnings.simplefilter("ignore")
import datasets
from transformers import BertTokenizerFast
datasets.disable_progress_bars()
a = json.loads(sys.argv[1])
tokenizer = BertTokenizerFast.from_pretrained(a["tokenizer"])
builder = {"text": "text", "jsonl.gz": "json", "parquet": "parquet"}[a["format"]]
raw = datasets.load_dataset(builder, data_files=a["inputs"], split="train", cache_dir=a["cache"])
num_proc = a["workers"] if a["workers"] > 1 else None

def tokenize_function(examples):
    return tokenizer(examples["text"], return_special_tokens_mask=True)

tokenized = raw.map(tokenize_function, batched=True, num_proc=num_proc, remove_columns=raw.column_names)
block_size = a["length"]

def group_texts(examples):
    concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
    total_length = len(concatenated[list(examples.keys())[0]])
    total_length = (total_length // block_size) * block_size
    return {k: [t[i:i + block_size] for i in range(0, total_length, block_size)] for k, t in concatenated.items()}

grouped = tokenized.map(group_texts, batched=True, num_proc=num_proc)
print(json.dumps({"sequences": len(grouped), "tokens": len(grouped) * block_size}))
"""


# ---------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------


def records_of(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return ["\n".join(lines[i:i + LINES_PER_RECORD]) for i in range(0, len(lines), LINES_PER_RECORD)]


def write_inputs(sources: list[Path], copies: int, where: Path) -> dict[str, list[str]]:
    """The corpus `copies` times in each format; returns the files of each format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files: dict[str, list[str]] = {f: [] for f in FORMATS}
    for copy in range(copies):
        folder = where / f"copy{copy}"
        folder.mkdir(parents=True)
        rows = []
        for source in sources:
            text_file = folder / source.name
            shutil.copyfile(source, text_file)
            files["text"].append(str(text_file))
            records = records_of(source)
            rows.extend(records)
            jsonl = folder / f"{source.stem}.jsonl.gz"
            with gzip.open(jsonl, "wt", encoding="utf-8") as handle:
                handle.writelines(json.dumps({"text": r}) + "\n" for r in records)
            files["jsonl.gz"].append(str(jsonl))
        parquet = folder / "corpus.parquet"
        pq.write_table(pa.table({"text": rows}), parquet, row_group_size=ROWS_PER_GROUP)
        files["parquet"].append(str(parquet))
    return files


# ---------------------------------------------------------------------------------------------------
# one timed run in its own process, its tree's memory sampled from /proc
# ---------------------------------------------------------------------------------------------------


def tree_rss_bytes(root: int) -> int:
    """Summed resident memory of `root` and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    total, todo, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        todo.extend(children.get(pid, []))
    return total


def timed(code: str, spec: dict) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT / "src")}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    peak = 0
    while process.poll() is None:
        peak = max(peak, tree_rss_bytes(process.pid))
        time.sleep(0.2)
    wall = time.perf_counter() - started
    out, err = process.communicate()
    if process.returncode != 0:
        raise RuntimeError(err[-3000:])
    return {"wall_s": round(wall, 2), "peak_rss_mb": round(peak / 2**20, 1), **json.loads(out.strip().splitlines()[-1])}


def run(approach: str, fmt: str, files: list[str], workers: int, text_mb: float, tokenizer: Path, work: Path) -> dict:
    scratch = Path(tempfile.mkdtemp(dir=work))
    spec = {"inputs": files, "tokenizer": str(tokenizer), "workers": workers, "length": MAX_SEQ_LENGTH,
            "format": fmt, "out": str(scratch / "out"), "cache": str(scratch / "cache")}
    try:
        result = timed(OURS if approach == "bertforge" else REFERENCE, spec)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result.update(approach=approach, format=fmt, workers=workers, text_mb=round(text_mb, 2),
                  mb_per_s=round(text_mb / result["wall_s"], 3),
                  mb_per_s_per_worker=round(text_mb / result["wall_s"] / workers, 3))
    print(json.dumps(result), flush=True)
    return result


# ---------------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------------


def find(runs: list[dict], approach: str, fmt: str, workers: int, text_mb: float) -> dict:
    return next(r for r in runs if (r["approach"], r["format"], r["workers"]) == (approach, fmt, workers)
                and abs(r["text_mb"] - text_mb) < 1e-6)


NOISE = 0.05  # speed ratios within 5% of 1 are a tie on this shared machine


def verdicts(runs: list[dict], single: float, double: float, cores: int) -> dict:
    """Each target, met, tied or missed and by how much; the reference's memory growth alongside."""
    out: dict[str, dict] = {}
    for fmt in FORMATS:
        for workers in sorted({1, cores}):
            ours, theirs = find(runs, "bertforge", fmt, workers, single), find(runs, "run_mlm", fmt, workers, single)
            ratio = ours["mb_per_s"] / theirs["mb_per_s"]
            status = "met" if ratio > 1 + NOISE else "missed" if ratio < 1 - NOISE else "tie"
            out[f"faster per worker, {fmt}, {workers} worker(s)"] = {
                "ratio": round(ratio, 2), "met": ratio > 1.0, "status": status,
                "by": f"{ratio:.2f}x the run_mlm approach's MB/s per worker"
                      + (f"; within {NOISE:.0%} of it, a tie on this shared machine" if status == "tie" else "")}
        growth = {approach: find(runs, approach, fmt, 1, double)["peak_rss_mb"]
                  / find(runs, approach, fmt, 1, single)["peak_rss_mb"] for approach in ("bertforge", "run_mlm")}
        met = growth["bertforge"] <= FLAT
        out[f"memory flat as the input doubles, {fmt}"] = {
            "ratio": round(growth["bertforge"], 3), "met": met, "status": "met" if met else "missed",
            "by": f"bertforge's peak x{growth['bertforge']:.2f} for 2x the input (flat: at most x{FLAT}); "
                  f"the run_mlm approach's x{growth['run_mlm']:.2f}"}
    return out


def scaling_note(info: dict, cores: int) -> str:
    if max(info["load_start"], info["load_end"]) < cores:
        return ""
    return (f"With a load average of {max(info['load_start'], info['load_end'])} on {cores} cores, other work "
            "held the second core: this run cannot show scaling to all cores, only the speed per worker.")


def render(payload: dict) -> str:
    """The docs section from the saved results (benchmarks/results/prepare.json)."""
    info, runs, targets = payload["machine"], payload["runs"], payload["targets"]
    single, double = min(r["text_mb"] for r in runs), max(r["text_mb"] for r in runs)
    cores = max(r["workers"] for r in runs)
    # The section names the CPU's flags itself (a longer list than the machine line's): not twice.
    plain = {key: value for key, value in info.items() if key != "cpu_flags"}
    rows = []
    for fmt in FORMATS:
        for workers, size in [(1, single), *([(cores, single)] if cores > 1 else []), (1, double)]:
            ours, theirs = find(runs, "bertforge", fmt, workers, size), find(runs, "run_mlm", fmt, workers, size)
            rows.append([fmt, workers, f"{size:.1f}",
                         f"{ours['mb_per_s_per_worker']:.2f}", f"{theirs['mb_per_s_per_worker']:.2f}",
                         f"**{ours['mb_per_s'] / theirs['mb_per_s']:.2f}**",
                         f"{ours['peak_rss_mb']:.0f}", f"{theirs['peak_rss_mb']:.0f}"])
    table = markdown_table(["input", "workers", "text MB", "bertforge MB/s per worker",
                            "run_mlm approach MB/s per worker", "speed ratio", "bertforge peak RSS MB",
                            "run_mlm approach peak RSS MB"], rows)
    scaling = []
    for fmt in FORMATS:
        for approach in ("bertforge", "run_mlm"):
            one, many = find(runs, approach, fmt, 1, single), find(runs, approach, fmt, cores, single)
            scaling.append(f"{approach} {fmt} x{many['mb_per_s'] / one['mb_per_s']:.2f}")
    samples = "; ".join(
        f"{fmt}: " + ", then ".join(f"{find(runs, 'bertforge', fmt, 1, size)['mb_per_s'] / find(runs, 'run_mlm', fmt, 1, size)['mb_per_s']:.2f}x"
                                    for size in (single, double)) for fmt in FORMATS)
    target_lines = "\n".join(f"- {name}: **{t['status']}** ({t['by']})" for name, t in targets.items())
    return f"""## Pre-training data preparation (`bertforge prepare`)

`flock /work/bench.lock python benchmarks/prepare_bench.py`. {machine_line(plain)} CPU flags: {info['cpu_flags']}.
1-minute load average {info['load_start']} at the start and {info['load_end']} at the end of the run
(the machine is shared: timings are noisy, and both approaches ran interleaved in the same run).

Corpus: {len(info['sources'])} files of `shared/data/pretrain_text` ({', '.join(info['sources'])}; {single:.1f} MB)
as text files, as gzip-compressed JSON lines (one file per source, a record per 100 lines) and as
Parquet (row groups of 256 records), once and twice over (a second copy of each file). Both sides tokenize every line with the same
30,522-piece WordPiece vocabulary and pack the tokens into {payload['max_seq_length']}-token sequences, unmasked:
`prepare --objective none --masking dynamic --dupe-factor 1` against the recipe of transformers'
`run_mlm.py` example (`datasets.load_dataset`, `map` with the fast tokenizer and `num_proc` workers,
then `map(group_texts)`), written in the script. Each run is its own process, timed from outside;
one worker is one core (`TOKENIZERS_PARALLELISM=false`). MB/s counts uncompressed text bytes. Peak
RSS is the summed resident memory of the run's whole process tree (workers included; pages shared
between processes count once per process).

{table}

The rows at twice the input are a second sample of the same comparison at one worker: the spread
between samples ({samples}) is this machine's noise.

Scaling from 1 to {cores} workers (MB/s ratio): {', '.join(scaling)}. {scaling_note(info, cores)}

{target_lines}

A compressed file is one piece of work (a stream cannot be entered in the middle): a corpus in one
big `.gz` file prepares on one worker; split it into several files to use several.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--base-mb", type=float, default=10.0, help="Size of the smaller input (0: the whole corpus).")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--report-only", action="store_true",
                        help="Rewrite the docs section from benchmarks/results/prepare.json, running nothing.")
    args = parser.parse_args()
    if args.report_only:
        saved = json.loads((ROOT / "benchmarks" / "results" / "prepare.json").read_text())
        report(saved["machine"], saved["runs"], cores=max(r["workers"] for r in saved["runs"]))
        return

    from bertforge.tokenizer import BertTokenizer

    load_start = round(os.getloadavg()[0], 2)
    text = args.data / "pretrain_text"
    sources = sorted((text / "gutenberg").glob("*.txt")) + sorted((text / "wikitext-2").glob("*.txt"))
    if not sources:
        raise SystemExit(f"{text}: no Gutenberg or WikiText-2 files (give --data, the shared data directory)")
    if args.base_mb > 0:
        sizes = [p.stat().st_size / 1e6 for p in sources]
        keep = next((k + 1 for k in range(len(sources)) if sum(sizes[:k + 1]) >= args.base_mb), len(sources))
        sources = sources[:keep]
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        tokenizer = work / "tokenizer"
        BertTokenizer.train(sources, vocab_size=args.vocab_size, show_progress=False).save_pretrained(tokenizer)
        single_mb = sum(p.stat().st_size for p in sources) / 1e6
        small = write_inputs(sources, 1, work / "single")
        large = write_inputs(sources, 2, work / "double")
        runs = []
        for fmt in FORMATS:
            for approach in ("bertforge", "run_mlm"):
                for workers in sorted({1, cores}):
                    runs.append(run(approach, fmt, small[fmt], workers, single_mb, tokenizer, work))
                runs.append(run(approach, fmt, large[fmt], 1, 2 * single_mb, tokenizer, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    info = machine()
    flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), [])
    info["cpu_flags"] = " ".join(f for f in flags if f.startswith(("avx", "amx", "sse4")) or f in ("fma", "f16c"))
    info["load_start"], info["load_end"] = load_start, round(os.getloadavg()[0], 2)
    info["sources"] = [p.name for p in sources]
    report(info, runs, cores)


def report(info: dict, runs: list[dict], cores: int) -> None:
    """Targets from the runs, benchmarks/results/prepare.json and the docs section."""
    single = min(r["text_mb"] for r in runs)
    double = max(r["text_mb"] for r in runs)
    targets = verdicts(runs, single, double, cores)
    payload = {"machine": info, "max_seq_length": MAX_SEQ_LENGTH, "runs": runs, "targets": targets}
    save_results("prepare", payload)
    update_doc_section("prepare", render(payload))
    for name, target in targets.items():
        print(f"{name}: {target['status']} ({target['by']})")


if __name__ == "__main__":
    main()
