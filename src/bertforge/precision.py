"""Inference at a chosen numeric precision: fp32, bf16 or int8, and `auto` to pick by the CPU.

- `fp32`: the weights as trained.
- `bf16`: every weight cast to bfloat16 once (not autocast, which casts the weights again on every
  call). The packed per-sequence attention is unchanged. PyTorch's CPU kernels for LayerNorm and
  for scaled-dot-product attention accumulate bf16 inputs in fp32 (their "opmath" type), so no
  module needs to be kept in fp32 by hand; the residual stream between layers is bf16. Outputs are
  handed back as fp32, so callers (numpy, metrics) see the same dtype at every precision.
- `int8`: dynamic quantization of the encoder's Linear layers with torchao (int8 weights per output
  channel, activations quantized per token on every call, int8 x int8 matrix products with int32
  accumulation), but the feed-forward output projections, whose GELU inputs carry the outliers that
  per-token int8 handles worst (Bondarenko et al., 2021): kept fp32 they cost no measured speed and
  keep labels int8 would flip (docs/precision.md). Embeddings, LayerNorm, attention and the task head
  stay fp32. No hand-written kernels.
- `auto`: bf16 where the CPU has native bf16 matrix instructions (AMX-BF16 or AVX512-BF16), else fp32.
  Without them bf16 is emulated and slower than fp32. On a GPU: bf16 where it is supported.

A quantized model can be saved and loaded without pickle: torchao's own safetensors layout (int8
data and scales as plain tensors, the tensor subclass named in the header's JSON metadata) in
`model.int8.safetensors`, beside a config.json that records the recipe under `bertforge_quantization`.
"""

from __future__ import annotations

import json
import os
import platform
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.fileio import atomic_path
from bertforge.model.auto import load_any, model_class, read_config
from bertforge.model.base import PreTrainedModel

PRECISIONS = ("auto", "fp32", "bf16", "int8")
# CPU flags (as /proc/cpuinfo spells them) that give native bf16 matrix products.
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
# The flags worth naming beside any timing: bf16 and int8 matrix instructions.
RELEVANT_FLAGS = ("avx512_bf16", "amx_bf16", "amx_int8", "amx_tile", "avx512_vnni", "avx_vnni", "avx512f", "avx2")

QUANTIZED_WEIGHTS = "model.int8.safetensors"
QUANTIZATION_KEY = "bertforge_quantization"  # the config.json entry of a quantized copy


class PrecisionError(ValueError):
    """An unknown precision, or a saved quantized model that cannot be read."""


CPUINFO = "/proc/cpuinfo"
# numpy's own CPU detection (the cpuid instruction, at import) -> the flag names of /proc/cpuinfo
CPUID_FLAGS = {"AVX2": "avx2", "AVX512F": "avx512f", "AVX512VNNI": "avx512_vnni", "AVX512BF16": "avx512_bf16"}


def cpu_flags(cpuinfo: str | os.PathLike[str] | None = None) -> set[str]:
    """The CPU's feature flags as Linux lists them (`avx512_bf16`, `amx_bf16`, ...); empty where unknown.

    This machine's (no argument): /proc/cpuinfo's flags line, corrected by what the cpuid instruction
    reports for the flags numpy detects (`as_cpuid_sees`), since kernels pick their instructions by
    cpuid: under user-mode emulation (`qemu-x86_64 -cpu Haswell`) /proc/cpuinfo shows the host's
    flags, and off Linux there is no /proc/cpuinfo at all. `cpuinfo` reads that file alone.
    """
    flags = _flags_line(Path(cpuinfo if cpuinfo is not None else CPUINFO))
    return flags if cpuinfo is not None else as_cpuid_sees(flags, cpuid_flags())


