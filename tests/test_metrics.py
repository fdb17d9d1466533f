"""Metrics against hand-computed values and the official scripts' edge cases (GLUE, conlleval, SQuAD)."""

from __future__ import annotations

import json
import math
import random
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from bertforge.cli import app
from bertforge.tasks.metrics import (
    GLUE_METRIC_NAMES,
    accuracy,
    binary_f1,
    canonical_glue_task,
    conll_f1,
    conlleval_report,
    detect_squad_version,
    glue_metrics,
    matthews_corr,
    mnli_accuracy,
    multiple_choice_accuracy,
    normalize_answer,
    pearson_spearman,
    squad_evaluate,
    squad_exact,
    squad_f1,
)
from bertforge.tasks.ner import iob1_to_iob2

# ---------------------------------------------------------------------------------------------------
# GLUE
# ---------------------------------------------------------------------------------------------------


def test_accuracy_and_binary_f1_by_hand():
    # TP=2 FP=1 FN=0 TN=1: precision 2/3, recall 1, F1 = 2 * (2/3) / (5/3) = 0.8
    assert accuracy([1, 0, 1, 1], [1, 0, 0, 1]) == 0.75
    assert binary_f1([1, 0, 1, 1], [1, 0, 0, 1]) == pytest.approx(0.8)
    assert binary_f1([0, 0], [0, 0]) == 0.0  # no positives anywhere: 0, not a warning and NaN


def test_matthews_by_hand():
    # TP=2 TN=2 FP=1 FN=0: (2*2 - 1*0) / sqrt(3 * 2 * 3 * 2) = 4/6
    assert matthews_corr([1, 1, 0, 0, 1], [1, 0, 0, 0, 1]) == pytest.approx(2 / 3)
    assert matthews_corr([0, 1, 1, 0], [1, 0, 0, 1]) == pytest.approx(-1.0)


def test_matthews_all_one_class_predictions_is_zero():
    # a CoLA model that answers "acceptable" everywhere: the denominator is 0 and GLUE scores it 0
    assert matthews_corr([1, 1, 1, 1, 1], [1, 0, 1, 0, 1]) == 0.0
    assert glue_metrics("CoLA", [0] * 6, [0, 1, 0, 1, 1, 0]) == {"matthews_correlation": 0.0}


def test_pearson_spearman_by_hand():
    # x - mean = (-1.5, -.5, .5, 1.5), y - mean = (-1.75, -.75, .25, 2.25): r = 6.5 / sqrt(5 * 8.75)
    got = pearson_spearman([1, 2, 3, 4], [1, 2, 3, 5])
    assert got["pearson"] == pytest.approx(6.5 / math.sqrt(43.75))
    assert got["spearmanr"] == pytest.approx(1.0)  # same order
    assert math.isnan(pearson_spearman([2, 2, 2], [1, 2, 3])["pearson"])  # constant predictions


def test_glue_metrics_keys_and_aliases():
    for task, names in GLUE_METRIC_NAMES.items():
        preds = [0.5, 1.5, 2.0] if task == "stsb" else [0, 1, 1]
        assert tuple(glue_metrics(task, preds, [0.0, 1.0, 2.5] if task == "stsb" else [0, 1, 0])) == names
    assert glue_metrics("MRPC", [1, 0, 1, 1], [1, 0, 0, 1]) == {"accuracy": 0.75, "f1": pytest.approx(0.8)}
    assert canonical_glue_task("SST-2") == canonical_glue_task("sst_2") == "sst2"
    assert canonical_glue_task("MNLI-mm") == "mnli_mismatched"
    assert canonical_glue_task("STS-B") == "stsb"
    with pytest.raises(ValueError, match="unknown GLUE task"):
        glue_metrics("SQuAD", [1], [1])
    with pytest.raises(ValueError, match="2 predictions but 3 labels"):
        glue_metrics("rte", [1, 0], [1, 0, 1])


