"""Inference engines behind the one pipeline: PyTorch (the model itself) or ONNX Runtime.

The pipeline's pre- and post-processing are the same whichever engine runs the model rows; the
engine only maps a batch (`input_ids`, `attention_mask`, `token_type_ids`) to the named outputs the
task reads. `torch` calls the model. `onnxruntime` runs an ONNX graph of it that holds the task head
and any pooling (`bertforge.export`):

    pipeline task              graph                                  outputs
    text / token classification, QA, multiple choice: the model's head (`export.OUTPUTS` of its job)
    embeddings                 `export.PooledEncoder` (the backbone)   cls, mean, pooler (B, H)
    fill-mask                  `export.MaskedTopK`                     mask_scores, mask_ids (B, T, k)

The graph is exported on first use into a cache (`OnnxEngine`): a folder beside the weights
(MODEL_DIR/.bertforge-onnx/) where that is writable, else the user's cache directory
($BERTFORGE_ONNX_CACHE, else $XDG_CACHE_HOME/bertforge/onnx). An entry is keyed by the SHA-256 of
config.json and the weights, the precision, the opset and what else changes the graph, so a changed
model is exported again; it is written to a temporary folder and renamed into place (atomic). Then:

- ONNX Runtime's transformer optimizer (`optimize_model`, model_type "bert", the config's heads and
  width) fuses what it recognises (LayerNorm with the residual add, GELU with its bias; attention
  where the pattern matches). The fused graph is compared with the plain one on sample inputs and
  kept only if it agrees; a fusion that fails or disagrees leaves the plain graph, with the reason
  logged.
- int8 is ONNX Runtime's dynamic quantization of that graph (`export.quantize_onnx_int8`), with 7-bit
  weights where the CPU lacks VNNI (`export.int8_reduce_range`). The int8 graph is then measured
  against the fp32 graph it came from on the model's dev file (or training rows, or fixed sentences):
  label agreement, largest probability change, the metric before and after
  (`bertforge.quantization_report`). The report goes into the entry's entry.json and the model
  directory's quantization_report.json, and is logged: a warning below 99% agreement.
- The session uses the thread count torch uses (`torch.get_num_threads()`, which the command line's
  thread policy sets); when that count changes, the session is made again with the new one.

`choose_engine` decides what `--engine auto` runs: bf16 on torch (ONNX Runtime has no CPU bf16
path worth using), a saved int8 copy on torch (its fp32 weights are gone), otherwise the faster engine
for (precision, CPU class, shape class) in `ENGINE_TABLE`, filled from `benchmarks/onnx_anchor.py`;
entries not yet measured on such a CPU are marked as guesses, and the reason says so. `calibrate`
times both engines on this machine instead (`--engine-calibrate`), cached per model and machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

ENGINES = ("auto", "torch", "onnxruntime")
ENGINE_PRECISIONS = ("fp32", "int8")  # what ONNX Runtime runs here; bf16 stays with torch
GRAPHS = ("head", "embeddings", "fill-mask")
CACHE_ENV = "BERTFORGE_ONNX_CACHE"
CACHE_FOLDER = ".bertforge-onnx"  # inside the model directory
# Bump when the exported graphs change, so that caches made by an older bertforge are not reused.
# 4: int8 keeps the pooler and head (Gemm) fp32 and carries its report (quantization_report)
GRAPH_VERSION = 4  # 2: attention exported in the form ONNX Runtime fuses; 3: max pooling in the embeddings graph
# Fill-mask's graph hands out this many tokens per position (the server's top_k limit is 50).
FILL_MASK_TOP_K = 50
# An export whose outputs differ from PyTorch's by more than this is broken, not rounded.
EXPORT_TOLERANCE = 1e-3
# A fused graph must give the plain graph's numbers within this (fusion reorders sums, nothing more).
FUSION_TOLERANCE = 1e-4
ONNX_INT8_PATH = "onnxruntime int8"  # the engine's entry in a model directory's quantization_report.json

# (precision, CPU class, shape class) -> (engine, measured). Shape classes: "single-short" (one
# sequence of at most 64 pieces: the latency of a request), "single-long" (one longer sequence),
# "batch" (several sequences per call: files, dev sets, a busy server). MEASURED holds the
# `engine_table` of benchmarks/onnx_anchor.py for each CPU class it has run on (docs/benchmarks.md,
# "ONNX Runtime as an engine"); a class it has not run on takes the entries of the nearest measured
# class, marked as guesses (measured=False, and `auto` says so).
MEASURED_AVX512_BF16 = {  # ONNX Runtime's fused graph against torch, geometric mean over the class's cells:
    # fp32 1 x 16 2.22x, 1 x 128 1.24x, length-sorted batches 1.01x (0.94x at 1 thread, 1.07x at 2: a tie,
    # which goes to torch: no export, and 1.8x ONNX Runtime's speed on mixed-length batches); int8 1.5-5x
    ("fp32", "single-short"): "onnxruntime", ("fp32", "single-long"): "onnxruntime", ("fp32", "batch"): "torch",
    ("int8", "single-short"): "onnxruntime", ("int8", "single-long"): "onnxruntime", ("int8", "batch"): "onnxruntime",
}
MEASURED: dict[str, dict[tuple[str, str], str]] = {
    # 2-core AMD EPYC (avx2, avx512f, avx512_bf16, avx512_vnni, no AMX), all-MiniLM-L6-v2 and a
    # BERT-base-shaped model at 1 and 2 threads, torch 2.13
    "avx512_bf16": MEASURED_AVX512_BF16,
}
NEAREST_MEASURED = {"amx": "avx512_bf16", "avx512_bf16": "avx512_bf16", "avx512_vnni": "avx512_bf16",
                    "avx2": "avx512_bf16"}
ENGINE_TABLE: dict[tuple[str, str, str], tuple[str, bool]] = {
    (precision, cpu, shape): (MEASURED.get(cpu, MEASURED[nearest])[(precision, shape)], cpu in MEASURED)
    for cpu, nearest in NEAREST_MEASURED.items()
    for precision in ENGINE_PRECISIONS
    for shape in ("single-short", "single-long", "batch")
}


class EngineError(ValueError):
    """An engine that cannot run this model, precision or device: one line saying what to use instead."""


# ------------------------------------------------------------------------------------------------
# which engine
# ------------------------------------------------------------------------------------------------
def cpu_class(flags: set[str] | None = None) -> str:
    """The CPU's class for the engine table: amx, avx512_bf16, avx512_vnni or avx2 (anything less)."""
    from bertforge.precision import cpu_flags

    flags = cpu_flags() if flags is None else flags
    if flags & {"amx_bf16", "amx_int8", "amx_tile"}:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if flags & {"avx512_vnni", "avx_vnni"}:
        return "avx512_vnni"
    return "avx2"


