"""Hugging Face-layout checkpoints: one key map between our module names and theirs, used both ways.

A checkpoint directory holds `config.json`, `model.safetensors` (or shards with an index) and the
tokenizer files. Our modules have short names and a fused q/k/v projection; Hugging Face's have
`encoder.layer.{i}.attention.self.{query,key,value}` and so on. `KEY_MAP` below is the only place
that knows both, so saving and loading cannot drift apart.

Pickle files (`pytorch_model.bin`) can run code when loaded; they are refused unless the caller
says `allow_pickle=True`, and then read with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file

from bertforge.config import BertConfig
from bertforge.fileio import atomic_path

if TYPE_CHECKING:
    from bertforge.model.bert import BertPreTrainedModel
    from bertforge.tokenizer import BertTokenizer

log = logging.getLogger(__name__)

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_FILE = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked: missing files, wrong keys or shapes, pickle refused."""


# ------------------------------------------------------------------------------------------------
# The key map. "{i}" is a layer index, "{p}" a parameter name (weight or bias).
# Backbone names are relative to the encoder (ours: `bert.` inside a model with heads, nothing in a
# bare BertModel; theirs: `bert.` likewise). The fused q/k/v is the one row that is not a rename.
# Family switches add rows but no new layout: ALBERT's factorised embeddings add the E -> H
# projection (named as in Hugging Face's ALBERT), and with shared layers `{i}` counts the G distinct
# layers. Such checkpoints do not load in transformers.BertModel (see BertConfig.transformers_incompatibilities).
# ------------------------------------------------------------------------------------------------
KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.layer_norm.{p}", "embeddings.LayerNorm.{p}"),
    ("embeddings.projection.{p}", "encoder.embedding_hidden_mapping_in.{p}"),
    ("encoder.layers.{i}.attention.out.{p}", "encoder.layer.{i}.attention.output.dense.{p}"),
    ("encoder.layers.{i}.attention_norm.{p}", "encoder.layer.{i}.attention.output.LayerNorm.{p}"),
    ("encoder.layers.{i}.ffn.up.{p}", "encoder.layer.{i}.intermediate.dense.{p}"),
    ("encoder.layers.{i}.ffn.down.{p}", "encoder.layer.{i}.output.dense.{p}"),
    ("encoder.layers.{i}.ffn_norm.{p}", "encoder.layer.{i}.output.LayerNorm.{p}"),
    ("pooler.dense.{p}", "pooler.dense.{p}"),
]
FUSED_QKV = ("encoder.layers.{i}.attention.qkv.{p}", "encoder.layer.{i}.attention.self.{part}.{p}")
QKV_PARTS = ("query", "key", "value")  # the order of the rows of our fused weight

# Heads sit beside the backbone (ours: `mlm.`, `nsp.`, `sbo.`; theirs: `cls.`). Task heads that are not
# listed (`classifier`, `qa_outputs`) already use Hugging Face's names and pass through unchanged.
# transformers has no span-boundary head: it reports `cls.span_boundary.*` as unused and loads the rest.
HEAD_KEY_MAP: list[tuple[str, str]] = [
    ("mlm.transform.dense.{p}", "cls.predictions.transform.dense.{p}"),
    ("mlm.transform.layer_norm.{p}", "cls.predictions.transform.LayerNorm.{p}"),
    ("mlm.bias", "cls.predictions.bias"),
    ("nsp.{p}", "cls.seq_relationship.{p}"),
    ("sbo.position_embeddings.weight", "cls.span_boundary.position_embeddings.weight"),
    ("sbo.transform.dense1.{p}", "cls.span_boundary.transform.dense1.{p}"),
    ("sbo.transform.layer_norm1.{p}", "cls.span_boundary.transform.LayerNorm1.{p}"),
    ("sbo.transform.dense2.{p}", "cls.span_boundary.transform.dense2.{p}"),
    ("sbo.transform.layer_norm2.{p}", "cls.span_boundary.transform.LayerNorm2.{p}"),
]

# Hugging Face keys that carry nothing we need: a buffer, and the decoder tied to the embeddings.
HF_REDUNDANT = re.compile(r"(^|\.)embeddings\.position_ids$|^cls\.predictions\.decoder\.(weight|bias)$")
HF_BACKBONE_ROOTS = ("embeddings.", "encoder.", "pooler.")


def _template_regex(template: str) -> re.Pattern[str]:
    pattern = re.escape(template)
    pattern = pattern.replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    pattern = pattern.replace(r"\{part\}", r"(?P<part>query|key|value)")
    return re.compile(f"^{pattern}$")


