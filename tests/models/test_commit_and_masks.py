"""Hand-computable checks of ``KVCache.commit`` and the block masks."""

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import cache as cache_lib
from specdec_jax.models import masks
from specdec_jax.models.cache import KVCache, LayerKV


def _cache(lengths, max_length=8, layers=2):
  """Slot s of row b, layer l holds 100 * l + 10 * b + s (k) and its negative
  (v), so every moved entry is identifiable."""
  b = len(lengths)
  base = (10 * np.arange(b)[:, None] + np.arange(max_length)[None, :])
  kvs = tuple(LayerKV(k=jnp.asarray(100 * l + base, jnp.float32)[..., None,
                                                                  None],
                      v=-jnp.asarray(100 * l + base, jnp.float32)[..., None,
                                                                   None])
              for l in range(layers))
  return KVCache(lengths=jnp.asarray(lengths, jnp.int32), layers=kvs)


def _slots(layer_kv, b):
  return np.asarray(layer_kv.k)[b, :, 0, 0].astype(int).tolist()


def test_commit_worked_example():
  # Row 0: block [r, a, b, c] at slots 5..8, accepted r -> b: slots 5, 6
  # hold r (slot 5), b (slot 7); lengths 7 (the docstring example).
  # Row 1: block at slot 1, accepted nodes 1, 3 of the block.
  # Row 2: nothing accepted; the chain case in row 3.
  cache = _cache([9, 5, 4, 5], max_length=10)
  start = np.array([5, 1, 2, 0])
  path = np.array([[0, 2, 0], [1, 3, 3], [0, 1, 2], [0, 1, 2]])
  count = np.array([2, 2, 0, 3])
  out = cache.commit(start, path, count)
  np.testing.assert_array_equal(out.lengths, [7, 3, 2, 3])
  for l, kv in enumerate(out.layers):
    got = [s[:n] for s, n in zip(
        [_slots(kv, b) for b in range(4)], [7, 3, 2, 3])]
    base = lambda b, s: 100 * l + 10 * b + s  # noqa: E731
    assert got[0] == [base(0, s) for s in (0, 1, 2, 3, 4, 5, 7)]
    assert got[1] == [base(1, s) for s in (0, 2, 4)]
    assert got[2] == [base(2, s) for s in (0, 1)]
    assert got[3] == [base(3, s) for s in (0, 1, 2)]
    np.testing.assert_array_equal(out.layers[l].v, -out.layers[l].k)


def test_commit_near_the_end_of_the_cache_never_shifts_the_prefix():
  # start 6 + width 3 > max_length 8: dynamic_update_slice would shift the
  # write to slot 5 and clobber it; commit must leave slots < start intact.
  cache = _cache([8], max_length=8, layers=1)
  out = cache.commit(np.array([6]), np.array([[1, 1, 1]]), np.array([1]))
  assert _slots(out.layers[0], 0)[:7] == [0, 1, 2, 3, 4, 5, 7]
  assert int(out.lengths[0]) == 7
  with pytest.raises(ValueError, match="path width 9 exceeds"):
    cache.commit(np.array([0]), np.zeros((1, 9), np.int32), np.array([0]))


def test_commit_leaves_cross_attention_alone():
  cache = _cache([4, 4])
  cross = (LayerKV(k=jnp.ones((2, 3, 1, 1)), v=jnp.zeros((2, 3, 1, 1))),)
  cache = cache.replace(cross=cross, cross_mask=jnp.ones((2, 3), bool))
  out = cache.commit(np.array([1, 2]), np.array([[1], [0]]), np.array([1, 1]))
  assert out.cross is cross and out.cross_mask is cache.cross_mask


