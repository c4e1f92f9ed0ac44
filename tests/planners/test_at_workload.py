"""Moving a fitted CostModel to another workload (CostModel.at_workload,
tune_measure.at_workload): the re-timed parts replace, the chain's fitted
parts scale with them by hand (the tree / hierarchy loops' are kept unless
carry=()), and on a simulated machine whose costs all scale
with the prompt the moved model prices every chain exactly."""

import dataclasses

import numpy as np
import pytest

from specdec_jax import decoding
from specdec_jax.decoding.planners import costs as costs_lib
from specdec_jax.decoding.planners import tune_measure
from tests.decoding.fakes import FixedModel

WIDTHS = (1, 4, 8)


def _fitted():
  """A model as fit_chains / structure_fit leave it, every term set."""
  return costs_lib.CostModel(
      WIDTHS, ((1e-4, 2e-4, 4e-4), (1e-3, 1.2e-3, 2e-3)), 2, (
          ("autoregressive", 2e-4), ("chain", 5e-4), ("draft", 1e-4),
          ("tree", 2e-4), ("tree_node", 1e-5), ("hierarchy_buffer", 3e-5)),
      call_s=4e-3, spec_call_s=5e-3,
      structure_call_s=(("hierarchy", 6e-3),))


def test_at_workload_by_hand():
  # The workload: target calls at half, drafter calls at a quarter, the
  # fixed part per call at half (2 ms), its own loop overhead 70 us.
  calls = costs_lib.CostModel(WIDTHS, ((2.5e-5, 5e-5, 1e-4),
                                       (5e-4, 6e-4, 1e-3)), 2)
  moved = _fitted().at_workload(calls, 2e-3, 7e-5)
  assert moved.seconds == calls.seconds and moved.batch == 2
  assert moved.call_s == 2e-3
  want = {"autoregressive": 7e-5, "chain": 2.5e-4,  # x 1/2
          "draft": 2.5e-5,  # x 1/4: per drafted token
          "tree": 2e-4, "tree_node": 1e-5, "hierarchy_buffer": 3e-5}  # kept
  for name, secs in want.items():
    assert moved.overhead(name) == pytest.approx(secs), name
  scaled = _fitted().at_workload(calls, 2e-3, 7e-5, carry=())
  want.update(tree=1e-4, tree_node=2.5e-6, hierarchy_buffer=7.5e-6)
  for name, secs in want.items():
    assert scaled.overhead(name) == pytest.approx(secs), name
  # The speculative excess over call_s (1 ms; hierarchy 2 ms) x 1/2.
  assert moved.spec_call_s == pytest.approx(2.5e-3)
  assert moved.fixed("hierarchy") == pytest.approx(3e-3)
  assert moved.fixed("tree") == pytest.approx(2.5e-3)


def test_at_workload_keeps_unset_parts_and_refuses_other_shapes():
  base = costs_lib.CostModel(WIDTHS, ((0.0,) * 3, (1e-3, 1.2e-3, 2e-3)),
                             1, (("chain", 4e-4), ("draft", 1e-4)), 4e-3)
  calls = costs_lib.CostModel(WIDTHS, ((0.0,) * 3, (2e-3, 2.4e-3, 4e-3)), 1)
  moved = base.at_workload(calls, 8e-3, 1e-4)
  assert moved.spec_call_s is None and moved.fixed() == 8e-3
  assert moved.overhead("chain") == pytest.approx(8e-4)  # x 2
  assert moved.overhead("draft") == 1e-4  # parameter-free drafter: kept
  with pytest.raises(ValueError, match=r"same models timed at the same "
                     r"widths: got 2 models at widths \[1, 2\], this model "
                     r"has 2 at \[1, 4, 8\]"):
    base.at_workload(costs_lib.CostModel((1, 2), ((0, 0), (1, 1))), 1, 0)


class _World:
  """Seconds and verifier calls of decodes on one simulated machine: a
  CostModel (the truth) and the chain's true alpha; 4 rows at batch 2."""

  new, short_tokens, repeats = 16, 1, 3

  def __init__(self, truth, alpha, teacher):
    self.truth, self.alpha, self.teacher = truth, alpha, teacher

  def split_timers(self, batch):
    t = self.truth
    per = lambda n: 2 * t.target_only_decode(n)  # one pass: 2 calls
    return {"full": lambda: per(16), "short": lambda: per(1)}

  def chunks(self, batch):
    return 4 // batch

  def teacher_alpha(self, levels):
    return self.teacher


