"""Choosing the hierarchy: which drafters, in which order, which buffers.

Inputs are MEASURED: ``alpha[i][j]`` (acceptance of model i's tokens by
model j, ``calibrate.alphas``) and ``cost(i, width)`` (seconds of one call of
model i on a block of ``width`` tokens at the serving batch size,
``calibrate.costs``). Candidates are ordered cheapest first; the last one is
the target.

* ``dp``: the generalized-shortest-path dynamic program over the DAG of
  (model, buffer) vertices (trees-and-hierarchies.md section 1.4: an edge
  (j, T') -> (i, T) for a cheaper model i multiplies everything below by the
  expected rounds gamma(alpha_ij, T, T') and adds c_j), with the scalar
  approximation that a batch from below has exactly T tokens; it keeps the
  best ``beam`` partial chains per vertex, scored with the EXACT evaluator
  (``latency.evaluate``, overshoot included), and re-scores every full chain
  exactly. Polynomial: O(m^2 T^2 beam) evaluations.
* ``brute``: every ordered subset of the drafters and every buffer vector
  (exact); used when there are at most ``brute_force_limit`` drafters.

``plan`` returns the best hierarchies with their predicted latency and the
predicted speedup over target-only and over the best single drafter.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Callable, Sequence

import numpy as np

from specdec_jax.decoding.hierarchy import latency


@dataclasses.dataclass(frozen=True)
class Candidate:
  """A hierarchy and its predicted cost.

  Attributes:
    chain: drafter indices, bottom first (the target is implicit).
    buffers: T_0 .. T_{K-1}.
    latency: expected cost of the model calls per emitted token
      (``latency.Latency``).
    loop_s: the loop's non-model seconds per target round
      (:func:`loop_seconds`; 0 when the costs carry no overheads).
  """

  chain: tuple[int, ...]
  buffers: tuple[int, ...]
  latency: latency.Latency
  loop_s: float = 0.0

  @property
  def per_token(self) -> float:
    """Model calls plus the loop's overhead, per emitted token."""
    return self.latency.per_token + (
        self.loop_s / self.latency.tokens_per_target_call)


def loop_seconds(cost, buffers: Sequence[int]) -> float:
  """Non-model seconds per target round of a hierarchy with ``buffers``:
  'hierarchy' + sum(buffers) x 'hierarchy_buffer' when ``cost`` is a
  ``planners.CostModel`` holding them (``structure_fit.fit_stack`` fits
  both from anchor decodes; ``CostModel.stack_decode`` prices the same
  terms), else 0 (a bare cost(i, width) function: model calls only)."""
  overhead = getattr(cost, "overhead", None)
  if overhead is None:
    return 0.0
  return overhead("hierarchy") + sum(buffers) * overhead("hierarchy_buffer")


@dataclasses.dataclass(frozen=True)
class Plan:
  """The planner's answer.

  Attributes:
    best: the chosen hierarchy.
    top: the best hierarchies, best first.
    target_only: cost per token of the target alone.
    best_single: the best two-level (single drafter) configuration.
    names: model names, by index (for printing).
  """

  best: Candidate
  top: tuple[Candidate, ...]
  target_only: float
  best_single: Candidate
  names: tuple[str, ...] = ()

  @property
  def speedup(self) -> float:
    """Predicted speedup of ``best`` over the target alone."""
    return self.target_only / self.best.per_token

  @property
  def gain_over_single(self) -> float:
    """Predicted speedup of ``best`` over the best single drafter."""
    return self.best_single.per_token / self.best.per_token

  def describe(self, c: Candidate) -> str:
    name = lambda i: self.names[i] if self.names else f"M{i}"
    target = len(self.names) - 1 if self.names else "T"
    chain = " -> ".join(name(i) for i in c.chain)
    return (f"{chain} -> {name(target) if self.names else target} "
            f"buffers {list(c.buffers)}")


def check_inputs(alpha, cost: Callable[[int, int], float], n: int) -> None:
  """Candidates must be ordered cheapest first, alphas in [0, 1]."""
  if n < 2:
    raise ValueError(f"the planner needs at least one drafter and the "
                     f"target, got {n} model(s)")
  a = np.asarray(alpha, dtype=float)
  if a.shape != (n, n):
    raise ValueError(f"alpha must be a {n}x{n} matrix, got {a.shape}")
  if not np.all(np.isfinite(a)) or a.min() < 0 or a.max() > 1:
    raise ValueError("alpha entries must be probabilities in [0, 1]")
  costs = [cost(i, 1) for i in range(n)]
  if any(not np.isfinite(x) or x <= 0 for x in costs):
    raise ValueError(f"costs must be positive numbers, got {costs}")
  bad = [i for i in range(1, n) if costs[i] < costs[i - 1]]
  if bad:
    i = bad[0]
    raise ValueError(
        f"models must be ordered cheapest first (the target last): model "
        f"{i} costs {costs[i]:.3g} per call but model {i - 1} costs "
        f"{costs[i - 1]:.3g}; reorder the candidates")


MAX_BUFFER = 64
"""The largest buffer the planner searches (one level's batch of tokens)."""
MAX_EVALUATIONS = 100_000
"""Latency evaluations a search may make (each is a few microseconds to a
millisecond of Python; 100k is about a minute at worst)."""


