"""`specdec_jax plan-hierarchy` end to end on tiny random models (costs fixed
by hand so that the choice is deterministic), then a decode that includes
the gin file it wrote; and the mode's own errors, raised before any model
loads."""

import gin
import jax
import numpy as np
import pytest

from specdec_jax import decoding, main, models
from specdec_jax.decoding.hierarchy import planner
from specdec_jax.decoding.planners import hierarchy_calibration as calib
from specdec_jax import plan_hierarchy_run as plan_hierarchy

# Seconds of one call at width 1 of: the drafter, exit:1, the verifier.
COSTS = (0.02, 0.06, 1.0)


def _fake_costs(levels, batch=1, widths=(1,), **kw):
  del kw
  widths = tuple(sorted({1, *widths}))
  assert len(levels) == 3
  return calib.CallCosts(widths, tuple(
      tuple(c * (1 + 0.05 * (w - 1)) for w in widths) for c in COSTS), batch)


@pytest.fixture(autouse=True)
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.mark.slow
def test_plan_hierarchy_writes_a_gin_file_that_decode_uses(tmp_path, capsys,
                                                           monkeypatch):
  monkeypatch.setattr(calib, "measure_call_costs", _fake_costs)
  out = tmp_path / "hier.gin"
  main.parse_gin(["runs/plan_hierarchy.gin", "pairs/tiny_random.gin"],
                 ["CANDIDATES = {'small': %DRAFTER, 'exit1': 'exit:1'}",
                  "TEMPERATURE = 1.0", "MAX_BUFFER = 3", "MAX_DEPTH = 2",
                  "NUM_PROMPTS = 2", "NEW_TOKENS = 6", f"OUTPUT = '{out}'"])
  report = main.run()
  printed = capsys.readouterr().out
  assert report["names"] == ["small", "exit1", "verifier"]
  # The choice is the planner's on the measured alpha and these costs.
  want = planner.plan(np.asarray(report["alpha"]), _fake_costs(
      [0] * 3, widths=calib.planner_widths(3, 2)), 3, names=report["names"],
                      max_depth=2)
  assert report["best"]["chain"] == [report["names"][i]
                                     for i in want.best.chain]
  assert report["best"]["buffers"] == list(want.best.buffers)
  assert report["speedup"] == pytest.approx(want.speedup)
  assert report["best"]["chain"] == ["small", "exit1"]  # a 3-level stack
  assert "| small | 1.000 | " in printed
  assert f"chosen: {want.describe(want.best)}: predicted " in printed
  assert out.read_text() == report["gin"]
  assert "hierarchy_spec.drafters = [@hierarchy_level0/ModelSpec(), " \
         "'exit:1']" in report["gin"]
  gin.clear_config()
  req = tmp_path / "req.jsonl"
  req.write_text('{"tokens": [2, 5, 9]}\n{"tokens": [2, 7]}\n')
  main.parse_gin(["runs/decode.gin", "pairs/tiny_random.gin", str(out)],
                 [f"INPUT_FILE = '{req}'", f"OUTPUT_DIR = '{tmp_path}'",
                  "MAX_NEW_TOKENS = 5"])
  rows = main.run()
  v = models.get_model("gemma2_tiny")
  ref = decoding.generate(decoding.TargetOnly(), v, v, None,
                          v.init_params(jax.random.PRNGKey(0)),
                          [[2, 5, 9], [2, 7]], max_new_tokens=5)
  assert [r["tokens"] for r in rows] == ref.sequences()  # greedy: exact
  assert all(len(r["level_calls"]) == 3 and r["level_calls"][2] ==
             r["verifier_calls"] for r in rows)


def _run(bindings):
  main.parse_gin(["runs/plan_hierarchy.gin", "pairs/tiny_random.gin"],
                 bindings)
  return main.run()


@pytest.mark.parametrize("bindings,match", [
    (["CANDIDATES = []"], "plan-hierarchy has no candidates: set CANDIDATES"),
    (["CANDIDATES = None"], "plan-hierarchy has no candidates"),
    (["CANDIDATES = ['medium']"],
     "unknown candidate 0 'medium': a level is a ModelSpec"),
    (["CANDIDATES = {'x': 'exit:one'}"], "unknown candidate 'x' 'exit:one'"),
    (["CANDIDATES = ['exit:2']"],
     "candidate 'exit:2' is an early exit after 2 decoder layers but the "
     "verifier has 2; use 'exit:1' .. 'exit:1'"),
    (["CANDIDATES = [@big/ModelSpec()]", "big/ModelSpec.preset = 'gemma_2b'"],
     "candidate 'gemma_2b' \\(gemma_2b\\) has a vocabulary of 256128 ids but "
     "the verifier has 64"),
    (["CANDIDATES = [%DRAFTER, %DRAFTER]"],
     "candidate name 'gemma_tiny@seed1' is used twice"),
    (["CANDIDATES = {'verifier': 'exit:1'}"],
     "candidate name 'verifier' is used twice"),
    (["PLANNER = 'greedy'"], "planner must be 'auto', 'brute' or 'dp'"),
    (["MAX_BUFFER = 0"], "max_buffer must be an integer >= 1, got 0"),
    (["MAX_DEPTH = 0"], "max_depth must be an integer >= 1, got 0"),
    (["MAX_BUFFER = 100000"], "max_buffer must be an integer in \\[1, 64\\] "
     "\\(planner.MAX_BUFFER\\), got 100000"),
    (["MAX_BUFFER = 64", "PLANNER = 'dp'",
      "CANDIDATES = [%DRAFTER, 'exit:1']"], "this search would evaluate "
     "131,200 hierarchies, more than 100,000 \\(planner.MAX_EVALUATIONS\\);"
     " lower max_buffer, max_depth or the number of candidates"),
    (["OUTPUT = '/etc/hostname/plan.gin'"], "cannot write OUTPUT "
     "/etc/hostname/plan.gin: /etc/hostname is a file"),
    (["INPUT_FILE = '/nonexistent/requests.jsonl'"],
     "input file not found: /nonexistent/requests.jsonl"),
])
def test_bad_plan_hierarchy_input_fails_before_loading(bindings, match,
                                                       capsys):
  with pytest.raises(ValueError, match=match):
    _run(bindings)
  assert "RANDOM weights" not in capsys.readouterr().err  # nothing loaded


def test_no_candidate_cheaper_than_the_verifier_is_a_clear_error():
  costs = calib.CallCosts((1,), ((2e-3,), (1e-3,)), 1)
  with pytest.raises(ValueError, match=(
      r"no candidate is cheaper per call than the verifier on this machine "
      r"\(verifier 1.000 ms; exit:1 2.000 ms\)")):
    plan_hierarchy._plan_and_report(  # pylint: disable=protected-access
        ["exit:1", "verifier"], np.eye(2), costs, [("exit:1", None)], 4, 2,
        "auto", 5, None, decoding.Greedy(), 1, 1)


def test_unknown_candidate_is_one_line_on_the_command_line(capsys):
  from tests.test_cli import _cli_here  # pylint: disable=g-import-not-at-top
  code, _, err = _cli_here(capsys, "plan-hierarchy",
                           "--gin_file=runs/plan_hierarchy.gin",
                           "--gin_file=pairs/tiny_random.gin",
                           "--gin.CANDIDATES=['exit:1', 'small']")
  assert code == 2
  assert err.splitlines() == [
      "specdec_jax: error: ValueError: unknown candidate 1 'small': a level "
      "is a ModelSpec (gin: @scope/ModelSpec()) or 'exit:K' (the verifier's "
      "first K decoder layers), e.g. 'exit:1'"]
