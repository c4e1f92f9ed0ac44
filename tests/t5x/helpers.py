"""t5x-style ``tokens_to_logits`` closures over our tiny models, and fakes.

t5x's models build ``tokens_to_logits`` as a closure over the module and the
(already expanded) encoder output that reads ``DecodingState.cur_token``
[B*n, 1] and ``DecodingState.cache`` (a nested dict with per-layer
``cached_key`` / ``cached_value`` / ``cache_index``) and returns
(logits [B*n, V], new cache). :func:`t5x_style_decoder` does the same around a
specdec_jax model, so the decode_fn can be compared token for token with
specdec_jax's own target-only decoding of that model.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.cache import KVCache, LayerKV
from specdec_jax.t5x import decoding as t5x_decoding


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _start(model, params, batch, max_len, src, tokens):
  encoded = model.encode(params, src) if src is not None else None
  cache = model.init_cache(batch, max_len, encoded)
  if tokens is not None:
    _, cache = model.step(params, tokens, cache,
                          logits_at=jnp.zeros((batch,), jnp.int32))
  return cache


def t5x_style_decoder(model, params, batch, max_len, *, src=None,
                      num_decodes=1, prefill=None):
  """(cache dict, tokens_to_logits) the way t5x's models build them.

  Args:
    model: a T5Model (pass ``src``) or GemmaModel.
    params: its parameters.
    batch: rows B (before num_decodes expansion).
    max_len: cache positions per row.
    src: [B, S] encoder inputs (encoder-decoder models).
    num_decodes: the closure serves B * num_decodes rows, so the encoder
      output is expanded here (as t5x does before calling decode_fn).
    prefill: optional (tokens [B, P], lengths [B]): the cache holds
      tokens[:, :lengths] and its ``cache_index`` is the [B] vector lengths
      (t5x's DecoderOnlyModel prefill); otherwise the index is a scalar 0.

  Returns:
    (cache, tokens_to_logits).
  """
  cache = _start(model, params, batch, max_len,
                 None if src is None else jnp.asarray(src, jnp.int32),
                 None if prefill is None else jnp.asarray(prefill[0],
                                                          jnp.int32))
  if prefill is None:
    index = jnp.int32(0)
  else:
    index = jnp.asarray(prefill[1], jnp.int32)
  layers = {f"layers_{i}": {"cached_key": kv.k, "cached_value": kv.v,
                            "cache_index": index}
            for i, kv in enumerate(cache.layers)}
  cross, cross_mask = None, None
  if cache.cross is not None:
    expand = lambda x: t5x_decoding.flat_batch_expand(x, num_decodes)
    cross = jax.tree.map(expand, cache.cross)
    cross_mask = expand(cache.cross_mask)
  num_layers = len(cache.layers)

  def tokens_to_logits(state):
    c = state.cache
    idx = c["layers_0"]["cache_index"]
    rows = state.cur_token.shape[0]
    kv = KVCache(
        lengths=jnp.broadcast_to(idx, (rows,)).astype(jnp.int32),
        layers=tuple(LayerKV(k=c[f"layers_{i}"]["cached_key"],
                             v=c[f"layers_{i}"]["cached_value"])
                     for i in range(num_layers)),
        cross=cross, cross_mask=cross_mask)
    logits, new = model.step(params, state.cur_token, kv)
    new_cache = {f"layers_{i}": {"cached_key": l.k, "cached_value": l.v,
                                 "cache_index": idx + 1}
                 for i, l in enumerate(new.layers)}
    return logits[:, 0], new_cache

  return layers, tokens_to_logits


def successor_decoder(vocab, margin=3.0):
  """A hand-computable fake: the next token is (cur_token + 1) % vocab.

  Its logits are ``margin`` on the successor and 0 elsewhere, so every
  sampled-or-greedy successor has log-probability
  ``margin - log(exp(margin) + vocab - 1)`` under the raw logits. The cache
  counts calls per row.

  Returns:
    (cache {'calls': [B] int32}, tokens_to_logits, per-token log-prob).
  """

  def tokens_to_logits(state):
    nxt = (state.cur_token[:, 0] + 1) % vocab
    logits = margin * jax.nn.one_hot(nxt, vocab)
    return logits, {"calls": state.cache["calls"] + 1}

  lp = float(margin - np.log(np.exp(margin) + vocab - 1))
  return tokens_to_logits, lp