def shape_class(batch_size: int, max_length: int | None = None) -> str:
    """single-short (one sequence of at most 64 pieces), single-long, or batch."""
    if batch_size > 1:
        return "batch"
    return "single-short" if (max_length or 0) <= 64 else "single-long"


@dataclass
class EngineChoice:
    """The engine and precision a pipeline runs, and why (said in a log line, by predict and by serve)."""

    engine: str
    precision: str
    reason: str
    measured: bool = True  # False: the table's entry is a guess
    source: str = "asked"  # asked (by name), rule (bf16, a saved int8 copy, a GPU, no onnxruntime), table, calibration
    timings_ms: dict[str, float] = field(default_factory=dict)  # from a calibration

    def describe(self) -> str:
        return f"engine {self.engine} at {self.precision}: {self.reason}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def onnxruntime_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        return False
    return True


def choose_engine(requested: str, precision: str, *, batch_size: int = 1, max_length: int | None = None,
                  device: str | None = None, flags: set[str] | None = None, saved_int8: bool = False,
                  table: dict[tuple[str, str, str], tuple[str, bool]] | None = None,
                  available: bool | None = None) -> EngineChoice:
    """The engine for `requested` (auto, torch, onnxruntime) at `precision` (fp32, bf16, int8 or auto),
    on this CPU (or one with `flags`) for calls of `batch_size` rows of up to `max_length` pieces.

    `precision` auto is resolved first (`bertforge.precision.choose_precision`: bf16 where native);
    with onnxruntime asked for by name it resolves to fp32, the precision that engine runs in its place.
    Raises `EngineError` for what ONNX Runtime cannot run when asked by name: bf16, a saved int8 copy,
    a GPU device, or no onnxruntime installed.
    """
    from bertforge.precision import PRECISIONS, choose_precision, cpu_flags

    if requested not in ENGINES:
        raise EngineError(f"unknown engine {requested!r}; choose one of {', '.join(ENGINES)}")
    if precision not in PRECISIONS:
        raise EngineError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    flags = cpu_flags() if flags is None else flags
    on_gpu = device is not None and not str(device).startswith("cpu")
    if saved_int8:
        resolved = "int8"
    elif precision == "auto":
        resolved = "fp32" if requested == "onnxruntime" else choose_precision("auto", flags, device or "cpu")
    else:
        resolved = precision
    available = onnxruntime_available() if available is None else available
    if requested == "torch":
        return EngineChoice("torch", resolved, "asked for")
    if requested == "onnxruntime":
        if on_gpu:
            raise EngineError(f"the onnxruntime engine runs on the CPU; device {device} needs --engine torch")
        if saved_int8:
            raise EngineError("a saved int8 copy (torchao) runs only on the torch engine; give the fp32 "
                              "checkpoint for ONNX Runtime int8 (--engine onnxruntime --precision int8)")
        if resolved not in ENGINE_PRECISIONS:
            raise EngineError(f"ONNX Runtime has no CPU {resolved} path worth using; use --engine torch for "
                              f"{resolved}, or --precision fp32 or int8 with onnxruntime")
        if not available:
            raise EngineError("the onnxruntime engine needs onnxruntime, onnx and onnxscript "
                              "(pip install 'bertforge[onnx]')")
        return EngineChoice("onnxruntime", resolved, "asked for")
    # auto
    if on_gpu:
        return EngineChoice("torch", resolved, f"device {device}: ONNX Runtime runs on the CPU here", source="rule")
    if saved_int8:
        return EngineChoice("torch", resolved, "a saved int8 copy (torchao) runs only on torch", source="rule")
    if resolved not in ENGINE_PRECISIONS:
        return EngineChoice("torch", resolved, f"{resolved}: ONNX Runtime has no CPU {resolved} path worth using", source="rule")
    if not available:
        return EngineChoice("torch", resolved, "onnxruntime is not installed (pip install 'bertforge[onnx]')", source="rule")
    cpu, shape = cpu_class(flags), shape_class(batch_size, max_length)
    engine, measured = (table if table is not None else ENGINE_TABLE).get((resolved, cpu, shape), ("torch", False))
    how = "measured" if measured else "a guess, not yet measured"
    return EngineChoice(engine, resolved, f"table entry ({resolved}, {cpu}, {shape}) -> {engine} ({how})",
                        measured=measured, source="table")


