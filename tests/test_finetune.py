"""Fine-tuning: features, windows and offset mapping in detail, then a tiny end-to-end run per family.

The end-to-end runs use a randomly initialised one-layer model and the small fixtures under
tests/fixtures/tasks; they check the plumbing (the one training loop, result and prediction files,
checkpoints that `transformers` loads), not the scores.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge import BertConfig, BertModel, BertTokenizer
from bertforge.finetune import finetune, predict, summarize
from bertforge.tasks import make_task
from bertforge.tasks.base import (
    IGNORE_INDEX,
    DataFormatError,
    Feature,
    TaskBatches,
    collate,
    max_context_score,
    run_model,
)
from bertforge.tasks.glue import GlueExample
from bertforge.tasks.ner import NerSentence, word_windows
from bertforge.tasks.squad import SquadAnswer, SquadExample, char_span_to_pieces, context_windows
from bertforge.tasks.swag import SwagExample

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"

CORPUS = [
    "the normans were a people who gave their name to normandy , a region in france .",
    "zurich is the largest city in switzerland ; its airport opened in 1948 .",
    "the company made money , he said . she opens the door and walks in .",
    "new york times reported that anna smith met bob in rome .",
    "a gripping , beautifully acted film with a terrible ending .",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> BertTokenizer:
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 10) + "\n", encoding="utf-8")
    return BertTokenizer.train([corpus], vocab_size=200, min_frequency=1, show_progress=False)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: BertTokenizer) -> Path:
    """A random one-layer encoder saved like a pre-trained checkpoint (pooler included)."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    directory = tmp_path_factory.mktemp("encoder")
    BertModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def pieces(tokenizer: BertTokenizer, text: str) -> list[str]:
    return tokenizer.tokenize(text)


# ------------------------------------------------------------------------------------------------
# collate and batches
# ------------------------------------------------------------------------------------------------
def test_collate_pads_to_the_longest_row() -> None:
    features = [Feature({"input_ids": [2, 7, 3], "token_type_ids": [0, 0, 0], "labels": [IGNORE_INDEX, 1, IGNORE_INDEX]}, 0),
                Feature({"input_ids": [2, 8, 9, 10, 3], "token_type_ids": [0, 0, 1, 1, 1],
                         "labels": [IGNORE_INDEX, 0, 2, 2, IGNORE_INDEX]}, 1)]
    batch = collate(features, pad_id=0)
    assert batch["input_ids"].tolist() == [[2, 7, 3, 0, 0], [2, 8, 9, 10, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 1, 1, 1]]
    assert batch["labels"].tolist()[0] == [IGNORE_INDEX, 1, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]

    scores = collate([Feature({"input_ids": [2, 3], "token_type_ids": [0, 0], "labels": 4.5}, 0)])
    assert scores["labels"].dtype == torch.float32 and scores["labels"].tolist() == [4.5]
    choices = collate([Feature({"input_ids": [[2, 5, 3], [2, 3]], "token_type_ids": [[0, 1, 1], [0, 0]],
                                "labels": 1}, 0)] * 2)
    assert choices["input_ids"].shape == (2, 2, 3) and choices["attention_mask"][0, 1].tolist() == [1, 1, 0]
    assert "labels" not in collate(features, with_labels=False)


def _features(lengths: list[int]) -> list[Feature]:
    return [Feature({"input_ids": [5] * n, "token_type_ids": [0] * n, "labels": i % 2}, i)
            for i, n in enumerate(lengths)]


def test_task_batches_cover_every_feature_and_bucket_by_length() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 100, size=203).tolist()
    batches = TaskBatches(_features(lengths), batch_size=8, seed=1, bucket_batches=5)
    assert len(batches) == math.ceil(203 / 8)
    order = batches.order(0)
    assert sorted(np.concatenate(order).tolist()) == list(range(203))
    assert sum(len(b) < 8 for b in order) == 1  # only one short batch
    assert [b.tolist() for b in batches.order(0)] == [b.tolist() for b in order]  # deterministic
    assert [b.tolist() for b in batches.order(1)] != [b.tolist() for b in order]  # reshuffled per epoch

    def padding(order: list[np.ndarray]) -> int:
        return sum(int(lengths_arr[b].max()) * len(b) - int(lengths_arr[b].sum()) for b in order)

    lengths_arr = np.array(lengths)
    shuffled = np.random.default_rng(1).permutation(203)
    unbucketed = [shuffled[i:i + 8] for i in range(0, 203, 8)]
    assert padding(order) < padding(unbucketed) / 3


