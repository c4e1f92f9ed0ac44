"""tools/default_models/input_dependence.py: the input-shuffling loss diagnostic."""

import os

import pytest

from specdec_jax.families import loader as dm
from tests.tools.default_models import load_tool

BUILT = os.path.isfile(os.path.join(dm.ASSETS, "t5_codegen", "medium",
                                    "params.safetensors"))


def _script():
  return load_tool("input_dependence")


@pytest.mark.skipif(not BUILT, reason="the three-size families are not built")
def test_real_input_loss_is_the_recorded_validation_loss():
  """The 'real' column on the whole validation split reproduces the
  validation loss the training run recorded; a wrong or missing input can
  only cost these models (it does, by a little for shuffled inputs and
  much for none)."""
  fam = dm.load("t5_codegen")
  exs = dm.examples("t5_codegen", "validation")
  got = _script().measure(fam, exs)
  levels = fam.info["evaluation"]["levels"]
  for level, loss in got.items():
    assert loss["real"] == pytest.approx(levels[level]["validation_loss"],
                                         abs=2e-4)
    assert loss["real"] < loss["shuffled"] < loss["empty"]


@pytest.mark.skipif(not BUILT, reason="the three-size families are not built")
def test_bad_requests_are_refused():
  script = _script()
  with pytest.raises(ValueError, match="decoder-only"):
    script.measure(dm.load("gemma_completion"),
                   dm.examples("gemma_completion", "test", limit=4))
  with pytest.raises(ValueError, match="at least 2 examples"):
    script.measure(dm.load("t5_codegen"),
                   dm.examples("t5_codegen", "test", limit=1))
