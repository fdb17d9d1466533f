"""Students cut from a teacher: the teacher's family and config with fewer layers, those layers and
everything else the two share by name (embeddings, pooler, head) copied over. Task and general
distillation start a student this way (`--student-layers-from-teacher`); `save_layer_student` cuts one
without distilling."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def copy_teacher_weights(student: Any, teacher: Any, layers: Sequence[int]) -> None:
    """Copy into `student` (the teacher's family, fewer layers) the teacher's layers `layers` (student
    layer j <- teacher layer layers[j]) and every other weight the two name alike with the same shape
    (embeddings, pooler, head), found through `transformer_layers()` rather than key spellings."""
    import torch

    def layer_prefixes(model: Any) -> dict[str, int]:
        owners = {id(layer): index for index, layer in enumerate(model.transformer_layers())}
        return {name: owners[id(module)] for name, module in model.named_modules() if id(module) in owners}

    mine, theirs = layer_prefixes(student), layer_prefixes(teacher)
    theirs_by_index = {index: name for name, index in theirs.items()}
    source = teacher.state_dict()
    target = student.state_dict()
    with torch.no_grad():
        for key, tensor in target.items():
            owner = next((name for name in mine if key.startswith(name + ".")), None)
            origin = key if owner is None else theirs_by_index[layers[mine[owner]]] + key[len(owner):]
            if origin in source and source[origin].shape == tensor.shape:
                tensor.copy_(source[origin])


def layer_student(teacher: Any, layers: Sequence[int], job: str) -> Any:
    """A model for `job` of the teacher's family and config with only the teacher's `layers` (0-based,
    bottom to top), those layers and everything else the two share by name (embeddings, pooler, head)
    copied from the teacher."""
    from bertforge.model.registry import model_class

    config = teacher.config.with_overrides(num_hidden_layers=len(layers))
    config.extra = dict(teacher.config.extra)  # labels and the family's extra settings go with the head
    student = model_class(config.model_type, job)(config)
    copy_teacher_weights(student, teacher, layers)
    return student


def save_layer_student(source: str | Path, layers: Sequence[int], out: str | Path,
                       job: str = "embeddings") -> Path:
    """Save to `out` (unless it holds a model already) a model of `source`'s family made of `source`'s
    layers `layers` (0-based, bottom to top) with its embeddings and, for a task `job`, its head: the
    student one cuts from a model without distilling (or times, since its speed is its shape's)."""
    from bertforge.model.auto import load_for_job
    from bertforge.tokenizer import BertTokenizer

    out = Path(out)
    if (out / "config.json").exists():
        return out
    student = layer_student(load_for_job(source, job), layers, job)
    student.save_pretrained(out, tokenizer=BertTokenizer.from_pretrained(source))
    return out


__all__ = ["copy_teacher_weights", "layer_student", "save_layer_student"]
