"""Model families behind one decode interface (see ``interface.py``)."""

from __future__ import annotations

import dataclasses

from specdec_jax.models.base import FlaxDecodeModel, early_exit
from specdec_jax.models.cache import KVCache, LayerKV
from specdec_jax.models.gemma import GEMMA_PRESETS, GemmaConfig, GemmaModel
from specdec_jax.models.ngram import NgramModel
from specdec_jax.models.interface import (DecodeModel, Encoded,
                                          EncoderDecoderModel,
                                          check_decode_model, check_params,
                                          check_tokens, flatten_params,
                                          unflatten_params)
from specdec_jax.models.t5 import T5_PRESETS, T5Config, T5Model
from specdec_jax.models import families  # pylint: disable=g-bad-import-order

PRESETS = {k: v for fam in families.FAMILIES for k, v in fam.presets.items()}


def model_from_config(config) -> FlaxDecodeModel:
  """Wraps a family's config (T5Config, GemmaConfig) in its model class."""
  return families.of_config(config).model_cls(config)


def get_model(name: str, **overrides) -> FlaxDecodeModel:
  """A model from a preset name, e.g. ``get_model('gemma2_2b', dtype='bfloat16')``.

  Args:
    name: one of :data:`PRESETS`.
    **overrides: config fields to replace (dtype, vocab_size, ...).
  """
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; available: "
                     f"{', '.join(sorted(PRESETS))}")
  cfg = PRESETS[name]
  bad = [k for k in overrides if k not in {f.name for f in
                                           dataclasses.fields(cfg)}]
  if bad:
    raise ValueError(f"{type(cfg).__name__} has no field {bad[0]!r}")
  return model_from_config(dataclasses.replace(cfg, **overrides))


__all__ = [
    "DecodeModel", "Encoded", "EncoderDecoderModel", "FlaxDecodeModel", "GemmaConfig", "GemmaModel",
    "GEMMA_PRESETS", "KVCache", "LayerKV", "NgramModel", "PRESETS",
    "T5Config", "T5Model", "T5_PRESETS", "families",
    "check_decode_model", "check_params", "check_tokens", "early_exit",
    "flatten_params", "get_model", "model_from_config", "unflatten_params",
]
