"""How ``tune`` measures and prices candidates (split from ``tuning.py``).

``DecodeMeasurer`` decodes the calibration rows with each candidate, back to
back with target-only (compile excluded); ``predict_chains`` prices every
chain gamma with the CostModel (``fit_chains``: the models' call costs, the
fixed cost per decode call and target-only's loop overhead from target-only
decodes of two lengths, the chain's loop overhead and alpha from one anchor
chain, all timed interleaved); ``agreement`` is the default quality.
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
    self._runs = {}
    self.stats = {}
    self.fits = {}  # batch -> (CostModel, anchor alphas): predict_chains'
    self._teacher = {}

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

  def split_timers(self, batch: int) -> dict:
    """{'full', 'short'}: timers (``timing.Timer``: seconds of one pass
    over the rows) of target-only decodes of new_tokens and
    ``short_tokens`` tokens, to interleave with other timings
    (``timing.medians``)."""
    base_c = Candidate("target_only", Chain(1), (len(self.models) - 1,))
    full = self.runner(base_c, batch)
    short = self.runner(base_c, batch, new_tokens=self.short_tokens)
    return {"full": lambda: full(self.seed + 1)[0],
            "short": lambda: short(self.seed + 1)[0]}

  @property
  def short_tokens(self) -> int:
    """Tokens of the short decode that, with the full one, splits a call
    into its fixed part and its per-token (per-iteration) part: 1, so the
    fixed part is read next to a measured point, not extrapolated over
    new / 2 tokens (5% noise on each of two timings 8 tokens apart moved
    it by +-15 ms on the random pair)."""
    return 1

  def call_shape(self) -> dict:
    """``timing.step_timer``'s context / encoder_len for calls shaped like
    this measurer's decodes: a model call's cost grows with the cached
    tokens it attends to (decoder-only: the prompt plus half the new
    tokens; encoder-decoder: the decoder's own tokens, and cross-attention
    over the encoded input)."""
    if self.enc:
      return dict(context=self.new // 2 + 1, encoder_len=self.width)
    return dict(context=self.width + self.new // 2)

  def teacher_alpha(self, levels) -> float:
    """Teacher-forced acceptance of models ``levels`` = (drafter, target)
    on these rows (``pairwise_alpha``: E[sum_v min(S(q), S(p))] along the
    target's continuations of new_tokens, seed as ``measure``; no
    speculative decode); computed once per levels."""
    levels = tuple(levels)
    if levels not in self._teacher:
      from specdec_jax.decoding.planners import hierarchy_calibration  # pylint: disable=g-import-not-at-top
      pair = [(self.models[i], self.params[i]) for i in levels]
      rows = {"inputs" if self.enc else "prompts": self.rows}
      self._teacher[levels] = float(hierarchy_calibration.pairwise_alpha(
          pair, **rows, sampling=self.sampling, new_tokens=self.new,
          seed=self.seed)[0, 1])
    return self._teacher[levels]

  def chunks(self, batch: int) -> int:
    """Decode calls per pass over the rows at ``batch``."""
    return len(self._rows(batch)) // batch

  def _rows(self, batch):
    return range(-(-len(self.rows) // batch) * batch)

  def _quality(self, cand, base_c, batch) -> float:
    ref = self.runner(base_c, batch, greedy=True)(self.seed)[1]
    toks = self.runner(cand, batch, greedy=True)(self.seed)[1]
    return float(self.quality_fn(toks, ref))


def fixed_and_step(full: float, short: float, new: int, short_new: int,
                   chunks: int) -> tuple[float, float]:
  """(fixed seconds per decode call, seconds per step) from the seconds of
  one pass of ``chunks`` target-only calls of ``new`` and ``short_new``
  tokens: the difference is the per-token part, the rest of a call is
  fixed (host prep, encode, prefill, dispatch)."""
  step = max(full - short, 0.0) / ((new - short_new) * chunks) if (
      new > short_new) else 0.0
  return max(full / chunks - new * step, 0.0), step


def target_only_split(measurer, med: dict, batch: int
                      ) -> tuple[float, float]:
  """:func:`fixed_and_step` of the medians of ``measurer.split_timers``
  ('full', 'short') at ``batch``."""
  return fixed_and_step(med["full"], med["short"], measurer.new,
                        measurer.short_tokens, measurer.chunks(batch))


def solve_alpha(iterations: float, gamma: int, new_tokens: int) -> float:
  """The alpha in [0, 1] at which a chain of ``gamma`` takes
  ``iterations`` (measured verifier calls per decode call) to emit
  ``new_tokens`` (``costs.chain_iterations``, decreasing in alpha)."""
  lo, hi = 0.0, 1.0
  if iterations <= costs_lib.chain_iterations(1.0, gamma, new_tokens):
    return 1.0
  for _ in range(40):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if costs_lib.chain_iterations(
        mid, gamma, new_tokens) > iterations else (lo, mid)
  return 0.5 * (lo + hi)


_TIMERS = {}


def cached_step_timer(model, params, batch: int, width: int, **shape):
  """``timing.step_timer``, compiled once per (model, params, batch,
  width, shape) in this process (a tune at another temperature reuses
  it)."""
  key = (id(model), id(params), batch, width, tuple(sorted(shape.items())))
  if key not in _TIMERS:
    _TIMERS[key] = (model, params, timing.step_timer(model, params, batch,
                                                     width, **shape))
  return _TIMERS[key][2]


def call_timers(measurer, levels, batch: int, widths) -> dict:
  """{('t', w)}: the target's call at every width; 'q': the drafter's at 1
  (absent when parameter-free); shaped like the measurer's decodes
  (``call_shape``)."""
  (dm, dp), (tm, tp) = [(measurer.models[i], measurer.params[i])
                        for i in levels]
  shape = measurer.call_shape()
  timers = {("t", w): cached_step_timer(tm, tp, batch, w, **shape)
            for w in widths}
  if not costs_lib.parameter_free(dm, dp):
    timers["q"] = cached_step_timer(dm, dp, batch, 1, **shape)
  return timers


def calls_model(med: dict, widths, batch: int) -> costs_lib.CostModel:
  """The CostModel of :func:`call_timers`' medians (no overheads yet)."""
  return costs_lib.CostModel(tuple(widths), (
      (med.get("q", 0.0),) * len(widths),
      tuple(med[("t", w)] for w in widths)), batch)


