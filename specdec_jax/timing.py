"""One jitted timing loop for model calls, and the paired-ratio protocol.

Every benchmark and planner that prices a model call uses :func:`step_timer`:
a cache is prefilled with ``context`` tokens once, then a jitted loop runs
``n`` cached block steps of ``width`` tokens (chain positions, or the tree
positions ``lengths + depths`` with a [W, W] ancestor mask), each rolled back
to the prefilled length, so every call sees the same shapes and no per-call
dispatch is timed. The step count is traced (one compile per shape) and
chosen so that one timed loop lasts at least ``min_seconds``.

A timer returns the MARGINAL seconds of one call: each timing runs the loop
twice, ``k`` and ``k + n`` steps, and keeps ``(t(k + n) - t(k)) / n``. An
XLA:CPU launch of such a loop costs a fixed 2-4 ms on this project's
2-core machine whatever the step count (the default T5 verifier: 4.4 ms for
one step, 0.85 ms per further step); a decode pays it once per call (its
fixed part), so dividing one loop's time by its steps over-prices a step by
that fixed cost over the steps (50% for a 1 ms step in a 20 ms loop).

On a shared machine, compare calls with :func:`paired_ratios`: each repeat
times the baseline and every candidate back to back, and the median of the
per-repeat ratios is kept (robust to load drifting between repeats).

Example::

    one = timing.step_timer(verifier, params, batch=1, width=1)
    six = timing.step_timer(verifier, params, batch=1, width=6)
    b = timing.paired_ratios({"6": six}, one, repeats=5)["6"]
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

Timer = Callable[[], float]
_SENTINEL = 1.2345e-7  # see fn_timer


def _check_int(name: str, value, low: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
      value < low):
    raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
  return int(value)


def _block_layout(width: int, depths, mask):
  """(tree?, depths [W], mask [W, W]) of :func:`step_timer`'s block."""
  tree = depths is not None or mask is not None
  depths = np.arange(width) if depths is None else np.asarray(depths)
  mask = (np.tril(np.ones((width, width), bool)) if mask is None
          else np.asarray(mask, bool))
  if depths.shape != (width,) or mask.shape != (width, width):
    raise ValueError(f"depths must be [{width}] and mask [{width}, {width}]"
                     f" for width {width}, got {depths.shape} and "
                     f"{mask.shape}")
  return tree, depths, mask


def _reader(sampling) -> Callable:
  """``(keys [B], logits [B, W, V]) -> [B] float32`` that a timed step's
  loop sums: one logit (the call alone), or one draw from ``sampling``."""
  if sampling is None:
    return lambda keys, logits: logits[:, -1, 0]
  from specdec_jax.decoding.rules import sampling as sampling_lib  # pylint: disable=g-import-not-at-top
  strategy = sampling_lib.canonical(sampling)
  return lambda keys, logits: sampling_lib.sample(
      keys, strategy.probs(logits)[:, -1]).astype(jnp.float32)


def step_timer(model, params, batch: int = 1, width: int = 1, *,
               depths: Sequence[int] | None = None, mask=None,
               context: int = 32, encoder_len: int = 16, sampling=None,
               min_iters: int = 8, min_seconds: float = 0.02,
               capacity: int | None = None) -> Timer:
  """``timed() -> seconds per call`` of ``model`` on a block of ``width``.

  Args:
    model, params: a model of ``specdec_jax.models`` and its parameters.
    batch: rows per call.
    width: tokens per call (W).
    depths: [W] position offsets of the block's tokens (a tree's node
      depths); None: 0..W-1 (a chain block).
    mask: [W, W] bool ancestor mask of a tree block (None: causal). With
      ``depths`` or ``mask`` the call gets explicit positions and a mask, as
      the tree loop calls its models.
    context: cached tokens before the timed block.
    encoder_len: encoder input length (encoder-decoder models).
    sampling: a sampling strategy whose ``probs`` and one draw per row are
      timed with each call (None: the call alone).
    min_iters: least calls per timed loop.
    min_seconds: least duration of the timed difference (n steps).
    capacity: cache slots (default ``context + width + 8``). Attention
      reads every slot, so a decode's step is priced at the decode's own
      capacity (``prompt + max_new + block + 2``).

  Returns:
    A function that runs the loop twice (k and k + n steps) and returns
    the marginal seconds per call (the launch's fixed cost cancels).
  """
  batch = _check_int("batch", batch, 1)
  width = _check_int("width", width, 1)
  context = _check_int("context", context, 1)
  min_iters = _check_int("min_iters", min_iters, 1)
  slots = context + width + 8 if capacity is None else _check_int(
      "capacity", capacity, context + width)
  tree, depths, mask = _block_layout(width, depths, mask)
  read = _reader(sampling)
  enc_in = jnp.full((batch, encoder_len), 5, jnp.int32)

  @jax.jit
  def prefill(params):
    enc = (model.encode(params, enc_in) if model.is_encoder_decoder
           else None)
    cache = model.init_cache(batch, slots, enc)
    return model.step(params, jnp.full((batch, context), 5, jnp.int32),
                      cache)[1]

  @jax.jit
  def run(params, toks, cache, iters):
    kw = {}
    if tree:
      kw["positions"] = cache.lengths[:, None] + jnp.asarray(
          depths, jnp.int32)[None, :]  # [B, W]
      kw["mask"] = jnp.broadcast_to(jnp.asarray(mask),
                                    (batch, width, width))
    keys = jax.random.split(jax.random.key(0), batch)

    def body(_, carry):
      cache, acc = carry
      # The tokens depend on the carry (+0 unless it is NaN), so XLA cannot
      # hoist the embedding and the first layer's projections out of the
      # loop as it would for constant tokens.
      fed = toks + jnp.isnan(acc).astype(toks.dtype)[:, None]
      logits, new = model.step(params, fed, cache, **kw)  # [B, W, V]
      return new.with_lengths(cache.lengths), acc + read(keys, logits)

    return jax.lax.fori_loop(0, iters, body,
                             (cache, jnp.zeros((batch,), jnp.float32)))[1]

  args = (params, jnp.full((batch, width), 7, jnp.int32), prefill(params))
  return _marginal(lambda iters: run(*args, iters), min_iters, min_seconds)


