"""T5 v1.1 encoder-decoder (Raffel et al.; t5x ``examples/t5`` architecture).

RMSNorm (eps 1e-6, scale only), gated-GELU MLP, no biases anywhere, relative
position buckets (32 buckets, max distance 128; bidirectional in the encoder,
causal in the decoder; one bias table per stack), no 1/sqrt(d) scaling of the
attention logits, untied output projection. Parameter names and 2-D kernel
layouts follow t5x, so a T5X checkpoint's ``target`` tree loads as is:

    token_embedder/embedding                         [vocab, d]
    encoder/relpos_bias/rel_embedding                [heads, 32]
    encoder/layers_{i}/attention/{query,key,value}/kernel  [d, heads*head_dim]
    encoder/layers_{i}/attention/out/kernel          [heads*head_dim, d]
    encoder/layers_{i}/mlp/{wi_0,wi_1}/kernel        [d, mlp]
    encoder/layers_{i}/mlp/wo/kernel                 [mlp, d]
    decoder/layers_{i}/{self_attention,encoder_decoder_attention}/...
    decoder/logits_dense/kernel                      [d, vocab]
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models import cache as cache_lib
from specdec_jax.models.cache import KVCache, LayerKV
from specdec_jax.models.interface import Encoded, FlaxDecodeModel, check_tokens
from specdec_jax.models.layers import RMSNorm, attend, dtype_of, gelu_tanh


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyperparameters of a T5 v1.1 model.

  Attributes:
    vocab_size: embedding rows (32128 for the public checkpoints: 32100
      SentencePiece ids padded to a multiple of 128).
    d_model: hidden size.
    num_heads: attention heads.
    head_dim: size of each head (64 for every public size).
    num_encoder_layers: encoder blocks.
    num_decoder_layers: decoder blocks.
    mlp_dim: hidden size of the gated-GELU MLP.
    relpos_buckets: relative position buckets.
    relpos_max_distance: distance beyond which buckets saturate.
    layer_norm_eps: RMSNorm epsilon.
    dtype: compute dtype ('float32' or 'bfloat16').
    param_dtype: parameter storage dtype.
    pad_id: padding id (also the decoder start token).
    eos_id: end-of-sequence id.
    decoder_start_id: first decoder input token.
  """

  vocab_size: int = 32128
  d_model: int = 512
  num_heads: int = 6
  head_dim: int = 64
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  mlp_dim: int = 1024
  relpos_buckets: int = 32
  relpos_max_distance: int = 128
  layer_norm_eps: float = 1e-6
  dtype: str = "float32"
  param_dtype: str = "float32"
  pad_id: int = 0
  eos_id: int = 1
  decoder_start_id: int = 0

  def __post_init__(self):
    for field in ("vocab_size", "d_model", "num_heads", "head_dim",
                  "num_encoder_layers", "num_decoder_layers", "mlp_dim",
                  "relpos_buckets", "relpos_max_distance"):
      if int(getattr(self, field)) < 1:
        raise ValueError(f"T5Config.{field} must be >= 1, got "
                         f"{getattr(self, field)}")
    if self.relpos_buckets % 2:
      raise ValueError("T5Config.relpos_buckets must be even, got "
                       f"{self.relpos_buckets}")
    dtype_of(self.dtype)
    dtype_of(self.param_dtype)