# ------------------------------------------------------------------------------------------------
# the ONNX Runtime engine
# ------------------------------------------------------------------------------------------------
def graph_for_task(task: str) -> str:
    """The graph a pipeline task runs: its own for embeddings and fill-mask, the model's head otherwise."""
    return task if task in ("embeddings", "fill-mask") else "head"


def export_module(model: nn.Module, graph: str, excluded: list[int] | None = None) -> nn.Module:
    """The module whose graph `graph` is: the model itself (its head), or a wrapper from `bertforge.export`."""
    from bertforge.export import MaskedTopK, PooledEncoder, outputs_of

    if graph == "embeddings":
        return PooledEncoder(model)
    if graph == "fill-mask":
        if not hasattr(model, "masked_lm_logits"):
            raise EngineError(f"{type(model).__name__} has no masked-LM head to export for fill-mask")
        return MaskedTopK(model, excluded or [], FILL_MASK_TOP_K)
    try:
        outputs_of(model)
    except ValueError as exc:
        raise EngineError(f"the onnxruntime engine cannot run this model: {exc}; use --engine torch") from None
    return model


def weights_digest(model_dir: str | os.PathLike[str] | None, model: nn.Module | None = None) -> str:
    """`bertforge.checkpoint.weights_digest`, with a directory of no weights an EngineError (no cache key)."""
    from bertforge.checkpoint import CheckpointError
    from bertforge.checkpoint import weights_digest as checkpoint_weights_digest

    try:
        return checkpoint_weights_digest(model_dir, model)
    except CheckpointError as exc:
        raise EngineError(f"{exc}: nothing to key the ONNX cache on") from exc


