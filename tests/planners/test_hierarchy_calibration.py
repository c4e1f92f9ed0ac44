"""Calibration of the hierarchy planner: pairwise alpha (exact on fakes whose
distributions do not depend on the context), call costs and their widths."""

import jax
import numpy as np
import pytest

from specdec_jax import decoding, models
from specdec_jax.decoding.planners import hierarchy_calibration as calib
from tests.decoding.fakes import FixedModel

LOGITS = ([1.0, 0.0, 0.5, 1.5, 0.2, 0.0],
          [1.2, 0.3, 0.4, 1.0, 0.0, 0.4],
          [1.0, 0.5, 0.0, 1.2, 0.3, 0.6])


def _softmax(x, t):
  z = np.exp(np.asarray(x) / t)
  return z / z.sum()


@pytest.mark.parametrize("sampling,temperature", [
    (decoding.Temperature(1.0), 1.0), (decoding.Temperature(0.5), 0.5),
    (decoding.Greedy(), 0.0)])
def test_pairwise_alpha_is_one_minus_tv_on_context_free_fakes(sampling,
                                                               temperature):
  levels = [(FixedModel(tuple(x)), {}) for x in LOGITS]
  got = calib.pairwise_alpha(levels, [[1, 2, 3], [1]], sampling=sampling,
                             new_tokens=4)
  if temperature == 0.0:  # greedy: do the argmaxes (3, 0, 3) agree?
    want = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 1]], float)
  else:
    p = [_softmax(x, temperature) for x in LOGITS]
    want = np.array([[np.minimum(a, b).sum() for b in p] for a in p])
  np.testing.assert_allclose(got, want, atol=1e-6)


def test_pairwise_alpha_of_early_exits_of_a_real_model():
  """exit:2 of a 2-layer model IS the model (alpha exactly 1); exit:1 is
  not; the matrix is symmetric with a unit diagonal."""
  v = models.get_model("gemma2_tiny")
  pp = v.init_params(jax.random.PRNGKey(0))
  pp["embedder"]["input_embedding"] *= 3.0
  levels = [(models.early_exit(v, 1), pp), (models.early_exit(v, 2), pp),
            (v, pp)]
  got = calib.pairwise_alpha(levels, [[2, 9, 4], [2, 30]],
                             sampling=decoding.Temperature(1.0),
                             new_tokens=5, seed=1)
  assert got[1, 2] == 1.0 and got[2, 1] == 1.0
  assert 0.0 < got[0, 2] < 1.0 and got[0, 1] == got[0, 2]
  np.testing.assert_array_equal(got, got.T)
  np.testing.assert_array_equal(np.diag(got), np.ones(3))


def test_call_costs_interpolate_select_and_measure():
  costs = calib.CallCosts((1, 4, 8), ((1.0, 2.5, 4.5), (2.0, 2.0, 6.0)), 8)
  assert costs(0, 2) == 1.5 and costs(1, 6) == 4.0 and costs(0, 20) == 4.5
  assert costs.select([1]).seconds == ((2.0, 2.0, 6.0),)
  assert calib.planner_widths(3, 2) == (1, 2, 4, 8, 11)
  assert calib.planner_widths(1, 1) == (1, 2, 4, 5)
  m = models.get_model("gemma_tiny")
  real = calib.measure_call_costs([(m, m.init_params(jax.random.PRNGKey(0)))],
                                  batch=2, widths=(3,), iters=2, repeats=2)
  assert real.widths == (1, 3) and real.batch == 2
  assert all(0 < s < 1 for s in real.seconds[0]), real.seconds


@pytest.mark.parametrize("call,match", [
    (lambda lv: calib.pairwise_alpha(lv[:1], [[1]]),
     "needs at least two models"),
    (lambda lv: calib.pairwise_alpha([lv[0], (FixedModel((1.0, 2.0)), {})],
                                     [[1]]),
     r"share one vocabulary, got sizes \[6, 2\]"),
    (lambda lv: calib.pairwise_alpha(lv, [[1]], new_tokens=0),
     "new_tokens must be an integer >= 1, got 0"),
    (lambda lv: calib.measure_call_costs(lv, batch=0),
     "batch must be an integer >= 1, got 0"),
    (lambda lv: calib.measure_call_costs(lv, widths=(0, 2)),
     r"widths must be >= 1, got \[0, 1, 2\]"),
])
def test_bad_calibration_input_is_a_clear_error(call, match):
  levels = [(FixedModel(tuple(x)), {}) for x in LOGITS]
  with pytest.raises(ValueError, match=match):
    call(levels)