def counting_timer(run, seed: int, seen: list):
  """A Timer of ``run`` (a DecodeMeasurer runner) over seeds seed + 1,
  seed + 2, ... (as ``measure`` times them) that appends each pass's
  verifier calls to ``seen``: the anchor's time and its iterations come
  from the same decodes (at T > 0 they vary with the seed)."""
  seeds = iter(range(seed + 1, seed + 1_000_000))

  def timed() -> float:
    secs, _, iters = run(next(seeds))
    seen.append(iters)
    return secs

  return timed


def fit_chains(measurer: DecodeMeasurer, anchors, batch: int,
               gammas: Sequence[int], calls: costs_lib.CostModel | None = None
               ) -> tuple[costs_lib.CostModel, tuple]:
  """(CostModel, ((gamma, alpha), ...)) of the anchors' drafter/target pair.

  ``anchors``: one or two measured chains (``Measured``) of the same pair.
  One interleaved timing (``timing.medians``: every timer once per repeat,
  in turn, so a machine whose speed drifts moves them together) of:
  target-only decodes of two lengths (the fixed seconds per decode call
  and the per-token part, :func:`fixed_and_step`), each anchor's decode,
  the first (smallest gamma) anchor's decode of ``short_tokens``, and --
  unless ``calls`` gives them (model 0 the drafter, the last the target)
  -- each model's call (:func:`call_timers`: the target at EVERY width
  1..max(gammas) + 1, XLA:CPU's cost is not linear in the width, the
  drafter at 1, 0 when parameter-free; at the decodes' lengths). Each
  anchor's alpha solves chain_iterations(alpha, g, new) = its verifier
  calls per decode call (mean over the timed passes, seeds as
  ``measure``; :func:`alpha_at` interpolates between anchors). The first
  anchor's two lengths give the speculative decode's fixed seconds per
  call (``spec_call_s``, the intercept at 0 iterations; at least
  target-only's: the drafter's encode and prefill come on top); what each
  anchor's time per call leaves after that fixed part and its model calls
  is its loop overhead per iteration, fitted exactly through the anchors
  as 'chain' + g x 'draft' (one anchor: 'chain' only).
  """
  anchors = [anchors] if isinstance(anchors, Measured) else list(anchors)
  anchors.sort(key=lambda a: a.candidate.structure.gamma)
  gs = [a.candidate.structure.gamma for a in anchors]
  if not 1 <= len(anchors) <= 2 or len(set(gs)) != len(gs):
    raise ValueError(f"fit_chains takes one or two anchor chains of "
                     f"different gammas, got gammas {gs}")
  widths = tuple(range(1, max(max(gammas), *gs) + 2))
  timers = measurer.split_timers(batch)
  chunks, new = measurer.chunks(batch), measurer.new
  seen = {a.candidate: [] for a in anchors}  # verifier calls per pass
  for a in anchors:
    timers[("anchor", a.candidate)] = counting_timer(
        measurer.runner(a.candidate, batch), measurer.seed,
        seen[a.candidate])
  seen_short = []  # the first anchor at short_tokens
  timers["anchor_short"] = counting_timer(
      measurer.runner(anchors[0].candidate, batch,
                      new_tokens=measurer.short_tokens),
      measurer.seed, seen_short)
  if calls is None:
    timers.update(call_timers(measurer, anchors[0].candidate.levels, batch,
                              widths))
  med = timing.medians(timers, measurer.repeats)
  fixed, step = target_only_split(measurer, med, batch)
  cm = calls or calls_model(med, widths, batch)
  iters = [max(statistics.mean(seen[a.candidate]), 1) / chunks  # per call
           for a in anchors]
  secs = [med[("anchor", a.candidate)] / chunks for a in anchors]
  spec_fixed = intercept(med["anchor_short"] / chunks,
                          statistics.mean(seen_short) / chunks, secs[0],
                          iters[0], fixed)
  alphas = tuple((g, solve_alpha(it, g, new)) for g, it in zip(gs, iters))
  rest = [(t - spec_fixed) / it - g * cm.call(0, 1) - cm.call(-1, g + 1)
          for g, t, it in zip(gs, secs, iters)]
  per_draft = 0.0 if len(gs) == 1 else (rest[1] - rest[0]) / (gs[1] - gs[0])
  return costs_lib.CostModel(cm.widths, cm.seconds, batch, (
      ("autoregressive", max(step - cm.call(-1, 1), 0.0)),
      ("chain", rest[0] - gs[0] * per_draft), ("draft", per_draft)), fixed,
      spec_fixed), alphas


