"""Pre-training end to end on real shards: prepare (fixture text) -> pretrain -> final/ in transformers.

The shards are made once per module from the Gutenberg sample fixture with a 400-token WordPiece
vocabulary, 64-token sequences and dynamic masking, so that a run takes seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from bertforge import BertConfig, BertForPreTraining
from bertforge.cli import app
from bertforge.plot import plot_run
from bertforge.pretrain import (
    PhasedBatches,
    ShardBatches,
    load_recipe,
    pretrain,
    recipe_from_dict,
    with_overrides,
)
from bertforge.train import latest_checkpoint, read_metrics
from tests.hub_server import loopback_hub_fixture  # noqa: F401  (the `loopback_hub` fixture)

FIXTURE = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
RECIPES = Path(__file__).parent.parent / "recipes"
SMALL = dict(batch_size=8, eval_batch_size=16, eval_max_batches=4, progress=False, log_every=2)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model on a shared 2-core box: threads cost more than they give
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from bertforge.data.prepare import prepare
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("shards")
    tokenizer = BertTokenizer.train([FIXTURE], vocab_size=400, show_progress=False)
    tokenizer.save_pretrained(root / "tokenizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one book: NotNext partners fall back, and prepare says so
        prepare([FIXTURE], root / "tokenizer", root / "data", max_seq_length=64, plain_text=True, masking="dynamic",
                validation_fraction=0.1, block_sentences=16, progress=False)
    return root / "data", root / "tokenizer"


def test_pretrain_exports_a_model_that_transformers_loads_with_identical_logits(shards, tmp_path: Path) -> None:
    data, tokenizer = shards
    run = tmp_path / "run"
    result = pretrain("tiny", data, run, max_steps=12, eval_every=6, save_every=6, tokenizer=str(tokenizer),
                      max_position_embeddings=64, lr=1e-3, warmup_steps=2, **SMALL)
    assert result.final == run / "final" and result.train.step == 12
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        assert (run / "final" / name).is_file(), name

    ours = BertForPreTraining.from_pretrained(run / "final").eval()
    theirs = transformers.BertForPreTraining.from_pretrained(run / "final").eval()
    ids = torch.tensor([[2, 50, 60, 70, 4, 80, 3, 90, 100, 3, 0, 0]])
    mask, types = (ids != 0).long(), torch.tensor([[0] * 7 + [1] * 5])
    with torch.no_grad():
        mine, ref = ours(ids, mask, types), theirs(input_ids=ids, attention_mask=mask, token_type_ids=types)
    real = mask[0].bool()  # padded positions carry no meaning (and transformers treats them its own way)
    torch.testing.assert_close(mine.mlm_logits[:, real], ref.prediction_logits[:, real], atol=1e-5, rtol=0)
    torch.testing.assert_close(mine.nsp_logits, ref.seq_relationship_logits, atol=1e-5, rtol=0)

    evals = [r for r in read_metrics(run) if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [6, 12]
    assert {"mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"} <= evals[-1].keys()
    assert evals[-1]["mlm_loss"] < evals[0]["mlm_loss"] < 7.0  # ln(400) = 6.0 at random
    assert plot_run(run).stat().st_size > 10_000

    # run_config.yaml is a recipe that rebuilds the same run
    saved = yaml.safe_load((run / "run_config.yaml").read_text())
    assert saved["model"]["vocab_size"] == 400 and saved["train"]["max_steps"] == 12
    again = load_recipe(run / "run_config.yaml")
    assert again.train == result_recipe_train(saved) and again.optim.lr == 1e-3


def result_recipe_train(saved: dict):
    return recipe_from_dict(saved).train


def test_pretrain_resumes_bit_exactly_through_the_shard_loader(shards, tmp_path: Path, monkeypatch) -> None:
    data, _ = shards
    settings = dict(max_steps=6, save_every=3, max_position_embeddings=64, grad_accum=2, lr=1e-3, **SMALL)
    pretrain("tiny", data, tmp_path / "straight", **settings)

    real_iter, fetched = ShardBatches.__iter__, []

    def dying_iter(self):
        for batch in real_iter(self):
            if len(fetched) == 3 * 2 + 1:
                raise KeyboardInterrupt("killed")
            fetched.append(1)
            yield batch

    monkeypatch.setattr(ShardBatches, "__iter__", dying_iter)
    with pytest.raises(KeyboardInterrupt):
        pretrain("tiny", data, tmp_path / "crashed", **settings)
    monkeypatch.setattr(ShardBatches, "__iter__", real_iter)
    assert latest_checkpoint(tmp_path / "crashed").name == "step-000003"
    pretrain("tiny", data, tmp_path / "crashed", resume=True, **settings)

    a = load_file(tmp_path / "straight" / "checkpoints" / "step-000006" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "checkpoints" / "step-000006" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_recipes_load_and_base_paper_follows_the_paper() -> None:
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    assert {"tiny-cpu", "mini", "base-paper", "base-fast"} <= set(names)
    for name in names:
        load_recipe(RECIPES / f"{name}.yaml")
    paper = load_recipe(RECIPES / "base-paper.yaml")
    assert paper.model["preset"] == "base"
    assert paper.data.batch_size * paper.train.grad_accum * 8 == 256  # on the 8 GPUs it names
    assert paper.train.max_steps == 1_000_000 and paper.optim.lr == 1e-4 and paper.optim.warmup_steps == 10_000
    assert paper.optim.weight_decay == 0.01 and paper.data.long_fraction == 0.1
    assert load_recipe(RECIPES / "base-fast.yaml").optim.optimizer == "lamb"
    modern = load_recipe(RECIPES / "modern-mini-cpu.yaml")
    assert modern.model["preset"] == "modern-mini" and modern.data.mask_rate == 0.3
    assert with_overrides(modern, local_attention=64).model["local_attention"] == 64  # a ModernBERT field

    assert with_overrides(paper, lr=3e-4, batch_size=4, hidden_dropout_prob=0.0).optim.lr == 3e-4
    with pytest.raises(ValueError, match="unknown recipe field"):
        with_overrides(paper, learning_rate=1.0)
    with pytest.raises(ValueError, match="unknown optim fields"):
        recipe_from_dict({"optim": {"learning_rate": 1.0}})


def test_cli_pretrain_then_plot(shards, tmp_path: Path) -> None:
    data, tokenizer = shards
    runner = CliRunner()
    args = ["pretrain", "--config", "tiny", "--data", str(data), "--out", str(tmp_path / "run"), "--max-steps", "3",
            "--batch-size", "4", "--tokenizer", str(tokenizer), "--set", "max_position_embeddings=64",
            "--set", "data.eval_max_batches=2", "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "final model:" in result.output and "mlm_accuracy" in result.output
    again = runner.invoke(app, args)  # the run directory is taken
    assert again.exit_code == 2 and "--resume" in again.output
    result = runner.invoke(app, ["plot", str(tmp_path / "run")])
    assert result.exit_code == 0 and (tmp_path / "run" / "curves.png").is_file()
    bad = runner.invoke(app, ["pretrain", "--config", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "dataset.json" in bad.output


@pytest.mark.slow
def test_cli_pretrain_under_torchrun_with_fsdp_exports_the_gathered_model(shards, tmp_path: Path) -> None:
    data, tokenizer = shards
    out = tmp_path / "fsdp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "bertforge.cli", "pretrain", "--config", "tiny", "--data", str(data), "--out", str(out),
               "--max-steps", "2", "--batch-size", "4", "--parallel", "fsdp", "--tokenizer", str(tokenizer),
               "--set", "max_position_embeddings=64", "--set", "eval_max_batches=2", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "final model:" in done.stdout and "mlm_accuracy" in done.stdout
    facts = next(r for r in read_metrics(out) if r["split"] == "run")
    assert facts["parallel"] == "fsdp" and facts["world_size"] == 2
    # final/ holds the full weights of the last checkpoint (gathered from the shards for the export)
    saved = load_file(latest_checkpoint(out) / "model.safetensors")
    final = BertForPreTraining.from_pretrained(out / "final").state_dict()
    assert final.keys() == saved.keys() and all(torch.equal(final[k], saved[k]) for k in saved)
    assert (out / "final" / "vocab.txt").is_file()


def test_a_data_position_carries_over_to_another_world_size(shards) -> None:
    from bertforge.data.loader import PretrainingLoader

    data, _ = shards

    def loader(rank: int, world: int) -> ShardBatches:
        return ShardBatches(PretrainingLoader(data, 4, seed=3, rank=rank, world_size=world, drop_last=True, even=True))

    two = [loader(r, 2) for r in range(2)]
    for source in two:  # each of two ranks takes 3 batches of 4
        for _ in zip(range(3), source, strict=False):
            pass
    one = loader(0, 1)
    one.load_state_dict(two[0].state_dict())
    assert one.loader.offset == 24 and one.loader.epoch == 0
    # what the two ranks consumed is exactly what one rank skips: the first 24 of the epoch's order
    consumed = {int(i) for source in two for i in source.loader.indices()[:12]}
    assert consumed == {int(i) for i in one.loader.indices()[:24]}
    three = loader(2, 3)
    three.load_state_dict(two[1].state_dict())
    assert three.loader.offset == 8


class Counted:
    """A resumable source of numbered batches, `per_epoch` to an epoch."""

    def __init__(self, name: str, per_epoch: int) -> None:
        self.name, self.per_epoch, self.position = name, per_epoch, 0

    def __iter__(self):
        while self.position < self.per_epoch:
            self.position += 1
            yield {"source": self.name, "number": self.position}
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def test_phased_batches_switch_sources_after_a_number_of_micro_batches_and_resume() -> None:
    from bertforge.train.loop import _forever

    phased = PhasedBatches(Counted("short", 3), Counted("long", 2), switch_at=5)
    stream = _forever(phased)
    seen = [(b["source"], b["number"]) for b in (next(stream) for _ in range(8))]
    assert seen == [("short", 1), ("short", 2), ("short", 3), ("short", 1), ("short", 2),
                    ("long", 1), ("long", 2), ("long", 1)]
    resumed = PhasedBatches(Counted("short", 3), Counted("long", 2), switch_at=5)
    resumed.load_state_dict(phased.state_dict())
    assert next(_forever(resumed)) == {"source": "long", "number": 2}


def test_roberta_style_data_trains_a_masked_lm_without_nsp(shards, tmp_path: Path) -> None:
    from bertforge.data.prepare import prepare

    _, tokenizer = shards
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepare([FIXTURE], tokenizer, tmp_path / "data", max_seq_length=64, plain_text=True, objective="none",
                masking="dynamic", validation_fraction=0.1, block_sentences=16, progress=False)
    result = pretrain("tiny", tmp_path / "data", tmp_path / "run", max_steps=2, max_position_embeddings=64,
                      tokenizer=str(tokenizer), **SMALL)
    assert json.loads((result.final / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    assert set(result.train.metrics) == {"mlm_loss", "mlm_accuracy"}
    transformers.BertForMaskedLM.from_pretrained(result.final)


def test_training_steps_match_transformers_step_for_step(tmp_path: Path) -> None:
    """The pre-training dynamics, not only the forward pass, are transformers' own: from the same
    initial weights, on the same masked batches (dropout off, so that nothing random differs), our
    model with our optimiser set-up and transformers.BertForPreTraining with the weight-decay grouping
    of the original BERT code give the same losses at every step and the same model at the end.
    This is what says a slow MLM curve comes from the budget, not from our code."""
    from bertforge.train.optim import OptimConfig, build_optimizer

    torch.manual_seed(0)
    config = BertConfig(vocab_size=400, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    ours = BertForPreTraining(config).train()
    ours.save_pretrained(tmp_path / "init")
    theirs = transformers.BertForPreTraining.from_pretrained(tmp_path / "init").train()
    settings = OptimConfig(lr=2e-3, weight_decay=0.01)
    our_optimizer = build_optimizer(ours, settings)
    no_decay = [p for n, p in theirs.named_parameters() if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in theirs.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    their_optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                        lr=2e-3, betas=(0.9, 0.999), eps=1e-6)

    generator = torch.Generator().manual_seed(1)
    batches = [toy_pretraining_batch(generator) for _ in range(2)]  # cycled, so that there is something to learn
    losses = []
    for step in range(30):
        inputs, mask, types, labels, nsp = batches[step % 2]
        mine = ours(inputs, mask, types, labels=labels, next_sentence_label=nsp)
        ref = theirs(input_ids=inputs, attention_mask=mask, token_type_ids=types, labels=labels,
                     next_sentence_label=nsp)
        torch.testing.assert_close(mine.loss, ref.loss, atol=2e-5, rtol=0, msg=f"loss at step {step}")
        for model, optimizer, loss in ((ours, our_optimizer, mine.loss), (theirs, their_optimizer, ref.loss)):
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        losses.append(mine.loss.item())
    assert losses[-1] < losses[0] - 1.0  # and both learned: the batches are being memorised

    ours.save_pretrained(tmp_path / "ours")
    reloaded = transformers.BertForPreTraining.from_pretrained(tmp_path / "ours")
    their_state = theirs.state_dict()
    for name, tensor in reloaded.state_dict().items():
        torch.testing.assert_close(tensor, their_state[name], atol=1e-4, rtol=0, msg=name)


def toy_pretraining_batch(generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """8 random pairs "[CLS] A [SEP] B [SEP]" of 32 ids in a 400-id vocabulary, 15% masked, random NSP labels."""
    ids = torch.randint(5, 400, (8, 32), generator=generator)
    ids[:, 0], ids[:, 15], ids[:, -1] = 2, 3, 3
    types = torch.zeros_like(ids)
    types[:, 16:] = 1
    masked = (torch.rand(ids.shape, generator=generator) < 0.15) & (ids > 4)
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    inputs = torch.where(masked, torch.full_like(ids, 4), ids)  # 4 = [MASK] in this toy vocabulary
    nsp = torch.randint(0, 2, (8,), generator=generator)
    return inputs, torch.ones_like(ids), types, labels, nsp


def test_init_from_continues_from_a_checkpoint_s_weights_and_refuses_one_that_does_not_fit(shards, tmp_path: Path) -> None:
    from bertforge.checkpoint import CheckpointError

    data, tokenizer = shards
    settings = dict(max_position_embeddings=64, tokenizer=str(tokenizer), **SMALL)
    first = pretrain("tiny", data, tmp_path / "first", max_steps=4, lr=1e-3, warmup_steps=1, **settings).final

    # One step at lr 1e-9 moves a weight by about 1e-9 (Adam's step is about the rate): the export is
    # the checkpoint it started from, to 1e-7, and far from a run started from a random draw.
    again = pretrain("tiny", data, tmp_path / "again", max_steps=1, lr=1e-9, warmup_steps=0, init_from=first,
                     **settings).final
    started, ended = load_file(str(first / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert started.keys() == ended.keys()
    for key in started:
        torch.testing.assert_close(ended[key], started[key], atol=1e-7, rtol=0, msg=key)
    assert yaml.safe_load((tmp_path / "again" / "run_config.yaml").read_text())["init_from"] == str(first.resolve())
    fresh = pretrain("tiny", data, tmp_path / "fresh", max_steps=1, lr=1e-9, warmup_steps=0, **settings).final
    word_embeddings = "bert.embeddings.word_embeddings.weight"
    assert (load_file(str(fresh / "model.safetensors"))[word_embeddings] - started[word_embeddings]).abs().max() > 1e-3

    other_vocab = tmp_path / "other-vocab"
    other_vocab.mkdir()
    for item in first.iterdir():
        (other_vocab / item.name).write_bytes(item.read_bytes())
    lines = (first / "vocab.txt").read_text(encoding="utf-8").splitlines()
    lines[10], lines[11] = lines[11], lines[10]  # same size, two ids swapped
    (other_vocab / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="its tokenizer.s vocabulary is not the one the pre-training data"):
        pretrain("tiny", data, tmp_path / "bad-vocab", max_steps=1, init_from=other_vocab, **settings)

    shallower = tmp_path / "one-layer"
    BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=400, num_hidden_layers=1,
                                              max_position_embeddings=64)).save_pretrained(shallower)
    with pytest.raises(CheckpointError, match="MISSING from the file: bert.encoder.layers.1"):
        pretrain("tiny", data, tmp_path / "bad-shape", max_steps=1, init_from=shallower, **settings)


def test_pretrain_joins_the_distributed_context_once(shards, tmp_path: Path, monkeypatch) -> None:
    from bertforge.train import distributed

    real_init, calls = distributed.init_distributed, []

    def counting_init(*args, **kwargs):
        calls.append(args)
        return real_init(*args, **kwargs)

    monkeypatch.setattr(distributed, "init_distributed", counting_init)
    data, _ = shards
    pretrain("tiny", data, tmp_path / "run", max_steps=1, max_position_embeddings=64, **SMALL)
    assert len(calls) == 1


def test_modern_pretraining_is_mlm_only_at_the_recipe_s_mask_rate(shards, tmp_path: Path) -> None:
    from bertforge.data.loader import PretrainingLoader
    from bertforge.data.prepare import prepare

    _, tokenizer = shards
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepare([FIXTURE], tokenizer, tmp_path / "data", max_seq_length=64, plain_text=True, objective="none",
                masking="dynamic", validation_fraction=0.1, block_sentences=16, progress=False)
    loader = PretrainingLoader(tmp_path / "data", 16, mask_rate=0.3)
    batch = next(iter(loader))
    masked = (batch["labels"] != -100).sum() / batch["attention_mask"].sum()
    assert 0.25 < masked < 0.35  # specials are never masked, so a little under 30% of all tokens
    result = pretrain("modern-tiny", tmp_path / "data", tmp_path / "run", max_steps=2, mask_rate=0.3,
                      local_attention=16, tokenizer=str(tokenizer), **SMALL)
    config = json.loads((result.final / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForMaskedLM"] and config["local_attention"] == 16
    assert set(result.train.metrics) == {"mlm_loss", "mlm_accuracy"}
    saved = yaml.safe_load((tmp_path / "run" / "run_config.yaml").read_text())
    assert saved["data"]["mask_rate"] == 0.3 and saved["model"]["model_type"] == "modernbert"
    again = pretrain(tmp_path / "run" / "run_config.yaml", tmp_path / "data", tmp_path / "again", max_steps=2,
                     progress=False)  # the saved recipe repeats the run
    assert again.train.metrics == result.train.metrics
    transformers.ModernBertForMaskedLM.from_pretrained(result.final)
    with pytest.raises(ValueError, match="objective 'none'"):  # no sentence head to train NSP with
        pretrain("modern-tiny", shards[0], tmp_path / "nsp", max_steps=1, tokenizer=str(tokenizer), **SMALL)


def test_init_from_a_hub_name(shards, loopback_hub, tmp_path: Path) -> None:
    data, tokenizer = shards
    settings = dict(max_position_embeddings=64, tokenizer=str(tokenizer), **SMALL)
    first = pretrain("tiny", data, tmp_path / "first", max_steps=2, lr=1e-3, warmup_steps=1, **settings).final
    loopback_hub.commit("org/tiny-first", {p.name: p.read_bytes() for p in first.iterdir() if p.is_file()})
    again = pretrain("tiny", data, tmp_path / "again", max_steps=1, lr=1e-9, warmup_steps=0,
                     init_from="org/tiny-first", **settings).final
    started, ended = load_file(str(first / "model.safetensors")), load_file(str(again / "model.safetensors"))
    for key in started:
        torch.testing.assert_close(ended[key], started[key], atol=1e-7, rtol=0, msg=key)
    recorded = yaml.safe_load((tmp_path / "again" / "run_config.yaml").read_text())["init_from"]
    assert loopback_hub.head("org/tiny-first") in recorded  # the snapshot of the commit used
