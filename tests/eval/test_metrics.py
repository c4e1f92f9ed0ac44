"""Metrics: hand-computed values and parity with sacrebleu / rouge-score."""

import decimal
import math

import pytest
from rouge_score import rouge_scorer
import sacrebleu

from specdec_jax.eval import metrics

REF = "the cat sat on a mat"
HYP = "the cat sat on the mat"


# ---------------------------------------------------------------- BLEU


def test_bleu_identical_is_100():
  refs = ["a quick brown fox jumps", "over the lazy dog again"]
  assert metrics.bleu(refs, refs) == pytest.approx(100.0, abs=1e-9)


def test_bleu_hand_computed():
  # Clipped n-gram precisions 5/6, 3/5, 2/4, 1/3 and no brevity penalty:
  # BLEU = (5/6 * 3/5 * 1/2 * 1/3) ** (1/4) = (1/12) ** (1/4).
  assert metrics.bleu([REF], [HYP]) == pytest.approx(100 * (1 / 12) ** 0.25,
                                                     abs=1e-9)


def test_bleu_no_overlap_is_zero():
  assert metrics.bleu(["a b c d"], ["w x y z"]) == 0.0


def test_bleu_equals_sacrebleu_t5_setting():
  refs = ["Das Haus ist klein.", "Der Himmel ist heute blau!",
          "Wir gehen morgen ins Kino, sagt sie."]
  hyps = ["Das Haus ist winzig.", "Der Himmel ist blau heute!",
          "Morgen gehen wir ins Kino, sagt sie."]
  want = sacrebleu.corpus_bleu(hyps, [refs], smooth_method="exp",
                               tokenize="intl").score
  assert metrics.bleu(refs, hyps) == want


def test_bleu_default_tokenizer_is_intl():
  # German quotes and dashes: 'intl' splits them off, '13a' does not.
  refs, hyps = ["Er sagte: „Ja“ – und ging."], ["Er sagte „Ja“ und ging ."]
  intl = sacrebleu.corpus_bleu(hyps, [refs], tokenize="intl").score
  t13a = sacrebleu.corpus_bleu(hyps, [refs], tokenize="13a").score
  assert intl != t13a
  assert metrics.bleu(refs, hyps) == intl
  assert metrics.bleu(refs, hyps, tokenize="13a") == t13a


def test_bleu_multi_reference_streams():
  targets = [[REF, "a cat sat on the mat"], ["hello there dear world"]]
  hyps = [HYP, "hello there dear world"]
  # Example 2 has one reference: its second stream entry is None.
  streams = [[REF, "hello there dear world"], ["a cat sat on the mat", None]]
  want = sacrebleu.corpus_bleu(hyps, streams, tokenize="intl").score
  assert metrics.bleu(targets, hyps) == want
  # A second reference that matches the hypothesis raises the score.
  assert metrics.bleu(targets, hyps) > metrics.bleu([REF, hyps[1]], hyps)


# ---------------------------------------------------------------- ROUGE


def test_rouge_hand_computed():
  # Unigrams: 5 of 6 match (one "the" is clipped); bigrams: 3 of 5 match.
  got = metrics.rouge([HYP], [REF], ("rouge1", "rouge2", "rougeL"))
  assert got["rouge1"] == pytest.approx(100 * 5 / 6)
  assert got["rouge2"] == pytest.approx(60.0)
  assert got["rougeL"] == pytest.approx(100 * 5 / 6)


def test_rouge_is_mean_over_examples():
  got = metrics.rouge(["a b c", "d e f"], ["a b c", "x y z"], ("rouge2",))
  assert got == {"rouge2": pytest.approx(50.0)}


def test_rouge_equals_rouge_score():
  targets = ["The economy grew by 3% last year, officials said.",
             "A storm hit the coast. Thousands lost power."]
  preds = ["Officials said the economy grew 3% in the last year.",
           "Thousands lost power when a storm hit."]
  keys = ("rouge1", "rouge2", "rougeL")
  scorer = rouge_scorer.RougeScorer(list(keys))
  for k in keys:
    want = 100 * sum(scorer.score(t, p)[k].fmeasure
                     for t, p in zip(targets, preds)) / 2
    assert metrics.rouge(targets, preds, (k,))[k] == pytest.approx(want,
                                                                   abs=1e-12)


def test_rougelsum_uses_sentence_splitting():
  # Sentence order swapped: LCS over the whole text finds 2 of 4 tokens,
  # the summary-level (per sentence) LCS finds all of them.
  got = metrics.rouge(["a b. c d."], ["c d. a b."], ("rougeL", "rougeLsum"))
  assert got == {"rougeL": pytest.approx(50.0), "rougeLsum": 100.0}
  scorer = rouge_scorer.RougeScorer(["rougeLsum"])
  want = scorer.score("a b.\nc d.", "c d.\na b.")["rougeLsum"].fmeasure
  assert got["rougeLsum"] == 100 * want


def test_split_sentences():
  assert metrics.split_sentences("He won . She lost . ok") == \
      "He won .\nShe lost .\nok"
  assert metrics.split_sentences('Is it? "Yes." Fine!\nNext') == \
      'Is it?\n"Yes."\nFine!\nNext'
  assert metrics.split_sentences("3.5 is a number") == "3.5 is a number"


