"""Positions and attention masks of a cached block step.

A block of K tokens is written at cache slots ``[lengths, lengths + K)`` of
each row. By default its tokens sit at positions ``lengths + arange(K)`` and
attend causally (:func:`specdec_jax.models.cache.causal_mask`, the chain
case). A step may instead give explicit ``positions`` [B, K] and an in-block
``mask`` [B, K, K] (a token tree):

* the key position of a cached prefix slot ``s < lengths`` is ``s``; that of
  the block slot ``lengths + j`` is ``positions[b, j]``;
* every block token sees the whole prefix ``[0, lengths)``, block token j iff
  ``mask[b, i, j]``, and nothing at or past ``lengths + K``;
* a sliding-window layer also needs ``0 <= q_pos - k_pos < window``.

A step may also re-describe the last M cached slots (a token tree fed one
level per call, whose earlier levels are already cached): ``positions``
[B, M + K] and ``mask`` [B, K, M + K]. Column j < M is cache slot
``lengths - M + j``: its key position is ``positions[b, j]`` and query i
sees it iff ``mask[b, i, j]``; column M + j is block token j. Slots before
``lengths - M`` stay visible prefix slots at their own positions, and the
block's queries sit at ``positions[:, M:]``. Columns that fall before slot 0
(``lengths < M``) address no slot and are ignored.

Worked example (one row, lengths = 2, a root with two children, K = 3):
positions = [2, 3, 3], mask = [[1,0,0], [1,1,0], [1,0,1]]. Key positions of
slots 0..5 are [0, 1, 2, 3, 3, 5] (slot 5 is stale and never visible), and
query 2 (the second child) sees slots {0, 1, 2, 4}: its path prefix + root +
itself, exactly what an uncached forward of [p0, p1, root, child2] sees.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specdec_jax.models import cache as cache_lib


def is_default(positions, mask) -> bool:
  """True when a step uses the chain defaults (the original code path)."""
  return positions is None and mask is None


def query_positions(lengths: jax.Array, block: int,
                    positions: jax.Array | None) -> jax.Array:
  """[B, K] int32 positions of a block: given (its last K columns), or
  ``lengths + arange(K)``."""
  if positions is None:
    return cache_lib.block_positions(lengths, block)
  return jnp.asarray(positions, jnp.int32)[:, -block:]


def _block_index(start: jax.Array, width: int, max_length: int):
  """Column of every cache slot in a window of ``width`` columns from
  ``start`` [B]: (j [B, T] clipped to [0, width), in_window [B, T])."""
  slots = jnp.arange(max_length, dtype=jnp.int32)[None, :]  # [1, T]
  j = slots - start[:, None]  # [B, T]
  in_window = (j >= 0) & (j < width)
  return jnp.clip(j, 0, width - 1), in_window


def key_positions(lengths: jax.Array, positions: jax.Array,
                  max_length: int) -> jax.Array:
  """Position of the key held in every cache slot after a block write.

  Args:
    lengths: [B] int32 first slot described by ``positions`` (the block
      offset, or ``lengths - M`` when M cached slots are re-described).
    positions: [B, W] int32 positions of slots ``lengths .. lengths + W``.
    max_length: static cache size T.

  Returns:
    [B, T] int32: ``s`` for slots outside the window, ``positions[b, j]``
    for slot ``lengths[b] + j``.
  """
  j, in_window = _block_index(lengths, positions.shape[1], max_length)
  slots = jnp.arange(max_length, dtype=jnp.int32)[None, :]
  from_block = jnp.take_along_axis(positions, j, axis=1)  # [B, T]
  return jnp.where(in_window, from_block, slots)


def block_mask(lengths: jax.Array, q_pos: jax.Array, max_length: int, *,
               mask: jax.Array | None, window: int | None,
               k_pos: jax.Array | None = None) -> jax.Array:
  """Cache slots visible to each query of a block with an in-block mask.

  Args:
    lengths: [B] int32 block offsets (the cached prefix lengths).
    q_pos: [B, K] int32 query positions.
    max_length: static cache size T.
    mask: [B, K, M + K] bool mask over the last M cached slots and the
      block (M = 0: the in-block mask), or None for causal (j <= i).
    window: sliding window, or None for a global layer.
    k_pos: [B, T] key positions (:func:`key_positions`); computed from
      ``q_pos`` when None (only valid for M = 0).

  Returns:
    [B, K, T] bool: prefix slots before ``lengths - M``, plus the window's
    slots allowed by ``mask``, limited to ``0 <= q_pos - k_pos < window`` on
    a local layer.
  """
  b, k = q_pos.shape
  if mask is None:
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((k, k), bool)), (b, k, k))
  width = mask.shape[2]
  start = lengths - (width - k)
  j, in_window = _block_index(start, width, max_length)  # [B, T]
  idx = jnp.broadcast_to(j[:, None, :], (b, k, max_length))
  allowed = jnp.take_along_axis(mask, idx, axis=2) & in_window[:, None, :]
  slots = jnp.arange(max_length, dtype=jnp.int32)[None, :]
  visible = allowed | (slots < start[:, None])[:, None, :]  # [B, K, T]
  if window is not None:
    if k_pos is None:
      k_pos = key_positions(lengths, q_pos, max_length)
    dist = q_pos[:, :, None] - k_pos[:, None, :]  # [B, K, T]
    visible = visible & (dist >= 0) & (dist < window)
  return visible


def step_masks(lengths: jax.Array, block: int, max_length: int,
               windows, positions: jax.Array | None,
               mask: jax.Array | None):
  """Query positions, key positions and one mask per window of a step.

  With ``positions`` and ``mask`` both None this is exactly the original
  chain computation (``causal_mask`` of ``lengths + arange(K)``, keys at
  their slot indices).

  Args:
    lengths: [B] int32 block offsets.
    block: static block size K.
    max_length: static cache size T.
    windows: iterable of sliding windows used by the layers (None = global).
    positions: [B, M + K] int32 or None.
    mask: [B, K, M + K] bool or None (M = 0 when None).

  Returns:
    (q_pos [B, K] int32, k_pos [B or 1, T] int32, {window: [B, K, T] bool}).
  """
  q_pos = query_positions(lengths, block, positions)
  if is_default(positions, mask):
    k_pos = jnp.arange(max_length, dtype=jnp.int32)[None, :]  # [1, T]
    return q_pos, k_pos, {w: cache_lib.causal_mask(q_pos, max_length, w)
                          for w in windows}
  cached = 0 if mask is None else mask.shape[2] - block
  if positions is None:
    positions = cache_lib.block_positions(lengths - cached, cached + block)
  k_pos = key_positions(lengths - cached, jnp.asarray(positions, jnp.int32),
                        max_length)  # [B, T]
  return q_pos, k_pos, {w: block_mask(lengths, q_pos, max_length, mask=mask,
                                      window=w, k_pos=k_pos) for w in windows}


def check_step_args(tokens, positions, mask, logits_at) -> None:
  """Raises ValueError unless the optional step arguments fit ``tokens``.

  Args:
    tokens: [B, K] block.
    positions: None, [B, K] or [B, M + K] integer (with a mask of M + K
      columns).
    mask: None, [B, K, K] or [B, K, M + K] bool (M cached slots
      re-described, see the module docstring).
    logits_at: None, [B] or [B, P] integer.
  """
  b, k = tokens.shape[:2]
  cached = 0
  if mask is not None:
    shape = tuple(jnp.shape(mask))
    if len(shape) != 3 or shape[:2] != (b, k) or shape[2] < k:
      raise ValueError(
          f"step mask must have shape {(b, k, k)} (or ({b}, {k}, M + {k}) "
          f"to re-describe the last M cached slots) for tokens of shape "
          f"{(b, k)}, got {shape}")
    cached = shape[2] - k
  want = {"positions": (b, cached + k), "logits_at": (b,)}
  if logits_at is not None and jnp.ndim(logits_at) == 2:
    if jnp.shape(logits_at)[0] != b or jnp.shape(logits_at)[1] < 1:
      raise ValueError(f"step logits_at must have shape ({b},) or ({b}, P) "
                       f"with P >= 1 for tokens of shape {(b, k)}, got "
                       f"{tuple(jnp.shape(logits_at))}")
    logits_at = None  # checked
  for name, val in (("positions", positions), ("logits_at", logits_at)):
    if val is not None and tuple(jnp.shape(val)) != want[name]:
      extra = (f" (the mask covers {cached} cached slots)"
               if name == "positions" and cached else "")
      raise ValueError(f"step {name} must have shape {want[name]} for tokens "
                       f"of shape {(b, k)}{extra}, got "
                       f"{tuple(jnp.shape(val))}")
  if mask is not None and jnp.result_type(mask) != jnp.bool_:
    raise ValueError(f"step mask must be bool, got {jnp.result_type(mask)}")
