"""planners.costs: one cost model for chains, trees and hierarchies."""

import dataclasses

import jax
import pytest

from specdec_jax import models
from specdec_jax.decoding.planners import costs as costs_lib


def _model():
  return costs_lib.CostModel(
      widths=(1, 4, 8), seconds=((1e-4, 2e-4, 4e-4), (1e-3, 1.2e-3, 2e-3)),
      iteration_s=(("chain", 5e-5),))


def test_worked_example_chain_price_and_best_gamma():
  cm = _model()
  assert costs_lib.chain_tokens(0.8, 3) == pytest.approx(2.952)
  assert cm.chain(0.8, 3) == pytest.approx(1.55e-3 / 2.952)
  assert cm.target_only() / cm.chain(0.8, 3) == pytest.approx(1.90, abs=0.01)
  g, secs = cm.best_gamma(0.8, range(1, 8))
  assert g is not None and secs == min(cm.chain(0.8, k) for k in range(1, 8))
  assert cm.best_gamma(0.0) == (None, cm.target_only())  # never slower


def test_views_for_the_planners():
  cm = _model()
  tree = cm.tree_costs()
  assert tree.verifier(4) == cm.call(-1, 4) and tree.drafter(8) == 4e-4
  assert tree.overhead == 0.0
  calls = cm.call_costs()
  assert calls(1, 6) == cm.call(1, 6) == pytest.approx(1.6e-3)


@pytest.mark.parametrize("kw,match", [
    (dict(widths=(2, 4), seconds=((1.0, 1.0),)), "start at 1"),
    (dict(widths=(1, 4), seconds=((1.0,),)), "one entry per width"),
    (dict(widths=(1,), seconds=((1.0,),), iteration_s=(("x", 1.0),)),
     "unknown structure 'x'"),
])
def test_rejects_bad_models(kw, match):
  with pytest.raises(ValueError, match=match):
    costs_lib.CostModel(**kw)


def test_measure_on_a_tiny_model():
  m = models.get_model("gemma_tiny")
  p = m.init_params(jax.random.PRNGKey(0))
  cm = costs_lib.measure([(m, p), (m, p)], batch=1, widths=(2,), repeats=1,
                         iteration_s={"chain": 1e-5})
  assert cm.widths == (1, 2) and len(cm.seconds) == 2
  assert all(0 < s < 1 for row in cm.seconds for s in row)
  assert cm.overhead("chain") == 1e-5


def test_plan_tree_takes_the_cost_model():
  from specdec_jax.decoding import planners  # pylint: disable=g-import-not-at-top
  cm = _model()
  acc = (0.7, 0.2, 0.1)
  a = planners.plan_tree(acc, cm, max_nodes=6, max_depth=3)
  b = planners.plan_tree(acc, cm.tree_costs(), max_nodes=6, max_depth=3)
  assert a == b


def test_chain_decode_pays_the_fixed_part_once_per_call():
  # Worked numbers: call_s = 5 ms, 16 tokens; the chain of the module
  # docstring (1.55 ms per iteration, 2.952 tokens per iteration).
  cm = costs_lib.CostModel((1, 4, 8), _model().seconds, 1,
                           (("chain", 5e-5), ("autoregressive", 1e-4)),
                           5e-3)
  assert cm.chain_decode(0.8, 3, 16) == pytest.approx(
      5e-3 + 16 / 2.952 * 1.55e-3)
  assert cm.target_only_decode(16) == pytest.approx(5e-3 + 16 * 1.1e-3)


class _FakeMeasurer:
  """A machine with known costs: fixed 4 ms per call, target-only steps of
  1.1 ms, 16 tokens per row, 2 calls per pass (4 rows, batch 2)."""

  new = 16

  def __init__(self):
    self.stats = {}

  def split_target(self, batch):
    del batch
    return 4e-3, 1.1e-3

  def chunks(self, batch):
    return 4 // batch


def test_fit_chains_recovers_alpha_overhead_and_prices_every_gamma():
  from specdec_jax.decoding.planners import tune_measure  # pylint: disable=g-import-not-at-top
  from specdec_jax.decoding.planners.auto import Candidate, Measured  # pylint: disable=g-import-not-at-top
  from specdec_jax.decoding.strategy import Chain  # pylint: disable=g-import-not-at-top
  calls = costs_lib.CostModel((1, 4, 8), _model().seconds, 2)
  alpha, g0, h, fixed, batch = 0.7, 3, 2e-4, 4e-3, 2
  world = dataclasses.replace(calls, iteration_s=(("chain", h),),
                              call_s=fixed)
  iters = 16 / costs_lib.chain_tokens(alpha, g0)  # per call
  anchor_c = Candidate("spec_decode", Chain(g0), (0, 1))
  m = _FakeMeasurer()
  m.stats[(anchor_c, batch)] = dict(tokens=4 * 16, iterations=iters * 2)
  anchor_s = world.chain_decode(alpha, g0, 16)
  anchor = Measured(anchor_c, batch * 16 / anchor_s,
                    (4e-3 + 16 * 1.1e-3) / anchor_s)  # ratio to target-only
  fit, a = tune_measure.fit_chains(m, anchor, batch, (1, 5), calls=calls)
  assert a == pytest.approx(alpha, abs=1e-9)
  assert fit.overhead("chain") == pytest.approx(h)
  assert fit.call_s == fixed
  assert fit.overhead("autoregressive") == pytest.approx(1.1e-3 - 1e-3)
  for g in (1, 2, 5, 7):  # far from the anchor too: the fixed part is
    assert fit.chain_decode(a, g, 16) == pytest.approx(  # not amortised
        world.chain_decode(alpha, g, 16))  # over the anchor's iterations
