"""The paired bootstrap of scripts/family_significance.py."""

import pytest

from tests.eval import load_script


def _script():
  return load_script("family_significance")


TARGETS = [f"return the sum of the {w} values in order" for w in
           ("first", "last", "odd", "even", "large", "small", "named", "new")]


@pytest.mark.parametrize("metric", ["rouge2", "bleu"])
def test_a_perfect_model_beats_a_bad_one_in_every_resample(metric):
  script = _script()
  preds = {"large": list(TARGETS),
           "medium": [t.rsplit(" ", 2)[0] for t in TARGETS],
           "small": ["x y z"] * len(TARGETS)}
  out = script.bootstrap(metric, TARGETS, preds, resamples=50, seed=0)
  assert out["levels"]["large"]["metric"] == pytest.approx(100.0)
  assert out["levels"]["small"]["metric"] == 0.0
  assert out["wins"] == {"large>medium": 1.0, "large>small": 1.0,
                         "medium>small": 1.0}
  for s in out["levels"].values():
    assert s["low"] <= s["metric"] <= s["high"]


def test_identical_models_never_win_and_the_seed_fixes_the_draws():
  script = _script()
  preds = {"large": TARGETS[::-1], "small": TARGETS[::-1]}
  out = script.bootstrap("rouge2", TARGETS, preds, resamples=30, seed=1)
  assert out["wins"] == {"large>small": 0.0}
  assert out == script.bootstrap("rouge2", TARGETS, preds, 30, seed=1)


def test_bad_arguments_are_rejected(capsys):
  script = _script()
  with pytest.raises(SystemExit):
    script.main(["--out", "/tmp/x", "--resamples", "3"])
  assert "--resamples must be >= 10, got 3" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    script.main(["--out", "/tmp/x", "--pairs", "nope"])
  assert "unknown pair 'nope'" in capsys.readouterr().err
