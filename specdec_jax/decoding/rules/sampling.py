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

import math
from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax


def per_row(x: jax.Array, ndim: int) -> jax.Array:
  """Reshapes a [] or [B] knob so it broadcasts against a rank-``ndim`` array
  whose first axis is the batch: [B] -> [B, 1, ..., 1]."""
  x = jnp.asarray(x)
  return x.reshape(x.shape + (1,) * (ndim - x.ndim)) if x.ndim else x


def unscaled(logits: jax.Array) -> jax.Array:
  """softmax at temperature 1, no truncation: [..., V] -> [..., V] float32."""
  return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)


def argmax(x: jax.Array) -> jax.Array:
  """Index of the first maximum over the last axis: [..., V] -> [...] int32.

  Same result as ``jnp.argmax`` on finite input, computed with two plain
  reductions (max, then min over matching indices), which XLA:CPU vectorises;
  its variadic arg-reduction is 3x slower on decode-sized vocabularies. A row
  with a NaN yields V - 1 (NaN rows are flagged by the decode loop anyway).
  """
  v = x.shape[-1]
  top = jnp.max(x, axis=-1, keepdims=True)
  iota = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.minimum(jnp.min(jnp.where(x == top, iota, v), axis=-1), v - 1)


def _one_hot_argmax(logits: jax.Array) -> jax.Array:
  iota = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  return (iota == argmax(logits)[..., None]).astype(jnp.float32)


# Lean paths (the default): when every row is greedy (or every row samples)
# the work of the other kind is skipped with a ``lax.cond`` -- no softmax
# over V for a greedy batch, no argmax for a sampling one; the chain kernel
# draws its one token with one inverse-CDF search. Outputs are identical
# either way; ``LEAN = False`` (read at trace time) restores the reference
# computation, for benchmarks' before/after tables.
LEAN = True


def _tempered(logits: jax.Array, temperature) -> jax.Array:
  """Softmax at per-row temperature; rows with temperature 0 -> one-hot."""
  t = per_row(jnp.asarray(temperature, jnp.float32), logits.ndim)
  logits = logits.astype(jnp.float32)
  hot = t > 0

  def mixed(logits):
    soft = jax.nn.softmax(logits / jnp.where(hot, t, 1.0), axis=-1)
    return jnp.where(hot, soft, _one_hot_argmax(logits))

  if not LEAN:
    return mixed(logits)
  soft = lambda x: jax.nn.softmax(x / jnp.where(hot, t, 1.0), axis=-1)
  branch = jnp.where(jnp.all(~hot), 0, jnp.where(jnp.all(hot), 1, 2))
  return lax.switch(branch, (_one_hot_argmax, soft, mixed), logits)


def is_cold(strategy) -> jax.Array:
  """[] bool: every row of ``strategy`` is greedy (temperature 0; traced)."""
  t = getattr(strategy, "temperature", None)
  return (jnp.asarray(True) if t is None and isinstance(strategy, Greedy)
          else jnp.all(jnp.asarray(t, jnp.float32) == 0))


def draw(key, logits: jax.Array, strategy) -> jax.Array:
  """``sample(key, strategy.probs(logits))``: [B] keys, [B, V] -> [B].

  A greedy batch takes the argmax directly (``sample`` of a one-hot row is
  its argmax, so the tokens are the same) and skips the V-wide transform
  and search.

  Args:
    key: [B] typed keys, or a function ``() -> [B] keys``; a function is
      called only on the sampling branch, so a greedy batch derives no key
      at all (each derivation is a few threefry hashes; ``keys.py`` keeps
      them loop-free on CPU).
    logits: [B, V].
    strategy: the sampling transform S.

  Returns:
    [B] int32 tokens.
  """
  keys = key if callable(key) else lambda: key
  full = lambda: sample(keys(), strategy.probs(logits))
  if not LEAN or getattr(strategy, "temperature", None) is None:
    return full()
  return lax.cond(is_cold(strategy), lambda: argmax(logits), full)


def _descending(probs: jax.Array) -> jax.Array:
  return -jnp.sort(-probs, axis=-1)


def _renorm(probs: jax.Array, keep: jax.Array) -> jax.Array:
  kept = jnp.where(keep, probs, 0.0)
  return kept / jnp.sum(kept, axis=-1, keepdims=True)


class SamplingStrategy(Protocol):
  """A sampling transform: logits [..., V] -> S(distribution) [..., V].

  Its traced fields are knobs ([] or [B]); ``canonical`` maps every
  strategy to the one that runs (Greedy() runs as Temperature(0)).
  """

  def probs(self, logits: jax.Array) -> jax.Array:
    ...

  def validate(self) -> None:
    ...


@struct.dataclass
class Greedy:
  """S(d) = one-hot(argmax d) for every row.

  Runs as ``Temperature(0)`` (see :func:`canonical`): greedy and sampled
  rows share one compiled program.
  """

  def probs(self, logits: jax.Array) -> jax.Array:
    """[B, ..., V] logits -> [B, ..., V] one-hot float32."""
    return _one_hot_argmax(logits)

  def validate(self) -> None:
    return None


