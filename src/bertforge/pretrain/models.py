"""What a pre-training run trains and saves: the model for the objective (masked LM with or without a
sentence task, ELECTRA's replaced-token detection, a left-to-right LM), its start from a checkpoint, a
randomly initialised copy of a checkpoint, and the exported final/."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.config import ModelConfig
from bertforge.model.registry import model_class
from bertforge.pretrain.recipe import DataOptions
from bertforge.pretrain.shards import has_tokenizer, vocab_sha1

if TYPE_CHECKING:
    from torch import nn


def objective_config(options: DataOptions, config: ModelConfig) -> ModelConfig:
    """The model config the recipe's objective needs: objective ltr makes it causal (`is_decoder: true`,
    transformers' name), so that the saved model is a left-to-right one everywhere it is loaded."""
    if options.objective != "ltr":
        return config
    try:
        model_class(config.model_type, "causal-lm")
    except ValueError as exc:  # UnknownFamilyError
        raise ValueError(f"objective ltr needs a left-to-right LM head, which the {config.model_type!r} family "
                         f"does not have (use a BERT model: preset mini, say): {exc}") from None
    if getattr(config, "span_boundary_objective", False):
        raise ValueError("objective ltr predicts the next token and masks no span: turn span_boundary_objective off")
    return config.with_overrides(is_decoder=True)


def pretraining_model(options: DataOptions, config: ModelConfig, data_objective: str) -> Callable[[], nn.Module]:
    """What builds the model a run trains, for the data's objective and the recipe's `objective`.

    nsp / sop: the family's pre-training model; none (RoBERTa): its masked-LM model, which carries the
    span-boundary head when the config asks (a family without sentence-pair heads gives its masked-LM
    model for "pretraining" too); rtd: the family's pre-training model (a replaced-token detector) with a
    generator beside it (`with_generator`), which only a family with such a discriminator has; ltr: the
    family's left-to-right LM (job causal-lm) on any data, with the config made causal (`objective_config`).
    """
    objective = options.objective or data_objective
    if objective == "ltr":
        config = objective_config(options, config)
        lm = model_class(config.model_type, "causal-lm")
        return lambda: lm(config)
    if objective == "rtd":
        if data_objective != "none":
            raise ValueError(f"objective rtd trains on masked-LM data, but the data has a sentence objective "
                             f"({data_objective}); prepare it with objective 'none'")
        joint = getattr(model_class(config.model_type, "pretraining"), "with_generator", None)
        if joint is None:
            raise ValueError(f"objective rtd needs a replaced-token detector with a generator beside it, which the "
                             f"{config.model_type!r} family does not have (use an ELECTRA model: preset "
                             "electra-small-discriminator, say)")
        return lambda: joint(config, generator_size=options.generator_size,
                             discriminator_weight=options.discriminator_weight)
    if objective != data_objective:
        raise ValueError(f"objective {objective!r} is not the data's ({data_objective}): a sentence objective is "
                         "chosen when the data is prepared (bertforge prepare --objective)")
    cls = model_class(config.model_type, "masked-lm" if objective == "none" else "pretraining")
    return lambda: cls(config)


def initialise_from(model: nn.Module, checkpoint: Path, info: dict[str, Any]) -> Any:
    """Load `checkpoint`'s weights into `model`, refusing one whose vocabulary is not the data's, and
    return the load report (its `new_heads`: what the checkpoint lacked). A model of several parts (rtd's
    generator and discriminator) loads them itself (`load_weights`); its report is the discriminator's."""
    from bertforge.checkpoint import load_weights_into

    recorded = info.get("tokenizer", {}).get("vocab_sha1")
    if recorded and has_tokenizer(checkpoint) and vocab_sha1(checkpoint) != recorded:
        raise ValueError(f"{checkpoint}: its tokenizer's vocabulary is not the one the pre-training data was made "
                         "with (token ids would mean different pieces)")
    load = getattr(model, "load_weights", None)
    if load is not None:
        return load(checkpoint)
    return load_weights_into(model, checkpoint)


def random_init_like(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], seed: int = 0) -> Path:
    """A checkpoint with `checkpoint`'s config and tokenizer and BERT's random initialisation instead of
    its weights: the start that shows what pre-training bought when both are fine-tuned alike."""
    import torch

    from bertforge.model.registry import read_config_file
    from bertforge.tokenizer import BertTokenizer

    checkpoint, out = Path(checkpoint), Path(out)
    torch.manual_seed(seed)
    config = read_config_file(checkpoint / "config.json")
    model = model_class(config.model_type, "pretraining")(config)  # its family's pre-training model
    model.save_pretrained(out, tokenizer=BertTokenizer.from_pretrained(checkpoint))
    return out


def export_final(model: nn.Module, directory: Path, tokenizer_dir: Path | None) -> Path:
    """The model in Hugging Face layout (config.json + model.safetensors), with the tokenizer's files."""
    tokenizer = None
    if tokenizer_dir is not None:
        from bertforge.tokenizer import BertTokenizer

        tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    model.save_pretrained(directory, tokenizer=tokenizer)  # each file written atomically
    return directory
