"""Gemma 1 and Gemma 2 decoder-only transformers.

RoPE, MHA/MQA/GQA, RMSNorm with ``(1 + scale)``, input embedding scaled by
sqrt(d), output tied to the input embedding, GeGLU MLP. Gemma 2 adds the
attention-logit soft cap (50), final-logit soft cap (30), alternating local
sliding-window (layer 0 local) and global layers, a configurable query
pre-attention scalar (27B: d / heads) and post-attention / post-FFW norms.

Parameters. Every kernel keeps its contracted axes first and its output axes
last, so each projection is one matmul that reads the weight in place (the
official einsum layouts put the contracted axis in the middle, which makes
XLA:CPU copy the whole weight on every call: 5x slower decoding here). The
checkpoint readers convert from the official layout (right column):

    embedder/input_embedding         [vocab, d]          = embedder/input_embedding
    layer_{i}/pre_attention_norm/scale [d]                = same
    layer_{i}/attn/q/kernel          [d, heads, head_dim] <- q_einsum/w [N,d,H]
                                                            (or qkv_einsum/w[0])
    layer_{i}/attn/kv/kernel         [d, 2, kv_heads, head_dim] <- kv_einsum/w
                                                            [2,K,d,H] (qkv[1:])
    layer_{i}/attn/out/kernel        [heads, head_dim, d] = attn_vec_einsum/w
    layer_{i}/post_attention_norm/scale [d]  (Gemma 2)    = same
    layer_{i}/pre_ffw_norm/scale     [d]                  = same
    layer_{i}/mlp/gating/kernel      [d, 2, mlp]          <- gating_einsum [2,d,F]
                                                            ([2,F,d] if transposed)
    layer_{i}/mlp/linear/kernel      [mlp, d]             = mlp/linear
    layer_{i}/post_ffw_norm/scale    [d]      (Gemma 2)   = same
    final_norm/scale                 [d]                  = same
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import cache as cache_lib
from specdec_jax.models.cache import KVCache, LayerKV
from specdec_jax.models.interface import FlaxDecodeModel, check_tokens
from specdec_jax.models.layers import (RMSNorm, apply_rope, attend, dtype_of,
                                       gelu_tanh, soft_cap)

GLOBAL = "global"
LOCAL = "local"


@dataclasses.dataclass(frozen=True)
class GemmaConfig:
  """Hyperparameters of a Gemma 1 / Gemma 2 model.

  Attributes:
    vocab_size: embedding rows (256128 for the public checkpoints).
    d_model: embedding / residual width.
    num_layers: transformer blocks.
    num_heads: query heads.
    num_kv_heads: key/value heads (1 = MQA, < heads = GQA).
    head_dim: size of each head.
    mlp_dim: hidden size of the GeGLU MLP.
    attention_types: per-layer 'global' or 'local' (sliding window); its
      length must equal num_layers.
    sliding_window: window of the local layers (4096 for Gemma 2).
    query_pre_attn_scalar: queries are multiplied by this ** -0.5
      (head_dim for all but Gemma 2 27B, where it is d_model / num_heads).
    attn_logit_softcap: Gemma 2: 50.0; None disables.
    final_logit_softcap: Gemma 2: 30.0; None disables.
    use_post_attn_norm: Gemma 2 post-attention norm.
    use_post_ffw_norm: Gemma 2 post-FFW norm.
    transpose_gating_einsum: the official checkpoint stores the gating kernel
      as [2, mlp, d] (9B / 27B) instead of [2, d, mlp]; only the checkpoint
      reader uses it (our own layout is the same for every size).
    rope_base: RoPE base frequency.
    norm_eps: RMSNorm epsilon.
    dtype: compute dtype.
    param_dtype: parameter dtype.
    pad_id, eos_id, bos_id: special ids of the Gemma tokenizer.
  """

  vocab_size: int = 256128
  d_model: int = 2048
  num_layers: int = 18
  num_heads: int = 8
  num_kv_heads: int = 1
  head_dim: int = 256
  mlp_dim: int = 16384
  attention_types: tuple[str, ...] = ()
  sliding_window: int | None = None
  query_pre_attn_scalar: float | None = None
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  use_post_attn_norm: bool = False
  use_post_ffw_norm: bool = False
  transpose_gating_einsum: bool = False
  rope_base: float = 10_000.0
  norm_eps: float = 1e-6
  dtype: str = "float32"
  param_dtype: str = "float32"
  pad_id: int = 0
  eos_id: int = 1
  bos_id: int = 2

  def __post_init__(self):
    for field in ("vocab_size", "d_model", "num_layers", "num_heads",
                  "num_kv_heads", "head_dim", "mlp_dim"):
      if int(getattr(self, field)) < 1:
        raise ValueError(f"GemmaConfig.{field} must be >= 1, got "
                         f"{getattr(self, field)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                       f"num_kv_heads ({self.num_kv_heads})")
    if not self.attention_types:
      object.__setattr__(self, "attention_types", (GLOBAL,) * self.num_layers)
    if len(self.attention_types) != self.num_layers:
      raise ValueError(f"attention_types has {len(self.attention_types)} "
                       f"entries, expected num_layers={self.num_layers}")
    bad = [t for t in self.attention_types if t not in (GLOBAL, LOCAL)]
    if bad:
      raise ValueError(f"attention_types entries must be 'global' or 'local', "
                       f"got {bad[0]!r}")
    if LOCAL in self.attention_types and not self.sliding_window:
      raise ValueError("local attention layers need sliding_window >= 1")
    if self.query_pre_attn_scalar is None:
      object.__setattr__(self, "query_pre_attn_scalar", float(self.head_dim))
    dtype_of(self.dtype)
    dtype_of(self.param_dtype)

  def window(self, layer: int) -> int | None:
    """Sliding window of ``layer`` (None for global layers)."""
    return self.sliding_window if self.attention_types[layer] == LOCAL else None


def _gemma2(num_layers, **kw) -> GemmaConfig:
  return GemmaConfig(
      num_layers=num_layers,
      attention_types=(LOCAL, GLOBAL) * (num_layers // 2),
      sliding_window=kw.pop("sliding_window", 4096), attn_logit_softcap=50.0,
      final_logit_softcap=30.0, use_post_attn_norm=True,
      use_post_ffw_norm=True, **kw)


# Published hyperparameters (google-deepmind/gemma transformer configs).
GEMMA_PRESETS: dict[str, GemmaConfig] = {
    "gemma_2b": GemmaConfig(d_model=2048, num_layers=18, num_heads=8,
                            num_kv_heads=1, head_dim=256, mlp_dim=16384),
    "gemma_7b": GemmaConfig(d_model=3072, num_layers=28, num_heads=16,
                            num_kv_heads=16, head_dim=256, mlp_dim=24576),
    "gemma2_2b": _gemma2(26, d_model=2304, num_heads=8, num_kv_heads=4,
                         head_dim=256, mlp_dim=9216),
    "gemma2_9b": _gemma2(42, d_model=3584, num_heads=16, num_kv_heads=8,
                         head_dim=256, mlp_dim=14336,
                         transpose_gating_einsum=True),
    "gemma2_27b": _gemma2(46, d_model=4608, num_heads=32, num_kv_heads=16,
                          head_dim=128, mlp_dim=36864,
                          query_pre_attn_scalar=4608 / 32,
                          transpose_gating_einsum=True),
    # Tiny configs for tests (random weights).
    "gemma_tiny": GemmaConfig(vocab_size=64, d_model=32, num_layers=2,
                              num_heads=4, num_kv_heads=1, head_dim=8,
                              mlp_dim=64),
    "gemma2_tiny": _gemma2(2, vocab_size=64, d_model=32, num_heads=4,
                           num_kv_heads=2, head_dim=8, mlp_dim=64,
                           sliding_window=4),
}


class Kernel(nn.Module):
  """A bias-free projection whose kernel 'kernel' has its contracted axes
  first and its output axes last, so every matmul reads the weight in place
  (XLA:CPU copies a kernel whose contracted axis sits in the middle)."""

  shape: tuple[int, ...]
  n_in: int = 1
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, T, *shape[:n_in]] -> [B, T, *shape[n_in:]]."""
    w = self.param("kernel", nn.initializers.variance_scaling(
        1.0, "fan_in", "normal", in_axis=tuple(range(self.n_in)),
        out_axis=tuple(range(self.n_in, len(self.shape)))),
                   self.shape, self.param_dtype)
    fan_in = 1
    for n in self.shape[:self.n_in]:
      fan_in *= n
    w2 = w.astype(self.dtype).reshape(fan_in, -1)
    x2 = x.astype(self.dtype).reshape(*x.shape[:2], fan_in)
    out = jnp.einsum("BTI,IO->BTO", x2, w2)
    return out.reshape(*x.shape[:2], *self.shape[self.n_in:])


