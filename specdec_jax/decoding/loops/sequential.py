"""Sequential (non-speculative) baselines, each one jitted while_loop.

* :func:`autoregressive_program` -- target-only or drafter-only sampling
  (one level of the stack runs, one token per call).
* :func:`oracle_program` -- OracleCascade (Alg. 3): both models run every
  token and the token is drawn from T(q, p); with a cascade target this is
  the token-level process the speculative cascade reproduces.
* :func:`seq_cascade_program` -- SeqCascade[Chow]: the drafter decodes every
  row; rows whose sequence confidence is too low are decoded again by the
  verifier, in the same program (the verifier is not even prefilled when no
  row defers).
* ``token_cascade.py`` -- TokenCascade (Alg. 2).

Every token at output position o is drawn with the DRAFT key stream of o, so
the drafter-only baseline and a speculative decode whose drafts are all
accepted produce the same tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding.loops import state as state_lib
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.loops.output import LoopOutput, output
from specdec_jax.decoding.loops.state import (Batch, Level, LoopConfig,
                                              Stream, all_finite)
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.knobs import Static
from specdec_jax.decoding.rules.targets import effective


@struct.dataclass
class ARState:
  """Loop state of one-token-at-a-time decoding.

  Attributes:
    stream: the emitted token stream.
    levels: (drafter, verifier) levels; a level a loop does not run has no
      cache.
    logconf: [B] float32 sum of log max q (sequence confidence) of the
      decoding model.
  """

  stream: Stream
  levels: tuple[Level, Level]
  logconf: jax.Array


def draft_keys(batch: Batch, stream: Stream) -> jax.Array:
  """[B] DRAFT-stream keys at each row's next output position."""
  return keys_lib.row_keys(batch.req.seed, batch.req.request_id,
                           stream.num_out, keys_lib.DRAFT)


def start_state(batch: Batch, cfg: LoopConfig, pending, caches) -> ARState:
  b = batch.prompt.shape[0]
  return ARState(stream=Stream.start(pending, batch.req, cfg.max_new + 1,
                                     cfg.pad_id),
                 levels=tuple(Level.start(c, b) for c in caches),
                 logconf=jnp.zeros((b,), jnp.float32))


def loop_cond(cfg: LoopConfig):
  return lambda args, s: (s.stream.step < cfg.max_new) & ~jnp.all(
      s.stream.done)


def loop_finish(cfg: LoopConfig):
  return lambda args, s: output(s.stream, s.levels, cfg,
                                          confidence=s.logconf)


def autoregressive_program(models: tuple, cfg: LoopConfig, level: int,
                           confidence: bool = False) -> LoopProgram:
  """Plain sampling with one model of the stack.

  With ``confidence``, ``LoopOutput.confidence`` is the sum over the
  response of log max q (unscaled), SeqCascade's sequence confidence;
  without it the loop skips that V-wide softmax (0 is returned).

  Args:
    models: (drafter, verifier); only ``models[level]`` runs.
    cfg: static LoopConfig (the topology is unused).
    level: 1 for target-only, 0 for drafter-only.
    confidence: accumulate the sequence confidence.
  """
  model = models[level]

  def init(args) -> ARState:
    params, batch = args
    cap = state_lib.capacity(batch.prompt.shape[1], cfg)
    cache, pending = state_lib.start_cache(model, params[level], batch, cap)
    caches = [None, None]
    caches[level] = cache
    return start_state(batch, cfg, pending, caches)

  def body(args, s: ARState) -> ARState:
    params, batch = args
    lv, active = s.levels[level], ~s.stream.done
    logits, cache = model.step(params[level], s.stream.pending[:, None],
                               lv.cache)
    logits = logits[:, 0]  # [B, V]
    finite = s.stream.finite & (~active | all_finite(logits))
    strategy = cfg.strategy(batch)
    if sampling.LEAN:  # a greedy batch: argmax, no keys, no V-wide search
      tok = sampling.draw(lambda: draft_keys(batch, s.stream), logits,
                          strategy)  # [B]
    else:
      tok = sampling.sample(draft_keys(batch, s.stream),
                            strategy.probs(logits))
    conf = 0.0
    if confidence or not sampling.LEAN:
      conf = jnp.log(jnp.max(sampling.unscaled(logits), axis=-1))  # [B]
    stream, _ = s.stream.emit(tok[:, None], jnp.ones_like(tok), batch.req,
                              cfg, finite)
    levels = list(s.levels)
    levels[level] = lv.keep_cache(active, cache).count(active, calls=1)
    return ARState(stream=stream, levels=tuple(levels),
                   logconf=s.logconf + jnp.where(active, conf, 0.0))

  return LoopProgram(("autoregressive", model, level, cfg, confidence), init,
                     loop_cond(cfg), body, loop_finish(cfg))


