"""The checks ``specdec_jax decode`` runs before a model loads: the settings
and the KV-cache memory of the longest batch (split from ``decode_run.py``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np

from specdec_jax import decoding, program_cache
from specdec_jax.decoding import budget

MAX_POSITIONS = 2**31 - 1  # positions and cache slots are int32


def _bad_int(x, lo: int, hi: int) -> bool:
  return (isinstance(x, bool) or not isinstance(x, (int, np.integer))
          or not lo <= x < hi)


def _is_greedy(sampling) -> bool:
  if isinstance(sampling, decoding.Greedy):
    return True
  t = getattr(sampling, "temperature", None)
  return t is not None and bool(np.all(np.asarray(t) == 0))


def check_settings(method, sampling, gamma, max_new_tokens, batch_size,
                   seed) -> None:
  """Validates the decode knobs; raises ValueError (nothing is loaded).

  Args:
    method: a decoding method object (its knobs are validated).
    sampling: a sampling strategy (validated).
    gamma: draft block size, an integer >= 1.
    max_new_tokens: an integer in [1, 2**31 - 1).
    batch_size: an integer >= 1.
    seed: an integer in [0, 2**32).
  """
  if not hasattr(method, "program"):
    raise ValueError(f"method must be a decoding method object (see "
                     f"decoding.make_method), got {type(method).__name__}")
  method.validate()
  if not hasattr(sampling, "probs"):
    raise ValueError(f"sampling must be a strategy (Greedy, Temperature, "
                     f"TopK, TopP), got {type(sampling).__name__}")
  sampling.validate()
  if method.greedy_only and not _is_greedy(sampling):
    name = type(getattr(method, "target", method)).__name__
    hint = (" (for sampling, TokenV3 generalises LossyGreedy)"
            if name == "LossyGreedy" else "")
    raise ValueError(f"{name} is a greedy method (temperature 0 only); set "
                     f"TEMPERATURE = 0{hint}")
  if _bad_int(gamma, 1, 1025):
    raise ValueError(f"gamma must be an integer in [1, 1024], got {gamma!r}")
  if _bad_int(max_new_tokens, 1, MAX_POSITIONS):
    raise ValueError(f"max_new_tokens must be an integer in [1, 2**31 - 1), "
                     f"got {max_new_tokens!r}")
  if _bad_int(batch_size, 1, 2**20):
    raise ValueError(f"batch_size must be an integer >= 1, got "
                     f"{batch_size!r}")
  if _bad_int(seed, 0, 2**32):
    raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r} "
                     f"(negative seeds are not accepted: they would wrap "
                     f"around)")


def _tree_bytes(tree) -> int:
  return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def cache_bytes(model, batch: int, length: int, src_len: int = 1) -> int:
  """Bytes of ``model``'s KV cache for ``batch`` rows x ``length`` slots.

  Computed with ``jax.eval_shape``: nothing is allocated (and read from
  ``program_cache`` when it is on and a run already sized it).
  """
  def build(params):
    if model.is_encoder_decoder:
      enc = model.encode(params, jax.numpy.zeros((batch, src_len),
                                                 jax.numpy.int32))
      return model.init_cache(batch, length, enc)
    return model.init_cache(batch, length)
  compute = lambda: _tree_bytes(jax.eval_shape(build, model.param_shapes()))
  key = program_cache.stable_repr(model)
  if key is None:
    return compute()
  return program_cache.memo("cache_bytes", f"{key}|{batch}|{length}|"
                            f"{src_len}", compute)


def available_memory() -> tuple[int, str]:
  """(bytes, what) this process may still use (``decoding.budget``)."""
  have, what = budget.available()
  return (have if have is not None else 2**62), what


def check_memory(models_: Sequence[Any], batch: int, width: int,
                 src_len: int, max_new_tokens: int, gamma: int,
                 memory: tuple[int, str] | None = None,
                 cache_only: Sequence[Any] = ()) -> int:
  """Raises ValueError when parameters + KV caches cannot fit in memory.

  Args:
    models_: the model objects that run (verifier, and the drafter if used).
    batch: rows per call.
    width: padded prompt width (decoder-only) or 1 (encoder-decoder).
    src_len: padded encoder input width (encoder-decoder) or 1.
    max_new_tokens, gamma: the budget and block size (cache slack).
    memory: (bytes, what) to compare with (default :func:`available_memory`).
    cache_only: models whose caches count but whose parameters are another
      model's (a hierarchy's early exits).

  Returns:
    The bytes needed.
  """
  slots = budget.capacity(width, max_new_tokens, gamma)
  if slots >= MAX_POSITIONS:
    raise ValueError(f"max_new_tokens={max_new_tokens} is too large: prompt "
                     f"({width}) + max_new_tokens + gamma + 2 = {slots} cache "
                     f"positions, more than int32 positions allow (2**31 - 1)")
  need = sum(_tree_bytes(m.param_shapes()) + cache_bytes(m, batch, slots,
                                                          src_len)
             for m in models_) + sum(cache_bytes(m, batch, slots, src_len)
                                     for m in cache_only)
  budget.check(need, f"max_new_tokens={max_new_tokens} with batch {batch}",
               f"the parameters and KV caches ({slots} cache slots per row)",
               "lower MAX_NEW_TOKENS or BATCH_SIZE",
               memory or available_memory())
  return need


__all__ = ["available_memory", "cache_bytes", "check_memory",
           "check_settings"]
