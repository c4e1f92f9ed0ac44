"""Tree speculative decoding end to end: greedy identity with the target,
chain-shaped trees equal the chain loop, one program per tree shape."""

import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding import request as request_lib
from specdec_jax.decoding.loops import program as program_lib
from specdec_jax.decoding.loops import tree as tree_loop
from tests.decoding import fakes
from tests.decoding.pairs import random_prompts, tiny_pair

Topology = decoding.Topology
SHAPES = {
    "kary": (Topology.kary(2, 2), "without_replacement"),
    "eagle": (Topology.from_paths([[0], [1], [2], [0, 0], [0, 1], [1, 0],
                                   [0, 0, 0]]), "top_k"),
    "wide": (Topology.from_widths([[4], [1, 1, 0, 0]]), "iid"),
}


def _requests(family, n=10, seed=0):
  drafter, verifier, qp, pp = tiny_pair(family)
  rng = np.random.default_rng(seed)
  vocab = verifier.vocab_size
  if family == "t5":
    kw = dict(inputs=random_prompts(rng, n, vocab, 3, 12))
  else:
    kw = dict(prompts=random_prompts(rng, n, vocab))
  budgets = rng.integers(1, 20, size=n).tolist()
  return (drafter, verifier, qp, pp), kw, budgets


@pytest.mark.parametrize("family", ["gemma", "t5"])
def test_greedy_tree_spec_decode_equals_target_only(family):
  (d, v, qp, pp), kw, budgets = _requests(family)
  ref = decoding.generate(decoding.TargetOnly(), d, v, qp, pp,
                          max_new_tokens=budgets, **kw)
  effs = {}
  for name, (topo, kind) in SHAPES.items():
    out = decoding.generate(decoding.make_method("spec_decode"), d, v, qp,
                            pp, max_new_tokens=budgets,
                            tree=decoding.Tree(topo, kind), **kw)
    assert out.sequences() == ref.sequences(), name
    assert (out.verifier_calls <= ref.verifier_calls).all()
    assert (out.drafted == topo.num_nodes * out.verifier_calls).all()
    effs[name] = out.block_efficiency
    assert 0.0 < out.acceptance_rate < 1.0
  assert min(effs.values()) > 1.0, effs


def test_greedy_cascade_on_a_tree_equals_the_chain_cascade_at_extremes():
  """TokenV3 with alpha 0 is the target and with alpha 1 the drafter, on a
  branching tree too (greedy)."""
  (d, v, qp, pp), kw, _ = _requests("gemma", 6, seed=1)
  tree = decoding.Tree(Topology.kary(2, 2))
  run = lambda m, **t: decoding.generate(m, d, v, qp, pp, max_new_tokens=10,
                                         **t, **kw).sequences()
  assert run(decoding.make_method("token_v3", alpha=0.0),
             tree=tree) == run(decoding.TargetOnly())
  assert run(decoding.make_method("token_v3", alpha=1.0),
             tree=tree) == run(decoding.DrafterOnly())
  assert run(decoding.make_method("lossy_greedy", alpha=0.0), tree=decoding.Tree(
      Topology.kary(2, 2), "top_k")) == run(decoding.TargetOnly())


@pytest.mark.parametrize("name,knobs", [
    ("spec_decode", {}), ("token_v3", dict(alpha=0.3)),
    ("lossy", dict(alpha=0.3, beta=1.0)), ("opt", dict(alpha=0.0))])
