"""Inputs of the hierarchy planner, measured: pairwise alpha and call costs.

The planner (``decoding.hierarchy.planner.plan``) needs, for candidate
models M_0 .. M_{n-1} (the last one the target):

* ``pairwise_alpha``: alpha_ij = E[1 - TV(S(p_i), S(p_j))] = E[sum_v
  min(S(p_i)(v), S(p_j)(v))], the probability that a token drawn from level
  i's distribution survives level j's accept test (speculative sampling,
  Leviathan et al. Thm 3.5), averaged over contexts. S is the sampling
  transform the decode runs with (``strategy.probs``: temperature, top-k,
  top-p; greedy makes S one-hot, so alpha_ij is the rate at which the two
  argmaxes agree). The contexts come from ONE teacher-forced pass of each
  candidate: the target continues a few task prompts (target-only decoding
  at the same sampling), then every candidate scores prompt + continuation
  in a single forward; the positions of the continuation are averaged.
* ``measure_call_costs``: c_i(w), seconds of one call of model i on a block
  of w tokens at the serving batch size on THIS machine: a jitted loop of
  cached block steps (each followed by the sampling transform of its
  logits and one draw, as the decode loop does), timed back to back for
  every (model, width) in each repeat, median over repeats.

Both are model-agnostic (the decode interface only); early exits of the
verifier (``models.early_exit``) are candidates like any other model.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import timing
from specdec_jax.decoding import inputs as inputs_lib
from specdec_jax.decoding.methods import TargetOnly
from specdec_jax.decoding.api import decode
from specdec_jax.decoding.planners.costs import CostModel
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.strategy import Strategy


def _teacher_rows(target, params, prompts, inputs, strategy, new_tokens: int,
                  seed: int):
  """The target's continuations as teacher-forced rows.

  Returns:
    (tokens [B, T] int32 prompt + continuation, right-padded; encoder
    inputs [B, S] or None; (row, position) index arrays [M] of the
    positions whose next token is a continuation token).
  """
  out = decode(Strategy(TargetOnly(), sampling=strategy), (target, target),
               (params, params), prompts, inputs=inputs,
               max_new_tokens=new_tokens, seeds=seed, eos_id=None)
  conts = out.sequences()
  if target.is_encoder_decoder:
    start = getattr(target.config, "decoder_start_id", 0)
    rows = [[start] + s for s in conts]
    enc, _ = inputs_lib.pad_ragged(inputs, inputs_lib.PAD_TO, "inputs")
    enc = jnp.asarray(enc, jnp.int32)
  else:
    rows = [list(p) + s for p, s in zip(prompts, conts)]
    enc = None
  width = max(len(r) for r in rows)
  toks = jnp.asarray([r + [0] * (width - len(r)) for r in rows], jnp.int32)
  pick = [(b, t) for b, (r, s) in enumerate(zip(rows, conts))
          for t in range(len(r) - len(s) - 1, len(r) - 1)]
  bi, ti = (np.asarray(x, np.int32) for x in zip(*pick))
  return toks, enc, (bi, ti)


def _transformed(model, params, toks, enc, strategy, bi, ti) -> jax.Array:
  """S(p) of ``model`` at the picked positions: [M, V] float32."""
  e = model.encode(params, enc) if model.is_encoder_decoder else None
  cache = model.init_cache(toks.shape[0], toks.shape[1] + 1, e)
  logits, _ = model.step(params, toks, cache)  # [B, T, V]
  return strategy.probs(logits[bi, ti])  # [M, V] -> [M, V]


def pairwise_alpha(levels: Sequence, prompts=None, *, inputs=None,
                   sampling=None, new_tokens: int = 32,
                   seed: int = 0) -> np.ndarray:
  """alpha_ij = E[sum_v min(S(p_i), S(p_j))] from one teacher-forced pass.

  Args:
    levels: [(model_0, params_0), ..., (model_{n-1}, params_{n-1})], the
      candidates; the LAST one is the target, whose continuations of the
      prompts are the contexts. Models share one vocabulary.
    prompts / inputs: calibration requests, as for ``decoding.generate``
      (prompts: decoder-only, inputs: encoder-decoder).
    sampling: the decode's sampling strategy (default greedy); S above.
    new_tokens: continuation length per request (contexts per request).
    seed: sampling seed of the continuations.

  Returns:
    [n, n] float64 symmetric matrix, ones on the diagonal.
  """
  levels = list(levels)
  if len(levels) < 2:
    raise ValueError(f"pairwise_alpha needs at least two models (candidates "
                     f"and the target), got {len(levels)}")
  vocab = {m.vocab_size for m, _ in levels}
  if len(vocab) != 1:
    raise ValueError(f"the candidates must share one vocabulary, got sizes "
                     f"{[m.vocab_size for m, _ in levels]}")
  if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or (
      new_tokens < 1):
    raise ValueError(f"new_tokens must be an integer >= 1, got "
                     f"{new_tokens!r}")
  strategy = sampling_lib.Greedy() if sampling is None else sampling
  strategy.validate()
  target, p_target = levels[-1]
  toks, enc, (bi, ti) = _teacher_rows(target, p_target, prompts, inputs,
                                      strategy, new_tokens, seed)
  probs = [_transformed(m, p, toks, enc, strategy, bi, ti)
           for m, p in levels]  # n x [M, V]
  n = len(levels)
  out = np.eye(n)
  for i in range(n):
    for j in range(i + 1, n):
      a = jnp.mean(jnp.sum(jnp.minimum(probs[i], probs[j]), axis=-1))
      out[i, j] = out[j, i] = min(1.0, float(a))
  return out


# The hierarchy planner's call costs ARE the one cost model (costs.py): c_i(w)
# is ``CostModel.__call__(i, w)``; the name stays for existing callers.
CallCosts = CostModel


def measure_call_costs(levels: Sequence, batch: int = 1,
                       widths: Sequence[int] = (1, 2, 4, 8, 16, 32),
                       sampling=None, iters: int = 8, repeats: int = 5,
                       context: int = 32,
                       min_seconds: float = 0.02) -> CallCosts:
  """Times one call of every model at every width (this machine).

  Each repeat runs every (model, width) loop back to back, so a slow
  moment of the machine touches all of them alike; the median over the
  repeats is kept. A loop runs at least ``iters`` calls and enough calls to
  last about ``min_seconds`` (the count is traced: one compile per (model,
  width)), so fast models are not timed below the timer's noise.

  Args:
    levels: [(model, params)] the candidates (any order).
    batch: serving batch size.
    widths: block widths to time (1 is always added; costs are interpolated
      in between, so include the widest block the planner may use).
    sampling: the decode's sampling strategy (its transform is timed with
      each call; default greedy).
    iters: least calls per jitted loop; repeats: loops timed per (model,
      width).
    context: cached tokens before the timed block.
    min_seconds: least duration of one timed loop.

  Returns:
    CostModel (``CallCosts``) of ``levels`` at ``batch``.
  """
  for name, x, lo in (("batch", batch, 1), ("iters", iters, 1),
                      ("repeats", repeats, 1), ("context", context, 1)):
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
      raise ValueError(f"{name} must be an integer >= {lo}, got {x!r}")
  if not min_seconds >= 0:
    raise ValueError(f"min_seconds must be >= 0, got {min_seconds!r}")
  widths = tuple(sorted({1, *(int(w) for w in widths)}))
  if widths[0] < 1:
    raise ValueError(f"widths must be >= 1, got {list(widths)}")
  strategy = sampling_lib.canonical(
      sampling_lib.Greedy() if sampling is None else sampling)
  timers = {(i, k): timing.step_timer(
      m, p, batch, w, context=context, sampling=strategy, min_iters=iters,
      min_seconds=min_seconds)
            for i, (m, p) in enumerate(levels) for k, w in enumerate(widths)}
  got = timing.medians(timers, repeats)
  med = np.array([[got[i, k] for k in range(len(widths))]
                  for i in range(len(levels))])
  return CostModel(widths, tuple(tuple(map(float, m)) for m in med), batch)


def planner_widths(max_buffer: int, max_depth: int) -> tuple[int, ...]:
  """Widths to time so that every call a plan can make is interpolated:
  powers of two up to the widest block (level n feeds B_{n-1} + lag)."""
  widest = max_buffer * max_depth + max_depth + 3
  out, w = [1], 2
  while w < widest:
    out.append(w)
    w *= 2
  return tuple(out + [widest])


__all__ = ["CallCosts", "measure_call_costs", "pairwise_alpha",
           "planner_widths"]