_OURS_TO_HF = [(_template_regex(ours), hf) for ours, hf in KEY_MAP + HEAD_KEY_MAP]
_HF_TO_OURS = [(_template_regex(hf), ours) for ours, hf in KEY_MAP + HEAD_KEY_MAP]
_OURS_QKV = _template_regex(FUSED_QKV[0])
_HF_QKV = _template_regex(FUSED_QKV[1])


def _rename(key: str, table: list[tuple[re.Pattern[str], str]]) -> str:
    for pattern, target in table:
        match = pattern.match(key)
        if match:
            return target.format(**match.groupdict())
    return key  # task heads with Hugging Face names already


# ------------------------------------------------------------------------------------------------
# ours -> Hugging Face
# ------------------------------------------------------------------------------------------------
def to_hf_state_dict(model: BertPreTrainedModel) -> dict[str, torch.Tensor]:
    """Our state dict renamed to Hugging Face's keys, q/k/v split, contiguous tensors ready to save."""
    prefix = _backbone_prefix(model)
    out: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        tensor = tensor.detach()
        local = key[len(prefix):] if prefix and key.startswith(prefix) else key
        hf_prefix = prefix if key.startswith(prefix) else ""
        qkv = _OURS_QKV.match(local)
        if qkv:  # (3H, H) or (3H,) -> three (H, H) or (H,)
            for part, piece in zip(QKV_PARTS, tensor.chunk(3, dim=0), strict=True):
                name = FUSED_QKV[1].format(i=qkv["i"], p=qkv["p"], part=part)
                out[hf_prefix + name] = piece.contiguous()
            continue
        out[hf_prefix + _rename(local, _OURS_TO_HF)] = tensor.contiguous()
    return out


