"""Per-request randomness.

Every random number a row uses is derived from (seed, request id, absolute
output position, purpose) of that row alone, so a request produces the same
tokens whatever batch it sits in, whatever padding surrounds it and however
the batch is sharded. Purposes are separate streams:

* DRAFT: the drafter's sample at an output position, and also the bonus token
  at a position no draft was made for (so a drafter-only decode and a
  speculative decode whose drafts are all accepted emit the same tokens);
* ACCEPT: the uniform of the accept/reject test of the draft at a position;
* RESIDUAL: the replacement drawn from the residual after a rejection.

On XLA:CPU every key derivation and draw is a Threefry-2x32 hash, which JAX
lowers there as a 5-trip ``while`` loop (to keep compiles small); a
sampled chain iteration of the default T5 pair runs 24 of them, each with
its own small copies, and XLA:CPU pays a dispatch per loop trip and op.
Importing this module therefore lowers Threefry on CPU as the straight-line
rounds JAX already uses on GPU and TPU (:func:`unroll_threefry_on_cpu`):
the same hash, so the same bits and tokens, as fused elementwise work. Set
``SPECDEC_JAX_ROLLED_THREEFRY=1`` before the import to keep JAX's loops.
Measured (``benchmarks/results/threefry_unrolled/``): one sampled loop
iteration 3.9% cheaper against the greedy control (median of 12 cells;
default T5 chain at batch 1: 13%); whole decodes: within noise.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

DRAFT = 0
ACCEPT = 1
RESIDUAL = 2
ROLLED_ENV = "SPECDEC_JAX_ROLLED_THREEFRY"


def unroll_threefry_on_cpu() -> bool:
  """Lowers ``threefry2x32`` on CPU without a loop (JAX's GPU/TPU form).

  A process-wide switch of how XLA:CPU computes the hash, never of its
  value (the rounds are the same; the Threefry known-answer vectors and the
  golden sampled tokens hold either way). Programs traced before the call
  keep the loops. Uses one JAX internal (the non-CPU lowering rule,
  checked for jax 0.10): if it moved, nothing changes and this returns
  False.

  Returns:
    True if the straight-line lowering is now registered for CPU.
  """
  # pylint: disable-next=g-import-not-at-top
  from jax.extend import random as jax_random
  # pylint: disable-next=g-import-not-at-top
  from jax.interpreters import mlir
  try:
    # pylint: disable-next=g-import-not-at-top
    from jax._src.random import threefry2x32 as threefry
    rule = threefry._threefry2x32_lowering_rule  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return False
  mlir.register_lowering(jax_random.threefry2x32_p, rule, platform="cpu")
  return True


UNROLLED = (os.environ.get(ROLLED_ENV, "") in ("", "0")
            and unroll_threefry_on_cpu())


def row_keys(seed: jax.Array, request_id: jax.Array, position: jax.Array,
             purpose: int) -> jax.Array:
  """Typed PRNG keys, one per row.

  Args:
    seed: [B] uint32 user seeds.
    request_id: [B] int32 request ids.
    position: [B] int32 absolute output positions (0 = first new token).
    purpose: DRAFT, ACCEPT or RESIDUAL.

  Returns:
    [B] typed keys.
  """

  def one(s, r, o):
    k = jax.random.fold_in(jax.random.key(s), r)
    return jax.random.fold_in(jax.random.fold_in(k, o), purpose)

  return jax.vmap(one)(seed.astype(jnp.uint32), request_id.astype(jnp.int32),
                       position.astype(jnp.int32))


def level_purpose(purpose: int, level: int | None) -> int:
  """The stream of ``purpose`` for an intermediate level of a hierarchy.

  The top verifier and the bottom drafter of a stack use the plain streams
  (so a two-level stack is exactly the drafter/verifier loop); every
  intermediate level n verifies with its own streams, ``purpose + 8 n``.
  """
  return purpose if level is None else purpose + 8 * level


def block_uniforms(seed, request_id, start, width: int,
                   purpose: int = ACCEPT) -> jax.Array:
  """U[0, 1) acceptance uniforms for positions ``start + j``, j < width.

  Args:
    seed, request_id: [B].
    start: [B] int32 first output position of the block.
    width: static number of positions.
    purpose: the stream (ACCEPT, or an intermediate level's).

  Returns:
    [B, width] float32.
  """
  cols = []
  for j in range(width):
    k = row_keys(seed, request_id, start + j, purpose)
    cols.append(jax.vmap(lambda kk: jax.random.uniform(kk, ()))(k))
  return jnp.stack(cols, axis=1)
