"""The training loop: learning, accumulation, optimisers, schedules, exact resume, atomic checkpoints,
non-finite handling, and DDP and FSDP on CPU (gloo).

Everything runs a tiny BERT (2 layers, H=128, vocab 100) on a synthetic shuffling, dynamically masked
data source defined here, which follows the loop's `ResumableBatches` protocol.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors import safe_open
from safetensors.torch import load_file
from torch.optim.optimizer import register_optimizer_step_pre_hook

from bertforge import BertConfig, BertForPreTraining
from bertforge.train import (
    Counters,
    Lamb,
    NonFiniteLossError,
    OptimConfig,
    ResumableBatches,
    TrainConfig,
    TrainState,
    distributed,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    lr_factor,
    param_groups,
    read_metrics,
    train,
)
from bertforge.train.optim import build_optimizer, build_scheduler

VOCAB = 100
MASK_ID = 4
SEQ = 16
MASKED_PER_ROW = 3  # every row predicts the same number of tokens, so micro-batch means average exactly


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box lose a lot to them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Crash(Exception):
    """Stands for the process dying while fetching data."""


class SyntheticBatches:
    """`n` sequences, reshuffled every epoch, re-masked every epoch; batch j of an epoch goes to rank
    j % world_size. The position (epoch, global batches consumed) does not depend on the world size."""

    def __init__(self, n: int = 32, batch_size: int = 4, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 dynamic: bool = True, crash_after: int | None = None) -> None:
        gen = torch.Generator().manual_seed(1234)
        half = SEQ // 2
        first = torch.randint(5, VOCAB, (n, half), generator=gen)
        self.ids = torch.cat([first, first], dim=1)  # the second half repeats the first: a learnable task
        self.lengths = torch.randint(SEQ - 4, SEQ + 1, (n,), generator=gen)
        self.nsp = torch.randint(0, 2, (n,), generator=gen)
        self.n, self.batch_size, self.seed, self.dynamic = n, batch_size, seed, dynamic
        self.rank, self.world_size, self.crash_after = rank, world_size, crash_after
        self.epoch, self.consumed = 0, 0  # consumed: batches (of all ranks) handed out this epoch
        self.fetched = 0  # batches this object produced: resume must not replay any

    def batches_per_epoch(self) -> int:
        return self.n // self.batch_size

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.consumed = state["epoch"], state["consumed"]

    def __iter__(self):
        torch.randint(0, 2**62, ())  # as a DataLoader does (its base seed): the loop must not let this shift dropout
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        while self.consumed + self.rank < self.batches_per_epoch():
            j = self.consumed + self.rank
            if self.crash_after is not None and self.fetched >= self.crash_after:
                raise Crash(f"killed before batch {self.fetched}")
            rows = order[j * self.batch_size:(j + 1) * self.batch_size]
            self.consumed += self.world_size
            self.fetched += 1
            yield self._batch(rows)
        self.epoch, self.consumed = self.epoch + 1, 0

    def _batch(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        ids = self.ids[rows].clone()
        labels = torch.full_like(ids, -100)
        attention = (torch.arange(SEQ)[None, :] < self.lengths[rows][:, None]).long()
        for i, row in enumerate(rows.tolist()):
            # mask 3 of positions 8..11: always real tokens (lengths >= 12), each with its copy at 0..3
            gen = torch.Generator().manual_seed(row * 7919 + (self.epoch if self.dynamic else 0))
            picked = torch.randperm(4, generator=gen)[:MASKED_PER_ROW] + SEQ // 2
            labels[i, picked] = ids[i, picked]
            ids[i, picked] = MASK_ID
        ids = ids * attention
        return {"input_ids": ids, "attention_mask": attention,
                "token_type_ids": (torch.arange(SEQ) >= SEQ // 2).long().expand_as(ids).clone() * attention,
                "labels": labels, "next_sentence_label": self.nsp[rows]}


def tiny_model(seed: int = 0, dropout: float = 0.1) -> BertForPreTraining:
    torch.manual_seed(seed)
    config = BertConfig.from_preset("tiny", vocab_size=VOCAB, max_position_embeddings=SEQ,
                                    hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertForPreTraining(config)


def run_config(**overrides) -> TrainConfig:
    values = dict(max_steps=8, log_every=1, progress=False, keep_last=3)
    values.update(overrides)
    return TrainConfig(**values)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


def test_synthetic_source_follows_the_protocol() -> None:
    source = SyntheticBatches()
    assert isinstance(source, ResumableBatches)
    first = [b["input_ids"] for b in source]
    second = [b["input_ids"] for b in source]
    assert len(first) == len(second) == 8
    assert not all(torch.equal(x, y) for x, y in zip(first, second, strict=True))  # reshuffled
    batch = next(iter(SyntheticBatches()))
    assert ((batch["labels"] != -100).sum(dim=1) == MASKED_PER_ROW).all()


# ------------------------------------------------------------------------------------------------
# learning
# ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_overfitting_one_batch_drives_mlm_loss_near_zero(tmp_path: Path) -> None:
    model = tiny_model(dropout=0.0)
    source = SyntheticBatches(n=8, batch_size=8, dynamic=False)
    batch = next(iter(SyntheticBatches(n=8, batch_size=8, dynamic=False)))

    def mlm_loss(m: torch.nn.Module) -> dict[str, float]:
        return {"mlm_loss": m(**batch).mlm_loss.item()}

    before = mlm_loss(model.eval())["mlm_loss"]
    result = train(model, source, tmp_path, run_config(max_steps=150, log_every=10),
                   OptimConfig(lr=3e-3, warmup_steps=10, weight_decay=0.0), evaluate=mlm_loss)
    assert before > 4.0  # ln(100) = 4.6 at initialisation
    assert result.metrics["mlm_loss"] < 0.05
    losses = [r["loss"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert losses[-1] < losses[0] / 10


def grads_of_first_step(tmp_path: Path, batch_size: int, grad_accum: int) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}
    model = tiny_model(dropout=0.0)
    names = {id(p): n for n, p in model.named_parameters()}

    def capture(optimizer, args, kwargs) -> None:
        if not captured:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    captured[names[id(p)]] = p.grad.detach().clone()

    handle = register_optimizer_step_pre_hook(capture)
    try:
        train(model, SyntheticBatches(batch_size=batch_size), tmp_path,
              run_config(max_steps=1, grad_accum=grad_accum, max_grad_norm=0.0), OptimConfig(lr=1e-3))
    finally:
        handle.remove()
    return captured


def test_accumulating_k_micro_batches_equals_one_batch_of_k_times_the_size(tmp_path: Path) -> None:
    one = grads_of_first_step(tmp_path / "one", batch_size=8, grad_accum=1)
    accumulated = grads_of_first_step(tmp_path / "acc", batch_size=2, grad_accum=4)
    assert one.keys() == accumulated.keys() and len(one) > 10
    for name in one:
        torch.testing.assert_close(accumulated[name], one[name], atol=1e-6, rtol=1e-5, msg=name)
    # and it is not trivially true: a single micro-batch gives other gradients
    half = grads_of_first_step(tmp_path / "half", batch_size=2, grad_accum=1)
    qkv = "bert.encoder.layers.0.attention.qkv.weight"
    assert not torch.allclose(half[qkv], one[qkv], atol=1e-6)


def test_bf16_autocast_trains_on_cpu_and_fp16_asks_for_a_gpu(tmp_path: Path) -> None:
    model = tiny_model()
    before = params(model)["bert.encoder.layers.0.attention.qkv.weight"]
    result = train(model, SyntheticBatches(), tmp_path / "bf16", run_config(max_steps=3, precision="bf16"),
                   OptimConfig(lr=1e-3))
    assert result.skipped_steps == 0 and math.isfinite(result.train_loss)
    assert model.bert.encoder.layers[0].attention.qkv.weight.dtype == torch.float32  # weights stay fp32
    assert not torch.equal(before, params(model)["bert.encoder.layers.0.attention.qkv.weight"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="fp16 needs a GPU"):
            train(tiny_model(), SyntheticBatches(), tmp_path / "fp16", run_config(precision="fp16"), OptimConfig())


# ------------------------------------------------------------------------------------------------
# optimisers and schedules
# ------------------------------------------------------------------------------------------------
def test_no_weight_decay_on_biases_and_layernorm() -> None:
    model = tiny_model()
    decay, keep = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    keep_names = {names[id(p)] for p in keep["params"]}
    decay_names = {names[id(p)] for p in decay["params"]}
    assert keep["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01
    assert keep_names | decay_names == set(names.values()) and not keep_names & decay_names
    for name in names.values():
        expect_keep = name.endswith("bias") or "norm" in name
        assert (name in keep_names) == expect_keep, name
    assert "bert.embeddings.word_embeddings.weight" in decay_names
    assert "bert.encoder.layers.0.attention_norm.weight" in keep_names and "mlm.bias" in keep_names

    # behaviour: with zero gradients AdamW's only effect is the decay, on the decayed group only
    optimizer = build_optimizer(model, OptimConfig(lr=0.1, weight_decay=0.5))
    before = params(model)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    after = params(model)
    torch.testing.assert_close(after["bert.pooler.dense.weight"], before["bert.pooler.dense.weight"] * (1 - 0.05))
    assert torch.equal(after["bert.embeddings.layer_norm.weight"], before["bert.embeddings.layer_norm.weight"])


def test_adamw_is_fused_on_the_cpu_and_steps_like_the_reference() -> None:
    torch.manual_seed(0)
    model, reference = tiny_model(), tiny_model()
    reference.load_state_dict(model.state_dict())
    fused = build_optimizer(model, OptimConfig(lr=1e-2, weight_decay=0.01))
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW(param_groups(reference, 0.01), lr=1e-2, eps=OptimConfig().adam_eps, foreach=False)
    for _ in range(3):
        for a, b in zip(model.parameters(), reference.parameters(), strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        fused.step()
        plain.step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)

    # a checkpoint made with the multi-tensor kernel resumes with it: the choice lives in the param groups
    resumed = build_optimizer(reference, OptimConfig(lr=1e-2, weight_decay=0.01))
    resumed.load_state_dict(plain.state_dict())
    assert all(not group["fused"] for group in resumed.param_groups)


def test_lamb_matches_a_hand_computed_step() -> None:
    w = torch.nn.Parameter(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))  # ||w|| = 5
    b = torch.nn.Parameter(torch.zeros(2))  # ||b|| = 0: the trust ratio falls back to 1
    optimizer = Lamb([{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
                     lr=0.01, betas=(0.9, 0.99), eps=1e-6)
    gw = np.array([[1.0, -2.0], [0.5, 0.0]])
    gb = np.array([0.3, -0.4])
    w.grad, b.grad = torch.tensor(gw, dtype=torch.float32), torch.tensor(gb, dtype=torch.float32)
    optimizer.step()

    # step 1: m_hat = g, v_hat = g^2, so r = g / (|g| + eps)
    w0 = np.array([[3.0, 4.0], [0.0, 0.0]])
    r = gw / (np.abs(gw) + 1e-6)
    u = r + 0.1 * w0
    expected_w = w0 - 0.01 * (5.0 / np.linalg.norm(u)) * u
    expected_b = -0.01 * 1.0 * gb / (np.abs(gb) + 1e-6)
    np.testing.assert_allclose(w.detach().numpy(), expected_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b.detach().numpy(), expected_b, rtol=1e-6, atol=1e-7)
    # by hand: r = sign(g) = [[1, -1], [1, 0]], u = r + 0.1 w = [[1.3, -0.6], [1, 0]], ||u||^2 = 3.05
    assert w[0, 0].item() == pytest.approx(3.0 - 0.01 * (5 / math.sqrt(3.05)) * 1.3, rel=1e-6)

    # step 2 exercises the bias corrections 1 - beta^2
    gw2 = np.array([[-1.0, 1.0], [1.0, 2.0]])
    w.grad = torch.tensor(gw2, dtype=torch.float32)
    b.grad = None  # no gradient: untouched
    b_before = b.detach().clone()
    w1 = w.detach().numpy().astype(np.float64)
    optimizer.step()
    m = 0.9 * 0.1 * gw + 0.1 * gw2
    v = 0.99 * 0.01 * gw**2 + 0.01 * gw2**2
    u = (m / (1 - 0.9**2)) / (np.sqrt(v / (1 - 0.99**2)) + 1e-6) + 0.1 * w1
    expected_w2 = w1 - 0.01 * (np.linalg.norm(w1) / np.linalg.norm(u)) * u
    np.testing.assert_allclose(w.detach().numpy(), expected_w2, rtol=1e-5, atol=1e-6)
    assert torch.equal(b.detach(), b_before)


def test_schedule_values() -> None:
    kwargs = dict(warmup_steps=10, total_steps=110)
    assert lr_factor(0, **kwargs) == pytest.approx(0.1)  # the first update already moves
    assert lr_factor(4, **kwargs) == pytest.approx(0.5)
    assert lr_factor(9, **kwargs) == pytest.approx(1.0)  # warm-up ends at the peak
    assert lr_factor(10, **kwargs) == pytest.approx(1.0)
    assert lr_factor(60, **kwargs) == pytest.approx(0.5)  # half-way through the decay
    assert lr_factor(110, **kwargs) == pytest.approx(0.0)
    assert lr_factor(35, **kwargs, schedule="cosine") == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert lr_factor(60, **kwargs, schedule="cosine") == pytest.approx(0.5)
    assert lr_factor(110, **kwargs, schedule="cosine") == pytest.approx(0.0)
    assert lr_factor(80, **kwargs, schedule="constant") == 1.0
    assert lr_factor(110, **kwargs, min_ratio=0.1) == pytest.approx(0.1)

    # the scheduler applies it to the optimiser, step by step
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([p], lr=2.0)
    scheduler = build_scheduler(optimizer, OptimConfig(lr=2.0, warmup_ratio=0.1), total_steps=100)
    seen = []
    for _ in range(101):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[0] == pytest.approx(0.2) and seen[9] == pytest.approx(2.0) and seen[55] == pytest.approx(1.0)
    assert seen[100] == pytest.approx(0.0)


# ------------------------------------------------------------------------------------------------
# exact resume and checkpoints
# ------------------------------------------------------------------------------------------------
def test_resume_is_bit_exact_and_seeks_without_replaying(tmp_path: Path) -> None:
    config = run_config(max_steps=8, grad_accum=2, save_every=4, seed=3)
    optim = OptimConfig(lr=1e-3, warmup_steps=2)
    # dropout on, and 8 batches per epoch, so the 16 micro-batches cross an epoch boundary (reshuffle,
    # re-mask): RNG state and data position both have to come back right
    straight_model = tiny_model(seed=0)
    train(straight_model, SyntheticBatches(), tmp_path / "straight", config, optim)

    with pytest.raises(Crash):
        train(tiny_model(seed=0), SyntheticBatches(crash_after=4 * 2 + 1), tmp_path / "crashed", config, optim)
    assert [p.name for p in list_checkpoints(tmp_path / "crashed")] == ["step-000004"]

    resumed_model = tiny_model(seed=99)  # other initial weights: everything must come from the checkpoint
    source = SyntheticBatches()
    result = train(resumed_model, source, tmp_path / "crashed", config, optim, resume=True)
    assert result.step == 8
    assert source.fetched == 4 * 2  # only the remaining micro-batches were produced
    assert_identical(params(resumed_model), params(straight_model))
    # and the control: without the RNG and data position, the run would differ
    other = tiny_model(seed=0)
    train(other, SyntheticBatches(), tmp_path / "other-seed", run_config(max_steps=8, grad_accum=2, seed=4), optim)
    assert not torch.equal(params(other)["mlm.bias"], params(straight_model)["mlm.bias"])


def test_keep_last_k_prunes_and_metrics_are_not_doubled_on_resume(tmp_path: Path) -> None:
    config = run_config(max_steps=5, save_every=1, keep_last=2)
    train(tiny_model(), SyntheticBatches(), tmp_path, config, OptimConfig())
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000004", "step-000005"]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")]
    files = sorted(p.name for p in (tmp_path / "checkpoints" / "step-000005").iterdir())
    assert files == ["model.safetensors", "optimizer.pt", "rank-00000.pt", "trainer.json"]
    trainer = json.loads((tmp_path / "checkpoints" / "step-000005" / "trainer.json").read_text())
    assert trainer["step"] == 5 and trainer["data"] == {"epoch": 0, "consumed": 5}

    with pytest.raises(FileExistsError, match="resume"):
        train(tiny_model(), SyntheticBatches(), tmp_path, config, OptimConfig())
    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=7, save_every=1, keep_last=2),
          OptimConfig(), resume=True)
    steps = [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert steps == [1, 2, 3, 4, 5, 6, 7]


def test_train_state_saves_and_resumes_as_one(tmp_path: Path) -> None:
    def fresh_state(seed: int) -> TrainState:
        model = tiny_model(seed=seed)
        optimizer = build_optimizer(model, OptimConfig())
        return TrainState(model, optimizer, build_scheduler(optimizer, OptimConfig(), 10), None, SyntheticBatches())

    state = fresh_state(0)
    state.step, state.counters = 3, Counters(skipped_steps=1, nonfinite_in_a_row=1, tokens=42)
    next(iter(state.batches))
    path = state.save(tmp_path)
    assert path == state.checkpoint == latest_checkpoint(tmp_path)

    other = fresh_state(7)
    assert other.resume_from(path)  # same world size: the RNG states came back
    assert (other.step, other.counters, other.checkpoint) == (3, state.counters, path)
    assert other.batches.state_dict() == state.batches.state_dict()
    assert_identical(params(other.model), params(state.model))


def test_a_cadence_of_zero_means_only_at_the_end(tmp_path: Path) -> None:
    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=3, log_every=0), OptimConfig())
    assert [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"] == [3]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003"]


def test_tensorboard_has_the_jsonl_curves_and_a_resume_does_not_double_them(tmp_path: Path) -> None:
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=5, save_every=2), OptimConfig())
    # As if the run had died after logging step 5 but before its last checkpoint: steps 5.. run again.
    shutil.rmtree(tmp_path / "checkpoints" / "step-000005")
    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=7, save_every=2), OptimConfig(),
          resume=True)

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    curve = [(e.step, e.value) for e in events.Scalars("train/loss")]
    jsonl = [(r["step"], r["loss"]) for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert [step for step, _ in curve] == [1, 2, 3, 4, 5, 6, 7]  # step 5 once, from the resumed run
    assert [step for step, _ in jsonl] == [1, 2, 3, 4, 5, 6, 7]
    assert np.allclose([v for _, v in curve], [v for _, v in jsonl], rtol=1e-6)  # TensorBoard keeps float32


KILL_SCRIPT = """
import time
from pathlib import Path
import torch
torch.set_num_threads(1)  # as the test process, so that the arithmetic is the same
import bertforge.train.state as state
from bertforge.train import OptimConfig, train
from test_train import SyntheticBatches, run_config, tiny_model  # tests/ is on the child's PYTHONPATH

