"""Model presets as ml_collections ConfigDicts.

    from configs import models
    cfg = models.get_config('t5_1_1_large')      # or, with config_flags:
    --model_config=configs/models.py:gemma2_27b

Every field of the architecture dataclass (a family's config class,
``specdec_jax/models/families.py``) plus the family; ``build(cfg)`` returns the model object.
"""

import dataclasses

import ml_collections

from specdec_jax import models


def get_config(preset: str = "t5_1_1_small") -> ml_collections.ConfigDict:
  """The preset's hyperparameters (published sizes) as a ConfigDict."""
  if preset not in models.PRESETS:
    raise ValueError(f"unknown preset {preset!r}; available: "
                     f"{', '.join(sorted(models.PRESETS))}")
  arch = models.PRESETS[preset]
  cfg = ml_collections.ConfigDict()
  cfg.preset = preset
  cfg.family = models.families.of_config(arch).name
  # Per-field comments live on the dataclasses (models/t5.py, gemma.py).
  cfg.arch = ml_collections.ConfigDict(
      {k: list(v) if isinstance(v, tuple) else v
       for k, v in dataclasses.asdict(arch).items()})
  return cfg


def build(cfg: ml_collections.ConfigDict):
  """ConfigDict from :func:`get_config` (possibly edited) -> model object."""
  arch = dict(cfg.arch)
  if "attention_types" in arch:
    arch["attention_types"] = tuple(arch["attention_types"])
  klass = models.families.get(cfg.family).config_cls
  return models.model_from_config(klass(**arch))
