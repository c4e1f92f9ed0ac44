"""Cached block decoding equals the uncached forward, through rollbacks."""

import numpy as np
import pytest

from tests.models.helpers import jitted, reference_logits, tiny

TOL = 1e-5
MAX_LEN = 40


def _run_script(model, params, rows_seed, batch, inputs=None):
  """Applies random blocks and rollbacks; checks every logit vs reference.

  Returns the per-row history of (committed tokens, logits) for comparing a
  batched run with single-row runs.
  """
  rng = np.random.default_rng(rows_seed)
  vocab = model.vocab_size
  encoded = None if inputs is None else model.encode(params, inputs)
  cache = model.init_cache(batch, MAX_LEN, encoded)
  committed = [[] for _ in range(batch)]
  outputs = []
  step = jitted(model)[0]
  first = True
  while True:
    lengths = np.asarray(cache.lengths)
    room = MAX_LEN - int(lengths.max())
    if room < 1:
      break
    k = int(min(room, rng.choice([1, 2, 3, 6] + ([9] if first else []))))
    first = False
    tokens = rng.integers(2, vocab, size=(batch, k))
    logits, cache = step(params, tokens, cache)
    logits = np.asarray(logits)
    for b in range(batch):
      committed[b] = committed[b][:lengths[b]] + list(tokens[b])
      ref = reference_logits(model, params, committed[b],
                             None if inputs is None else inputs[b],
                             pad_to=MAX_LEN)
      np.testing.assert_allclose(logits[b], ref[lengths[b]:], atol=TOL,
                                 rtol=0)
    outputs.append(logits)
    # Random per-row rollback (possibly zero) of up to k + 2 positions.
    new_len = np.asarray(cache.lengths) - rng.integers(0, k + 3, size=batch)
    cache = cache.with_lengths(np.maximum(new_len, 1))
  return outputs


@pytest.mark.parametrize("family", ["t5", "gemma", "gemma2", "gemma3"])
def test_cached_blocks_and_rollbacks_match_uncached(family):
  model, params = tiny(family)
  inputs = None
  if family == "t5":
    inputs = np.random.default_rng(3).integers(2, model.vocab_size, (3, 7))
    inputs[1, 4:] = 0
  for seed in range(3):
    _run_script(model, params, seed, 3, inputs)


@pytest.mark.parametrize("family", ["t5", "gemma2"])
def test_ragged_batch_equals_rows_alone(family):
  model, params = tiny(family)
  rng = np.random.default_rng(7)
  batch, vocab = 3, model.vocab_size
  inputs = None
  if family == "t5":
    inputs = rng.integers(2, vocab, (batch, 6))
    inputs[2, 3:] = 0
  # Rows start at different lengths (a padded prefill) and roll back
  # differently; each row must equal the same row decoded alone.
  prompt = rng.integers(2, vocab, (batch, 8))
  plen = np.array([8, 3, 5])
  steps = [rng.integers(2, vocab, (batch, k)) for k in (4, 1, 6, 2)]
  backs = [rng.integers(0, 4, batch) for _ in steps]

  def run(rows):
    step = jitted(model)[0]
    enc = None if inputs is None else model.encode(params, inputs[rows])
    cache = model.init_cache(len(rows), MAX_LEN, enc)
    _, cache = step(params, prompt[rows], cache)
    cache = cache.with_lengths(plen[rows])
    outs = []
    for toks, back in zip(steps, backs):
      logits, cache = step(params, toks[rows], cache)
      outs.append(np.asarray(logits))
      cache = cache.with_lengths(np.asarray(cache.lengths) - back[rows])
    return outs

  together = run(np.arange(batch))
  for b in range(batch):
    alone = run(np.array([b]))
    for t, a in zip(together, alone):
      np.testing.assert_allclose(t[b], a[0], atol=TOL, rtol=0)
