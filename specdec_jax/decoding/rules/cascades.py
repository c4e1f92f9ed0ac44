"""Speculative cascades as target distributions (Faster Cascades Sec. 4-5).

Deferral rules mix the transformed drafter and verifier distributions,
``T = (1 - delta) S(q) + delta S(p)`` (Chow, Diff, OPT, BiLD*), or defer per
token, ``pi(v) = S(q)(v) (1 - r(v)) + S(p)(v) eta`` (TokenV1-V3). Decisions
read the UNSCALED q and p (App. C.1). Same calling convention as
``targets.py``: ``pi, defer = rule(q, p, sq, sp)`` on [B, K, V] arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding.rules.sampling import per_row
from specdec_jax.decoding.rules.targets import (check_range, entropy,
                                                tv_distance)

# ----------------------------------------------------------------------------
# Speculative cascades
# ----------------------------------------------------------------------------

LOSSES = ("0-1", "log")


def expected_loss(d: jax.Array, loss: str) -> jax.Array:
  """Plug-in expected loss of predicting with d: 1 - max d (0-1) or H(d)."""
  if loss == "0-1":
    return 1.0 - jnp.max(d, axis=-1)
  return entropy(d)


def _mix(delta: jax.Array, sq: jax.Array, sp: jax.Array) -> jax.Array:
  d = delta[..., None]
  return (1.0 - d) * sq + d * sp


class _Cascade:
  """Shared by the cascade rules: ``T = (1 - delta) S(q) + delta S(p)``.

  Subclasses define ``deferral(q, p, sq, sp) -> delta [B, K]``.
  """

  def __call__(self, q, p, sq, sp):
    delta = self.deferral(q, p, sq, sp)
    return _mix(delta, sq, sp), delta

  def _alpha(self, ndim: int) -> jax.Array:
    return per_row(jnp.asarray(self.alpha, jnp.float32), ndim)


@struct.dataclass
class Chow(_Cascade):
  """SpecCascade[Chow]: defer when the drafter is unsure.

  ``delta = 1[L(q) > alpha]``; with the 0-1 loss ``1[max q < 1 - alpha]``.
  Target ``(1 - delta) S(q) + delta S(p)``.

  Attributes:
    alpha: [] or [B]; 0-1 loss: in [0, 1] (1 never defers).
    loss: static '0-1' or 'log' (entropy plug-in, App. D).
  """

  alpha: jax.Array = 0.5
  loss: str = struct.field(pytree_node=False, default="0-1")
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def deferral(self, q, p, sq, sp):
    alpha = self._alpha(q.ndim - 1)
    return (expected_loss(q, self.loss) > alpha).astype(jnp.float32)

  def validate(self) -> None:
    _validate_loss(self.loss)
    if self.loss == "0-1":
      check_range("Chow alpha", self.alpha, 0.0, 1.0)
    else:
      check_range("Chow alpha", self.alpha, 0.0, float("inf"), hi_open=True)


@struct.dataclass
class Diff(_Cascade):
  """SpecCascade[Diff]: ``delta = 1[L(q) > L(p) + alpha]``.

  0-1 loss: ``1[max q < max p - alpha]``. Implementable speculatively
  because p is computed in parallel.

  Attributes:
    alpha: [] or [B] real (0-1 loss: [-1, 1]).
    loss: static '0-1' or 'log'.
  """

  alpha: jax.Array = 0.0
  loss: str = struct.field(pytree_node=False, default="0-1")
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def deferral(self, q, p, sq, sp):
    alpha = self._alpha(q.ndim - 1)
    return (expected_loss(q, self.loss) >
            expected_loss(p, self.loss) + alpha).astype(jnp.float32)

  def validate(self) -> None:
    _validate_loss(self.loss)
    bound = 1.0 if self.loss == "0-1" else float("inf")
    check_range("Diff alpha", self.alpha, -bound, bound,
                 lo_open=bound == float("inf"), hi_open=bound == float("inf"))


@struct.dataclass
class OPT(_Cascade):
  """SpecCascade[OPT], the plug-in of the optimal rule (Lemma 4).

  ``delta = 1[L(q) > L(p) + alpha * D_TV(S(p), S(q))]`` (TV between the
  transformed distributions, App. C.1); 0-1 loss: ``1[max q < max p - alpha
  * D_TV]``.

  Attributes:
    alpha: [] or [B] >= 0.
    loss: static '0-1' or 'log'.
  """

  alpha: jax.Array = 0.0
  loss: str = struct.field(pytree_node=False, default="0-1")
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def deferral(self, q, p, sq, sp):
    alpha = self._alpha(q.ndim - 1)
    gap = alpha * tv_distance(sp, sq)
    return (expected_loss(q, self.loss) >
            expected_loss(p, self.loss) + gap).astype(jnp.float32)

  def validate(self) -> None:
    _validate_loss(self.loss)
    check_range("OPT alpha", self.alpha, 0.0, float("inf"), hi_open=True)


@struct.dataclass
class BiLDStar(_Cascade):
  """BiLD* (stochastic BiLD via Alg. 4): defer when q and p disagree.

  ``delta = 1[D(q, p) > alpha]`` with D the total-variation distance ('tv')
  or KL(p || q) ('kl') of the unscaled distributions.

  Attributes:
    alpha: [] or [B] >= 0.
    divergence: static 'tv' or 'kl'.
  """

  alpha: jax.Array = 0.3
  divergence: str = struct.field(pytree_node=False, default="tv")
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def deferral(self, q, p, sq, sp):
    alpha = self._alpha(q.ndim - 1)
    if self.divergence == "tv":
      dist = tv_distance(p, q)
    else:
      safe_q = jnp.maximum(q, 1e-30)
      dist = jnp.sum(jnp.where(p > 0, p * (jnp.log(jnp.where(p > 0, p, 1.0))
                                          - jnp.log(safe_q)), 0.0), axis=-1)
    return (dist > alpha).astype(jnp.float32)

  def validate(self) -> None:
    if self.divergence not in ("tv", "kl"):
      raise ValueError(f"BiLDStar divergence must be 'tv' or 'kl', got "
                       f"{self.divergence!r}")
    check_range("BiLDStar alpha", self.alpha, 0.0, float("inf"),
                 hi_open=True)


def _validate_loss(loss: str) -> None:
  if loss not in LOSSES:
    raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")


# ----------------------------------------------------------------------------
# Token-specific speculative cascades (Sec. 5, Alg. 6)
# ----------------------------------------------------------------------------


def _token_target(r, sq, sp):
  """pi(v) = S(q)(v) (1 - r(v)) + S(p)(v) eta, eta = sum r S(q)."""
  eta = jnp.sum(r * sq, axis=-1)  # [B, K]
  return sq * (1.0 - r) + sp * eta[..., None], eta


class _TokenSpecific:
  """Shared by V1-V3: ``pi(v) = S(q)(v) (1 - r(v)) + S(p)(v) eta``.

  Subclasses define ``rule(q, p, alpha) -> r [B, K, V] bool`` (True where
  token v is deferred) and ``ALPHA_RANGE``.
  """

  ALPHA_RANGE = (-1.0, 1.0)

  def __call__(self, q, p, sq, sp):
    alpha = per_row(jnp.asarray(self.alpha, jnp.float32), q.ndim)
    return _token_target(self.rule(q, p, alpha).astype(jnp.float32), sq, sp)

  def validate(self) -> None:
    check_range(f"{type(self).__name__} alpha", self.alpha,
                 *self.ALPHA_RANGE)


@struct.dataclass
class TokenV1(_TokenSpecific):
  """Token-specific rule V1: ``r(v) = 1[q(v) < max p - alpha]``.

  Attributes:
    alpha: [] or [B] in [-1, 1].
  """

  alpha: jax.Array = 0.0
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def rule(self, q, p, alpha):
    return q < jnp.max(p, axis=-1, keepdims=True) - alpha


@struct.dataclass
class TokenV2(_TokenSpecific):
  """Token-specific rule V2: ``r(v) = 1[p(v) < max p - alpha]``.

  Attributes:
    alpha: [] or [B] in [-1, 1].
  """

  alpha: jax.Array = 0.0
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def rule(self, q, p, alpha):
    return p < jnp.max(p, axis=-1, keepdims=True) - alpha


@struct.dataclass
class TokenV3(_TokenSpecific):
  """Token-specific rule V3: ``r(v) = 1[p(v) < (1 - alpha) max p]``.

  At temperature 0 this is exactly :class:`LossyGreedy` (Lemma 7).

  Attributes:
    alpha: [] or [B] in [0, 1].
  """

  ALPHA_RANGE = (0.0, 1.0)

  alpha: jax.Array = 0.0
  needs_drafter_at_bonus: bool = struct.field(pytree_node=False, default=True)
  normalized: bool = struct.field(pytree_node=False, default=True)

  def rule(self, q, p, alpha):
    return p < (1.0 - alpha) * jnp.max(p, axis=-1, keepdims=True)
