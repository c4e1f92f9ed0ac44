"""T5 v1.1 layers: relative position buckets, attention, MLP, blocks.

Every parameter declares its logical axes where it is created (t5x names);
kernels are 2-D [in, out] as in t5x checkpoints.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import cache as cache_lib
from specdec_jax.models.cache import LayerKV
from specdec_jax.models.layers import (RMSNorm, attend, dtype_of, gelu_tanh,
                                       param_with_axes)
from specdec_jax.models.t5_config import T5Config


@functools.lru_cache(maxsize=None)
def relpos_bucket_table(bidirectional: bool, num_buckets: int,
                        max_distance: int) -> np.ndarray:
  """Bucket of every distance ``n = query_pos - key_pos`` in [0, max_distance].

  Mesh-TensorFlow / t5x / HF bucketing: half the buckets are exact distances,
  the other half grow logarithmically up to ``max_distance`` and saturate.
  Computed on the host once (float32, the same arithmetic as HF transformers),
  then gathered on device, so the bucket boundaries are bit-identical.

  Args:
    bidirectional: encoder (True) or causal decoder (False).
    num_buckets: total buckets (both directions when bidirectional).
    max_distance: saturation distance.

  Returns:
    [max_distance + 1] int32, buckets for n >= 0 (key at or before query).
    For bidirectional attention, a key after the query at distance n uses
    ``table[n] + num_buckets // 2``.
  """
  nb = num_buckets // 2 if bidirectional else num_buckets
  max_exact = nb // 2
  n = np.arange(max_distance + 1)
  with np.errstate(divide="ignore"):
    large = (np.log(n.astype(np.float32) / np.float32(max_exact))
             / np.float32(math.log(max_distance / max_exact))
             * np.float32(nb - max_exact))
  large = max_exact + np.nan_to_num(large, neginf=0).astype(np.int32)
  large = np.minimum(large, nb - 1)
  return np.where(n < max_exact, n, large).astype(np.int32)


def relpos_buckets(q_pos: jax.Array, k_pos: jax.Array, *, bidirectional: bool,
                   num_buckets: int, max_distance: int) -> jax.Array:
  """Relative position bucket of every (query, key) pair.

  Args:
    q_pos: [B, Q] int32 query positions.
    k_pos: [B or 1, S] int32 key positions.
    bidirectional: encoder (True) or causal decoder (False).
    num_buckets: total buckets.
    max_distance: saturation distance.

  Returns:
    [B, Q, S] int32 buckets in [0, num_buckets).
  """
  table = jnp.asarray(relpos_bucket_table(bidirectional, num_buckets,
                                          max_distance))
  n = q_pos[:, :, None] - k_pos[:, None, :]  # [B, Q, S], >0: key before query
  if bidirectional:
    offset = jnp.where(n < 0, num_buckets // 2, 0)
    return offset + table[jnp.minimum(jnp.abs(n), max_distance)]
  return table[jnp.clip(n, 0, max_distance)]


class Dense(nn.Module):
  """Bias-free dense layer with a 2-D kernel [in, out] (t5x layout).

  Attributes:
    features: output size.
    axes: logical names of the kernel's (in, out) axes.
    init_scale: variance scale of the fan-in normal initialiser (1: unit
      variance outputs for unit variance inputs).
  """

  features: int
  axes: tuple[str, str]
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  init_scale: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., in] -> [..., features]."""
    kernel = param_with_axes(
        self, "kernel", nn.initializers.variance_scaling(
            self.init_scale, "fan_in", "normal"),
        (x.shape[-1], self.features), self.param_dtype, self.axes)
    return jnp.einsum("...i,io->...o", x.astype(self.dtype),
                      kernel.astype(self.dtype))


class Embed(nn.Module):
  """Token embedding table 'embedding' [vocab, d]."""

  num_embeddings: int
  features: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, ids: jax.Array) -> jax.Array:
    """[B, T] int -> [B, T, d]."""
    table = param_with_axes(self, "embedding", nn.initializers.normal(1.0),
                            (self.num_embeddings, self.features),
                            self.param_dtype, ("vocab", "embed"))
    return jnp.take(table, ids, axis=0).astype(self.dtype)