real_save_model, calls = state.save_model, []

def save_model_then_hang(model, path):
    calls.append(path)
    real_save_model(model, path)
    if len(calls) == 2:  # the second checkpoint: model written, the rest not, directory not published
        Path({marker!r}).write_text("in the middle of a checkpoint")
        time.sleep(120)

state.save_model = save_model_then_hang
train(tiny_model(), SyntheticBatches(), {run!r}, run_config(max_steps=8, save_every=2), OptimConfig(lr=1e-3))
"""


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_resumes_from_the_last_complete_one(tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker"
    script = KILL_SCRIPT.format(marker=str(marker), run=str(run))
    python_path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p)
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stderr=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": python_path})
    deadline = time.monotonic() + 90
    while not marker.exists():
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() < deadline, "the child never reached its second checkpoint"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()

    assert [p.name for p in list_checkpoints(run)] == ["step-000002"]
    assert (run / "checkpoints" / ".tmp-step-000004").is_dir()  # the torn one, never published
    resumed = tiny_model(seed=5)
    train(resumed, SyntheticBatches(), run, run_config(max_steps=8, save_every=2), OptimConfig(lr=1e-3), resume=True)
    straight = tiny_model()
    train(straight, SyntheticBatches(), tmp_path / "straight", run_config(max_steps=8, save_every=2),
          OptimConfig(lr=1e-3))
    assert_identical(params(resumed), params(straight))
    assert [p.name for p in list_checkpoints(run)] == ["step-000004", "step-000006", "step-000008"]
    assert not (run / "checkpoints" / ".tmp-step-000004").exists()


def test_checkpoint_holds_no_pickled_objects(tmp_path: Path) -> None:
    train(tiny_model(), SyntheticBatches(), tmp_path, run_config(max_steps=2), OptimConfig(optimizer="lamb"))
    path = latest_checkpoint(tmp_path)
    for name in ("optimizer.pt", "rank-00000.pt"):
        torch.load(path / name, weights_only=True)  # raises on anything but tensors and plain data
    model = tiny_model(seed=7)
    trainer = load_checkpoint(path, model=model, restore_rng_state=False)
    with safe_open(str(path / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert keys == set(model.state_dict()) and trainer["step"] == 2


# ------------------------------------------------------------------------------------------------
# non-finite losses
# ------------------------------------------------------------------------------------------------
def nan_from(module: torch.nn.Module, calls: set[int] | None) -> list[int]:
    """Make `module` output NaN on the given forward calls (all calls when None)."""
    counter = [0]

    def hook(mod, args, output):
        counter[0] += 1
        if calls is None or counter[0] in calls:
            return output * float("nan")
        return output

    module.register_forward_hook(hook)
    return counter


def test_non_finite_steps_are_skipped_and_counted(tmp_path: Path) -> None:
    model = tiny_model()
    nan_from(model.bert.encoder.layers[1].ffn.up, calls={3, 4})  # steps 3 and 4 (one forward per step)
    result = train(model, SyntheticBatches(), tmp_path, run_config(max_steps=6, save_every=1, keep_last=10),
                   OptimConfig(lr=1e-3))
    assert result.skipped_steps == 2 and math.isfinite(result.train_loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    saved = {p.name: load_file(p / "model.safetensors") for p in list_checkpoints(tmp_path)}
    assert_identical(saved["step-000002"], saved["step-000004"])  # the skipped steps changed nothing
    assert not torch.equal(saved["step-000004"]["mlm.bias"], saved["step-000005"]["mlm.bias"])
    records = [r for r in read_metrics(tmp_path) if r["split"] == "train"]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 2, 2, 2]
    assert math.isnan(records[2]["grad_norm"]) if isinstance(records[2]["grad_norm"], float) else True


def test_too_many_non_finite_steps_stop_with_a_checkpoint_and_the_module_named(tmp_path: Path) -> None:
    model = tiny_model()
    nan_from(model.bert.encoder.layers[1].ffn.up, calls=None)
    with pytest.raises(NonFiniteLossError, match=r"bert\.encoder\.layers\.1\.ffn\.up") as caught:
        train(model, SyntheticBatches(), tmp_path, run_config(max_steps=20, max_nonfinite=3), OptimConfig())
    assert caught.value.module == "bert.encoder.layers.1.ffn.up"
    assert caught.value.checkpoint == latest_checkpoint(tmp_path)
    assert caught.value.checkpoint.name == "step-000003"
    assert "3 steps in a row" in str(caught.value)


# ------------------------------------------------------------------------------------------------
# distributed (gloo on CPU)
# ------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ddp_worker(rank: int, world_size: int, port: int, run_dir: str, task: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        if task == "train":
            model = tiny_model(seed=rank, dropout=0.0)  # different on purpose: DDP must broadcast rank 0's
            train(model, SyntheticBatches(batch_size=4, rank=rank, world_size=world_size), run_dir,
                  run_config(max_steps=3, dist_timeout_s=60), OptimConfig(lr=1e-3))
            torch.save(params(model), Path(run_dir) / f"final-rank{rank}.pt")
        elif task in ("fsdp", "fsdp-resume"):
            _fsdp_run(rank, world_size, run_dir, resume=task == "fsdp-resume")
        else:  # timeout: rank 1 never joins the collective
            distributed.init_distributed("cpu", timeout_s=2)
            if rank == 0:
                try:
                    distributed.all_reduce_sum(torch.ones(1), "the test's all-reduce")
                except distributed.DistributedTimeout as exc:
                    Path(run_dir, "message.txt").write_text(str(exc))
            else:
                time.sleep(5)
    finally:
        distributed.cleanup()


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_matches_one_process_and_resumes_on_one(tmp_path: Path) -> None:
    run = tmp_path / "ddp"
    mp.spawn(_ddp_worker, args=(2, free_port(), str(run), "train"), nprocs=2, join=True)
    rank0 = torch.load(run / "final-rank0.pt", weights_only=True)
    rank1 = torch.load(run / "final-rank1.pt", weights_only=True)
    assert_identical(rank0, rank1)

    path = latest_checkpoint(run)
    with safe_open(str(path / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert keys == set(rank0) and not any(k.startswith(("module.", "_orig_mod.")) for k in keys)
    assert (path / "rank-00000.pt").exists() and (path / "rank-00001.pt").exists()
    facts = next(r for r in read_metrics(run) if r["split"] == "run")
    assert facts["effective_batch"] == 8 and facts["world_size"] == 2

    # one process, the same global batch as two micro-batches: the same parameters
    single = tiny_model(seed=0, dropout=0.0)
    train(single, SyntheticBatches(batch_size=4), tmp_path / "single", run_config(max_steps=3, grad_accum=2),
          OptimConfig(lr=1e-3))
    for name, tensor in params(single).items():
        torch.testing.assert_close(rank0[name], tensor, atol=1e-5, rtol=0, msg=name)

    # the 2-process checkpoint resumes in 1 process; its global data position carries over
    resumed = tiny_model(seed=0, dropout=0.0)
    source = SyntheticBatches(batch_size=4)
    result = train(resumed, source, run, run_config(max_steps=5, grad_accum=2), OptimConfig(lr=1e-3), resume=True)
    assert result.step == 5 and source.fetched == 4
    trainer = json.loads((latest_checkpoint(run) / "trainer.json").read_text())
    assert trainer["world_size"] == 1 and trainer["data"] == {"epoch": 1, "consumed": 2}


# FSDP: 2 ranks x 2 sequences x 2 micro-batches, the same global batch of 8 as 1 rank x 2 x 4
FSDP_STEPS, RESUMED_STEPS = 3, 5
CONSTANT_LR = OptimConfig(lr=1e-3, schedule="constant")  # a run and its longer resume share one schedule


def fixed_batch_loss(model: torch.nn.Module) -> dict[str, float]:
    """An evaluation; under FSDP every rank runs it (the forward gathers parameters from all)."""
    batch = next(iter(SyntheticBatches(n=8, batch_size=8, dynamic=False)))
    return {"mlm_loss": model(**batch).mlm_loss.item()}


def _fsdp_run(rank: int, world_size: int, run_dir: str, resume: bool) -> None:
    from torch.distributed.tensor import DTensor

    model = tiny_model(seed=rank, dropout=0.0)  # different on purpose: rank 0's weights must reach every rank
    train(model, SyntheticBatches(batch_size=2, rank=rank, world_size=world_size), run_dir,
          run_config(max_steps=RESUMED_STEPS if resume else FSDP_STEPS, grad_accum=2, parallel="fsdp",
                     dist_timeout_s=60),
          CONSTANT_LR, evaluate=fixed_batch_loss, resume=resume)
    weight = model.bert.embeddings.word_embeddings.weight
    facts = {"sharded": isinstance(weight, DTensor), "local_rows": weight.to_local().shape[0]}
    Path(run_dir, f"facts-rank{rank}.json").write_text(json.dumps(facts))


def single_run(run_dir: Path, steps: int, resume: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    model = tiny_model(seed=seed, dropout=0.0)
    train(model, SyntheticBatches(batch_size=2), run_dir, run_config(max_steps=steps, grad_accum=4), CONSTANT_LR,
          evaluate=fixed_batch_loss, resume=resume)
    return params(model)


def assert_close_tensors(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-5, rtol=0, msg=name)


def last_eval(run_dir: Path) -> float:
    return [r for r in read_metrics(run_dir) if r["split"] == "eval"][-1]["mlm_loss"]


@pytest.mark.slow
def test_fsdp_on_two_cpu_processes_matches_one_process_and_checkpoints_move_both_ways(tmp_path: Path) -> None:
    run = tmp_path / "fsdp"
    mp.spawn(_ddp_worker, args=(2, free_port(), str(run), "fsdp"), nprocs=2, join=True)
    facts = json.loads((run / "facts-rank0.json").read_text())
    assert facts == {"sharded": True, "local_rows": VOCAB // 2}  # each rank holds half the embedding matrix
    run_facts = next(r for r in read_metrics(run) if r["split"] == "run")
    assert run_facts["parallel"] == "fsdp" and run_facts["effective_batch"] == 8

    # the checkpoint is the unwrapped, full state dict, and equals a 1-process run with the same global batch;
    # the MLM decoder is the word-embedding matrix, stored once, and trained by both of its uses
    single = single_run(tmp_path / "single", FSDP_STEPS)
    checkpoint = latest_checkpoint(run)
    saved = load_file(checkpoint / "model.safetensors")
    assert_close_tensors(saved, single)
    assert not any("decoder" in name for name in saved)
    assert last_eval(run) == pytest.approx(last_eval(tmp_path / "single"), abs=1e-5)
    # the optimizer state is in torch's own layout (parameters by number), as a 1-process run writes it
    ours = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    theirs = torch.load(latest_checkpoint(tmp_path / "single") / "optimizer.pt", weights_only=True)
    assert ours["param_groups"] == theirs["param_groups"] and ours["state"].keys() == theirs["state"].keys()
    for number, state in theirs["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours["state"][number][key], state[key], atol=1e-6, rtol=1e-4)

    # the FSDP checkpoint resumes in 1 process and goes on as an uninterrupted 1-process run
    straight = single_run(tmp_path / "straight", RESUMED_STEPS)
    assert_close_tensors(single_run(run, RESUMED_STEPS, resume=True, seed=9), straight)

    # and a 1-process checkpoint resumes under FSDP on 2 processes
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path / "single"), "fsdp-resume"), nprocs=2, join=True)
    resumed = latest_checkpoint(tmp_path / "single")
    assert resumed.name == "step-000005"
    assert json.loads((resumed / "trainer.json").read_text())["world_size"] == 2
    assert_close_tensors(load_file(resumed / "model.safetensors"), straight)


def test_parallel_must_be_ddp_or_fsdp() -> None:
    with pytest.raises(ValueError, match="parallel 'zero3'"):
        TrainConfig(parallel="zero3")


@pytest.mark.slow
def test_a_missing_rank_ends_with_a_clear_timeout_message(tmp_path: Path) -> None:
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path), "timeout"), nprocs=2, join=True)
    message = (tmp_path / "message.txt").read_text()
    assert "rank 0: the test's all-reduce: no answer from the other ranks within 2s" in message
    assert "crashed or is stuck" in message


class ShortFirstBatches(SyntheticBatches):
    """An epoch whose first batch is its short one (one row), as a shuffled epoch's can be."""

    def __iter__(self):
        for batch in super().__iter__():
            yield {k: v[:1] for k, v in batch.items()} if self.fetched == 1 else batch


def test_the_run_facts_give_the_batch_size_even_when_the_first_batch_is_short(tmp_path: Path) -> None:
    train(tiny_model(), ShortFirstBatches(batch_size=4), tmp_path, run_config(max_steps=2), OptimConfig(lr=1e-3))
    facts = next(r for r in read_metrics(tmp_path) if r["split"] == "run")
    assert facts["per_device_batch"] == 4 and facts["effective_batch"] == 4
