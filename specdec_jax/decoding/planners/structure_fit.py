"""Fitting the CostModel's tree and hierarchy terms from a few anchors.

``tune_measure.fit_chains`` fits what a chain costs (the models' calls,
the fixed seconds per decode call, the chain loop's overheads, alpha). A
tree or a hierarchy adds unknowns of its own, fitted here from a few
measured anchors of the structure (up to three trees, two hierarchies; each
decode timed with its verifier calls counted, as the chain anchors are),
of different sizes (tree nodes N; a hierarchy's buffered tokens T_0 + ...
+ T_{K-1}):

* its acceptance level: the planners' calibrated inputs (per-rank
  acceptance for trees, ``calibration.calibrate``; pairwise alpha for
  hierarchies, ``hierarchy_calibration.pairwise_alpha``) keep their shape
  and are scaled by one factor s per anchor (capped at 1) so that the
  anchor's predicted blocks per decode call (``costs.iterations`` over the
  structure's distribution of tokens per block) equal its measured ones --
  teacher-forced calibration overstates acceptance in a real decode
  (bench_tree: 8-12% more tokens per call than measured); other sizes read
  it linearly between the anchors, constant past them (:func:`at_size`, as
  chains read alpha between their two anchor gammas);
* its loop overhead per block: what each anchor's seconds per block leave
  after the fixed part and the model calls the planners price, fitted
  through the anchors as 'tree' + N x 'tree_node' + D x 'tree_depth' (up
  to three anchors) / 'hierarchy' + sum(buffers) x 'hierarchy_buffer'
  (measured: the tree loop's non-model work grows with its nodes -- draws,
  acceptance, masks over N -- and its levels -- a drafter call each);
* a hierarchy's fixed seconds per decode call (its middle levels prefill
  too): the intercept of each anchor decoded at two lengths
  (``tune_measure.intercept``); a tree's is the chain's (same models).

The model calls are timed at exactly the widths the structures call
(:func:`needed_widths`), at the decodes' shapes (``DecodeMeasurer.
call_shape``).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Callable, Sequence

import numpy as np

from specdec_jax import timing
from specdec_jax.decoding.hierarchy import latency
from specdec_jax.decoding.planners import costs as costs_lib
from specdec_jax.decoding.planners import tree_shape
from specdec_jax.decoding.planners import tune_measure
from specdec_jax.decoding.strategy import Stack
from specdec_jax.decoding.verify import tree as tree_lib


def needed_widths(structures: Sequence, levels: int, level_fed: bool = True,
                  sync: str = "catchup") -> dict[int, set[int]]:
  """{level: block widths its calls take} for trees (drafter = level 0,
  target = the last) and hierarchies over ``levels`` models, as the
  planners price them (``tree_shape.block_seconds``,
  ``latency.evaluate``); width 1 for every level always."""
  need = {i: {1} for i in range(levels)}
  top = levels - 1
  for s in structures:
    if isinstance(s, Stack):
      k = len(s.buffers)
      bound = np.cumsum(s.buffers)
      for n in range(1, k):
        need[n].add(int(bound[n - 1]) + k + 2)  # latency.evaluate's lag
      need[top].add(int(bound[-1]) + 1)
      continue
    t = s.topology
    feeds = tree_lib.tree_feed_widths(t, level_fed)
    calls = ([feeds[0] + 1, *feeds[1:t.max_depth]] if sync == "catchup"
             else list(feeds[:t.max_depth + 1]))
    need[0].update(int(w) for w in calls)
    need[top].add(t.num_nodes + 1)
  return need


def call_costs(measurer, levels: Sequence[int], batch: int,
               need: dict[int, set[int]]) -> costs_lib.CostModel:
  """A CostModel of models ``levels`` (measurer indices, cheapest first)
  with each call timed at the widths ``need[i]`` (i: position in
  ``levels``; one interleaved ``timing.medians``); the other grid points
  are linear between a model's timed widths (the planners never ask for
  them). A parameter-free model costs 0."""
  widths = tuple(sorted(set().union(*need.values())))
  shape = measurer.call_shape()
  timers = {}
  for i, lvl in enumerate(levels):
    m, p = measurer.models[lvl], measurer.params[lvl]
    if costs_lib.parameter_free(m, p):
      continue
    for w in sorted(need.get(i, {1})):
      timers[(i, w)] = tune_measure.cached_step_timer(m, p, batch, w,
                                                      **shape)
  med = timing.medians(timers, measurer.repeats)
  rows = []
  for i in range(len(levels)):
    pts = sorted((w, s) for (j, w), s in med.items() if j == i)
    rows.append(tuple(float(np.interp(w, *zip(*pts))) if pts else 0.0
                      for w in widths))
  return costs_lib.CostModel(widths, tuple(rows), batch)


def time_anchor(measurer, cand, batch: int, short: bool = False) -> dict:
  """Seconds and verifier calls per decode call of ``cand`` (one
  interleaved ``timing.medians``; iterations: mean over the timed passes),
  also at ``short_tokens`` with ``short``: {'secs', 'iters'[, 'short_secs',
  'short_iters']}."""
  seen, seen_short = [], []
  timers = {"full": tune_measure.counting_timer(
      measurer.runner(cand, batch), measurer.seed, seen)}
  if short:
    timers["short"] = tune_measure.counting_timer(
        measurer.runner(cand, batch, new_tokens=measurer.short_tokens),
        measurer.seed, seen_short)
  med = timing.medians(timers, measurer.repeats)
  n = measurer.chunks(batch)
  out = dict(secs=med["full"] / n, iters=max(statistics.mean(seen), 1) / n)
  if short:
    out.update(short_secs=med["short"] / n,
               short_iters=statistics.mean(seen_short) / n)
  return out


def solve_scale(blocks: Callable[[float], float], measured: float,
                top: float) -> float:
  """The s in [0, top] at which ``blocks(s)`` (blocks per decode call,
  non-increasing in s) equals ``measured`` (bisection; an end when it is
  out of reach)."""
  lo, hi = 0.0, float(top)
  if blocks(hi) >= measured:
    return hi
  if blocks(lo) <= measured:
    return lo
  for _ in range(40):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if blocks(mid) > measured else (lo, mid)
  return 0.5 * (lo + hi)


def scaled(values, s: float):
  """Acceptance values times s, capped at 1 (an [n, n] alpha matrix keeps
  its unit diagonal)."""
  arr = np.minimum(np.asarray(values, np.float64) * s, 1.0)
  if arr.ndim == 2:
    np.fill_diagonal(arr, 1.0)
    return arr
  return tuple(float(a) for a in arr)


def _with(model: costs_lib.CostModel, field: str, name: str,
          value: float) -> costs_lib.CostModel:
  """``model`` with ``field`` ('iteration_s' / 'structure_call_s') entry
  ``name`` set to ``value``."""
  entries = dict(getattr(model, field))
  entries[name] = float(value)
  return dataclasses.replace(model, **{field: tuple(sorted(entries.items()))})


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
  """(intercept, slope) of the line through one point (slope 0) or two."""
  if len(xs) == 1:
    return float(ys[0]), 0.0
  slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
  return float(ys[0] - xs[0] * slope), float(slope)


def _tree_terms(shapes: Sequence[tuple[int, int]], overs: Sequence[float]
                ) -> tuple[float, float, float]:
  """('tree', 'tree_node', 'tree_depth') exactly through the anchors'
  (nodes, depth) -> overhead points: one anchor: a constant; two: constant
  + per node; three: constant + per node + per level."""
  if len(shapes) < 3:
    h, per_node = _line([n for n, _ in shapes], overs)
    return h, per_node, 0.0
  rows = np.array([[1.0, n, d] for n, d in shapes])
  if abs(np.linalg.det(rows)) < 1e-9:
    raise ValueError(f"three tree anchors need (nodes, depth) points not on "
                     f"one line, got {list(shapes)}")
  return tuple(float(x) for x in np.linalg.solve(rows, np.asarray(overs)))


def at_size(points, size: float):
  """The fitted acceptance at a structure of ``size`` (tree nodes, or a
  hierarchy's buffered tokens): linear between the anchors' (size, value)
  ``points``, constant past them (as ``tune_measure.alpha_at`` is for
  chains); values are tuples (per-rank) or [n, n] arrays (pairwise)."""
  xs = [float(x) for x, _ in points]
  vals = np.stack([np.asarray(v, np.float64) for _, v in points])
  out = np.apply_along_axis(lambda col: np.interp(size, xs, col), 0, vals)
  return out if out.ndim == 2 else tuple(float(v) for v in out)


def _anchors(anchors, size, most: int = 2) -> list:
  """One to ``most`` anchors of different sizes, smallest first."""
  anchors = sorted([anchors] if not isinstance(anchors, (list, tuple))
                   else anchors, key=size)
  sizes = [size(a) for a in anchors]
  if not 1 <= len(anchors) <= most or len(set(sizes)) != len(sizes):
    raise ValueError(f"give one to {most} anchors of different sizes, got "
                     f"sizes {sizes}")
  return anchors


def fit_tree(measurer, anchors, batch: int, model: costs_lib.CostModel,
             acceptance: Sequence[float], *, rank0: float | None = None,
             sync: str = "catchup", level_fed: bool = True,
             timed: Sequence[dict] | None = None
             ) -> tuple[costs_lib.CostModel, tuple]:
  """(CostModel with the tree loop's overheads, ((nodes, per-rank
  acceptance), ...) fitted at each anchor; :func:`at_size` reads it).

  Each anchor's acceptance scale solves its measured blocks per call; what
  its seconds per block leave after the fixed part and the model calls is
  its overhead, fitted exactly through the anchors as 'tree' + N x
  'tree_node' + D x 'tree_depth' (one anchor: 'tree' only; two: no
  'tree_depth').

  Args:
    measurer: a ``tune_measure.DecodeMeasurer`` (or one like it).
    anchors: one to three tree Candidates of different node counts
      (drafter = model 0 of ``model``).
    batch: batch size.
    model: call costs of (drafter, target) at the trees' widths, with the
      chain fit's fixed seconds per call (``spec_call_s``: a tree runs the
      same two models).
    acceptance: calibrated per-rank acceptance (its shape is kept).
    rank0: the first-ranked child's acceptance in a real decode -- a
      chain's alpha (``fit_chains``): the first child IS the chain's draft
      (q's argmax at T = 0, a draw from q otherwise) -- kept as given, the
      scale then fits ranks 1.. of the anchors that branch (a chain-shaped
      anchor has none: it fits the overheads only; no branching anchor:
      ranks 1.. as calibrated) (None: every rank scaled).
    sync, level_fed: how the tree loop drafts (SpecDecode: 'catchup'; the
      built-in models are level-fed).
    timed: :func:`time_anchor`'s answers, one per anchor (None: timed).
  """
  nodes = lambda c: c.structure.topology.num_nodes
  anchors = _anchors(anchors, nodes, most=3)
  timed = timed or [time_anchor(measurer, a, batch) for a in anchors]
  acc = tuple(float(a) for a in acceptance)
  head, rest = ((), acc) if rank0 is None else ((float(rank0),), acc[1:])
  fitted = lambda x: head + scaled(rest, x) if rest else head
  bare = model
  for name in ("tree", "tree_node", "tree_depth"):
    bare = _with(bare, "iteration_s", name, 0.0)
  points, overs = [], []
  for a, t in zip(anchors, timed):
    topo = a.structure.topology
    if rank0 is None or topo.max_children > 1:  # else no rank >= 1 to fit
      s = solve_scale(lambda x, topo=topo: costs_lib.iterations(
          tree_shape.tokens_dist(topo, fitted(x)), measurer.new),
                      t["iters"], 1.0 / max(max(rest, default=1.0), 1e-9))
      points.append((nodes(a), fitted(s)))
    block = tree_shape.block_seconds(topo, bare.tree_costs(0, level_fed),
                                     sync)
    overs.append((t["secs"] - bare.fixed("tree")) / t["iters"] - block)
  terms = _tree_terms([(nodes(a), a.structure.topology.max_depth)
                       for a in anchors], overs)
  fit = model
  for name, value in zip(("tree", "tree_node", "tree_depth"), terms):
    fit = _with(fit, "iteration_s", name, value)
  return fit, tuple(points) or ((1, fitted(1.0)),)


def fit_stack(measurer, anchors, batch: int, model: costs_lib.CostModel,
              alpha, *, timed: Sequence[dict] | None = None
              ) -> tuple[costs_lib.CostModel, tuple]:
  """(CostModel with the hierarchy's overheads and fixed part, ((buffered
  tokens, alpha matrix), ...) fitted at each anchor; :func:`at_size`).

  Each anchor's alpha scale solves its measured target calls per decode
  call; its fixed part is the intercept of its decodes at two lengths
  (the fitted value: their mean); what its seconds per round leave after
  that and the model calls is its overhead, fitted exactly through the
  anchors as 'hierarchy' + sum(buffers) x 'hierarchy_buffer' (one anchor:
  'hierarchy' only).

  Args:
    measurer: a ``tune_measure.DecodeMeasurer`` (or one like it).
    anchors: one or two Stack Candidates over every model of ``model``,
      of different sum(buffers).
    batch: batch size.
    model: call costs of the stack's models (cheapest first) at its
      widths, with the chain fit's ``spec_call_s`` (the fixed part's floor).
    alpha: [n, n] calibrated pairwise acceptance (its shape is kept).
    timed: :func:`time_anchor`'s answers with ``short``, one per anchor
      (None: timed here).
  """
  size = lambda c: sum(c.structure.buffers)
  anchors = _anchors(anchors, size)
  timed = timed or [time_anchor(measurer, a, batch, short=True)
                    for a in anchors]
  a0 = np.asarray(alpha, np.float64)
  top = 1.0 / max(float(a0[~np.eye(len(a0), dtype=bool)].max()), 1e-9)
  fixed = statistics.mean(tune_measure.intercept(
      t["short_secs"], t["short_iters"], t["secs"], t["iters"],
      model.fixed("chain")) for t in timed)
  points, overs = [], []
  for a, t in zip(anchors, timed):
    buffers = a.structure.buffers
    s = solve_scale(lambda x, b=buffers: costs_lib.iterations(
        model.stack(b, scaled(a0, x)).target_yield, measurer.new),
                    t["iters"], top)
    points.append((size(a), scaled(a0, s)))
    lat: latency.Latency = model.stack(buffers, points[-1][1])
    overs.append((t["secs"] - fixed) / t["iters"]
                 - lat.per_token * lat.tokens_per_target_call)
  h, per_buffer = _line([size(a) for a in anchors], overs)
  fit = _with(_with(_with(model, "iteration_s", "hierarchy", h),
                    "iteration_s", "hierarchy_buffer", per_buffer),
              "structure_call_s", "hierarchy", fixed)
  return fit, tuple(points)


__all__ = ["at_size", "call_costs", "fit_stack", "fit_tree",
           "needed_widths", "scaled", "solve_scale", "time_anchor"]