def test_task_batches_resume_mid_epoch() -> None:
    features = _features(list(range(3, 40)))
    first = TaskBatches(features, batch_size=4, seed=3)
    stream = iter(first)
    for _ in range(4):
        next(stream)
    state = first.state_dict()
    rest = [b["input_ids"].tolist() for b in stream]
    resumed = TaskBatches(features, batch_size=4, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [b["input_ids"].tolist() for b in resumed] == rest
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["position"] == 0
    with pytest.raises(ValueError):
        TaskBatches([], batch_size=4)


def test_max_context_score_prefers_the_centred_window() -> None:
    assert max_context_score(5, 0, 10) == pytest.approx(4 + 0.1)
    assert max_context_score(5, 4, 10) == pytest.approx(1 + 0.1)
    assert max_context_score(3, 4, 10) == -math.inf
    assert max_context_score(13, 4, 10) == pytest.approx(0 + 0.1)


# ------------------------------------------------------------------------------------------------
# SQuAD: windows, labels, max context, offsets back to the text
# ------------------------------------------------------------------------------------------------
def test_context_windows() -> None:
    assert context_windows(5, 10, 3) == [(0, 5)]
    assert context_windows(0, 10, 3) == [(0, 0)]
    assert context_windows(20, 8, 4) == [(0, 8), (4, 8), (8, 8), (12, 8)]
    assert context_windows(20, 8, 50) == [(0, 8), (8, 8), (16, 4)]  # a long stride is cut to the window
    for n, budget, stride in [(37, 9, 4), (100, 30, 7), (9, 9, 1)]:
        windows = context_windows(n, budget, stride)
        covered = {p for start, length in windows for p in range(start, start + length)}
        assert covered == set(range(n)) and windows[-1][0] + windows[-1][1] == n
        assert all(length <= budget for _, length in windows)


def test_char_span_to_pieces() -> None:
    offsets = [(0, 3), (4, 9), (9, 10), (11, 15)]  # "The Zuric h ..." style pieces
    assert char_span_to_pieces(offsets, 4, 10) == (1, 2)
    assert char_span_to_pieces(offsets, 5, 6) == (1, 1)  # inside one piece
    assert char_span_to_pieces(offsets, 10, 11) is None  # only the space between pieces


def _squad_example(context: str, answer: str, qid: str = "q", question: str = "where is it ?",
                   occurrence: int = 0) -> SquadExample:
    start = -1
    for _ in range(occurrence + 1):
        start = context.index(answer, start + 1)
    return SquadExample(qid, "t", question, context, [SquadAnswer(answer, start)])


def test_squad_answer_spanning_two_windows(tokenizer: BertTokenizer) -> None:
    context = " ".join(["the normans gave their name to normandy ."] * 3) + " anna smith met bob in rome ."
    example = _squad_example(context, "anna smith met bob")
    question_pieces = len(pieces(tokenizer, example.question))
    # a stride shorter than the answer (4 pieces) guarantees windows that start inside it
    squad = make_task("squad", "v1.1", {"doc_stride": 3})
    n_context = len(pieces(tokenizer, context))
    budget = 10
    features = squad.featurize([example], tokenizer, max_length=question_pieces + 3 + budget)
    windows = [f.meta for f in features]
    assert [(w.first_piece, w.length) for w in windows] == context_windows(n_context, budget, 3)
    answer = char_span_to_pieces(windows[0].offsets, example.answers[0].answer_start,
                                 example.answers[0].answer_start + len("anna smith met bob"))
    assert answer is not None
    labelled = 0
    for feature, window in zip(features, windows, strict=True):
        inputs = feature.inputs
        assert len(inputs["input_ids"]) <= question_pieces + 3 + budget
        assert inputs["input_ids"][0] == tokenizer.cls_token_id and inputs["input_ids"][-1] == tokenizer.sep_token_id
        assert inputs["token_type_ids"] == [0] * window.context_start + [1] * (window.length + 1)
        inside = window.first_piece <= answer[0] and answer[1] < window.first_piece + window.length
        if inside:
            labelled += 1
            start, end = inputs["start_positions"], inputs["end_positions"]
            tokens = tokenizer.convert_ids_to_tokens(inputs["input_ids"][start:end + 1])
            assert tokenizer.decode(inputs["input_ids"][start:end + 1]) == "anna smith met bob", tokens
        else:  # a window with part of the answer, or none of it, points at [CLS]
            assert (inputs["start_positions"], inputs["end_positions"]) == (0, 0)
    straddling = [w for w in windows if w.first_piece <= answer[1] and answer[0] < w.first_piece + w.length
                  and not (w.first_piece <= answer[0] and answer[1] < w.first_piece + w.length)]
    assert labelled >= 1 and straddling, "the fixture should have a window that cuts the answer"


def test_squad_max_context_flags(tokenizer: BertTokenizer) -> None:
    context = " ".join(CORPUS)
    squad = make_task("squad", "v1.1", {"doc_stride": 5})
    example = _squad_example(context, "zurich")
    question_pieces = len(pieces(tokenizer, example.question))
    features = squad.featurize([example], tokenizer, max_length=question_pieces + 3 + 16)
    n_context = len(pieces(tokenizer, context))
    chosen: dict[int, list[int]] = {}
    for k, feature in enumerate(features):
        window = feature.meta
        for i, flag in enumerate(window.max_context):
            if flag:
                chosen.setdefault(window.first_piece + i, []).append(k)
    assert sorted(chosen) == list(range(n_context)) and all(len(v) == 1 for v in chosen.values())
    for piece, (k,) in chosen.items():
        scores = [max_context_score(piece, f.meta.first_piece, f.meta.length) for f in features]
        assert scores[k] == max(scores)


def _peaked_outputs(features: list[Feature], spans: dict[int, tuple[int, int]], null: float = -5.0
                    ) -> list[dict[str, np.ndarray]]:
    """Start/end logits per feature: 0 everywhere, `null` on [CLS], 10 at the given (start, end) tokens."""
    outputs = []
    for k, feature in enumerate(features):
        n = len(feature.inputs["input_ids"])
        start, end = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=np.float32)
        start[0] = end[0] = null / 2
        if k in spans:
            start[spans[k][0]] += 10.0
            end[spans[k][1]] += 10.0
        outputs.append({"start_logits": start, "end_logits": end})
    return outputs


