"""Hugging Face-layout checkpoints on disk: the key map, reading and writing, and the load report.

This is the I/O layer under the models, as transformers' `modeling_utils`: it knows the file format
and no model class. The model classes import it (their `save_pretrained` / `from_pretrained` call
`save_pretrained` / `load_pretrained` here) and declare as class attributes the facts a load needs
(see `Checkpointable`): where the backbone sits (`base_model_prefix`), which modules are task heads,
and which keys a file may lack or carry without being wrong.

A checkpoint directory holds `config.json`, `model.safetensors` (or shards with an index) and the
tokenizer files. Our modules have short names (and, for BERT, a fused q/k/v projection where Hugging
Face has three). Each family's key map (`KeyLayout`, declared in the family's folder and carried by
its model classes as `key_layout`) is the only place that knows both, so saving and loading cannot
drift apart.

Loading checks before it allocates: the safetensors headers are read first (a truncated file is
named as such), a model that config.json makes bigger than this machine's memory is refused, and
the model is built on the `meta` device so that every shape config.json implies is compared with
the file's. Only then is the model built
for real and the tensors read. A wrong config.json thus ends in one line naming the field, never in
a traceback or a request for terabytes.

Pickle files (`pytorch_model.bin`) can run code when loaded; they are refused unless the caller
says `allow_pickle=True`, and then read with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.overrides import TorchFunctionMode

from bertforge.config import ModelConfig, read_json_object
from bertforge.fileio import atomic_path

if TYPE_CHECKING:
    from bertforge.tokenizer import BertTokenizer

log = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked: missing files, wrong keys or shapes, pickle refused."""


WEIGHT_SUFFIXES = (".safetensors", ".bin")  # the files that hold a checkpoint's weights


def weights_digest(model_dir: str | os.PathLike[str] | None, model: nn.Module | None = None) -> str:
    """SHA-256 of config.json and every weights file in `model_dir` (names and bytes); of the model's
    state dict where there is no directory (a model built in memory)."""
    digest = hashlib.sha256()
    if model_dir is not None:
        directory = Path(model_dir)
        files = sorted(p for p in directory.iterdir() if p.is_file() and (
            p.name == "config.json" or p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json")))
        if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
            raise CheckpointError(f"{directory}: no weights file")
        for path in files:
            digest.update(path.name.encode() + b"\0")
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 22):
                    digest.update(chunk)
        return digest.hexdigest()
    assert model is not None
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + b"\0" + str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        digest.update(tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


class Checkpointable(Protocol):
    """What this module needs of a model: its config, its state dict, and the declared facts below.

    `bertforge.model.base.PreTrainedModel` and each family's classes declare them; each is a tuple of regular expressions
    searched in our key names (`bert.pooler.dense.weight`), except the prefixes.
    """

    config: ModelConfig
    # The family's file layout.
    key_layout: ClassVar[KeyLayout]
    # The attribute that holds the BertModel, and so our state-dict prefix of the backbone's keys;
    # "" when the model is the BertModel itself.
    base_model_prefix: ClassVar[str]
    # Our task-head modules: a file without them loads, and they keep BERT's initialisation.
    head_prefixes: ClassVar[tuple[str, ...]]
    # Other keys of ours that a file may lack (the pooler, say): freshly initialised, reported as new.
    keys_to_ignore_on_load_missing: ClassVar[tuple[str, ...]]
    # Keys a file may carry that this model does not use (a pooler under a head without one): unused.
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]]
    # Keys a file may carry that repeat what the model computes or ties: dropped without a mention.
    keys_redundant_on_load: ClassVar[tuple[str, ...]]

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor], strict: bool = True) -> Any: ...


# ------------------------------------------------------------------------------------------------
# Key layouts. Each family declares one (in its folder's keys.py) and its model classes carry it
# as `key_layout`: the renames between our module names and transformers', where transformers puts
# the backbone, and whether q/k/v are one fused matrix of ours but three of theirs. In a template
# "{i}" is a layer index, "{p}" a parameter name (weight or bias), "{part}" the name of the query, key
# or value projection in their keys (`qkv_names`).
# ------------------------------------------------------------------------------------------------
QKV_PARTS = ("query", "key", "value")  # the order of the rows of a fused q/k/v weight