def at_workload(model: costs_lib.CostModel, alphas, calib: DecodeMeasurer,
                work: DecodeMeasurer, batch: int, levels
                ) -> tuple[costs_lib.CostModel, tuple]:
  """(CostModel, alphas) of :func:`fit_chains`' ``model`` and anchor
  ``alphas``, fitted on ``calib``'s rows, moved to ``work``'s rows (another
  workload: other prompt lengths, other text) without decoding them
  speculatively. Re-timed on ``work``, interleaved: the models' calls
  (:func:`call_timers`) and target-only at two lengths (its fixed part and
  loop overhead); the speculative fits carried in proportion
  (``CostModel.at_workload``); each alpha scaled by the pair's
  teacher-forced acceptance on ``work`` over that on ``calib``
  (``DecodeMeasurer.teacher_alpha``; ``costs.moved_acceptance``): the anchors' alpha
  holds what teacher forcing misses (a batch waits for its slowest row,
  acceptances are not independent), the ratio what the workload changes.
  ``levels``: (drafter, target) indices of the measurers' models."""
  timers = work.split_timers(batch)
  timers.update(call_timers(work, levels, batch, model.widths))
  med = timing.medians(timers, work.repeats)
  fixed, step = target_only_split(work, med, batch)
  calls = calls_model(med, model.widths, batch)
  moved = model.at_workload(calls, fixed, max(step - calls.call(-1, 1), 0.0))
  n = len(alphas)
  scaled = costs_lib.moved_acceptance(
      [a for _, a in alphas], [calib.teacher_alpha(levels)] * n,
      [work.teacher_alpha(levels)] * n)
  return moved, tuple((g, a) for (g, _), a in zip(alphas, scaled))


def intercept(short_s: float, short_iters: float, long_s: float,
               long_iters: float, floor: float) -> float:
  """Fixed seconds per call of a decode timed at two lengths (seconds and
  iterations per call each): the intercept of the line through them, at
  least ``floor`` (target-only's fixed part); ``floor`` when the
  iterations do not differ."""
  if long_iters <= short_iters:
    return floor
  per_iter = (long_s - short_s) / (long_iters - short_iters)
  return max(short_s - short_iters * per_iter, floor)


def alpha_at(alphas, gamma: int) -> float:
  """alpha at ``gamma``: linear between the anchors' (gamma, alpha)
  points, constant past them."""
  return float(np.interp(gamma, [g for g, _ in alphas],
                         [a for _, a in alphas]))


def predict_chains(measurer: DecodeMeasurer, anchors, batch: int,
                   gammas: Sequence[int]) -> dict[int, float]:
  """{gamma: predicted tokens/s}: :func:`fit_chains`'s CostModel (one or
  two anchor chains) prices a decode call of every gamma
  (``CostModel.chain_decode``). The fit is kept in
  ``measurer.fits[batch]`` (:func:`at_workload` moves it to other rows)."""
  model, alphas = fit_chains(measurer, anchors, batch, gammas)
  measurer.fits[batch] = (model, alphas)
  new = measurer.new
  return {g: batch * new / model.chain_decode(alpha_at(alphas, g), g, new)
          for g in gammas}