class Attention(nn.Module):
  """Gemma attention with RoPE, GQA, optional soft cap and sliding window."""

  config: GemmaConfig
  window: int | None

  def setup(self):
    cfg = self.config
    dt, pdt = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    n, k, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.d_model, cfg.head_dim
    self.q = Kernel((d, n, h), 1, dt, pdt)
    self.kv = Kernel((d, 2, k, h), 1, dt, pdt)
    self.out = Kernel((n, h, d), 2, dt, pdt)

  def __call__(self, x, positions, layer_cache: LayerKV | None, lengths):
    """Attention over a block.

    Args:
      x: [B, K, d] normalised inputs.
      positions: [B, K] absolute positions of the block.
      layer_cache: LayerKV [B, T, kv_heads, head_dim] or None (uncached).
      lengths: [B] write offsets (cached path).

    Returns:
      ([B, K, d], updated LayerKV or None).
    """
    cfg = self.config
    q = self.q(x)  # 'BTD,DNH->BTNH'
    kv = self.kv(x)  # 'BTD,DCKH->BTCKH'
    k, v = kv[:, :, 0], kv[:, :, 1]
    q = apply_rope(q, positions, cfg.rope_base)
    k = apply_rope(k, positions, cfg.rope_base)
    q = q * jnp.asarray(cfg.query_pre_attn_scalar**-0.5, q.dtype)
    if layer_cache is None:
      kv = LayerKV(k=k, v=v)
      mask = cache_lib.causal_mask(positions, x.shape[1], self.window)
    else:
      kv = cache_lib.write_block(layer_cache, k, v, lengths)
      mask = cache_lib.causal_mask(positions, layer_cache.k.shape[1],
                                   self.window)
    ctx = attend(q, kv.k, kv.v, mask, logit_cap=cfg.attn_logit_softcap)
    return self.out(ctx), (kv if layer_cache is not None else None)