class RelativePositionBias(nn.Module):
  """One learned bias per (head, bucket): 'rel_embedding' [heads, buckets]."""

  num_heads: int
  num_buckets: int
  max_distance: int
  bidirectional: bool

  @nn.compact
  def __call__(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
    """Positions [B, Q], [B|1, S] -> bias [B, heads, Q, S] float32."""
    table = param_with_axes(self, "rel_embedding", nn.initializers.normal(0.5),
                            (self.num_heads, self.num_buckets), jnp.float32,
                            ("heads", "relpos_buckets"))
    buckets = relpos_buckets(q_pos, k_pos, bidirectional=self.bidirectional,
                             num_buckets=self.num_buckets,
                             max_distance=self.max_distance)
    bias = jnp.take(table.T.astype(jnp.float32), buckets, axis=0)
    return jnp.transpose(bias, (0, 3, 1, 2))  # [B, Q, S, H] -> [B, H, Q, S]


class Attention(nn.Module):
  """Projections of one T5 attention block (no logit scaling).

  T5 does not divide its attention logits by sqrt(head_dim); like t5x
  (``query_init = kernel_init / sqrt(head_dim)``) and HF (query weights of
  variance 1 / (d_model * head_dim)), the factor is folded into the query
  kernel's initialisation, so a freshly initialised model starts with logits
  of unit scale instead of a saturated softmax. Loading weights is unaffected.
  """

  config: T5Config

  def setup(self):
    cfg, dt, pdt = self.config, dtype_of(self.config.dtype), dtype_of(
        self.config.param_dtype)
    inner = cfg.num_heads * cfg.head_dim
    qkv = ("embed", "joined_kv")
    self.query = Dense(inner, qkv, dt, pdt, init_scale=1.0 / cfg.head_dim)
    self.key = Dense(inner, qkv, dt, pdt)
    self.value = Dense(inner, qkv, dt, pdt)
    self.out = Dense(cfg.d_model, ("joined_kv", "embed"), dt, pdt)

  def _heads(self, x: jax.Array) -> jax.Array:
    return x.reshape(*x.shape[:-1], self.config.num_heads, self.config.head_dim)

  def project_q(self, x: jax.Array) -> jax.Array:
    """[B, T, d] -> [B, T, heads, head_dim]."""
    return self._heads(self.query(x))

  def project_kv(self, x: jax.Array) -> LayerKV:
    """[B, S, d] -> keys and values [B, S, heads, head_dim]."""
    return LayerKV(k=self._heads(self.key(x)), v=self._heads(self.value(x)))

  def __call__(self, q, kv: LayerKV, mask, bias=None) -> jax.Array:
    """Attention of q [B,T,H,D] over kv [B,S,H,D] -> [B, T, d]."""
    ctx = attend(q, kv.k, kv.v, mask, bias)
    return self.out(ctx.reshape(*ctx.shape[:2], -1))


class MLP(nn.Module):
  """Gated GELU: wo(gelu(wi_0 x) * wi_1 x)."""

  config: T5Config

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, T, d] -> [B, T, d]."""
    cfg = self.config
    dt, pdt = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    up = ("embed", "mlp")
    h = gelu_tanh(Dense(cfg.mlp_dim, up, dt, pdt, name="wi_0")(x)) * Dense(
        cfg.mlp_dim, up, dt, pdt, name="wi_1")(x)
    return Dense(cfg.d_model, ("mlp", "embed"), dt, pdt, name="wo")(h)


def norm(cfg: T5Config, name: str | None) -> RMSNorm:
  """T5 RMSNorm (scale only, initialised at 1)."""
  return RMSNorm(eps=cfg.layer_norm_eps, dtype=dtype_of(cfg.dtype),
                 param_dtype=dtype_of(cfg.param_dtype), name=name)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x, mask, bias):
    """x [B, S, d], mask [B, S, S], bias [B, H, S, S] -> [B, S, d]."""
    cfg = self.config
    h = norm(cfg, "pre_attention_layer_norm")(x)
    attn = Attention(cfg, name="attention")
    x = x + attn(attn.project_q(h), attn.project_kv(h), mask, bias)
    h = norm(cfg, "pre_mlp_layer_norm")(x)
    return x + MLP(cfg, name="mlp")(h)


class DecoderLayer(nn.Module):
  """Self-attention (cached or not), cross-attention, MLP."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = norm(cfg, None)
    self.self_attention = Attention(cfg)
    self.pre_cross_attention_layer_norm = norm(cfg, None)
    self.encoder_decoder_attention = Attention(cfg)
    self.pre_mlp_layer_norm = norm(cfg, None)
    self.mlp = MLP(cfg)

  def cross_kv(self, encoded: jax.Array) -> LayerKV:
    """Encoder output [B, S, d] -> cross-attention K/V [B, S, H, D]."""
    return self.encoder_decoder_attention.project_kv(encoded)

  def __call__(self, x, *, self_cache, lengths, mask, bias, cross: LayerKV,
               cross_mask):
    """One decoder block.

    Args:
      x: [B, K, d] hidden states of the block.
      self_cache: LayerKV [B, T, H, D] to write into at ``lengths``, or None
        for the uncached forward (keys/values are the block's own).
      lengths: [B] int32 write offsets (ignored when self_cache is None).
      mask: [B, K, T] (cached) or [B, K, K] (uncached) bool.
      bias: [B, H, K, T] or [B, H, K, K] relative position bias.
      cross: cross-attention K/V [B, S, H, D].
      cross_mask: [B, S] bool valid source positions.

    Returns:
      ([B, K, d] hidden states, updated LayerKV or None).
    """
    h = self.pre_self_attention_layer_norm(x)
    sa = self.self_attention
    kv = sa.project_kv(h)
    if self_cache is not None:
      kv = cache_lib.write_block(self_cache, kv.k, kv.v, lengths)
    x = x + sa(sa.project_q(h), kv, mask, bias)
    h = self.pre_cross_attention_layer_norm(x)
    ca = self.encoder_decoder_attention
    cmask = jnp.broadcast_to(cross_mask[:, None, :],
                             (x.shape[0], x.shape[1], cross_mask.shape[-1]))
    x = x + ca(ca.project_q(h), cross, cmask)
    h = self.pre_mlp_layer_norm(x)
    return x + self.mlp(h), (kv if self_cache is not None else None)
