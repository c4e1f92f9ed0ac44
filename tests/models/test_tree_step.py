"""Tree-masked block steps and ``KVCache.commit`` equal uncached forwards.

Each row holds a ragged cached prefix (with stale entries past its length
left by a rollback) and its own tree; every node's logits must equal the
uncached forward of prefix + that node's root-to-node path. Then the rows
commit a non-contiguous accepted path and keep decoding: the logits and the
cache must equal decoding prefix + path from scratch.
"""

import dataclasses

import jax
import numpy as np
import pytest

from specdec_jax import models
from tests.models import trees
from tests.models.helpers import jitted, reference_logits

TOL = 1e-5
MAX_LEN = 48
TREES = (trees.DEEP, trees.WIDE, trees.CHAIN, trees.FOREST)


def _model(family):
  """Tiny models; Gemma 2 with 4 layers and a window of 3."""
  if family == "t5":
    return models.get_model("t5_tiny")
  if family == "gemma":
    return models.get_model("gemma_tiny")
  if family == "gemma3":  # 5 local (window 4) : 1 global, QK-norm
    return models.get_model("gemma3_tiny")
  cfg = dataclasses.replace(
      models.PRESETS["gemma2_tiny"], num_layers=4, sliding_window=3,
      attention_types=("local", "global") * 2)
  return models.GemmaModel(cfg)


@pytest.fixture(scope="module", params=["t5", "gemma", "gemma2", "gemma3"])
def setup(request):
  model = _model(request.param)
  params = model.init_params(jax.random.PRNGKey(1))
  rng = np.random.default_rng(5)
  inputs = None
  if model.is_encoder_decoder:
    inputs = rng.integers(2, model.vocab_size, (len(TREES), 6))
    inputs[1, 4:] = 0
  return model, params, inputs


def _ref(model, params, inputs, b, tokens):
  return reference_logits(model, params, tokens,
                          None if inputs is None else inputs[b],
                          pad_to=MAX_LEN)


def _prefixed_cache(model, params, inputs, prefix, lengths):
  """Caches ``prefix`` [B, P], then rolls each row back to its length."""
  enc = None if inputs is None else model.encode(params, inputs)
  cache = model.init_cache(len(prefix), MAX_LEN, enc)
  _, cache = jitted(model)[0](params, prefix, cache)
  return cache.with_lengths(lengths)


def _tree_block(rng, vocab, lengths, parent_sets):
  """tokens [B, N], positions [B, N], mask [B, N, N] of one tree per row."""
  tokens = rng.integers(2, vocab, (len(parent_sets), len(parent_sets[0])))
  layouts = [trees.layout(p) for p in parent_sets]
  positions = np.stack([lengths[b] + d for b, (d, _) in enumerate(layouts)])
  mask = np.stack([m for _, m in layouts])
  return tokens, positions.astype(np.int32), mask


def test_tree_step_equals_per_path_uncached_forwards(setup):
  model, params, inputs = setup
  rng = np.random.default_rng(0)
  prefix = rng.integers(2, model.vocab_size, (len(TREES), 12))
  lengths = np.array([9, 1, 4, 12], np.int32)  # ragged, stale slots behind
  cache = _prefixed_cache(model, params, inputs, prefix, lengths)
  tokens, positions, mask = _tree_block(rng, model.vocab_size, lengths, TREES)
  logits, new = jitted(model)[0](params, tokens, cache, positions=positions,
                                 mask=mask)
  np.testing.assert_array_equal(new.lengths, lengths + tokens.shape[1])
  logits = np.asarray(logits)
  for b, parents in enumerate(TREES):
    for node in range(len(parents)):
      path = trees.path_to(parents, node)
      seq = list(prefix[b, :lengths[b]]) + list(tokens[b, path])
      ref = _ref(model, params, inputs, b, seq)[-1]
      np.testing.assert_allclose(logits[b, node], ref, atol=TOL, rtol=0,
                                 err_msg=f"row {b} node {node}")


def test_logits_at_picks_one_tree_node(setup):
  model, params, inputs = setup
  rng = np.random.default_rng(1)
  prefix = rng.integers(2, model.vocab_size, (len(TREES), 6))
  lengths = np.array([6, 2, 3, 5], np.int32)
  cache = _prefixed_cache(model, params, inputs, prefix, lengths)
  tokens, positions, mask = _tree_block(rng, model.vocab_size, lengths, TREES)
  full, _ = model.step(params, tokens, cache, positions=positions, mask=mask)
  at = np.array([6, 3, 0, 5], np.int32)
  one, _ = model.step(params, tokens, cache, positions=positions, mask=mask,
                      logits_at=at)
  assert one.shape == (len(TREES), 1, model.vocab_size)
  np.testing.assert_allclose(one[:, 0], np.asarray(full)[np.arange(4), at],
                             atol=TOL, rtol=0)
  # [B, P] picks P nodes per row, in the given order (repeats allowed).
  many_at = np.array([[6, 0, 1], [3, 3, 2], [0, 4, 1], [5, 2, 0]], np.int32)
  many, _ = model.step(params, tokens, cache, positions=positions, mask=mask,
                       logits_at=many_at)
  assert many.shape == (len(TREES), 3, model.vocab_size)
  np.testing.assert_allclose(
      many, np.asarray(full)[np.arange(4)[:, None], many_at], atol=TOL,
      rtol=0)
  with pytest.raises(ValueError, match=r"logits_at must have shape \(4,\) "
                     r"or \(4, P\)"):
    model.step(params, tokens, cache, logits_at=np.zeros((3, 2), np.int32))