class FeedForward(nn.Module):
  """GeGLU: linear(gelu(gate_0 x) * gate_1 x)."""

  config: GemmaConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, K, d] -> [B, K, d]."""
    cfg = self.config
    dt, pdt = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    f, d = cfg.mlp_dim, cfg.d_model
    gate = Kernel((d, 2, f), 1, dt, pdt, name="gating")(x)  # [B, K, 2, F]
    h = gelu_tanh(gate[:, :, 0]) * gate[:, :, 1]
    return Kernel((f, d), 1, dt, pdt, name="linear")(h)


def _norm(cfg: GemmaConfig, name=None) -> RMSNorm:
  return RMSNorm(eps=cfg.norm_eps, plus_one=True, dtype=dtype_of(cfg.dtype),
                 param_dtype=dtype_of(cfg.param_dtype), name=name)


class Block(nn.Module):
  config: GemmaConfig
  window: int | None

  def setup(self):
    cfg = self.config
    self.pre_attention_norm = _norm(cfg)
    self.attn = Attention(cfg, self.window)
    if cfg.use_post_attn_norm:
      self.post_attention_norm = _norm(cfg)
    self.pre_ffw_norm = _norm(cfg)
    self.mlp = FeedForward(cfg)
    if cfg.use_post_ffw_norm:
      self.post_ffw_norm = _norm(cfg)

  def __call__(self, x, positions, layer_cache, lengths):
    """x [B, K, d] -> ([B, K, d], LayerKV or None)."""
    cfg = self.config
    h, layer_cache = self.attn(self.pre_attention_norm(x), positions,
                               layer_cache, lengths)
    if cfg.use_post_attn_norm:
      h = self.post_attention_norm(h)
    x = x + h
    h = self.mlp(self.pre_ffw_norm(x))
    if cfg.use_post_ffw_norm:
      h = self.post_ffw_norm(h)
    return x + h, layer_cache


class GemmaModule(nn.Module):
  """The Gemma network; see :class:`GemmaModel` for the decode interface."""

  config: GemmaConfig

  def setup(self):
    cfg = self.config
    self.embedder = Embedder(cfg)
    self.layers = [Block(cfg, cfg.window(i), name=f"layer_{i}")
                   for i in range(cfg.num_layers)]
    self.final_norm = _norm(cfg)

  def _run(self, tokens, positions, caches, lengths, logits_at=None):
    x = self.embedder.encode(tokens)
    new = []
    for i, layer in enumerate(self.layers):
      x, lkv = layer(x, positions, None if caches is None else caches[i],
                     lengths)
      new.append(lkv)
    x = cache_lib.select_positions(x, logits_at)
    logits = self.embedder.decode(self.final_norm(x))
    return soft_cap(logits, self.config.final_logit_softcap), new

  def decode(self, tokens: jax.Array, cache: KVCache, logits_at=None):
    """Cached block step: tokens [B, K] -> (logits [B, K|1, V] f32, cache)."""
    k = tokens.shape[1]
    positions = cache_lib.block_positions(cache.lengths, k)
    logits, layers = self._run(tokens, positions, cache.layers, cache.lengths,
                               logits_at)
    return logits, cache.replace(lengths=cache.lengths + k,
                                 layers=tuple(layers))

  def forward(self, tokens: jax.Array) -> jax.Array:
    """Uncached causal forward: tokens [B, T] -> logits [B, T, V] float32."""
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return self._run(tokens, positions, None, None)[0]

  def init_all(self, tokens):
    return self.forward(tokens)


class Embedder(nn.Module):
  """'input_embedding' [vocab, d]: scaled lookup in, tied projection out."""

  config: GemmaConfig

  def setup(self):
    cfg = self.config
    self.input_embedding = self.param(
        "input_embedding", nn.initializers.normal(),
        (cfg.vocab_size, cfg.d_model), dtype_of(cfg.param_dtype))

  def encode(self, tokens: jax.Array) -> jax.Array:
    """[B, K] -> [B, K, d], scaled by sqrt(d)."""
    dt = dtype_of(self.config.dtype)
    x = jnp.take(self.input_embedding, tokens, axis=0).astype(dt)
    return x * jnp.sqrt(jnp.asarray(self.config.d_model, jnp.float32)).astype(dt)

  def decode(self, x: jax.Array) -> jax.Array:
    """[B, K, d] -> logits [B, K, V] float32 (tied embedding)."""
    dt = dtype_of(self.config.dtype)
    return jnp.einsum("BTD,VD->BTV", x.astype(dt),
                      self.input_embedding.astype(dt),
                      preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True)
class GemmaModel(FlaxDecodeModel):
  """Gemma 1 / 2 behind the decode interface (see ``models/interface.py``)."""

  config: GemmaConfig

  is_encoder_decoder = False

  def module(self) -> GemmaModule:
    return GemmaModule(self.config)

  def _dummy_init_args(self):
    return (jnp.ones((1, 2), jnp.int32),)

  @property
  def eos_id(self) -> int:
    return self.config.eos_id

  def encode(self, params, inputs):
    raise ValueError("Gemma is decoder-only: it has no encoder; put the prompt "
                     "in the decoder tokens instead")

  def init_cache(self, batch: int, max_length: int, encoded=None,
                 dtype=None) -> KVCache:
    """Empty cache (all lengths 0).

    Args:
      batch: rows.
      max_length: positions per row (prompt + new tokens + gamma + 1 slack).
      encoded: must be None (decoder-only).
      dtype: cache dtype, default the compute dtype.
    """
    if encoded is not None:
      raise ValueError("Gemma is decoder-only: init_cache takes no encoded=")
    cfg = self.config
    layers = cache_lib.init_layers(batch, max_length, cfg.num_layers,
                                   cfg.num_kv_heads, cfg.head_dim,
                                   dtype or self.dtype())
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32), layers=layers)

  def step(self, params, tokens: jax.Array, cache: KVCache, logits_at=None):
    """Block step: tokens [B, K] -> (logits [B, K, V] float32, cache).

    With ``logits_at`` ([B] int32 block indices) only that position's logits
    are computed, [B, 1, V].
    """
    check_tokens(tokens, self.config.vocab_size)
    cache_lib.check_capacity(cache.lengths, tokens.shape[1], cache.max_length)
    return self._apply(params, tokens, cache, logits_at, method="decode")

  def forward(self, params, tokens: jax.Array, inputs=None) -> jax.Array:
    """Uncached reference forward: tokens [B, T] -> logits [B, T, V]."""
    if inputs is not None:
      raise ValueError("Gemma is decoder-only: forward takes no inputs=")
    check_tokens(tokens, self.config.vocab_size)
    return self._apply(params, tokens, method="forward")
