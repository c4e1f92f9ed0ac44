"""The CostModel's tree and hierarchy terms (costs.py, tree_shape.py,
hierarchy/latency.py) and their one-anchor fits (structure_fit.py)."""

import dataclasses

import numpy as np
import pytest

from specdec_jax.decoding.hierarchy import latency
from specdec_jax.decoding.planners import costs as costs_lib
from specdec_jax.decoding.planners import structure_fit
from specdec_jax.decoding.planners import tree_shape
from specdec_jax.decoding.planners.auto import Candidate
from specdec_jax.decoding.strategy import Stack
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree

WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 13, 15)


def _calls(levels: int = 2) -> costs_lib.CostModel:
  """Call costs linear in the width: model i costs (i + 1) x (0.1 ms +
  w x 0.05 ms) -- the target the most; fixed parts 4 ms / 5 ms."""
  rows = tuple(tuple((i + 1) * (1e-4 + w * 5e-5) for w in WIDTHS)
               for i in range(levels))
  return costs_lib.CostModel(WIDTHS, rows, 2, (), 4e-3, 5e-3)


def test_iterations_generalises_the_chain_recursion():
  assert costs_lib.iterations((0.5, 0.5), 3) == pytest.approx(2.25)
  for a, g in ((0.7, 3), (0.2, 1), (1.0, 4)):
    probs = [a ** (k - 1) * (1 - a) for k in range(1, g + 1)] + [a ** g]
    assert costs_lib.iterations(probs, 16) == pytest.approx(
        costs_lib.chain_iterations(a, g, 16))
  assert costs_lib.iterations((0.0, 0.0, 1.0), 16) == 6  # ceil(16 / 3)
  with pytest.raises(ValueError, match="summing to 1"):
    costs_lib.iterations((0.5, 0.4), 4)


def test_tokens_dist_by_hand():
  # 2-ary depth 2, a = (0.6, 0.3): a node has an accepted child with
  # P_0 + P_1 = 0.6 + 0.4 x 0.3 = 0.72; depth >= 1 w.p. 0.72, >= 2 w.p.
  # 0.72^2.
  dist = tree_shape.tokens_dist(Topology.kary(2, 2), (0.6, 0.3))
  assert dist == pytest.approx((0.28, 0.72 - 0.5184, 0.5184))
  # Irregular: root -> {A (rank 0), B (rank 1)}, A -> C. Depth 2 only
  # through A then C: 0.6 x 0.6; depth >= 1: 0.72.
  topo = Topology((-1, -1, 0))
  dist = tree_shape.tokens_dist(topo, (0.6, 0.3))
  assert dist == pytest.approx((0.28, 0.72 - 0.36, 0.36))
  assert sum(k * p for k, p in enumerate(dist, 1)) == pytest.approx(
      1 + tree_shape.expected_accepted(topo, (0.6, 0.3)))


def test_tree_decode_is_fixed_plus_blocks_times_the_planners_block():
  topo, acc = Topology.kary(2, 2), (0.6, 0.3)
  cm = dataclasses.replace(_calls(), iteration_s=(("tree", 2e-4),))
  block = tree_shape.block_seconds(topo, cm.tree_costs(), "catchup")
  # catch-up: drafter call 0 on 2 tokens (catch-up slot + root), call 1 on
  # level 1 (2 tokens); the target on 7; the overhead.
  assert block == pytest.approx(2 * cm.call(0, 2) + cm.call(-1, 7) + 2e-4)
  blocks = costs_lib.iterations(tree_shape.tokens_dist(topo, acc), 16)
  assert cm.tree_decode(topo, acc, 16) == pytest.approx(5e-3 + blocks * block)


def test_stack_decode_prices_rounds_of_the_latency_model():
  cm = dataclasses.replace(_calls(3), iteration_s=(("hierarchy", 3e-4),),
                           structure_call_s=(("hierarchy", 7e-3),))
  alpha = np.array([[1, .8, .6], [.8, 1, .7], [.6, .7, 1]])
  lat = cm.stack((2, 4), alpha)
  want = latency.evaluate((0, 1), (2, 4), lambda i, j: alpha[i, j], cm.call,
                          2)
  assert lat == want
  assert sum(lat.target_yield) == pytest.approx(1.0)
  assert sum(k * p for k, p in enumerate(lat.target_yield, 1)) == (
      pytest.approx(lat.tokens_per_target_call))
  rounds = costs_lib.iterations(lat.target_yield, 16)
  assert cm.stack_decode((2, 4), alpha, 16) == pytest.approx(
      7e-3 + rounds * (lat.per_token * lat.tokens_per_target_call + 3e-4))
  assert cm.fixed("hierarchy") == 7e-3 and cm.fixed("tree") == 5e-3
  assert cm.fixed("autoregressive") == 4e-3