def save_pretrained(
    model: BertPreTrainedModel,
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


def from_hf_state_dict(
    hf_state: dict[str, torch.Tensor], model: BertPreTrainedModel
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename a Hugging Face state dict to our keys for `model`; also return the keys dropped as redundant."""
    prefix = _backbone_prefix(model)
    ours: dict[str, torch.Tensor] = {}
    qkv_parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    redundant = []
    for key, tensor in hf_state.items():
        key = _modernise(key)
        if HF_REDUNDANT.search(key):
            redundant.append(key)
            continue
        local, is_backbone = _strip_backbone_prefix(key)
        qkv = _HF_QKV.match(local)
        if qkv:
            qkv_parts.setdefault((qkv["i"], qkv["p"]), {})[qkv["part"]] = tensor
            continue
        name = _rename(local, _HF_TO_OURS)
        ours[(prefix + name) if is_backbone else name] = tensor
    for (layer, param), parts in qkv_parts.items():
        name = prefix + FUSED_QKV[0].format(i=layer, p=param)
        if len(parts) != 3:
            absent = [p for p in QKV_PARTS if p not in parts]
            raise CheckpointError(f"layer {layer} attention {param}: the file lacks {', '.join(absent)}")
        ours[name] = torch.cat([parts[p] for p in QKV_PARTS], dim=0)
    # A checkpoint saved before the bias moved keeps the MLM bias only as the decoder's bias.
    decoder_bias = hf_state.get("cls.predictions.decoder.bias")
    if "mlm.bias" not in ours and decoder_bias is not None:
        ours["mlm.bias"] = decoder_bias
    return ours, redundant


def load_pretrained(
    cls: type[BertPreTrainedModel],
    directory: str | os.PathLike[str],
    *,
    strict: bool = True,
    allow_pickle: bool = False,
    **config_overrides: Any,
) -> tuple[Any, LoadReport]:
    """Build `cls` from a directory's config.json and load its weights; see `BertPreTrainedModel.from_pretrained`."""
    directory = Path(directory)
    _require_directory(directory)
    if not (directory / "config.json").exists():
        raise CheckpointError(f"{directory}: no config.json")
    config = BertConfig.from_pretrained(directory)
    if config_overrides:
        config = BertConfig.from_dict({**config.to_dict(), **config_overrides}, source=str(directory / "config.json"))
    model = cls(config)
    report = load_weights_into(model, directory, strict=strict, allow_pickle=allow_pickle)
    return model, report


def load_weights_into(model: BertPreTrainedModel, directory: str | os.PathLike[str], *, strict: bool = True,
                      allow_pickle: bool = False) -> LoadReport:
    """Copy a checkpoint directory's weights into a model already built (by `load_pretrained`, or
    from a recipe for continued pre-training); the report is also kept on `model.load_report`.

    The model's config decides the architecture; every backbone weight must be in the file with the
    same shape. Heads the file lacks keep their fresh initialisation (and are listed in the report).
    """
    directory = Path(directory)
    _require_directory(directory)
    state, _ = from_hf_state_dict(read_state_dict(directory, allow_pickle=allow_pickle), model)
    report = _load_into(model, state, source=directory)
    model.load_report = report
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


def load_any(directory: str | os.PathLike[str], **kwargs: Any) -> tuple[Any, LoadReport]:
    """Load a checkpoint as the class its config.json names (`architectures`), BertModel if none we know."""
    import bertforge.model  # noqa: F401  (registers the classes)
    from bertforge.model.bert import BertModel, BertPreTrainedModel

    config_path = Path(directory) / "config.json"
    if not config_path.exists():
        raise CheckpointError(f"{directory}: no config.json")
    architectures = json.loads(config_path.read_text(encoding="utf-8")).get("architectures") or []
    cls = next((BertPreTrainedModel.registry[a] for a in architectures if a in BertPreTrainedModel.registry),
               BertModel)
    return load_pretrained(cls, directory, **kwargs)


def read_state_dict(directory: Path, *, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory: safetensors (single or sharded), else pickle if allowed."""
    if (directory / SAFETENSORS_FILE).exists():
        return load_file(str(directory / SAFETENSORS_FILE))
    if (directory / SAFETENSORS_INDEX).exists():
        return _read_shards(directory, SAFETENSORS_INDEX, lambda path: load_file(str(path)))
    pickled = [name for name in (PICKLE_FILE, PICKLE_INDEX) if (directory / name).exists()]
    if not pickled:
        raise CheckpointError(f"{directory}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX} or {PICKLE_FILE}")
    if not allow_pickle:
        raise CheckpointError(
            f"{directory / pickled[0]} is a pickle file, which can run arbitrary code when loaded. "
            "If you trust it, pass allow_pickle=True (Python API); it is then read with "
            "torch.load(weights_only=True). Better: convert it once to safetensors."
        )

    def read_pickle(path: Path) -> dict[str, torch.Tensor]:
        return torch.load(path, map_location="cpu", weights_only=True)

    if pickled[0] == PICKLE_FILE:
        return read_pickle(directory / PICKLE_FILE)
    return _read_shards(directory, PICKLE_INDEX, read_pickle)


def _read_shards(directory: Path, index_name: str, read: Any) -> dict[str, torch.Tensor]:
    index_path = directory / index_name
    try:
        weight_map = json.loads(index_path.read_text(encoding="utf-8"))["weight_map"]
    except (json.JSONDecodeError, KeyError) as exc:
        raise CheckpointError(f"{index_path}: not a shard index with a 'weight_map' ({exc})") from exc
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not (directory / shard).exists():
            raise CheckpointError(f"{index_path}: names shard {shard}, which is not in {directory}")
        state.update(read(directory / shard))
    return state


def _load_into(model: BertPreTrainedModel, state: dict[str, torch.Tensor], source: Path) -> LoadReport:
    """Copy tensors into the model (casting dtype), checking shapes, and sort the key differences."""
    own = model.state_dict()
    report = LoadReport()
    heads = model.head_prefixes
    prefix = _backbone_prefix(model)
    for key in own.keys() - state.keys():
        local = key[len(prefix):] if key.startswith(prefix) else key
        # A new task head, or a pooler the file omits (many encoders ship without one): expected.
        if key.startswith(heads) or local.startswith("pooler."):
            report.new_heads.append(key)
        else:
            report.missing.append(key)
    for key in state.keys() - own.keys():
        local = key[len(prefix):] if prefix and key.startswith(prefix) else key
        # Weights of a head this model does not have (pre-training heads under a bare encoder, say),
        # or a pooler under a head that reads every token (tagging, span QA): not needed, not wrong.
        if not local.startswith(HF_BACKBONE_ROOTS) or local.startswith("pooler."):
            report.unused.append(key)
        else:
            report.unexpected.append(key)
    for key in own.keys() & state.keys():
        if own[key].shape != state[key].shape:
            raise CheckpointError(
                f"{source}: {key} has shape {tuple(state[key].shape)} in the file but "
                f"{tuple(own[key].shape)} in the model (does config.json match the weights?)"
            )
    loadable = {k: v for k, v in state.items() if k in own}
    model.load_state_dict(loadable, strict=False)
    for field_list in (report.new_heads, report.unused, report.missing, report.unexpected):
        field_list.sort()
    return report


def _backbone_prefix(model: BertPreTrainedModel) -> str:
    """Where the encoder sits in our state dict: 'bert.' in a model with heads, '' in a bare BertModel."""
    return "bert." if hasattr(model, "bert") else ""


def _strip_backbone_prefix(key: str) -> tuple[str, bool]:
    """A Hugging Face key without its 'bert.' prefix, and whether it belongs to the backbone."""
    if key.startswith("bert."):
        return key[len("bert."):], True
    return key, key.startswith(HF_BACKBONE_ROOTS)


def _modernise(key: str) -> str:
    """TensorFlow-era conversions name LayerNorm parameters gamma/beta."""
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key))
