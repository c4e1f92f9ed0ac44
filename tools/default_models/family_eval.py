"""Measuring a default family: held-out loss, greedy quality, repetition,
acceptance of the smaller sizes against the larger ones.

Used by ``tools/default_models/build.py`` (full test split, written into
``metadata.json``) and by the tests (a fixed slice, compared exactly with the
numbers the training run recorded for it):

    pair = dm.load("t5_codegen")
    exs = dm.examples("t5_codegen", "test", limit=16)
    report = family_eval.evaluate_family(pair, exs)
    report["levels"]["large"]["rouge2"], report["acceptance"]["small>large"]

Every number is deterministic for fixed assets, examples and machine:
greedy decoding, fixed batches (``batch_size`` length-sorted rows, padded to
one compiled size), request ids = example positions.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from specdec_jax.eval import metrics as metrics_lib
from specdec_jax.families import loader as dm
from tools.default_models import train as train_lib

T5_INPUT_BUCKETS = (64, 128, 192, 256, 320)
# 128: the T5 prefix-LM pretraining pairs (task targets are <= 64).
T5_TARGET_BUCKETS = (32, 64, 128)
LM_BUCKETS = (64, 96, 128, 192, 256, 384)
GAMMA = 5
# (drafter, verifier) pairs whose greedy SpecDecode acceptance is measured.
ACCEPTANCE_PAIRS = (("small", "large"), ("medium", "large"),
                    ("small", "medium"))
LOOP_MIN_REPEATS = 3
LOOP_MAX_PERIOD = 10
LOOP_MIN_WORDS = 6


def batch_maker(spec: dm.TaskSpec, eos_id: int, prompt_weight: float = 0.0):
  """``[(input ids, target ids)] -> batch`` for the task's family.

  T5: ``train.seq2seq_batch``; Gemma: ``train.lm_batch`` with prompt tokens
  weighted ``prompt_weight`` (targets and EOS: 1).
  """
  if spec.family == "t5":
    return lambda rows: train_lib.seq2seq_batch(
        rows, T5_INPUT_BUCKETS, T5_TARGET_BUCKETS, eos_id)
  return lambda rows: train_lib.lm_batch(rows, LM_BUCKETS, eos_id,
                                         prompt_weight=prompt_weight)


def tokenize(tok, spec: dm.TaskSpec, examples: Sequence[dict]):
  """[(input ids, target ids)] of ``examples`` (see ``dm.encode_*``)."""
  return [(dm.encode_inputs(tok, spec, e["inputs"]),
           dm.encode_targets(tok, spec, e["targets"])) for e in examples]


def repetition_loop(text: str, min_repeats: int = LOOP_MIN_REPEATS,
                    max_period: int = LOOP_MAX_PERIOD,
                    min_words: int = LOOP_MIN_WORDS) -> bool:
  """True if ``text`` contains a degenerate loop.

  A loop: a unit of 1..``max_period`` whitespace-separated words repeated at
  least ``min_repeats`` times in a row, spanning at least ``min_words``
  words. ``'the name of the name of the name of the'`` has one (unit 'name
  of the', 3 times); ``'Return the name of the file.'`` has none.
  """
  words = text.split()
  for period in range(1, max_period + 1):
    need = max((min_repeats - 1) * period, min_words - period)
    run = 0
    for i in range(period, len(words)):
      run = run + 1 if words[i] == words[i - period] else 0
      if run >= need:
        return True
  return False


def heldout_loss(model, params, rows, make, batch_size: int = 64) -> float:
  """Mean cross-entropy of the target tokens and EOS (teacher forcing).

  Args:
    model, params: the model.
    rows: [(input ids, target ids)].
    make: batch maker with prompt weight 0.
    batch_size: rows per forward (length-sorted).
  """
  step = train_lib.make_eval_step(model)
  order = sorted(rows, key=lambda r: (len(r[0]), len(r[1])))
  batches = [make(order[i:i + batch_size])
             for i in range(0, len(order), batch_size)]
  return train_lib.evaluate(step, params, batches)


def decode(pair: dm.DefaultPair, method, examples: Sequence[dict],
           sampling=None, drafter: str = "small", verifier: str = "large",
           batch_size: int = 512, seed: int = 0):
  """Decodes ``examples`` in equal, length-sorted batches.

  At most ``batch_size`` rows per batch and as few batches as possible
  (every padded width is a compiled program). Row i has request id i, so
  sampled outputs do not depend on the batching.

  Returns:
    (predictions in example order, summed statistics dict).
  """
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  sampling = sampling or decoding.Greedy()
  n_batches = -(-len(examples) // batch_size)
  size = -(-len(examples) // n_batches)
  order = sorted(range(len(examples)),
                 key=lambda i: len(examples[i]["inputs"]))
  preds = [None] * len(examples)
  stats = dict(tokens=0, drafted=0, accepted=0, rejected=0, verifier_calls=0,
               drafter_calls=0, seconds=0.0)
  for lo in range(0, len(order), size):
    idx = order[lo:lo + size]
    rows = [examples[i] for i in idx]
    pad = size - len(rows)  # one compiled batch size
    rows += [rows[-1]] * pad
    t = time.perf_counter()
    texts, out = pair.generate(method, rows, sampling=sampling, gamma=GAMMA,
                               seeds=seed, drafter=drafter,
                               verifier=verifier,
                               request_ids=idx + [idx[-1]] * pad)
    stats["seconds"] += time.perf_counter() - t
    n = len(idx)
    for i, text in zip(idx, texts[:n]):
      preds[i] = text
    for key, arr in (("tokens", out.lengths), ("drafted", out.drafted),
                     ("accepted", out.accepted),
                     ("verifier_calls", out.verifier_calls),
                     ("drafter_calls", out.drafter_calls)):
      stats[key] += int(arr[:n].sum())
    if out.level_rejected is not None:  # rounds ended by a rejection (top)
      stats["rejected"] += int(out.level_rejected[:n, -1].sum())
  return preds, stats


def quality(pair: dm.DefaultPair, examples, preds) -> dict:
  """Task metrics (percent), loop fraction and mean words of ``preds``."""
  scores = metrics_lib.compute(pair.metrics, [e["targets"] for e in examples],
                               preds)
  out = {k: round(float(v), 4) for k, v in scores.items()}
  out["repetition_loop_fraction"] = round(float(np.mean(
      [repetition_loop(p) for p in preds])), 4)
  out["mean_words"] = round(float(np.mean([len(p.split()) for p in preds])),
                            3)
  return out


def evaluate_family(pair: dm.DefaultPair, examples: Sequence[dict],
                    batch_size: int = 512, with_timing: bool = False,
                    log=None) -> dict:
  """Held-out loss, greedy quality and acceptance of a whole family.

  Args:
    pair: a DefaultPair with all three sizes.
    examples: held-out examples.
    batch_size: decode rows per batch.
    with_timing: also record decode seconds (not reproducible; the tests
      compare everything else exactly).
    log: progress printer.

  Returns:
    {'examples': n,
     'levels': {level: {'loss', metrics..., 'repetition_loop_fraction',
                        'mean_words', 'mean_tokens'}},
     'acceptance': {'small>large': greedy SpecDecode acceptance rate
                    (accepted / drafted tokens, gamma = GAMMA), ...},
     'alpha': {'small>large': accepted / (accepted + rejections): the
               per-token acceptance rate of the papers, independent of
               gamma, ...},
     'tokens_per_call': {...}, 'spec_equals_target': {...}}
  """
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  say = log or (lambda s: None)
  tok, spec = pair.tokenizer, pair.spec
  make = batch_maker(spec, tok.eos_id, 0.0)
  rows = tokenize(tok, spec, examples)
  report = dict(examples=len(examples), levels={}, acceptance={}, alpha={},
                tokens_per_call={}, spec_equals_target={})
  greedy_out = {}
  target_only = decoding.make_method("target_only")
  for level in dm.LEVELS:
    model, params = pair.model(level)
    row = dict(loss=round(heldout_loss(model, params, rows, make), 5))
    preds, stats = decode(pair, target_only, examples, verifier=level,
                          batch_size=batch_size)
    greedy_out[level] = preds
    row.update(quality(pair, examples, preds))
    row["mean_tokens"] = round(stats["tokens"] / len(examples), 3)
    if with_timing:
      row["decode_seconds"] = round(stats["seconds"], 2)
    report["levels"][level] = row
    say(f"{pair.name} {level}: {row}")
  spec_decode = decoding.make_method("spec_decode")
  for q, p in ACCEPTANCE_PAIRS:
    key = f"{q}>{p}"
    preds, stats = decode(pair, spec_decode, examples, drafter=q, verifier=p,
                          batch_size=batch_size)
    report["acceptance"][key] = round(stats["accepted"] / stats["drafted"],
                                      5)
    report["alpha"][key] = round(stats["accepted"] / max(
        stats["accepted"] + stats["rejected"], 1), 5)
    report["tokens_per_call"][key] = round(
        stats["tokens"] / stats["verifier_calls"], 4)
    report["spec_equals_target"][key] = round(float(np.mean(
        [a == b for a, b in zip(preds, greedy_out[p])])), 4)
    say(f"{pair.name} SpecDecode {key}: acceptance "
        f"{report['acceptance'][key]}")
  return report


__all__ = [
    "ACCEPTANCE_PAIRS", "GAMMA", "LM_BUCKETS", "T5_INPUT_BUCKETS",
    "T5_TARGET_BUCKETS", "batch_maker", "decode", "evaluate_family",
    "heldout_loss", "quality", "repetition_loop", "tokenize",
]
