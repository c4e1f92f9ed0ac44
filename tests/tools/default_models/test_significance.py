"""The paired bootstrap of tools/default_models/significance.py."""

import pytest

from specdec_jax.families import loader as default_models
from tests.tools.default_models import load_tool


def _script():
  return load_tool("significance")


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
  with pytest.raises(SystemExit):
    script.main(["--out", "/tmp/x", "--predictions", "/tmp/p.json",
                 "--pairs", ",".join(default_models.PAIRS)])
  assert "must contain '{pair}'" in capsys.readouterr().err


def test_the_bleu_breakdown_explains_a_short_output():
  from specdec_jax.eval import metrics
  refs = ["return the sum of the first values in order"]
  full = metrics.bleu_breakdown(refs, refs)
  short = metrics.bleu_breakdown(refs, ["return the sum of the first"])
  assert full["brevity_penalty"] == 1.0 and full["length_ratio"] == 1.0
  assert short["precisions"] == [100.0] * 4  # every n-gram is right ...
  assert short["sys_len"] == 6 and short["ref_len"] == 9
  # ... and the brevity penalty exp(1 - 9/6) is the whole loss
  assert short["brevity_penalty"] == pytest.approx(0.6065307, abs=1e-6)
  assert short["bleu"] == pytest.approx(metrics.bleu(
      refs, ["return the sum of the first"]))
  assert short["bleu"] == pytest.approx(100 * 0.6065307, abs=1e-4)


def test_markdown_lists_the_bleu_parts():
  script = _script()
  preds = {"large": list(TARGETS), "small": [t.rsplit(" ", 2)[0]
                                             for t in TARGETS]}
  from specdec_jax.eval import metrics
  r = script.bootstrap("bleu", TARGETS, preds, resamples=20, seed=0)
  for lv, ps in preds.items():
    r["levels"][lv]["breakdown"] = metrics.bleu_breakdown(TARGETS, ps)
  r.update(metric="bleu", examples=len(TARGETS))
  md = script.markdown(dict(resamples=20, seed=0, pairs={"toy": r}), "cmd")
  assert "| large | 100.0 / 100.0 / 100.0 / 100.0 | 1.000 | 1.000 |" in md
  assert "| small | 100.0 / 100.0 / 100.0 / 100.0 |" in md