def _flags_line(path: Path) -> set[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def cpuid_flags() -> dict[str, bool]:
    """{flag: present} for the flags of CPUID_FLAGS, as numpy's runtime detection found them (empty
    where numpy does not say)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            return {}
    return {name: bool(features[key]) for key, name in CPUID_FLAGS.items() if key in features}


# matrix-instruction flags numpy cannot check: kept from /proc/cpuinfo only while it agrees with cpuid
UNCHECKED_MATRIX_FLAGS = ("avx_vnni", "amx_")


def as_cpuid_sees(flags: set[str], cpuid: dict[str, bool]) -> set[str]:
    """`flags` with each flag cpuid has an answer for set by that answer. Where cpuid contradicts the
    file on any of them, the file describes another CPU (the host of an emulator or VM): its flags that
    cpuid cannot confirm (AVX-VNNI, AMX) are dropped too, and without AVX-512 no avx512_* flag stays."""
    seen = {flag for flag in flags if cpuid.get(flag, True)} | {flag for flag, present in cpuid.items() if present}
    if any((flag in flags) != present for flag, present in cpuid.items()):
        seen = {flag for flag in seen if not flag.startswith(UNCHECKED_MATRIX_FLAGS)}
    if cpuid.get("avx512f") is False:
        seen = {flag for flag in seen if not flag.startswith("avx512")}
    return seen



def cpu_name(cpuinfo: str | os.PathLike[str] = "/proc/cpuinfo") -> str:
    try:
        for line in Path(cpuinfo).read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_description(flags: set[str] | None = None) -> dict[str, Any]:
    """The CPU's name and its precision-relevant flags, to record beside any result or timing."""
    flags = cpu_flags() if flags is None else flags
    return {"cpu": cpu_name(), "cpu_flags": [flag for flag in RELEVANT_FLAGS if flag in flags]}


def choose_precision(requested: str, flags: set[str] | None = None, device: str | torch.device = "cpu") -> str:
    """The precision to run: `requested` itself, or for `auto` bf16 where it is native, else fp32.

    `flags` are the CPU's (default: this machine's, from `cpu_flags`); give a set to ask about another CPU.
    """
    if requested not in PRECISIONS:
        raise PrecisionError(f"unknown precision {requested!r}; choose one of {', '.join(PRECISIONS)}")
    if requested != "auto":
        return requested
    if torch.device(device).type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    flags = cpu_flags() if flags is None else flags
    return "bf16" if flags & NATIVE_BF16_FLAGS else "fp32"


def apply_precision(model: nn.Module, precision: str, flags: set[str] | None = None) -> tuple[nn.Module, str]:
    """Make `model` ready for inference at `precision` ("auto" resolved by the CPU's flags).

    Returns the model (in eval mode; changed in place) and the precision actually used. The model's
    outputs are fp32 at every precision. A model that is already int8 (a loaded quantized copy)
    stays int8 whatever is asked, since its fp32 weights are gone: the returned precision says so.
    """
    model.eval()
    if is_quantized(model):
        return model, "int8"
    device = next(model.parameters()).device
    used = choose_precision(precision, flags, device)
    if used == "fp32":
        model.float()
    elif used == "bf16":
        model.to(torch.bfloat16)
        _return_fp32_outputs(model)
    else:
        model.float()
        _quantize_int8(model)
    return model, used


def model_precision(model: nn.Module) -> str:
    """The precision a model runs at, read from its weights: int8, bf16 or fp32."""
    if is_quantized(model):
        return "int8"
    dtype = next(model.parameters()).dtype
    return "bf16" if dtype == torch.bfloat16 else "fp32"


def is_quantized(model: nn.Module) -> bool:
    return any(_is_int8_weight(module.weight) for module in model.modules() if isinstance(module, nn.Linear))


# --- bf16 ---------------------------------------------------------------------------------------


def _return_fp32_outputs(model: nn.Module) -> None:
    """Hand the outputs of `model` back as fp32 (logits, hidden states, ...), whichever BERT model
    inside it is called: callers such as feature extraction run the backbone directly.

    Each `PreTrainedModel` inside gets a pair of hooks sharing one depth count, so only the
    outermost call converts: a head called on its backbone's output still sees bf16 there.
    """
    depth = [0]

    def enter(module: nn.Module, args: Any) -> None:
        depth[0] += 1

    def leave(module: nn.Module, args: Any, output: Any) -> Any:
        depth[0] -= 1
        return _to_fp32(output) if depth[0] == 0 else output

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and not getattr(module, "_fp32_output_hooks", False):
            module.register_forward_pre_hook(enter)
            module.register_forward_hook(leave, always_call=True)
            module._fp32_output_hooks = True  # type: ignore[assignment]


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() and value.dtype != torch.float32 else value
    if isinstance(value, tuple):
        return tuple(_to_fp32(item) for item in value)
    if isinstance(value, list):
        return [_to_fp32(item) for item in value]
    if hasattr(value, "__dataclass_fields__"):
        for name in value.__dataclass_fields__:
            setattr(value, name, _to_fp32(getattr(value, name)))
    return value


# --- int8 ---------------------------------------------------------------------------------------


def _quiet_torchao() -> Any:
    """Import torchao's quantization API, silencing its notices about GPU-only kernels it cannot load."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import logging

        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            import torchao.quantization as quantization
        finally:
            logging.disable(previous)
    return quantization


def _encoder_linears(model: nn.Module, *, ffn_output: bool = True) -> set[int]:
    """Which Linear layers int8 covers: those of the Transformer layers (q/k/v, attention output,
    feed-forward), where nearly all the compute is, as each family declares them
    (`transformer_layers`). The task head and pooler are a few thousand multiply-adds per sequence
    and stay fp32. `ffn_output=False` leaves out the feed-forward output projections: in every family
    the one Linear of a layer with more inputs than outputs (intermediate size -> hidden size)."""
    found: set[int] = set()
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and module.base_model is module:  # each backbone inside
            for layer in module.transformer_layers():
                found.update(id(linear) for linear in layer.modules() if isinstance(linear, nn.Linear)
                             and (ffn_output or linear.in_features <= linear.out_features))
    return found


def _quantize_int8(model: nn.Module, *, ffn_output: bool = False) -> None:
    """torchao's dynamic int8 on the encoder's Linear layers; the feed-forward output projections stay
    fp32 unless `ffn_output` (how int8 copies saved before they did were made)."""
    quantization = _quiet_torchao()
    config = quantization.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    covered = _encoder_linears(model, ffn_output=ffn_output)
    quantization.quantize_(model, config, filter_fn=lambda module, fqn: id(module) in covered)


def _is_int8_weight(weight: torch.Tensor) -> bool:
    return type(weight).__name__ == "Int8Tensor"


TORCH_INT8_PATH = "torch int8 (torchao)"
TORCH_INT8_RECIPE = ("encoder Linear layers but the feed-forward output projections: int8 weights per output "
                     "channel, int8 activations per token (dynamic); feed-forward output projections, "
                     "embeddings, LayerNorm, attention, pooler and head fp32")


def save_quantized(model: nn.Module, directory: str | os.PathLike[str], tokenizer: Any = None) -> Path:
    """Save an int8 model: config.json with the recipe, its weights in torchao's safetensors layout.

    The file holds plain tensors (int8 data, fp32 scales) plus JSON that names torchao's tensor
    class; loading rebuilds the classes from an allow-list, so nothing is unpickled.
    """
    from safetensors.torch import save_file
    from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

    if not is_quantized(model):
        raise PrecisionError("save_quantized needs an int8 model (apply_precision(model, 'int8') first)")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config  # type: ignore[attr-defined]
    config.extra[QUANTIZATION_KEY] = _recipe()
    try:
        config.to_json_file(directory / "config.json", architectures=[type(model).__name__])
    finally:
        config.extra.pop(QUANTIZATION_KEY, None)
    data, metadata = flatten_tensor_state_dict(model.state_dict())
    data = {key: value.contiguous() for key, value in data.items()}
    with atomic_path(directory / QUANTIZED_WEIGHTS) as tmp:
        save_file(data, str(tmp), metadata=metadata)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


# what a model directory holds beside its weights that says how to use it: the task settings predict
# reads, and sentence-transformers' module files (pooling, normalisation, length)
SIDECAR_FILES = ("task.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def copy_sidecars(source: str | os.PathLike[str], directory: str | os.PathLike[str]) -> list[str]:
    """Copy the task and sentence-transformers files of `source` into the int8 copy `directory`."""
    import shutil

    source, directory = Path(source), Path(directory)
    copied = []
    for name in SIDECAR_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, directory / name)
            copied.append(name)
    for module in sorted(source.glob("[0-9]_*")):  # 1_Pooling/, 2_Normalize/
        if module.is_dir():
            shutil.copytree(module, directory / module.name, dirs_exist_ok=True)
            copied.append(module.name)
    return copied


def _recipe() -> dict[str, Any]:
    import torchao

    return {"precision": "int8", "method": "dynamic int8 activations per token, int8 weights per channel",
            "library": "torchao", "library_version": torchao.__version__,
            "modules": "encoder Linear layers but the feed-forward output projections",
            "fp32_modules": FP32_MODULES, "weights": QUANTIZED_WEIGHTS}


FP32_MODULES = "feed-forward output projections"  # in the recipe of int8 copies that keep them fp32


def is_quantized_checkpoint(directory: str | os.PathLike[str]) -> bool:
    path = Path(directory) / "config.json"
    try:
        return QUANTIZATION_KEY in json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def load_quantized(directory: str | os.PathLike[str]) -> nn.Module:
    """Load a model saved by `save_quantized`: build it from config.json, quantize the same layers,
    then put the file's int8 data and scales in place."""
    from safetensors import safe_open
    from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

    directory = Path(directory)
    weights = directory / QUANTIZED_WEIGHTS
    if not weights.is_file():
        raise PrecisionError(f"{weights}: missing (config.json says this is an int8 model)")
    config = read_config(directory)
    recipe = config.extra.pop(QUANTIZATION_KEY, None) or {}
    model = model_class(directory)(config)
    # a copy saved before the feed-forward output projections stayed fp32 has them int8
    _quantize_int8(model, ffn_output=recipe.get("fp32_modules") != FP32_MODULES)
    try:
        with safe_open(str(weights), framework="pt") as handle:
            metadata = handle.metadata() or {}
            data = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (safe_open is not a dict)
        state, leftover = unflatten_tensor_state_dict(data, metadata)
    except (OSError, ValueError, KeyError) as exc:
        raise PrecisionError(f"{weights}: not a quantized bertforge model ({exc})") from exc
    if leftover:
        raise PrecisionError(f"{weights}: tensors this model does not have: {sorted(leftover)[:5]}")
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise PrecisionError(f"{weights}: missing tensors: {sorted(missing)[:5]}")
    model.load_state_dict(state, assign=True)
    return model.eval()


def load_model(directory: str | os.PathLike[str], precision: str = "auto", **kwargs: Any) -> tuple[nn.Module, str]:
    """Load a checkpoint for inference at `precision`: a normal checkpoint (any precision) or a saved
    int8 copy, which runs int8 whatever is asked (its fp32 weights are gone). Returns the model and
    the precision used; `kwargs` go to `load_any`."""
    choose_precision(precision)  # reject an unknown name before loading anything
    if is_quantized_checkpoint(directory):
        return load_quantized(directory), "int8"
    model, _ = load_any(directory, **kwargs)
    return apply_precision(model, precision)
