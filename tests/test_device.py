"""The device-independent checks, on the device `--device` names (default cpu; `--device cuda` on a GPU
machine): every family's masked-LM model against transformers in fp32 and under bf16 autocast, a
training step's loss and gradients against transformers', the packed and padded attention paths in
bf16, torch.compile, fused AdamW, the loop's exact resume in fp32 and bf16, and the loop under DDP and
FSDP on a process group of one rank (NCCL on a GPU, gloo on the CPU).

On the CPU these run in the ordinary suite; on a GPU machine they are the CUDA run:

    pytest tests/test_device.py --device cuda
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import transformers
from safetensors.torch import load_file

from bertforge.model import registry
from bertforge.tokenizer import BertTokenizer
from bertforge.train import OptimConfig, distributed, latest_checkpoint, train
from bertforge.train.optim import build_optimizer, param_groups
from test_every_family import smallest_config
from test_train import SyntheticBatches, params, run_config, tiny_model

FAMILIES = sorted(registry.families())  # every family the registry loads, derived ones included
TEXT = ["the cat sat on the mat .", "a dog ran in the park and the cat saw it .", "new york is a city ."]


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    return BertTokenizer.train_from_texts(TEXT * 20, vocab_size=120, min_frequency=1, show_progress=False)


def masked_lm_pair(model_type: str, tokenizer: BertTokenizer, directory: Path,
                   device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Ours and transformers' masked-LM model of the family with the same random weights, in eval mode
    (no dropout) on `device`: ours saved, transformers loading the directory."""
    torch.manual_seed(0)
    ours = registry.model_class(model_type, "masked-lm")(smallest_config(model_type, tokenizer))
    ours.save_pretrained(directory, tokenizer=tokenizer)
    architecture = json.loads((directory / "config.json").read_text())["architectures"][0]
    theirs = getattr(transformers, architecture).from_pretrained(directory)
    return ours.to(device).eval(), theirs.to(device).eval()


def padded_batch(vocab_size: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows of lengths 16, 9 and 4 padded to 16."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (3, 16), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate((16, 9, 4)):
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}


def bf16(device: torch.device) -> torch.autocast:
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_matches_transformers_in_fp32_and_bf16(model_type: str, tokenizer: BertTokenizer,
                                                            device: torch.device, tmp_path: Path) -> None:
    ours, theirs = masked_lm_pair(model_type, tokenizer, tmp_path, device)
    batch = padded_batch(tokenizer.vocab_size, device)
    real = batch["attention_mask"].bool()
    with torch.no_grad():
        reference = theirs(**batch).logits.float()
        ours_fp32 = ours(**batch).mlm_logits.float()
        with bf16(device):
            theirs_bf16 = theirs(**batch).logits.float()
            ours_bf16 = ours(**batch).mlm_logits.float()
    torch.testing.assert_close(ours_fp32[real], reference[real], atol=1e-4, rtol=1e-4)
    # bf16 rounds differently in each library; ours must stay as close to the fp32 answer as theirs does
    theirs_error = (theirs_bf16 - reference)[real].abs().max().item()
    ours_error = (ours_bf16 - reference)[real].abs().max().item()
    assert math.isfinite(ours_error) and ours_error <= 2 * theirs_error + 1e-2, (ours_error, theirs_error)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", FAMILIES)
def test_a_training_step_has_transformers_loss_and_gradients(model_type: str, tokenizer: BertTokenizer,
                                                             device: torch.device, tmp_path: Path) -> None:
    ours, theirs = masked_lm_pair(model_type, tokenizer, tmp_path / "start", device)
    batch = padded_batch(tokenizer.vocab_size, device, seed=1)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[0, [1, 5, 9]] = batch["input_ids"][0, [1, 5, 9]]
    labels[1, [2, 7]] = batch["input_ids"][1, [2, 7]]
    labels[2, 1] = batch["input_ids"][2, 1]
    ours_loss = ours(**batch, labels=labels).loss
    theirs_loss = theirs(**batch, labels=labels).loss
    torch.testing.assert_close(ours_loss, theirs_loss, atol=1e-5, rtol=1e-5)
    ours_loss.backward()
    theirs_loss.backward()

    # Our gradients under transformers' names: swap each parameter for its gradient and save, so the
    # family's own key map does the renaming.
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.copy_(parameter.grad)
    ours.cpu().save_pretrained(tmp_path / "gradients")
    ours_grads = load_file(tmp_path / "gradients" / "model.safetensors")
    theirs_grads = {name: p.grad.cpu() for name, p in theirs.named_parameters() if p.grad is not None}
    compared = [name for name in theirs_grads if name in ours_grads]
    assert len(compared) >= 0.9 * len(theirs_grads), sorted(set(theirs_grads) - set(ours_grads))
    scale = max(g.abs().max().item() for g in theirs_grads.values())
    for name in compared:
        torch.testing.assert_close(ours_grads[name], theirs_grads[name], atol=1e-5 * max(scale, 1.0), rtol=1e-4,
                                   msg=name)


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_packed_and_padded_attention_agree_in_bf16_with_gradients(model_type: str, tokenizer: BertTokenizer,
                                                                   device: torch.device) -> None:
    """The re-padded fused attention (per sequence, or one padded call) against the plain padded path,
    forward and backward, under bf16 autocast: what pre-training on a GPU runs."""
    torch.manual_seed(0)
    model = registry.model_class(model_type, "masked-lm")(smallest_config(model_type, tokenizer)).to(device)
    backbone = model.bert if model_type == "bert" else model.backbone
    batch = padded_batch(tokenizer.vocab_size, device, seed=2)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)
    model.eval()  # no dropout; gradients still flow
    results = {}
    for unpad, per_sequence in ((False, None), (True, True), (True, False)):
        backbone.unpad, backbone.attention_per_sequence = unpad, per_sequence
        model.zero_grad()
        with bf16(device):
            loss = model(**batch, labels=labels).loss
        loss.backward()
        results[unpad, per_sequence] = loss.float().item(), {n: p.grad.float().clone()
                                                             for n, p in model.named_parameters()}
    padded_loss, padded_grads = results[False, None]
    for key in ((True, True), (True, False)):
        loss, grads = results[key]
        assert math.isfinite(loss) and abs(loss - padded_loss) < 2e-2 * max(1.0, abs(padded_loss)), (key, loss)
        for name, grad in grads.items():
            assert torch.allclose(grad, padded_grads[name], atol=5e-2, rtol=5e-2), (key, name)


