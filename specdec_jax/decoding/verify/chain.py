"""The chain verification kernel of generic speculative sampling (Alg. 4).

Pure array code on one fixed-shape block: no model, no loop, no Python branch
on data. A chain is the one-branch case of tree verification (``tree.py``):
with one child per node the recursive rejection walk stops at the first
rejected draft, so acceptance is decided for all gamma positions at once and
the first rejection per row is found with a cumulative product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.targets import Target, effective, residual


@struct.dataclass
class BlockResult:
  """Outcome of verifying one block.

  Attributes:
    accepted: [B] int32, number n of leading drafts accepted (0..gamma).
    token: [B] int32, the token emitted at position n: the residual sample
      after a rejection, or the bonus token when all gamma were accepted.
    defer: [B, gamma + 1] float32 deferral mass of each position.
    accept: [B, gamma] bool outcome of each draft's accept test (drafts
      after the first rejection are tested but not used).
    pi: [B, gamma + 1, V] the target T(q, p) at every position.
  """

  accepted: jax.Array
  token: jax.Array
  defer: jax.Array
  accept: jax.Array | None = None
  pi: jax.Array | None = None


def _next_token(target: Target, pi: jax.Array, sq: jax.Array, sp: jax.Array,
                accepted: jax.Array, forced: jax.Array, key_residual: jax.Array,
                key_bonus: jax.Array, limit: jax.Array | None,
                gamma: int) -> jax.Array:
  """[B] the token :func:`verify_block` emits after ``accepted`` drafts:
  the residual draw at position n < gamma (S(p) where ``forced``), else the
  bonus draw at position gamma (shapes as in ``verify_block``)."""
  # Distribution of the token at position n (clamped: unused if n == gamma).
  at = jnp.minimum(accepted, gamma - 1)[:, None, None]  # [B, 1, 1]
  pi_n = jnp.take_along_axis(pi, at, axis=1)[:, 0]  # [B, V]
  sq_n = jnp.take_along_axis(sq, at, axis=1)[:, 0]
  res_dist = residual(pi_n, sq_n)
  # A residual with no mass (rounding when pi ~= sq) falls back to pi.
  res_dist = jnp.where(jnp.sum(res_dist, -1, keepdims=True) > 0, res_dist,
                       pi_n)
  if limit is not None:
    sp_n = jnp.take_along_axis(sp, at, axis=1)[:, 0]
    res_dist = jnp.where(forced[:, None], sp_n, res_dist)
  bonus_dist = pi[:, gamma]
  if not target.normalized:
    bonus_dist = effective(pi[:, gamma], sq[:, gamma])
  key_n = jax.vmap(jax.random.fold_in)(key_residual, accepted)
  if sampling.LEAN:  # one search: the row's residual or bonus, same token
    uniform = jax.vmap(lambda k: jax.random.uniform(k, ()))
    rejected = accepted < gamma  # [B]
    token = sampling.sample_at(
        jnp.where(rejected, uniform(key_n), uniform(key_bonus)),
        jnp.where(rejected[:, None], res_dist, bonus_dist))
  else:
    res_tok = sampling.sample(key_n, res_dist)
    bonus_tok = sampling.sample(key_bonus, bonus_dist)
    token = jnp.where(accepted < gamma, res_tok, bonus_tok)
  return token


def verify_block(target: Target, drafts: jax.Array, q: jax.Array,
                 p: jax.Array, sq: jax.Array, sp: jax.Array, u: jax.Array,
                 key_residual: jax.Array, key_bonus: jax.Array,
                 limit: jax.Array | None = None) -> BlockResult:
  """Accept/reject gamma drafts against pi = T(q, p) and pick the next token.

  Draft x_j (drawn from S(q)_j) is accepted iff ``u_j * S(q)_j(x_j) <
  pi_j(x_j)`` with u_j ~ U[0, 1), i.e. with probability min(1, pi/S(q)).
  With n the number of leading accepts, the emitted token is drawn from
  ``norm(max(0, pi_n - S(q)_n))`` if n < gamma, else (bonus) from the
  effective law at position gamma (= pi_gamma when pi is a distribution).

  Worked example (gamma = 2, vocabulary {0, 1, 2}, target SpecDecode so
  pi = S(p)); the test suite runs exactly these numbers:

      drafts = [[1, 2]]
      S(q)   = [[[.2, .5, .3], [.1, .3, .6], [1/3, 1/3, 1/3]]]
      S(p)   = [[[.1, .6, .3], [.5, .4, .1], [.0, .0, 1.]]]
      u      = [[.9, .5]]
      position 0: u*q(1) = .45 < p(1) = .6         -> accept
      position 1: u*q(2) = .30 >= p(2) = .1        -> reject
      residual = norm(max(0, p_1 - q_1)) = norm([.4, .1, 0]) = [.8, .2, 0]
      => accepted = 1, token ~ [.8, .2, 0] (a RESIDUAL-stream draw).
  With u = [[.9, .1]] both drafts pass (.1*.6 = .06 < .1) and the token is
  the bonus drawn from S(p)_2 = one-hot(2), i.e. 2.

  Args:
    target: the target distribution T.
    drafts: [B, gamma] int32 drafted tokens.
    q: [B, gamma + 1, V] unscaled drafter distributions (the last row is
      read only when ``target.needs_drafter_at_bonus``).
    p: [B, gamma + 1, V] unscaled verifier distributions.
    sq: [B, gamma + 1, V] transformed drafter distributions (drafts were
      sampled from these).
    sp: [B, gamma + 1, V] transformed verifier distributions.
    u: [B, gamma] float32 uniforms in [0, 1).
    key_residual: [B] keys of the block's residual draw; the number of
      accepted drafts is folded in, so each outcome has its own stream.
    key_bonus: [B] keys for the bonus draw (the DRAFT stream at output
      position gamma of the block, where no draft was made).
    limit: optional [B] int32 (BiLD fallback): drafts from this position on
      were never proposed; at most ``limit`` are accepted and, if the test
      would have accepted more, the token at ``limit`` is drawn from S(p).

  Returns:
    BlockResult.
  """
  gamma = drafts.shape[1]
  pi, defer = target(q, p, sq, sp)  # [B, g+1, V], [B, g+1]
  take = lambda d, idx: jnp.take_along_axis(d, idx[..., None], axis=-1)[..., 0]
  pi_x = take(pi[:, :gamma], drafts)  # [B, g]
  sq_x = take(sq[:, :gamma], drafts)  # [B, g]
  accept = u * sq_x < pi_x  # [B, g]
  accepted = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)
  forced = jnp.zeros_like(accepted, bool)
  if limit is not None:
    forced = accepted > limit
    accepted = jnp.minimum(accepted, limit)

  token = _next_token(target, pi, sq, sp, accepted, forced, key_residual,
                      key_bonus, limit, gamma)  # [B]
  return BlockResult(accepted=accepted.astype(jnp.int32), token=token,
                     defer=defer, accept=accept, pi=pi)

