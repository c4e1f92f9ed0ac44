"""Target distributions T(q, p) for generic speculative sampling (Alg. 4).

Every method is a small frozen pytree. Calling it on one block returns the
target ``pi = T(q, p)`` at every position and the deferral mass there:

    pi, defer = target(q, p, sq, sp)

with ``q, p`` the UNSCALED drafter / verifier distributions (softmax of the raw
logits) on which deferral decisions are computed, and ``sq, sp`` the
TRANSFORMED ones (temperature / top-k / top-p, see ``sampling.py``) that the
target mixes (Faster Cascades, App. C.1). All arrays are [B, K, V]; ``defer``
is [B, K]: the deferral indicator delta for cascade rules, the deferred mass
eta for token-specific rules, 0 for methods that do not defer.

Knobs (alpha, beta) are leaves: traced, scalar or per-row [B]; changing them
never recompiles. Static fields (loss type, whether beta is tuned) select the
program.

``pi`` need not be normalised (Lossy with a fixed beta). The kernel then
follows Alg. 4 literally at drafted positions; its output law there is the
*effective* law ``effective(pi, sq)`` below, and the bonus position is drawn
from that same law so every position follows one token-level process.
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding.rules.sampling import argmax as sampling_argmax
from specdec_jax.decoding.rules.sampling import per_row


class Target(Protocol):
  """Structural type of a target distribution."""

  needs_drafter_at_bonus: bool  # static: pi at the bonus position uses q
  normalized: bool  # static: pi sums to 1 (then effective(pi, .) == pi)

  def __call__(self, q, p, sq, sp) -> tuple[jax.Array, jax.Array]:
    ...

  def validate(self) -> None:
    ...


def tv_distance(a: jax.Array, b: jax.Array) -> jax.Array:
  """0.5 * sum |a - b| over the last axis."""
  return 0.5 * jnp.sum(jnp.abs(a - b), axis=-1)


def entropy(d: jax.Array) -> jax.Array:
  """Shannon entropy (nats) over the last axis; 0 log 0 = 0."""
  return -jnp.sum(jnp.where(d > 0, d * jnp.log(jnp.where(d > 0, d, 1.0)), 0.0),
                  axis=-1)


def residual(pi: jax.Array, sq: jax.Array) -> jax.Array:
  """Unnormalised residual max(0, pi - sq) (sampling normalises it)."""
  return jnp.maximum(pi - sq, 0.0)


def effective(pi: jax.Array, sq: jax.Array) -> jax.Array:
  """Output law of one Alg. 4 position that drafts from sq and targets pi.

  ``min(sq, pi) + (1 - sum min(sq, pi)) * norm(max(0, pi - sq))``; equals pi
  when pi is a distribution. When the residual has no mass (pi <= sq
  everywhere, which happens only through rounding) the rejected mass is
  spread like pi.

  Args:
    pi: [..., V] target (possibly unnormalised).
    sq: [..., V] drafting distribution.

  Returns:
    [..., V] distribution.
  """
  kept = jnp.minimum(sq, pi)
  res = residual(pi, sq)
  z = jnp.sum(res, axis=-1, keepdims=True)
  fallback = pi / jnp.maximum(jnp.sum(pi, axis=-1, keepdims=True), 1e-30)
  res = jnp.where(z > 0, res / jnp.where(z > 0, z, 1.0), fallback)
  return kept + (1.0 - jnp.sum(kept, axis=-1, keepdims=True)) * res


def _zeros_defer(p):
  return jnp.zeros(p.shape[:-1], jnp.float32)


def check_range(name: str, x, lo: float, hi: float, lo_open=False,
                 hi_open=False) -> None:
  x = jnp.asarray(x, jnp.float32)
  ok = jnp.isfinite(x) & (x > lo if lo_open else x >= lo) & (
      x < hi if hi_open else x <= hi)
  if not bool(jnp.all(ok)):
    rng = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    raise ValueError(f"{name} must be in {rng}, got {x.tolist()}")


# ----------------------------------------------------------------------------
# Speculative decoding and its lossy variants
# ----------------------------------------------------------------------------


@struct.dataclass
class SpecDecode:
  """Lossless speculative sampling: T(q, p) = S(p)."""

  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=False)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def __call__(self, q, p, sq, sp):
    return sp, _zeros_defer(p)

  def validate(self) -> None:
    return None


def tuned_beta(a: jax.Array, sp: jax.Array) -> jax.Array:
  """Solves sum_v max(a_v, sp_v / beta) = 1 for beta (exactly, by sorting).

  This is Tran-Thien's choice of beta: the one that makes the lossy target
  ``max(min(sq, sp / (1 - alpha)), sp / beta)`` a distribution, so the
  output law is exactly that target. f(beta) = sum max(a, sp / beta) is
  continuous and decreasing, f(1) >= 1 >= f(inf) = sum a, so the root is
  >= 1. With breakpoints b_v = sp_v / a_v sorted ascending, on the segment
  [b_(k), b_(k+1)] f = A_k + P_k / beta, giving beta = P_k / (1 - A_k).

  Args:
    a: [..., V] min(sq, sp / (1 - alpha)).
    sp: [..., V] transformed verifier distribution.

  Returns:
    [..., 1] beta (inf when sum a == 1 already).
  """
  b = jnp.where(a > 0, sp / jnp.where(a > 0, a, 1.0),
                jnp.where(sp > 0, jnp.inf, 0.0))
  order = jnp.argsort(b, axis=-1)
  b_s = jnp.take_along_axis(b, order, axis=-1)
  a_s = jnp.take_along_axis(a, order, axis=-1)
  p_s = jnp.take_along_axis(sp, order, axis=-1)
  zero = jnp.zeros_like(a_s[..., :1])
  big_a = jnp.concatenate([zero, jnp.cumsum(a_s, axis=-1)], axis=-1)  # A_k
  tail = jnp.sum(p_s, axis=-1, keepdims=True)
  big_p = tail - jnp.concatenate([zero, jnp.cumsum(p_s, axis=-1)], axis=-1)
  lo = jnp.concatenate([zero, b_s], axis=-1)  # b_(k), b_(0) = 0
  hi = jnp.concatenate([b_s, jnp.full_like(zero, jnp.inf)], axis=-1)
  denom = 1.0 - big_a
  beta = jnp.where(denom > 1e-12, big_p / jnp.where(denom > 1e-12, denom, 1.0),
                   jnp.inf)
  valid = (beta >= lo * (1 - 1e-6)) & (beta <= hi * (1 + 1e-6))
  k = jnp.argmax(valid, axis=-1)[..., None]
  return jnp.maximum(jnp.take_along_axis(beta, k, axis=-1), 1.0)


@struct.dataclass
class Lossy:
  """Lossy speculative sampling (Tran-Thien 2023; Faster Cascades Lemma 2).

  ``T(q, p) = max(min(S(q), S(p) / (1 - alpha)), S(p) / beta)``: accept with
  ``min(1, S(p) / ((1 - alpha) S(q)))``, residual ``norm(max(0, S(p)/beta -
  S(q)))``. ``tuned=True`` picks beta per position (Tran-Thien's procedure,
  :func:`tuned_beta`) and ignores the ``beta`` leaf.

  Attributes:
    alpha: [] or [B] in [0, 1); 0 is lossless.
    beta: [] or [B] >= 1 - alpha (the common heuristic is 1).
    tuned: static; solve beta so the target is a distribution.
  """

  alpha: jax.Array = 0.0
  beta: jax.Array = 1.0
  tuned: bool = struct.field(pytree_node=False, default=False)
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)

  @property
  def normalized(self) -> bool:
    return self.tuned

  def __call__(self, q, p, sq, sp):
    alpha = per_row(jnp.asarray(self.alpha, jnp.float32), sp.ndim)
    a = jnp.minimum(sq, sp / (1.0 - alpha))
    if self.tuned:
      beta = tuned_beta(a, sp)
    else:
      beta = per_row(jnp.asarray(self.beta, jnp.float32), sp.ndim)
    return jnp.maximum(a, sp / beta), _zeros_defer(p)

  def validate(self) -> None:
    check_range("Lossy alpha", self.alpha, 0.0, 1.0, hi_open=True)
    if not self.tuned:
      beta = jnp.asarray(self.beta, jnp.float32)
      floor = 1.0 - jnp.asarray(self.alpha, jnp.float32)
      if not bool(jnp.all(jnp.isfinite(beta) & (beta >= floor - 1e-7))):
        raise ValueError(f"Lossy beta must be >= 1 - alpha (= "
                         f"{floor.tolist()}), got {beta.tolist()}")


@struct.dataclass
class LossyGreedy:
  """Leviathan et al.'s lossy greedy rule (App. C.4 of Faster Cascades).

  The greedy draft v = argmax q is accepted iff ``p(v) >= (1 - alpha) max p``
  (unscaled p); otherwise the verifier's argmax replaces it. A greedy method:
  the decode API rejects temperature > 0 with it (use TokenV3 there, which
  equals this rule at temperature 0, Lemma 7).

  Attributes:
    alpha: [] or [B] in [0, 1].
  """

  alpha: jax.Array = 0.0
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def __call__(self, q, p, sq, sp):
    alpha = per_row(jnp.asarray(self.alpha, jnp.float32), p.ndim - 1)
    v = q.shape[-1]
    draft = sampling_argmax(q)  # [B, K]
    p_draft = jnp.take_along_axis(p, draft[..., None], axis=-1)[..., 0]
    ok = p_draft >= (1.0 - alpha) * jnp.max(p, axis=-1)  # [B, K]
    pi = jnp.where(ok[..., None], jax.nn.one_hot(draft, v),
                   jax.nn.one_hot(sampling_argmax(p), v))
    return pi, (~ok).astype(jnp.float32)

  def validate(self) -> None:
    check_range("LossyGreedy alpha", self.alpha, 0.0, 1.0)


@struct.dataclass
class BiLDRollback:
  """The original (deterministic) BiLD rollback rule as a greedy target.

  The greedy draft v is kept iff the verifier's cross-entropy on it is small,
  ``-log p(v) <= alpha`` (unscaled p); otherwise the verifier's argmax
  replaces it. Used with a fallback draft stop (``speculative.FallbackStop``).

  Attributes:
    alpha: [] or [B] >= 0, the rollback threshold alpha_RB.
  """

  alpha: jax.Array = 2.0
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def __call__(self, q, p, sq, sp):
    alpha = per_row(jnp.asarray(self.alpha, jnp.float32), p.ndim - 1)
    v = q.shape[-1]
    draft = sampling_argmax(q)
    p_draft = jnp.take_along_axis(p, draft[..., None], axis=-1)[..., 0]
    ok = -jnp.log(jnp.maximum(p_draft, 1e-30)) <= alpha
    pi = jnp.where(ok[..., None], jax.nn.one_hot(draft, v),
                   jax.nn.one_hot(sampling_argmax(p), v))
    return pi, (~ok).astype(jnp.float32)

  def validate(self) -> None:
    check_range("BiLD rollback alpha", self.alpha, 0.0, float("inf"),
                 hi_open=True)


GREEDY_ONLY = (LossyGreedy, BiLDRollback)