def _token_range(feature: Feature, char_start: int, char_end: int) -> tuple[int, int]:
    window = feature.meta
    first, last = char_span_to_pieces(window.offsets, char_start, char_end)
    return (window.context_start + first - window.first_piece, window.context_start + last - window.first_piece)


@pytest.mark.parametrize("answer", ["Zürich's café «Größe»", "naïve, résumé", "1948!", "Straße"])
def test_squad_offsets_give_back_the_original_text(tokenizer: BertTokenizer, answer: str) -> None:
    context = "In Zürich's café «Größe» (opened 1948!) a naïve, résumé-writing waiter met Straße."
    example = _squad_example(context, answer)
    squad = make_task("squad", "v1.1")
    features = squad.featurize([example], tokenizer, max_length=128)
    assert len(features) == 1
    start = example.answers[0].answer_start
    span = _token_range(features[0], start, start + len(answer))
    prediction = squad.postprocess([example], features, _peaked_outputs(features, {0: span}))[0]
    # pieces cover whole words: the answer is the piece span's text, cut from the original context
    window = features[0].meta
    first, last = span[0] - window.context_start, span[1] - window.context_start
    assert prediction.text == context[window.offsets[first][0]:window.offsets[last][1]]
    assert answer.rstrip("!") in prediction.text and prediction.text in context
    assert prediction.nbest[0]["text"] == prediction.text and len(prediction.nbest) <= 20
    assert sum(c["probability"] for c in prediction.nbest) == pytest.approx(1.0)
    assert squad.metric([example], [prediction])["exact_match"] in (0.0, 100.0)


def test_squad_span_limits_and_max_context_in_postprocessing(tokenizer: BertTokenizer) -> None:
    context = " ".join(["the normans gave their name to normandy ."] * 8)
    example = _squad_example(context, "normandy", occurrence=3)
    squad = make_task("squad", "v1.1", {"doc_stride": 8, "max_answer_length": 3})
    q = len(pieces(tokenizer, example.question))
    features = squad.featurize([example], tokenizer, max_length=q + 3 + 20)
    assert len(features) > 2
    start = example.answers[0].answer_start
    # the answer's pieces: find a window where the start piece is NOT max-context and peak there,
    # and a weaker peak in the window where it is: the latter must win
    owners = [k for k, f in enumerate(features) if _covers(f, start, start + len("normandy"))]
    best = [k for k in owners if f_is_max(features[k], start)]
    others = [k for k in owners if k not in best]
    assert best and others
    outputs = _peaked_outputs(features, {others[0]: _token_range(features[others[0]], start, start + 8)})
    wanted = _token_range(features[best[0]], start, start + 8)
    outputs[best[0]]["start_logits"][wanted[0]] += 6.0  # 12 in all: beats 10 (an allowed start with
    # the other window's end peak), loses to the 20 of the peak whose start is not max-context there
    outputs[best[0]]["end_logits"][wanted[1]] += 6.0
    prediction = squad.postprocess([example], features, outputs)[0]
    assert prediction.text == "normandy" and prediction.nbest[0]["start"] == start
    # a span longer than max_answer_length (3 pieces) is never proposed
    for candidate in prediction.nbest:
        assert len(tokenizer.tokenize(candidate["text"])) <= 3


def _covers(feature: Feature, char_start: int, char_end: int) -> bool:
    window = feature.meta
    span = char_span_to_pieces(window.offsets, char_start, char_end)
    return span is not None and window.first_piece <= span[0] and span[1] < window.first_piece + window.length


def f_is_max(feature: Feature, char_start: int) -> bool:
    window = feature.meta
    piece = char_span_to_pieces(window.offsets, char_start, char_start + 1)[0]
    return window.max_context[piece - window.first_piece]


