"""Sampling transforms S(.): greedy, temperature, top-k, top-p.

Each strategy is a small frozen pytree (``flax.struct.dataclass``). Its knobs
are *leaves*, traced by ``jit``: changing a temperature or a top-p value never
recompiles, and every knob may be a scalar or a per-row ``[batch]`` array.
Temperature 0 means greedy (one-hot argmax) for that row.

Semantics follow HF transformers' warpers: temperature first, then top-k
(ties with the k-th value are kept), then top-p (the smallest set of most
likely tokens whose mass reaches p, ties kept). ``probs`` returns the
transformed distribution S(d); ``softmax`` of raw logits is the *unscaled*
distribution that deferral rules use (App. C.1 of Faster Cascades).
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
from flax import struct


def per_row(x: jax.Array, ndim: int) -> jax.Array:
  """Reshapes a [] or [B] knob so it broadcasts against a rank-``ndim`` array
  whose first axis is the batch: [B] -> [B, 1, ..., 1]."""
  x = jnp.asarray(x)
  return x.reshape(x.shape + (1,) * (ndim - x.ndim)) if x.ndim else x


def unscaled(logits: jax.Array) -> jax.Array:
  """softmax at temperature 1, no truncation: [..., V] -> [..., V] float32."""
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def _one_hot_argmax(logits: jax.Array) -> jax.Array:
  return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1],
                        dtype=jnp.float32)


def _tempered(logits: jax.Array, temperature) -> jax.Array:
  """Softmax at per-row temperature; rows with temperature 0 -> one-hot."""
  t = per_row(jnp.asarray(temperature, jnp.float32), logits.ndim)
  logits = logits.astype(jnp.float32)
  hot = t > 0
  soft = jax.nn.softmax(logits / jnp.where(hot, t, 1.0), axis=-1)
  return jnp.where(hot, soft, _one_hot_argmax(logits))


def _descending(probs: jax.Array) -> jax.Array:
  return -jnp.sort(-probs, axis=-1)


def _renorm(probs: jax.Array, keep: jax.Array) -> jax.Array:
  kept = jnp.where(keep, probs, 0.0)
  return kept / jnp.sum(kept, axis=-1, keepdims=True)


class SamplingStrategy(Protocol):
  """A sampling transform: logits [..., V] -> S(distribution) [..., V]."""

  def probs(self, logits: jax.Array) -> jax.Array:
    ...

  def validate(self) -> None:
    ...


@struct.dataclass
class Greedy:
  """S(d) = one-hot(argmax d) for every row."""

  def probs(self, logits: jax.Array) -> jax.Array:
    """[B, ..., V] logits -> [B, ..., V] one-hot float32."""
    return _one_hot_argmax(logits)

  def validate(self) -> None:
    return None


def _check_temperature(t) -> None:
  t = jnp.asarray(t)
  if not bool(jnp.all(jnp.isfinite(t))) or bool(jnp.any(t < 0)):
    raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), "
                     f"got {t.tolist()}")


@struct.dataclass
class Temperature:
  """softmax(logits / temperature); temperature 0 -> greedy.

  Attributes:
    temperature: [] or [B] float, >= 0.
  """

  temperature: jax.Array = 1.0

  def probs(self, logits: jax.Array) -> jax.Array:
    """[B, ..., V] logits -> [B, ..., V] float32 probabilities."""
    return _tempered(logits, self.temperature)

  def validate(self) -> None:
    _check_temperature(self.temperature)


@struct.dataclass
class TopK:
  """Keep the k most likely tokens (ties kept), after temperature.

  Attributes:
    k: [] or [B] int, >= 1.
    temperature: [] or [B] float, >= 0.
  """

  k: jax.Array = 40
  temperature: jax.Array = 1.0

  def probs(self, logits: jax.Array) -> jax.Array:
    """[B, ..., V] logits -> [B, ..., V] float32 probabilities."""
    probs = _tempered(logits, self.temperature)
    k = per_row(jnp.asarray(self.k, jnp.int32), probs.ndim)
    k = jnp.clip(k, 1, probs.shape[-1])
    kth = jnp.take_along_axis(_descending(probs),
                              jnp.broadcast_to(k - 1, probs.shape[:-1] + (1,)),
                              axis=-1)  # [..., 1]
    return _renorm(probs, probs >= kth)

  def validate(self) -> None:
    _check_temperature(self.temperature)
    k = jnp.asarray(self.k)
    if not jnp.issubdtype(k.dtype, jnp.integer) or bool(jnp.any(k < 1)):
      raise ValueError(f"top_k must be an integer >= 1, got {k.tolist()}")


@struct.dataclass
class TopP:
  """Nucleus sampling: smallest top set with mass >= p (ties kept).

  Attributes:
    p: [] or [B] float in (0, 1]; 1 keeps everything.
    temperature: [] or [B] float, >= 0.
  """

  p: jax.Array = 0.9
  temperature: jax.Array = 1.0

  def probs(self, logits: jax.Array) -> jax.Array:
    """[B, ..., V] logits -> [B, ..., V] float32 probabilities."""
    probs = _tempered(logits, self.temperature)
    p = per_row(jnp.asarray(self.p, jnp.float32), probs.ndim)
    srt = _descending(probs)
    before = jnp.cumsum(srt, axis=-1) - srt  # mass strictly above each entry
    # Smallest kept probability: the last sorted entry whose preceding mass
    # is still < p (the first entry is always kept).
    kept = (before < p) | (jnp.arange(srt.shape[-1]) == 0)
    threshold = jnp.min(jnp.where(kept, srt, jnp.inf), axis=-1, keepdims=True)
    return _renorm(probs, probs >= threshold)

  def validate(self) -> None:
    _check_temperature(self.temperature)
    p = jnp.asarray(self.p)
    if bool(jnp.any(~(p > 0) | ~(p <= 1))):
      raise ValueError(f"top_p must be in (0, 1], got {p.tolist()}")


def sample(key: jax.Array, dist: jax.Array) -> jax.Array:
  """Draws one token per row from an (unnormalised) distribution.

  Inverse-CDF sampling with a single uniform per row: token i is picked with
  probability dist[i] / sum(dist); no normalisation is needed, a zero-mass
  entry is never picked (unless the whole row is zero: index 0), and a
  one-hot row always yields its argmax, so greedy decoding needs no special
  case. One random number per row instead of one per vocabulary entry keeps
  sampling cheap next to the model calls.

  Args:
    key: [B] typed PRNG keys, one per row.
    dist: [B, V] non-negative weights.

  Returns:
    [B] int32 token ids.
  """
  dist = jnp.maximum(dist.astype(jnp.float32), 0.0)
  cdf = jnp.cumsum(dist, axis=-1)  # [B, V]
  u = jax.vmap(lambda k: jax.random.uniform(k, ()))(key)  # [B]
  x = u[:, None] * cdf[:, -1:]  # [B, 1] in [0, total)
  above = cdf > x
  # Rounding can leave x >= cdf[-1]; fall back to the last positive entry.
  last = dist.shape[-1] - 1 - jnp.argmax(dist[:, ::-1] > 0, axis=-1)
  return jnp.where(jnp.any(above, axis=-1), jnp.argmax(above, axis=-1),
                   last).astype(jnp.int32)
