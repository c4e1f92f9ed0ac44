"""The tree verification kernel on hand-computed and chain-shaped inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.targets import SpecDecode
from specdec_jax.decoding.verify import greedy
from specdec_jax.decoding.verify import tree as tree_lib


def _arrays(topology, batch=1):
  return {k: jnp.asarray(v)
          for k, v in tree_lib.tree_arrays(topology, batch).items()}


def _at(keys, n):
  """keys [B, K] at per-row column n [B]."""
  return jax.vmap(lambda k, i: k[i])(keys, n)


def _keys(batch, width):
  seed = jnp.zeros((batch,), jnp.uint32)
  rid = jnp.arange(batch, dtype=jnp.int32)
  res = keys_lib.row_keys(seed, rid, jnp.zeros((batch,), jnp.int32),
                          keys_lib.RESIDUAL)
  bonus = jnp.stack([keys_lib.row_keys(seed, rid, jnp.full((batch,), j,
                                                           jnp.int32),
                                       keys_lib.DRAFT)
                     for j in range(width)], axis=1)
  return res, bonus


def _walk(sp, u, kind="without_replacement"):
  """verify_tree on the docstring's block: root children tokens 1 and 2."""
  topo = decoding.Topology.from_widths([[2]])
  sq = jnp.asarray([[[.2, .5, .3], [1 / 3] * 3, [1 / 3] * 3]])
  sp = jnp.asarray([sp, [1 / 3] * 3, [1., 0., 0.]])[None]
  res, bonus = _keys(1, 2)
  return tree_lib.verify_tree(decoding.SpecDecode(), kind,
                              jnp.asarray([[7, 1, 2]]), _arrays(topo), sq,
                              sp, sq, sp, jnp.asarray([u]), res,
                              lambda n: _at(bonus, n))


def test_worked_example_of_the_module_docstring():
  """pi = [.1, .3, .6], S(q) = [.2, .5, .3], u = (.9, .5): child 1 (token
  1) is rejected (.45 >= .3), r = [0, 0, .3]; child 2 (token 2) is tested
  against Q_2 = [.4, 0, .6]: .5 * .6 * .3 = .09 < .3, accepted. Node 2 is a
  leaf, so the bonus is drawn from pi there (one-hot 0)."""
  out = _walk([.1, .3, .6], [.9, .5])
  assert out.accepted.tolist() == [1] and out.path.tolist() == [[0, 2]]
  assert out.accept.tolist() == [[False, True]]
  assert out.token.tolist() == [0] and out.rejected.tolist() == [False]


def test_every_child_rejected_draws_from_the_residual():
  """pi = [.6, .4, 0]: child 1: .999999 * .5 >= .4, rejected, r = max(0,
  pi - S(q)) = [.4, 0, 0]; child 2: r(2) = 0, rejected; the token is drawn
  from r: 0 (a residual draw)."""
  out = _walk([.6, .4, 0.], [.999999, .5])
  assert out.accepted.tolist() == [0] and out.rejected.tolist() == [True]
  assert out.accept.tolist() == [[False, False]] and out.token.tolist() == [0]


def test_one_hot_proposals_accept_with_the_target_mass():
  """top_k: Q_i = one-hot(x_i), so child 1 is accepted iff u < pi(1)."""
  assert _walk([.1, .3, .6], [.29, .5], "top_k").path.tolist() == [[0, 1]]
  # u = .31 >= .3 rejects child 1; r = norm([.1, 0, .6]): child 2 accepted
  # iff .5 * 1 * .7 < .6.
  assert _walk([.1, .3, .6], [.31, .5], "top_k").path.tolist() == [[0, 2]]


def _random_block(rng, b, width, v, peaked=3.0):
  ql = rng.normal(size=(b, width, v)) * peaked
  pl = ql + rng.normal(size=(b, width, v)) * peaked
  return jnp.asarray(ql, jnp.float32), jnp.asarray(pl, jnp.float32)


@pytest.mark.parametrize("target", [
    decoding.SpecDecode(), decoding.TokenV3(alpha=0.4),
    decoding.Lossy(alpha=0.3, tuned=True), decoding.Chow(alpha=0.4)])