def test_squad_v2_null_answers_and_threshold(tokenizer: BertTokenizer) -> None:
    context = "zurich is the largest city in switzerland ; its airport opened in 1948 ."
    answerable = _squad_example(context, "1948", qid="a")
    impossible = SquadExample("b", "t", "when did the station open ?", context, [], True)
    squad = make_task("squad", "v2.0")
    features = squad.featurize([answerable, impossible], tokenizer, max_length=64)
    assert (features[1].inputs["start_positions"], features[1].inputs["end_positions"]) == (0, 0)
    start = answerable.answers[0].answer_start
    spans = {0: _token_range(features[0], start, start + 4), 1: _token_range(features[1], start, start + 4)}
    outputs = _peaked_outputs(features, spans, null=0.0)
    outputs[1]["start_logits"][0] = outputs[1]["end_logits"][0] = 15.0  # the null wins for b: 30 vs 20
    predictions = squad.postprocess([answerable, impossible], features, outputs)
    assert predictions[0].text == "1948" and predictions[0].null_odds == pytest.approx(-20.0)
    assert predictions[1].text == "" and predictions[1].null_odds == pytest.approx(10.0)
    assert predictions[1].best_span == "1948"
    metrics = squad.metric([answerable, impossible], predictions)
    assert metrics["exact"] == 100.0 and metrics["HasAns_exact"] == 100.0 and metrics["NoAns_exact"] == 100.0
    assert metrics["best_f1"] == 100.0
    tuned = squad.tune([answerable, impossible], predictions)
    assert -20.0 <= tuned["null_threshold"] < 10.0
    squad.settings["null_threshold"] = 50.0  # now everything is answered
    assert squad.postprocess([answerable, impossible], features, outputs)[1].text == "1948"


def test_squad_reader_split_by_article(tmp_path: Path) -> None:
    squad = make_task("squad", "squad", {"train_articles": 1})
    train = squad.read(FIXTURES / "squad" / "v1.json", "train")
    dev = squad.read(FIXTURES / "squad" / "v1.json", "dev")
    assert [e.id for e in train] == ["q1", "q2"] and [e.id for e in dev] == ["q3"]
    assert squad.version == "1.1"
    shutil.copy(FIXTURES / "squad" / "v2.json", tmp_path / "dev-v2.0.json")
    shutil.copy(FIXTURES / "squad" / "v1.json", tmp_path / "dev-v1.1.json")
    assert make_task("squad", "v2.0").data_file(tmp_path, "dev").name == "dev-v2.0.json"
    with pytest.raises(FileNotFoundError, match="2 files"):
        make_task("squad", "squad").data_file(tmp_path, "dev")
    with pytest.raises(ValueError, match="unknown SQuAD task"):
        make_task("squad", "v3")


# ------------------------------------------------------------------------------------------------
# NER: word alignment and windows
# ------------------------------------------------------------------------------------------------
def test_word_windows() -> None:
    assert word_windows([1, 2, 1], budget=10, stride=2) == [(0, 3)]
    counts = [1, 3, 2, 1, 1, 4, 2, 1]
    windows = word_windows(counts, budget=6, stride=3)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    assert windows[0][0] == 0 and windows[-1][1] == len(counts)
    for (start, end), (next_start, _) in zip(windows, windows[1:], strict=False):
        assert start < next_start <= end  # moves on, never leaves a gap
    assert all(offsets[end] - offsets[start] <= 6 for start, end in windows)
    assert word_windows([9, 1], budget=4, stride=2) == [(0, 1), (1, 2)]  # a word longer than the window


def test_ner_first_piece_labelled_and_words_kept(tokenizer: BertTokenizer) -> None:
    words = ["Gripping", "Zürich-based", "\u200b", "Normandy", "."]
    long_word = max(words, key=lambda w: len(tokenizer.tokenize(w)))
    assert len(tokenizer.tokenize(long_word)) > 1
    sentence = NerSentence("s-0", words, ["O", "B-LOC", "O", "B-LOC", "O"], [], [], 0)
    ner = make_task("ner")
    labels = ["O", "B-LOC", "I-LOC"]
    (feature,) = ner.featurize([sentence], tokenizer, max_length=64, label_names=labels)
    ids, tags = feature.inputs["input_ids"], feature.inputs["labels"]
    assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
    assert tags[0] == tags[-1] == IGNORE_INDEX
    window = feature.meta
    assert len(window.token_of_word) == len(words) and all(window.max_context)
    for w, position in enumerate(window.token_of_word):
        assert tags[position] == labels.index(sentence.labels[w])
        following = window.token_of_word[w + 1] if w + 1 < len(words) else len(ids) - 1
        assert all(t == IGNORE_INDEX for t in tags[position + 1:following])  # later pieces are ignored
    assert ids[window.token_of_word[2]] == tokenizer.unk_token_id  # a word with no pieces becomes [UNK]
    # each word's first piece, in order, is the word's first piece on its own
    for w, position in enumerate(window.token_of_word):
        if w != 2:
            assert tokenizer.convert_ids_to_tokens(ids[position]) == tokenizer.tokenize(words[w])[0]
    with pytest.raises(ValueError, match="not one of the model's labels"):
        ner.featurize([sentence], tokenizer, max_length=64, label_names=["O", "B-PER"])


