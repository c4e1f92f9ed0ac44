"""Hand-computable fake models implementing the decode interface.

``RuleModel`` emits (nearly) one-hot logits for ``rule(token, position)``:
the token at absolute position t + 1 is ``rule(x_t, t)``. Its cache only
tracks per-row lengths, exactly like a real model's, so block steps, ragged
rows and rollbacks go through the real decoding code.
"""

import dataclasses
from typing import Callable

import jax.numpy as jnp

from specdec_jax.models import cache as cache_lib
from specdec_jax.models.cache import KVCache


@dataclasses.dataclass(frozen=True)
class RuleModel:
  """Decoder-only fake: logits[b, i] = margin * one_hot(rule(tok, pos))."""

  rule: Callable  # (tokens [B, K] int, positions [B, K] int) -> [B, K] int
  vocab_size: int = 16
  margin: float = 20.0
  eos_id: int = 1
  is_encoder_decoder = False

  def init_params(self, rng=None):
    return {}

  def init_cache(self, batch, max_length, encoded=None) -> KVCache:
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32),
                   layers=cache_lib.init_layers(batch, max_length, 1, 1, 1,
                                                jnp.float32))

  def step(self, params, tokens, cache, logits_at=None, *, positions=None,
           mask=None):
    del mask  # the rule reads (token, position) only: any mask is exact
    k = tokens.shape[1]
    pos = (cache_lib.block_positions(cache.lengths, k) if positions is None
           else positions)
    nxt = self.rule(tokens, pos) % self.vocab_size
    logits = self.margin * jnp.eye(self.vocab_size)[nxt]
    logits = cache_lib.select_positions(logits, logits_at)  # [B, K|1|P, V]
    return logits, cache.with_lengths(cache.lengths + k)


def plus_one(vocab=16, margin=20.0):
  """Next token = previous + 1 (mod vocab), skipping 0 and 1 (pad/EOS)."""
  return RuleModel(lambda t, p: jnp.where(t + 1 >= vocab, 2, t + 1), vocab,
                   margin)


def plus_one_except(bad_positions, vocab=16, margin=20.0):
  """Like plus_one, but at the given absolute positions it emits prev + 2."""
  bad = jnp.asarray(bad_positions)

  def rule(t, p):
    hit = jnp.any(p[..., None] == bad, axis=-1)
    nxt = jnp.where(hit, t + 2, t + 1)
    return jnp.where(nxt >= vocab, 2 + nxt - vocab, nxt)

  return RuleModel(rule, vocab, margin)


@dataclasses.dataclass(frozen=True)
class FixedModel:
  """Decoder-only fake whose next-token logits never depend on the context:
  with sampling at temperature 1, every position of a verification is an
  i.i.d. test with acceptance alpha = sum_v min(p_drafter, p_verifier)."""

  logits: tuple  # [V] floats
  eos_id: int | None = None
  is_encoder_decoder = False

  @property
  def vocab_size(self) -> int:
    return len(self.logits)

  def init_params(self, rng=None):
    return {}

  def init_cache(self, batch, max_length, encoded=None) -> KVCache:
    return KVCache(lengths=jnp.zeros((batch,), jnp.int32),
                   layers=cache_lib.init_layers(batch, max_length, 1, 1, 1,
                                                jnp.float32))

  def step(self, params, tokens, cache, logits_at=None, *, positions=None,
           mask=None):
    del positions, mask
    b, k = tokens.shape
    width = k if logits_at is None else (
        1 if logits_at.ndim == 1 else logits_at.shape[1])
    logits = jnp.broadcast_to(jnp.asarray(self.logits, jnp.float32),
                              (b, width, len(self.logits)))
    return logits, cache.with_lengths(cache.lengths + k)
