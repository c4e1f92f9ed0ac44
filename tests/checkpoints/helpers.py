"""Helpers shared by the checkpoint tests."""

import functools

import jax
import numpy as np

from specdec_jax import models


@functools.lru_cache(maxsize=None)
def tiny(name, seed=0, **overrides):
  """(model, random params) of a tiny preset, norm scales included, without
  flax init (fast). Shared by the checkpoint tests."""
  model = models.get_model(name, **overrides)
  rng = np.random.default_rng(seed)
  return model, jax.tree.map(
      lambda s: jax.numpy.asarray(rng.normal(0, 0.3, s.shape), np.float32),
      model.param_shapes())


def assert_same(a, b):
  """Same paths, dtypes and values (exactly)."""
  fa, fb = models.flatten_params(a), models.flatten_params(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    assert fa[k].dtype == fb[k].dtype, k
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