@pytest.mark.parametrize("kind", ["iid", "without_replacement"])
def test_chain_shaped_tree_equals_the_chain_kernel_bit_for_bit(target, kind):
  rng = np.random.default_rng(0)
  b, gamma, v = 64, 4, 11
  ql, pl = _random_block(rng, b, gamma + 1, v)
  strategy = decoding.TopP(0.9, temperature=0.7)
  q, p = jax.nn.softmax(ql), jax.nn.softmax(pl)
  sq, sp = strategy.probs(ql), strategy.probs(pl)
  drafts = jax.vmap(jax.vmap(lambda k, d: jax.random.categorical(
      k, jnp.log(d))))(jax.random.split(jax.random.key(1), (b, gamma)),
                       sq[:, :gamma])
  u = jax.random.uniform(jax.random.key(2), (b, gamma))
  res, bonus = _keys(b, gamma + 1)
  chain = decoding.verify_block(target, drafts, q, p, sq, sp, u, res,
                                bonus[:, gamma])
  tokens = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), drafts], axis=1)
  tree = tree_lib.verify_tree(target, kind, tokens,
                              _arrays(decoding.Topology.chain(gamma), b),
                              q, p, sq, sp, u, res, lambda n: _at(bonus, n))
  assert 0 < float(chain.accepted.mean()) < gamma
  np.testing.assert_array_equal(tree.accepted, chain.accepted)
  np.testing.assert_array_equal(tree.token, chain.token)
  np.testing.assert_array_equal(tree.path[:, 1:] - 1,
                                np.where(np.arange(gamma)[None] <
                                         np.asarray(chain.accepted)[:, None],
                                         np.arange(gamma)[None],
                                         np.arange(1, gamma + 1)[None] - 1))


def test_tree_arrays_of_a_kary_tree():
  arr = tree_lib.tree_arrays(decoding.Topology.kary(2, 2), 1)
  assert arr["tree.parents"].tolist() == [[-1, -1, 0, 0, 1, 1]]
  assert arr["tree.depth"].tolist() == [[0, 1, 1, 2, 2, 2, 2]]
  assert arr["tree.rank"].tolist() == [[0, 1, 0, 1, 0, 1]]
  assert arr["tree.slot"].tolist() == [[0, 1, 0, 1, 2, 3]]
  assert arr["tree.children"][0].tolist() == [[0, 1], [2, 3], [4, 5],
                                              [-1, -1], [-1, -1], [-1, -1],
                                              [-1, -1]]
  assert arr["tree.first"].tolist() == [[0, 1, 3, 7]]
  # block position 4 = node 3, child of node 0 (block position 1)
  assert arr["tree.mask"][0, 4].tolist() == [True, True, False, False, True,
                                             False, False]


def _random_tree(rng, n, d, c):
  """A random breadth-first tree with n nodes, depth d, <= c children."""
  for _ in range(1000):
    sizes = [1]
    for _ in range(d - 1):
      sizes.append(int(rng.integers(1, c * sizes[-1] + 1)))
    sizes.append(n - sum(sizes[1:]))
    if not 1 <= sizes[-1] <= c * sizes[-2]:
      continue
    widths = []
    for parents, kids in zip(sizes[:-1], sizes[1:]):
      counts = [0] * parents
      for _ in range(kids):
        free = [j for j in range(parents) if counts[j] < c]
        counts[free[rng.integers(len(free))]] += 1
      widths.append(counts)
    return decoding.Topology.from_widths(widths)
  raise AssertionError("no tree found")


@pytest.mark.parametrize("n,d,c", [(6, 2, 2), (14, 3, 2), (5, 5, 1),
                                   (16, 4, 8), (31, 6, 4)])