def test_rouge_multi_reference_takes_best():
  got = metrics.rouge([["x y z", REF]], [HYP], ("rouge2",))
  assert got["rouge2"] == pytest.approx(60.0)


def test_rouge_bad_key():
  with pytest.raises(ValueError, match="subset of"):
    metrics.rouge(["a"], ["a"], ("rouge3",))


# ---------------------------------------------------- SQuAD EM and F1


def test_normalize_answer():
  assert metrics.normalize_answer("The  Cat, sat!  ") == "cat sat"
  assert metrics.normalize_answer("An apple a day") == "apple day"
  assert metrics.normalize_answer("theater") == "theater"


def test_exact_match_and_f1_hand_computed():
  targets = [["Barack Obama", "Obama"], "the Eiffel Tower", "1990"]
  preds = ["obama.", "Eiffel", "in 1990"]
  # EM: 1, 0, 0. F1: 1; P=1,R=1/2 -> 2/3; P=1/2,R=1 -> 2/3.
  assert metrics.exact_match(targets, preds) == pytest.approx(100 / 3)
  assert metrics.f1(targets, preds) == pytest.approx(100 * (1 + 4 / 3) / 3)


def test_squad_v2_no_answer():
  # An empty reference list is "unanswerable": only an empty answer is right.
  assert metrics.exact_match([[], []], ["", "Paris"]) == 50.0
  assert metrics.f1([[], []], ["", "Paris"]) == 50.0
  assert metrics.f1([["Paris"]], [""]) == 0.0


# ------------------------------------------------------------- GSM8K

GSM_REF = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72")


def test_gsm8k_answer_rule():
  assert metrics.gsm8k_answer(GSM_REF) == decimal.Decimal(72)
  assert metrics.gsm8k_answer("#### 1,234") == decimal.Decimal(1234)
  assert metrics.gsm8k_answer("72") == decimal.Decimal(72)
  assert metrics.extract_number("from 3-5 to 1,234.50, then $18.") == \
      decimal.Decimal(18)
  assert metrics.extract_number("-7 degrees") == decimal.Decimal(-7)
  assert metrics.extract_number("5,6") == decimal.Decimal(6)
  assert metrics.extract_number("no digits") is None


def test_gsm8k_accuracy():
  preds = ["48 / 2 = 24, 48 + 24 = 72. The answer is 72.",  # last number
           "... #### 72",
           "72.00",
           "The answer is 72 clips, not 24.",  # last number is 24: wrong
           "I do not know"]
  assert metrics.gsm8k_accuracy([GSM_REF] * 5, preds) == 60.0
  with pytest.raises(ValueError, match="target 0 has no number"):
    metrics.gsm8k_accuracy(["no number"], ["1"])


# -------------------------------------------------------------- code


def test_code_exact_match():
  ref = "def f(x):\n    return x + 1\n"
  preds = ["```python\ndef f(x):   \n\n    return x + 1\n```",
           "def f(x):\r\n    return x + 1",
           "def f(x):\nreturn x + 1",  # indentation differs: wrong
           "def f(x):\n    return x + 2"]
  assert metrics.code_exact_match([ref] * 4, preds) == 50.0
  assert metrics.normalize_code(preds[0]) == "def f(x):\n    return x + 1"


# ---------------------------------------------------------- registry


def test_compute_matches_individual_metrics():
  targets = [REF, "a b. c d."]
  preds = [HYP, "c d. a b."]
  names = ["rougeLsum", "bleu", "rouge2", "f1", "exact_match"]
  got = metrics.compute(names, targets, preds)
  assert list(got) == names
  for n in names:
    assert got[n] == metrics.METRICS[n](targets, preds)
  assert metrics.compute("bleu", targets, preds) == {"bleu": got["bleu"]}
  assert all(math.isfinite(v) for v in got.values())


def test_registry_names():
  assert set(metrics.METRICS) == {
      "bleu", "rouge1", "rouge2", "rougeL", "rougeLsum", "exact_match", "f1",
      "gsm8k_accuracy", "code_exact_match"}


def test_errors():
  with pytest.raises(ValueError, match=r"unknown metric\(s\) \['blue'\]"):
    metrics.compute(["blue"], ["a"], ["a"])
  with pytest.raises(ValueError, match="got 2 targets but 1 predictions"):
    metrics.compute(["bleu"], ["a", "b"], ["a"])
  with pytest.raises(ValueError, match="got 1 targets but 2 predictions"):
    metrics.rouge(["a"], ["a", "b"])
  with pytest.raises(ValueError, match="no examples"):
    metrics.f1([], [])
  with pytest.raises(TypeError, match="predictions must be a list"):
    metrics.bleu(["a"], "a")
  with pytest.raises(TypeError, match="prediction 0 must be a str"):
    metrics.exact_match(["a"], [None])
  with pytest.raises(TypeError, match="target 1 must be a str or a list"):
    metrics.f1(["a", 3], ["a", "b"])
  with pytest.raises(ValueError, match="target 0 has no reference"):
    metrics.bleu([[]], ["a"])
