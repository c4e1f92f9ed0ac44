"""TokenCascade (Alg. 2): the verifier runs only for deferred tokens.

The drafter runs every token; the verifier runs only when the drafter-only
deferral rule (Chow) defers, and then first catches up on the tokens it has
not seen, in parallel chunks. Its cache is prefilled with the prompt (all but
the last prompt token, as for target-only) and then lags behind; before
scoring a deferred position it processes the tokens generated since its last
call in blocks of ``chunk`` tokens (one verifier call each).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from specdec_jax.decoding.loops import state as state_lib
from specdec_jax.decoding.loops.program import LoopProgram
from specdec_jax.decoding.loops.sequential import (ARState, draft_keys,
                                                   loop_cond, loop_finish,
                                                   start_state)
from specdec_jax.decoding.loops.state import Level, LoopConfig, all_finite
from specdec_jax.decoding.rules import sampling
from specdec_jax.decoding.rules.knobs import Static


@struct.dataclass
class TCState:
  """Token-cascade state: the AR state plus the decoder-side history.

  Attributes:
    ar: ARState (level 0 the drafter, level 1 the lagging verifier).
    hist: [B, P + max_new + chunk] int32 prompt followed by the output, from
      which the verifier catches up.
  """

  ar: ARState
  hist: jax.Array


def _catch_up(verifier, p_params, level: Level, s: ARState, hist, need,
              prompt_len, chunk: int, vocab: int):
  """Verifier processes hist[length : m] for rows in ``need``.

  Returns:
    (verifier cache, logits [B, V] at the last known token, calls [B]).
  """
  m = prompt_len + s.stream.num_out  # tokens known, the pending one included
  b = hist.shape[0]

  def c_cond(c):
    return jnp.any(need & (c[0].lengths < m))

  def c_body(c):
    p_cache, last, calls = c
    start = p_cache.lengths
    valid = jnp.where(need, jnp.clip(m - start, 0, chunk), 0)  # [B]
    toks = jax.vmap(lambda h, st: lax.dynamic_slice_in_dim(
        h, st, chunk))(hist, start)  # [B, chunk]
    logits, new = verifier.step(p_params, toks, p_cache,
                                logits_at=jnp.maximum(valid - 1, 0))
    done_now = (valid > 0) & (start + valid == m)
    last = jnp.where(done_now[:, None], logits[:, 0], last)  # [B, V]
    calls = calls + (valid > 0).astype(jnp.int32)
    return new.with_lengths(start + valid), last, calls

  return lax.while_loop(c_cond, c_body, (
      level.cache, jnp.zeros((b, vocab)), jnp.zeros((b,), jnp.int32)))


def token_cascade_program(models: tuple, cfg: LoopConfig, rule: Static,
                          chunk: int) -> LoopProgram:
  """TokenCascade (Alg. 2) with a drafter-only deferral rule.

  Args:
    models: (drafter, verifier).
    cfg: static LoopConfig.
    rule: static half of the drafter-only rule (Chow); its knob ``alpha``
      travels in the batch.
    chunk: static catch-up block size.
  """
  drafter, verifier = models

  def init(args) -> TCState:
    params, batch = args
    b, width = batch.prompt.shape
    cap = state_lib.capacity(width, cfg, chunk)
    q_cache, pending = state_lib.start_cache(drafter, params[0], batch, cap)
    p_cache, _ = state_lib.start_cache(verifier, params[1], batch, cap)
    hist = jnp.zeros((b, width + cfg.max_new + chunk), jnp.int32)
    hist = lax.dynamic_update_slice(hist, batch.prompt, (0, 0))
    return TCState(ar=start_state(batch, cfg, pending, (q_cache, p_cache)),
                   hist=hist)

  def body(args, t: TCState) -> TCState:
    params, batch = args
    s, hist = t.ar, t.hist
    (q_level, p_level), active = s.levels, ~s.stream.done
    strategy = cfg.strategy(batch)
    ql, q_cache = drafter.step(params[0], s.stream.pending[:, None],
                               q_level.cache)
    ql = ql[:, :1]  # [B, 1, V]
    defers = rule.bind(batch.knobs).deferral(sampling.unscaled(ql), None,
                                             None, None)[:, 0]
    need = active & (defers > 0)  # [B]
    p_cache, pl, p_calls = _catch_up(verifier, params[1], p_level, s, hist,
                                     need, batch.prompt_len, chunk,
                                     drafter.vocab_size)
    finite = s.stream.finite & (~active | all_finite(ql)) & (
        ~need | all_finite(pl))
    dist = jnp.where(need[:, None], strategy.probs(pl),
                     strategy.probs(ql)[:, 0])  # [B, V]
    tok = sampling.sample(draft_keys(batch, s.stream), dist)
    stream, _ = s.stream.emit(tok[:, None], jnp.ones_like(tok), batch.req,
                              cfg, finite, need[:, None].astype(jnp.float32))
    write = jax.vmap(lambda h, x, o: lax.dynamic_update_index_in_dim(
        h, x, o, 0))
    hist = jnp.where(active[:, None],
                     write(hist, tok, batch.prompt_len + s.stream.num_out),
                     hist)
    levels = (q_level.keep_cache(active, q_cache).count(active, calls=1),
              p_level.replace(cache=p_cache).count(active, calls=p_calls))
    return TCState(ar=s.replace(stream=stream, levels=levels), hist=hist)

  finish = loop_finish(cfg)
  return LoopProgram(("token_cascade", models, cfg, rule, chunk), init,
                     lambda args, t: loop_cond(cfg)(args, t.ar), body,
                     lambda args, t: finish(args, t.ar))
