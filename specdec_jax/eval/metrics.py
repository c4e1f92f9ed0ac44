"""Text-quality metrics for the paper's benchmarks (no TensorFlow).

Every score is on a 0-100 scale (the t5 / seqio convention). ``targets`` holds
one entry per example: a reference string or a list of reference strings
(several references; scores take the best reference, BLEU uses all of them as
a multi-reference corpus). ``predictions`` holds one string per example.

    =================  ==================================================
    name               what it computes
    =================  ==================================================
    bleu               sacrebleu corpus BLEU, t5's WMT setting
    rouge1/2/L/Lsum    rouge-score F-measure, mean over examples
    exact_match, f1    SQuAD (v2.0) normalized answer match / token F1
    gsm8k_accuracy     final-number match (rule in :func:`gsm8k_accuracy`)
    code_exact_match   whitespace-normalized code match
    =================  ==================================================

BLEU and ROUGE come from the reference libraries (sacrebleu, rouge-score);
exact match and F1 follow the official SQuAD v2.0 evaluation script.

    >>> compute(["bleu", "rouge2"], ["a cat sat here"], ["a cat sat here"])
    {'bleu': 100.00000000000004, 'rouge2': 100.0}
"""

from __future__ import annotations

import collections
import decimal
import re
import string
from typing import Callable, Sequence

from rouge_score import rouge_scorer
import sacrebleu

Target = str | Sequence[str]
MetricFn = Callable[[Sequence[Target], Sequence[str]], float]

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def _references(targets: Sequence[Target], predictions: Sequence[str],
                metric: str, allow_empty: bool = False) -> list[list[str]]:
  """Checks the inputs; returns each example's references as a list."""
  for what, seq in (("targets", targets), ("predictions", predictions)):
    if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence):
      raise TypeError(f"{metric}: {what} must be a list with one entry per "
                      f"example, got {type(seq).__name__}")
  if len(targets) != len(predictions):
    raise ValueError(f"{metric}: got {len(targets)} targets but "
                     f"{len(predictions)} predictions; pass exactly one "
                     f"prediction per example")
  if not predictions:
    raise ValueError(f"{metric}: no examples (targets and predictions are "
                     f"empty)")
  refs = []
  for i, (t, p) in enumerate(zip(targets, predictions)):
    if not isinstance(p, str):
      raise TypeError(f"{metric}: prediction {i} must be a str, got "
                      f"{type(p).__name__}")
    r = [t] if isinstance(t, str) else t
    if not isinstance(r, Sequence) or not all(isinstance(x, str) for x in r):
      raise TypeError(f"{metric}: target {i} must be a str or a list of str, "
                      f"got {t!r}")
    if not r and not allow_empty:
      raise ValueError(f"{metric}: target {i} has no reference string")
    refs.append(list(r))
  return refs


# ---------------------------------------------------------------- BLEU


def _corpus_bleu(targets: Sequence[Target], predictions: Sequence[str],
                 tokenize: str):
  """sacrebleu's BLEUScore object in t5's setting (see :func:`bleu`)."""
  refs = _references(targets, predictions, "bleu")
  width = max(len(r) for r in refs)
  # sacrebleu wants reference *streams*: streams[k][i] = k-th ref of example i.
  streams = [[r[k] if k < len(r) else None for r in refs]
             for k in range(width)]
  return sacrebleu.corpus_bleu(
      list(predictions), streams, smooth_method="exp", smooth_value=0.0,
      force=False, lowercase=False, tokenize=tokenize,
      use_effective_order=False)


def bleu(targets: Sequence[Target], predictions: Sequence[str],
         tokenize: str = "intl") -> float:
  """Corpus BLEU with sacrebleu, as ``t5.evaluation.metrics.bleu`` sets it.

  Exponential smoothing, no effective order, case-sensitive, sacrebleu's
  ``intl`` tokenizer (pass ``tokenize='13a'`` for sacrebleu's default). With
  several references per example the corpus is multi-reference; examples with
  fewer references leave the missing streams empty (``None``).

  Args:
    targets: [n] reference strings or lists of reference strings.
    predictions: [n] hypothesis strings.
    tokenize: a sacrebleu tokenizer name.

  Returns:
    BLEU in [0, 100].
  """
  return float(_corpus_bleu(targets, predictions, tokenize).score)


