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
  iters = costs_lib.chain_iterations(0.8, 3, 16)
  assert 16 / 2.952 < iters < 16 / 2.952 + 1  # the last one is cut at 16
  assert cm.chain_decode(0.8, 3, 16) == pytest.approx(5e-3 + iters * 1.55e-3)
  assert cm.target_only_decode(16) == pytest.approx(5e-3 + 16 * 1.1e-3)


def test_chain_iterations_by_hand():
  # Every draft accepted: ceil(16 / (gamma + 1)) iterations, not 16 / 5.
  assert costs_lib.chain_iterations(1.0, 4, 16) == 4
  assert costs_lib.chain_iterations(1.0, 3, 16) == 4
  assert costs_lib.chain_iterations(0.0, 5, 16) == 16  # one token each
  # gamma 1, alpha 0.5: 1 or 2 tokens with probability 1/2 each; for 2
  # tokens: 1 + (1/2) x 1 (one emitted, one left) + (1/2) x 0 = 1.5; for 3:
  # 1 + (1/2) x 1.5 + (1/2) x 1 = 2.25.
  assert costs_lib.chain_iterations(0.5, 1, 2) == pytest.approx(1.5)
  assert costs_lib.chain_iterations(0.5, 1, 3) == pytest.approx(2.25)
  with pytest.raises(ValueError, match="alpha must be in"):
    costs_lib.chain_iterations(1.5, 2, 4)


class _FakeMeasurer:
  """A machine with known costs: fixed 4 ms per call, target-only steps of
  1.1 ms, 16 tokens per row, 2 calls per pass (4 rows, batch 2), each
  chain's call ``world.chain_decode``."""

  new, short_tokens, seed, repeats = 16, 1, 0, 3

  def __init__(self, world, alpha):
    self.stats, self.world, self.alpha = {}, world, alpha

  def split_timers(self, batch):
    per = lambda n: 2 * (4e-3 + n * 1.1e-3)  # seconds of one pass
    return {"full": lambda: per(16), "short": lambda: per(1)}

  def runner(self, cand, batch, new_tokens=None):
    g, new = cand.structure.gamma, new_tokens or self.new
    secs = 2 * self.world.chain_decode(self.alpha, g, new)
    iters = 2 * costs_lib.chain_iterations(self.alpha, g, new)  # per pass
    return lambda seed: (secs, None, iters)

  def chunks(self, batch):
    return 4 // batch

  def anchor(self, gamma, batch):
    from specdec_jax.decoding.planners.auto import Candidate, Measured  # pylint: disable=g-import-not-at-top
    from specdec_jax.decoding.strategy import Chain  # pylint: disable=g-import-not-at-top
    c = Candidate("spec_decode", Chain(gamma), (0, 1))
    return Measured(c, 1.0, 1.0)  # fit_chains re-times the anchors


def test_fixed_and_step_from_two_lengths():
  from specdec_jax.decoding.planners import tune_measure  # pylint: disable=g-import-not-at-top
  fixed, step = tune_measure.fixed_and_step(2 * (4e-3 + 16e-3),
                                            2 * (4e-3 + 8e-3), 16, 8, 2)
  assert (fixed, step) == pytest.approx((4e-3, 1e-3))


@pytest.mark.parametrize("per_draft,anchors,h", [
    (0.0, (3,), 2e-4), (1e-4, (2, 6), 2e-4),
    (3e-4, (2, 6), -1e-4)])  # the residual grows faster than from 0
def test_fit_chains_recovers_alpha_overheads_and_prices_every_gamma(
    per_draft, anchors, h):
  from specdec_jax.decoding.planners import tune_measure  # pylint: disable=g-import-not-at-top
  calls = costs_lib.CostModel((1, 4, 8), _model().seconds, 2)
  alpha, fixed, batch = 0.7, 4e-3, 2
  # A speculative decode's fixed part: target-only's + 1.5 ms (drafter).
  world = dataclasses.replace(calls, iteration_s=(
      ("chain", h), ("draft", per_draft)), call_s=fixed, spec_call_s=5.5e-3)
  m = _FakeMeasurer(world, alpha)
  fit, alphas = tune_measure.fit_chains(
      m, [m.anchor(g, batch) for g in anchors], batch, (1, 5), calls=calls)
  assert [g for g, _ in alphas] == list(anchors)
  assert all(a == pytest.approx(alpha, abs=1e-9) for _, a in alphas)
  assert fit.overhead("chain") == pytest.approx(h)
  assert fit.overhead("draft") == pytest.approx(per_draft, abs=1e-12)
  assert fit.call_s == pytest.approx(fixed)
  assert fit.spec_call_s == pytest.approx(5.5e-3)
  assert fit.overhead("autoregressive") == pytest.approx(1.1e-3 - 1e-3)
  for g in (1, 2, 5, 7):  # far from the anchors too: the fixed part is
    assert fit.chain_decode(alpha, g, 16) == pytest.approx(  # not amortised
        world.chain_decode(alpha, g, 16))  # over the anchor's iterations


def test_alpha_between_anchors_and_bad_anchors():
  from specdec_jax.decoding.planners import tune_measure  # pylint: disable=g-import-not-at-top
  pts = ((2, 0.8), (6, 0.6))
  assert tune_measure.alpha_at(pts, 4) == pytest.approx(0.7)
  assert tune_measure.alpha_at(pts, 1) == 0.8
  assert tune_measure.alpha_at(pts, 8) == 0.6
  m = _FakeMeasurer(_model(), 0.7)
  with pytest.raises(ValueError, match="different gammas, got gammas"):
    tune_measure.fit_chains(m, [m.anchor(3, 2), m.anchor(3, 2)], 2, (1,))


def test_intercept_and_the_chain_loop_floor():
  from specdec_jax.decoding.planners import tune_measure  # pylint: disable=g-import-not-at-top
  # 10 ms over 4 iterations, 16 ms over 7: 2 ms per iteration + 2 ms.
  assert tune_measure.intercept(10e-3, 4, 16e-3, 7, 1e-3) == pytest.approx(
      2e-3)
  assert tune_measure.intercept(10e-3, 4, 16e-3, 7, 3e-3) == 3e-3  # floor
  assert tune_measure.intercept(10e-3, 4, 12e-3, 4, 1e-3) == 1e-3  # same
  # 'chain' + g x 'draft' < 0 prices the loop at 0, not below.
  cm = costs_lib.CostModel((1, 4, 8), _model().seconds, 1, (
      ("chain", -5e-4), ("draft", 1e-4)))
  assert cm.chain(1.0, 3) == pytest.approx(
      (3 * cm.call(0, 1) + cm.call(-1, 4)) / 4)  # -0.2 ms -> 0
  assert cm.chain(1.0, 7) == pytest.approx(
      (7 * cm.call(0, 1) + cm.call(-1, 8) + 2e-4) / 8)
