"""Explicit key/value caches with per-row lengths.

A cache is a pytree passed into and returned from every model call; nothing is
hidden in a mutable Flax collection. Each row of the batch has its own length,
so rows of different lengths share one batch, and rejecting speculative tokens
is a rollback by index arithmetic: set the row's length back. Entries at or past
a row's length are never attended to (the attention mask is built from the
lengths) and are overwritten by the next write, never added to.

Writes use ``lax.dynamic_update_slice`` per row. That primitive *clamps* a
start index so the update fits, silently shifting a write that would overrun
the buffer; callers must therefore size caches with slack (the decoding code
adds ``gamma + 1`` slots) and :func:`check_capacity` guards the host-side path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax


@struct.dataclass
class LayerKV:
  """Keys and values of one attention layer.

  Attributes:
    k: [batch, max_length, kv_heads, head_dim] keys.
    v: [batch, max_length, kv_heads, head_dim] values.
  """

  k: jax.Array
  v: jax.Array


@struct.dataclass
class KVCache:
  """Decoder self-attention caches of every layer, plus cross-attention K/V.

  Attributes:
    lengths: [batch] int32, number of valid positions of each row. The next
      block of K tokens is written at ``[lengths, lengths + K)``.
    layers: one :class:`LayerKV` per decoder layer, each
      [batch, max_length, kv_heads, head_dim].
    cross: encoder-decoder models only: one :class:`LayerKV` per decoder
      layer holding the cross-attention keys/values of the encoded input,
      [batch, src_length, heads, head_dim], computed once by ``encode``.
    cross_mask: [batch, src_length] bool, True for real (non-pad) source
      positions; None for decoder-only models.
  """

  lengths: jax.Array
  layers: tuple[LayerKV, ...]
  cross: tuple[LayerKV, ...] | None = None
  cross_mask: jax.Array | None = None

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_length(self) -> int:
    """Number of positions each row can hold (static)."""
    return self.layers[0].k.shape[1]

  def with_lengths(self, lengths: jax.Array) -> KVCache:
    """Returns the cache with per-row lengths replaced (rollback / advance).

    Args:
      lengths: [batch] int32 new lengths.
    """
    return self.replace(lengths=jnp.asarray(lengths, jnp.int32))

  def commit(self, start: jax.Array, path: jax.Array,
             count: jax.Array) -> KVCache:
    """Keeps an accepted root-to-leaf path of a block, contiguously.

    The block was written at slots ``[start, start + N)``; node i of the
    accepted path is block token ``path[b, i]``. For every row b and
    ``i < count[b]``, slot ``start + i`` receives slot ``start + path[b, i]``
    (keys and values of every self-attention layer; cross-attention K/V are
    untouched), then ``lengths = start + count``. Slots ``< start`` never
    change. With ``path = arange(D)`` this is the chain case (a plain
    ``with_lengths(start + count)``).

    Example (one row): start 5, block [r, a, b, c] at slots 5..8, accepted
    path r -> b (path [0, 2, x], count 2): slots 5, 6 hold r, b; lengths 7.

    Args:
      start: [B] int32 slot of the block's first token (its cached prefix
        length before the block step).
      path: [B, D] int32 block-relative indices, ascending along the path
        (``path[b, i] >= i``); entries at ``i >= count[b]`` are ignored (any
        in-range value). D is static and at most ``max_length``.
      count: [B] int32 accepted path lengths, 0..D.

    Returns:
      The cache with the path compacted and ``lengths = start + count``.
    """
    start = jnp.asarray(start, jnp.int32)
    path = jnp.asarray(path, jnp.int32)
    count = jnp.asarray(count, jnp.int32)
    width = path.shape[1]
    if width > self.max_length:
      raise ValueError(f"commit path width {width} exceeds the cache's "
                       f"max_length {self.max_length}")
    # Read and write the D-slot window at `base` (= start unless it would
    # overrun, where dynamic_update_slice would silently shift the write).
    base = jnp.clip(start, 0, self.max_length - width)  # [B]
    i = base[:, None] + jnp.arange(width, dtype=jnp.int32) - start[:, None]
    use = (i >= 0) & (i < count[:, None])  # [B, D] window slot takes a node
    src = start[:, None] + jnp.take_along_axis(
        path, jnp.clip(i, 0, width - 1), axis=1)  # [B, D] source slots
    src = jnp.where(use, src, base[:, None] + jnp.arange(width))

    def one_row(buf, src_row, at):  # [T, H, Dh], [D], [] -> [T, H, Dh]
      return lax.dynamic_update_slice_in_dim(buf, buf[src_row], at, 0)

    move = jax.vmap(one_row)
    layers = tuple(LayerKV(k=move(kv.k, src, base), v=move(kv.v, src, base))
                   for kv in self.layers)
    return self.replace(lengths=start + count, layers=layers)


def init_layers(
    batch: int,
    max_length: int,
    num_layers: int,
    kv_heads: int,
    head_dim: int,
    dtype,
) -> tuple[LayerKV, ...]:
  """Zero-filled self-attention caches for ``num_layers`` layers."""
  shape = (batch, max_length, kv_heads, head_dim)
  return tuple(
      LayerKV(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))
      for _ in range(num_layers)
  )


def write_block(
    layer: LayerKV, k: jax.Array, v: jax.Array, lengths: jax.Array
) -> LayerKV:
  """Overwrites K new positions of every row at that row's own length.

  Args:
    layer: cache of one layer, [batch, max_length, kv_heads, head_dim].
    k: [batch, K, kv_heads, head_dim] new keys.
    v: [batch, K, kv_heads, head_dim] new values.
    lengths: [batch] int32 write offsets.

  Returns:
    The updated layer cache (same shapes).
  """

  def one_row(buf, upd, start):  # [T, H, D], [K, H, D], [] -> [T, H, D]
    return lax.dynamic_update_slice_in_dim(buf, upd.astype(buf.dtype), start, 0)

  write = jax.vmap(one_row)
  return LayerKV(k=write(layer.k, k, lengths), v=write(layer.v, v, lengths))


def block_positions(lengths: jax.Array, block: int) -> jax.Array:
  """Absolute positions of a block written at each row's length.

  Args:
    lengths: [batch] int32.
    block: static block size K.

  Returns:
    [batch, K] int32 positions ``lengths[:, None] + arange(K)``.
  """
  return lengths[:, None] + jnp.arange(block, dtype=jnp.int32)[None, :]


def causal_mask(
    positions: jax.Array, max_length: int, window: int | None = None
) -> jax.Array:
  """Which cache slots each query of a block may attend to.

  Slot j is visible to the query at absolute position t iff ``j <= t`` (and
  ``t - j < window`` for sliding-window layers). Slots past the row's length
  are therefore invisible: stale entries left by a rollback never matter.

  Args:
    positions: [batch, K] absolute query positions.
    max_length: static cache size T.
    window: sliding window size, or None for global attention.

  Returns:
    [batch, K, T] bool mask.
  """
  slots = jnp.arange(max_length, dtype=jnp.int32)[None, None, :]
  pos = positions[:, :, None]
  mask = slots <= pos
  if window is not None:
    mask = mask & (pos - slots < window)
  return mask


def check_capacity(lengths, block: int, max_length: int) -> None:
  """Raises if writing ``block`` tokens at ``lengths`` would overrun the cache.

  Only checks concrete (non-traced) lengths; inside ``jit`` the decoding code
  guarantees capacity statically.

  Args:
    lengths: [batch] int32 current lengths (concrete or traced).
    block: number of tokens about to be written.
    max_length: cache size.
  """
  if block > max_length:
    raise ValueError(
        f"a block of {block} tokens does not fit a cache of max_length "
        f"{max_length}; build the cache with init_cache(batch, max_length >= "
        f"{block})"
    )
  if isinstance(lengths, jax.core.Tracer):
    return
  lengths = np.asarray(lengths)
  worst = int(lengths.max()) + block if lengths.size else block
  if worst > max_length:
    row = int(lengths.argmax())
    raise ValueError(
        f"writing {block} tokens at row {row}'s length {int(lengths[row])} "
        f"would overrun the cache (max_length {max_length}); allocate a larger "
        f"cache (prompt + new tokens + gamma + 1 slots of slack)"
    )


def select_positions(x: jax.Array, at: jax.Array | None) -> jax.Array:
  """Keeps the positions to project before the output projection.

  Args:
    x: [B, K, D] hidden states of a block.
    at: None (keep all), [B] int32 index into the block (one position per
      row), or [B, P] int32 indices (P positions per row, any order,
      repeats allowed).

  Returns:
    [B, K, D], [B, 1, D] or [B, P, D].
  """
  if at is None:
    return x
  at = at[:, None] if at.ndim == 1 else at
  return jnp.take_along_axis(x, at[:, :, None], axis=1)