def _marginal(run: Callable, min_iters: int, min_seconds: float) -> Timer:
  """``timed() -> marginal seconds per iteration`` of ``run(iters)`` (a
  jitted loop; returns an array): ``(t(k + n) - t(k)) / n`` with ``n``
  iterations lasting at least ``min_seconds`` and ``k = max(1, n // 2)``,
  so a launch's fixed cost cancels. A difference that noise makes <= 0
  falls back to the long loop's time per iteration."""
  run(1).block_until_ready()  # compile and warm up
  t0 = time.perf_counter()
  run(min_iters).block_until_ready()
  each = (time.perf_counter() - t0) / min_iters
  n = max(min_iters, int(math.ceil(min_seconds / max(each, 1e-9))))
  k = max(1, n // 2)

  def timed() -> float:
    t0 = time.perf_counter()
    run(k).block_until_ready()
    t1 = time.perf_counter()
    run(k + n).block_until_ready()
    t2 = time.perf_counter()
    diff = ((t2 - t1) - (t1 - t0)) / n
    return diff if diff > 0 else (t2 - t1) / (k + n)

  return timed


def fn_timer(fn: Callable, *args, min_iters: int = 8,
             min_seconds: float = 0.02) -> Timer:
  """``timed() -> seconds per call`` of ``fn(*args)`` in a jitted loop.

  Used to price non-model work (softmaxes, sampling, acceptance) at the
  shapes a decode loop sees. Each iteration adds the loop carry (0 in
  practice) to the first argument (a float array) and sums every output
  into the next carry, so XLA can neither hoist the call out of the loop nor
  drop any of its outputs; that add and those sums are timed with it.

  Args:
    fn: a traceable function of arrays.
    *args: its arguments; ``args[0]`` must be a floating-point array.
    min_iters, min_seconds: as in :func:`step_timer`.
  """
  min_iters = _check_int("min_iters", min_iters, 1)
  if not jnp.issubdtype(jnp.asarray(args[0]).dtype, jnp.floating):
    raise ValueError(f"fn_timer needs a floating-point first argument (the "
                     f"carry is added to it), got {jnp.asarray(args[0]).dtype}")

  @jax.jit
  def run(args, iters):
    def body(_, c):
      out = fn(args[0] + c.astype(args[0].dtype), *args[1:])
      total = sum(jnp.sum(x.astype(jnp.float32))
                  for x in jax.tree.leaves(out)
                  if jnp.issubdtype(x.dtype, jnp.number))
      # 0 unless the sum hits an arbitrary constant: no compiler option
      # (fast math included) can fold this and drop the call.
      return c + (total == _SENTINEL).astype(jnp.float32)

    return jax.lax.fori_loop(0, iters, body, jnp.float32(0))

  return _marginal(lambda iters: run(args, iters), min_iters, min_seconds)


def medians(timers: Mapping[str, Timer], repeats: int) -> dict[str, float]:
  """{name: median seconds}; each repeat runs every timer once, in turn."""
  repeats = _check_int("repeats", repeats, 1)
  times = {k: [] for k in timers}
  for _ in range(repeats):
    for k, t in timers.items():
      times[k].append(t())
  return {k: statistics.median(v) for k, v in times.items()}


def paired_ratios(timers: Mapping[str, Timer], base: Timer,
                  repeats: int) -> dict[str, float]:
  """{name: median over repeats of timer seconds / base seconds}, the base
  timed right before each timer (back to back)."""
  repeats = _check_int("repeats", repeats, 1)
  ratios = {k: [] for k in timers}
  for _ in range(repeats):
    for k, t in timers.items():
      b = base()
      ratios[k].append(t() / b)
  return {k: statistics.median(v) for k, v in ratios.items()}


def wall(fn: Callable[[], object]) -> tuple[float, object]:
  """(seconds, result) of ``fn()``, its arrays ready."""
  t = time.perf_counter()
  out = fn()
  jax.block_until_ready(out)
  return time.perf_counter() - t, out


def load_average() -> tuple[float, float, float]:
  """The machine's 1/5/15-minute load averages (record them with timings)."""
  try:
    return tuple(round(x, 2) for x in os.getloadavg())
  except OSError:
    return (float("nan"),) * 3


__all__ = ["Timer", "fn_timer", "load_average", "medians", "paired_ratios",
           "step_timer", "wall"]
