"""Gemma 1, 2 and 3 decoder-only transformers.

RoPE, MHA/MQA/GQA, RMSNorm with ``(1 + scale)``, input embedding scaled by
sqrt(d), output tied to the input embedding, GeGLU MLP. Gemma 2 adds the
attention-logit soft cap (50), final-logit soft cap (30), alternating local
sliding-window (layer 0 local) and global layers, a configurable query
pre-attention scalar (27B: d / heads) and post-attention / post-FFW norms.
Gemma 3 keeps Gemma 2's four norms, drops both soft caps, adds an RMSNorm of
queries and keys over head_dim before RoPE (QK-norm), runs 5 local : 1 global
layers with RoPE base 10k on local and 1M on global layers (global positions
divided by 8 on 4B/12B/27B).

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
    layer_{i}/attn/query_norm/scale  [head_dim]  (Gemma 3) = _query_norm
    layer_{i}/attn/key_norm/scale    [head_dim]  (Gemma 3) = _key_norm
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
from specdec_jax.models import masks as masks_lib
from specdec_jax.models.base import FlaxDecodeModel
from specdec_jax.models.cache import KVCache, LayerKV
from specdec_jax.models.gemma_config import (GEMMA_PRESETS, GLOBAL, LOCAL,
                                             GemmaConfig)
from specdec_jax.models.interface import check_tokens
from specdec_jax.models.layers import (RMSNorm, apply_rope, attend, dtype_of,
                                       gelu_tanh, param_with_axes, soft_cap)

__all__ = ["GEMMA_PRESETS", "GLOBAL", "GemmaConfig", "GemmaModel",
           "GemmaModule", "LOCAL"]


class Kernel(nn.Module):
  """A bias-free projection whose kernel 'kernel' has its contracted axes
  first and its output axes last, so every matmul reads the weight in place
  (XLA:CPU copies a kernel whose contracted axis sits in the middle).

  Attributes:
    shape: kernel shape, contracted axes first.
    axes: logical name of every kernel axis.
    n_in: number of contracted (leading) axes.
  """

  shape: tuple[int, ...]
  axes: tuple[str, ...]
  n_in: int = 1
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[B, T, *shape[:n_in]] -> [B, T, *shape[n_in:]]."""
    w = param_with_axes(self, "kernel", nn.initializers.variance_scaling(
        1.0, "fan_in", "normal", in_axis=tuple(range(self.n_in)),
        out_axis=tuple(range(self.n_in, len(self.shape)))),
                        self.shape, self.param_dtype, self.axes)
    fan_in = 1
    for n in self.shape[:self.n_in]:
      fan_in *= n
    w2 = w.astype(self.dtype).reshape(fan_in, -1)
    x2 = x.astype(self.dtype).reshape(*x.shape[:2], fan_in)
    out = jnp.einsum("BTI,IO->BTO", x2, w2)
    return out.reshape(*x.shape[:2], *self.shape[self.n_in:])