def test_chain_shaped_tree_gives_the_chain_loops_tokens(name, knobs,
                                                      monkeypatch):
  """Sampled rows at several temperatures and a greedy row: the TREE loop
  gives the same tokens and acceptance counts as the chain loop (both
  proposal kinds that sample draw rank 0 from S(q) with the chain's keys),
  which is why ``generate`` runs such trees with the chain loop."""
  monkeypatch.setattr(tree_loop, "runs_as_chain", lambda cfg: False)
  d, v, qp, pp = tiny_pair("gemma", 0.5)
  prompts = random_prompts(np.random.default_rng(0), 6, v.vocab_size)
  method = decoding.make_method(name, **knobs)
  sampling = decoding.TopP(0.9, temperature=[1.0, 0.5, 0.0, 1.0, 0.7, 1.0])
  kw = dict(max_new_tokens=16, sampling=sampling, seeds=3)
  ref = decoding.generate(method, d, v, qp, pp, prompts, gamma=3, **kw)
  out = decoding.generate(method, d, v, qp, pp, prompts, **kw,
                          tree=decoding.Tree(Topology.chain(3)))
  assert out.sequences() == ref.sequences()
  np.testing.assert_array_equal(out.accepted, ref.accepted)
  np.testing.assert_array_equal(out.verifier_calls, ref.verifier_calls)
  # Both accepts and rejections happened (OPT at alpha 0 accepts ~0.92).
  assert 0.2 < ref.acceptance_rate < 1.0


def _program(method, tree, models, cfg):
  """The program the one structure dispatch builds for ``tree``."""
  return request_lib.build_program(decoding.Strategy(method, tree), models,
                                   cfg)


def test_chain_shaped_trees_run_on_the_chain_loop():
  """A one-branch tree with a sampled proposal is decoded by the chain loop
  (same results, cheaper drafting); a 'top_k' chain drafts argmaxes, which
  the chain loop does not, so it stays on the tree loop."""
  d, v, _, _ = tiny_pair("gemma")
  method = decoding.make_method("spec_decode")
  trees = {kind: decoding.Tree(Topology.chain(3), kind)
           for kind in ("iid", "without_replacement", "top_k")}
  cfgs = {kind: tree_loop.make_config(tree, method, v.vocab_size, max_new=8,
                                      eos_id=None)
          for kind, tree in trees.items()}
  keys = {kind: _program(method, trees[kind], (d, v), cfg).key[0]
          for kind, cfg in cfgs.items()}
  assert keys == {"iid": "speculative", "without_replacement": "speculative",
                  "top_k": "tree"}
  kary = decoding.Tree(Topology.kary(2, 2))
  branching = tree_loop.make_config(kary, method, v.vocab_size, max_new=8,
                                    eos_id=None)
  assert _program(method, kary, (d, v), branching).key[0] == "tree"
  assert tree_loop.as_chain(cfgs["iid"]).gamma == 3


def test_same_shaped_trees_share_one_program():
  """Two different trees with (N, D, C) = (4, 2, 2) compile once; knobs and
  the tree itself travel as data."""
  d, v, qp, pp = tiny_pair("gemma")
  prompts = random_prompts(np.random.default_rng(2), 3, v.vocab_size)
  outs = []
  for widths in ([[2], [2, 0]], [[2], [1, 1]]):
    tree = decoding.Tree(Topology.from_widths(widths))
    outs.append(decoding.generate(decoding.make_method("token_v3", alpha=0.2),
                                  d, v, qp, pp, prompts, max_new_tokens=8,
                                  sampling=decoding.Temperature(0.8),
                                  tree=tree))
  method = decoding.make_method("token_v3")
  tree = decoding.Tree(Topology.from_widths([[2], [1, 1]]))
  cfg = tree_loop.make_config(tree, method, v.vocab_size, max_new=8,
      eos_id=v.eos_id,
      sampling=inputs_lib.sampling_static(decoding.Temperature(0.8)))
  key = _program(method, tree, (d, v), cfg).key
  assert program_lib.compile_count(key) == 1
  assert outs[0].sequences() != outs[1].sequences()