@dataclass(frozen=True)
class KeyLayout:
    """One family's file layout.

    `renames`: (ours, theirs) templates, relative to the backbone for backbone keys; a key that
    matches none passes unchanged (task heads with transformers' names already). `hf_base_prefix`:
    what transformers puts before the backbone in a model with heads (`bert.`); `backbone_roots`:
    the backbone's top-level names. `fused_qkv`: (ours, theirs) when our one q/k/v matrix is three
    of theirs. `layers_root`: where our distinct layers sit (`encoder.layers.`), to count them.
    `fallbacks`: (ours, theirs) read when the file lacks ours under its usual name (older files).
    `qkv_names`: what "{part}" stands for in their keys, in row order (query, key, value unless the
    family names its projections otherwise: q_lin, k_lin, v_lin, say).
    """

    renames: list[tuple[str, str]]
    hf_base_prefix: str
    backbone_roots: tuple[str, ...]
    layers_root: str
    fused_qkv: tuple[str, str] | None = None
    fallbacks: tuple[tuple[str, str], ...] = ()
    qkv_names: tuple[str, str, str] = QKV_PARTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "_to_hf", [(_template_regex(ours), hf) for ours, hf in self.renames])
        object.__setattr__(self, "_to_ours", [(_template_regex(hf), ours) for ours, hf in self.renames])
        qkv = self.fused_qkv
        object.__setattr__(self, "_ours_qkv", _template_regex(qkv[0]) if qkv else None)
        object.__setattr__(self, "_hf_qkv", _template_regex(qkv[1], self.qkv_names) if qkv else None)
        object.__setattr__(self, "_layer_index", re.compile(rf"(?:^|\.){re.escape(self.layers_root)}(\d+)\."))


def _layout(model: Any) -> KeyLayout:
    """The key layout a model (or model class) declares for its family."""
    return model.key_layout


def _template_regex(template: str, parts: tuple[str, ...] = QKV_PARTS) -> re.Pattern[str]:
    pattern = re.escape(template)
    pattern = pattern.replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    pattern = pattern.replace(r"\{part\}", f"(?P<part>{'|'.join(map(re.escape, parts))})")
    return re.compile(f"^{pattern}$")


def _rename(key: str, table: list[tuple[re.Pattern[str], str]]) -> str:
    for pattern, target in table:
        match = pattern.match(key)
        if match:
            return target.format(**match.groupdict())
    return key  # task heads with Hugging Face names already


def _key_prefix(base_model_prefix: str) -> str:
    """Our state-dict prefix of the backbone's keys: 'bert.' in a model with heads, '' in a BertModel."""
    return f"{base_model_prefix}." if base_model_prefix else ""


# ------------------------------------------------------------------------------------------------
# ours -> Hugging Face
# ------------------------------------------------------------------------------------------------
def to_hf_state_dict(model: Checkpointable) -> dict[str, torch.Tensor]:
    """Our state dict renamed to Hugging Face's keys, q/k/v split, contiguous tensors ready to save."""
    prefix = _key_prefix(model.base_model_prefix)
    layout = _layout(model)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        tensor = tensor.detach()
        local = key[len(prefix):] if prefix and key.startswith(prefix) else key
        hf_prefix = layout.hf_base_prefix if prefix and key.startswith(prefix) else ""
        qkv = layout._ours_qkv.match(local) if layout.fused_qkv else None  # type: ignore[attr-defined]
        if qkv and layout.fused_qkv:  # (3H, H) or (3H,) -> three (H, H) or (H,)
            for part, piece in zip(layout.qkv_names, tensor.chunk(3, dim=0), strict=True):
                name = layout.fused_qkv[1].format(i=qkv["i"], p=qkv["p"], part=part)
                out[hf_prefix + name] = piece.contiguous()
            continue
        out[hf_prefix + _rename(local, layout._to_hf)] = tensor.contiguous()  # type: ignore[attr-defined]
    return out


