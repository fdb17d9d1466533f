"""ELECTRA's replaced-token detection as a pre-training objective (`objective: rtd`): the discriminator's
input and labels and its loss on a batch worked out by hand, the generator sharing the discriminator's
embeddings (one parameter, gradients from both losses, none through the sampling), and `bertforge
pretrain` on generated shards: the loss falls, an interrupted run resumes bit-exactly, and final/ is
the discriminator (transformers loads it) with the generator beside it, ready to fine-tune."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from bertforge.model import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining, load_any
from bertforge.model.electra.heads import (
    ElectraForJointPreTraining,
    JointPreTrainingOutput,
    generator_config,
    replace_masked,
    replaced_token_detection_loss,
)
from bertforge.pretrain import DataOptions, ShardBatches, pretrain, pretraining_metrics, pretraining_model
from bertforge.train import latest_checkpoint, read_metrics
from bertforge.train.optim import param_groups

FIXTURE = Path(__file__).parent / "fixtures" / "gutenberg_sample.txt"
CLASSIFY = Path(__file__).parent / "fixtures" / "classify"
# A two-layer discriminator (H 64, E 32) and so a generator of H 16, one head, feed-forward 32.
MODEL = dict(objective="rtd", num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             embedding_size=32, max_position_embeddings=64)
SMALL = dict(batch_size=8, eval_batch_size=16, eval_max_batches=4, progress=False, log_every=2)

# The hand-worked batch: [CLS] x [MASK] y [MASK] [SEP] / [CLS] [MASK] [SEP] pad pad. The generator
# drew 11 for the first mask (its original: counts as original), 30 and 31 for the others.
IDS = torch.tensor([[2, 4, 20, 4, 3], [2, 4, 3, 0, 0]])
LABELS = torch.tensor([[-100, 11, -100, 13, -100], [-100, 15, -100, -100, -100]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
SAMPLED = torch.tensor([11, 30, 31])  # row-major order of the masked positions
LOGITS = torch.tensor([[-2.0, 1.0, 0.0, 3.0, -1.0], [0.5, 2.0, -0.5, 9.0, -9.0]])  # padding's are never scored


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config(**overrides) -> ElectraConfig:
    return ElectraConfig(**{**dict(vocab_size=60, hidden_size=32, embedding_size=16, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64, max_position_embeddings=20,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), **overrides})


def test_discriminator_input_labels_and_loss_by_hand() -> None:
    corrupted, replaced = replace_masked(IDS, LABELS, SAMPLED, MASK)
    assert corrupted.tolist() == [[2, 11, 20, 30, 3], [2, 31, 3, 0, 0]]
    # the sample 11 equals its original: original (0); 30 for 13 and 31 for 15: replaced; padding: -100
    assert replaced.tolist() == [[0, 0, 0, 1, 0], [0, 1, 0, -100, -100]]

    # binary cross-entropy by hand over the 8 real tokens: -log(1 - sigmoid(z)) = log(1 + e^z) for an
    # original token, -log(sigmoid(z)) = log(1 + e^-z) for a replaced one
    terms = [math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(1.0)), math.log(2.0),  # originals
             math.log(1 + math.exp(-3.0)),  # replaced, z = 3
             math.log(1 + math.exp(-1.0)), math.log(1 + math.exp(0.5)),  # originals
             math.log(1 + math.exp(-2.0)),  # replaced, z = 2
             math.log(1 + math.exp(-0.5))]  # original
    expected = sum(terms) / 8
    assert expected == pytest.approx(0.508784, abs=1e-6)
    loss = replaced_token_detection_loss(LOGITS, replaced, MASK)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # the padding's logits (9, -9) are not scored, whether by the -100 labels or the attention mask
    assert replaced_token_detection_loss(LOGITS, replaced.clamp(min=0), MASK).item() == pytest.approx(expected, abs=1e-6)

    # the figures pretraining_metrics logs for such a batch: replaced tokens called replaced (z > 0)
    # 2 of 2; originals called original 4 of 6 (z = 1 and 0.5 are wrong); 2 of 8 tokens replaced
    class Fixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, **batch) -> JointPreTrainingOutput:
            mlm_logits = torch.full((3, 40), -5.0)
            mlm_logits[0, 11] = mlm_logits[1, 13] = mlm_logits[2, 2] = 5.0  # 2 of the 3 masked tokens right
            return JointPreTrainingOutput(loss=torch.zeros(()), mlm_loss=torch.zeros(()), rtd_loss=loss,
                                          mlm_logits=mlm_logits, rtd_logits=LOGITS, rtd_labels=replaced)

    batch = {"input_ids": IDS, "attention_mask": MASK, "labels": LABELS}
    metrics = pretraining_metrics(Fixed(), [batch, batch])
    assert metrics["rtd_loss"] == pytest.approx(expected, abs=1e-6)
    assert metrics["rtd_accuracy_replaced"] == 1.0 and metrics["rtd_accuracy_original"] == pytest.approx(4 / 6)
    assert metrics["replaced_fraction"] == 0.25 and metrics["mlm_accuracy"] == pytest.approx(2 / 3)


def test_the_joint_forward_labels_what_the_generator_sampled() -> None:
    torch.manual_seed(0)
    model = ElectraForPreTraining.with_generator(tiny_config()).eval()
    with torch.no_grad():  # the generator puts all its mass on token 13: every sample is 13
        model.generator.generator_lm_head.bias.fill_(-1e4)
        model.generator.generator_lm_head.bias[13] = 1e4
    out = model(IDS, MASK, None, labels=LABELS)
    # 13 at (0, 3) is its original (not replaced); 13 for 11 and for 15 are replacements
    assert out.rtd_labels.tolist() == [[0, 1, 0, 0, 0], [0, 1, 0, -100, -100]]
    real = MASK.bool()
    z, y = out.rtd_logits[real], out.rtd_labels[real].float()
    by_formula = -(y * torch.log(torch.sigmoid(z)) + (1 - y) * torch.log(1 - torch.sigmoid(z))).mean()
    torch.testing.assert_close(out.rtd_loss, by_formula, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.loss, out.mlm_loss + 50 * out.rtd_loss, atol=1e-4, rtol=0)
    assert out.mlm_logits.shape == (3, 60)


def test_the_generator_is_a_quarter_of_the_discriminator_on_its_embeddings() -> None:
    small = ElectraConfig.from_preset("electra-small-discriminator")
    generator = generator_config(small)
    assert (generator.hidden_size, generator.intermediate_size, generator.num_attention_heads) == (64, 256, 1)
    assert generator.embedding_size == small.embedding_size and generator.num_hidden_layers == small.num_hidden_layers
    base = generator_config(ElectraConfig.from_preset("electra-base-discriminator"))
    assert (base.hidden_size, base.intermediate_size, base.num_attention_heads, base.embedding_size) == (192, 768, 3, 768)
    half = generator_config(small, 0.5)
    assert (half.hidden_size, half.num_attention_heads) == (128, 2)
    with pytest.raises(ValueError, match="generator_size"):
        generator_config(small, 0.0)


def test_the_embeddings_are_one_parameter_reached_by_both_losses() -> None:
    torch.manual_seed(0)
    model = ElectraForPreTraining.with_generator(tiny_config()).eval()
    assert model.generator.electra.embeddings is model.discriminator.electra.embeddings
    state = model.state_dict()
    assert [key for key in state if key.endswith("word_embeddings.weight")] == \
        ["discriminator.electra.embeddings.word_embeddings.weight"]
    words = model.embeddings.word_embeddings.weight
    assert sum(p is words for p in model.parameters()) == 1
    assert sum(p is words for group in param_groups(model, 0.01) for p in group["params"]) == 1

    out = model(IDS, MASK, None, labels=LABELS)
    from_mlm, = torch.autograd.grad(out.mlm_loss, words, retain_graph=True)
    from_rtd, = torch.autograd.grad(out.rtd_loss, words, retain_graph=True)
    from_both, = torch.autograd.grad(out.loss, words, retain_graph=True)
    assert from_mlm.abs().sum() > 0 and from_rtd.abs().sum() > 0
    torch.testing.assert_close(from_both, from_mlm + 50 * from_rtd)
    # no gradient reaches the generator through its samples: the detection loss leaves its layers alone
    layer = model.generator.electra.encoder.layers[0].attention.qkv.weight
    assert torch.autograd.grad(out.rtd_loss, layer, allow_unused=True)[0] is None

    # saved apart, each half holds the embeddings as its own
    generator = model.standalone_generator()
    assert isinstance(generator, ElectraForMaskedLM)
    assert torch.equal(generator.state_dict()["electra.embeddings.word_embeddings.weight"], words)
    assert generator.electra.embeddings is not model.embeddings


def test_the_objective_is_checked_against_the_model_and_the_data() -> None:
    from bertforge.model import registry

    rtd = DataOptions(objective="rtd")
    assert isinstance(pretraining_model(rtd, tiny_config(), "none")(), ElectraForJointPreTraining)
    with pytest.raises(ValueError, match="objective 'none'"):
        pretraining_model(rtd, tiny_config(), "nsp")
    with pytest.raises(ValueError, match="replaced-token detector"):
        pretraining_model(rtd, registry.from_preset("tiny"), "none")
    with pytest.raises(ValueError, match="not the data's"):
        pretraining_model(DataOptions(objective="sop"), registry.from_preset("tiny"), "nsp")
    with pytest.raises(ValueError, match="objective 'mlm'"):
        DataOptions(objective="mlm")
    with pytest.raises(ValueError, match="generator_size"):
        DataOptions(generator_size=1.5)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from bertforge.data.prepare import prepare
    from bertforge.tokenizer import BertTokenizer

    root = tmp_path_factory.mktemp("electra-shards")
    tokenizer = BertTokenizer.train([FIXTURE], vocab_size=400, show_progress=False)
    tokenizer.save_pretrained(root / "tokenizer")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepare([FIXTURE], root / "tokenizer", root / "data", max_seq_length=64, plain_text=True, objective="none",
                masking="dynamic", validation_fraction=0.1, block_sentences=16, progress=False)
    return root / "data", root / "tokenizer"


@pytest.mark.slow
def test_pretrain_rtd_learns_resumes_bit_exactly_and_exports_the_discriminator(shards, tmp_path: Path,
                                                                               monkeypatch) -> None:
    from bertforge.finetune import finetune

    data, tokenizer = shards
    settings = dict(max_steps=8, save_every=4, eval_every=4, grad_accum=2, lr=2e-3, warmup_steps=1,
                    tokenizer=str(tokenizer), **MODEL, **SMALL)
    straight = pretrain("electra-small-discriminator", data, tmp_path / "straight", **settings)

    # the loss falls, and every figure of the objective is logged
    train = [r["loss"] for r in read_metrics(tmp_path / "straight") if r["split"] == "train"]
    assert train[-1] < 0.9 * train[0], train  # 40.0 over steps 1-2 (mlm ~6 + 50 x rtd ~0.7), 34.3 over 7-8
    assert set(straight.train.metrics) == {"mlm_loss", "mlm_accuracy", "rtd_loss", "rtd_accuracy_replaced",
                                           "rtd_accuracy_original", "replaced_fraction"}
    assert 0.05 < straight.train.metrics["replaced_fraction"] < 0.2  # ~15% masked, nearly all replaced
    evals = [r for r in read_metrics(tmp_path / "straight") if r["split"] == "eval"]
    assert evals[-1]["rtd_loss"] < evals[0]["rtd_loss"] < math.log(2)

    # killed after the checkpoint of step 4, resumed: the same weights at step 8, bit for bit
    real_iter, fetched = ShardBatches.__iter__, []

    def dying_iter(self):
        for batch in real_iter(self):
            if len(fetched) == 4 * 2 + 1:
                raise KeyboardInterrupt("killed")
            fetched.append(1)
            yield batch

    monkeypatch.setattr(ShardBatches, "__iter__", dying_iter)
    with pytest.raises(KeyboardInterrupt):
        pretrain("electra-small-discriminator", data, tmp_path / "crashed", **settings)
    monkeypatch.setattr(ShardBatches, "__iter__", real_iter)
    assert latest_checkpoint(tmp_path / "crashed").name == "step-000004"
    resumed = pretrain("electra-small-discriminator", data, tmp_path / "crashed", resume=True, **settings)
    a = load_file(tmp_path / "straight" / "checkpoints" / "step-000008" / "model.safetensors")
    b = load_file(tmp_path / "crashed" / "checkpoints" / "step-000008" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {k for k in a if "word_embeddings" in k} == {"discriminator.electra.embeddings.word_embeddings.weight"}
    assert resumed.train.metrics == straight.train.metrics

    # final/ is the discriminator (transformers' ElectraForPreTraining), the generator beside it
    final = resumed.final
    model, report = load_any(final)
    assert type(model) is ElectraForPreTraining and report.ok
    assert json.loads((final / "config.json").read_text())["hidden_size"] == 64
    assert torch.equal(model.electra.embeddings.word_embeddings.weight,
                       a["discriminator.electra.embeddings.word_embeddings.weight"])
    generator, report = load_any(final / "generator")
    assert type(generator) is ElectraForMaskedLM and report.ok and generator.config.hidden_size == 16
    assert torch.equal(generator.electra.embeddings.word_embeddings.weight, model.electra.embeddings.word_embeddings.weight)
    theirs = transformers.ElectraForPreTraining.from_pretrained(final).eval()
    ids = torch.tensor([[2, 50, 60, 70, 3, 0]])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids, (ids != 0).long()).logits[:, :5],
                                   theirs(input_ids=ids, attention_mask=(ids != 0).long()).logits[:, :5],
                                   atol=1e-5, rtol=0)

    # and fine-tuning starts from it
    task = {"train": str(CLASSIFY / "reviews.csv"), "dev": str(CLASSIFY / "reviews-dev.csv")}
    results = finetune("classify", None, final, None, tmp_path / "classify", epochs=1, batch_size=4, max_length=32,
                       task_settings=task, progress=False, verbose=False)
    assert "accuracy" in results["summary"]
    tuned, report = load_any(tmp_path / "classify" / "seed-1")
    assert type(tuned).__name__ == "ElectraForSequenceClassification" and report.ok


def test_init_from_a_finished_run_loads_both_halves(shards, tmp_path: Path) -> None:
    data, tokenizer = shards
    settings = dict(tokenizer=str(tokenizer), **MODEL, **SMALL)
    first = pretrain("electra-small-discriminator", data, tmp_path / "first", max_steps=2, lr=2e-3, **settings).final
    # at lr 1e-9 one step leaves the weights where they were: both halves come from first/
    again = pretrain("electra-small-discriminator", data, tmp_path / "again", max_steps=1, lr=1e-9, warmup_steps=0,
                     init_from=first, **settings).final
    for part in (Path("."), Path("generator")):
        started, ended = load_file(first / part / "model.safetensors"), load_file(again / part / "model.safetensors")
        assert started.keys() == ended.keys()
        for key in started:
            torch.testing.assert_close(ended[key], started[key], atol=1e-7, rtol=0, msg=key)