def test_ner_long_sentence_windows_map_back_to_words(tokenizer: BertTokenizer) -> None:
    text = ("The Normans gave their name to Normandy , a region in France ; Zürich is the largest city "
            "in Switzerland and Anna Smith met Bob in Rome .")
    words = text.split(" ")
    tags = ["O"] * len(words)
    for i, word in enumerate(words):
        if word in ("Normandy", "France", "Zürich", "Switzerland", "Rome"):
            tags[i] = "B-LOC"
        elif word in ("Anna", "Bob"):
            tags[i] = "B-PER"
        elif word == "Smith":
            tags[i] = "I-PER"
    sentence = NerSentence("s-1", words, tags, [], [], 0)
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    ner = make_task("ner")
    features = ner.featurize([sentence], tokenizer, max_length=14, label_names=labels)
    assert len(features) > 2
    chosen = [0] * len(words)
    for feature in features:
        assert len(feature.inputs["input_ids"]) <= 14
        window = feature.meta
        for offset, flag in enumerate(window.max_context):
            chosen[window.first_word + offset] += flag
    assert chosen == [1] * len(words)  # every word is predicted in exactly one window
    # logits that say the gold tag at each word's first piece (and nonsense elsewhere) give back the tags
    outputs = []
    for feature in features:
        logits = np.zeros((len(feature.inputs["input_ids"]), len(labels)), dtype=np.float32)
        logits[:, 4] = 1.0
        for offset, position in enumerate(feature.meta.token_of_word):
            logits[position, labels.index(tags[feature.meta.first_word + offset])] = 5.0
        outputs.append({"logits": logits})
    assert ner.postprocess([sentence], features, outputs, label_names=labels) == [tags]
    assert ner.metric([sentence], [tags])["f1"] == 1.0


# ------------------------------------------------------------------------------------------------
# GLUE and SWAG features, prediction files
# ------------------------------------------------------------------------------------------------
def test_glue_features_and_leaderboard_files(tokenizer: BertTokenizer, tmp_path: Path) -> None:
    rte = make_task("glue", "RTE")
    examples = [GlueExample("dev-0", "the normans gave their name to normandy . " * 10, "normandy is a region .",
                            "entailment"),
                GlueExample("dev-1", "a film .", "a terrible ending .", "not_entailment")]
    features = rte.featurize(examples, tokenizer, max_length=24)
    assert len(features[0].inputs["input_ids"]) == 24 and features[0].inputs["labels"] == 0
    assert features[1].inputs["labels"] == 1 and 1 in features[0].inputs["token_type_ids"]
    (path,) = rte.write_predictions(examples, [1, 0], tmp_path, "test")
    assert path.name == "RTE.tsv"
    assert path.read_text().splitlines() == ["index\tprediction", "0\tnot_entailment", "1\tentailment"]
    stsb = make_task("glue", "STS-B")
    assert stsb.label_names([]) == 1
    scored = stsb.featurize([GlueExample("test-7", "a", "b", 3.2)], tokenizer, 16)
    assert scored[0].inputs["labels"] == pytest.approx(3.2)
    (path,) = stsb.write_predictions([GlueExample("test-7", "a", "b", None)] * 2, [5.7, 2.25], tmp_path, "test")
    assert path.read_text().splitlines() == ["index\tprediction", "7\t5.000", "7\t2.250"]
    mnli = make_task("glue", "MNLI-mm")
    assert mnli.name == "mnli" and mnli.eval_splits() == ("dev_matched", "dev_mismatched")
    names = [mnli.write_predictions(examples[:1], [0], tmp_path, s)[0].name for s in mnli.test_splits()]
    assert names == ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]
    with pytest.raises(ValueError):
        make_task("glue", "AX")


def test_swag_features(tokenizer: BertTokenizer) -> None:
    swag = make_task("swag")
    example = SwagExample("e", "she opens the door .", "she", ["walks in .", "eats the door .", "flies .", "sings ."], 2)
    (feature,) = swag.featurize([example], tokenizer, max_length=32)
    assert len(feature.inputs["input_ids"]) == 4 and feature.inputs["labels"] == 2
    batch = collate([feature, feature])
    assert batch["input_ids"].shape[:2] == (2, 4)
    assert swag.metric([example], [2]) == {"accuracy": 1.0}


