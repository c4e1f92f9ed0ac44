"""Verification of an all-greedy batch as argmax arithmetic.

When every row of a batch decodes at temperature 0 and the target is
lossless (SpecDecode, no BiLD stop), S(q) and S(p) are one-hot at the
models' argmaxes and every draft is its drafter's argmax, so the accept
tests, residuals and bonus draws of ``chain.verify_block`` and
``tree.verify_tree`` reduce to comparing drafts with the verifier's argmax:
the same result without the V-wide softmaxes, residuals, uniforms and their
keys. The loops pick these kernels with a ``lax.cond`` on the batch's
temperatures (``sampling.is_cold``); tests/decoding/test_lean_paths.py and
test_tree_kernel.py check them against the full kernels.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.targets import SpecDecode, Target
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify.chain import BlockResult


def greedy_verifiable(target: Target, stop) -> bool:
  """Whether the kernels of this module give the full kernels' results for
  an all-greedy batch (static: lossless target, no BiLD stop, the lean
  paths on)."""
  return sampling.LEAN and type(target) is SpecDecode and stop is None


def verify_greedy(drafts: jax.Array, p_logits: jax.Array) -> BlockResult:
  """``chain.verify_block`` of SpecDecode for an all-greedy batch.

  Then S(q) and S(p) are one-hot at the argmaxes and every draft is its
  drafter's argmax, so draft j is accepted iff it is the verifier's argmax
  at j (``u * 1 < 1`` for any u < 1), and the residual after a rejection at
  n, like the bonus at gamma, is one-hot at the verifier's argmax at n: the
  same tokens without the softmaxes, the uniforms and their keys.

  Args:
    drafts: [B, gamma] int32 drafted tokens (the drafter's argmaxes).
    p_logits: [B, gamma + 1, V] verifier logits.

  Returns:
    BlockResult (``pi`` None; ``defer`` zeros).
  """
  gamma = drafts.shape[1]
  best = sampling.argmax(p_logits)  # [B, g + 1]
  accept = drafts == best[:, :gamma]  # [B, g]
  accepted = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)
  token = jnp.take_along_axis(best, accepted[:, None], axis=1)[:, 0]
  return BlockResult(accepted=accepted.astype(jnp.int32),
                     token=token.astype(jnp.int32),
                     defer=jnp.zeros(best.shape, jnp.float32), accept=accept)


def verify_tree_greedy(tokens: jax.Array, tree: dict,
                       p_logits: jax.Array) -> tree_lib.TreeResult:
  """``tree.verify_tree`` of SpecDecode for an all-greedy batch.

  Then pi = S(p) is one-hot at the verifier's argmax a_w of every block
  position, and the residual a parent holds stays ``z * one-hot(a_w)``
  whatever was rejected before (every proposal a greedy drafter's children
  are drawn from puts mass on a_w only through a child equal to a_w). So a
  child passes its test iff its token is a_w (``u * Q(a_w) * z < z`` for
  any u < 1, Q <= 1), the walk takes the first such child, and the token
  after the path is a_cur: the same result without the softmaxes, the
  V-wide residuals of every sibling, the uniforms and their keys.

  Args:
    tokens: [B, N + 1] int32 block tokens (root = pending, then nodes).
    tree: the per-row tree arrays (``tree.tree_arrays``).
    p_logits: [B, N + 1, V] verifier logits.

  Returns:
    tree_lib.TreeResult (``defer`` zeros: SpecDecode defers nothing).
  """
  children = tree["tree.children"]  # [B, W, C]
  d_max = tree["tree.first"].shape[1] - 2
  best = sampling.argmax(p_logits)  # [B, W]
  kids = jnp.take_along_axis(
      tokens[:, 1:], jnp.maximum(children, 0).reshape(children.shape[0], -1),
      axis=1).reshape(children.shape)  # [B, W, C]
  ok = (children >= 0) & (kids == best[..., None])
  n, path, cur, rejected, accept = tree_lib.walk(ok, children, d_max)
  token = jnp.take_along_axis(best, cur[:, None], axis=1)[:, 0]
  return tree_lib.TreeResult(
      accepted=n, path=path, token=token.astype(jnp.int32), rejected=rejected,
      defer=jnp.zeros(path.shape, jnp.float32), accept=accept)
