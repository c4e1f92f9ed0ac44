"""Sequoia's dynamic program against brute force; the hardware-aware plan."""

import itertools

import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding import planners
from specdec_jax.decoding.loops.tree_drafting import PrefixFed
from specdec_jax.decoding.planners import calibration, tree_shape
from tests.decoding.pairs import tiny_pair

Topology = decoding.Topology


def _forests(n, d, k, slots=None):
  """Every ordered forest of <= ``slots`` (default k) trees, <= n nodes in
  all, depth <= d, every node with <= k children."""
  slots = k if slots is None else slots
  if n == 0 or d == 0 or slots == 0:
    return [[]]
  out = [[]]
  for first in range(1, n + 1):  # nodes in the first tree
    for sub in _forests(first - 1, d - 1, k):
      if _size(sub) != first - 1:
        continue
      for rest in _forests(n - first, d, k, slots - 1):
        out.append([sub] + rest)
  return out


def _size(forest):
  return sum(1 + _size(t) for t in forest)


def _value(forest, probs):
  return sum(p * (1 + _value(t, probs)) for p, t in zip(probs, forest))


def test_worked_example_of_the_module_docstring():
  assert planners.rank_probs((0.6, 0.3)) == pytest.approx((0.6, 0.12))
  value, topo = planners.best_tree((0.6, 0.3), nodes=3, depth=2)
  assert value == pytest.approx(1.08)
  assert topo.parents == (-1, -1, 0)
  assert planners.best_tree((0.6, 0.3), 2, 2)[0] == pytest.approx(0.96)
  assert planners.best_tree((0.6, 0.3), 2, 1)[0] == pytest.approx(0.72)
  assert planners.expected_accepted(topo, (0.6, 0.3)) == pytest.approx(1.08)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_dp_equals_brute_force_on_small_budgets(k):
  rng = np.random.default_rng(k)
  for _ in range(4):
    acc = tuple(rng.uniform(0.05, 0.95, size=k))
    probs = planners.rank_probs(acc)
    for n, d in itertools.product(range(1, 7), range(1, 5)):
      brute = max(_value(f, probs) for f in _forests(n, d, k))
      value, topo = planners.best_tree(acc, n, d)
      assert value == pytest.approx(brute, abs=1e-12), (acc, n, d)
      assert topo.num_nodes <= n and topo.max_depth <= d
      assert topo.max_children <= k
      assert planners.expected_accepted(topo, acc) == pytest.approx(value)


def test_a_chain_is_optimal_with_one_rank():
  value, topo = planners.best_tree((0.8,), 5, 5)
  assert topo == Topology.chain(5)
  assert value == pytest.approx(sum(0.8**i for i in range(1, 6)))


def _costs(drafter, verifier, widths=tuple(range(1, 70)), overhead=0.0,
           level_fed=False):
  return calibration.Costs(tuple(widths), tuple(map(drafter, widths)),
                           tuple(map(verifier, widths)), overhead, level_fed)


def test_block_seconds_by_hand():
  topo = Topology.kary(2, 2)  # prefix-fed drafter calls feed 1, 3, 7 tokens
  costs = _costs(lambda w: w, lambda w: 10 * w, overhead=0.5)
  assert tree_shape.block_seconds(topo, costs) == 1 + 3 + 7 + 70 + 0.5
  # catchup: calls 0 and 1 only; call 0 feeds the catch-up slot and the
  # root (2 tokens) on every block, whatever was accepted.
  got = tree_shape.block_seconds(topo, costs, "catchup")
  assert got == pytest.approx(2 + 3 + 70 + 0.5)
  # A level-fed drafter: the root, then the 2 and 4 nodes of each level.
  level = _costs(lambda w: w, lambda w: 10 * w, overhead=0.5, level_fed=True)
  assert tree_shape.block_seconds(topo, level) == 1 + 2 + 4 + 70 + 0.5


def test_measured_costs_know_how_the_drafter_is_fed():
  d, v, qp, pp = tiny_pair("gemma")
  kw = dict(widths=(1, 2), iters=1, repeats=1)
  assert calibration.measure_costs(d, v, qp, pp, **kw).drafter_level_fed
  assert not calibration.measure_costs(PrefixFed(d), v, qp, pp,
                                       **kw).drafter_level_fed


def test_plan_without_costs_maximises_tokens_per_call():
  plan = planners.plan_tree((0.7, 0.3, 0.2), max_nodes=10, max_depth=4)
  value, topo = planners.best_tree((0.7, 0.3, 0.2), 10, 4)
  assert plan.topology == topo and plan.tokens_per_call == 1 + value


def test_plan_with_costs():
  acc = (0.7, 0.3, 0.2)
  # A memory-bound verifier (flat cost) and a free drafter: the biggest
  # tree wins.
  flat = planners.plan_tree(acc, _costs(lambda w: 0.0, lambda w: 1.0),
                            max_nodes=12, max_depth=5)
  assert flat.topology.num_nodes == 12
  assert flat.tokens_per_call == pytest.approx(
      1 + max(planners.best_tree(acc, 12, d)[0] for d in range(1, 6)))
  assert flat.predicted_speedup == pytest.approx(flat.tokens_per_call)
  # A compute-bound verifier (cost = block width): one node, chain of 1 at
  # a = 0.9 gives 1.9 tokens for 2 units, 0.95x; bigger trees are worse.
  linear = planners.plan_tree((0.9,), _costs(lambda w: 0.0, lambda w: w),
                              max_nodes=4, max_depth=4)
  assert linear.topology == Topology.chain(1)
  assert linear.predicted_speedup == pytest.approx(0.95)
  best = min(r["seconds_per_token"] for r in flat.candidates)
  assert flat.seconds_per_call / flat.tokens_per_call == pytest.approx(best)


def test_bad_inputs():
  with pytest.raises(ValueError, match="acceptance rates must be in"):
    planners.rank_probs((1.2,))
  with pytest.raises(ValueError, match="nodes and depth must be >= 1"):
    planners.best_tree((0.5,), 0, 3)
  with pytest.raises(ValueError, match="no tree helps"):
    planners.plan_tree((0.0, 0.0), max_nodes=3, max_depth=2)


def test_tree_gin_text():
  text = planners.tree_gin(Topology.kary(2, 1), "top_k", note="hello")
  assert "TREE_PARENTS = (-1, -1)\n" in text and "# hello" in text
  assert "TREE_PROPOSAL = 'top_k'" in text
  assert "TREE_PARENTS = (-1,)\n" in planners.tree_gin(Topology.chain(1))