class Attention(nn.Module):
  """Gemma attention with RoPE, GQA, optional soft cap / QK-norm (window via
  mask).

  Attributes:
    config: hyperparameters.
    layer: index of the layer (its RoPE base and scale).
  """

  config: GemmaConfig
  layer: int = 0

  def setup(self):
    cfg = self.config
    dt, pdt = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    n, k, d, h = cfg.num_heads, cfg.num_kv_heads, cfg.d_model, cfg.head_dim
    self.q = Kernel((d, n, h), ("embed", "heads", "head_dim"), 1, dt, pdt)
    self.kv = Kernel((d, 2, k, h), ("embed", "stack", "kv_heads", "head_dim"),
                     1, dt, pdt)
    self.out = Kernel((n, h, d), ("heads", "head_dim", "embed"), 2, dt, pdt)
    if cfg.use_qk_norm:
      self.query_norm = _norm(cfg, axis_name="head_dim")
      self.key_norm = _norm(cfg, axis_name="head_dim")

  def __call__(self, x, positions, mask, layer_cache: LayerKV | None,
               lengths):
    """Attention over a block.

    Args:
      x: [B, K, d] normalised inputs.
      positions: [B, K] absolute positions of the block (RoPE).
      mask: [B, K, T] (cached) or [B, K, K] (uncached) bool, the window of
        a local layer already applied.
      layer_cache: LayerKV [B, T, kv_heads, head_dim] or None (uncached).
      lengths: [B] write offsets (cached path).

    Returns:
      ([B, K, d], updated LayerKV or None).
    """
    cfg = self.config
    q = self.q(x)  # 'BTD,DNH->BTNH'
    kv = self.kv(x)  # 'BTD,DCKH->BTCKH'
    k, v = kv[:, :, 0], kv[:, :, 1]
    if cfg.use_qk_norm:
      q, k = self.query_norm(q), self.key_norm(k)  # over head_dim
    base, scale = cfg.rope(self.layer)
    q = apply_rope(q, positions, base, scale)
    k = apply_rope(k, positions, base, scale)
    q = q * jnp.asarray(cfg.query_pre_attn_scalar**-0.5, q.dtype)
    if layer_cache is None:
      kv = LayerKV(k=k, v=v)
    else:
      kv = cache_lib.write_block(layer_cache, k, v, lengths)
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
    gate = Kernel((d, 2, f), ("embed", "stack", "mlp"), 1, dt, pdt,
                  name="gating")(x)  # [B, K, 2, F]
    h = gelu_tanh(gate[:, :, 0]) * gate[:, :, 1]
    return Kernel((f, d), ("mlp", "embed"), 1, dt, pdt, name="linear")(h)


def _norm(cfg: GemmaConfig, name=None, axis_name="embed") -> RMSNorm:
  return RMSNorm(eps=cfg.norm_eps, plus_one=True, dtype=dtype_of(cfg.dtype),
                 param_dtype=dtype_of(cfg.param_dtype), name=name,
                 axis_name=axis_name)


class Block(nn.Module):
  config: GemmaConfig
  layer: int = 0

  def setup(self):
    cfg = self.config
    self.pre_attention_norm = _norm(cfg)
    self.attn = Attention(cfg, self.layer)
    if cfg.use_post_attn_norm:
      self.post_attention_norm = _norm(cfg)
    self.pre_ffw_norm = _norm(cfg)
    self.mlp = FeedForward(cfg)
    if cfg.use_post_ffw_norm:
      self.post_ffw_norm = _norm(cfg)

  def __call__(self, x, positions, mask, layer_cache, lengths):
    """x [B, K, d] -> ([B, K, d], LayerKV or None); see Attention."""
    cfg = self.config
    h, layer_cache = self.attn(self.pre_attention_norm(x), positions, mask,
                               layer_cache, lengths)
    if cfg.use_post_attn_norm:
      h = self.post_attention_norm(h)
    x = x + h
    h = self.mlp(self.pre_ffw_norm(x))
    if cfg.use_post_ffw_norm:
      h = self.post_ffw_norm(h)
    return x + h, layer_cache


