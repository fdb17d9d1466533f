"""ONNX export of any bertforge checkpoint, with dynamic batch and sequence axes on every input.

The graph takes `input_ids`, `attention_mask` and `token_type_ids` (int64, (batch, sequence); for
multiple choice (batch, choices, sequence)) and returns the model's tensors under the names in
`OUTPUTS`. It is traced with `torch.export` (torch.onnx's dynamo exporter), which needs `onnx` and
`onnxscript`, or with `exporter="torchscript"` by torch.onnx's tracer, whose graphs ONNX Runtime's
transformer optimizer fuses (the engine's choice); checking it needs `onnxruntime`.

Two things in the eager model are data-dependent, which a graph cannot be:
- `padding_bias` skips the mask when nothing is padded (`bool(mask.all())`, so SDPA can take its
  mask-free kernels). Exported, the bias is always built: an unpadded batch gets a bias of zeros,
  the same numbers.
- the unpadded fast path packs real tokens into an (N, H) tensor whose N depends on the mask. The
  export uses the padded reference path instead. Real tokens get the same vectors; positions under
  padding hold meaningless values (PyTorch's packed path returns zeros there), so `check_onnx`
  compares real positions only.

With `int8=True` the exported graph is then quantized by ONNX Runtime's dynamic quantization
(`onnxruntime.quantization.quantize_dynamic`: int8 weights per output channel, activations
quantized on the fly), the file about 4x smaller; the check then measures the quantization error too.

Example:
    from bertforge.export import export_onnx
    result = export_onnx("runs/squad/seed-1", "squad.onnx")
    print(result.outputs, result.max_abs_diff)
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.model.inputs import INPUTS, is_multiple_choice, sample_inputs

log = logging.getLogger(__name__)

# model job -> (ONNX output name, attribute of the model's output), and whether it is per token
OUTPUTS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "embeddings": (("last_hidden_state", "last_hidden_state", True), ("pooled_output", "pooled_output", False)),
    "masked-lm": (("logits", "mlm_logits", True),),
    "pretraining": (("mlm_logits", "mlm_logits", True), ("nsp_logits", "nsp_logits", False)),
    "sequence-classification": (("logits", "logits", False),),
    "token-classification": (("logits", "logits", True),),
    "question-answering": (("start_logits", "start_logits", True), ("end_logits", "end_logits", True)),
    "multiple-choice": (("logits", "logits", False),),
    # the graphs the onnxruntime engine runs for two pipeline tasks (`PooledEncoder`, `MaskedTopK` below)
    "sentence-embeddings": (("cls", "cls", False), ("mean", "mean", False), ("max", "max", False),
                            ("pooler", "pooler", False)),
    "fill-mask": (("mask_scores", "mask_scores", True), ("mask_ids", "mask_ids", True)),
    # a sentence-transformers directory's export (`SentenceEncoder`): its pooled, normalised sentence vector
    "sentence-embedding": (("sentence_embedding", "sentence_embedding", False),),
}


def outputs_of(model: nn.Module) -> tuple[tuple[str, str, bool], ...]:
    """The ONNX outputs of a model, by the job its class declares (a bare encoder without a pooler
    has no pooled output)."""
    job = getattr(model, "job", None)
    if job not in OUTPUTS:
        raise ValueError(f"cannot export {type(model).__name__}: exportable jobs are {', '.join(OUTPUTS)}")
    rows = getattr(model, "onnx_outputs", None) or OUTPUTS[job]  # the rows its class declares, if any
    if job == "embeddings" and getattr(model, "pooler", None) is None:
        rows = tuple(row for row in rows if row[1] != "pooled_output")
    return rows


@dataclass
class _Vectors:
    """What the wrappers below return: outputs by attribute, as the models' output records are read."""

    cls: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    max: torch.Tensor | None = None
    pooler: torch.Tensor | None = None
    mask_scores: torch.Tensor | None = None
    mask_ids: torch.Tensor | None = None
    sentence_embedding: torch.Tensor | None = None


class PooledEncoder(nn.Module):
    """The backbone of any model with the pipeline's sentence poolings inside the graph: the [CLS]
    vector, the mean and the maximum over the real tokens (specials included, as sentence-transformers
    does) and the pooler's output where the family has one. Per-sentence outputs are (B, H), so a batch's (B, T, H)
    hidden states never leave the graph."""

    job = "sentence-embeddings"

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = getattr(model, "base_model", model)
        self.config = self.backbone.config
        has_pooler = getattr(self.backbone, "pooler", None) is not None
        self.onnx_outputs = tuple(row for row in OUTPUTS[self.job] if has_pooler or row[1] != "pooler")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> _Vectors:
        out = self.backbone(input_ids, attention_mask, token_type_ids)
        hidden = out.last_hidden_state.float()  # (B, T, H)
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        largest = hidden.masked_fill(mask == 0, torch.finfo(hidden.dtype).min).amax(1)  # padding never wins
        return _Vectors(cls=hidden[:, 0], mean=mean, max=largest, pooler=out.pooled_output)


