"""The lean non-model paths (sampling.LEAN) give the reference's numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.decoding.loops.drafting import FallbackStop
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.targets import Lossy, SpecDecode
from specdec_jax.decoding.verify.chain import verify_block
from specdec_jax.decoding.verify.greedy import greedy_verifiable, verify_greedy


def _both(fn):
  """(lean, reference) results of jit(fn)() (traced under each setting)."""
  lean = jax.jit(fn)()
  sampling.LEAN = False
  try:
    ref = jax.jit(fn)()
  finally:
    sampling.LEAN = True
  return lean, ref


@pytest.mark.parametrize("temps", [[0.0, 0.0, 0.0, 0.0], [1.0, 0.7, 2.0, 1.0],
                                   [0.0, 1.0, 0.0, 0.5]])
def test_transform_draw_and_kernel_match_the_reference(temps):
  key = jax.random.key(3)
  logits = jax.random.normal(key, (4, 3, 50)) * 3  # [B, g + 1, V]
  strategy = sampling.TopK(jnp.asarray([50, 5, 50, 3]), jnp.asarray(temps))
  keys = jax.random.split(key, 4)
  drafts = jnp.asarray([[1, 2], [3, 4], [5, 6], [7, 8]], jnp.int32)
  u = jax.random.uniform(key, (4, 2))

  def fn():
    sq, sp = strategy.probs(logits), strategy.probs(logits[::-1])
    tok = sampling.draw(keys, logits[:, 0], strategy)
    out = verify_block(SpecDecode(), drafts, sq, sp, sq, sp, u, keys,
                       jax.random.split(jax.random.key(9), 4))
    return sq, tok, out.accepted, out.token

  lean, ref = _both(fn)
  for a, b in zip(lean, ref):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sample_at_is_sample_with_the_rows_uniforms():
  keys = jax.random.split(jax.random.key(0), 64)
  dist = jax.random.uniform(jax.random.key(1), (64, 37))
  u = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys)
  np.testing.assert_array_equal(sampling.sample(keys, dist),
                                sampling.sample_at(u, dist))


def test_greedy_verify_is_the_kernel_at_temperature_zero():
  # Worked example: gamma = 3, V = 4. Verifier argmaxes per position:
  # [2, 0, 3, 1]; row 0 drafts [2, 0, 1] -> 2 accepted, token 3 (the
  # verifier's argmax where the first draft failed); row 1 drafts [2, 0, 3]
  # -> all 3 accepted, token 1 (the bonus); row 2 drafts [1, ...] -> 0, 2.
  p_logits = jnp.asarray([[[0., 1., 5., 2.], [4., 1., 0., 2.],
                           [0., 1., 2., 7.], [1., 9., 2., 3.]]] * 3)
  drafts = jnp.asarray([[2, 0, 1], [2, 0, 3], [1, 0, 3]], jnp.int32)
  out = verify_greedy(drafts, p_logits)
  np.testing.assert_array_equal(out.accepted, [2, 3, 0])
  np.testing.assert_array_equal(out.token, [3, 1, 2])
  np.testing.assert_array_equal(out.defer, np.zeros((3, 4)))

  # Against the full kernel on random logits whose drafts are the drafter's
  # argmaxes, as a greedy batch's are.
  key = jax.random.key(5)
  q_logits = jax.random.normal(key, (64, 4, 11)) * 2
  p_logits = q_logits + jax.random.normal(jax.random.key(6), (64, 4, 11))
  greedy = sampling.canonical(sampling.Temperature(0.0))
  drafts = sampling.argmax(q_logits[:, :3])
  sq, sp = greedy.probs(q_logits), greedy.probs(p_logits)
  keys = jax.random.split(key, 64)
  u = jax.random.uniform(key, (64, 3))
  full = verify_block(SpecDecode(), drafts, sampling.unscaled(q_logits),
                      sampling.unscaled(p_logits), sq, sp, u, keys, keys)
  fast = verify_greedy(drafts, p_logits)
  assert 0 < int(jnp.sum(fast.accepted == 3)) < 64  # both outcomes occur
  for name in ("accepted", "token", "accept", "defer"):
    np.testing.assert_array_equal(getattr(fast, name), getattr(full, name))


def test_greedy_verify_applies_to_lossless_chains_only():
  assert greedy_verifiable(SpecDecode(), None)
  assert not greedy_verifiable(SpecDecode(), FallbackStop(0.5))
  assert not greedy_verifiable(Lossy(alpha=0.2), None)
  sampling.LEAN = False
  try:
    assert not greedy_verifiable(SpecDecode(), None)
  finally:
    sampling.LEAN = True


def test_draw_takes_a_key_function():
  logits = jax.random.normal(jax.random.key(2), (5, 30)) * 2
  keys = jax.random.split(jax.random.key(4), 5)
  for t in (0.0, 1.0, [0.0, 1.0, 0.5, 0.0, 2.0]):
    strategy = sampling.Temperature(jnp.asarray(t, jnp.float32))
    np.testing.assert_array_equal(
        jax.jit(lambda: sampling.draw(lambda: keys, logits, strategy))(),
        jax.jit(lambda: sampling.draw(keys, logits, strategy))())


def _lean_and_reference(family, *counters, temperatures=(0.0, 1.0) * 4,
                        **structure):
  """(lean, reference) SpecDecode results on a tiny pair (8 rows, T 0 and 1
  mixed unless ``temperatures`` says otherwise, with the block trace),
  asserted equal in tokens, the block trace, accepted / drafted / verifier
  calls and ``counters``."""
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from tests.decoding import pairs  # pylint: disable=g-import-not-at-top
  d, v, qp, pp = pairs.tiny_pair(family)
  rows = pairs.random_prompts(np.random.default_rng(7), 8, v.vocab_size)
  kw = dict(inputs=rows) if v.is_encoder_decoder else dict(prompts=rows)

  def run():
    return decoding.generate(
        decoding.make_method("spec_decode"), d, v, qp, pp,
        sampling=decoding.Temperature(list(temperatures)), max_new_tokens=12,
        seeds=list(range(8)), eos_id=None, return_trace=True, **structure,
        **kw)

  lean = run()
  sampling.LEAN = False
  try:
    ref = run()
  finally:
    sampling.LEAN = True
  np.testing.assert_array_equal(lean.tokens, ref.tokens)
  for name in ("accepted", "drafted", "verifier_calls", *counters):
    np.testing.assert_array_equal(getattr(lean, name), getattr(ref, name))
  for name, value in ref.trace.items():
    np.testing.assert_array_equal(lean.trace[name], value)
  return lean, ref


@pytest.mark.parametrize("family", ["gemma", "t5"])
def test_one_block_first_feed_matches_the_cond(family):
  """SpecDecode's draft phase feeds the drafter ONE 2-token block per row
  (``[catchup, pending]`` on lagging rows, ``[pending, pad]`` on the others)
  instead of a ``lax.cond`` on "some row lags": same tokens, same drafts and
  acceptances block by block, same counters, at T = 0 and 1 -- in a decode
  where, in some iteration, some rows lag and others do not."""
  gamma = 3
  lean, ref = _lean_and_reference(family, "drafter_calls", gamma=gamma)
  acc = np.asarray(ref.trace["accepted"])  # [B, blocks]
  mixed = [(acc[:, k] == gamma).any() and ((acc[:, k] >= 0) &
                                            (acc[:, k] < gamma)).any()
           for k in range(acc.shape[1] - 1)]
  assert any(mixed), acc  # the next block had lagging and other rows


@pytest.mark.parametrize("family", ["gemma", "t5"])
def test_tree_catch_up_inside_the_root_call_matches_the_cond(family):
  """A tree that catches the drafter up feeds the catch-up token inside
  drafter call 0 (one 2-token block, ``[catchup, root]`` / ``[root,
  pad]``) instead of a separate 1-token call under a ``lax.cond``: same
  tokens, same tree drafts and acceptances block by block, same verifier
  counters, at T = 0 and 1, in a decode where some block has lagging and
  other rows; the drafter makes D calls per block (the reference D, plus
  one in every block after a row lagged)."""
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  topology = decoding.Topology.kary(2, 3)
  lean, ref = _lean_and_reference(family, tree=decoding.Tree(
      topology, proposal="without_replacement"))
  acc = np.asarray(ref.trace["accepted"])  # [B, blocks]
  depth = topology.max_depth
  lagged = [(acc[:, k] == depth).any() for k in range(acc.shape[1] - 1)]
  mixed = [lag and ((acc[:, k + 1] >= 0) & (acc[:, k] < depth) &
                    (acc[:, k] >= 0)).any() for k, lag in enumerate(lagged)]
  assert any(mixed), acc  # the next block had lagging and other rows
  calls = np.asarray(lean.verifier_calls)
  np.testing.assert_array_equal(lean.drafter_calls, depth * calls)
  # The reference's extra call: in every block where some active row's
  # last block accepted a depth-D node.
  lags, extra = np.zeros(acc.shape[0], bool), np.zeros(acc.shape[0], int)
  for k in range(acc.shape[1]):
    live = acc[:, k] >= 0
    extra += live & (lags & live).any()
    lags = np.where(live, acc[:, k] == depth, lags)
  assert extra.any()
  np.testing.assert_array_equal(ref.drafter_calls, depth * calls + extra)


@pytest.mark.parametrize("kind", ["iid", "without_replacement"])
def test_greedy_children_are_the_drawn_ones(kind):
  """A greedy batch's children, taken without draws (the argmax; the top C
  logits in order), equal the rank-by-rank draws from one-hot S(q): ties in
  the logits included (lower index first)."""
  from specdec_jax.decoding.loops import tree_drafting  # pylint: disable=g-import-not-at-top
  logits = jnp.round(jax.random.normal(jax.random.key(1), (4, 3, 40)) * 2)
  sq = sampling.canonical(sampling.Greedy()).probs(logits)
  assert int(jnp.sum(logits == jnp.max(logits, -1, keepdims=True))) > 12
  slot_of = jnp.zeros((4, 20), jnp.int32)
  keys_at = lambda slots: jax.vmap(jax.vmap(
      lambda s: jax.random.fold_in(jax.random.key(0), s)))(slots)
  for c in (1, 3, 6):
    kids = jnp.broadcast_to(jnp.arange(3 * c, dtype=jnp.int32).reshape(
        1, 3, c), (4, 3, c))
    args = (kind, logits, sq, kids, slot_of, keys_at, c)
    drawn = tree_drafting._drawn_children(*args)  # pylint: disable=protected-access
    fast = jax.jit(lambda a=args: tree_drafting.draw_children(
        *a, cold=jnp.asarray(True)))()
    np.testing.assert_array_equal(fast, drawn)
    if kind == "without_replacement":
      np.testing.assert_array_equal(
          np.sort(np.asarray(logits), -1)[..., ::-1][..., :c],
          np.take_along_axis(np.asarray(logits), np.asarray(fast), -1))


@pytest.mark.parametrize("family,proposal", [
    ("gemma", "without_replacement"), ("gemma", "iid"),
    ("t5", "without_replacement")])
def test_greedy_tree_batches_skip_the_draws_with_the_same_tokens(family,
                                                                 proposal):
  """An all-greedy batch on a wide irregular tree (6 children at the root,
  depth 4) takes its children without draws: same tokens, tree drafts and
  acceptances block by block as the reference's rank-by-rank draws."""
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  topology = decoding.Topology((-1,) * 6 + (0, 0, 1, 6, 6, 7, 9))
  lean, ref = _lean_and_reference(family, temperatures=(0.0,) * 8,
                                  tree=decoding.Tree(topology,
                                                     proposal=proposal))
  assert np.asarray(ref.trace["accepted"]).max() >= 2
