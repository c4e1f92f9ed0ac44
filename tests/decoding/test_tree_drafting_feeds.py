"""Tree drafting feeds a ``masks_cached_slots`` drafter one level per call;
any other drafter gets the block prefix per call. Both give the same drafts,
verifications and tokens (greedy and sampled, T5 and Gemma 2 with a sliding
window, trees whose deep levels start before their first node)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding.loops import tree_drafting
from specdec_jax.decoding.loops.state import Request
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.verify import tree as tree_lib
from tests.decoding.pairs import random_prompts, tiny_pair

PrefixFed = tree_drafting.PrefixFed
Topology = decoding.Topology


# "wide_then_deep": 3 children, then a chain; levels 2 and 3 would run past
# the block end, so their fed blocks start early (re-writing shallow nodes).
TREES = {
    "kary": (Topology.kary(2, 2), "without_replacement"),
    "wide_then_deep": (Topology.from_paths([[0], [1], [2], [0, 0],
                                            [0, 0, 0]]), "iid"),
    "eagle": (Topology.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0],
                                   [0, 0, 0]]), "top_k"),
}


def test_the_wide_then_deep_tree_needs_early_starts():
  topo = TREES["wide_then_deep"][0]
  shape = (topo.num_nodes, topo.max_depth, topo.max_children)
  first = tree_lib.tree_arrays(topo, 1)["tree.first"][0]
  bounds = tree_lib.level_bounds(*shape)
  late = [k for k in range(1, shape[1] + 1)
          if first[k] + bounds[k] > shape[0] + 1]
  assert late == [2, 3]


def test_only_flagged_models_are_fed_level_by_level():
  d, _, _, _ = tiny_pair("gemma")
  assert tree_drafting.incremental_drafting(d)
  assert not tree_drafting.incremental_drafting(PrefixFed(d))


@pytest.mark.parametrize("family,sync", [("gemma", "catchup"),
                                         ("t5", "commit")])
def test_level_feeds_equal_prefix_feeds(family, sync):
  d, v, qp, pp = tiny_pair(family, 0.5)
  rng = np.random.default_rng(3)
  prompts = random_prompts(rng, 4, v.vocab_size, 1, 10)
  kw = dict(inputs=prompts) if family == "t5" else dict(prompts=prompts)
  temps = decoding.Temperature([0.0, 1.0, 0.7, 1.0])
  for name in ("kary", "wide_then_deep"):  # top_k: the direct test below
    topo, kind = TREES[name]
    outs = [decoding.generate(
        decoding.make_method("spec_decode"), drafter, v, qp, pp,
        max_new_tokens=12, seeds=7, sampling=temps, return_trace=True,
        tree=decoding.Tree(topo, kind, drafter_sync=sync), **kw)
            for drafter in (d, PrefixFed(d))]
    assert outs[0].sequences() == outs[1].sequences(), name
    for key in ("drafts", "accepted", "token"):
      np.testing.assert_array_equal(outs[0].trace[key], outs[1].trace[key],
                                    err_msg=f"{name} {key}")
    np.testing.assert_array_equal(outs[0].drafter_calls,
                                  outs[1].drafter_calls)


@pytest.mark.parametrize("family", ["gemma", "t5"])
def test_both_feeds_draft_the_same_logits_and_cache(family):
  """One draft phase, both feeds, at the bounds and at the exact level
  sizes: the same drafted tokens, logits and K/V at every block slot (up
  to float rounding: the blocks differ in shape)."""
  d, _, qp, _ = tiny_pair(family, 0.5)
  b = 3
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(2, d.vocab_size, size=(b, 6)), jnp.int32)
  enc = (d.encode(qp, prompt) if d.is_encoder_decoder else None)
  cache = d.init_cache(b, 48, enc)
  _, cache = d.step(qp, prompt[:, :5], cache)
  cache = cache.with_lengths(jnp.array([5, 3, 4], jnp.int32))  # ragged
  pending = prompt[:, 5]
  req = Request(seed=jnp.arange(b, dtype=jnp.uint32),
                request_id=jnp.arange(b, dtype=jnp.int32),
                max_new_tokens=jnp.full((b,), 8, jnp.int32))
  zeros = jnp.zeros((b,), jnp.int32)
  for name, (topo, kind) in TREES.items():
    shape = (topo.num_nodes, topo.max_depth, topo.max_children)
    tree = {k: jnp.asarray(x) for k, x in
            tree_lib.tree_arrays(topo, b).items()}
    temps = sampling.Temperature(jnp.array([0.0, 1.0, 0.7]))  # per row
    # Level- and prefix-fed, each at the (N, D, C) bounds and at the
    # tree's exact level sizes (what the tree loop compiles).
    lv, *others = [jax.jit(lambda c, m=m, lv=lv: tree_drafting.draft_tree(
        m, qp, c, pending, zeros, zeros, zeros.astype(bool), tree, temps,
        req, shape, kind, True, 0, lv))(cache)
                   for m in (d, PrefixFed(d))
                   for lv in (None, tree_lib.level_sizes(topo))]
    n = topo.num_nodes + 1
    for px in others:
      np.testing.assert_array_equal(lv.tokens, px.tokens, err_msg=name)
      np.testing.assert_allclose(lv.logits, px.logits, rtol=1e-5, atol=1e-5,
                                 err_msg=name)
      np.testing.assert_array_equal(lv.start, px.start)
      for a, c in zip(lv.cache.layers, px.cache.layers):
        for row, s in enumerate(np.asarray(lv.start)):
          np.testing.assert_allclose(a.k[row, s:s + n], c.k[row, s:s + n],
                                     rtol=1e-5, atol=1e-5, err_msg=name)
          np.testing.assert_allclose(a.v[row, s:s + n], c.v[row, s:s + n],
                                     rtol=1e-5, atol=1e-5, err_msg=name)