def save_pretrained(
    model: Checkpointable,
    directory: str | os.PathLike[str],
    tokenizer: BertTokenizer | None = None,
) -> None:
    """Write config.json and model.safetensors (each atomically), and the tokenizer's files if given."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = to_hf_state_dict(model)
    with atomic_path(directory / SAFETENSORS_FILE) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    model.config.to_json_file(directory / "config.json", architectures=[type(model).__name__])
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)


# ------------------------------------------------------------------------------------------------
# Hugging Face -> ours
# ------------------------------------------------------------------------------------------------
@dataclass
class LoadReport:
    """What a load found, sorted into what was expected and what is an error."""

    new_heads: list[str] = field(default_factory=list)  # ours, missing from the file: freshly initialised
    unused: list[str] = field(default_factory=list)  # the file's, for heads this model does not have
    missing: list[str] = field(default_factory=list)  # ours, missing from the file: an error
    unexpected: list[str] = field(default_factory=list)  # the file's, matching nothing: an error

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unexpected

    def summary(self) -> str:
        lines = ["all keys matched"] if self.ok and not self.new_heads and not self.unused else []
        for title, keys in (("newly initialised (expected)", self.new_heads),
                            ("unused heads in the file (expected)", self.unused),
                            ("MISSING from the file", self.missing),
                            ("UNEXPECTED in the file", self.unexpected)):
            if keys:
                shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
                lines.append(f"{title}: {shown}")
        return "\n".join(lines)


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], base_model_prefix: str,
                       layout: KeyLayout) -> dict[str, torch.Tensor]:
    """Rename a Hugging Face state dict to our keys, for a model of `layout`'s family whose backbone
    is `base_model_prefix`."""
    renamed, fused = _hf_keys_to_ours(hf_state, base_model_prefix, layout)
    ours = {name: hf_state[key] for name, key in renamed.items()}
    ours.update({name: torch.cat([hf_state[key] for key in keys], dim=0) for name, keys in fused.items()})
    for name, key in layout.fallbacks:  # an older file keeps this tensor under another name only
        if name not in ours and key in hf_state:
            ours[name] = hf_state[key]
    return ours


def _shapes_as_ours(shapes: dict[str, tuple[int, ...]], base_model_prefix: str,
                    layout: KeyLayout) -> dict[str, tuple[int, ...]]:
    """`from_hf_state_dict` for shapes alone: what the file's tensors will be under our keys."""
    renamed, fused = _hf_keys_to_ours(shapes, base_model_prefix, layout)
    ours = {name: shapes[key] for name, key in renamed.items()}
    for name, keys in fused.items():
        ours[name] = (sum(shapes[key][0] for key in keys), *shapes[keys[0]][1:])
    return ours


def _hf_keys_to_ours(hf_keys: Iterable[str], base_model_prefix: str,
                     layout: KeyLayout) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Our key for each Hugging Face key ({ours: theirs}), and the q/k/v triples fused into one of ours."""
    prefix = _key_prefix(base_model_prefix)
    renamed: dict[str, str] = {}
    qkv_parts: dict[tuple[str, str], dict[str, str]] = {}
    for key in hf_keys:
        local, is_backbone = _strip_backbone_prefix(_tf_layer_norm_names(key), layout)
        qkv = layout._hf_qkv.match(local) if layout.fused_qkv else None  # type: ignore[attr-defined]
        if qkv:
            qkv_parts.setdefault((qkv["i"], qkv["p"]), {})[qkv["part"]] = key
            continue
        name = _rename(local, layout._to_ours)  # type: ignore[attr-defined]
        renamed[(prefix + name) if is_backbone else name] = key
    fused: dict[str, list[str]] = {}
    for (layer, param), parts in qkv_parts.items():
        if len(parts) != 3:
            absent = [p for p in layout.qkv_names if p not in parts]
            raise CheckpointError(f"layer {layer} attention {param}: the file lacks {', '.join(absent)}")
        fused[prefix + layout.fused_qkv[0].format(i=layer, p=param)] = [parts[p] for p in layout.qkv_names]  # type: ignore[index]
    return renamed, fused


def _no_config(directory: Path) -> CheckpointError:
    """The error for a directory without config.json, pointing at the models inside it when it is a
    run directory (`finetune --out runs/x` keeps its models in runs/x/seed-1, ...)."""
    inside = sorted(str(p.parent) for p in directory.glob("*/config.json")) if directory.is_dir() else []
    hint = f" (the models are one level down: {', '.join(inside[:3])})" if inside else ""
    return CheckpointError(f"{directory}: no config.json{hint}")


def read_config_data(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint directory's config.json as a dict (which family it is, the model layer decides)."""
    directory = Path(directory)
    _require_directory(directory)
    if not (directory / "config.json").exists():
        raise _no_config(directory)
    return read_json_object(directory / "config.json")