def search_size(n: int, max_buffer: int, use_brute: bool, beam: int,
                max_depth: int | None) -> int:
  """Latency evaluations :func:`brute` or :func:`dp` will make (counted
  before searching)."""
  drafters = n - 1
  depth = min(drafters, max_depth or drafters)
  if use_brute:
    return sum(math.comb(drafters, k) * max_buffer ** k
               for k in range(1, depth + 1))
  return drafters * max_buffer * (1 + drafters * max_buffer * beam)


def check_search(n: int, max_buffer: int, use_brute: bool, beam: int,
                 max_depth: int | None) -> None:
  """Refuses a search beyond the documented bounds, before it starts."""
  if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or (
      not 1 <= max_buffer <= MAX_BUFFER):
    raise ValueError(f"max_buffer must be an integer in [1, {MAX_BUFFER}] "
                     f"(planner.MAX_BUFFER), got {max_buffer!r}")
  size = search_size(n, max_buffer, use_brute, beam, max_depth)
  if size > MAX_EVALUATIONS:
    raise ValueError(f"this search would evaluate {size:,} hierarchies, more "
                     f"than {MAX_EVALUATIONS:,} (planner.MAX_EVALUATIONS); "
                     f"lower max_buffer, max_depth or the number of "
                     f"candidates" + ("" if not use_brute else
                                      ", or use method='dp'"))


def brute(alpha, cost, n: int, max_buffer: int,
          max_depth: int | None = None) -> list[Candidate]:
  """Every hierarchy (ordered subsets, buffers 1..max_buffer), best first."""
  target = n - 1
  a = lambda i, j: float(alpha[i][j])
  out = []
  for depth in range(1, (max_depth or n - 1) + 1):
    for chain in itertools.combinations(range(n - 1), depth):
      for bufs in itertools.product(range(1, max_buffer + 1), repeat=depth):
        out.append(Candidate(chain, bufs, latency.evaluate(
            chain, bufs, a, cost, target), loop_seconds(cost, bufs)))
  out.sort(key=lambda c: c.per_token)
  return out


def dp(alpha, cost, n: int, max_buffer: int, beam: int = 8,
       max_depth: int | None = None) -> list[Candidate]:
  """The (model, buffer) DAG program with exact re-scoring, best first."""
  target = n - 1
  a = lambda i, j: float(alpha[i][j])
  # best[(i, t)]: up to `beam` partial chains ending at drafter i with
  # buffer t, each scored by the exact cost of one batch of level i.
  best: dict[tuple[int, int], list[tuple[float, tuple, tuple]]] = {}

  def batch_cost(chain, bufs):
    """Exact cost of one batch of the chain's last level."""
    lat = latency.evaluate(chain, bufs, a, cost, target)
    return lat.per_token * lat.tokens_per_target_call - cost(
        target, _bound(bufs) + 1)

  for i in range(n - 1):
    for t in range(1, max_buffer + 1):
      options = [((i,), (t,))]
      for h in range(i):
        for th in range(1, max_buffer + 1):
          for _, chain, bufs in best.get((h, th), []):
            if max_depth is None or len(chain) < max_depth:
              options.append((chain + (i,), bufs + (t,)))
      scored = sorted((batch_cost(c, b), c, b) for c, b in options)
      best[i, t] = scored[:beam]
  full = {(c, b) for v in best.values() for _, c, b in v}
  out = [Candidate(c, b, latency.evaluate(c, b, a, cost, target),
                   loop_seconds(cost, b)) for c, b in full]
  out.sort(key=lambda c: c.per_token)
  return out


def _bound(bufs) -> int:
  total = 0
  for t in bufs:
    total += t
  return total


def plan(alpha, cost: Callable[[int, int], float], max_buffer: int = 8,
         method: str = "auto", brute_force_limit: int = 5, beam: int = 8,
         top: int = 5, names: Sequence[str] = (),
         max_depth: int | None = None) -> Plan:
  """The latency-optimal hierarchy of candidates 0..n-1 (n-1: the target).

  Args:
    alpha: [n, n] measured acceptance, alpha[i][j] of i's tokens by j.
    cost: cost(i, width) seconds of one call of model i on ``width``
      tokens.
    max_buffer: buffers range over 1..max_buffer.
    method: 'auto' (brute force up to ``brute_force_limit`` drafters, else
      the DP), 'brute' or 'dp'.
    brute_force_limit, beam, top: see the module docstring.
    names: model names for printing.
    max_depth: optional limit on the number of drafters stacked.
  """
  n = len(alpha)
  check_inputs(alpha, cost, n)
  if max_buffer < 1:
    raise ValueError(f"max_buffer must be >= 1, got {max_buffer}")
  if method not in ("auto", "brute", "dp"):
    raise ValueError(f"method must be 'auto', 'brute' or 'dp', got "
                     f"{method!r}")
  use_brute = method == "brute" or (method == "auto" and
                                    n - 1 <= brute_force_limit)
  check_search(n, max_buffer, use_brute, beam, max_depth)
  ranked = (brute(alpha, cost, n, max_buffer, max_depth) if use_brute else
            dp(alpha, cost, n, max_buffer, beam, max_depth))
  single = min((c for c in ranked if len(c.chain) == 1),
               key=lambda c: c.per_token)
  target_only = getattr(cost, "target_only", None)
  return Plan(best=ranked[0], top=tuple(ranked[:top]),
              target_only=target_only() if target_only else cost(n - 1, 1),
              best_single=single,
              names=tuple(names))
