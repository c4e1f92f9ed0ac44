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

PRESETS = {**{k: v for k, v in T5_PRESETS.items()}, **GEMMA_PRESETS}


def model_from_config(config) -> T5Model | GemmaModel:
  """Wraps a T5Config or GemmaConfig in its model class."""
  if isinstance(config, T5Config):
    return T5Model(config)
  if isinstance(config, GemmaConfig):
    return GemmaModel(config)
  raise ValueError(f"expected a T5Config or GemmaConfig, got "
                   f"{type(config).__name__}")


def get_model(name: str, **overrides) -> T5Model | GemmaModel:
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
    "KVCache", "LayerKV", "NgramModel", "PRESETS", "T5Config", "T5Model",
    "check_decode_model", "check_params", "check_tokens", "early_exit",
    "flatten_params", "get_model", "model_from_config", "unflatten_params",
]