def read_config(cls: Any, directory: str | os.PathLike[str], **config_overrides: Any) -> ModelConfig:
    """A checkpoint directory's config.json read by `cls`'s config class, with the overrides applied
    (and validated) on top."""
    source = str(Path(directory) / "config.json")
    config = cls.config_class.from_dict(read_config_data(directory), source=source)
    if config_overrides:
        config = type(config).from_dict({**config.to_dict(), **config_overrides}, source=source)
    return config


def read_architectures(directory: str | os.PathLike[str]) -> list[str]:
    """The class names config.json's `architectures` lists (empty when it lists none)."""
    path = Path(directory) / "config.json"
    if not path.exists():
        raise _no_config(Path(directory))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}:{exc.lineno}: invalid JSON ({exc.msg})") from exc
    architectures = data.get("architectures") if isinstance(data, dict) else None
    return [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []


ModelT = TypeVar("ModelT", bound=nn.Module)  # a model class that is also Checkpointable


def load_pretrained(
    cls: type[ModelT],
    directory: str | os.PathLike[str],
    *,
    strict: bool = True,
    allow_pickle: bool = False,
    **config_overrides: Any,
) -> tuple[ModelT, LoadReport]:
    """Build `cls` from a directory's config.json and load its weights; return both and the report.

    Everything that can be checked without allocating is checked first (see the module docstring):
    `cls` is built on the `meta` device for that, then once for real, which gives new heads BERT's
    initialisation. The caller keeps the report (`BertPreTrainedModel.from_pretrained` puts it on
    `model.load_report`).
    """
    directory = Path(directory)
    config = read_config(cls, directory, **config_overrides)
    weights = WeightFiles.find(directory, allow_pickle=allow_pickle)
    check_fits(cls, config, weights)
    model = cls(config)
    return model, _load_files(model, weights, strict=strict)  # type: ignore[arg-type]


def load_weights_into(model: Checkpointable, directory: str | os.PathLike[str], *, strict: bool = True,
                      allow_pickle: bool = False) -> LoadReport:
    """Copy a checkpoint directory's weights into a model already built (from a recipe, for continued
    pre-training) and return the report.

    The model's config decides the architecture; every backbone weight must be in the file with the
    same shape. Heads the file lacks keep their fresh initialisation (and are listed in the report).
    """
    return _load_files(model, WeightFiles.find(Path(directory), allow_pickle=allow_pickle), strict=strict)


def _load_files(model: Checkpointable, weights: WeightFiles, *, strict: bool) -> LoadReport:
    directory = weights.directory
    state = from_hf_state_dict(weights.read(), model.base_model_prefix, _layout(model))
    report = _load_into(model, state, source=directory)
    if not report.ok:
        message = f"{directory}: checkpoint does not fit {type(model).__name__}\n{report.summary()}"
        if strict:
            raise CheckpointError(message + "\n(pass strict=False to load anyway)")
        log.warning(message)
    elif report.new_heads:
        log.info("%s: newly initialised %s", directory, ", ".join(report.new_heads))
    return report


def _require_directory(directory: Path) -> None:
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: not a directory (expected config.json + model.safetensors)")


# ------------------------------------------------------------------------------------------------
# The weight files, and the checks made before anything is allocated
# ------------------------------------------------------------------------------------------------
@dataclass
class WeightFiles:
    """A checkpoint directory's weight files: found, and for safetensors their headers read; the
    tensors themselves are read by `read`."""

    directory: Path
    paths: list[Path]
    name: str  # how messages call them: model.safetensors, the shards of an index, pytorch_model.bin
    pickled: bool = False
    _pickled_state: dict[str, torch.Tensor] | None = field(default=None, repr=False, init=False)

    @classmethod
    def find(cls, directory: Path, *, allow_pickle: bool = False) -> WeightFiles:
        _require_directory(directory)
        if (directory / SAFETENSORS_FILE).exists():
            return cls(directory, [directory / SAFETENSORS_FILE], SAFETENSORS_FILE)
        if (directory / SAFETENSORS_INDEX).exists():
            return cls(directory, _shards(directory, SAFETENSORS_INDEX), f"the shards of {SAFETENSORS_INDEX}")
        pickled = [name for name in (PICKLE_FILE, PICKLE_INDEX) if (directory / name).exists()]
        if not pickled:
            raise CheckpointError(f"{directory}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {PICKLE_FILE}")
        if not allow_pickle:
            raise CheckpointError(
                f"{directory / pickled[0]} is a pickle file, which can run arbitrary code when loaded. "
                "If you trust it, pass allow_pickle=True (Python API); it is then read with "
                "torch.load(weights_only=True). Better: convert it once to safetensors."
            )
        if pickled[0] == PICKLE_FILE:
            return cls(directory, [directory / PICKLE_FILE], PICKLE_FILE, pickled=True)
        return cls(directory, _shards(directory, PICKLE_INDEX), f"the shards of {PICKLE_INDEX}", pickled=True)

    def nbytes(self) -> int:
        return sum(path.stat().st_size for path in self.paths)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape under its Hugging Face key; safetensors answer from their headers."""
        if self.pickled:  # a pickle has no header: its tensors must be read to be seen
            return {key: tuple(tensor.shape) for key, tensor in self.read().items()}
        shapes: dict[str, tuple[int, ...]] = {}
        for path in self.paths:
            shapes.update(read_safetensors_header(path))
        return shapes

    def read(self) -> dict[str, torch.Tensor]:
        """All tensors, on the CPU."""
        if self.pickled:
            if self._pickled_state is None:
                self._pickled_state = {}
                for path in self.paths:
                    self._pickled_state.update(torch.load(path, map_location="cpu", weights_only=True))
            return self._pickled_state
        state: dict[str, torch.Tensor] = {}
        for path in self.paths:
            read_safetensors_header(path)  # a truncated file is named as such, not left to the reader
            state.update(load_file(str(path)))
        return state


def read_state_dict(directory: Path, *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: safetensors (single or sharded), else pickle if allowed."""
    return WeightFiles.find(Path(directory), allow_pickle=allow_pickle).read()


def _shards(directory: Path, index_name: str) -> list[Path]:
    index_path = directory / index_name
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index_path}: not a shard index with a 'weight_map' ({exc})") from exc
    shards = []
    for shard in sorted(set(weight_map.values())):
        if not (directory / shard).exists():
            raise CheckpointError(f"{index_path}: names shard {shard}, which is not in {directory}")
        shards.append(directory / shard)
    return shards