def test_compiled_model_matches_eager_forward_and_backward(device: torch.device) -> None:
    """torch.compile with code generation on a GPU (inductor); on the CPU dynamo's tracing alone
    (code generation there needs a C++ compiler and minutes)."""
    torch._dynamo.reset()
    model = tiny_model(dropout=0.0).to(device)
    batch = {k: v.to(device) for k, v in next(iter(SyntheticBatches(batch_size=4))).items()}
    eager_loss = model(**batch).loss
    eager_loss.backward()
    eager_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, backend="inductor" if device.type == "cuda" else "eager")
    compiled_loss = compiled(**batch).loss
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss, atol=1e-4, rtol=1e-4)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, eager_grads[name], atol=1e-4, rtol=1e-3, msg=name)


def test_fused_adamw_on_the_device_steps_like_the_reference(device: torch.device) -> None:
    model, reference = tiny_model().to(device), tiny_model().to(device)
    reference.load_state_dict(model.state_dict())
    fused = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.01))
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW(param_groups(reference, 0.01), lr=1e-2, eps=OptimConfig().adam_eps, foreach=False)
    gen = torch.Generator(device=device).manual_seed(0)
    for _ in range(3):
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            a.grad = torch.randn(a.shape, generator=gen, device=device)
            b.grad = a.grad.clone()
        fused.step()
        plain.step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loop_trains_and_resumes_exactly_on_the_device(precision: str, device: torch.device,
                                                           tmp_path: Path) -> None:
    settings = dict(device=str(device), precision=precision, save_every=2)
    constant = OptimConfig(lr=1e-3, schedule="constant")  # a run and its longer resume share one schedule
    straight = tiny_model()
    result = train(straight, SyntheticBatches(), tmp_path / "straight", run_config(max_steps=4, **settings), constant)
    assert result.skipped_steps == 0 and math.isfinite(result.train_loss)
    assert next(straight.parameters()).device.type == device.type

    first = tiny_model()
    train(first, SyntheticBatches(), tmp_path / "resumed", run_config(max_steps=2, **settings), constant)
    resumed = tiny_model(seed=1)  # other weights: the checkpoint must bring everything back
    train(resumed, SyntheticBatches(), tmp_path / "resumed", run_config(max_steps=4, **settings), constant,
          resume=True)
    for name, tensor in params(straight).items():
        torch.testing.assert_close(params(resumed)[name], tensor, atol=1e-6, rtol=0, msg=name)


@pytest.mark.slow
def test_the_loop_compiled_on_the_device_learns_like_eager(device: torch.device, tmp_path: Path) -> None:
    torch._dynamo.reset()
    losses = {}
    for compiled in (False, True):
        model = tiny_model(dropout=0.0)
        result = train(model, SyntheticBatches(), tmp_path / f"compile-{compiled}",
                       run_config(max_steps=4, device=str(device), compile=compiled), OptimConfig(lr=1e-3))
        losses[compiled] = result.train_loss
    assert losses[True] == pytest.approx(losses[False], rel=1e-3)


class OneRankGroup(distributed.DistContext):
    """A process group of one rank that the loop treats as distributed, so DDP and FSDP wrap the model
    and every collective goes through the backend (NCCL on a GPU) although one device is all there is."""

    @property
    def distributed(self) -> bool:
        return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_ddp_and_fsdp_on_a_one_rank_group_train_like_one_process(parallel: str, device: torch.device,
                                                                 tmp_path: Path) -> None:
    plain = tiny_model(dropout=0.0)
    train(plain, SyntheticBatches(), tmp_path / "plain", run_config(max_steps=3, device=str(device)),
          OptimConfig(lr=1e-3, schedule="constant"))
    here = device if device.type == "cpu" else torch.device("cuda", device.index or 0)
    if here.type == "cuda":
        torch.cuda.set_device(here)
    dist.init_process_group("nccl" if here.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1, device_id=here if here.type == "cuda" else None)
    try:
        group = OneRankGroup(rank=0, world_size=1, local_rank=0, device=here, timeout_s=120)
        wrapped = tiny_model(dropout=0.0)
        train(wrapped, SyntheticBatches(), tmp_path / parallel,
              run_config(max_steps=3, device=str(device), parallel=parallel), OptimConfig(lr=1e-3, schedule="constant"),
              ctx=group)
        # what the run saved, read back as plain tensors (FSDP's parameters are sharded DTensors)
        saved = load_file(latest_checkpoint(tmp_path / parallel) / "model.safetensors")
    finally:
        dist.destroy_process_group()
    for name, tensor in params(plain).items():
        if name in saved:
            torch.testing.assert_close(saved[name], tensor.cpu(), atol=1e-5, rtol=0, msg=name)
    assert len(saved) >= len(list(plain.parameters()))
