"""Pre-training data preparation: MB/s, documents/s and peak memory for 1 and 2 workers, and for twice the input.

    python benchmarks/prepare_bench.py [--data ../shared/data] [--vocab-size 30522]

Corpus: all of `pretrain_text` (the Gutenberg novels, headers stripped, and WikiText-2 valid/test),
plain text, static masking with the paper's dupe_factor 10, max_seq_length 128. A tokenizer is trained
on the corpus first (not timed). Each run is its own process, so its peak RSS is its own; with workers,
the figure is the largest single process (main or worker), read inside that run (RUSAGE_SELF/CHILDREN). The "doubled"
run reads every file twice (a second copy under another name) with one worker: bounded memory means
its peak RSS stays where the single copy's is. Writes benchmarks/results/prepare.json and the
`prepare` section of docs/benchmarks.md. No transformers here: it has no counterpart of this step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

RUN = """
import json, resource, sys, warnings
from bertforge.data.prepare import prepare
warnings.simplefilter("ignore")
args = json.loads(sys.argv[1])
stats = prepare(args["inputs"], args["tokenizer"], args["out"], workers=args["workers"], plain_text=True,
                strip_gutenberg=args["strip"], max_seq_length=128, dupe_factor=10, progress=False)
peak_kb = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
facts = {k: stats[k] for k in ("documents", "instances", "validation_instances", "tokens", "bytes")}
print(json.dumps(facts | {"peak_rss_mb": peak_kb / 1024}))
"""


def run_prepare(inputs: list[str], tokenizer: Path, out: Path, workers: int, strip: bool) -> dict:
    started = time.perf_counter()
    spec = {"inputs": inputs, "tokenizer": str(tokenizer), "out": str(out), "workers": workers, "strip": strip}
    done = subprocess.run([sys.executable, "-c", RUN, json.dumps(spec)], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    megabytes = sum(Path(p).stat().st_size for p in inputs) / 1e6
    return {"workers": workers, "input_mb": megabytes, "wall_s": wall, "mb_per_s": megabytes / wall,
            "docs_per_s": stats["documents"] / wall, **stats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--vocab-size", type=int, default=30522)
    args = parser.parse_args()

    from bertforge.tokenizer import BertTokenizer

    text = args.data / "pretrain_text"
    books = sorted((text / "gutenberg").glob("*.txt"))
    wiki = sorted((text / "wikitext-2").glob("*.txt"))
    work = Path(tempfile.mkdtemp(prefix="prepare-bench-"))
    try:
        tokenizer = work / "tokenizer"
        BertTokenizer.train(books + wiki, vocab_size=args.vocab_size, show_progress=False).save_pretrained(tokenizer)
        corpus = [str(p) for p in books + wiki]
        doubled_dir = work / "second-copy"
        doubled_dir.mkdir()
        copies = [str(shutil.copy(p, doubled_dir / f"copy-{Path(p).name}")) for p in corpus]
        # Gutenberg stripping applies to the books; WikiText has no header, which prepare warns about and keeps.
        runs = [run_prepare(corpus, tokenizer, work / "w1", 1, True),
                run_prepare(corpus, tokenizer, work / "w2", 2, True),
                run_prepare(corpus + copies, tokenizer, work / "double", 1, True)]
    finally:
        shutil.rmtree(work, ignore_errors=True)

    info = machine()
    save_results("prepare", {"machine": info, "runs": runs})
    labels = ["1 worker", "2 workers", "1 worker, input doubled"]
    rows = [[label, f"{r['input_mb']:.1f}", f"{r['wall_s']:.1f}", f"**{r['mb_per_s']:.2f}**", f"{r['docs_per_s']:.1f}",
             f"{r['instances']:,}", f"{r['peak_rss_mb']:.0f}"] for label, r in zip(labels, runs, strict=True)]
    table = markdown_table(["run", "input MB", "wall s", "MB/s", "docs/s", "instances", "peak RSS MB (largest process)"], rows)
    update_doc_section("prepare", f"""## Pre-training data preparation (`bertforge prepare`)

`python benchmarks/prepare_bench.py`. {machine_line(info)} Corpus: all of `shared/data/pretrain_text`
(19 Gutenberg novels, headers stripped, and WikiText-2 valid/test), plain text, max_seq_length 128,
static masking with dupe_factor 10, a {args.vocab_size}-token vocabulary trained on the same text.
Peak RSS is that of the largest single process (bounded memory: the doubled input must not raise it).
No `transformers` column: it has no counterpart of this step (google-research/bert's script holds the
whole corpus in memory, single process).

{table}
""")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