def read_safetensors_header(path: Path) -> dict[str, tuple[int, ...]]:
    """A safetensors file's tensor shapes, from its header alone (stdlib only), checking that the file
    is as long as the header says: 8 bytes of header length, the JSON header, then the data."""
    size = path.stat().st_size
    with path.open("rb") as file:
        length_bytes = file.read(8)
        if len(length_bytes) < 8:
            raise CheckpointError(f"{path}: truncated: {size} bytes, not even the 8-byte header length")
        header_end = 8 + int.from_bytes(length_bytes, "little")
        if header_end > size:
            raise CheckpointError(f"{path}: truncated: header describes {header_end} bytes, file has {size}")
        try:
            header = json.loads(file.read(header_end - 8))
            tensors = {key: value for key, value in header.items() if key != "__metadata__"}
            shapes = {key: tuple(int(n) for n in value["shape"]) for key, value in tensors.items()}
            data_end = max((int(value["data_offsets"][1]) for value in tensors.values()), default=0)
        except (ValueError, AttributeError, KeyError, TypeError, IndexError) as exc:
            raise CheckpointError(f"{path}: not a safetensors file (unreadable header: {exc})") from exc
    if header_end + data_end > size:
        raise CheckpointError(f"{path}: truncated: header describes {header_end + data_end} bytes, file has {size}")
    return shapes