def test_block_mask_worked_example():
  # masks.py docstring: lengths 2, a root with two children.
  lengths = jnp.array([2])
  pos = jnp.array([[2, 3, 3]])
  tree = jnp.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool)
  k_pos = masks.key_positions(lengths, pos, 6)
  np.testing.assert_array_equal(k_pos, [[0, 1, 2, 3, 3, 5]])
  vis = masks.block_mask(lengths, pos, 6, mask=tree, window=None)
  assert np.asarray(vis[0, 2]).nonzero()[0].tolist() == [0, 1, 2, 4]
  # A window of 2 keeps keys at distance 0 and 1 only.
  vis = masks.block_mask(lengths, pos, 6, mask=tree, window=2)
  assert np.asarray(vis[0, 2]).nonzero()[0].tolist() == [2, 4]


def test_cached_slot_form_worked_example():
  """The same tree with the root and child 1 already cached (slots 2, 3):
  child 2 alone is fed at slot 4, and the mask's first M = 2 columns
  re-describe slots 2 and 3 (root visible, sibling hidden, both keys at
  their tree positions). Row 1: lengths 1 < M = 2, so column 0 addresses no
  slot and slot 0 is a plain prefix slot."""
  lengths = jnp.array([4, 1])
  pos = jnp.array([[2, 3, 3], [7, 0, 1]])
  mask = jnp.array([[[1, 0, 1]], [[0, 1, 1]]], bool)
  q_pos, k_pos, got = masks.step_masks(lengths, 1, 6, (None, 2), pos, mask)
  np.testing.assert_array_equal(q_pos, [[3], [1]])
  np.testing.assert_array_equal(k_pos, [[0, 1, 2, 3, 3, 5],
                                        [0, 1, 2, 3, 4, 5]])
  assert np.asarray(got[None][0, 0]).nonzero()[0].tolist() == [0, 1, 2, 4]
  assert np.asarray(got[2][0, 0]).nonzero()[0].tolist() == [2, 4]
  assert np.asarray(got[None][1, 0]).nonzero()[0].tolist() == [0, 1]
  # Hiding the cached slot of row 1 hides it even though it precedes the
  # block.
  hidden = mask.at[1, 0, 1].set(False)
  _, _, got = masks.step_masks(lengths, 1, 6, (None,), pos, hidden)
  assert np.asarray(got[None][1, 0]).nonzero()[0].tolist() == [1]


def test_default_masks_are_the_causal_ones():
  lengths = jnp.array([3, 0])
  q_pos, k_pos, got = masks.step_masks(lengths, 2, 6, (None, 2), None, None)
  np.testing.assert_array_equal(q_pos, cache_lib.block_positions(lengths, 2))
  np.testing.assert_array_equal(k_pos, [np.arange(6)])
  for w in (None, 2):
    np.testing.assert_array_equal(got[w],
                                  cache_lib.causal_mask(q_pos, 6, w))
  # Explicit chain arguments give the same masks through the tree path.
  chain = jnp.broadcast_to(jnp.tril(jnp.ones((2, 2), bool)), (2, 2, 2))
  _, _, explicit = masks.step_masks(lengths, 2, 6, (None, 2), q_pos, chain)
  for w in (None, 2):
    np.testing.assert_array_equal(explicit[w], got[w])


def test_step_argument_shapes_are_checked():
  toks = np.zeros((2, 3), np.int32)
  with pytest.raises(ValueError, match=r"positions must have shape \(2, 3\)"):
    masks.check_step_args(toks, np.zeros((2, 4)), None, None)
  with pytest.raises(ValueError, match=r"mask must have shape \(2, 3, 3\)"):
    masks.check_step_args(toks, None, np.zeros((2, 3), bool), None)
  with pytest.raises(ValueError, match=r"mask must have shape .*re-describe"):
    masks.check_step_args(toks, None, np.zeros((2, 3, 2), bool), None)
  with pytest.raises(ValueError, match=r"positions must have shape \(2, 5\)"
                     r".*covers 2 cached slots"):
    masks.check_step_args(toks, np.zeros((2, 3)), np.zeros((2, 3, 5), bool),
                          None)
  masks.check_step_args(toks, np.zeros((2, 5)), np.zeros((2, 3, 5), bool),
                        None)
  with pytest.raises(ValueError, match="mask must be bool"):
    masks.check_step_args(toks, None, np.zeros((2, 3, 3), np.int32), None)