def test_run_model_restores_feature_order(encoder_dir: Path, tokenizer: BertTokenizer) -> None:
    from bertforge.finetune import load_for_task
    from bertforge.model import BertForTokenClassification

    model = load_for_task(BertForTokenClassification, encoder_dir)
    texts = ["the normans", "zurich is the largest city in switzerland", "a film"]
    features = [Feature({"input_ids": e.input_ids, "token_type_ids": e.token_type_ids}, i)
                for i, e in enumerate(tokenizer.encode_batch(texts)["encodings"])]
    model.train()
    together = run_model(model, features, ["logits"], token_outputs=["logits"], batch_size=2)
    assert model.training  # the caller's mode is restored
    for feature, output in zip(features, together, strict=True):
        alone = run_model(model, [feature], ["logits"], token_outputs=["logits"])[0]["logits"]
        assert output["logits"].shape == (feature.length, 2)
        np.testing.assert_allclose(output["logits"], alone, atol=1e-5)


def test_summarize() -> None:
    summary = summarize([{"f1": 0.8, "acc": 0.5}, {"f1": 0.9, "acc": 0.7}, {"f1": 0.7, "acc": 0.6}])
    assert summary["f1"]["mean"] == pytest.approx(0.8) and summary["f1"]["std"] == pytest.approx(0.1)
    assert summary["acc"]["median"] == pytest.approx(0.6) and summarize([{"x": 1.0}])["x"]["std"] == 0.0


# ------------------------------------------------------------------------------------------------
# end to end: the one loop, result files, prediction files, transformers-loadable models
# ------------------------------------------------------------------------------------------------
def _assert_loads_in_transformers(directory: Path, auto_class: str) -> None:
    import transformers

    cls = getattr(transformers, auto_class)
    model, info = cls.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.config.to_dict()["model_type"] == "bert"


def _run_record(seed_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (seed_dir / "run" / "metrics.jsonl").read_text().splitlines()]


def test_end_to_end_glue(encoder_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "mrpc"
    results = finetune("glue", "MRPC", encoder_dir, FIXTURES / "glue", out, seeds=(1, 2), epochs=2,
                       batch_size=2, progress=False, verbose=False)
    saved = json.loads((out / "results.json").read_text())
    assert saved["summary"].keys() == {"accuracy", "f1"} and len(saved["seeds"]) == 2
    # the paper's 2e-5, scaled to the fixture's width (H=32: x16 at most)
    assert saved["hyperparameters"]["lr"] == pytest.approx(2e-5 * 16) and saved["hyperparameters"]["max_length"] == 128
    assert results["summary"]["accuracy"]["values"] == [s["metrics"]["accuracy"] for s in saved["seeds"]]
    seed_dir = out / "seed-1"
    assert {"config.json", "model.safetensors", "vocab.txt", "task.json", "MRPC-dev.tsv"} <= {
        p.name for p in seed_dir.iterdir()}
    assert not (seed_dir / "run" / "checkpoints").exists()  # the loop's checkpoint is dropped once saved
    records = _run_record(seed_dir)
    assert [r["step"] for r in records if r["split"] == "eval"] == [1, 2]  # one evaluation per epoch
    config = json.loads((seed_dir / "config.json").read_text())
    # MRPC's classes by name (the files say 0/1; the leaderboard file keeps 0/1)
    assert config["id2label"] == {"0": "not_equivalent", "1": "equivalent"} and config["architectures"] == ["BertForSequenceClassification"]
    _assert_loads_in_transformers(seed_dir, "AutoModelForSequenceClassification")

    done = predict("glue", "MRPC", seed_dir, FIXTURES / "glue", tmp_path / "submission")
    lines = (tmp_path / "submission" / "MRPC.tsv").read_text().splitlines()
    assert done["test"]["examples"] == 1 and lines[0] == "index\tprediction" and lines[1].split("\t")[1] in "01"
    dev = predict("glue", "MRPC", seed_dir, FIXTURES / "glue", tmp_path / "submission", splits=["dev"])
    assert dev["dev"]["metrics"]["accuracy"] == saved["seeds"][0]["metrics"]["accuracy"]
    # run again: finished seeds are reused, not retrained
    again = finetune("glue", "MRPC", encoder_dir, FIXTURES / "glue", out, seeds=(1, 2), epochs=2, batch_size=2,
                     progress=False, verbose=False)
    assert again["summary"] == results["summary"] and again["wall_s"] < results["wall_s"]
    with pytest.raises(ValueError, match="fine-tuned for"):
        predict("glue", "RTE", seed_dir, FIXTURES / "glue", tmp_path / "x")


def test_end_to_end_stsb_and_mnli(encoder_dir: Path, tmp_path: Path) -> None:
    finetune("glue", "STS-B", encoder_dir, FIXTURES / "glue", tmp_path / "stsb", epochs=1, batch_size=2,
             progress=False, verbose=False)
    assert json.loads((tmp_path / "stsb" / "seed-1" / "config.json").read_text())["id2label"] == {"0": "LABEL_0"}
    _assert_loads_in_transformers(tmp_path / "stsb" / "seed-1", "AutoModelForSequenceClassification")
    results = finetune("glue", "MNLI", encoder_dir, FIXTURES / "glue", tmp_path / "mnli", epochs=1, batch_size=2,
                       progress=False, verbose=False)
    assert set(results["summary"]) == {"dev_matched_accuracy", "dev_mismatched_accuracy"}
    done = predict("glue", "MNLI", tmp_path / "mnli" / "seed-1", FIXTURES / "glue", tmp_path / "sub")
    assert set(done) == {"test_matched", "test_mismatched", "ax"}
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "metrics.json"]
    for line in (tmp_path / "sub" / "AX.tsv").read_text().splitlines()[1:]:
        assert line.split("\t")[1] in ("contradiction", "entailment", "neutral")