def check_fits(cls: type[nn.Module], config: ModelConfig, weights: WeightFiles) -> None:
    """Raise a one-line CheckpointError if `config` cannot describe these weights or this machine
    cannot hold the model, without allocating the model: `cls` is built on the `meta` device only."""
    layout = _layout(cls)
    in_file = _shapes_as_ours(weights.shapes(), cls.base_model_prefix, layout)  # type: ignore[attr-defined]
    needed = config.estimated_parameter_count() * torch.get_default_dtype().itemsize
    memory = _physical_memory()
    too_big = memory is not None and needed > memory
    # A model too big for this machine is still compared with the file first, for the more precise
    # message, when that is cheap: building on `meta` costs time per layer, so not for a layer count
    # beyond what the file holds, and it fails for a tensor past 2**63 bytes.
    if too_big and config.hidden_groups > _stored_layers(in_file, layout):
        raise CheckpointError(_too_big_message(config, weights, needed, memory))
    try:
        skeleton = _on_meta(cls, config)
    except RuntimeError:
        if too_big:
            raise CheckpointError(_too_big_message(config, weights, needed, memory)) from None
        raise
    for key, tensor in skeleton.state_dict().items():
        if key in in_file and in_file[key] != tuple(tensor.shape):
            raise CheckpointError(_disagreement(cls, config, weights, key, in_file[key], tuple(tensor.shape)))
    if too_big:
        raise CheckpointError(_too_big_message(config, weights, needed, memory))


def _on_meta(cls: type[nn.Module], config: ModelConfig) -> nn.Module:
    """`cls(config)` as shapes only: on the `meta` device, which allocates nothing."""
    with torch.device("meta"), _NoRandomFill():
        return cls(config)  # type: ignore[call-arg]


class _NoRandomFill(TorchFunctionMode):
    """Random initialisation as a no-op on `meta` tensors: there are no values to fill, and the first
    such call in a process imports torch._dynamo, which would add about two seconds to every load."""

    # torch.nn.init's functions as well as the tensor methods: a mode does not see the calls made
    # inside a function it has handled.
    RANDOM_FILLS = {"normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_",
                    "xavier_uniform_", "xavier_normal_"}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes it by keyword
        if getattr(func, "__name__", None) in self.RANDOM_FILLS and getattr(target, "is_meta", False):
            return target
        return func(*args, **kwargs)


def _stored_layers(shapes: dict[str, tuple[int, ...]], layout: KeyLayout) -> int:
    pattern = layout._layer_index  # type: ignore[attr-defined]
    return len({match[1] for key in shapes if (match := pattern.search(key))})


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not on this platform: no limit known
        return None


def _too_big_message(config: ModelConfig, weights: WeightFiles, needed: int, memory: int | None) -> str:
    names = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"]
    names += [name for name in ("embedding_size", "num_hidden_groups") if getattr(config, name) is not None]
    sizes = ", ".join(f"{name} {getattr(config, name)}" for name in names)
    message = (f"{weights.directory / 'config.json'}: describes a model of {_bytes(needed)} "
               f"({sizes}), more than this machine's memory ({_bytes(memory or 0)})")
    held = weights.nbytes()
    if held < needed / 2:
        message += f", while {weights.name} holds {_bytes(held)}: does config.json match the weights?"
    return message


