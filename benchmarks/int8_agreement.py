"""What int8 costs on the labels of a fine-tuned classifier, beside what it gains in speed.

    python benchmarks/int8_agreement.py --model runs/sst2-minilm/seed-1 [--rounds 5] [--threads 1]
    python benchmarks/int8_agreement.py --render   # the section again from the saved results

The model is a classifier fine-tuned by `bertforge finetune classify` whose task.json names its dev
file (SST-2 dev: 872 sentences); every variant runs the whole dev file in batches of 32 (file order,
padded to each batch's longest, cut at the model's max length), and int8 is compared with the fp32
of the same runtime (`bertforge.quantization_report`: label agreement, flips, the largest probability
change, accuracy before and after):

- torch fp32; torch int8 as bertforge made it before (every encoder Linear, activations per token) and
  as it does now (the feed-forward output projections, whose GELU inputs carry the outliers, kept fp32);
- ONNX Runtime fp32 (the engine's fused graph), ONNX Runtime int8 as bertforge quantized it before
  (every quantizable op, the pooler and head included) and as it does now (pooler and head fp32).

Speed: each round runs every variant once over the dev file, the order reversed every other round;
the median over rounds is reported, as sequences per second. This compares int8 with fp32 of our
own engines (and ONNX Runtime's int8 of the same model), not with transformers: the question is what
quantization costs, and both sides of each comparison run the same code but for it.
Results: benchmarks/results/int8_agreement.json and the `int8-agreement` section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, machine_line, markdown_table, save_results, update_doc_section  # noqa: E402

BATCH = 32


def torch_int8(model: Any, ffn_output: bool) -> Any:
    """bertforge's torchao recipe on a copy of `model`; `ffn_output` quantizes the feed-forward output
    projections too (the recipe before they stayed fp32)."""
    from bertforge.precision import _quantize_int8

    quantized = copy.deepcopy(model)
    _quantize_int8(quantized, ffn_output=ffn_output)
    return quantized


def rerender() -> None:
    """Write the section again from the saved results (after a change to `render`)."""
    import json

    from common import RESULTS

    update_doc_section("int8-agreement", render(json.loads((RESULTS / "int8_agreement.json").read_text())))


def main() -> None:
    if sys.argv[1:] == ["--render"]:
        rerender()
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a fine-tuned classifier directory with a dev file in task.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bertforge import quantization_report as qr
    from bertforge.engine import OnnxEngine, _session
    from bertforge.export import quantize_onnx_int8
    from bertforge.finetuned import TaskRecord, load_for_inference
    from bertforge.model.base import label_names_of

    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    loaded = load_for_inference(args.model, "fp32")
    model, tokenizer, record = loaded.model, loaded.tokenizer, TaskRecord.read(args.model)
    max_length = record.max_length if record and record.max_length else 128
    sample = qr.sample_for(args.model)
    batches = qr.encode_batches(tokenizer, sample, max_length, BATCH)
    compared = qr.compared_output(model)
    variants: dict[str, Any] = {"transformers fp32": transformers_runner(args.model),
                                "torch fp32": qr.torch_runner(model, compared),
                                "torch int8, before": qr.torch_runner(torch_int8(model, True), compared),
                                "torch int8, now": qr.torch_runner(torch_int8(model, False), compared)}
    with tempfile.TemporaryDirectory() as work:
        engine = OnnxEngine(model, "head", "fp32", model_dir=args.model).prepare()
        fp32_graph = engine.path
        before, now = Path(work) / "before.onnx", Path(work) / "now.onnx"
        quantize_dynamic(str(fp32_graph), str(before), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # every quantizable op
        quantize_onnx_int8(fp32_graph, now)
        for name, path in (("onnxruntime fp32", fp32_graph), ("onnxruntime int8, before", before),
                           ("onnxruntime int8, now", now)):
            variants[name] = qr.onnx_runner(_session(path, args.threads), compared)
        results = measure_all(variants, batches, sample, label_names_of(model), args.rounds)
    payload = {"machine": {**machine(), "load_average_1m": [round(load_start, 2), round(os.getloadavg()[0], 2)]},
               "model": str(args.model), "sample": sample.source, "rows": len(sample), "batch": BATCH,
               "max_length": max_length, "rounds": args.rounds, "threads": args.threads, "results": results}
    save_results("int8_agreement", payload)
    update_doc_section("int8-agreement", render(payload))
    print(render(payload))


def transformers_runner(model_dir: str) -> Any:
    """transformers' own classifier on the same directory and batches: the baseline every speed is set beside."""
    import torch
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir).eval()

    def run(batch: dict[str, Any]) -> Any:
        with torch.inference_mode():
            return model(**{name: batch[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
                         ).logits.float().numpy()
    return run


def measure_all(variants: dict[str, Any], batches: list[dict[str, Any]], sample: Any, names: list[str],
                rounds: int) -> list[dict[str, Any]]:
    from bertforge import quantization_report as qr

    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(rounds):
        order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
        for name in order:
            started = time.perf_counter()
            for batch in batches:
                variants[name](batch)
            seconds[name].append(time.perf_counter() - started)
    results = []
    for name, run in variants.items():
        reference = "onnxruntime fp32" if name.startswith("onnxruntime") else "torch fp32"
        report = qr.measure(variants[reference], run, batches, path=name, recipe="", sample=sample, kind="labels",
                            label_names=names)
        median = statistics.median(seconds[name])
        results.append({"variant": name, "against": reference, "seconds": [round(s, 3) for s in seconds[name]],
                        "median_s": round(median, 3), "sequences_per_s": round(len(sample) / median, 1),
                        **{key: getattr(report, key) for key in ("label_agreement", "flipped", "decisions",
                                                                 "max_probability_change", "largest_flip",
                                                                 "fp32_score", "int8_score")}})
    return results


def render(payload: dict[str, Any]) -> str:
    """The int8-agreement section from its saved results (benchmarks/results/int8_agreement.json)."""
    info, results = payload["machine"], payload["results"]
    speed = {r["variant"]: r["sequences_per_s"] for r in results}
    rows = []
    for r in results:
        int8 = "int8" in r["variant"]
        versus = f"{r['sequences_per_s'] / speed['transformers fp32']:.2f}x" if "transformers fp32" in speed else ""
        flip = r["largest_flip"]
        rows.append([r["variant"], f"{r['sequences_per_s']:.0f}",
                     f"{r['sequences_per_s'] / speed[r['against']]:.2f}x" if int8 else "1.00x", versus,
                     f"**{r['label_agreement']:.2%}**" if int8 else "", f"{r['flipped']}" if int8 else "",
                     f"{r['max_probability_change']:.3f}" if int8 else "",
                     f"{flip['fp32_probability']:.3f} -> {flip['int8_probability']:.3f}" if int8 and flip else "",
                     f"{r['int8_score']:.4f}"])
    table = markdown_table(["variant", "sequences/s", "vs its fp32", "vs transformers fp32", "label agreement", "flipped",
                            "largest probability change", "largest flip: p(fp32's label) -> p(int8's label)",
                            "accuracy"], rows)
    return f"""## int8 against fp32: label agreement and speed (CPU)

`python benchmarks/int8_agreement.py --model DIR --rounds {payload['rounds']} --threads {payload['threads']}`.
{machine_line(info)} (it was {info['load_average_1m'][0]} at the start). Every variant ran
{payload['rounds']} times, alternating, on {payload['threads']} thread(s), and the median is given.
Model: all-MiniLM-L6-v2 fine-tuned on 16,000 SST-2 training sentences (1 epoch, max length
{payload['max_length']}); sample: {payload['rows']} rows of {payload['sample']}, batches of
{payload['batch']} in file order. Each int8 variant is compared with the fp32 of its own runtime (torch
int8 with torch fp32, ONNX Runtime int8 with ONNX Runtime's fp32 graph); transformers'
AutoModelForSequenceClassification on the same directory and batches, in the same rounds, is the
baseline of the "vs transformers fp32" column (its accuracy row is scored as the others). "before": int8 as bertforge made it
until now (torch: every encoder Linear; ONNX Runtime: the pooler and head quantized too); "now": as it
makes it (torch: the feed-forward output projections fp32; ONNX Runtime: pooler and head fp32).

{table}
"""


if __name__ == "__main__":
    main()