def _check_temperature(t) -> None:
  t = np.asarray(t, np.float32)  # on the host: no device program compiled
  if not bool(np.all(np.isfinite(t))) or bool(np.any(t < 0)):
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
    # is still < p (the first entry is always kept; p >= 1 keeps every
    # entry exactly, whatever float32 rounding does to the cumulative sum).
    kept = (before < p) | (p >= 1.0) | (jnp.arange(srt.shape[-1]) == 0)
    threshold = jnp.min(jnp.where(kept, srt, jnp.inf), axis=-1, keepdims=True)
    return _renorm(probs, probs >= threshold)

  def validate(self) -> None:
    _check_temperature(self.temperature)
    p = jnp.asarray(self.p)
    if bool(jnp.any(~(p > 0) | ~(p <= 1))):
      raise ValueError(f"top_p must be in (0, 1], got {p.tolist()}")


def _block_size(v: int) -> int:
  """Power of two near sqrt(v): the inner width of the two-level search."""
  return max(4, 1 << max(0, round(math.log2(max(v, 1)) / 2)))


def _first_above(cdf: jax.Array, mass: jax.Array, x: jax.Array) -> jax.Array:
  """First index with positive mass whose prefix sum exceeds x, else the
  last index with positive mass (rounding), else 0 (an all-zero row).

  Args:
    cdf: [B, N] prefix sums of ``mass``.
    mass: [B, N] non-negative weights.
    x: [B, 1] search values.

  Returns:
    [B] int32 indices.
  """
  n = mass.shape[-1]
  iota = lax.broadcasted_iota(jnp.int32, mass.shape, 1)
  first = jnp.min(jnp.where((cdf > x) & (mass > 0), iota, n), axis=-1)
  last = jnp.max(jnp.where(mass > 0, iota, 0), axis=-1)
  return jnp.where(first < n, first, last)


def sample(key: jax.Array, dist: jax.Array) -> jax.Array:
  """Draws one token per row from an (unnormalised) distribution.

  Inverse-CDF sampling with a single uniform per row: token i is picked with
  probability dist[i] / sum(dist); no normalisation is needed, a zero-mass
  entry is never picked (unless the whole row is zero: index 0), and a
  one-hot row always yields its argmax, so greedy decoding needs no special
  case. One random number per row instead of one per vocabulary entry keeps
  sampling cheap next to the model calls.

  The search is two-level so that no vocabulary-wide prefix sum is needed
  (XLA:CPU lowers ``cumsum`` to a slow reduce-window): the vocabulary is cut
  into blocks of about sqrt(V) entries; a prefix sum over the block masses
  picks the block that holds ``x = u * total``, and a prefix sum inside that
  block picks the token. Rounding can leave x past the last prefix sum; the
  last block / entry with positive mass is taken then, and an entry
  without mass is never taken even where rounding breaks monotonicity.

  Args:
    key: [B] typed PRNG keys, one per row.
    dist: [B, V] non-negative weights.

  Returns:
    [B] int32 token ids.
  """
  u = jax.vmap(lambda k: jax.random.uniform(k, ()))(key)  # [B]
  return sample_at(u, dist)


def sample_at(u: jax.Array, dist: jax.Array) -> jax.Array:
  """``sample`` with the rows' uniforms given: u [B] in [0, 1), dist [B, V]
  -> [B] int32 (``sample(key, d) == sample_at(uniform(key), d)``)."""
  dist = jnp.maximum(dist.astype(jnp.float32), 0.0)
  b, v = dist.shape
  bs = _block_size(v)
  padded = jnp.pad(dist, ((0, 0), (0, (-v) % bs)))
  blocks = padded.reshape(b, -1, bs)  # [B, nb, bs]
  mass = jnp.sum(blocks, axis=-1)  # [B, nb]
  upto = jnp.cumsum(mass, axis=-1)  # [B, nb] inclusive block prefix sums
  before = jnp.concatenate([jnp.zeros_like(upto[:, :1]), upto[:, :-1]], 1)
  x = (u * upto[:, -1])[:, None]  # [B, 1] in [0, total)
  blk = _first_above(upto, mass, x)  # before[blk] <= x < upto[blk]
  inner = jnp.take_along_axis(blocks, blk[:, None, None], axis=1)[:, 0]
  cdf = jnp.take_along_axis(before, blk[:, None], axis=1) + jnp.cumsum(
      inner, axis=-1)  # [B, bs]
  j = _first_above(cdf, inner, x)
  return (blk * bs + j).astype(jnp.int32)


def canonical(strategy) -> "Temperature | TopK | TopP":
  """The strategy that runs: Greedy() is Temperature(0) (one program)."""
  if isinstance(strategy, Greedy):
    return Temperature(0.0)
  return strategy


def is_greedy(strategy) -> bool:
  """True when every row of ``strategy`` (concrete knobs) is greedy."""
  if isinstance(strategy, Greedy):
    return True
  t = getattr(strategy, "temperature", None)
  return t is not None and bool(jnp.all(jnp.asarray(t) == 0))
