"""Tiny models shared by the model tests."""

import functools

import jax
import numpy as np

from specdec_jax.models.gemma import GEMMA_PRESETS, GemmaModel
from specdec_jax.models.t5 import T5_PRESETS, T5Model

TINY = {
    "t5": lambda: T5Model(T5_PRESETS["t5_tiny"]),
    "gemma": lambda: GemmaModel(GEMMA_PRESETS["gemma_tiny"]),
    "gemma2": lambda: GemmaModel(GEMMA_PRESETS["gemma2_tiny"]),
    "gemma3": lambda: GemmaModel(GEMMA_PRESETS["gemma3_tiny"]),
}


def tiny(name, seed=0):
  model = TINY[name]()
  return model, model.init_params(jax.random.PRNGKey(seed))


@functools.lru_cache(maxsize=None)
def jitted(model):
  """(step, forward) of ``model`` under jax.jit."""
  return jax.jit(model.step), jax.jit(model.forward)


def reference_logits(model, params, tokens, inputs=None, pad_to=None):
  """Uncached forward of one row: tokens [T] -> [T, V] numpy.

  The row is zero-padded to ``pad_to`` (causal attention makes the padding
  invisible to earlier positions), so one compiled program serves all T.
  """
  tokens = np.asarray(tokens)
  n = len(tokens)
  if pad_to is not None:
    tokens = np.pad(tokens, (0, pad_to - n))
  kw = {} if inputs is None else {"inputs": np.asarray(inputs)[None]}
  return np.asarray(jitted(model)[1](params, tokens[None], **kw))[0, :n]