def bleu_breakdown(targets: Sequence[Target], predictions: Sequence[str],
                   tokenize: str = "intl") -> dict[str, float | list[float]]:
  """The parts of :func:`bleu`: why one system's BLEU is above another's.

  Args:
    targets: [n] reference strings or lists of reference strings.
    predictions: [n] hypothesis strings.
    tokenize: a sacrebleu tokenizer name.

  Returns:
    ``bleu`` (as :func:`bleu`), ``precisions`` ([4] n-gram precisions in
    percent), ``brevity_penalty``, ``sys_len`` and ``ref_len`` (tokens over
    the corpus) and ``length_ratio`` (sys_len / ref_len).
  """
  s = _corpus_bleu(targets, predictions, tokenize)
  return dict(bleu=float(s.score),
              precisions=[float(p) for p in s.precisions],
              brevity_penalty=float(s.bp), sys_len=int(s.sys_len),
              ref_len=int(s.ref_len),
              length_ratio=float(s.sys_len) / max(int(s.ref_len), 1))


# ---------------------------------------------------------------- ROUGE

_SENTENCE_END = re.compile(r"([.!?][\"')\]]*)\s+")


def split_sentences(text: str) -> str:
  """Puts each sentence on its own line, which rougeLsum needs.

  A sentence ends at ``.``, ``!`` or ``?`` (plus closing quotes or brackets)
  followed by whitespace; existing newlines are kept. This generalizes t5's
  ``" . " -> " .\\n"`` rule (identical on t5's space-tokenized text).
  Abbreviations such as "Mr. X" are split too: rougeLsum only.
  """
  return _SENTENCE_END.sub(r"\1\n", text)


def rouge(targets: Sequence[Target], predictions: Sequence[str],
          score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
          use_stemmer: bool = False) -> dict[str, float]:
  """ROUGE F-measures with rouge-score, averaged over examples.

  The deterministic mean of ``t5.evaluation.metrics.rouge_mean`` (not the
  bootstrap estimate): per-example F-measure, mean over examples, times 100.
  For rougeLsum both sides go through :func:`split_sentences` first. With
  several references an example scores its best reference per key
  (``RougeScorer.score_multi``).

  Args:
    targets: [n] reference strings or lists of reference strings.
    predictions: [n] summary strings.
    score_keys: any of 'rouge1', 'rouge2', 'rougeL', 'rougeLsum'.
    use_stemmer: Porter-stem tokens longer than 3 characters.

  Returns:
    {key: mean F-measure in [0, 100]} for each key.
  """
  refs = _references(targets, predictions, "rouge")
  bad = [k for k in score_keys if k not in ROUGE_KEYS]
  if bad or not score_keys:
    raise ValueError(f"rouge: score_keys must be a non-empty subset of "
                     f"{ROUGE_KEYS}, got {tuple(score_keys)}")
  scorer = rouge_scorer.RougeScorer(list(score_keys), use_stemmer=use_stemmer)
  split = "rougeLsum" in score_keys
  sums = dict.fromkeys(score_keys, 0.0)
  for r, p in zip(refs, predictions):
    if split:
      r, p = [split_sentences(x) for x in r], split_sentences(p)
    s = scorer.score(r[0], p) if len(r) == 1 else scorer.score_multi(r, p)
    for k in score_keys:
      sums[k] += s[k].fmeasure
  return {k: 100.0 * v / len(refs) for k, v in sums.items()}


# ---------------------------------------------------- SQuAD EM and F1

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """SQuAD normalization: lowercase, drop punctuation and a/an/the, squash
  whitespace (the official v1.1/v2.0 evaluation script's order)."""
  text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


