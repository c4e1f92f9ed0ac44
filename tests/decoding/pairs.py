"""Tiny random model pairs for decoding tests.

The drafter is the verifier with noisy weights, so their greedy choices agree
often but not always (a meaningful acceptance rate), exactly as a distilled
drafter would.
"""

import functools

import jax
import numpy as np

from specdec_jax import models


def _noisy(params, seed, scale):
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  noisy = [x + scale * jax.random.normal(k, x.shape, x.dtype) * (
      np.std(np.asarray(x)) + 1e-3) for x, k in zip(leaves, keys)]
  return jax.tree.unflatten(tree, noisy)


def _scale_query_kernels(tree, factor: float) -> None:
  """Multiplies every T5 attention 'query' kernel of ``tree`` in place."""
  for k, v in tree.items():
    if k == "query" and isinstance(v, dict) and "kernel" in v:
      v["kernel"] = v["kernel"] * factor
    elif isinstance(v, dict):
      _scale_query_kernels(v, factor)


@functools.lru_cache(maxsize=None)
def tiny_pair(family: str, noise: float | None = None):
  """(drafter, verifier, q_params, p_params) for 't5' or 'gemma'."""
  if noise is None:
    noise = {"t5": 0.3, "gemma": 0.05}[family]
  name = {"t5": "t5_tiny", "gemma": "gemma2_tiny"}[family]
  model = models.get_model(name)
  p_params = model.init_params(jax.random.PRNGKey(0))
  # Random tiny models fall into repeating one token; sharper logits and
  # stronger MLPs make their greedy outputs vary with the context.
  if family == "gemma":
    emb = p_params["embedder"]["input_embedding"]
    p_params["embedder"]["input_embedding"] = emb * 3.0
    layers = [v for k, v in p_params.items() if k.startswith("layer_")]
  else:
    # The golden tokens were recorded with query kernels initialised like
    # the keys; T5's init now folds 1/sqrt(head_dim) into them (t5x, HF).
    _scale_query_kernels(p_params, model.config.head_dim ** 0.5)
    layers = [v for k, v in p_params["decoder"].items()
              if k.startswith("layers_")]
  for layer in layers:
    for w in layer["mlp"].values():
      w["kernel"] = w["kernel"] * 3.0
  q_params = _noisy(p_params, 1, noise)
  return model, model, q_params, p_params


def random_prompts(rng, n, vocab, lo=1, hi=9):
  return [list(rng.integers(2, vocab, size=int(rng.integers(lo, hi))))
          for _ in range(n)]