class SentenceEncoder(nn.Module):
    """A sentence encoder as its sentence-transformers files define it (`sentence_config.SentenceEmbedding`):
    the backbone, the pooling (cls, mean or max over the real tokens, specials included) and, where
    modules.json lists Normalize, unit length. Its one output, `sentence_embedding` (B, H), is the vector
    `SentenceTransformer.encode` gives, so an exported embedding model is used without any code around it."""

    job = "sentence-embedding"

    def __init__(self, model: nn.Module, pooling: str = "mean", normalize: bool = True) -> None:
        super().__init__()
        if pooling not in ("cls", "mean", "max"):
            raise ValueError(f"cannot export {pooling} pooling; the exported poolings are cls, mean and max")
        self.pooled = PooledEncoder(model)
        self.config = self.pooled.config
        self.pooling, self.normalize = pooling, normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> _Vectors:
        vector = getattr(self.pooled(input_ids, attention_mask, token_type_ids), self.pooling)
        if self.normalize:
            vector = torch.nn.functional.normalize(vector, p=2.0, dim=-1)
        return _Vectors(sentence_embedding=vector)


def sentence_encoder_for(directory: str | Path, model: nn.Module) -> nn.Module:
    """`model` wrapped as its directory's sentence encoder where the directory is a sentence-transformers
    model (modules.json) and the model a bare encoder; else `model` itself."""
    from bertforge.sentence_config import read_sentence_embedding

    if getattr(model, "job", None) != "embeddings":
        return model
    embedding = read_sentence_embedding(directory)
    if embedding is None:
        return model
    return SentenceEncoder(model, embedding.pooling, embedding.normalize)


class MaskedTopK(nn.Module):
    """A masked-LM model with fill-mask's selection inside the graph: at every position the `k` most
    probable tokens other than `excluded` (the tokenizer's special tokens) and their probabilities,
    (B, T, k) each. Handing out (B, T, V) logits instead would be 120 MB per batch of 32 x 16 at BERT's
    30,522 pieces; the caller reads the positions that hold [MASK]."""

    job = "fill-mask"

    def __init__(self, model: nn.Module, excluded: list[int], k: int) -> None:
        super().__init__()
        self.model = model
        self.config = model.config  # type: ignore[attr-defined]
        self.k = min(k, self.config.vocab_size - len(set(excluded)))
        bias = torch.zeros(self.config.vocab_size)
        bias[sorted(set(excluded))] = -math.inf
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> _Vectors:
        backbone = self.model.base_model  # type: ignore[attr-defined]
        hidden = backbone(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.model.masked_lm_logits(hidden).float() + self.bias  # type: ignore[attr-defined]
        top = logits.softmax(-1).topk(self.k, dim=-1)
        return _Vectors(mask_scores=top.values, mask_ids=top.indices)


DEFAULT_OPSET = 18
_EXTERNAL_DATA_BYTES = 1_500_000_000  # protobuf caps a file at 2 GiB; larger weights go beside it


@dataclass
class ExportResult:
    path: Path
    model: str  # class name
    inputs: list[str]
    outputs: list[str]
    dynamic_axes: dict[str, list[str]]
    seconds: float
    max_abs_diff: float | None = None  # ONNX Runtime vs PyTorch on a padded sample; None if not checked
    checked_shapes: list[tuple[int, ...]] = field(default_factory=list)
    int8: bool = False  # quantized by ONNX Runtime's dynamic quantization (the check compares with fp32 PyTorch)
    quantization: Any = None  # int8: `quantization_report.QuantizationReport` against the fp32 graph
    report_path: Path | None = None  # where that report was written


class _Exportable(nn.Module):
    """The model with a positional, tensor-only signature and a tuple of tensors out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.fields = [attr for _, attr, _ in outputs_of(model)]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, attention_mask, token_type_ids)
        return tuple(getattr(out, name) for name in self.fields)


@contextlib.contextmanager
def graph_friendly(model: nn.Module) -> Iterator[None]:
    """For the duration: the padded attention path, and an attention mask built whatever the data
    (no data-dependent branch in the graph), on every encoder inside that has these switches; and
    attention with separate q/k/v projections where a layer offers it (`split_for_export`), the form
    ONNX Runtime's optimizer fuses."""
    switches = {"unpad": False, "always_build_mask": True}
    saved = [(m, name, getattr(m, name)) for m in model.modules() for name in switches if hasattr(m, name)]
    split = [m for m in model.modules() if hasattr(m, "split_for_export")]  # attention ONNX Runtime can fuse
    try:
        for m, name, _ in saved:
            setattr(m, name, switches[name])
        for m in split:
            m.split_for_export()
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)
        for m in split:
            m.join_after_export()


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's noise that says nothing about this model."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")  # "torchvision is not installed"
    level = registration.level
    with warnings.catch_warnings():
        # every input names the same Dim objects on purpose; the exporter says it shares them
        warnings.filterwarnings("ignore", message=r".*will not be used, since it shares the same shape")
        warnings.filterwarnings("ignore", message=r".*LeafSpec.*is deprecated", category=FutureWarning)
        # the tracer (exporter="torchscript"): Python branches on sizes it records as constants, which the
        # engine's check on other shapes catches; and its notice that it is deprecated
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*dynamo=False.*", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=r".*TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx\._internal\.torchscript.*")
        registration.setLevel(logging.ERROR)
        try:
            yield
        finally:
            registration.setLevel(level)


