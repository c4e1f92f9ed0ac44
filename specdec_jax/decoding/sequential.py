"""Sequential (non-speculative) baselines, each one jitted while_loop.

* :func:`autoregressive_loop` -- target-only or drafter-only sampling.
* :func:`oracle_loop` -- OracleCascade (Alg. 3): both models run every token
  and the token is drawn from T(q, p); with a cascade target this is the
  token-level process the speculative cascade reproduces.
* :func:`token_cascade_loop` -- TokenCascade (Alg. 2): the drafter runs every
  token; the verifier runs only when the drafter-only rule (Chow) defers, and
  then first catches up on the tokens it has not seen, in parallel chunks.
* :func:`seq_cascade_loop` -- SeqCascade: decode the whole response with the
  drafter; if its sequence confidence is below 1 - alpha, decode the whole
  response again with the verifier.

Every token at output position o is drawn with the DRAFT key stream of o, so
the drafter-only baseline and a speculative decode whose drafts are all
accepted produce the same tokens.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding import keys as keys_lib
from specdec_jax.decoding import sampling
from specdec_jax.decoding.speculative import (LoopConfig, LoopOutput,
                                              capacity, start_caches)
from specdec_jax.decoding.state import Request, Stats, all_finite, emit
from specdec_jax.decoding.targets import Chow, effective
from specdec_jax.models.cache import KVCache


@struct.dataclass
class ARState:
  """Loop state of one-token-at-a-time decoding.

  Attributes:
    step: [] int32 iterations done.
    tokens: [B, max_new + 1] int32 generated tokens.
    num_out: [B] int32 tokens emitted.
    pending: [B] int32 last token (not yet cached).
    done: [B] bool finished rows.
    finite: [B] bool False once a NaN/inf logit was seen.
    cache: KVCache of the decoding model (the drafter for cascades).
    aux_cache: verifier KVCache (cascades) or None.
    aux_len: [B] int32 prefix length the verifier has cached (token cascade:
      it lags behind when it was not needed).
    logconf: [B] float32 sum of log max q (sequence confidence).
    stats: per-row Stats.
  """

  step: jax.Array
  tokens: jax.Array
  num_out: jax.Array
  pending: jax.Array
  done: jax.Array
  finite: jax.Array
  cache: KVCache
  aux_cache: KVCache | None
  aux_len: jax.Array
  logconf: jax.Array
  stats: Stats


def _init(b, cfg, cache, pending, req, aux_cache=None, done=None):
  return ARState(
      step=jnp.int32(0),
      tokens=jnp.full((b, cfg.max_new + 1), cfg.pad_id, jnp.int32),
      num_out=jnp.zeros((b,), jnp.int32), pending=pending,
      done=(req.max_new_tokens <= 0) if done is None else done,
      finite=jnp.ones((b,), bool), cache=cache, aux_cache=aux_cache,
      aux_len=jnp.zeros((b,), jnp.int32),
      logconf=jnp.zeros((b,), jnp.float32), stats=Stats.zeros(b))


def _emit_one(s: ARState, tok, req, cfg, active, finite):
  tokens, num_out, finished, _ = emit(
      s.tokens, s.num_out, tok[:, None], jnp.ones_like(tok), active,
      cfg.eos_id, req.max_new_tokens, cfg.pad_id)
  return dict(tokens=tokens, num_out=num_out,
              pending=jnp.where(active, tok, s.pending),
              done=s.done | finished | ~finite)


def _draft_keys(req, s):
  return keys_lib.row_keys(req.seed, req.request_id, s.num_out,
                           keys_lib.DRAFT)


def _loop(state, body, cfg):
  cond = lambda s: (s.step < cfg.max_new) & ~jnp.all(s.done)
  return lax.while_loop(cond, body, state)


def _output(s: ARState, cfg) -> LoopOutput:
  return LoopOutput(tokens=s.tokens[:, :cfg.max_new], num_out=s.num_out,
                    stats=s.stats, finite=s.finite)


def _ar_body(model, params, strategy, req, cfg, role, s: ARState) -> ARState:
  """One token from ``model``; role 'verifier' or 'drafter' for the stats."""
  active = ~s.done
  logits, cache = model.step(params, s.pending[:, None], s.cache)
  logits = logits[:, 0]
  finite = s.finite & (~active | all_finite(logits))
  tok = sampling.sample(_draft_keys(req, s), strategy.probs(logits))
  conf = jnp.log(jnp.max(sampling.unscaled(logits), axis=-1))
  upd = _emit_one(s, tok, req, cfg, active, finite)
  cache = cache.with_lengths(jnp.where(active, cache.lengths,
                                       s.cache.lengths))
  calls = {f"{role}_calls": 1}
  return s.replace(step=s.step + 1, cache=cache, finite=finite,
                   logconf=s.logconf + jnp.where(active, conf, 0.0),
                   stats=s.stats.add(active, **calls), **upd)


@functools.partial(jax.jit, static_argnames=("model", "cfg", "role"))
def autoregressive_loop(model, params, prompt, prompt_len, inputs,
                        req: Request, strategy, cfg: LoopConfig,
                        role: str = "verifier") -> LoopOutput:
  """Plain sampling with one model (target-only or drafter-only).

  Args:
    model: DecodeModel (static).
    params: its parameters.
    prompt: [B, P] decoder-side prompts; prompt_len: [B].
    inputs: [B, S] encoder inputs or None.
    req: per-row Request.
    strategy: sampling transform.
    cfg: static LoopConfig (gamma unused).
    role: 'verifier' or 'drafter' (which counter the calls go to).

  Returns:
    LoopOutput.
  """
  cache, pending = start_caches(model, params, prompt, prompt_len, inputs,
                                capacity(prompt.shape[1], cfg))
  state = _init(prompt.shape[0], cfg, cache, pending, req)
  body = functools.partial(_ar_body, model, params, strategy, req, cfg, role)
  return _output(_loop(state, body, cfg), cfg)


@functools.partial(jax.jit, static_argnames=("drafter", "verifier", "cfg"))
def oracle_loop(drafter, verifier, q_params, p_params, prompt, prompt_len,
                inputs, req: Request, strategy, target,
                cfg: LoopConfig) -> LoopOutput:
  """OracleCascade: both models every token, token ~ effective(T(q,p), S(q)).

  Returns:
    LoopOutput (drafter_calls == verifier_calls == tokens).
  """
  cap = capacity(prompt.shape[1], cfg)
  q_cache, pending = start_caches(drafter, q_params, prompt, prompt_len,
                                  inputs, cap)
  p_cache, _ = start_caches(verifier, p_params, prompt, prompt_len, inputs,
                            cap)
  state = _init(prompt.shape[0], cfg, q_cache, pending, req,
                aux_cache=p_cache)

  def body(s: ARState) -> ARState:
    active = ~s.done
    ql, q_cache = drafter.step(q_params, s.pending[:, None], s.cache)
    pl, p_cache = verifier.step(p_params, s.pending[:, None], s.aux_cache)
    ql, pl = ql[:, :1], pl[:, :1]  # [B, 1, V]
    finite = s.finite & (~active | (all_finite(ql) & all_finite(pl)))
    sq = strategy.probs(ql)
    pi, defer = target(sampling.unscaled(ql), sampling.unscaled(pl), sq,
                       strategy.probs(pl))
    dist = pi[:, 0] if target.normalized else effective(pi, sq)[:, 0]
    tok = sampling.sample(_draft_keys(req, s), dist)
    upd = _emit_one(s, tok, req, cfg, active, finite)
    keep = lambda c, old: c.with_lengths(jnp.where(active, c.lengths,
                                                   old.lengths))
    return s.replace(
        step=s.step + 1, cache=keep(q_cache, s.cache),
        aux_cache=keep(p_cache, s.aux_cache), finite=finite,
        stats=s.stats.add(active, drafter_calls=1, verifier_calls=1,
                          deferrals=defer[:, 0]), **upd)

  return _output(_loop(state, body, cfg), cfg)


@functools.partial(jax.jit,
                   static_argnames=("drafter", "verifier", "cfg", "chunk"))
def token_cascade_loop(drafter, verifier, q_params, p_params, prompt,
                       prompt_len, inputs, req: Request, strategy, rule: Chow,
                       cfg: LoopConfig, chunk: int = 16) -> LoopOutput:
  """TokenCascade (Alg. 2) with a drafter-only deferral rule (Chow).

  The verifier is called only for deferred tokens. Its cache lags behind;
  before scoring a deferred position it processes the missing prefix in
  blocks of ``chunk`` tokens (one verifier call each).

  Args:
    rule: a target whose ``deferral(q, None, None, None)`` reads q only.
    chunk: static catch-up block size.

  Returns:
    LoopOutput.
  """
  b, width = prompt.shape
  cap = capacity(width, cfg, chunk)
  q_cache, pending = start_caches(drafter, q_params, prompt, prompt_len,
                                  inputs, cap)
  encoded = verifier.encode(p_params, inputs) if verifier.is_encoder_decoder \
      else None
  p_cache = verifier.init_cache(b, cap, encoded)
  # The whole decoder-side history, from which the verifier catches up.
  hist = jnp.zeros((b, width + cfg.max_new + chunk), jnp.int32)
  hist = lax.dynamic_update_slice(hist, prompt, (0, 0))
  state = _init(b, cfg, q_cache, pending, req, aux_cache=p_cache)

  def catch_up(s: ARState, hist, need):
    """Verifier processes hist[aux_len : m] for rows in need; m = prefix."""
    m = prompt_len + s.num_out  # tokens known, the pending one included

    def cond(c):
      p_cache, _, calls = c
      return jnp.any(need & (p_cache.lengths < m))

    def body(c):
      p_cache, last, calls = c
      start = p_cache.lengths
      valid = jnp.where(need, jnp.clip(m - start, 0, chunk), 0)
      toks = jax.vmap(lambda h, st: lax.dynamic_slice_in_dim(h, st, chunk))(
          hist, start)
      logits, new = verifier.step(p_params, toks, p_cache,
                                  logits_at=jnp.maximum(valid - 1, 0))
      got = logits[:, 0]
      finished = (valid > 0) & (start + valid == m)
      last = jnp.where(finished[:, None], got, last)
      calls = calls + (valid > 0).astype(jnp.int32)
      return new.with_lengths(start + valid), last, calls

    v = drafter.vocab_size
    return lax.while_loop(cond, body, (s.aux_cache, jnp.zeros((b, v)),
                                       jnp.zeros((b,), jnp.int32)))

  def body(carry):
    s, hist = carry
    active = ~s.done
    ql, q_cache = drafter.step(q_params, s.pending[:, None], s.cache)
    ql = ql[:, :1]
    q = sampling.unscaled(ql)
    need = active & (rule.deferral(q, None, None, None)[:, 0] > 0)
    p_cache, pl, p_calls = catch_up(s, hist, need)
    finite = s.finite & (~active | all_finite(ql)) & (
        ~need | all_finite(pl))
    dist = jnp.where(need[:, None], strategy.probs(pl),
                     strategy.probs(ql)[:, 0])
    tok = sampling.sample(_draft_keys(req, s), dist)
    upd = _emit_one(s, tok, req, cfg, active, finite)
    write = jax.vmap(lambda h, t, o: lax.dynamic_update_index_in_dim(
        h, t, o, 0))
    hist = jnp.where(active[:, None],
                     write(hist, tok, prompt_len + s.num_out), hist)
    q_cache = q_cache.with_lengths(jnp.where(active, q_cache.lengths,
                                             s.cache.lengths))
    s = s.replace(step=s.step + 1, cache=q_cache, aux_cache=p_cache,
                  finite=finite,
                  stats=s.stats.add(active, drafter_calls=1,
                                    verifier_calls=p_calls,
                                    deferrals=need.astype(jnp.float32)),
                  **upd)
    return s, hist

  cond = lambda c: (c[0].step < cfg.max_new) & ~jnp.all(c[0].done)
  final, _ = lax.while_loop(cond, body, (state, hist))
  return _output(final, cfg)


@functools.partial(jax.jit, static_argnames=("drafter", "verifier", "cfg"))
def seq_cascade_loop(drafter, verifier, q_params, p_params, prompt,
                     prompt_len, inputs, req: Request, strategy, alpha,
                     cfg: LoopConfig) -> LoopOutput:
  """SeqCascade[Chow]: drafter response, redone by the verifier if unsure.

  The drafter's sequence confidence is ``prod_t max q_t`` over its response
  (unscaled q); a row defers when it is below ``1 - alpha``.

  Args:
    alpha: [] or [B] in [0, 1].

  Returns:
    LoopOutput; a deferred row counts all its tokens as deferred.
  """
  cap = capacity(prompt.shape[1], cfg)
  q_cache, pending = start_caches(drafter, q_params, prompt, prompt_len,
                                  inputs, cap)
  body = functools.partial(_ar_body, drafter, q_params, strategy, req, cfg,
                           "drafter")
  first = _loop(_init(prompt.shape[0], cfg, q_cache, pending, req), body, cfg)
  alpha = jnp.broadcast_to(jnp.asarray(alpha, jnp.float32), pending.shape)
  defer = first.logconf < jnp.log(jnp.maximum(1.0 - alpha, 1e-30))
  defer = defer & (req.max_new_tokens > 0)

  def redo(_):
    p_cache, p_pending = start_caches(verifier, p_params, prompt, prompt_len,
                                      inputs, cap)
    vbody = functools.partial(_ar_body, verifier, p_params, strategy, req,
                              cfg, "verifier")
    return _output(_loop(_init(prompt.shape[0], cfg, p_cache, p_pending, req,
                               done=~defer), vbody, cfg), cfg)

  first_out = _output(first, cfg)

  def skip(_):
    return first_out.replace(stats=Stats.zeros(pending.shape[0]))

  second = lax.cond(jnp.any(defer), redo, skip, None)
  pick = lambda a, c: jnp.where(
      defer.reshape(defer.shape + (1,) * (a.ndim - 1)), c, a)
  num_out = pick(first.num_out, second.num_out)
  stats = first.stats.replace(
      verifier_calls=second.stats.verifier_calls,
      deferrals=jnp.where(defer, num_out, 0).astype(jnp.float32))
  return LoopOutput(tokens=pick(first_out.tokens, second.tokens),
                    num_out=num_out, stats=stats,
                    finite=first.finite & (~defer | second.finite))
