"""Loop state shared by the decode loops, and the helpers that update it.

Conventions (every loop): a row's generated tokens go to ``tokens`` at
``num_out``; the last emitted token is ``pending`` and is *not yet* in any
cache (the next model call feeds it), so a prompt of length P is prefilled
with its first P - 1 tokens cached and its last token pending. A finished row
(``done``) is frozen: the body keeps computing it (fixed shapes) but none of
its state changes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specdec_jax.models.cache import KVCache


@struct.dataclass
class Request:
  """Per-row request parameters (all [batch]).

  Attributes:
    seed: [B] uint32 random seed of each request.
    request_id: [B] int32 id of each request (keys derive from it).
    max_new_tokens: [B] int32 tokens to generate at most (<= the static
      buffer size of the call).
  """

  seed: jax.Array
  request_id: jax.Array
  max_new_tokens: jax.Array


@struct.dataclass
class Batch:
  """Every per-row input of a decode call (all leading dims are [batch]).

  Attributes:
    prompt: [B, P] int32 decoder-side prompts, right-padded.
    prompt_len: [B] int32 prompt lengths (>= 1).
    inputs: [B, S] int32 encoder inputs (encoder-decoder) or None.
    req: per-row Request.
    strategy: sampling transform (a pytree; knobs [B]).
    method: the decoding method object (a pytree; knobs [B]).
  """

  prompt: jax.Array
  prompt_len: jax.Array
  inputs: jax.Array | None
  req: "Request"
  strategy: object
  method: object


@struct.dataclass
class Stats:
  """Per-row counters (all [batch]).

  Attributes:
    drafted: int32 draft tokens proposed.
    accepted: int32 draft tokens accepted.
    verifier_calls: int32 calls of the verifier (target) model.
    drafter_calls: int32 calls of the drafter model.
    deferrals: float32 summed deferral mass (delta for cascades, eta for
      token-specific rules) over the decided positions.
  """

  drafted: jax.Array
  accepted: jax.Array
  verifier_calls: jax.Array
  drafter_calls: jax.Array
  deferrals: jax.Array

  @classmethod
  def zeros(cls, batch: int) -> "Stats":
    z = jnp.zeros((batch,), jnp.int32)
    return cls(drafted=z, accepted=z, verifier_calls=z, drafter_calls=z,
               deferrals=jnp.zeros((batch,), jnp.float32))

  def add(self, active: jax.Array, **inc) -> "Stats":
    """Adds ``inc`` ([B] or scalar per field) on active rows only."""
    upd = {k: getattr(self, k) + jnp.where(active, v, 0).astype(
        getattr(self, k).dtype) for k, v in inc.items()}
    return self.replace(**upd)


def prefill(model, params, prompt: jax.Array, prompt_len: jax.Array,
            cache: KVCache) -> tuple[KVCache, jax.Array]:
  """Caches prompt[:, :len - 1] of every row; returns (cache, pending).

  Args:
    model: a DecodeModel.
    params: its parameters.
    prompt: [B, P] int32 right-padded prompts (decoder side).
    prompt_len: [B] int32 lengths, >= 1.
    cache: empty cache.

  Returns:
    (cache with lengths prompt_len - 1, pending [B] = last prompt token).
  """
  if prompt.shape[1] > 1:
    at = jnp.zeros(prompt.shape[:1], jnp.int32)  # logits unused: project one
    _, cache = model.step(params, prompt, cache, logits_at=at)
  cache = cache.with_lengths(prompt_len - 1)
  pending = jnp.take_along_axis(prompt, (prompt_len - 1)[:, None], axis=1)[:, 0]
  return cache, pending.astype(jnp.int32)


def emit(tokens: jax.Array, num_out: jax.Array, block: jax.Array,
         count: jax.Array, active: jax.Array, eos_id: int | None,
         max_new: jax.Array, pad_id: int):
  """Appends the first ``count`` tokens of ``block`` to each active row.

  Truncates at the first EOS (kept) and at ``max_new`` tokens.

  Args:
    tokens: [B, N] output buffer (N >= max_new + block width).
    num_out: [B] tokens already emitted.
    block: [B, W] candidate tokens.
    count: [B] how many of them are real (1..W).
    active: [B] rows still decoding.
    eos_id: end-of-sequence id, or None.
    max_new: [B] per-row budget.
    pad_id: filler for unused slots.

  Returns:
    (tokens, num_out, finished [B] bool, count [B] actually emitted).
  """
  width = block.shape[1]
  iota = jnp.arange(width)[None, :]
  if eos_id is not None:
    is_eos = (block == eos_id) & (iota < count[:, None])
    has_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, count)
  else:
    has_eos = jnp.zeros_like(active)
  count = jnp.minimum(count, max_new - num_out)
  block = jnp.where(iota < count[:, None], block, pad_id)
  write = jax.vmap(lambda buf, b, s: jax.lax.dynamic_update_slice_in_dim(
      buf, b, s, 0))
  new_tokens = write(tokens, block.astype(tokens.dtype), num_out)
  tokens = jnp.where(active[:, None], new_tokens, tokens)
  count = jnp.where(active, count, 0)
  num_out = num_out + count
  finished = active & (has_eos | (num_out >= max_new))
  return tokens, num_out, finished, count


def all_finite(logits: jax.Array) -> jax.Array:
  """[B, ...] -> [B] bool: every entry of the row is finite."""
  return jnp.all(jnp.isfinite(logits.reshape(logits.shape[0], -1)), axis=1)
