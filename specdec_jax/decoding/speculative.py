"""The speculative decode loop: draft gamma tokens, verify them in one block.

One ``lax.while_loop`` runs the whole generation inside ``jit``; each
iteration is one draft phase (the drafter proposes gamma tokens into a fixed
[B, gamma] buffer), one verifier block step on ``[pending, drafts]``, the
masked verification kernel (``kernel.verify_block``) and a per-row rollback
of both caches by index arithmetic. Rows advance independently.

Drafter catch-up: when all gamma drafts of a row were accepted and the target
does not need the drafter's distribution at the bonus position, the drafter
never saw the last draft; the next draft phase then starts with a 2-token
block ``[last_draft, pending]`` (otherwise ``[pending, pad]`` with one valid
token). Targets that do need it (every target but SpecDecode) run the drafter
one extra step, which also caches the last draft.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding import keys as keys_lib
from specdec_jax.decoding import program as program_lib
from specdec_jax.decoding import sampling
from specdec_jax.decoding.kernel import verify_block
from specdec_jax.decoding.state import (Request, Stats, all_finite, emit,
                                        prefill)
from specdec_jax.models.cache import KVCache


@struct.dataclass
class FallbackStop:
  """BiLD's fallback policy: stop drafting when the drafter is unsure.

  Drafting of a row stops at the first position whose unscaled drafter
  confidence ``max q`` is below ``alpha``; drafts from there on are not
  proposed (the verifier produces that token). The draft loop exits as soon
  as every row has stopped, so at batch 1 the draft window is dynamic.

  Attributes:
    alpha: [] or [B] fallback threshold alpha_FB in [0, 1].
  """

  alpha: jax.Array = 0.5


@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """Static configuration of a decode call (hashable, part of the jit key).

  Attributes:
    gamma: draft block size (>= 1).
    max_new: static output buffer size (>= every row's max_new_tokens).
    eos_id: end-of-sequence id, or None to ignore EOS.
    pad_id: filler of unused output slots.
  """

  gamma: int
  max_new: int
  eos_id: int | None
  pad_id: int = 0


@struct.dataclass
class SpecState:
  """Loop state of speculative decoding.

  Attributes:
    step: [] int32 iterations done.
    tokens: [B, max_new + gamma + 1] int32 generated tokens.
    num_out: [B] int32 tokens emitted so far.
    pending: [B] int32 last emitted token (in neither cache yet).
    catchup: [B] int32 last accepted draft the drafter has not cached.
    catchup_valid: [B] bool whether ``catchup`` must be fed first.
    done: [B] bool finished rows (frozen).
    finite: [B] bool False once a row met a NaN/inf logit.
    q_cache: drafter KVCache.
    p_cache: verifier KVCache.
    stats: per-row Stats.
  """

  step: jax.Array
  tokens: jax.Array
  num_out: jax.Array
  pending: jax.Array
  catchup: jax.Array
  catchup_valid: jax.Array
  done: jax.Array
  finite: jax.Array
  q_cache: KVCache
  p_cache: KVCache
  stats: Stats


def _draft_phase(drafter, q_params, state: SpecState, strategy, req: Request,
                 cfg: LoopConfig, extra: bool, stop: FallbackStop | None):
  """Drafts gamma tokens per row (plus q at the bonus position if ``extra``).

  Returns:
    (drafts [B, gamma], q_logits [B, gamma + 1, V], q_cache, limit [B] or
    None (BiLD: number of confident drafts), drafter calls []).
  """
  gamma, b = cfg.gamma, state.pending.shape[0]
  cv = state.catchup_valid & ~state.done

  def catch_up(_):  # some row must first feed its last accepted draft
    first = jnp.where(cv[:, None],
                      jnp.stack([state.catchup, state.pending], 1),
                      jnp.stack([state.pending, jnp.full_like(
                          state.pending, cfg.pad_id)], 1))
    logits, cache = drafter.step(q_params, first, state.q_cache,
                                 logits_at=cv.astype(jnp.int32))
    return logits[:, 0], cache.with_lengths(
        state.q_cache.lengths + 1 + cv.astype(jnp.int32))

  def plain(_):
    logits, cache = drafter.step(q_params, state.pending[:, None],
                                 state.q_cache)
    return logits[:, 0], cache

  l0, cache = lax.cond(jnp.any(cv), catch_up, plain, None)  # [B, V]
  v = l0.shape[-1]
  q_buf = jnp.zeros((b, gamma + 1, v), jnp.float32).at[:, 0].set(l0)
  drafts = jnp.zeros((b, gamma), jnp.int32)
  feeds = gamma - 1 + int(extra)

  def draw(logits, j):  # [B, V] -> [B]
    k = keys_lib.row_keys(req.seed, req.request_id, state.num_out + j,
                          keys_lib.DRAFT)
    return sampling.sample(k, strategy.probs(logits))

  def still_drafting(q_buf, j):
    if stop is None:
      return jnp.ones((b,), bool)
    conf = jnp.max(sampling.unscaled(q_buf[:, j]), axis=-1)
    return conf >= sampling.per_row(stop.alpha, 1)

  def cond(carry):
    j, _, _, _, live = carry
    return (j < feeds) & jnp.any(live & ~state.done)

  def body(carry):
    j, cache, q_buf, drafts, live = carry
    d = draw(lax.dynamic_index_in_dim(q_buf, j, 1, keepdims=False), j)
    drafts = lax.dynamic_update_index_in_dim(drafts, d, jnp.minimum(
        j, gamma - 1), 1)
    logits, cache = drafter.step(q_params, d[:, None], cache)
    q_buf = lax.dynamic_update_index_in_dim(q_buf, logits[:, 0], j + 1, 1)
    live = live & still_drafting(q_buf, j + 1)
    return j + 1, cache, q_buf, drafts, live

  live0 = still_drafting(q_buf, 0)
  j, cache, q_buf, drafts, _ = lax.while_loop(
      cond, body, (jnp.int32(0), cache, q_buf, drafts, live0))
  if not extra:  # the last draft comes from q_{gamma-1}, never fed
    drafts = drafts.at[:, gamma - 1].set(draw(q_buf[:, gamma - 1], gamma - 1))
  limit = None
  if stop is not None:
    conf = jnp.max(sampling.unscaled(q_buf[:, :gamma]), axis=-1)  # [B, g]
    unsure = conf < sampling.per_row(stop.alpha, 2)
    limit = jnp.where(jnp.any(unsure, 1), jnp.argmax(unsure, 1), gamma)
  return drafts, q_buf, cache, limit, j + 1


def _body(drafter, verifier, q_params, p_params, strategy, target, stop,
          req: Request, cfg: LoopConfig, state: SpecState) -> SpecState:
  gamma = cfg.gamma
  active = ~state.done
  extra = bool(target.needs_drafter_at_bonus)
  drafts, q_logits, q_cache, limit, d_calls = _draft_phase(
      drafter, q_params, state, strategy, req, cfg, extra, stop)

  block = jnp.concatenate([state.pending[:, None], drafts], axis=1)
  p_len = state.p_cache.lengths
  p_logits, p_cache = verifier.step(p_params, block, state.p_cache)
  finite = state.finite & (~active | (all_finite(q_logits[:, :gamma])
                                      & all_finite(p_logits)))

  q, p = sampling.unscaled(q_logits), sampling.unscaled(p_logits)
  sq, sp = strategy.probs(q_logits), strategy.probs(p_logits)
  start = state.num_out
  u = keys_lib.block_uniforms(req.seed, req.request_id, start, gamma)
  out = verify_block(
      target, drafts, q, p, sq, sp, u,
      key_residual=keys_lib.row_keys(req.seed, req.request_id, start,
                                     keys_lib.RESIDUAL),
      key_bonus=keys_lib.row_keys(req.seed, req.request_id, start + gamma,
                                  keys_lib.DRAFT),
      limit=limit)

  n, tok = out.accepted, out.token
  iota = jnp.arange(gamma + 1)[None, :]
  padded = jnp.concatenate([drafts, jnp.zeros_like(drafts[:, :1])], axis=1)
  cand = jnp.where(iota < n[:, None], padded,
                   jnp.where(iota == n[:, None], tok[:, None], cfg.pad_id))
  tokens, num_out, finished, count = emit(
      state.tokens, state.num_out, cand, n + 1, active, cfg.eos_id,
      req.max_new_tokens, cfg.pad_id)

  # Roll both caches back to [prefix, pending, accepted drafts].
  new_p_len = p_len + 1 + n
  full = n == gamma
  lag = (~jnp.asarray(extra)) & full  # drafter never fed the last draft
  new_q_len = new_p_len - lag.astype(jnp.int32)
  keep = lambda new, old: jnp.where(active, new, old)
  p_cache = p_cache.with_lengths(keep(new_p_len, p_len))
  q_cache = q_cache.with_lengths(keep(new_q_len, state.q_cache.lengths))
  # Deferral mass of the positions whose tokens were emitted.
  defer = jnp.sum(jnp.where(iota < count[:, None], out.defer, 0.0), axis=1)
  stats = state.stats.add(active, drafted=gamma, accepted=n, verifier_calls=1,
                          drafter_calls=d_calls, deferrals=defer)
  done = state.done | finished | ~finite
  return SpecState(
      step=state.step + 1, tokens=tokens, num_out=num_out,
      pending=keep(tok, state.pending),
      catchup=keep(drafts[:, gamma - 1], state.catchup),
      catchup_valid=keep(lag, state.catchup_valid), done=done, finite=finite,
      q_cache=q_cache, p_cache=p_cache, stats=stats)


@struct.dataclass
class LoopOutput:
  """What every decode loop returns (device arrays).

  Attributes:
    tokens: [B, W >= max_new] int32 generated tokens, pad after the end.
    num_out: [B] int32 number of generated tokens per row.
    stats: per-row Stats.
    finite: [B] bool, False if the row met a NaN/inf logit.
    confidence: [B] float32 sum of log max q over the response
      (autoregressive programs; SeqCascade's deferral statistic), or None.
  """

  tokens: jax.Array
  num_out: jax.Array
  stats: Stats
  finite: jax.Array
  confidence: jax.Array | None = None


def start_caches(model, params, prompt, prompt_len, inputs, capacity):
  """Encodes (encoder-decoder), allocates and prefills one model's cache.

  Returns:
    (cache, pending [B]).
  """
  encoded = model.encode(params, inputs) if model.is_encoder_decoder else None
  cache = model.init_cache(prompt.shape[0], capacity, encoded)
  return prefill(model, params, prompt, prompt_len, cache)


def capacity(prompt_width: int, cfg: LoopConfig, chunk: int = 0) -> int:
  """Cache slots: prompt + new tokens + gamma + 1 of slack (+ a chunk)."""
  return prompt_width + cfg.max_new + cfg.gamma + 2 + chunk


def speculative_program(drafter, verifier, cfg: LoopConfig,
                        has_stop: bool) -> program_lib.LoopProgram:
  """Speculative decoding as a LoopProgram (see ``program.py``).

  ``args = (q_params, p_params, batch)``; the target is
  ``batch.method.spec_target()`` and BiLD's fallback
  ``batch.method.spec_stop()``.

  Args:
    drafter, verifier: DecodeModels sharing a vocabulary.
    cfg: static LoopConfig.
    has_stop: whether the method has a draft stop (BiLD).
  """
  key = ("speculative", drafter, verifier, cfg, has_stop)

  def build():
    def init(args) -> SpecState:
      q_params, p_params, batch = args
      b, width = batch.prompt.shape
      cap = capacity(width, cfg)
      q_cache, pending = start_caches(drafter, q_params, batch.prompt,
                                      batch.prompt_len, batch.inputs, cap)
      p_cache, _ = start_caches(verifier, p_params, batch.prompt,
                                batch.prompt_len, batch.inputs, cap)
      zeros = jnp.zeros((b,), jnp.int32)
      return SpecState(
          step=jnp.int32(0),
          tokens=jnp.full((b, cfg.max_new + cfg.gamma + 1), cfg.pad_id,
                          jnp.int32),
          num_out=zeros, pending=pending, catchup=zeros,
          catchup_valid=jnp.zeros((b,), bool),
          done=batch.req.max_new_tokens <= 0, finite=jnp.ones((b,), bool),
          q_cache=q_cache, p_cache=p_cache, stats=Stats.zeros(b))

    def cond(args, s: SpecState):
      return (s.step < cfg.max_new) & ~jnp.all(s.done)

    def body(args, s: SpecState) -> SpecState:
      q_params, p_params, batch = args
      stop = batch.method.spec_stop() if has_stop else None
      return _body(drafter, verifier, q_params, p_params, batch.strategy,
                   batch.method.spec_target(), stop, batch.req, cfg, s)

    def finish(args, s: SpecState) -> LoopOutput:
      return LoopOutput(tokens=s.tokens[:, :cfg.max_new], num_out=s.num_out,
                        stats=s.stats, finite=s.finite)

    return program_lib.LoopProgram(key, init, cond, body, finish)

  return program_lib.cached_program(key, build)