def simulated(monkeypatch):
  """(calibration truth, workload truth, calibration, workload): on the
  calibration's long prompts the chain's true alpha is 0.8 (teacher-forced
  0.7); on the workload every cost is 0.4x (calls, fixed parts, loop
  overheads) and both acceptances 0.9x. The models' call timers read the
  truth (patched into tune_measure)."""
  cal_truth = dataclasses.replace(_fitted(), iteration_s=(
      ("autoregressive", 2e-4), ("chain", 5e-4), ("draft", 1e-4)),
                                  structure_call_s=())
  scale = lambda s: tuple(tuple(0.4 * x for x in r) for r in s)
  work_truth = dataclasses.replace(
      cal_truth, seconds=scale(cal_truth.seconds), call_s=1.6e-3,
      spec_call_s=2e-3, iteration_s=tuple(
          (k, 0.4 * v) for k, v in cal_truth.iteration_s))
  cal, work = _World(cal_truth, 0.8, 0.7), _World(work_truth, 0.72, 0.63)

  def fake_call_timers(measurer, levels, batch, widths):
    s = measurer.truth
    timers = {("t", w): (lambda w=w: s.call(-1, w)) for w in widths}
    timers["q"] = lambda: s.call(0, 1)
    return timers

  monkeypatch.setattr(tune_measure, "call_timers", fake_call_timers)
  return cal_truth, work_truth, cal, work


def test_tune_measure_moves_a_fit_onto_a_simulated_workload(monkeypatch):
  """The moved model prices every chain of the workload exactly."""
  cal_truth, work_truth, cal, work = simulated(monkeypatch)
  anchors = ((3, 0.8), (7, 0.8))
  moved, alphas = tune_measure.at_workload(cal_truth, anchors, cal, work, 2,
                                           (0, 1))
  assert [g for g, _ in alphas] == [3, 7]
  np.testing.assert_allclose([a for _, a in alphas], [0.72, 0.72])
  for g in (1, 3, 5, 8):
    assert moved.chain_decode(0.72, g, 16) == pytest.approx(
        work_truth.chain_decode(0.72, g, 16))
  assert moved.target_only_decode(16) == pytest.approx(
      work_truth.target_only_decode(16))
  # Acceptance scaled up is capped at 1.
  _, up = tune_measure.at_workload(cal_truth, ((3, 0.95),), work, cal, 2,
                                   (0, 1))
  assert up == ((3, 1.0),)


def test_decode_measurer_teacher_alpha_is_one_minus_tv_once():
  q, p = [1.0, 0.0, 0.5, 1.5], [1.2, 0.3, 0.4, 1.0]
  m = tune_measure.DecodeMeasurer(
      [FixedModel(tuple(q)), FixedModel(tuple(p))], [{}, {}],
      [[1, 2, 3], [1]], False, 4, decoding.Temperature(1.0), 1)
  soft = lambda x: np.exp(x) / np.exp(x).sum()
  want = np.minimum(soft(np.array(q)), soft(np.array(p))).sum()
  assert m.teacher_alpha((0, 1)) == pytest.approx(want, abs=1e-6)
  m.rows = [[3]]  # memoised per levels: not recomputed
  assert m.teacher_alpha((0, 1)) == pytest.approx(want, abs=1e-6)


def test_moved_acceptance_per_rank_and_pairwise():
  got = costs_lib.moved_acceptance((0.9, 0.5, 0.2), (0.8, 0.4, 0.0),
                                       (0.6, 0.6, 0.3))
  assert got == pytest.approx((0.675, 0.75, 0.3))  # rank 2: workload's
  assert costs_lib.moved_acceptance((0.9,), (0.5,), (0.6,)) == (1.0,)
  fitted = np.array([[1.0, 0.6], [0.6, 1.0]])
  got = costs_lib.moved_acceptance(fitted,
                                       np.array([[1.0, 0.8], [0.8, 1.0]]),
                                       np.array([[1.0, 0.4], [0.4, 1.0]]))
  np.testing.assert_allclose(got, [[1.0, 0.3], [0.3, 1.0]])
  with pytest.raises(ValueError, match=r"one shape, got \(2,\), \(1,\)"):
    costs_lib.moved_acceptance((0.5, 0.4), (0.5,), (0.5, 0.4))