def user_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "bertforge" / "onnx"


def cache_dir_for(model_dir: str | os.PathLike[str] | None) -> Path:
    """MODEL_DIR/.bertforge-onnx where the model directory is writable (and $BERTFORGE_ONNX_CACHE is
    not set), else the user cache directory."""
    if model_dir is not None and not os.environ.get(CACHE_ENV):
        beside = Path(model_dir) / CACHE_FOLDER
        if os.access(beside if beside.is_dir() else Path(model_dir), os.W_OK):
            return beside
    return user_cache_dir()


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def _allow_spinning() -> bool:
    """Whether ONNX Runtime's threads may spin between calls: not under the sharing policy
    (`threads.threads_should_yield`), since a spinning thread holds a core another job could use."""
    from bertforge import threads

    return not threads.threads_should_yield()


class OnnxEngine:
    """One ONNX Runtime session for one graph of a model (see the module docstring).

    `prepare()` exports (or finds in the cache) and opens the session; `run(batch)` maps a batch of
    int64 tensors to the graph's outputs as torch tensors. `info` says what was built and why.
    """

    def __init__(self, model: nn.Module, graph: str = "head", precision: str = "fp32", *,
                 model_dir: str | os.PathLike[str] | None = None, optimize: bool = True, opset: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, excluded_ids: list[int] | None = None,
                 reduce_range: bool | None = None) -> None:
        from bertforge.export import DEFAULT_OPSET

        if graph not in GRAPHS:
            raise ValueError(f"graph must be one of {', '.join(GRAPHS)}, got {graph!r}")
        if precision not in ENGINE_PRECISIONS:
            raise EngineError(f"ONNX Runtime has no CPU {precision} path worth using; use --engine torch")
        self.model, self.graph, self.precision = model, graph, precision
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.optimize, self.opset = optimize, opset or DEFAULT_OPSET
        self.cache_dir = Path(cache_dir) if cache_dir is not None else cache_dir_for(self.model_dir)
        self.excluded_ids = sorted(set(excluded_ids or []))
        if reduce_range is None and precision == "int8":
            from bertforge.export import int8_reduce_range

            reduce_range = int8_reduce_range()
        self.reduce_range = bool(reduce_range) if precision == "int8" else None
        self.module = export_module(model, graph, self.excluded_ids)  # refuses what cannot export, at once
        self.path: Path | None = None
        self.weights = ""  # the digest the cache entry is keyed on (set by prepare)
        self.info: dict[str, Any] = {}
        self._session: Any = None
        self._threads = 0
        self._outputs: list[str] = []

    # -- the cache ---------------------------------------------------------------------------
    def key(self) -> dict[str, Any]:
        """Everything the cached graph depends on."""
        return {"weights": weights_digest(self.model_dir, self.model if self.model_dir is None else None),
                "graph": self.graph, "class": type(self.model).__name__, "precision": self.precision,
                "opset": self.opset, "optimize": self.optimize, "reduce_range": self.reduce_range,
                "excluded_ids": self.excluded_ids if self.graph == "fill-mask" else None,
                "top_k": FILL_MASK_TOP_K if self.graph == "fill-mask" else None,
                "onnxruntime": _ort_version(), "graph_version": GRAPH_VERSION}

    def entry(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        return self.cache_dir / f"{key['graph']}-{key['precision']}-opset{key['opset']}-{digest}"

    def prepare(self) -> OnnxEngine:
        """Export into the cache unless this key is there already, then open the session."""
        key = self.key()
        self.weights = key["weights"]
        entry = self.entry(key)
        if not (entry / "model.onnx").is_file():
            self._build(entry, key)
        else:
            log.info("ONNX graph from the cache: %s", entry)
        self.path = entry / "model.onnx"
        try:
            self.info = json.loads((entry / "entry.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.info = {"key": key}
        self._open()
        return self

    def _build(self, entry: Path, key: dict[str, Any]) -> None:
        from bertforge.export import quantize_onnx_int8

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=self.cache_dir, prefix=f".{entry.name}.", suffix=".tmp"))
        started = time.perf_counter()
        try:
            fp32 = self.entry({**key, "precision": "fp32", "reduce_range": None})
            if self.precision == "int8" and (fp32 / "model.onnx").is_file():
                # the fp32 graph of these weights is cached: quantize it rather than export again
                from bertforge.export import quantize_onnx_int8

                quantize_onnx_int8(fp32 / "model.onnx", work / "model.onnx", reduce_range=self.reduce_range)
                source = json.loads((fp32 / "entry.json").read_text(encoding="utf-8"))
                record = {**source, "key": key, "quantized_from": fp32.name,
                          **self._int8_record(fp32 / "model.onnx", work / "model.onnx", source),
                          "seconds": round(time.perf_counter() - started, 2)}
                self._commit(work, entry, key, record)
                return
            plain, export_diff, exporter = self._export(work / "plain.onnx")
            chosen, fusion = plain, {"optimized": False, "reason": "not asked for"}
            if self.optimize:
                chosen, fusion = self._fuse(plain, work / "fused.onnx")
            final = work / "model.onnx"
            if self.precision == "int8":
                quantize_onnx_int8(chosen, final, reduce_range=self.reduce_range)
                fusion.update(self._int8_record(chosen, final, fusion))
            else:
                os.replace(chosen, final)
            for leftover in (plain, work / "fused.onnx"):
                leftover.unlink(missing_ok=True)
            record = {"key": key, "exporter": exporter, "export_max_abs_diff": export_diff, **fusion,
                      "seconds": round(time.perf_counter() - started, 2)}
            self._commit(work, entry, key, record)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _export(self, plain: Path) -> tuple[Path, float, str]:
        """The plain graph, its largest difference from PyTorch, and the exporter that made it: torch.onnx's
        tracer first (ONNX Runtime's optimizer fuses attention in its graphs; measured 5-25% faster than
        the same model's dynamo graph, benchmarks/onnx_anchor.py), `torch.export` where tracing fails
        or freezes a shape (the check on two other shapes then disagrees)."""
        from bertforge.export import export_onnx

        failures = []
        for exporter in ("torchscript", "dynamo"):
            try:
                export_onnx(self.module, plain, opset=self.opset, check=False, exporter=exporter)
            except Exception as exc:  # the exporters' errors are many and long: one line each
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                failures.append(f"{exporter}: {type(exc).__name__}: {first}")
                continue
            try:
                diff = self._check(plain, None)
            except Exception as exc:  # noqa: BLE001 (a traced graph that cannot run other shapes)
                failures.append(f"{exporter}: the graph does not run ({type(exc).__name__})")
                continue
            if diff <= EXPORT_TOLERANCE:
                return plain, diff, exporter
            failures.append(f"{exporter}: differs from PyTorch by {diff:.2e}")
        raise EngineError(f"{type(self.model).__name__} ({self.graph} graph) does not export to ONNX "
                          f"({'; '.join(failures)}); use --engine torch")

    def _int8_record(self, fp32_graph: Path, int8_graph: Path, fp32_record: dict[str, Any]) -> dict[str, Any]:
        """int8 measured against the fp32 graph it was quantized from (`quantization_report`): the report,
        written to the model directory's quantization_report.json too, and a reason that says it (the
        fusion's own check compared the fused fp32 graph with the plain one, not int8 with fp32)."""
        from bertforge import quantization_report as qr
        from bertforge.export import onnx_int8_report

        report = onnx_int8_report(self.module, fp32_graph, int8_graph, self.model_dir, path=ONNX_INT8_PATH)
        for line in report.lines():
            (log.info if report.ok else log.warning)("%s", line)
        if self.model_dir is not None:
            try:
                qr.write_report(report, self.model_dir)
            except OSError as exc:  # a read-only model directory: the cache entry keeps the report
                log.info("could not write %s: %s", qr.report_path(self.model_dir), exc)
        measured = (f"label agreement {report.label_agreement:.2%} ({report.flipped} of {report.decisions} flipped)"
                    if report.label_agreement is not None else
                    f"lowest cosine {report.cosine_min:.4f}" if report.cosine_min is not None else "compared")
        fused = str(fp32_record.get("reason", "")).replace("max diff", "fused vs plain fp32 max diff")
        return {"quantization": report.as_dict(),
                "int8_max_abs_diff": report.max_abs_diff,
                "reason": f"{fused}; int8 vs fp32 on {report.rows} rows: {measured}, max diff "
                          f"{report.max_abs_diff:.1e}{'' if report.ok else ' (below the 99% floor)'}"}

    def _commit(self, work: Path, entry: Path, key: dict[str, Any], record: dict[str, Any]) -> None:
        (work / "entry.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        try:
            os.replace(work, entry)  # one rename: the entry appears whole or not at all
        except OSError:
            if not (entry / "model.onnx").is_file():  # not another process's finished entry
                raise
        log.info("exported the %s graph of %s at %s to %s in %.1f s (%s)", self.graph, type(self.model).__name__,
                 self.precision, entry, record["seconds"], record.get("reason", ""))
        self._prune(entry, key)

    def _prune(self, entry: Path, key: dict[str, Any]) -> None:
        """Drop entries for other weights from a model directory's own cache (the user cache is shared
        by many models and left alone)."""
        if self.model_dir is None or self.cache_dir != self.model_dir / CACHE_FOLDER:
            return
        for other in self.cache_dir.iterdir():
            if other == entry or not other.is_dir() or other.name.startswith("."):
                continue
            try:
                old = json.loads((other / "entry.json").read_text(encoding="utf-8"))["key"]
            except (OSError, ValueError, KeyError):
                continue
            if old.get("weights") != key["weights"]:
                shutil.rmtree(other, ignore_errors=True)

    def _fuse(self, plain: Path, out: Path) -> tuple[Path, dict[str, Any]]:
        """ONNX Runtime's transformer fusions on `plain`; the plain graph where they fail or change the numbers."""
        config = self.module.config  # type: ignore[attr-defined]
        try:
            from onnxruntime.transformers.optimizer import optimize_model

            root = logging.getLogger()
            level = root.level
            root.setLevel(logging.ERROR)  # the optimizer logs every pattern it looked for
            try:
                # opt_level 0: the Python fusions only; the session applies ONNX Runtime's own graph
                # optimisations for this machine when it opens the file
                fused = optimize_model(str(plain), model_type=_encoder_fusions(), num_heads=config.num_attention_heads,
                                       hidden_size=config.hidden_size, opt_level=0)
                counts = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
                fused.save_model_to_file(str(out))
            finally:
                root.setLevel(level)
        except Exception as exc:  # noqa: BLE001 (any failure of an optional step falls back)
            reason = f"fusion failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); " \
                     "the plain graph runs"
            log.warning("%s: %s", type(self.model).__name__, reason)
            return plain, {"optimized": False, "reason": reason}
        if not counts:
            return plain, {"optimized": False, "reason": "the optimizer fused nothing in this graph; the plain graph runs"}
        diff = self._check(out, plain)
        if not diff <= FUSION_TOLERANCE:
            reason = f"the fused graph differs from the plain one by {diff:.2e}; the plain graph runs"
            log.warning("%s: %s", type(self.model).__name__, reason)
            return plain, {"optimized": False, "reason": reason, "fused": counts}
        if "Attention" not in counts and "MultiHeadAttention" not in counts:
            note = "attention not fused (its pattern differs from the optimizer's), "
        else:
            note = ""
        return out, {"optimized": True, "fused": counts,
                     "reason": f"fused {', '.join(f'{n} x{c}' for n, c in counts.items())}; {note}max diff {diff:.1e}"}

    def _check(self, path: Path, reference: Path | None) -> float:
        """Max |difference| of the floating outputs at real positions: `path` against the `reference`
        graph, or against PyTorch when there is none, on two padded samples."""
        import numpy as np
        import torch

        from bertforge.export import INPUTS, graph_friendly, outputs_of, sample_inputs

        session = _session(path, 1)
        other = _session(reference, 1) if reference is not None else None
        rows = outputs_of(self.module)
        worst = 0.0
        for seed, (batch, length) in enumerate([(1, 7), (3, 23)]):
            inputs = sample_inputs(self.module, batch=batch, length=min(length, self.module.config.max_tokens),
                                   seed=seed + 1)
            feed = {name: inputs[name].numpy() for name in INPUTS}
            got = session.run(None, feed)
            if other is not None:
                expected = other.run(None, feed)
            else:
                with torch.no_grad(), graph_friendly(self.module):
                    out = self.module(*(inputs[name] for name in INPUTS))
                expected = [getattr(out, attr).float().numpy() for _, attr, _ in rows]
            mask = inputs["attention_mask"].numpy().astype(bool)
            if mask.ndim == 3:
                mask = mask.reshape(-1, mask.shape[-1])
            for (_, _, per_token), a, b in zip(rows, got, expected, strict=True):
                if not np.issubdtype(np.asarray(a).dtype, np.floating):
                    continue  # token ids: ties may order differently; their scores are compared
                diff = np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64))
                if per_token:
                    diff = diff[mask]
                worst = max(worst, float(diff.max()) if diff.size else 0.0)
        return worst

    # -- running -----------------------------------------------------------------------------
    def _open(self) -> None:
        import torch

        assert self.path is not None
        self._threads = torch.get_num_threads()
        self._session = _session(self.path, self._threads)
        self._outputs = [o.name for o in self._session.get_outputs()]

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    def run(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The graph's outputs for a batch (int64 `input_ids`, `attention_mask`, `token_type_ids`)."""
        import torch

        from bertforge.export import INPUTS

        if self._session is None:
            self.prepare()
        elif torch.get_num_threads() != self._threads:  # the thread policy moved: follow it
            log.debug("ONNX Runtime session reopened with %d threads", torch.get_num_threads())
            self._open()
        feed = {name: batch[name].detach().cpu().to(torch.int64).numpy() for name in INPUTS}
        values = self._session.run(self._outputs, feed)
        return {name: torch.from_numpy(value) for name, value in zip(self._outputs, values, strict=True)}

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 token_type_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.run({"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids})


def _encoder_fusions() -> str:
    """The optimizer's model_type key for Transformer-encoder fusions: the first one its table maps to
    the fusion class `BertOnnxModel` (attention, SkipLayerNorm, BiasGelu), looked up by that class
    rather than spelt out."""
    from onnxruntime.transformers.optimizer import MODEL_TYPES

    return next(name for name, entry in MODEL_TYPES.items() if entry[0].__name__ == "BertOnnxModel")


def _session(path: str | os.PathLike[str], threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: its warnings name graph nodes, nothing a user can act on
    if not _allow_spinning():
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------------------------------------
# calibration: time both engines on this machine
# ------------------------------------------------------------------------------------------------
def calibration_shape(batch_size: int, max_length: int) -> tuple[int, int]:
    """The (batch, length) a calibration times: what a call of this shape class looks like."""
    shape = shape_class(batch_size, max_length)
    if shape == "batch":
        return min(batch_size, 32), min(max_length, 48)  # SST-2 / MRPC dev batches average 25-55 pieces
    return 1, min(max_length, 16 if shape == "single-short" else 128)


def _median_ms(call: Any, repeats: int) -> float:
    call()  # warm-up: kernels built, caches filled
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def calibrate(torch_model: nn.Module, onnx_engine: OnnxEngine, precision: str, *, batch_size: int,
              max_length: int, repeats: int = 5, cache: str | os.PathLike[str] | None = None) -> EngineChoice:
    """Time `torch_model` (already at `precision`) and `onnx_engine` on random batches of this shape
    class and choose the faster; the result is cached per model, machine, threads and shape class in
    the engine's cache folder (calibration.json), so later loads do not time again."""
    import torch

    from bertforge.export import INPUTS, sample_inputs
    from bertforge.precision import cpu_description

    batch, length = calibration_shape(batch_size, max_length)
    machine = cpu_description()
    if onnx_engine.path is None:
        onnx_engine.prepare()
    key = json.dumps({"weights": onnx_engine.weights, "graph": onnx_engine.graph, "precision": precision,
                      "shape": [batch, length], "threads": torch.get_num_threads(), **machine}, sort_keys=True)
    path = Path(cache) if cache is not None else onnx_engine.cache_dir / "calibration.json"
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if key in known:
        timings = known[key]
        how = "calibrated earlier on this machine"
    else:
        inputs = sample_inputs(onnx_engine.module, batch=batch, length=length, seed=0)
        inputs["attention_mask"].fill_(1)  # full rows: the timing is of the shape, not of one padding
        args = tuple(inputs[name] for name in INPUTS)
        module = onnx_engine.module

        def run_torch() -> None:
            with torch.inference_mode():
                module(*args)

        timings = {"torch": _median_ms(run_torch, repeats),
                   "onnxruntime": _median_ms(lambda: onnx_engine(*args), repeats)}
        known[key] = timings
        try:
            from bertforge.fileio import write_text_atomic

            write_text_atomic(path, json.dumps(known, indent=1) + "\n")
        except OSError as exc:  # a read-only cache: the choice stands, it is only not remembered
            log.warning("could not keep the calibration in %s: %s", path, exc)
        how = "calibrated now"
    engine = min(timings, key=timings.get)
    reason = (f"{how} at {batch}x{length}: torch {timings['torch']:.2f} ms, onnxruntime "
              f"{timings['onnxruntime']:.2f} ms per call")
    return EngineChoice(engine, precision, reason, measured=True, source="calibration", timings_ms=dict(timings))




def select_engine(model: nn.Module, requested: str, precision: str, *, graph: str = "head",
                  model_dir: str | os.PathLike[str] | None = None, batch_size: int = 1, max_length: int | None = None,
                  device: str | None = None, saved_int8: bool = False, calibrate_engines: bool = False,
                  excluded_ids: list[int] | None = None, flags: set[str] | None = None,
                  optimize: bool = True) -> tuple[EngineChoice, OnnxEngine | None]:
    """Choose the engine for `model` (loaded at fp32, or a saved int8 copy) and make it ready: the
    ONNX Runtime engine for `graph` prepared (exported or read from the cache), or the model put at the
    chosen precision for torch. With `calibrate_engines` and `requested` auto, both engines are timed
    here instead of reading the table (`calibrate`). The choice is logged with its reason."""
    from bertforge.precision import apply_precision

    choice = choose_engine(requested, precision, batch_size=batch_size, max_length=max_length, device=device,
                           flags=flags, saved_int8=saved_int8)
    onnx: OnnxEngine | None = None
    calibrating = calibrate_engines and choice.source == "table"
    if calibrating or choice.engine == "onnxruntime":
        onnx = OnnxEngine(model, graph, choice.precision, model_dir=model_dir, excluded_ids=excluded_ids,
                          optimize=optimize).prepare()
    if (choice.engine == "torch" or calibrating) and not saved_int8:
        from bertforge.quantization_report import fp32_copy_to_measure, report_int8

        # torchao's int8 in memory measures itself once per weights (quantization_report.json)
        fp32 = fp32_copy_to_measure(model, model_dir, choice.precision, device) if model_dir is not None else None
        apply_precision(model, choice.precision)
        if fp32 is not None and choice.precision == "int8":
            report_int8(fp32, model, model_dir)
    if calibrating:
        assert onnx is not None
        choice = calibrate(model, onnx, choice.precision, batch_size=batch_size, max_length=max_length or 128)
        if choice.engine == "torch":
            onnx = None
    if onnx is not None:
        choice.reason += f"; graph: {onnx.info.get('reason', 'plain')}"
    log.info("%s", choice.describe())
    return choice, onnx


@dataclass(frozen=True)
class EngineRequest:
    """An engine asked for by a caller that loads the model itself: `bertforge.finetune.predict(...,
    engine=EngineRequest("onnxruntime"))` runs a benchmark split's rows through it. `prepare` makes the
    choice for a model loaded at fp32 (or a saved int8 copy) and returns it with the ONNX Runtime engine,
    or None where the model runs itself at the chosen precision (`select_engine`)."""

    engine: str = "auto"
    calibrate: bool = False  # time both engines on this machine instead of reading ENGINE_TABLE (auto only)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:  # a misspelt name fails before any model loads
            raise EngineError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")

    def prepare(self, model: nn.Module, precision: str, *, model_dir: str | os.PathLike[str] | None = None,
                batch_size: int = 1, max_length: int | None = None,
                device: str | None = None) -> tuple[EngineChoice, OnnxEngine | None]:
        from bertforge.precision import is_quantized

        return select_engine(model, self.engine, precision, graph="head", model_dir=model_dir, batch_size=batch_size,
                             max_length=max_length, device=device, saved_int8=is_quantized(model),
                             calibrate_engines=self.calibrate)


__all__ = ["ENGINES", "ENGINE_TABLE", "EngineChoice", "EngineError", "EngineRequest", "OnnxEngine", "calibrate",
           "choose_engine", "cpu_class", "graph_for_task", "select_engine", "shape_class", "weights_digest"]