def _token_f1(reference: str, prediction: str) -> float:
  ref, pred = reference.split(), prediction.split()
  if not ref or not pred:  # SQuAD v2.0: no-answer matches only no-answer.
    return float(ref == pred)
  same = sum((collections.Counter(ref) & collections.Counter(pred)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(pred), same / len(ref)
  return 2 * precision * recall / (precision + recall)


def _qa_scores(targets, predictions, metric, score_fn) -> float:
  refs = _references(targets, predictions, metric, allow_empty=True)
  total = 0.0
  for r, p in zip(refs, predictions):
    p = normalize_answer(p)
    # An empty reference list is SQuAD v2.0's unanswerable question.
    total += max(score_fn(normalize_answer(x), p) for x in (r or [""]))
  return 100.0 * total / len(refs)


def exact_match(targets: Sequence[Target],
                predictions: Sequence[str]) -> float:
  """Percent of predictions equal to some reference after
  :func:`normalize_answer`. An empty reference list means "no answer" and
  matches only an empty (normalized) prediction."""
  return _qa_scores(targets, predictions, "exact_match",
                    lambda r, p: float(r == p))


def f1(targets: Sequence[Target], predictions: Sequence[str]) -> float:
  """Mean over examples of the best token F1 against any reference
  (normalized with :func:`normalize_answer`; official SQuAD v2.0 rule:
  if either side has no tokens, F1 is 1 when both are empty, else 0)."""
  return _qa_scores(targets, predictions, "f1", _token_f1)


# ------------------------------------------------------------- GSM8K

# Integers with optional thousands commas, optional decimals and sign; a
# minus sign right after a digit is a range dash ("3-5" -> 3, 5), not a sign.
_NUMBER = re.compile(r"(?<![\d.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def extract_number(text: str, last: bool = True) -> decimal.Decimal | None:
  """The last (or first) number written in ``text``, or None.

  "1,234.50" -> 1234.50, "-7" -> -7, "$18." -> 18. Commas are thousands
  separators only when they group three digits ("5,6" is two numbers).
  """
  found = _NUMBER.findall(text)
  if not found:
    return None
  return decimal.Decimal((found[-1] if last else found[0]).replace(",", ""))


def gsm8k_answer(reference: str) -> decimal.Decimal | None:
  """The gold number of a GSM8K reference: the first number after its last
  '####' (GSM8K answers end in "#### 72"), or, with no '####', the last
  number of the whole reference (for pre-extracted targets such as "72")."""
  if "####" in reference:
    return extract_number(reference.rsplit("####", 1)[1], last=False)
  return extract_number(reference)


def gsm8k_accuracy(targets: Sequence[Target],
                   predictions: Sequence[str]) -> float:
  """Percent of predictions whose final answer equals the gold number.

  Rule: the prediction's answer is the LAST number it contains (so "... the
  answer is 72." and "#### 72" both give 72); the gold answer is
  :func:`gsm8k_answer` of the reference. Numbers compare as decimals
  ("18.00" == "18"). A prediction with no number is wrong; a reference with
  no number is an error.
  """
  refs = _references(targets, predictions, "gsm8k_accuracy")
  correct = 0
  for i, (r, p) in enumerate(zip(refs, predictions)):
    gold = [gsm8k_answer(x) for x in r]
    if any(g is None for g in gold):
      raise ValueError(f"gsm8k_accuracy: target {i} has no number: {r!r}")
    correct += extract_number(p) in gold
  return 100.0 * correct / len(refs)


# -------------------------------------------------------------- code

_FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


def normalize_code(code: str) -> str:
  """Unwraps one surrounding markdown fence (```python ... ```), normalizes
  line endings, strips trailing whitespace and drops blank lines. Leading
  indentation is kept: it is meaningful in Python."""
  m = _FENCE.match(code)
  if m:
    code = m.group(1)
  lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
  return "\n".join(line.rstrip() for line in lines if line.strip())


def code_exact_match(targets: Sequence[Target],
                     predictions: Sequence[str]) -> float:
  """Percent of predictions equal to some reference after
  :func:`normalize_code`. A proxy: MBPP's own metric executes unit tests,
  which this library does not do (it would run untrusted model output)."""
  refs = _references(targets, predictions, "code_exact_match")
  hits = sum(normalize_code(p) in {normalize_code(x) for x in r}
             for r, p in zip(refs, predictions))
  return 100.0 * hits / len(refs)


# ---------------------------------------------------------- registry


def _rouge_key(key: str) -> MetricFn:
  def fn(targets, predictions):
    return rouge(targets, predictions, (key,))[key]
  fn.__name__ = key
  fn.__doc__ = f"{key} F-measure (see :func:`rouge`)."
  return fn


METRICS: dict[str, MetricFn] = {
    "bleu": bleu,
    **{k: _rouge_key(k) for k in ROUGE_KEYS},
    "exact_match": exact_match,
    "f1": f1,
    "gsm8k_accuracy": gsm8k_accuracy,
    "code_exact_match": code_exact_match,
}


def check_names(names: Sequence[str]) -> list[str]:
  """Returns ``names`` as a list; raises ValueError on an unknown name."""
  names = [names] if isinstance(names, str) else list(names)
  unknown = [n for n in names if n not in METRICS]
  if unknown:
    raise ValueError(f"unknown metric(s) {unknown}; known metrics: "
                     f"{sorted(METRICS)}")
  if not names:
    raise ValueError(f"no metric names given; choose from {sorted(METRICS)}")
  return names


def compute(names: Sequence[str], targets: Sequence[Target],
            predictions: Sequence[str]) -> dict[str, float]:
  """Computes the named metrics (0-100 each) over one corpus.

  Args:
    names: keys of :data:`METRICS` (a single str is accepted too).
    targets: [n] reference strings or lists of reference strings.
    predictions: [n] prediction strings.

  Returns:
    {name: score} in the order of ``names``.
  """
  names = check_names(names)
  _references(targets, predictions, "compute", allow_empty=True)
  rouge_keys = tuple(dict.fromkeys(n for n in names if n in ROUGE_KEYS))
  out = rouge(targets, predictions, rouge_keys) if rouge_keys else {}
  return {n: out[n] if n in out else METRICS[n](targets, predictions)
          for n in names}