def export_onnx(
    model: nn.Module | str | Path,
    out: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    check: bool = True,
    int8: bool = False,
    exporter: str = "dynamo",
) -> ExportResult:
    """Export a model (or a checkpoint directory) to ONNX at `out`; optionally check it with ONNX Runtime.

    Every input has dynamic axes `batch` and `sequence` (and `choices` for multiple choice), so one
    file serves any batch size and any length up to the model's `max_tokens`. `int8` quantizes the
    exported graph with ONNX Runtime's dynamic quantization (needs onnxruntime).

    `exporter`: "dynamo" (`torch.export`, the default: shapes stay symbolic whatever the model's code
    does with them) or "torchscript" (torch.onnx's tracer: its graphs are the ones ONNX Runtime's
    transformer optimizer knows, so attention fuses into one op; a model whose code computes with
    shapes in Python gets those shapes frozen, which only a check on other shapes reveals).
    """
    if exporter not in ("dynamo", "torchscript"):
        raise ValueError(f"unknown exporter {exporter!r}; choose dynamo or torchscript")
    directory = None
    if not isinstance(model, nn.Module):
        from bertforge.model import load_any

        directory = Path(model)
        model, _ = load_any(model)
        model = sentence_encoder_for(directory, model)  # a sentence-transformers model: its sentence vector
    kind = type(model).__name__
    rows = outputs_of(model)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").eval()
    config = model.config  # type: ignore[attr-defined]

    batch = torch.export.Dim("batch", min=1, max=4096)
    sequence = torch.export.Dim("sequence", min=1, max=config.max_tokens)
    if is_multiple_choice(model):
        axes: dict[int, Any] = {0: batch, 1: torch.export.Dim("choices", min=1, max=64), 2: sequence}
    else:
        axes = {0: batch, 1: sequence}
    example = sample_inputs(model)
    output_names = [name for name, _, _ in rows]
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())

    started = time.perf_counter()
    traced = out.with_name(out.stem + ".fp32.tmp.onnx") if int8 else out
    with graph_friendly(model), _quiet_exporter(), torch.inference_mode(False), torch.no_grad():
        if exporter == "torchscript":
            named_axes = {index: dim.__name__ for index, dim in axes.items()}
            # the outputs' dynamic axes follow from the inputs'
            specific: dict[str, Any] = {"dynamo": False, "dynamic_axes": {name: named_axes for name in INPUTS}}
        else:
            specific = {"dynamo": True, "dynamic_shapes": {name: dict(axes) for name in INPUTS},
                        "external_data": n_bytes > _EXTERNAL_DATA_BYTES}
        torch.onnx.export(_Exportable(model).eval(), tuple(example[name] for name in INPUTS), str(traced),
                          input_names=list(INPUTS), output_names=output_names, opset_version=opset, verbose=False,
                          **specific)
    report = None
    if int8:
        try:
            quantize_onnx_int8(traced, out)
            report = onnx_int8_report(model, traced, out, directory, path="export-onnx --int8")
        finally:
            traced.unlink(missing_ok=True)
            traced.with_name(traced.name + ".data").unlink(missing_ok=True)
    result = ExportResult(
        path=out, model=kind, inputs=list(INPUTS), outputs=output_names,
        dynamic_axes={name: [str(d.__name__) for d in axes.values()] for name in INPUTS},
        seconds=time.perf_counter() - started, int8=int8, quantization=report,
    )
    if report is not None:
        from bertforge.quantization_report import write_report

        result.report_path = write_report(report, out)
    if check:
        shapes = [(1, 3, 7), (2, 2, 23)] if is_multiple_choice(model) else [(1, 7), (3, 23)]
        diffs = []
        for i, shape in enumerate(shapes):
            inputs = sample_inputs(model, batch=shape[0], length=shape[-1],
                                   choices=shape[1] if len(shape) == 3 else 2, seed=i + 1)
            diffs.append(check_onnx(model, out, inputs))
            result.checked_shapes.append(tuple(inputs["input_ids"].shape))
        result.max_abs_diff = max(diffs)
    return result


