"""The speculative decode loop: draft a chain, verify it in one block.

One ``lax.while_loop`` runs the whole generation inside ``jit``; each
iteration is one draft phase (level 0, the drafter, fills a [B, gamma]
buffer: ``drafting.draft_chain``), one verifier block step on ``[pending,
drafts]`` (level 1), the chain verification kernel (``verify/chain.py``)
and a per-row rollback of both caches by index arithmetic. Rows advance
independently.
"""

from __future__ import annotations

from typing import Hashable, Protocol

import jax.numpy as jnp
from jax import lax

from specdec_jax.decoding.loops import state as state_lib
from specdec_jax.decoding.loops.drafting import FallbackStop, draft_chain
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.loops.output import BlockTrace, output
from specdec_jax.decoding.loops.state import (
    Batch, DraftState, Level, LoopConfig, Stream, all_finite)
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.verify.chain import verify_block
from specdec_jax.decoding.verify.greedy import greedy_verifiable, verify_greedy


class SpecRule(Protocol, Hashable):
  """The static rule of a speculative method (hashable, in the jit key).

  ``bind(knobs)`` returns ``(target, stop)`` with the traced knobs: the
  target distribution T(q, p) and an optional draft-stop policy (BiLD).
  """

  def bind(self, knobs: dict) -> tuple[object, FallbackStop | None]:
    ...


def _body(models, params, batch: Batch, cfg: LoopConfig, rule: SpecRule,
          state: DraftState) -> DraftState:
  drafter, verifier = models
  (q_level, p_level), stream = state.levels, state.stream
  target, stop = rule.bind(batch.knobs)
  strategy = cfg.strategy(batch)
  req, gamma, active = batch.req, cfg.gamma, ~stream.done
  extra = bool(target.needs_drafter_at_bonus)
  draft = draft_chain(drafter, params[0], q_level.cache, stream,
                      state.catchup, state.catchup_valid, strategy, req, cfg,
                      extra, stop)
  drafts, q_logits = draft.drafts, draft.logits  # [B, g], [B, g + 1, V]

  block = jnp.concatenate([stream.pending[:, None], drafts], axis=1)
  p_len = p_level.cache.lengths
  p_logits, p_cache = verifier.step(params[1], block, p_level.cache)
  finite = stream.finite & (~active | (all_finite(q_logits[:, :gamma])
                                       & all_finite(p_logits)))

  def verify():
    q, p = sampling.unscaled(q_logits), sampling.unscaled(p_logits)
    sq, sp = strategy.probs(q_logits), strategy.probs(p_logits)  # [B,g+1,V]
    start = stream.num_out
    u = keys_lib.block_uniforms(req.seed, req.request_id, start, gamma)
    return verify_block(
        target, drafts, q, p, sq, sp, u,
        key_residual=keys_lib.row_keys(req.seed, req.request_id, start,
                                       keys_lib.RESIDUAL),
        key_bonus=keys_lib.row_keys(req.seed, req.request_id, start + gamma,
                                    keys_lib.DRAFT),
        limit=draft.limit)

  if greedy_verifiable(target, stop):
    out = lax.cond(sampling.is_cold(strategy),
                   lambda: verify_greedy(drafts, p_logits),
                   lambda: verify().replace(pi=None))
  else:
    out = verify()
  n, tok = out.accepted, out.token  # [B], [B]
  iota = jnp.arange(gamma + 1)[None, :]
  padded = jnp.concatenate([drafts, jnp.zeros_like(drafts[:, :1])], axis=1)
  cand = jnp.where(iota < n[:, None], padded,
                   jnp.where(iota == n[:, None], tok[:, None], cfg.pad_id))
  new_stream, _ = stream.emit(cand, n + 1, req, cfg, finite, out.defer)

  # Roll both caches back to [prefix, pending, accepted drafts].
  new_p_len = p_len + 1 + n
  lag = (~jnp.asarray(extra)) & (n == gamma)  # drafter never fed the last
  new_q_len = new_p_len - lag.astype(jnp.int32)
  keep = lambda new, old: jnp.where(active, new, old)
  q_level = q_level.replace(cache=draft.cache.with_lengths(
      keep(new_q_len, q_level.cache.lengths))).count(active,
                                                     calls=draft.calls)
  p_level = p_level.replace(cache=p_cache.with_lengths(
      keep(new_p_len, p_len))).count(active, calls=1, drafted=gamma,
                                     accepted=n, rejected=n < gamma)
  trace = state.trace
  if trace is not None:
    trace = trace.record(stream.step, active, drafts, out.accept, n, tok)
  return DraftState(
      stream=new_stream, levels=(q_level, p_level),
      catchup=keep(drafts[:, gamma - 1], state.catchup),
      catchup_valid=keep(lag, state.catchup_valid), trace=trace)


def chain_program(models: tuple, cfg: LoopConfig,
                  rule: SpecRule) -> LoopProgram:
  """Speculative decoding of a (drafter, verifier) stack as a LoopProgram.

  Args:
    models: (drafter, verifier) DecodeModels sharing a vocabulary.
    cfg: static LoopConfig (its topology must be a chain).
    rule: the method's static rule (target and optional draft stop).
  """
  if not cfg.topology.is_chain:
    raise ValueError(f"the speculative chain loop needs a chain topology, "
                     f"got {cfg.topology}")

  def init(args) -> DraftState:
    params, batch = args
    b, width = batch.prompt.shape
    cap = state_lib.capacity(width, cfg)
    q_cache, pending = state_lib.start_cache(models[0], params[0], batch, cap)
    p_cache, _ = state_lib.start_cache(models[1], params[1], batch, cap)
    zeros = jnp.zeros((b,), jnp.int32)
    trace = (BlockTrace.start(b, cfg.max_new, cfg.gamma) if cfg.trace
             else None)
    return DraftState(
        stream=Stream.start(pending, batch.req, cfg.max_new + cfg.gamma + 1,
                            cfg.pad_id),
        levels=(Level.start(q_cache, b), Level.start(p_cache, b)),
        catchup=zeros, catchup_valid=jnp.zeros((b,), bool), trace=trace)

  def cond(args, s: DraftState):
    return (s.stream.step < cfg.max_new) & ~jnp.all(s.stream.done)

  def body(args, s: DraftState) -> DraftState:
    params, batch = args
    return _body(models, params, batch, cfg, rule, s)

  def finish(args, s: DraftState):
    return output(s.stream, s.levels, cfg, trace=s.trace)

  return LoopProgram(("speculative", models, cfg, rule), init, cond, body,
                     finish)
