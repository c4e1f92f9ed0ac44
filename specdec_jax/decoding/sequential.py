"""Sequential (non-speculative) baselines, each one jitted while_loop.

* :func:`autoregressive_program` -- target-only or drafter-only sampling.
* :func:`oracle_program` -- OracleCascade (Alg. 3): both models run every
  token and the token is drawn from T(q, p); with a cascade target this is
  the token-level process the speculative cascade reproduces.
* :func:`token_cascade_program` -- TokenCascade (Alg. 2): the drafter runs
  every token; the verifier runs only when the drafter-only rule (Chow)
  defers, and then first catches up on the tokens it has not seen, in
  parallel chunks.
* SeqCascade (``methods.SeqCascade``) runs the drafter program, then the
  verifier program on the rows whose sequence confidence is too low.

Every token at output position o is drawn with the DRAFT key stream of o, so
the drafter-only baseline and a speculative decode whose drafts are all
accepted produce the same tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding import keys as keys_lib
from specdec_jax.decoding import program as program_lib
from specdec_jax.decoding import sampling
from specdec_jax.decoding.speculative import (LoopConfig, LoopOutput,
                                              capacity, start_caches)
from specdec_jax.decoding.state import Stats, all_finite, emit
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
    aux_cache: verifier KVCache (cascades) or None; in the token cascade
      its lengths lag behind when the verifier was not needed.
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
  logconf: jax.Array
  stats: Stats


def _init(b, cfg, cache, pending, req, aux_cache=None):
  return ARState(
      step=jnp.int32(0),
      tokens=jnp.full((b, cfg.max_new + 1), cfg.pad_id, jnp.int32),
      num_out=jnp.zeros((b,), jnp.int32), pending=pending,
      done=req.max_new_tokens <= 0, finite=jnp.ones((b,), bool), cache=cache,
      aux_cache=aux_cache, logconf=jnp.zeros((b,), jnp.float32), stats=Stats.zeros(b))


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


def _cond(cfg):
  return lambda args, s: (s.step < cfg.max_new) & ~jnp.all(s.done)


def _finish(cfg):
  return lambda args, s: LoopOutput(
      tokens=s.tokens[:, :cfg.max_new], num_out=s.num_out, stats=s.stats,
      finite=s.finite, confidence=s.logconf)


def autoregressive_program(model, cfg: LoopConfig,
                           role: str = "verifier") -> program_lib.LoopProgram:
  """Plain sampling with one model (target-only or drafter-only).

  ``args = (q_params, p_params, batch)``; role 'verifier' decodes with the
  verifier's parameters, 'drafter' with the drafter's (and counts its calls
  as drafter calls). ``LoopOutput.confidence`` is the sum over the response
  of log max q (unscaled), SeqCascade's sequence confidence.

  Args:
    model: DecodeModel.
    cfg: static LoopConfig (gamma unused).
    role: 'verifier' or 'drafter'.
  """
  key = ("autoregressive", model, cfg, role)
  pick = (lambda args: args[1]) if role == "verifier" else (
      lambda args: args[0])

  def build():
    def init(args):
      batch = args[2]
      cache, pending = start_caches(
          model, pick(args), batch.prompt, batch.prompt_len, batch.inputs,
          capacity(batch.prompt.shape[1], cfg))
      return _init(batch.prompt.shape[0], cfg, cache, pending, batch.req)

    def body(args, s: ARState) -> ARState:
      batch = args[2]
      active = ~s.done
      logits, cache = model.step(pick(args), s.pending[:, None], s.cache)
      logits = logits[:, 0]
      finite = s.finite & (~active | all_finite(logits))
      tok = sampling.sample(_draft_keys(batch.req, s),
                            batch.strategy.probs(logits))
      conf = jnp.log(jnp.max(sampling.unscaled(logits), axis=-1))
      upd = _emit_one(s, tok, batch.req, cfg, active, finite)
      cache = cache.with_lengths(jnp.where(active, cache.lengths,
                                           s.cache.lengths))
      return s.replace(step=s.step + 1, cache=cache, finite=finite,
                       logconf=s.logconf + jnp.where(active, conf, 0.0),
                       stats=s.stats.add(active, **{f"{role}_calls": 1}),
                       **upd)

    return program_lib.LoopProgram(key, init, _cond(cfg), body, _finish(cfg))

  return program_lib.cached_program(key, build)


def oracle_program(drafter, verifier,
                   cfg: LoopConfig) -> program_lib.LoopProgram:
  """OracleCascade: both models every token, token ~ effective(T(q,p), S(q)).

  The target is ``batch.method.target``. Outputs count one drafter and one
  verifier call per token.
  """
  key = ("oracle", drafter, verifier, cfg)

  def build():
    def init(args):
      q_params, p_params, batch = args
      cap = capacity(batch.prompt.shape[1], cfg)
      q_cache, pending = start_caches(drafter, q_params, batch.prompt,
                                      batch.prompt_len, batch.inputs, cap)
      p_cache, _ = start_caches(verifier, p_params, batch.prompt,
                                batch.prompt_len, batch.inputs, cap)
      return _init(batch.prompt.shape[0], cfg, q_cache, pending, batch.req,
                   aux_cache=p_cache)

    def body(args, s: ARState) -> ARState:
      q_params, p_params, batch = args
      target = batch.method.target
      active = ~s.done
      ql, q_cache = drafter.step(q_params, s.pending[:, None], s.cache)
      pl, p_cache = verifier.step(p_params, s.pending[:, None], s.aux_cache)
      finite = s.finite & (~active | (all_finite(ql) & all_finite(pl)))
      sq = batch.strategy.probs(ql)
      pi, defer = target(sampling.unscaled(ql), sampling.unscaled(pl), sq,
                         batch.strategy.probs(pl))
      dist = pi[:, 0] if target.normalized else effective(pi, sq)[:, 0]
      tok = sampling.sample(_draft_keys(batch.req, s), dist)
      upd = _emit_one(s, tok, batch.req, cfg, active, finite)
      keep = lambda c, old: c.with_lengths(jnp.where(active, c.lengths,
                                                     old.lengths))
      return s.replace(
          step=s.step + 1, cache=keep(q_cache, s.cache),
          aux_cache=keep(p_cache, s.aux_cache), finite=finite,
          stats=s.stats.add(active, drafter_calls=1, verifier_calls=1,
                            deferrals=defer[:, 0]), **upd)

    return program_lib.LoopProgram(key, init, _cond(cfg), body, _finish(cfg))

  return program_lib.cached_program(key, build)


@struct.dataclass
class TCState:
  """Token-cascade state: the AR state plus the decoder-side history.

  Attributes:
    ar: ARState (``cache`` is the drafter's, ``aux_cache`` the verifier's).
    hist: [B, P + max_new + chunk] int32 prompt followed by the output, from
      which the verifier catches up.
  """

  ar: ARState
  hist: jax.Array


def token_cascade_program(drafter, verifier, cfg: LoopConfig,
                          chunk: int) -> program_lib.LoopProgram:
  """TokenCascade (Alg. 2) with a drafter-only deferral rule (Chow).

  The verifier is called only for deferred tokens. Its cache is prefilled
  with the prompt (all but the last prompt token, as for target-only) and
  then lags behind; before scoring a deferred position it processes the
  tokens generated since its last call in blocks of ``chunk`` tokens (one
  verifier call each). The rule is ``Chow(batch.method.alpha)``.
  """
  key = ("token_cascade", drafter, verifier, cfg, chunk)

  def build():
    def init(args) -> TCState:
      q_params, p_params, batch = args
      b, width = batch.prompt.shape
      cap = capacity(width, cfg, chunk)
      q_cache, pending = start_caches(drafter, q_params, batch.prompt,
                                      batch.prompt_len, batch.inputs, cap)
      p_cache, _ = start_caches(verifier, p_params, batch.prompt,
                                batch.prompt_len, batch.inputs, cap)
      hist = jnp.zeros((b, width + cfg.max_new + chunk), jnp.int32)
      hist = lax.dynamic_update_slice(hist, batch.prompt, (0, 0))
      return TCState(ar=_init(b, cfg, q_cache, pending, batch.req,
                              aux_cache=p_cache), hist=hist)

    def catch_up(p_params, s: ARState, hist, need, prompt_len):
      """Verifier processes hist[aux_len : m] for rows in need."""
      m = prompt_len + s.num_out  # tokens known, the pending one included
      b = hist.shape[0]

      def c_cond(c):
        return jnp.any(need & (c[0].lengths < m))

      def c_body(c):
        p_cache, last, calls = c
        start = p_cache.lengths
        valid = jnp.where(need, jnp.clip(m - start, 0, chunk), 0)
        toks = jax.vmap(lambda h, st: lax.dynamic_slice_in_dim(
            h, st, chunk))(hist, start)
        logits, new = verifier.step(p_params, toks, p_cache,
                                    logits_at=jnp.maximum(valid - 1, 0))
        done_now = (valid > 0) & (start + valid == m)
        last = jnp.where(done_now[:, None], logits[:, 0], last)
        calls = calls + (valid > 0).astype(jnp.int32)
        return new.with_lengths(start + valid), last, calls

      v = drafter.vocab_size
      return lax.while_loop(c_cond, c_body, (
          s.aux_cache, jnp.zeros((b, v)), jnp.zeros((b,), jnp.int32)))

    def body(args, t: TCState) -> TCState:
      q_params, p_params, batch = args
      s, hist = t.ar, t.hist
      active = ~s.done
      ql, q_cache = drafter.step(q_params, s.pending[:, None], s.cache)
      ql = ql[:, :1]
      rule = Chow(batch.method.alpha)
      need = active & (rule.deferral(sampling.unscaled(ql), None, None,
                                     None)[:, 0] > 0)
      p_cache, pl, p_calls = catch_up(p_params, s, hist, need,
                                      batch.prompt_len)
      finite = s.finite & (~active | all_finite(ql)) & (
          ~need | all_finite(pl))
      dist = jnp.where(need[:, None], batch.strategy.probs(pl),
                       batch.strategy.probs(ql)[:, 0])
      tok = sampling.sample(_draft_keys(batch.req, s), dist)
      upd = _emit_one(s, tok, batch.req, cfg, active, finite)
      write = jax.vmap(lambda h, x, o: lax.dynamic_update_index_in_dim(
          h, x, o, 0))
      hist = jnp.where(active[:, None],
                       write(hist, tok, batch.prompt_len + s.num_out), hist)
      q_cache = q_cache.with_lengths(jnp.where(active, q_cache.lengths,
                                               s.cache.lengths))
      s = s.replace(step=s.step + 1, cache=q_cache, aux_cache=p_cache,
                    finite=finite,
                    stats=s.stats.add(active, drafter_calls=1,
                                      verifier_calls=p_calls,
                                      deferrals=need.astype(jnp.float32)),
                    **upd)
      return TCState(ar=s, hist=hist)

    finish = _finish(cfg)
    return program_lib.LoopProgram(
        key, init, lambda args, t: _cond(cfg)(args, t.ar), body,
        lambda args, t: finish(args, t.ar))

  return program_lib.cached_program(key, build)