# Published T5 v1.1 sizes (t5x/examples/t5/t5_1_1/*.gin).
T5_PRESETS: dict[str, T5Config] = {
    "t5_1_1_small": T5Config(d_model=512, num_heads=6, num_encoder_layers=8,
                             num_decoder_layers=8, mlp_dim=1024),
    "t5_1_1_base": T5Config(d_model=768, num_heads=12, num_encoder_layers=12,
                            num_decoder_layers=12, mlp_dim=2048),
    "t5_1_1_large": T5Config(d_model=1024, num_heads=16, num_encoder_layers=24,
                             num_decoder_layers=24, mlp_dim=2816),
    "t5_1_1_xl": T5Config(d_model=2048, num_heads=32, num_encoder_layers=24,
                          num_decoder_layers=24, mlp_dim=5120),
    "t5_1_1_xxl": T5Config(d_model=4096, num_heads=64, num_encoder_layers=24,
                           num_decoder_layers=24, mlp_dim=10240),
    # Tiny config for tests (random weights).
    "t5_tiny": T5Config(vocab_size=64, d_model=32, num_heads=4, head_dim=8,
                        num_encoder_layers=2, num_decoder_layers=2, mlp_dim=64,
                        relpos_buckets=8, relpos_max_distance=16),
}


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
  """Bias-free dense layer with a 2-D kernel [in, out] (t5x layout)."""

  features: int
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., in] -> [..., features]."""
    kernel = self.param(
        "kernel", nn.initializers.variance_scaling(1.0, "fan_in", "normal"),
        (x.shape[-1], self.features), self.param_dtype)
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
    table = self.param("embedding", nn.initializers.normal(1.0),
                       (self.num_embeddings, self.features), self.param_dtype)
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
    table = self.param("rel_embedding", nn.initializers.normal(0.5),
                       (self.num_heads, self.num_buckets), jnp.float32)
    buckets = relpos_buckets(q_pos, k_pos, bidirectional=self.bidirectional,
                             num_buckets=self.num_buckets,
                             max_distance=self.max_distance)
    bias = jnp.take(table.T.astype(jnp.float32), buckets, axis=0)
    return jnp.transpose(bias, (0, 3, 1, 2))  # [B, Q, S, H] -> [B, H, Q, S]


class Attention(nn.Module):
  """Projections of one T5 attention block (no logit scaling)."""

  config: T5Config

  def setup(self):
    cfg, dt, pdt = self.config, dtype_of(self.config.dtype), dtype_of(
        self.config.param_dtype)
    inner = cfg.num_heads * cfg.head_dim
    self.query = Dense(inner, dt, pdt)
    self.key = Dense(inner, dt, pdt)
    self.value = Dense(inner, dt, pdt)
    self.out = Dense(cfg.d_model, dt, pdt)

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
    h = gelu_tanh(Dense(cfg.mlp_dim, dt, pdt, name="wi_0")(x)) * Dense(
        cfg.mlp_dim, dt, pdt, name="wi_1")(x)
    return Dense(cfg.d_model, dt, pdt, name="wo")(h)


def _norm(cfg: T5Config, name: str) -> RMSNorm:
  return RMSNorm(eps=cfg.layer_norm_eps, dtype=dtype_of(cfg.dtype),
                 param_dtype=dtype_of(cfg.param_dtype), name=name)


class EncoderLayer(nn.Module):
  config: T5Config

  @nn.compact
  def __call__(self, x, mask, bias):
    """x [B, S, d], mask [B, S, S], bias [B, H, S, S] -> [B, S, d]."""
    cfg = self.config
    h = _norm(cfg, "pre_attention_layer_norm")(x)
    attn = Attention(cfg, name="attention")
    x = x + attn(attn.project_q(h), attn.project_kv(h), mask, bias)
    h = _norm(cfg, "pre_mlp_layer_norm")(x)
    return x + MLP(cfg, name="mlp")(h)


class DecoderLayer(nn.Module):
  """Self-attention (cached or not), cross-attention, MLP."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm = _norm(cfg, None)
    self.self_attention = Attention(cfg)
    self.pre_cross_attention_layer_norm = _norm(cfg, None)
    self.encoder_decoder_attention = Attention(cfg)
    self.pre_mlp_layer_norm = _norm(cfg, None)
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


