"""The hierarchy planner prices the loop's overheads when its costs are a
CostModel holding them ('hierarchy' + sum(buffers) x 'hierarchy_buffer'
per target round, as CostModel.stack_decode), and nothing else changes
for bare cost functions or a CostModel without them."""

import dataclasses

import numpy as np
import pytest

from specdec_jax.decoding.hierarchy import latency
from specdec_jax.decoding.hierarchy import planner
from specdec_jax.decoding.planners import costs as costs_lib

ALPHA = np.array([[1.0, 0.8, 0.6], [0.8, 1.0, 0.85], [0.6, 0.85, 1.0]])
WIDTHS = tuple(range(1, 18))
# small 0.05 ms, medium 0.2 ms, target 1 ms per call, +2% per extra token.
SECONDS = tuple(tuple(c * (1 + 0.02 * (w - 1)) for w in WIDTHS)
                for c in (5e-5, 2e-4, 1e-3))


def _model(**overheads):
  return costs_lib.CostModel(WIDTHS, SECONDS, 1, tuple(overheads.items()))


def test_loop_seconds_by_hand_and_per_token():
  m = _model(hierarchy=3e-4, hierarchy_buffer=2e-5)
  assert planner.loop_seconds(m, (2, 4)) == pytest.approx(3e-4 + 6 * 2e-5)
  assert planner.loop_seconds(m.call, (2, 4)) == 0.0  # a bare function
  lat = latency.evaluate((0, 1), (2, 4), lambda i, j: ALPHA[i, j], m, 2)
  c = planner.Candidate((0, 1), (2, 4), lat, planner.loop_seconds(m, (2, 4)))
  assert c.per_token == pytest.approx(
      lat.per_token + 4.2e-4 / lat.tokens_per_target_call)
  # The same per-round price as CostModel.stack_decode's.
  per_round = c.per_token * lat.tokens_per_target_call
  assert per_round == pytest.approx(
      lat.per_token * lat.tokens_per_target_call + m.overhead("hierarchy")
      + 6 * m.overhead("hierarchy_buffer"))


def test_overheads_change_the_plan_and_target_only():
  bare = planner.plan(ALPHA, _model(), max_buffer=8, method="brute")
  same = planner.plan(ALPHA, _model().call, max_buffer=8, method="brute")
  assert (bare.best.chain, bare.best.buffers) == (same.best.chain,
                                                  same.best.buffers)
  assert bare.best.per_token == same.best.per_token
  assert bare.target_only == same.target_only == pytest.approx(1e-3)
  # A large cost per buffered token: the planner buffers less.
  heavy = planner.plan(ALPHA, _model(hierarchy_buffer=2e-4), max_buffer=8,
                       method="brute")
  assert sum(heavy.best.buffers) < sum(bare.best.buffers)
  # Every candidate is ranked by its priced seconds per token, loop in.
  per = [c.per_token for c in heavy.top]
  assert per == sorted(per)
  # A fixed cost per round: fewer, longer rounds (more tokens per round).
  per_round = planner.plan(ALPHA, _model(hierarchy=2e-3), max_buffer=8,
                           method="brute")
  assert (per_round.best.latency.tokens_per_target_call
          > bare.best.latency.tokens_per_target_call)
  # target-only pays its own loop overhead when the model holds it.
  ar = planner.plan(ALPHA, _model(autoregressive=1e-4), max_buffer=4)
  assert ar.target_only == pytest.approx(1.1e-3)
  # dp and brute agree with the loop priced.
  dp = planner.plan(ALPHA, _model(hierarchy_buffer=2e-4), max_buffer=8,
                    method="dp")
  assert (dp.best.chain, dp.best.buffers) == (heavy.best.chain,
                                              heavy.best.buffers)


def test_selected_costs_keep_their_overheads():
  m = dataclasses.replace(_model(hierarchy_buffer=1e-4))
  sub = m.select((0, 2))
  assert planner.loop_seconds(sub, (3,)) == pytest.approx(3e-4)