def test_glue_metrics_take_logits_and_multiclass():
    logits = np.array([[0.1, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert glue_metrics("mnli", logits, [1, 0, 2]) == {"accuracy": 1.0}
    assert glue_metrics("ax", [0, 1, 2, 2], [0, 1, 2, 2]) == {"matthews_correlation": pytest.approx(1.0)}
    assert mnli_accuracy([0, 1], [0, 0], [2], [2]) == {"accuracy_matched": 0.5, "accuracy_mismatched": 1.0}


def test_multiple_choice_accuracy():
    scores = np.array([[0.1, 0.9, 0.0, 0.0], [0.0, 0.0, 0.2, 0.1], [1.0, 0.0, 0.0, 0.0]])
    assert multiple_choice_accuracy(scores, [1, 2, 3]) == {"accuracy": pytest.approx(2 / 3)}
    assert multiple_choice_accuracy([3, 0], [3, 0]) == {"accuracy": 1.0}


# ---------------------------------------------------------------------------------------------------
# CoNLL (conlleval)
# ---------------------------------------------------------------------------------------------------


def test_conll_hand_computed_with_per_type_and_report():
    gold = ["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "I-ORG"]   # PER(0-1) LOC(3) ORG(5-6)
    pred = ["B-PER", "I-PER", "O", "B-ORG", "O", "B-ORG", "O"]       # PER(0-1) ORG(3) ORG(5)
    got = conll_f1([gold], [pred])
    assert (got["n_gold"], got["n_predicted"], got["n_correct"], got["n_tokens"]) == (3, 3, 1, 7)
    assert got["precision"] == got["recall"] == got["f1"] == pytest.approx(1 / 3)
    assert got["accuracy"] == pytest.approx(5 / 7)
    assert got["per_type"]["PER"]["f1"] == 1.0
    assert got["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                      "n_gold": 1, "n_predicted": 0, "n_correct": 0}
    assert got["per_type"]["ORG"]["n_predicted"] == 2 and got["per_type"]["ORG"]["n_correct"] == 0
    assert conlleval_report(got).splitlines() == [
        "processed 7 tokens with 3 phrases; found: 3 phrases; correct: 1.",
        "accuracy:  71.43%; precision:  33.33%; recall:  33.33%; FB1:  33.33",
        "              LOC: precision:   0.00%; recall:   0.00%; FB1:   0.00  0",
        "              ORG: precision:   0.00%; recall:   0.00%; FB1:   0.00  2",
        "              PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1",
    ]


def test_conll_i_after_o_starts_a_chunk():
    # conlleval: "O I-PER" opens a chunk (seqeval's strict mode would drop it; conlleval does not)
    got = conll_f1([["O", "I-PER", "I-PER"]], [["O", "B-PER", "I-PER"]])
    assert (got["n_gold"], got["n_predicted"], got["n_correct"]) == (1, 1, 1)
    assert got["f1"] == 1.0


def test_conll_iob1_boundaries_and_type_changes():
    # IOB1: B-PER after I-PER splits two PER entities; a predicted single span matches neither
    got = conll_f1([["I-PER", "I-PER", "B-PER"]], [["I-PER", "I-PER", "I-PER"]])
    assert (got["n_gold"], got["n_predicted"], got["n_correct"]) == (2, 1, 0)
    # a type change opens a new chunk even without B-
    got = conll_f1([["I-PER", "I-LOC"]], [["B-PER", "B-LOC"]])
    assert (got["n_gold"], got["n_predicted"], got["n_correct"]) == (2, 2, 2)
    # gold B-PER I-LOC is PER(0) LOC(1); guessed B-PER I-PER is PER(0-1): no match (counts from conlleval.pl)
    got = conll_f1([["B-PER", "I-LOC", "O"]], [["B-PER", "I-PER", "O"]])
    assert (got["n_gold"], got["n_predicted"], got["n_correct"], got["accuracy"]) == (2, 1, 0, 2 / 3)


def test_conll_iob1_and_iob2_of_the_same_entities_score_perfectly():
    iob1 = ["I-ORG", "I-ORG", "O", "I-MISC", "B-MISC", "I-MISC", "I-LOC", "I-PER"]
    got = conll_f1([iob1], [iob1_to_iob2(iob1)])
    assert got["f1"] == 1.0 and got["n_gold"] == 5


def test_conll_sentence_boundaries_split_chunks():
    as_two = conll_f1([["O", "I-PER"], ["I-PER", "O"]], [["O", "I-PER"], ["I-PER", "O"]])
    as_one = conll_f1(["O", "I-PER", "I-PER", "O"], ["O", "I-PER", "I-PER", "O"])  # flat list = one sentence
    assert as_two["n_gold"] == 2 and as_one["n_gold"] == 1


def test_conll_matches_counts_printed_by_conlleval_pl():
    # expected tuples (tokens, gold chunks, found chunks, correct chunks, correct tags) are the
    # counts the 2004-01-26 conlleval.pl printed for these inputs (one sentence per inner list)
    cases = [
        ([["O", "I-PER", "I-PER", "B-PER", "I-LOC", "O"], ["I-MISC", "B-MISC", "O"]],
         [["O", "B-PER", "I-PER", "I-PER", "I-LOC", "I-ORG"], ["I-MISC", "I-MISC", "O"]], (9, 5, 4, 1, 5)),
        ([["I-NP", "E-NP", "I-NP", "E-NP"]], [["I-NP", "I-NP", "I-NP", "E-NP"]], (4, 2, 1, 0, 3)),
    ]
    for gold, pred, expected in cases:
        got = conll_f1(gold, pred)
        counts = (got["n_tokens"], got["n_gold"], got["n_predicted"], got["n_correct"],
                  round(got["accuracy"] * got["n_tokens"]))
        assert counts == expected


def test_conll_agrees_with_seqeval_default_mode_on_random_bio():
    from seqeval.metrics import f1_score, precision_score, recall_score

    rng = random.Random(0)
    tags = ["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-MISC"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(300):
            gold = [[rng.choice(tags) for _ in range(rng.randint(1, 7))] for _ in range(rng.randint(1, 4))]
            pred = [[rng.choice(tags) if rng.random() < 0.4 else t for t in s] for s in gold]
            got = conll_f1(gold, pred)
            assert got["precision"] == pytest.approx(precision_score(gold, pred))
            assert got["recall"] == pytest.approx(recall_score(gold, pred))
            assert got["f1"] == pytest.approx(f1_score(gold, pred))


def test_conll_empty_and_mismatched_lengths():
    got = conll_f1([["O", "O"]], [["O", "O"]])
    assert got["f1"] == 0.0 and got["accuracy"] == 1.0 and got["per_type"] == {}
    with pytest.raises(ValueError, match="sentence 0"):
        conll_f1([["O", "O"]], [["O"]])


# ---------------------------------------------------------------------------------------------------
# SQuAD
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("The  Quick, brown fox!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("THE END", "end"),
    ("Theater and Anatomy", "theater and anatomy"),       # articles only as whole words
    ("A-bomb", "abomb"),                                   # punctuation goes first, then articles
    ("the.end", "theend"),
    ("(a) list", "list"),
    ("Zürich’s “old” town — Ängström", "zürich’s “old” town — ängström"),  # non-ASCII punctuation stays
    ("\u00a0The\u3000cat\t", "cat"),                       # Unicode whitespace splits
    ("Àn apple", "àn apple"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_and_f1_by_hand():
    assert squad_exact("The cat sat.", "cat sat") == 1
    assert squad_f1("the cat sat on mat", "a cat sat on the mat") == 1.0
    # pred [cat cat dog], gold [cat dog dog bird]: overlap 2, P 2/3, R 1/2, F1 4/7
    assert squad_f1("cat cat dog", "cat dog dog bird") == pytest.approx(4 / 7)
    assert squad_f1("dog", "cat", version="1.1") == 0.0


def test_empty_answers_v1_versus_v2():
    assert squad_f1("", "", version="1.1") == 0.0     # v1.1: no tokens, no overlap
    assert squad_f1("", "", version="2.0") == 1.0     # v2.0: both "no answer"
    assert squad_f1("The", "", version="2.0") == 1.0  # normalises to empty
    assert squad_f1("cat", "", version="2.0") == 0.0


def _dataset(qas, version=None):
    data = {"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}
    if version:
        data["version"] = version
    return data


def _qa(qid, *answers, impossible=None):
    qa = {"id": qid, "question": "?", "answers": [{"text": a, "answer_start": 0} for a in answers]}
    if impossible is not None:
        qa["is_impossible"] = impossible
    return qa


V1 = _dataset([_qa("q1", "France", "in France"), _qa("q2", "The Normans"), _qa("q3", "1948")], "1.1")


def test_squad_v11_by_hand():
    # q1: "in France." -> "in france" matches the second gold; q2 matches; q3: P 1/2 R 1 -> F1 2/3
    got = squad_evaluate(V1, {"q1": "in France.", "q2": "Normans", "q3": "1948 AD"})
    assert got == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(100 * (2 + 2 / 3) / 3)}
    assert list(got) == ["exact_match", "f1"]


def test_squad_v11_missing_prediction_scores_zero():
    with pytest.warns(UserWarning, match="1 questions have no prediction"):
        got = squad_evaluate(V1, {"q1": "France", "q2": "the normans"})
    assert got == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3)}


# five questions; raw (exact, f1) and na_prob:
#   h1 answerable "Zürich" <- "Zürich"       (1, 1)    0.1
#   n1 unanswerable        <- ""             (1, 1)    0.2
#   h3 answerable "blue sky" <- "red car"    (0, 0)    0.3
#   h2 answerable "in 1948" <- "1948"        (0, 2/3)  0.6
#   n2 unanswerable        <- "something"    (0, 0)    0.8
V2 = _dataset([_qa("h1", "Zürich", impossible=False), _qa("h2", "in 1948", impossible=False),
               _qa("h3", "blue sky", impossible=False), _qa("n1", impossible=True),
               _qa("n2", impossible=True)], "v2.0")
V2_PREDS = {"h1": "Zürich", "h2": "1948", "h3": "red car", "n1": "", "n2": "something"}
V2_PROBS = {"h1": 0.1, "h2": 0.6, "h3": 0.3, "n1": 0.2, "n2": 0.8}


def test_squad_v2_by_hand_with_best_thresholds():
    got = squad_evaluate(V2, V2_PREDS, V2_PROBS)
    assert list(got) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                         "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    expected = {
        "exact": 40.0, "f1": 100 * (8 / 3) / 5, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 100 * (5 / 3) / 3, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2,
        # sweep from "all no-answer" = 2 (the two unanswerable), in na_prob order h1 n1 h3 h2 n2:
        # exact: 2 -> 3 (h1, thresh 0.1) -> 3 -> 3 -> 3 -> 2 (n2 answered wrongly): best 3/5
        "best_exact": 60.0, "best_exact_thresh": 0.1,
        # f1: 2 -> 3 (0.1) -> 3 -> 3 -> 3 2/3 (h2, thresh 0.6) -> 2 2/3: best (11/3)/5
        "best_f1": 100 * (11 / 3) / 5, "best_f1_thresh": 0.6,
    }
    assert got == pytest.approx(expected)


def test_squad_v2_threshold_applied():
    # na_prob > 0.5 answers "no answer" for h2 (wrong, 0) and n2 (right, 1)
    got = squad_evaluate(V2, V2_PREDS, V2_PROBS, na_prob_thresh=0.5)
    assert got["exact"] == got["f1"] == pytest.approx(60.0)
    assert got["HasAns_f1"] == pytest.approx(100 / 3) and got["NoAns_exact"] == 100.0


def test_squad_v2_without_na_probs_has_no_best_keys():
    got = squad_evaluate(V2, V2_PREDS)
    assert "best_exact" not in got and got["exact"] == 40.0


def test_squad_v2_gold_that_normalises_to_empty_counts_as_no_answer_text():
    # the official script keeps only golds that survive normalisation, else [""]
    data = _dataset([_qa("x", "The", impossible=False)], "v2.0")
    assert squad_evaluate(data, {"x": ""})["HasAns_exact"] == 100.0


def test_squad_version_detection_and_errors():
    assert detect_squad_version(V1) == "1.1" and detect_squad_version(V2) == "2.0"
    no_version = {"data": V2["data"]}
    assert detect_squad_version(no_version) == "2.0"      # found by is_impossible
    assert "HasAns_total" in squad_evaluate(no_version, V2_PREDS)
    with pytest.raises(ValueError, match="1 of 5 questions have no prediction: n2"):
        squad_evaluate(V2, {k: v for k, v in V2_PREDS.items() if k != "n2"})
    with pytest.raises(ValueError, match="no na_prob"):
        squad_evaluate(V2, V2_PREDS, {"h1": 0.5})
    with pytest.raises(ValueError, match="v2.0 only"):
        squad_evaluate(V1, {"q1": "x"}, {"q1": 0.5})
    with pytest.raises(ValueError, match="not a string"):
        squad_evaluate(V1, {"q1": 3})
    with pytest.raises(ValueError, match="malformed SQuAD dataset"):
        squad_evaluate({"data": [{"paragraphs": [{"qas": [{"question": "?"}]}]}]}, {})


# ---------------------------------------------------------------------------------------------------
# CLI: bertforge evaluate squad
# ---------------------------------------------------------------------------------------------------


def test_cli_evaluate_squad(tmp_path):
    data, preds, probs, out = (tmp_path / name for name in ("d.json", "p.json", "n.json", "out/eval.json"))
    data.write_text(json.dumps(V2), encoding="utf-8")
    preds.write_text(json.dumps(V2_PREDS), encoding="utf-8")
    probs.write_text(json.dumps(V2_PROBS), encoding="utf-8")
    result = CliRunner().invoke(app, ["evaluate", "squad", "--data", str(data), "--predictions", str(preds),
                                      "--na-probs", str(probs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed == pytest.approx(squad_evaluate(V2, V2_PREDS, V2_PROBS))
    assert printed["best_f1_thresh"] == 0.6
    assert json.loads(out.read_text(encoding="utf-8")) == printed

    result = CliRunner().invoke(app, ["evaluate", "squad", "--data", str(data), "--predictions", str(preds),
                                      "--na-probs", str(probs), "--na-prob-thresh", "0.5"])
    assert result.exit_code == 0 and json.loads(result.output)["exact"] == pytest.approx(60.0)


def test_cli_evaluate_squad_bad_input(tmp_path):
    data, preds = tmp_path / "d.json", tmp_path / "p.json"
    data.write_text(json.dumps(V1), encoding="utf-8")
    runner = CliRunner()

    preds.write_text('{"q1": "France",', encoding="utf-8")
    result = runner.invoke(app, ["evaluate", "squad", "--data", str(data), "--predictions", str(preds)])
    assert result.exit_code == 2 and "not valid JSON" in result.output

    preds.write_text('["France"]', encoding="utf-8")
    result = runner.invoke(app, ["evaluate", "squad", "--data", str(data), "--predictions", str(preds)])
    assert result.exit_code == 2 and "expected a JSON object" in result.output

    preds.write_text('{"q1": "France"}', encoding="utf-8")
    data.write_text('{"version": "1.1", "data": [\n  {"title": }', encoding="utf-8")
    result = runner.invoke(app, ["evaluate", "squad", "--data", str(data), "--predictions", str(preds)])
    assert result.exit_code == 2 and "d.json:2: json:" in result.output

    result = runner.invoke(app, ["evaluate", "squad", "--data", str(tmp_path / "none.json"),
                                 "--predictions", str(preds)])
    assert result.exit_code == 2 and "none.json" in result.output