def _disagreement(cls: type[nn.Module], config: ModelConfig, weights: WeightFiles, key: str,
                  in_file: tuple[int, ...], from_config: tuple[int, ...]) -> str:
    shapes = f"{key} has shape {list(in_file)} in the file, {list(from_config)} from the config"
    culprit = _field_behind(cls, config, key, in_file, from_config)
    if culprit is None:
        return f"{weights.directory / 'config.json'} disagrees with {weights.name}: {shapes}"
    return (f"{weights.directory / 'config.json'}: {culprit} {getattr(config, culprit)} disagrees with "
            f"{weights.name}: {shapes}")


def _field_behind(cls: type[nn.Module], config: ModelConfig, key: str, in_file: tuple[int, ...],
                  from_config: tuple[int, ...]) -> str | None:
    """The config field that, set to the file's size, gives `key` the file's shape (None if no single one).

    Tried rather than guessed: a field whose value merely equals the wrong size (type_vocab_size 2
    against a 2-label classifier) is not blamed unless changing it really fixes the shape.
    """
    if len(in_file) != len(from_config):
        return None
    for want, have in zip(in_file, from_config, strict=True):
        if want == have:
            continue
        for candidate in dataclasses.fields(config):
            value = getattr(config, candidate.name)
            if candidate.name == "extra" or isinstance(value, bool) or value != have:
                continue
            try:
                changed = dataclasses.replace(config, **{candidate.name: want})
                tensor = _on_meta(cls, changed).state_dict().get(key)
            except (ValueError, RuntimeError):  # not a valid value here (heads must divide H, say)
                continue
            if tensor is not None and tuple(tensor.shape) == in_file:
                return candidate.name
    return None


def _bytes(count: float) -> str:
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:,.0f} PB"


# ------------------------------------------------------------------------------------------------
# Sorting the keys
# ------------------------------------------------------------------------------------------------
def _load_into(model: Checkpointable, state: dict[str, torch.Tensor], source: Path) -> LoadReport:
    """Copy tensors into the model (casting dtype), checking shapes, and sort the key differences
    by what the model declares (see `Checkpointable`)."""
    own = model.state_dict()
    report = LoadReport()
    prefix = _key_prefix(model.base_model_prefix)
    for key in own.keys() - state.keys():
        if key.startswith(model.head_prefixes) or _matches(key, model.keys_to_ignore_on_load_missing):
            report.new_heads.append(key)
        else:
            report.missing.append(key)
    for key in state.keys() - own.keys():
        local = key[len(prefix):] if prefix and key.startswith(prefix) else key
        if _matches(key, model.keys_redundant_on_load):
            continue
        # Weights of a head this model does not have (pre-training heads under a bare encoder, say),
        # or keys the model declares it does not use: not needed, not wrong.
        if not local.startswith(_layout(model).backbone_roots) or _matches(
                key, model.keys_to_ignore_on_load_unexpected):
            report.unused.append(key)
        else:
            report.unexpected.append(key)
    for key in own.keys() & state.keys():
        if own[key].shape != state[key].shape:
            raise CheckpointError(
                f"{source}: {key} has shape {list(state[key].shape)} in the file but "
                f"{list(own[key].shape)} in the model (does config.json match the weights?)"
            )
    loadable = {k: v for k, v in state.items() if k in own}
    model.load_state_dict(loadable, strict=False)
    for field_list in (report.new_heads, report.unused, report.missing, report.unexpected):
        field_list.sort()
    return report


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(re.search(pattern, key) for pattern in patterns)


def _strip_backbone_prefix(key: str, layout: KeyLayout) -> tuple[str, bool]:
    """A Hugging Face key without its backbone prefix ('bert.'), and whether it belongs to the backbone."""
    if key.startswith(layout.hf_base_prefix):
        return key[len(layout.hf_base_prefix):], True
    return key, key.startswith(layout.backbone_roots)


def _tf_layer_norm_names(key: str) -> str:
    """TensorFlow-era conversions name LayerNorm parameters gamma/beta."""
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