def test_needed_widths_are_the_calls_the_planners_price():
  topo = Topology.kary(2, 3)  # 14 nodes; level bounds 1, 2, 4, 8
  need = structure_fit.needed_widths([Tree(topo), Stack((2, 4))], 3)
  # tree: drafter calls 0..2 on 1 + 1, 2, 4 tokens, the target on 15;
  # stack: the middle level on T_0 + K + 2 = 6, the target on 2 + 4 + 1.
  assert need == {0: {1, 2, 4}, 1: {1, 6}, 2: {1, 15, 7}}


class _Machine:
  """A measurer whose decodes cost what ``world`` says, at ``truth``
  acceptance; 2 decode calls per pass, 16 tokens."""

  new, short_tokens, seed, repeats = 16, 1, 0, 3

  def __init__(self, world, truth):
    self.world, self.truth = world, truth

  def chunks(self, batch):
    return 2

  def runner(self, cand, batch, new_tokens=None):
    new = new_tokens or self.new
    s = cand.structure
    if isinstance(s, Tree):
      secs = self.world.tree_decode(s.topology, self.truth, new)
      its = costs_lib.iterations(
          tree_shape.tokens_dist(s.topology, self.truth), new)
    else:
      secs = self.world.stack_decode(s.buffers, self.truth, new)
      its = costs_lib.iterations(
          self.world.stack(s.buffers, self.truth).target_yield, new)
    return lambda seed: (2 * secs, None, 2 * its)


@pytest.mark.parametrize("per_node,per_level,shapes", [
    (0.0, 0.0, [(2, 2)]), (3e-5, 0.0, [(2, 2), (2, 3)]),
    (3e-5, 1e-4, [(2, 2), (2, 3), (1, 4)])])
def test_fit_tree_recovers_scale_and_overheads_and_prices_other_trees(
    per_node, per_level, shapes):
  calibrated = (0.7, 0.3, 0.2)
  truth = structure_fit.scaled(calibrated, 0.8)  # a decode accepts less
  world = dataclasses.replace(_calls(), iteration_s=(
      ("tree", 2e-4), ("tree_node", per_node), ("tree_depth", per_level)))
  anchors = [Candidate("spec_decode", Tree(Topology.kary(*k)), (0, 1))
             for k in shapes]
  fit, points = structure_fit.fit_tree(_Machine(world, truth), anchors, 2,
                                       _calls(), calibrated)
  assert [n for n, _ in points] == sorted(Topology.kary(*k).num_nodes
                                          for k in shapes)
  for _, acc in points:
    assert acc == pytest.approx(truth, abs=1e-6)
  assert fit.overhead("tree") == pytest.approx(2e-4, abs=1e-9)
  assert fit.overhead("tree_node") == pytest.approx(per_node, abs=1e-10)
  assert fit.overhead("tree_depth") == pytest.approx(per_level, abs=1e-10)
  for topo in (Topology.kary(2, 3), Topology.kary(3, 1), Topology.chain(4),
               Topology.chain(6), Topology.kary(3, 2)):
    acc = structure_fit.at_size(points, topo.num_nodes)
    assert fit.tree_decode(topo, acc, 16) == pytest.approx(
        world.tree_decode(topo, truth, 16), rel=1e-5)


@pytest.mark.parametrize("per_buffer,anchor_buffers", [
    (0.0, [(2, 4)]), (4e-5, [(1, 2), (3, 6)])])
def test_fit_stack_recovers_scale_overheads_and_fixed_part(
    per_buffer, anchor_buffers):
  calibrated = np.array([[1, .8, .6], [.8, 1, .7], [.6, .7, 1]])
  truth = structure_fit.scaled(calibrated, 0.9)
  world = dataclasses.replace(_calls(3), iteration_s=(
      ("hierarchy", 3e-4), ("hierarchy_buffer", per_buffer)),
                              structure_call_s=(("hierarchy", 7e-3),))
  anchors = [Candidate("spec_decode", Stack(b), (0, 1, 2))
             for b in anchor_buffers]
  fit, points = structure_fit.fit_stack(_Machine(world, truth), anchors, 2,
                                        _calls(3), calibrated)
  for _, alpha in points:
    assert alpha == pytest.approx(truth, abs=1e-6)
  assert fit.overhead("hierarchy") == pytest.approx(3e-4, abs=1e-9)
  assert fit.overhead("hierarchy_buffer") == pytest.approx(per_buffer,
                                                           abs=1e-10)
  assert fit.fixed("hierarchy") == pytest.approx(7e-3)
  for buffers in ((1, 2), (3, 6), (2, 2), (1, 4)):
    alpha = structure_fit.at_size(points, sum(buffers))
    assert fit.stack_decode(buffers, alpha, 16) == pytest.approx(
        world.stack_decode(buffers, truth, 16), rel=1e-5)