def _tree_and_commit(model, params, rng, cache, seqs, leaves, counts):
  """One tree step, then each row commits part of a root-to-leaf path.

  Returns the cache and the rows' token sequences after the commit.
  """
  lengths = np.asarray(cache.lengths)
  tokens, positions, mask = _tree_block(rng, model.vocab_size, lengths, TREES)
  _, cache = jitted(model)[0](params, tokens, cache, positions=positions,
                              mask=mask)
  paths = [trees.path_to(p, leaf) for p, leaf in zip(TREES, leaves)]
  width = max(len(p) for p in paths)
  path = np.stack([np.pad(p, (0, width - len(p)), constant_values=p[-1])
                   for p in paths]).astype(np.int32)
  count = np.asarray(counts, np.int32)
  cache = cache.commit(lengths, path, count)
  np.testing.assert_array_equal(cache.lengths, lengths + count)
  seqs = [seqs[b][:lengths[b]] + list(tokens[b, path[b, :count[b]]])
          for b in range(len(TREES))]
  return cache, seqs


def _chain_step(model, params, inputs, rng, cache, seqs, k):
  """A default (causal) block of k tokens, checked against the reference."""
  lengths = np.asarray(cache.lengths)
  toks = rng.integers(2, model.vocab_size, (len(TREES), k))
  logits, cache = jitted(model)[0](params, toks, cache)
  seqs = [seqs[b][:lengths[b]] + list(toks[b]) for b in range(len(TREES))]
  for b in range(len(TREES)):
    ref = _ref(model, params, inputs, b, seqs[b])[lengths[b]:]
    np.testing.assert_allclose(np.asarray(logits)[b], ref, atol=TOL, rtol=0,
                               err_msg=f"row {b}")
  return cache, seqs


def test_commit_then_decode_equals_decoding_the_path_from_scratch(setup):
  model, params, inputs = setup
  rng = np.random.default_rng(2)
  prefix = rng.integers(2, model.vocab_size, (len(TREES), 10))
  lengths = np.array([3, 10, 1, 7], np.int32)
  cache = _prefixed_cache(model, params, inputs, prefix, lengths)
  seqs = [list(prefix[b, :lengths[b]]) for b in range(len(TREES))]
  # Non-contiguous accepted paths (DEEP [0,1,2,4,5,6], WIDE [0,4], FOREST
  # [0,3,6]); counts differ per row, one row accepts nothing.
  cache, seqs = _tree_and_commit(model, params, rng, cache, seqs,
                                 leaves=(6, 4, 5, 6), counts=(6, 2, 0, 3))
  _check_cache_equals_scratch(model, params, inputs, cache, seqs)
  cache, seqs = _chain_step(model, params, inputs, rng, cache, seqs, 3)
  cache, seqs = _tree_and_commit(model, params, rng, cache, seqs,
                                 leaves=(3, 2, 6, 5), counts=(3, 1, 7, 1))
  _check_cache_equals_scratch(model, params, inputs, cache, seqs)
  for _ in range(2):
    cache, seqs = _chain_step(model, params, inputs, rng, cache, seqs, 1)


def _check_cache_equals_scratch(model, params, inputs, cache, seqs):
  """Valid K/V slots of ``cache`` equal those of prefilling ``seqs``."""
  width = max(len(s) for s in seqs)
  toks = np.stack([np.pad(s, (0, width - len(s)), constant_values=2)
                   for s in seqs])
  fresh = _prefixed_cache(model, params, inputs, toks,
                          np.array([len(s) for s in seqs], np.int32))
  for got, want in zip(cache.layers, fresh.layers):
    for b, s in enumerate(seqs):
      for g, w in ((got.k, want.k), (got.v, want.v)):
        np.testing.assert_allclose(np.asarray(g)[b, :len(s)],
                                   np.asarray(w)[b, :len(s)], atol=TOL,
                                   rtol=0)


def test_explicit_default_positions_and_mask_equal_the_default_path(setup):
  model, params, inputs = setup
  rng = np.random.default_rng(3)
  prefix = rng.integers(2, model.vocab_size, (len(TREES), 8))
  lengths = np.array([8, 2, 5, 0], np.int32)
  cache = _prefixed_cache(model, params, inputs, prefix, lengths)
  k = 5
  tokens = rng.integers(2, model.vocab_size, (len(TREES), k))
  positions = lengths[:, None] + np.arange(k, dtype=np.int32)
  causal = np.broadcast_to(np.tril(np.ones((k, k), bool)), (len(TREES), k, k))
  step = jitted(model)[0]
  want, want_cache = step(params, tokens, cache)
  for kw in (dict(positions=positions, mask=causal), dict(positions=positions),
             dict(mask=causal)):
    got, got_cache = step(params, tokens, cache, **kw)
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0, err_msg=str(kw))
    for g, w in zip(got_cache.layers, want_cache.layers):
      np.testing.assert_array_equal(g.k, w.k)
