"""scripts/cost_model_check.py: the previous model's price and the counts
of its report (the timed run itself is a benchmark, not a test)."""

import pytest

from specdec_jax.decoding.planners import costs as costs_lib
from tests import load_script


def _load():
  return load_script("cost_model_check", "cost_model_check_under_test")


def test_before_folds_the_fixed_cost_into_the_anchors_iterations():
  mod = _load()
  calls = costs_lib.CostModel((1, 4, 8), ((1e-4,) * 3, (1e-3, 1.2e-3, 2e-3)))
  world = costs_lib.CostModel(calls.widths, calls.seconds, 1,
                              (("chain", 5e-5),), 4e-3)
  alpha, g0, g, new = 0.8, 3, 6, 16
  call0 = world.chain_decode(alpha, g0, new)  # the anchor's measured call
  # The previous model: what the anchor's time per iteration (iterations
  # = new / E[tokens per iteration]) leaves after its model calls is
  # charged per iteration at every g: (g q + t(g + 1) + rest) seconds per
  # chain_tokens(alpha, g) tokens.
  iters0 = new / costs_lib.chain_tokens(alpha, g0)
  rest = call0 / iters0 - g0 * 1e-4 - calls.call(-1, g0 + 1)
  per_token = (g * 1e-4 + calls.call(-1, g + 1) + rest) / (
      costs_lib.chain_tokens(alpha, g))
  assert mod._before(calls, alpha, g0, call0, g, new) == pytest.approx(
      new * per_token)
  assert mod._before(calls, alpha, g0, call0, g0, new) == pytest.approx(call0)
  assert mod._old_alpha(costs_lib.chain_tokens(0.7, 4), 4) == pytest.approx(
      0.7)


def test_within_skips_the_fitted_anchor():
  mod = _load()
  rows = [dict(fitted=True, p=2.0, measured_tps=1.0, ratio=1.0),
          dict(fitted=False, p=1.05, measured_tps=1.0, ratio=2.0),
          dict(fitted=False, p=1.2, measured_tps=1.0, ratio=1.2)]
  assert mod.within(rows, "p") == (1, 2)
  assert mod.within(rows, "p", "ratio") == (1, 2)


def test_noise_floor_compares_anchors_with_the_rest():
  mod = _load()
  row = lambda fitted, pred, where="calibration": dict(
      fitted=fitted, prompts=where, predicted_tps=pred, measured_tps=1.0)
  rows = [row(True, 1.2), row(True, 0.95), row(False, 1.04),
          row(False, 0.9), row(False, 1.5, "held-out")]
  assert mod.noise_floor(rows) == (
      "- noise floor: the anchors (fitted, so exact in the fit's own pass) "
      "re-measured in the measuring pass are off by more than 10% in 1/2, "
      "median 12.5%; the other calibration cells' median error is 7.0%")
  assert mod.noise_floor(rows[2:]) == ""


def test_structures_script_parses_trees_and_counts_without_anchors():
  mod = load_script("cost_model_structures", "cost_model_structures_under_test")
  from specdec_jax.decoding.verify.topology import Topology  # pylint: disable=g-import-not-at-top
  trees = mod.parse_trees("2x2,1x4,plan5", (0.6, 0.3))
  assert trees["2x2"] == Topology.kary(2, 2)
  assert trees["1x4"] == Topology.chain(4)
  # The Sequoia tree of 5 nodes for (0.6, 0.3) (tree_shape's DP).
  assert trees["plan5"].num_nodes == 5
  # At acceptance 1 the planned tree is a chain: listed once.
  assert list(mod.parse_trees("1x4,plan4", (1.0,))) == ["1x4"]
  rows = [dict(fitted=True, p=9.0, measured_tps=1.0),
          dict(fitted=False, p=1.08, measured_tps=1.0),
          dict(fitted=False, p=0.85, measured_tps=1.0)]
  assert mod.within(rows, "p") == (1, 2)


def test_drift_lines_name_each_cell_and_count_the_calm_ones():
  mod = _load()
  row = lambda drift, pred, kind="tree", fitted=False, b=1: dict(
      pair="p", batch=b, temperature=0.0, prompts="calibration", kind=kind,
      fitted=fitted, drift=drift, predicted_tps=pred, measured_tps=1.0)
  rows = [row(0.02, 1.5, fitted=True), row(0.02, 1.05), row(0.02, 1.3),
          row(0.02, 0.95, "stack"), row(-0.2, 1.0, b=8),
          row(-0.2, 1.0, "stack", b=8)]
  assert mod.drift_lines(rows) == [
      "- machine drift per cell (target-only tokens/s, measuring pass / fit "
      "pass - 1): p b1 T=0 calibration +2%, p b8 T=0 calibration -20%",
      "  - trees in the cells that drifted <= 5%: within 10% 1/2",
      "  - stacks in the cells that drifted <= 5%: within 10% 1/1"]
  assert mod.drift_lines([dict(r, drift=None) for r in rows]) == []