class GemmaModule(nn.Module):
  """The Gemma network; see :class:`GemmaModel` for the decode interface.

  Attributes:
    config: hyperparameters.
    depth: layers run by decode/forward (None: all; early exit). Every
      layer's params exist.
  """

  config: GemmaConfig
  depth: int | None = None

  def setup(self):
    cfg = self.config
    self.embedder = Embedder(cfg)
    self.layers = [Block(cfg, i, name=f"layer_{i}")
                   for i in range(cfg.num_layers)]
    self.final_norm = _norm(cfg)

  def _windows(self) -> list[int | None]:
    """Sliding window of every run layer (None: global)."""
    cfg = self.config
    return [cfg.window(i) for i in range(self.depth or cfg.num_layers)]

  def _run(self, tokens, positions, masks, caches, lengths, logits_at=None):
    """Embed, run the layers, project: tokens [B, K] -> ([B, K|1, V], kvs)."""
    x = self.embedder.encode(tokens)
    new = []
    for i, window in enumerate(self._windows()):
      x, lkv = self.layers[i](x, positions, masks[window],
                              None if caches is None else caches[i], lengths)
      new.append(lkv)
    x = cache_lib.select_positions(x, logits_at)
    logits = self.embedder.decode(self.final_norm(x))
    return soft_cap(logits, self.config.final_logit_softcap), new

  def decode(self, tokens: jax.Array, cache: KVCache, positions=None,
             mask=None, logits_at=None):
    """Cached block step: tokens [B, K] -> (logits [B, K|1, V] f32, cache).

    Args:
      tokens: [B, K] int32.
      cache: KVCache of the run layers.
      positions: [B, K] or [B, M + K] int32, or None (``lengths +
        arange(K)``).
      mask: [B, K, K] bool in-block mask, [B, K, M + K] (also over the last
        M cached slots; ``models/masks.py``), or None (causal).
      logits_at: [B] or [B, P] int32, or None.
    """
    k = tokens.shape[1]
    q_pos, _, masks = masks_lib.step_masks(
        cache.lengths, k, cache.max_length, set(self._windows()), positions,
        mask)
    logits, layers = self._run(tokens, q_pos, masks, cache.layers,
                               cache.lengths, logits_at)
    return logits, cache.replace(lengths=cache.lengths + k,
                                 layers=tuple(layers))

  def forward(self, tokens: jax.Array) -> jax.Array:
    """Uncached causal forward: tokens [B, T] -> logits [B, T, V] float32."""
    b, t = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    masks = {w: cache_lib.causal_mask(positions, t, w)
             for w in set(self._windows())}
    return self._run(tokens, positions, masks, None, None)[0]

  def init_all(self, tokens):
    return self.forward(tokens)


class Embedder(nn.Module):
  """'input_embedding' [vocab, d]: scaled lookup in, tied projection out."""

  config: GemmaConfig

  def setup(self):
    cfg = self.config
    self.input_embedding = param_with_axes(
        self, "input_embedding", nn.initializers.normal(),
        (cfg.vocab_size, cfg.d_model), dtype_of(cfg.param_dtype),
        ("vocab", "embed"))

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
  """Gemma 1 / 2 / 3 behind the decode interface (see ``models/interface.py``).

  Attributes:
    config: hyperparameters.
    exit_layer: early exit after this many layers (None: all).
  """

  config: GemmaConfig
  exit_layer: int | None = None

  is_encoder_decoder = False

  def module(self) -> GemmaModule:
    return GemmaModule(self.config, depth=self.exit_layer)

  def dummy_init_args(self):
    return (jnp.ones((1, 2), jnp.int32),)

  @property
  def num_decoder_layers(self) -> int:
    return self.config.num_layers

  def kv_shape(self) -> tuple[int, int]:
    return self.config.num_kv_heads, self.config.head_dim

  @classmethod
  def axes_examples(cls) -> tuple["GemmaModel", ...]:
    """Small models holding every kind of Gemma parameter (Gemma 2 has the
    post-attention / post-FFW norms on top of Gemma 1's, Gemma 3 the QK-norm)."""
    return (cls(GEMMA_PRESETS["gemma3_tiny"]), cls(GEMMA_PRESETS["gemma2_tiny"]),
            cls(GEMMA_PRESETS["gemma_tiny"]))

  def encode(self, params, inputs):
    raise ValueError("Gemma is decoder-only: it has no encoder; put the prompt "
                     "in the decoder tokens instead")

  def forward(self, params, tokens: jax.Array, inputs=None) -> jax.Array:
    """Uncached reference forward: tokens [B, T] -> logits [B, T, V]."""
    if inputs is not None:
      raise ValueError("Gemma is decoder-only: forward takes no inputs=")
    check_tokens(tokens, self.config.vocab_size)
    return self._apply(params, tokens, method="forward")
