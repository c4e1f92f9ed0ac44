"""How ``tune`` measures and prices candidates (split from ``tuning.py``).

``DecodeMeasurer`` decodes the calibration rows with each candidate, back to
back with target-only (compile excluded); ``predict_chains`` prices every
chain gamma with the CostModel (``fit_chains``: the models' call costs, the
fixed cost per decode call and target-only's loop overhead from target-only
decodes of two lengths, the chain's loop overhead and alpha from one anchor
chain); ``agreement`` is the default quality.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

import jax
import numpy as np

from specdec_jax import timing
from specdec_jax.decoding.planners import costs as costs_lib
from specdec_jax.decoding.planners.auto import Candidate, Measured
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.strategy import Chain


def agreement(tokens: np.ndarray, reference: np.ndarray) -> float:
  """Fraction of positions where ``tokens`` [N, T] equal ``reference``."""
  tokens, reference = np.asarray(tokens), np.asarray(reference)
  return float(np.mean(tokens == reference)) if tokens.size else 1.0


class DecodeMeasurer:
  """Times candidates by decoding the calibration rows (compile excluded).

  Each repeat decodes target-only and then the candidate, back to back,
  each timed over enough decodes of every row to last ``min_seconds``;
  tokens/s and the ratio are medians over repeats.
  """

  def __init__(self, models, params, rows, encoder_decoder: bool,
               new_tokens: int, sampling, repeats: int,
               quality_fn: Callable | None = None, seed: int = 0,
               min_seconds: float = 0.2):
    self.models, self.params = list(models), list(params)
    self.rows, self.enc = [list(map(int, r)) for r in rows], encoder_decoder
    self.new, self.sampling, self.repeats = new_tokens, sampling, repeats
    self.quality_fn = quality_fn or agreement
    self.seed, self.min_seconds = seed, min_seconds
    self.width = max(len(r) for r in self.rows)
    self._runs, self._split = {}, {}
    self.stats = {}

  def runner(self, cand: Candidate, batch: int, greedy: bool = False,
             new_tokens: int | None = None):
    """``run(seed) -> (seconds, tokens [N, T], verifier calls)`` of one
    decode of every row (``new_tokens`` each; None: the measurer's)."""
    new = int(new_tokens or self.new)
    key = (cand, batch, greedy, new)
    if key in self._runs:
      return self._runs[key]
    from specdec_jax.decoding import api  # pylint: disable=g-import-not-at-top
    n = -(-len(self.rows) // batch) * batch
    rows = [self.rows[i % len(self.rows)] for i in range(n)]
    sampling = sampling_lib.Greedy() if greedy else self.sampling
    top = len(self.models) - 1
    levels = cand.levels if len(cand.levels) > 1 else (top, top)
    ms = [self.models[i] for i in levels]
    ps = [self.params[i] for i in levels]
    strategy = cand.strategy(sampling)

    def run(seed):
      t = time.perf_counter()
      outs = []
      for i in range(0, n, batch):
        chunk = rows[i:i + batch]
        outs.append(api.decode(
            strategy, ms, ps, None if self.enc else chunk,
            inputs=chunk if self.enc else None, max_new_tokens=new,
            seeds=seed, eos_id=None, pad_to=self.width))
      jax.block_until_ready([o.tokens for o in outs])
      secs = time.perf_counter() - t
      toks = np.concatenate([np.asarray(o.tokens) for o in outs])
      iters = sum(int(np.max(o.verifier_calls)) for o in outs)
      return secs, toks, iters

    run(self.seed)  # compile
    loops = max(1, math.ceil(self.min_seconds / max(run(self.seed)[0], 1e-6)))

    def timed(seed):
      """(seconds per decode of every row, tokens, iterations)."""
      t = time.perf_counter()
      for _ in range(loops - 1):
        run(seed)
      _, toks, iters = run(seed)
      return (time.perf_counter() - t) / loops, toks, iters

    self._runs[key] = timed
    return timed

  def measure(self, cands: Sequence[Candidate], batch: int) -> list[Measured]:
    base_c = Candidate("target_only", Chain(1), (len(self.models) - 1,))
    base = self.runner(base_c, batch)
    runs = {c: self.runner(c, batch) for c in cands if c != base_c}
    times = {c: [] for c in runs}
    ratios = {c: [] for c in runs}
    base_times = []
    for r in range(self.repeats):
      for c, run in runs.items():
        tb = base(self.seed + r + 1)[0]
        t, toks, iters = run(self.seed + r + 1)
        base_times.append(tb)
        times[c].append(t)
        ratios[c].append(tb / t)
        self.stats[(c, batch)] = dict(tokens=toks.size, iterations=iters)
    if not runs:
      base_times = [base(self.seed + r + 1)[0] for r in range(self.repeats)]
    ntok = len(self._rows(batch)) * self.new
    out = [Measured(base_c, ntok / statistics.median(base_times), 1.0,
                    quality=1.0)]
    for c in runs:
      quality = 1.0 if c.lossless else self._quality(c, base_c, batch)
      out.append(Measured(c, ntok / statistics.median(times[c]),
                          statistics.median(ratios[c]), quality=quality))
    return out

  def split_target(self, batch: int) -> tuple[float, float]:
    """(fixed seconds per decode call, seconds per target-only step) at
    ``batch``: target-only decodes of new_tokens and new_tokens // 2
    timed back to back (``repeats`` pairs, medians); the difference is
    the per-token part, the rest of a call is fixed (host prep, encode,
    prefill, dispatch). Cached per batch size."""
    if batch not in self._split:
      base_c = Candidate("target_only", Chain(1), (len(self.models) - 1,))
      half_n = max(1, self.new // 2)
      full = self.runner(base_c, batch)
      half = self.runner(base_c, batch, new_tokens=half_n)
      pairs = [(full(self.seed + r + 1)[0], half(self.seed + r + 1)[0])
               for r in range(self.repeats)]
      chunks = self.chunks(batch)
      step = max(statistics.median(f - h for f, h in pairs), 0.0) / (
          (self.new - half_n) * chunks) if self.new > half_n else 0.0
      fixed = statistics.median(f for f, _ in pairs) / chunks - self.new * step
      self._split[batch] = (max(fixed, 0.0), step)
    return self._split[batch]

  def chunks(self, batch: int) -> int:
    """Decode calls per pass over the rows at ``batch``."""
    return len(self._rows(batch)) // batch

  def _rows(self, batch):
    return range(-(-len(self.rows) // batch) * batch)

  def _quality(self, cand, base_c, batch) -> float:
    ref = self.runner(base_c, batch, greedy=True)(self.seed)[1]
    toks = self.runner(cand, batch, greedy=True)(self.seed)[1]
    return float(self.quality_fn(toks, ref))


def _alpha(eff: float, gamma: int) -> float:
  """Solves chain_tokens(a, gamma) = eff for a in [0, 1]."""
  lo, hi = 0.0, 1.0
  if eff >= gamma + 1:
    return 1.0
  for _ in range(50):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if costs_lib.chain_tokens(mid, gamma) < eff else (
        lo, mid)
  return 0.5 * (lo + hi)


_TIMERS = {}


def _step_timer(model, params, batch: int, width: int):
  """``timing.step_timer``, compiled once per (model, params, batch,
  width) in this process (a tune at another temperature reuses it)."""
  key = (id(model), id(params), batch, width)
  if key not in _TIMERS:
    _TIMERS[key] = (model, params, timing.step_timer(model, params, batch,
                                                     width))
  return _TIMERS[key][2]


def _time_calls(measurer, levels, batch: int, widths) -> costs_lib.CostModel:
  """Call costs of the drafter (at 1) and the target (at ``widths``)."""
  (dm, dp), (tm, tp) = [(measurer.models[i], measurer.params[i])
                        for i in levels]
  timers = {w: _step_timer(tm, tp, batch, w) for w in widths}
  free = costs_lib.parameter_free(dm, dp)
  if not free:
    timers["q"] = _step_timer(dm, dp, batch, 1)
  med = timing.medians(timers, 3)
  q = 0.0 if free else med["q"]
  return costs_lib.CostModel(tuple(widths), ((q,) * len(widths), tuple(
      med[w] for w in widths)), batch)


def fit_chains(measurer: DecodeMeasurer, anchor: Measured, batch: int,
               gammas: Sequence[int], calls: costs_lib.CostModel | None = None
               ) -> tuple[costs_lib.CostModel, float]:
  """(CostModel, alpha) of the anchor's drafter/target pair at ``batch``.

  ``calls`` (None: timed here) gives the call costs: model 0 the drafter,
  the last the target; ``timing.step_timer`` times the target at 1, at the
  anchor's block and at the widest block (linear in between) and the
  drafter at 1 (0 when parameter-free). The fixed seconds per decode call
  and target-only's loop overhead come from ``measurer.split_target``;
  alpha solves chain_tokens(alpha, g0) = the anchor's tokens per verifier
  call; the chain's loop overhead per iteration is what the anchor's time
  per call (target-only's over the anchor's measured ratio to it) leaves
  after the fixed part and its model calls.
  """
  g0 = anchor.candidate.structure.gamma
  cm = calls or _time_calls(measurer, anchor.candidate.levels, batch,
                            sorted({1, g0 + 1, max(gammas) + 1}))
  fixed, step = measurer.split_target(batch)
  new = measurer.new
  stats = measurer.stats[(anchor.candidate, batch)]
  iters = max(stats["iterations"], 1) / measurer.chunks(batch)  # per call
  alpha = _alpha(new / iters, g0)
  # Seconds per decode call of the anchor: target-only's call (timed at
  # two lengths) over the anchor's back-to-back ratio to it -- robust to
  # the machine's speed drifting between timings (absolute tokens/s
  # measured minutes apart can differ by 1.5x on a loaded machine).
  anchor_s = (fixed + new * step) / max(anchor.ratio, 1e-12)
  chain_s = max((anchor_s - fixed) / iters - g0 * cm.call(0, 1) -
                cm.call(-1, g0 + 1), 0.0)
  return costs_lib.CostModel(cm.widths, cm.seconds, batch, (
      ("autoregressive", max(step - cm.call(-1, 1), 0.0)),
      ("chain", chain_s)), fixed), alpha


def predict_chains(measurer: DecodeMeasurer, anchor: Measured, base: Measured,
                   batch: int, gammas: Sequence[int]) -> dict[int, float]:
  """{gamma: predicted tokens/s}: :func:`fit_chains`'s CostModel prices a
  decode call of every gamma (``CostModel.chain_decode``)."""
  del base  # target-only's call is re-timed at two lengths (split_target)
  model, alpha = fit_chains(measurer, anchor, batch, gammas)
  return {g: batch * measurer.new / model.chain_decode(alpha, g,
                                                       measurer.new)
          for g in gammas}
