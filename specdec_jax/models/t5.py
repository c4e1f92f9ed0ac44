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

import flax.linen as nn
import jax
import jax.numpy as jnp

from specdec_jax.models import cache as cache_lib
from specdec_jax.models import masks as masks_lib
from specdec_jax.models.base import FlaxDecodeModel
from specdec_jax.models.cache import KVCache
from specdec_jax.models.interface import Encoded, check_tokens
from specdec_jax.models.layers import dtype_of
from specdec_jax.models.t5_config import T5_PRESETS, T5Config
from specdec_jax.models.t5_layers import (Dense, DecoderLayer, Embed,
                                          EncoderLayer, RelativePositionBias,
                                          norm, relpos_bucket_table,
                                          relpos_buckets)

__all__ = ["T5Config", "T5Model", "T5Module", "T5_PRESETS",
           "relpos_bucket_table", "relpos_buckets"]


class T5Module(nn.Module):
  """The T5 v1.1 network; see :class:`T5Model` for the decode interface.

  Attributes:
    config: hyperparameters.
    depth: decoder layers run by decode/forward (None: all; early exit).
  """

  config: T5Config
  depth: int | None = None

  def setup(self):
    cfg = self.config
    dt, pdt = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    self.token_embedder = Embed(cfg.vocab_size, cfg.d_model, dt, pdt)
    self.encoder = T5Stack(cfg, decoder=False)
    self.decoder = T5Stack(cfg, decoder=True, depth=self.depth)

  def encode(self, inputs: jax.Array):
    """inputs [B, S] -> (encoded [B, S, d], mask [B, S] bool)."""
    mask = inputs != self.config.pad_id
    return self.encoder.encode(self.token_embedder(inputs), mask), mask

  def encode_for_decoding(self, inputs: jax.Array):
    """inputs [B, S] -> (tuple of cross LayerKV per run decoder layer, mask)."""
    encoded, mask = self.encode(inputs)
    return self.decoder.cross_kv(encoded), mask

  def decode(self, tokens: jax.Array, cache: KVCache, positions=None,
             mask=None, logits_at=None):
    """Cached block step: tokens [B, K] -> (logits [B, K|1, V] f32, cache)."""
    return self.decoder.step(self.token_embedder(tokens), cache, positions,
                             mask, logits_at)

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
  """Encoder (``decoder=False``) or decoder stack.

  Attributes:
    config: hyperparameters.
    decoder: decoder (causal, cross-attention, LM head) or encoder.
    depth: decoder layers run (None: all); every layer's params exist.
  """

  config: T5Config
  decoder: bool
  depth: int | None = None

  def setup(self):
    cfg = self.config
    self.relpos_bias = RelativePositionBias(
        cfg.num_heads, cfg.relpos_buckets, cfg.relpos_max_distance,
        bidirectional=not self.decoder)
    if self.decoder:
      self.layers = [DecoderLayer(cfg, name=f"layers_{i}")
                     for i in range(cfg.num_decoder_layers)]
      self.decoder_norm = norm(cfg, None)
      self.logits_dense = Dense(cfg.vocab_size, ("embed", "vocab"),
                                dtype_of(cfg.dtype), dtype_of(cfg.param_dtype))
    else:
      self.layers = [EncoderLayer(cfg, name=f"layers_{i}")
                     for i in range(cfg.num_encoder_layers)]
      self.encoder_norm = norm(cfg, None)

  def _run_layers(self):
    """The decoder layers this stack runs (the first ``depth``)."""
    return self.layers[:self.depth] if self.depth else self.layers

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
    """Encoder output [B, S, d] -> one cross LayerKV per run layer."""
    return tuple(layer.cross_kv(encoded) for layer in self._run_layers())

  def _logits(self, x):
    x = self.decoder_norm(x)
    return self.logits_dense(x).astype(jnp.float32)

  def full(self, x, cross, cross_mask):
    """Uncached decoder over x [B, T, d] -> logits [B, T, V]."""
    b, t = x.shape[:2]
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    bias = self.relpos_bias(pos, pos)
    mask = cache_lib.causal_mask(pos, t)
    for layer, ckv in zip(self._run_layers(), cross):
      x, _ = layer(x, self_cache=None, lengths=None, mask=mask, bias=bias,
                   cross=ckv, cross_mask=cross_mask)
    return self._logits(x)

  def step(self, x, cache: KVCache, positions=None, mask=None,
           logits_at=None):
    """Cached decoder block over x [B, K, d] -> (logits [B, K|1, V], cache).

    Args:
      x: [B, K, d] embedded block.
      cache: KVCache of the run layers.
      positions: [B, K] or [B, M + K] int32, or None (``lengths +
        arange(K)``).
      mask: [B, K, K] bool in-block mask, [B, K, M + K] (also over the last
        M cached slots; ``models/masks.py``), or None (causal).
      logits_at: [B] or [B, P] int32, or None.
    """
    k = x.shape[1]
    q_pos, k_pos, masks = masks_lib.step_masks(
        cache.lengths, k, cache.max_length, (None,), positions, mask)
    bias = self.relpos_bias(q_pos, k_pos)  # [B, H, K, T]
    new_layers = []
    for layer, lkv, ckv in zip(self._run_layers(), cache.layers, cache.cross):
      x, lkv = layer(x, self_cache=lkv, lengths=cache.lengths,
                     mask=masks[None], bias=bias, cross=ckv,
                     cross_mask=cache.cross_mask)
      new_layers.append(lkv)
    x = cache_lib.select_positions(x, logits_at)
    return self._logits(x), cache.replace(lengths=cache.lengths + k,
                                          layers=tuple(new_layers))


@dataclasses.dataclass(frozen=True)
class T5Model(FlaxDecodeModel):
  """T5 v1.1 behind the decode interface (see ``models/interface.py``).

  Attributes:
    config: hyperparameters.
    exit_layer: early exit after this many decoder layers (None: all).
  """

  config: T5Config
  exit_layer: int | None = None

  is_encoder_decoder = True

  def module(self) -> T5Module:
    return T5Module(self.config, depth=self.exit_layer)

  def dummy_init_args(self):
    ids = jnp.ones((1, 2), jnp.int32)
    return ids, ids

  @property
  def num_decoder_layers(self) -> int:
    return self.config.num_decoder_layers

  def kv_shape(self) -> tuple[int, int]:
    return self.config.num_heads, self.config.head_dim

  @classmethod
  def axes_examples(cls) -> tuple["T5Model", ...]:
    """Small models holding every kind of T5 parameter (axes collection)."""
    return (cls(T5_PRESETS["t5_tiny"]),)

  def encode(self, params, inputs: jax.Array) -> Encoded:
    """Runs the encoder once and projects its output to cross K/V.

    Args:
      params: parameter tree.
      inputs: [B, S] int32 source ids, right-padded with 0.

    Returns:
      Encoded with cross K/V [B, S, H, D] for each of the ``depth`` decoder
      layers this model runs, and mask [B, S].
    """
    check_tokens(inputs, self.config.vocab_size, "encoder inputs")
    cross, mask = self._apply(params, inputs, method="encode_for_decoding")
    return Encoded(cross=tuple(cross), mask=mask)

  def forward(self, params, tokens: jax.Array, inputs: jax.Array | None = None):
    """Uncached reference forward: (inputs [B,S], tokens [B,T]) -> [B,T,V]."""
    if inputs is None:
      raise ValueError("T5 forward needs inputs= (the encoder token ids)")
    check_tokens(inputs, self.config.vocab_size, "encoder inputs")
    check_tokens(tokens, self.config.vocab_size)
    return self._apply(params, inputs, tokens, method="forward")
