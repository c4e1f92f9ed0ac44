"""specdec_jax.timing: the one jitted timing loop and the paired ratios."""

import jax
import numpy as np
import pytest

from specdec_jax import models, timing
from specdec_jax.decoding.rules import sampling
from specdec_jax.eval import results_file


def test_step_timer_chain_tree_and_sampling_and_ratios():
  m = models.get_model("gemma_tiny")
  p = m.init_params(jax.random.PRNGKey(0))
  one = timing.step_timer(m, p, 2, 1, min_iters=2, min_seconds=0.0)
  tree = timing.step_timer(m, p, 2, 3, depths=[0, 1, 1],
                           mask=[[1, 0, 0], [1, 1, 0], [1, 0, 1]],
                           sampling=sampling.Temperature(1.0), min_iters=2,
                           min_seconds=0.0)
  assert 0 < one() < 1 and 0 < tree() < 1
  got = timing.medians({"one": one}, 2)
  assert set(got) == {"one"} and got["one"] > 0
  ratio = timing.paired_ratios({"tree": tree}, one, 2)["tree"]
  assert 0 < ratio < 100


def test_step_timer_prices_the_capacity_it_is_given(monkeypatch):
  m = models.get_model("gemma_tiny")
  p = m.init_params(jax.random.PRNGKey(0))
  slots, orig = [], type(m).init_cache

  def init_cache(self, batch, max_length, *a, **kw):
    slots.append(max_length)
    return orig(self, batch, max_length, *a, **kw)

  monkeypatch.setattr(type(m), "init_cache", init_cache)
  timing.step_timer(m, p, 1, 2, context=5, min_iters=1, min_seconds=0.0)
  timing.step_timer(m, p, 1, 2, context=5, capacity=40, min_iters=1,
                    min_seconds=0.0)
  assert slots == [5 + 2 + 8, 40]


@pytest.mark.parametrize("kw,match", [
    (dict(batch=0), "batch must be an integer >= 1, got 0"),
    (dict(width=2, depths=[0]), r"depths must be \[2\] and mask \[2, 2\]"),
    (dict(width=2, context=5, capacity=6),
     "capacity must be an integer >= 7, got 6"),
])
def test_step_timer_rejects_bad_arguments(kw, match):
  m = models.get_model("gemma_tiny")
  with pytest.raises(ValueError, match=match):
    timing.step_timer(m, {}, **kw)


def test_write_report(tmp_path):
  out = str(tmp_path / "sub" / "r")
  js, md = results_file.write_report(out, command="python x.py",
                                     markdown="# T\n", rows=[{"a": 1}],
                                     meta={"k": np.float32(2)})
  import json  # pylint: disable=g-import-not-at-top
  data = json.load(open(js))
  assert data["rows"] == [{"a": 1}] and data["meta"]["k"] == 2.0
  assert data["meta"]["command"] == "python x.py"
  assert len(data["meta"]["load_average"]) == 3
  assert open(md).read().startswith("# T\n\nMeasured with `python x.py`")
  with pytest.raises(ValueError, match="without extension"):
    results_file.write_report(out + ".json", command="", markdown="",
                              rows=[])


def test_fn_timer_times_a_function_and_rejects_int_first_argument():
  x = np.ones((2, 16), np.float32)
  t = timing.fn_timer(lambda a: (jax.nn.softmax(a), a.argmax(-1)), x,
                      min_iters=2, min_seconds=0.0)
  assert 0 < t() < 1
  with pytest.raises(ValueError, match="floating-point first argument"):
    timing.fn_timer(lambda a: a, np.ones(3, np.int32))


def test_marginal_timer_cancels_a_launch_cost(monkeypatch):
  """A loop of n steps costing 4 ms per launch + 1 ms per step is priced
  1 ms per step (not (4 + n) / n), on a fake clock; a difference that is
  not positive falls back to the long loop's time per step."""
  import types  # pylint: disable=g-import-not-at-top
  clock, per_step = [0.0], [0.001]

  class Done:

    def block_until_ready(self):
      return self

  def run(iters):
    clock[0] += 0.004 + per_step[0] * iters
    return Done()

  monkeypatch.setattr(timing, "time",
                      types.SimpleNamespace(perf_counter=lambda: clock[0]))
  timed = timing._marginal(run, 8, 0.02)  # pylint: disable=protected-access
  assert timed() == pytest.approx(0.001)
  per_step[0] = 0.0  # launches only: no positive difference
  # 8 steps took 12 ms: n = ceil(0.02 / 0.0015) = 14 steps, k = 7.
  assert timed() == pytest.approx(0.004 / 21)
