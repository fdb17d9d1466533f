"""The accuracy study of inference precision runs end to end on a fixture model and renders its table."""

from __future__ import annotations

from pathlib import Path

import torch

from bertforge import BertConfig, BertForSequenceClassification
from bertforge.model import set_labels
from bertforge.tokenizer import BertTokenizer
from experiments import precision_accuracy as study

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


def test_scores_every_variant_and_renders(tmp_path: Path) -> None:
    tokenizer = BertTokenizer.train([FIXTURES / "glue" / "MRPC" / "train.tsv"], vocab_size=200, min_frequency=1,
                                    show_progress=False)
    torch.manual_seed(0)
    config = set_labels(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64, max_position_embeddings=128),
                        ["0", "1"])
    BertForSequenceClassification(config).save_pretrained(tmp_path / "run" / "seed-1", tokenizer=tokenizer)
    row = study.score("MRPC", study.model_dir(tmp_path / "run"), FIXTURES, max_examples=None)
    assert set(row["metrics"]) == set(study.VARIANTS)
    assert set(row["points_lost"]) == set(study.VARIANTS[1:])
    for variant in study.VARIANTS[1:]:
        fp32, other = row["metrics"]["fp32"], row["metrics"][variant]
        assert row["points_lost"][variant] == max(100 * (fp32[m] - other[m]) for m in ("accuracy", "f1"))
        assert 0 <= row["changed_predictions"][variant] <= 1 and row["max_output_change"][variant] > 0
    payload = {"machine": {"cpu": "Some CPU", "cpu_flags": ["avx512_bf16"], "torch": "2", "date": "today"},
               "torchao": "0.18", "rows": [row], "not_measured": ["SQuAD: no fine-tuned model"]}
    text = study.render(payload, "python -m experiments.precision_accuracy --model MRPC=x")
    assert "| MRPC | 1 | int8 |" in text and "Not measured: SQuAD: no fine-tuned model." in text
    assert "Some CPU (flags of note: avx512_bf16)" in text