def test_at_size_interpolates_between_anchors_and_holds_past_them():
  pts = ((6, (0.8, 0.2)), (14, (0.6, 0.4)))
  assert structure_fit.at_size(pts, 10) == pytest.approx((0.7, 0.3))
  assert structure_fit.at_size(pts, 2) == (0.8, 0.2)
  assert structure_fit.at_size(pts, 20) == (0.6, 0.4)
  m = structure_fit.at_size(((3, np.eye(2)), (9, np.ones((2, 2)))), 6)
  assert m.tolist() == [[1.0, 0.5], [0.5, 1.0]]
  two = Candidate("spec_decode", Tree(Topology.kary(2, 2)), (0, 1))
  with pytest.raises(ValueError, match="different sizes, got sizes"):
    structure_fit.fit_tree(None, [two, two], 1, _calls(), (0.5,))
  # (nodes, depth) on one line: 1x3 (3, 3), 2x2 (6, 2), 9x1 (9, 1).
  flat = [Candidate("spec_decode", Tree(t), (0, 1)) for t in (
      Topology.chain(3), Topology.kary(2, 2), Topology.kary(9, 1))]
  timed = [dict(secs=1e-2, iters=4.0)] * 3
  with pytest.raises(ValueError, match="not on one line"):
    structure_fit.fit_tree(_Machine(_calls(), (0.5,)), flat, 1, _calls(),
                           (0.5,), timed=timed)


def test_rank0_is_kept_and_the_other_ranks_fit_the_anchor():
  calibrated = (0.5, 0.3, 0.2)
  truth = (0.75,) + structure_fit.scaled(calibrated[1:], 0.6)
  world = dataclasses.replace(_calls(), iteration_s=(("tree", 2e-4),))
  anchor = Candidate("spec_decode", Tree(Topology.kary(2, 2)), (0, 1))
  _, points = structure_fit.fit_tree(_Machine(world, truth), [anchor], 2,
                                     _calls(), calibrated, rank0=0.75)
  assert points[0][1] == pytest.approx(truth, abs=1e-6)


def test_solve_scale_ends_and_scaled_caps():
  blocks = lambda s: 10 - 5 * s
  assert structure_fit.solve_scale(blocks, 7.5, 2.0) == pytest.approx(0.5)
  assert structure_fit.solve_scale(blocks, 20, 2.0) == 0.0  # out of reach
  assert structure_fit.solve_scale(blocks, 1, 1.5) == 1.5
  assert structure_fit.scaled((0.5, 0.9), 1.5) == (0.75, 1.0)
  m = structure_fit.scaled(np.array([[1, .5], [.5, 1]]), 0.5)
  assert m.tolist() == [[1.0, 0.25], [0.25, 1.0]]


def test_a_chain_shaped_anchor_fits_overheads_not_the_other_ranks():
  calibrated = (0.5, 0.3, 0.2)
  truth = (0.75,) + structure_fit.scaled(calibrated[1:], 0.6)
  world = dataclasses.replace(_calls(), iteration_s=(
      ("tree", 2e-4), ("tree_node", 3e-5)))
  anchors = [Candidate("spec_decode", Tree(t), (0, 1))
             for t in (Topology.chain(4), Topology.kary(2, 2))]
  fit, points = structure_fit.fit_tree(_Machine(world, truth), anchors, 2,
                                       _calls(), calibrated, rank0=0.75)
  assert [n for n, _ in points] == [6]  # the 2x2 only
  assert points[0][1] == pytest.approx(truth, abs=1e-6)
  assert fit.overhead("tree_node") == pytest.approx(3e-5, abs=1e-10)
  _, alone = structure_fit.fit_tree(_Machine(world, truth), anchors[:1], 2,
                                    _calls(), calibrated, rank0=0.75)
  assert alone == ((1, (0.75, 0.3, 0.2)),)  # ranks 1.. as calibrated
