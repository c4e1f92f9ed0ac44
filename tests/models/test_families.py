"""The families table is the one list of model families."""

import pytest

from specdec_jax import models
from specdec_jax.model_spec import DEFAULT_MAX_INPUT_TOKENS
from specdec_jax.models import families


def test_every_preset_belongs_to_one_row():
  assert set(models.PRESETS) == {k for f in families.FAMILIES
                                 for k in f.presets}
  for name, cfg in models.PRESETS.items():
    fam = families.of_config(cfg)
    assert isinstance(models.get_model(name), fam.model_cls), name
    assert fam.encoder_decoder == models.get_model(name).is_encoder_decoder


def test_lookups_and_readers():
  t5 = models.get_model("t5_tiny")
  assert families.of_model(t5).name == "t5"
  assert families.of_model(models.early_exit(t5, 1)).name == "t5"
  assert families.get("gemma").hf_model_types == ("gemma", "gemma2")
  assert DEFAULT_MAX_INPUT_TOKENS == {"t5": 512, "gemma": 8192}
  with pytest.raises(ValueError, match="unknown model family 'llama'; "
                     "known: t5, gemma"):
    families.get("llama")
  with pytest.raises(ValueError, match="expected a config of T5Config or "
                     "GemmaConfig, got dict"):
    families.of_config({})
