"""Building blocks shared by the model families.

Norms and softmax always run in float32 whatever the compute dtype; matmuls run
in the module's compute dtype (float32 or bfloat16).

Every parameter is created with :func:`param_with_axes`, which declares its
logical axis names next to its definition (``nn.with_logical_partitioning``);
``specdec_jax.sharding`` maps those names to mesh axes. The returned params
trees hold plain arrays: the boxes only exist inside ``init`` and are read by
``FlaxDecodeModel.param_axes``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

# Large negative value used to mask attention logits (Gemma's K_MASK).
MASK_VALUE = -2.3819763e38


def param_with_axes(module: nn.Module, name: str, init: Callable,
                    shape: Sequence[int], dtype, axes: Sequence[str]):
  """Creates (or reads) parameter ``name`` and declares its logical axes.

  Args:
    module: the Flax module owning the parameter.
    name: parameter name.
    init: initializer ``(rng, shape, dtype) -> array``.
    shape: parameter shape.
    dtype: parameter dtype.
    axes: one logical axis name per dimension (see ``sharding.py``).

  Returns:
    The parameter value, a plain array (never a partitioning box; no sharding
    constraint is applied here).
  """
  shape, axes = tuple(shape), tuple(axes)
  if len(axes) != len(shape):
    raise ValueError(f"parameter {name!r} of shape {shape} declares "
                     f"{len(axes)} logical axes {axes}; give one per dimension")
  value = module.param(name, nn.with_logical_partitioning(init, axes), shape,
                       dtype, unbox=False)
  return unbox(value)


def unbox(tree):
  """Replaces every logical-partitioning box in ``tree`` by its value."""
  return jax.tree.map(
      lambda x: x.value if isinstance(x, nn.LogicallyPartitioned) else x, tree,
      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def box_names(tree):
  """Tree of boxed params -> the same tree with each box's logical names."""
  return jax.tree.map(
      lambda x: tuple(x.names), tree,
      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


class RMSNorm(nn.Module):
  """Root-mean-square norm (no mean subtraction, no bias).

  Attributes:
    eps: added to the mean square before the reciprocal square root.
    plus_one: Gemma style ``x * (1 + scale)`` with scale initialised at 0;
      otherwise T5 style ``x * scale`` with scale initialised at 1.
    dtype: output dtype.
    param_dtype: dtype of the scale parameter.
    axis_name: logical name of the normalised axis (Gemma 3's QK-norm:
      'head_dim').
  """

  eps: float = 1e-6
  plus_one: bool = False
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., D] -> [..., D]."""
    init = nn.initializers.zeros if self.plus_one else nn.initializers.ones
    scale = param_with_axes(self, "scale", init, (x.shape[-1],),
                            self.param_dtype, (self.axis_name,))
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.eps)
    s = scale.astype(jnp.float32)
    y = y * (1.0 + s) if self.plus_one else y * s
    return y.astype(self.dtype)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
  """``tanh(x / cap) * cap``; identity when ``cap`` is None."""
  if cap is None:
    return x
  return jnp.tanh(x / cap) * cap


def apply_rope(
    x: jax.Array, positions: jax.Array, base: float = 10_000.0,
    scale: float = 1.0,
) -> jax.Array:
  """Rotary position embedding, half-split convention (Gemma / HF).

  Args:
    x: [batch, seq, heads, head_dim].
    positions: [batch, seq] int32 absolute positions.
    base: RoPE base frequency.
    scale: linear scaling: positions are divided by it (Gemma 3 global).

  Returns:
    [batch, seq, heads, head_dim], same dtype as ``x``.
  """
  half = x.shape[-1] // 2
  freq = 2.0 * jnp.arange(half, dtype=jnp.float32) / x.shape[-1]
  timescale = base**freq  # [half]
  pos = positions.astype(jnp.float32)
  if scale != 1.0:
    pos = pos / scale
  angle = pos[..., None] / timescale  # [B, S, half]
  angle = angle[:, :, None, :]  # [B, S, 1, half]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    bias: jax.Array | None = None,
    logit_cap: float | None = None,
) -> jax.Array:
  """Grouped-query dot-product attention (queries already scaled).

  Args:
    q: [batch, T, heads, head_dim] queries.
    k: [batch, S, kv_heads, head_dim] keys; heads % kv_heads == 0.
    v: [batch, S, kv_heads, head_dim] values.
    mask: [batch, T, S] bool, True where attention is allowed.
    bias: optional [batch or 1, heads, T, S] additive logit bias.
    logit_cap: optional soft cap applied to the logits (Gemma 2).

  Returns:
    [batch, T, heads, head_dim] attention outputs in q's dtype.
  """
  b, t, n, h = q.shape
  kv = k.shape[2]
  g = n // kv
  qg = q.reshape(b, t, kv, g, h)
  # 'BTKGH,BSKH->BKGTS'
  logits = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k,
                      preferred_element_type=jnp.float32)
  logits = logits.reshape(b, n, t, -1)  # [B, N, T, S]
  logits = soft_cap(logits, logit_cap)
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  logits = jnp.where(mask[:, None, :, :], logits, MASK_VALUE)
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  probs = probs.reshape(b, kv, g, t, -1)
  out = jnp.einsum("BKGTS,BSKH->BTKGH", probs, v)  # [B, T, K, G, H]
  return out.reshape(b, t, n, h)


def gelu_tanh(x: jax.Array) -> jax.Array:
  """GELU with the tanh approximation (T5 'gelu_new', Gemma 'gelu_pytorch_tanh')."""
  return nn.gelu(x, approximate=True)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {"gelu": gelu_tanh}


def dtype_of(name: str | jnp.dtype) -> jnp.dtype:
  """'float32' / 'bfloat16' / a dtype -> the jnp dtype, with a clear error."""
  if not isinstance(name, str):
    return jnp.dtype(name)
  table = {"float32": jnp.float32, "bfloat16": jnp.bfloat16,
           "float16": jnp.float16}
  if name not in table:
    raise ValueError(
        f"unknown dtype {name!r}; use one of {sorted(table)}")
  return jnp.dtype(table[name])