def test_trees_with_other_level_sizes_compile_their_own_widths():
  """The drafter's level calls compile at the tree's exact level sizes:
  two (N, D, C) = (5, 3, 2) trees with levels (1, 2, 2, 1) and (1, 2, 1, 2)
  get different program keys (same-sized levels share one, above)."""
  _, v, _, _ = tiny_pair("gemma")
  method = decoding.make_method("spec_decode")
  cfgs = [tree_loop.make_config(decoding.Tree(Topology.from_widths(w)),
                                method, v.vocab_size, max_new=8, eos_id=None)
          for w in ([[2], [2, 0], [1, 0]], [[2], [1, 0], [2]])]
  assert [c.shape for c in cfgs] == [(5, 3, 2)] * 2
  assert [c.levels for c in cfgs] == [(1, 2, 2, 1), (1, 2, 1, 2)]
  assert cfgs[0] != cfgs[1]


def test_a_request_gives_the_same_tokens_in_any_batch():
  d, v, qp, pp = tiny_pair("gemma", 0.5)
  prompts = random_prompts(np.random.default_rng(4), 5, v.vocab_size)
  kw = dict(max_new_tokens=12, sampling=decoding.Temperature(1.0), seeds=9,
            tree=decoding.Tree(Topology.kary(2, 2)))
  method = decoding.make_method("chow", alpha=0.4)
  full = decoding.generate(method, d, v, qp, pp, prompts, **kw).sequences()
  alone = decoding.generate(method, d, v, qp, pp, prompts[3:4], **kw)
  mixed = decoding.generate(method, d, v, qp, pp, prompts[::-1], **kw)
  assert alone.sequences()[0] == full[3]
  assert mixed.sequences() == full[::-1]


def test_commit_and_catchup_drafter_sync_agree():
  """SpecDecode defaults to catching the drafter up; committing its last
  call gives the same tokens (greedy and sampled rows)."""
  d, v, qp, pp = tiny_pair("gemma", 0.5)
  prompts = random_prompts(np.random.default_rng(5), 4, v.vocab_size)
  outs = []
  for sync in ("catchup", "commit"):
    outs.append(decoding.generate(
        decoding.make_method("spec_decode"), d, v, qp, pp, prompts,
        max_new_tokens=14, seeds=1,
        sampling=decoding.Temperature([0.0, 1.0, 0.6, 1.0]),
        tree=decoding.Tree(Topology.kary(2, 2), drafter_sync=sync)))
  assert outs[0].sequences() == outs[1].sequences()
  # catchup: D calls (+1 when a depth-D node was accepted); commit: D + 1.
  assert (outs[0].drafter_calls <= outs[1].drafter_calls).all()


def test_hand_computed_tree_on_fake_models():
  """Drafter: next = prev + 1; verifier: the same except prev + 2 at
  absolute position 5. kary(2, 2) with top-k children: rank 0 is the +1
  token, rank 1 token 0 (the lowest other id, all tie at logit 0).

  Prompt [2, 3] (pending 3 at position 1): the verifier wants 4, 5, 6, 7,
  then at position 5 it wants prev + 2. Block 1 (root 3): path 4 -> 5, bonus
  6 (pi at node 5 = +1): 3 tokens. Block 2 (root 6 at position 4): child 7
  (+1) accepted; at position 5 the verifier wants 7 + 2 = 9, the children of
  7 are 8 and 0: both rejected, residual 9. Tokens 4 5 6 7 9, then +1."""
  drafter = fakes.plus_one()
  verifier = fakes.plus_one_except([5])
  out = decoding.generate(decoding.make_method("spec_decode"), drafter,
                          verifier, {}, {}, [[2, 3]], max_new_tokens=8,
                          eos_id=None, tree=decoding.Tree(
                              Topology.kary(2, 2), "top_k"),
                          return_trace=True)
  assert out.sequences() == [[4, 5, 6, 7, 9, 10, 11, 12]]
  assert out.trace["accepted"][0, :3].tolist() == [2, 1, 2]
  assert out.trace["token"][0, :2].tolist() == [6, 9]
  assert out.trace["drafts"][0, 0].tolist() == [4, 0, 5, 0, 1, 0]