def oracle_program(models: tuple, cfg: LoopConfig,
                   target: Static) -> LoopProgram:
  """OracleCascade: both models every token, token ~ effective(T(q,p), S(q)).

  Args:
    models: (drafter, verifier).
    cfg: static LoopConfig.
    target: static half of the target rule (its knobs are in the batch).
  """
  drafter, verifier = models

  def init(args) -> ARState:
    params, batch = args
    cap = state_lib.capacity(batch.prompt.shape[1], cfg)
    q_cache, pending = state_lib.start_cache(drafter, params[0], batch, cap)
    p_cache, _ = state_lib.start_cache(verifier, params[1], batch, cap)
    return start_state(batch, cfg, pending, (q_cache, p_cache))

  def body(args, s: ARState) -> ARState:
    params, batch = args
    rule, strategy = target.bind(batch.knobs), cfg.strategy(batch)
    (q_level, p_level), active = s.levels, ~s.stream.done
    pending = s.stream.pending[:, None]
    ql, q_cache = drafter.step(params[0], pending, q_level.cache)
    pl, p_cache = verifier.step(params[1], pending, p_level.cache)
    finite = s.stream.finite & (~active | (all_finite(ql) & all_finite(pl)))
    sq = strategy.probs(ql)  # [B, 1, V]
    pi, defer = rule(sampling.unscaled(ql), sampling.unscaled(pl), sq,
                     strategy.probs(pl))
    dist = pi[:, 0] if rule.normalized else effective(pi, sq)[:, 0]
    tok = sampling.sample(draft_keys(batch, s.stream), dist)  # [B]
    stream, _ = s.stream.emit(tok[:, None], jnp.ones_like(tok), batch.req,
                              cfg, finite, defer)
    levels = (q_level.keep_cache(active, q_cache).count(active, calls=1),
              p_level.keep_cache(active, p_cache).count(active, calls=1))
    return s.replace(stream=stream, levels=levels)

  return LoopProgram(("oracle", models, cfg, target), init, loop_cond(cfg),
                     body, loop_finish(cfg))


@struct.dataclass
class SeqState:
  """SeqCascade state: the drafter's finished pass and the verifier loop.

  Attributes:
    first: LoopOutput of the drafter's pass over every row.
    defer: [B] bool rows the verifier decodes again.
    ar: ARState of the verifier's pass (deferred rows only).
  """

  first: LoopOutput
  defer: jax.Array
  ar: ARState


def seq_cascade_program(models: tuple, cfg: LoopConfig) -> LoopProgram:
  """SeqCascade[Chow] as ONE program (knob ``alpha`` in the batch).

  The drafter's sequence confidence is ``prod_t max q_t`` over its response
  (unscaled q); a row defers when it is below ``1 - alpha``, and the
  verifier then decodes that row's whole response. A deferred row counts
  all its tokens as deferred.
  """
  first_pass = autoregressive_program(models, cfg, level=0, confidence=True)
  second = autoregressive_program(models, cfg, level=1)

  def init(args) -> SeqState:
    params, batch = args
    first = first_pass(args)
    alpha = batch.knobs["alpha"]  # [B]
    floor = jnp.log(jnp.maximum(1.0 - alpha, 1e-30))
    defer = (first.confidence < floor) & (batch.req.max_new_tokens > 0)
    req = batch.req.replace(max_new_tokens=jnp.where(
        defer, batch.req.max_new_tokens, 0))
    args2 = (params, batch.replace(req=req))

    def skip(_):  # nothing deferred: the verifier is never even prefilled
      shapes = jax.eval_shape(second.init, args2)
      ar = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes)
      return ar.replace(stream=ar.stream.replace(
          done=jnp.ones_like(ar.stream.done)))

    ar = lax.cond(jnp.any(defer), second.init, skip, args2)
    return SeqState(first=first, defer=defer, ar=ar)

  def cond(args, s: SeqState):
    return second.cond(args, s.ar)

  def body(args, s: SeqState) -> SeqState:
    params, batch = args
    req = batch.req.replace(max_new_tokens=jnp.where(
        s.defer, batch.req.max_new_tokens, 0))
    return s.replace(ar=second.body((params, batch.replace(req=req)), s.ar))

  def finish(args, s: SeqState) -> LoopOutput:
    first, defer, out = s.first, s.defer, second.finish(args, s.ar)
    pick = lambda a, c: jnp.where(
        defer.reshape(defer.shape + (1,) * (a.ndim - 1)), c, a)
    num_out = pick(first.num_out, out.num_out)
    return LoopOutput(
        tokens=pick(first.tokens, out.tokens), num_out=num_out,
        levels=(first.levels[0], out.levels[1]),
        deferrals=jnp.where(defer, num_out, 0).astype(jnp.float32),
        finite=first.finite & (~defer | out.finite),
        confidence=first.confidence)

  return LoopProgram(("seq_cascade", models, cfg), init, cond, body, finish)