def test_static_bounds_cover_every_tree_of_that_shape(n, d, c):
  """call_widths / level_bounds bound every breadth-first tree with n nodes,
  depth d and at most c children (random such trees)."""
  rng = np.random.default_rng(n * 100 + d)
  widths = tree_lib.call_widths(n, d, c)
  bounds = tree_lib.level_bounds(n, d, c)
  for _ in range(200):
    t = _random_tree(rng, n, d, c)
    assert t.num_nodes == n and t.max_depth == d and t.max_children <= c
    dep = np.asarray(t.depths)
    for k in range(1, d + 1):
      assert (dep <= k).sum() <= widths[k]
      assert (dep == k).sum() <= bounds[k]
  assert widths[-1] == n and bounds[0] == 1


def test_exact_widths_of_an_irregular_tree():
  """A tree's own level sizes replace the (N, D, C) bounds: the Sequoia-like
  (16, 6, 2) tree below feeds a level-fed drafter 17 tokens per block
  (catch-up calls 0..5: 2 + 2 + 3 + 4 + 5 + 1) where the bounds feed 38."""
  t = decoding.Topology(parents=(-1, -1, 0, 0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8,
                                 9, 14))
  assert tree_lib.level_sizes(t) == (1, 2, 3, 4, 5, 1, 1)
  assert tree_lib.tree_feed_widths(t, True) == (1, 2, 3, 4, 5, 1, 1)
  assert tree_lib.tree_feed_widths(t, False) == (1, 3, 6, 10, 15, 16, 17)
  assert tree_lib.feed_widths(16, 6, 2, True) == (1, 2, 4, 8, 11, 11, 11)
  w = decoding.Topology.from_widths([[3], [2, 1, 0], [1, 0, 1]])
  assert tree_lib.level_sizes(w) == (1, 3, 3, 2)
  assert tree_lib.call_widths(8, 3, 3, tree_lib.level_sizes(w)) == (
      0, 3, 6, 8)
  # k-ary trees: the bounds were already exact.
  k = decoding.Topology.kary(2, 3)
  assert tree_lib.tree_feed_widths(k, True) == tree_lib.feed_widths(
      14, 3, 2, True) == (1, 2, 4, 8)


@pytest.mark.parametrize("kind", tree_lib.PROPOSALS)
@pytest.mark.parametrize("topology", [decoding.Topology.kary(2, 3),
                                      decoding.Topology.kary(3, 2)])
def test_greedy_tree_verification_is_the_kernel_at_temperature_zero(
    kind, topology):
  """verify_tree_greedy == verify_tree for a greedy drafter's children."""
  b, v = 96, 13
  n = topology.num_nodes
  tree = {k: jnp.asarray(x) for k, x in tree_lib.tree_arrays(topology,
                                                              b).items()}
  q_logits = jax.random.normal(jax.random.key(1), (b, n + 1, v)) * 2
  p_logits = q_logits + jax.random.normal(jax.random.key(2), (b, n + 1, v))
  # A greedy drafter's children: rank i is the i-th most likely unscaled-q
  # token (top_k and, once S(q) is exhausted, without_replacement) or the
  # argmax again (iid).
  order = jnp.argsort(-q_logits, axis=-1)  # [B, W, V]
  nodes = np.zeros((b, n), np.int32)
  for j, kids in enumerate(topology.children):
    for i, kid in enumerate(kids):
      nodes[:, kid] = order[:, j, 0 if kind == "iid" else i]
  tokens = jnp.concatenate([jnp.full((b, 1), 3, jnp.int32),
                            jnp.asarray(nodes)], axis=1)
  cold = sampling.canonical(sampling.Temperature(0.0))
  sq, sp = cold.probs(q_logits), cold.probs(p_logits)
  key = jax.random.key(4)
  u = jax.random.uniform(key, (b, n))
  keys = jax.random.split(key, b)
  full = tree_lib.verify_tree(SpecDecode(), kind, tokens, tree,
                              sampling.unscaled(q_logits),
                              sampling.unscaled(p_logits), sq, sp, u, keys,
                              lambda depth: keys)
  fast = greedy.verify_tree_greedy(tokens, tree, p_logits)
  accepted = np.asarray(full.accepted)
  assert accepted.min() < accepted.max() and accepted.max() >= 2  # varied
  for name in ("accepted", "path", "token", "rejected", "defer", "accept"):
    np.testing.assert_array_equal(getattr(fast, name), getattr(full, name),
                                  err_msg=name)