ONNX_INT8_RECIPE = ("ONNX Runtime dynamic quantization: MatMul and Attention weights int8 per output channel, "
                    "activations uint8 per tensor on each call; embeddings int8; pooler and head fp32")


def onnx_int8_report(model: nn.Module, fp32_graph: str | Path, int8_graph: str | Path,
                     directory: str | Path | None, *, path: str, tokenizer: Any = None) -> Any:
    """The int8 graph measured against the fp32 graph it was quantized from
    (`bertforge.quantization_report`), on `directory`'s sample (its dev file, training rows or fixed
    sentences), or on random ids where there is no tokenizer."""
    from bertforge import quantization_report as qr

    compared = qr.compared_output(model)
    sample, batches = qr.sample_batches(model, directory, tokenizer)
    fp32, int8 = onnx_session(fp32_graph, threads=1), onnx_session(int8_graph, threads=1)
    return qr.measure_model(model, qr.onnx_runner(fp32, compared), qr.onnx_runner(int8, compared), compared,
                            sample, batches, path=path, recipe=ONNX_INT8_RECIPE)


VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def int8_reduce_range(flags: set[str] | None = None) -> bool:
    """Whether int8 weights should use 7 bits: on a CPU without VNNI, ONNX Runtime's u8 x s8 products go
    through 16-bit sums (vpmaddubsw) that saturate with full-range weights, which moved hidden states by
    0.25 on an AVX2-only EPYC against 0.06 with VNNI; 7-bit weights cannot saturate there."""
    from bertforge.precision import cpu_flags

    return not (VNNI_FLAGS & (cpu_flags() if flags is None else flags))


def quantize_onnx_int8(source: str | Path, out: str | Path, *, reduce_range: bool | None = None) -> None:
    """ONNX Runtime's dynamic quantization of `source` into `out` (written atomically): the encoder's
    projections and the embedding table (the pooler and head stay fp32: `_head_nodes`), int8 weights
    per output channel (per channel measured 0.52 against 0.74 per tensor as the largest change of
    all-MiniLM-L6-v2's final hidden states), activations quantized per call; 7-bit weights where this
    CPU lacks VNNI (`int8_reduce_range`; None decides by the CPU)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from bertforge.fileio import atomic_path

    if Path(source).with_name(Path(source).name + ".data").exists():
        raise ValueError("int8 export of a model whose weights exceed 1.5 GB (external data) is not supported")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # "consider pre-processing": shape inference adds nothing to a dynamo graph
    try:
        with atomic_path(out) as tmp:
            # a graph fused by ONNX Runtime's optimizer holds contrib ops (Attention, SkipLayerNormalization)
            # that shape inference cannot type: their outputs are float
            quantize_dynamic(str(source), str(tmp), weight_type=QuantType.QInt8, per_channel=True,
                             nodes_to_exclude=_head_nodes(source),
                             reduce_range=int8_reduce_range() if reduce_range is None else reduce_range,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)


def _head_nodes(source: str | Path) -> list[str]:
    """The nodes int8 leaves fp32: the pooler and the task head, which the tracer makes Gemm nodes (a few
    thousand multiply-adds per sequence). The quantizer turns a Gemm into a MatMul named NAME_MatMul
    before it quantizes, so both names are given."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    return [name for node in graph.node if node.op_type == "Gemm" for name in (node.name, node.name + "_MatMul")]


def onnx_session(path: str | Path, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU session; `threads` sets intra-op threads (None: ONNX Runtime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def check_onnx(model: nn.Module, path: str | Path, inputs: dict[str, torch.Tensor],
               session: Any = None) -> float:
    """Max |ONNX Runtime - PyTorch| over every output, at real (unpadded) positions of per-token outputs."""
    session = session or onnx_session(path)
    got = session.run(None, {name: inputs[name].numpy() for name in INPUTS})
    with torch.no_grad():
        expected = model(*(inputs[name] for name in INPUTS))
    mask = inputs["attention_mask"].bool()
    if mask.dim() == 3:  # multiple choice: (B, C, T)
        mask = mask.flatten(0, 1)
    worst = 0.0
    for (_, attr, per_token), array in zip(outputs_of(model), got, strict=True):
        reference = getattr(expected, attr).float()
        onnx_out = torch.from_numpy(array).float()
        if reference.shape != onnx_out.shape:
            raise AssertionError(f"{attr}: ONNX shape {tuple(onnx_out.shape)} != PyTorch {tuple(reference.shape)}")
        diff = (onnx_out - reference).abs()
        if per_token:
            diff = diff[mask]  # (B, T, ...) -> (real tokens, ...)
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
    return worst