class T5Module(nn.Module):
  """The T5 v1.1 network; see :class:`T5Model` for the decode interface."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dt, pdt = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    self.token_embedder = Embed(cfg.vocab_size, cfg.d_model, dt, pdt)
    self.encoder = T5Stack(cfg, decoder=False)
    self.decoder = T5Stack(cfg, decoder=True)

  def encode(self, inputs: jax.Array):
    """inputs [B, S] -> (encoded [B, S, d], mask [B, S] bool)."""
    mask = inputs != self.config.pad_id
    return self.encoder.encode(self.token_embedder(inputs), mask), mask

  def encode_for_decoding(self, inputs: jax.Array):
    """inputs [B, S] -> (tuple of cross LayerKV per decoder layer, mask)."""
    encoded, mask = self.encode(inputs)
    return self.decoder.cross_kv(encoded), mask

  def decode(self, tokens: jax.Array, cache: KVCache, logits_at=None):
    """Cached block step: tokens [B, K] -> (logits [B, K|1, V] f32, cache)."""
    return self.decoder.step(self.token_embedder(tokens), cache, logits_at)

  def forward(self, inputs: jax.Array, targets: jax.Array) -> jax.Array:
    """Uncached teacher-forced forward: logits [B, T, V] float32.

    Args:
      inputs: [B, S] encoder token ids (pad id 0 masked out).
      targets: [B, T] decoder input ids (already shifted right).
    """
    encoded, mask = self.encode(inputs)
    cross = self.decoder.cross_kv(encoded)
    return self.decoder.full(self.token_embedder(targets), cross, mask)

  def init_all(self, inputs, targets):
    return self.forward(inputs, targets)


class T5Stack(nn.Module):
  """Encoder (``decoder=False``) or decoder stack."""

  config: T5Config
  decoder: bool

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(
        cfg.num_heads, cfg.relpos_buckets, cfg.relpos_max_distance,
        bidirectional=not self.decoder)
    if self.decoder:
      self.layers = [DecoderLayer(cfg, name=f"layers_{i}")
                     for i in range(cfg.num_decoder_layers)]
      self.decoder_norm = _norm(cfg, None)
      self.logits_dense = Dense(cfg.vocab_size, dtype_of(cfg.dtype),
                                dtype_of(cfg.param_dtype))
    else:
      self.layers = [EncoderLayer(cfg, name=f"layers_{i}")
                     for i in range(cfg.num_encoder_layers)]
      self.encoder_norm = _norm(cfg, None)

  def encode(self, x, mask):
    """x [B, S, d], mask [B, S] -> [B, S, d]."""
    pos = jnp.broadcast_to(jnp.arange(x.shape[1], dtype=jnp.int32),
                           x.shape[:2])
    bias = self.relpos_bias(pos, pos)
    attn_mask = jnp.broadcast_to(mask[:, None, :],
                                 (x.shape[0], x.shape[1], x.shape[1]))
    for layer in self.layers:
      x = layer(x, attn_mask, bias)
    return self.encoder_norm(x)

  def cross_kv(self, encoded):
    return tuple(layer.cross_kv(encoded) for layer in self.layers)

  def _logits(self, x):
    x = self.decoder_norm(x)
    return self.logits_dense(x).astype(jnp.float32)

  def full(self, x, cross, cross_mask):
    """Uncached decoder over x [B, T, d] -> logits [B, T, V]."""
    b, t = x.shape[:2]
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    bias = self.relpos_bias(pos, pos)
    mask = cache_lib.causal_mask(pos, t)
    for layer, ckv in zip(self.layers, cross):
      x, _ = layer(x, self_cache=None, lengths=None, mask=mask, bias=bias,
                   cross=ckv, cross_mask=cross_mask)
    return self._logits(x)

  def step(self, x, cache: KVCache, logits_at=None):
    """Cached decoder block over x [B, K, d] -> (logits [B, K|1, V], cache)."""
    k = x.shape[1]
    pos = cache_lib.block_positions(cache.lengths, k)  # [B, K]
    slots = jnp.arange(cache.max_length, dtype=jnp.int32)[None, :]
    bias = self.relpos_bias(pos, slots)  # [B, H, K, T]
    mask = cache_lib.causal_mask(pos, cache.max_length)
    new_layers = []
    for layer, lkv, ckv in zip(self.layers, cache.layers, cache.cross):
      x, lkv = layer(x, self_cache=lkv, lengths=cache.lengths, mask=mask,
                     bias=bias, cross=ckv, cross_mask=cache.cross_mask)
      new_layers.append(lkv)
    x = cache_lib.select_positions(x, logits_at)
    return self._logits(x), cache.replace(lengths=cache.lengths + k,
                                          layers=tuple(new_layers))


@dataclasses.dataclass(frozen=True)
class T5Model(FlaxDecodeModel):
  """T5 v1.1 behind the decode interface (see ``models/interface.py``)."""

  config: T5Config

  is_encoder_decoder = True

  def module(self) -> T5Module:
    return T5Module(self.config)

  def _dummy_init_args(self):
    ids = jnp.ones((1, 2), jnp.int32)
    return ids, ids

  @property
  def eos_id(self) -> int:
    return self.config.eos_id

  def encode(self, params, inputs: jax.Array) -> Encoded:
    """Runs the encoder once and projects its output to cross K/V.

    Args:
      params: parameter tree.
      inputs: [B, S] int32 source ids, right-padded with 0.

    Returns:
      Encoded with per-decoder-layer cross K/V [B, S, H, D] and mask [B, S].
    """
    check_tokens(inputs, self.config.vocab_size, "encoder inputs")
    cross, mask = self._apply(params, inputs, method="encode_for_decoding")
    return Encoded(cross=tuple(cross), mask=mask)

  def init_cache(self, batch: int, max_length: int,
                 encoded: Encoded | None = None, dtype=None) -> KVCache:
    """Empty decoder cache (all lengths 0) holding the encoded input.

    Args:
      batch: rows.
      max_length: decoder positions per row (include gamma + 1 of slack).
      encoded: output of :meth:`encode` for these rows (required).
      dtype: cache dtype, default the compute dtype.
    """
    if encoded is None:
      raise ValueError("T5 is an encoder-decoder model: pass encoded="
                       "model.encode(params, inputs) to init_cache")
    if encoded.mask.shape[0] != batch:
      raise ValueError(f"encoded batch {encoded.mask.shape[0]} != cache batch "
                       f"{batch}")
    cfg = self.config
    layers = cache_lib.init_layers(batch, max_length, cfg.num_decoder_layers,
                                   cfg.num_heads, cfg.head_dim,
                                   dtype or self.dtype())
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32), layers=layers,
                   cross=encoded.cross, cross_mask=encoded.mask)

  def step(self, params, tokens: jax.Array, cache: KVCache, logits_at=None):
    """Block step: tokens [B, K] -> (logits [B, K, V] float32, cache).

    Writes the K tokens at each row's length and advances lengths by K.
    With ``logits_at`` ([B] int32 block indices) only that position's logits
    are computed, [B, 1, V] (prefill and catch-up blocks skip the vocabulary
    projection of the other positions).
    """
    check_tokens(tokens, self.config.vocab_size)
    cache_lib.check_capacity(cache.lengths, tokens.shape[1], cache.max_length)
    return self._apply(params, tokens, cache, logits_at, method="decode")

  def forward(self, params, tokens: jax.Array, inputs: jax.Array | None = None):
    """Uncached reference forward: (inputs [B,S], tokens [B,T]) -> [B,T,V]."""
    if inputs is None:
      raise ValueError("T5 forward needs inputs= (the encoder token ids)")
    check_tokens(inputs, self.config.vocab_size, "encoder inputs")
    check_tokens(tokens, self.config.vocab_size)
    return self._apply(params, inputs, tokens, method="forward")