def test_end_to_end_ner(encoder_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "conll"
    data.mkdir()
    shutil.copy(FIXTURES / "conll" / "with_docstart.txt", data / "eng.train")
    shutil.copy(FIXTURES / "conll" / "without_docstart.txt", data / "eng.testa")
    shutil.copy(FIXTURES / "conll" / "without_docstart.txt", data / "eng.testb")
    results = finetune("ner", "conll2003", encoder_dir, data, tmp_path / "ner", epochs=2, batch_size=2,
                       max_length=8, progress=False, verbose=False)
    assert set(results["summary"]) == {"precision", "recall", "f1", "accuracy"}
    assert results["train_features"] > results["train_examples"]  # max_length 8 splits sentences into windows
    seed_dir = tmp_path / "ner" / "seed-1"
    assert json.loads((seed_dir / "config.json").read_text())["id2label"]["1"] == "B-PER"
    _assert_loads_in_transformers(seed_dir, "AutoModelForTokenClassification")
    done = predict("ner", "conll2003", seed_dir, data, tmp_path / "out")
    lines = (tmp_path / "out" / "predictions-test.txt").read_text().split("\n")
    n_words = sum(1 for line in (data / "eng.testb").read_text().splitlines()
                  if line.strip() and not line.startswith("-DOCSTART-"))
    assert len([line for line in lines if line]) == n_words
    assert done["test"]["metrics"].keys() == {"precision", "recall", "f1", "accuracy"}


def test_end_to_end_squad_v1_and_v2(encoder_dir: Path, tmp_path: Path) -> None:
    results = finetune("squad", "squad", encoder_dir, FIXTURES / "squad" / "v1.json", tmp_path / "v1",
                       epochs=1, batch_size=4, max_length=32, task_settings={"doc_stride": 4},
                       progress=False, verbose=False)
    assert set(results["summary"]) == {"exact_match", "f1"} and results["train_features"] > 3
    seed_dir = tmp_path / "v1" / "seed-1"
    assert json.loads((seed_dir / "task.json").read_text())["settings"]["doc_stride"] == 4
    _assert_loads_in_transformers(seed_dir, "AutoModelForQuestionAnswering")
    predict("squad", "squad", seed_dir, FIXTURES / "squad" / "v1.json", tmp_path / "pred")
    answers = json.loads((tmp_path / "pred" / "predictions.json").read_text())
    assert set(answers) == {"q1", "q2", "q3"} and all(isinstance(a, str) for a in answers.values())
    context = json.loads((FIXTURES / "squad" / "v1.json").read_text())["data"][0]["paragraphs"][0]["context"]
    assert answers["q1"] in context  # cut from the original text (case and punctuation kept)

    data = tmp_path / "squad2"
    data.mkdir()
    shutil.copy(FIXTURES / "squad" / "v2.json", data / "train-v2.0.json")
    shutil.copy(FIXTURES / "squad" / "v2.json", data / "dev-v2.0.json")
    results = finetune("squad", "v2.0", encoder_dir, data, tmp_path / "v2", epochs=1, batch_size=2,
                       max_length=48, progress=False, verbose=False)
    assert {"exact", "f1", "HasAns_exact", "NoAns_exact", "best_f1", "best_f1_thresh"} <= set(results["summary"])
    seed_dir = tmp_path / "v2" / "seed-1"
    task_file = json.loads((seed_dir / "task.json").read_text())
    assert isinstance(task_file["settings"]["null_threshold"], float)
    # the saved threshold gives the sweep's best F1 (when "no answer" everywhere is best, a threshold
    # below every question's null odds rather than the official script's 0.0)
    assert task_file["metrics"]["f1"] == pytest.approx(task_file["metrics"]["best_f1"])
    odds = json.loads((seed_dir / "null_odds-dev.json").read_text())
    assert set(odds) == {"a1", "a2"}
    done = predict("squad", "v2.0", seed_dir, data, tmp_path / "pred2", splits=["dev"])
    assert done["dev"]["metrics"]["f1"] == pytest.approx(task_file["metrics"]["f1"])
    assert {"predictions-dev.json", "null_odds-dev.json"} <= {p.name for p in (tmp_path / "pred2").iterdir()}


def test_end_to_end_swag(encoder_dir: Path, tmp_path: Path) -> None:
    data = tmp_path / "swag"
    data.mkdir()
    shutil.copy(FIXTURES / "swag" / "sample.jsonl", data / "train.jsonl")
    shutil.copy(FIXTURES / "swag" / "train.csv", data / "val.csv")
    shutil.copy(FIXTURES / "swag" / "test.csv", data / "test.csv")
    results = finetune("swag", "swag", encoder_dir, data, tmp_path / "swag-run", epochs=1, batch_size=2,
                       progress=False, verbose=False)
    assert set(results["summary"]) == {"accuracy"}
    seed_dir = tmp_path / "swag-run" / "seed-1"
    _assert_loads_in_transformers(seed_dir, "AutoModelForMultipleChoice")
    predict("swag", "swag", seed_dir, data, tmp_path / "pred")
    lines = (tmp_path / "pred" / "predictions-test.csv").read_text().splitlines()
    assert lines[0] == "id,label" and all(line.split(",")[1] in "0123" for line in lines[1:])


def test_finetune_bad_input(encoder_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown task family"):
        finetune("pos", "x", encoder_dir, tmp_path, tmp_path / "o")
    with pytest.raises(FileNotFoundError, match="no train file"):
        finetune("ner", "conll2003", encoder_dir, tmp_path, tmp_path / "o", verbose=False)
    bad = tmp_path / "glue" / "RTE"
    bad.mkdir(parents=True)
    (bad / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    with pytest.raises(DataFormatError, match=r"train.tsv:2: label: unknown label 'maybe'"):
        finetune("glue", "RTE", encoder_dir, tmp_path / "glue", tmp_path / "o", verbose=False)
    with pytest.raises(ValueError, match="seed"):
        finetune("glue", "RTE", encoder_dir, FIXTURES / "glue", tmp_path / "o", seeds=())
    # a model that was never fine-tuned has no output layer to predict with
    with pytest.raises(ValueError, match="no trained"):
        predict("glue", "RTE", encoder_dir, FIXTURES / "glue", tmp_path / "o")


def test_cli_finetune_and_predict(encoder_dir: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from bertforge.cli import app

    runner = CliRunner()
    out = tmp_path / "rte"
    result = runner.invoke(app, ["finetune", "glue", "--task", "RTE", "--model", str(encoder_dir), "--data",
                                 str(FIXTURES / "glue"), "--out", str(out), "--seeds", "3", "--epochs", "1",
                                 "--batch-size", "2"])
    assert result.exit_code == 0, result.output
    assert "accuracy" in result.output and (out / "results.json").exists() and (out / "seed-3").is_dir()
    result = runner.invoke(app, ["predict", "glue", "--model", str(out / "seed-3"), "--data", str(FIXTURES / "glue"),
                                 "--out", str(tmp_path / "sub")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sub" / "RTE.tsv").exists()
    result = runner.invoke(app, ["finetune", "glue", "--task", "RTE", "--model", str(encoder_dir), "--data",
                                 str(FIXTURES / "glue"), "--out", str(out), "--seeds", "1,x"])
    assert result.exit_code == 2 and "--seeds" in result.output
    result = runner.invoke(app, ["finetune", "glue", "--task", "XYZ", "--model", str(encoder_dir), "--data",
                                 str(FIXTURES / "glue"), "--out", str(out)])
    assert result.exit_code == 2 and "unknown GLUE task" in result.output


def test_reinitialize_top_layers_resets_only_the_top(tokenizer: BertTokenizer) -> None:
    from bertforge.finetune import reinitialize_top_layers
    from bertforge.model import BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=3,
                        num_attention_heads=2, intermediate_size=64)
    model = BertForSequenceClassification(config)
    with torch.no_grad():  # "pre-trained": every parameter moved off BERT's initialisation
        for p in model.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reinitialize_top_layers(model, 1)
    after = {k: v.clone() for k, v in model.state_dict().items()}  # state_dict() shares the tensors
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if k.startswith(("bert.encoder.layers.2.", "bert.pooler."))}
    layer = model.bert.encoder.layers[2]
    assert torch.equal(layer.ffn_norm.weight, torch.ones(32)) and torch.equal(layer.ffn_norm.bias, torch.zeros(32))
    assert all(float(after[k].std()) < 0.03 for k in changed if after[k].dim() == 2)  # N(0, 0.02) again
    reinitialize_top_layers(model, 0)
    assert all(torch.equal(after[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="3 distinct layers"):
        reinitialize_top_layers(model, 4)


def test_finetune_records_reinit_layers(encoder_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rte"
    finetune("glue", "RTE", encoder_dir, FIXTURES / "glue", out, epochs=1, batch_size=4, reinit_layers=1,
             progress=False, verbose=False)
    saved = json.loads((out / "results.json").read_text())
    assert saved["hyperparameters"]["reinit_layers"] == 1
    with pytest.raises(ValueError, match="1 distinct layers"):
        finetune("glue", "RTE", encoder_dir, FIXTURES / "glue", tmp_path / "o", reinit_layers=2,
                 progress=False, verbose=False)
