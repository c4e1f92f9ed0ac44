"""Expected latency of a hierarchy under i.i.d. acceptance (exact, no MC).

A chain M_{i_0} -> M_{i_1} -> ... -> M_{i_{K-1}} -> target with buffers
T_0 .. T_{K-1} (derivation: trees-and-hierarchies.md section 1.3 and App. A;
the formulas are derived there and checked by simulation, not the paper's
own equations):

* level 0 makes one batch of exactly N_0 = T_0 tokens at cost T_0 c_0;
* a round of level n verifies an incoming batch of N tokens and yields
  Y tokens, P(Y = k | N) = a^(k-1) (1 - a) for k <= N and P(Y = N + 1 | N)
  = a^N, with a = alpha(level n-1, level n); the number of rounds R_n is the
  first r with Y_1 + ... + Y_r >= T_n, computed with the renewal mass
  u(s) = sum_k u(s - k) P(Y = k) (exact; it also gives the distribution of
  the batch size N_n, overshoot included); the cost of a level-n batch is
  C_n = E[R_n] (C_{n-1} + c_n);
* the target verifies one batch per round: E[tokens per target call] =
  E_N[(1 - a^(N+1)) / (1 - a)], and the expected cost per emitted token is
  L = (C_{K-1} + c_K) / E[Y_K].

``simulate`` runs the algorithm itself with Bernoulli acceptances, for
checking the formulas (the tests ask for agreement within 2%).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

Dist = Mapping[int, float]  # batch size -> probability


def yield_dist(a: float, n_dist: Dist) -> np.ndarray:
  """P(Y = k) of one verification round over a batch of random size N.

  Args:
    a: acceptance probability of each token (i.i.d.).
    n_dist: distribution of the incoming batch size N.

  Returns:
    [max N + 2] probabilities (index k = tokens yielded, index 0 unused).
  """
  y = np.zeros(max(n_dist) + 2)
  for n, pn in n_dist.items():
    k = np.arange(1, n + 1)
    y[1:n + 1] += pn * a ** (k - 1) * (1 - a)
    y[n + 1] += pn * a**n
  return y


def rounds(y: np.ndarray, target: int) -> tuple[float, dict[int, float]]:
  """Renewal DP: (E[rounds until >= target tokens], batch-size dist)."""
  u = np.zeros(target)
  u[0] = 1.0
  out: dict[int, float] = {}
  for s in range(target):
    for k in range(1, len(y)):
      if y[k] == 0.0:
        continue
      if s + k >= target:
        out[s + k] = out.get(s + k, 0.0) + u[s] * y[k]
      else:
        u[s + k] += u[s] * y[k]
  return float(u.sum()), out


def expected_tokens(a: float, n_dist: Dist) -> float:
  """E[tokens per target call] = E_N[(1 - a^(N+1)) / (1 - a)]."""
  if a >= 1.0:
    return float(sum(p * (n + 1) for n, p in n_dist.items()))
  return float(sum(p * (1 - a ** (n + 1)) / (1 - a)
                   for n, p in n_dist.items()))


@dataclasses.dataclass(frozen=True)
class Latency:
  """Expected cost of a hierarchy, per emitted token.

  Attributes:
    per_token: expected cost per emitted token (units of the costs).
    tokens_per_target_call: E[Y_K].
    calls_per_token: expected calls of each level per emitted token.
    batch_sizes: expected size of each level's batch.
    target_yield: [K] P(a target call emits k tokens), k = 1..K (empty
      from ``simulate``); its mean is ``tokens_per_target_call``.
  """

  per_token: float
  tokens_per_target_call: float
  calls_per_token: tuple[float, ...]
  batch_sizes: tuple[float, ...]
  target_yield: tuple[float, ...] = ()


def evaluate(chain: Sequence[int], buffers: Sequence[int],
             alpha: Callable[[int, int], float],
             cost: Callable[[int, int], float], target: int) -> Latency:
  """Exact expected latency of ``chain`` (drafter indices, bottom first).

  Args:
    chain: model indices of levels 0 .. K-1 (the target is ``target``).
    buffers: T_0 .. T_{K-1}.
    alpha: alpha(i, j): acceptance of model i's tokens by model j.
    cost: cost(i, width): one call of model i on a block of ``width``
      tokens (level 0 calls width 1; level n >= 1 width B_{n-1} + lag, the
      top B_{K-1} + 1, as the jitted loop pads them).
    target: index of the target model.
  """
  k = len(chain)
  lag = k + 2
  bound = [buffers[0]]
  for t in buffers[1:]:
    bound.append(t + bound[-1])
  n_dist: dict[int, float] = {buffers[0]: 1.0}
  c = buffers[0] * cost(chain[0], 1)
  calls = [float(buffers[0])]
  for n in range(1, k):
    y = yield_dist(alpha(chain[n - 1], chain[n]), n_dist)
    er, n_dist = rounds(y, buffers[n])
    c = er * (c + cost(chain[n], bound[n - 1] + lag))
    calls = [x * er for x in calls] + [er]
  a_top = alpha(chain[-1], target)
  ey = expected_tokens(a_top, n_dist)
  total = c + cost(target, bound[-1] + 1)
  sizes = [float(buffers[0])]
  return Latency(per_token=total / ey, tokens_per_target_call=ey,
                 calls_per_token=tuple(x / ey for x in calls + [1.0]),
                 batch_sizes=tuple(sizes + [float(
                     sum(n * p for n, p in n_dist.items()))] * (k > 1)),
                 target_yield=tuple(float(x) for x in
                                    yield_dist(a_top, n_dist)[1:]))


def simulate(chain: Sequence[int], buffers: Sequence[int],
             alpha: Callable[[int, int], float],
             cost: Callable[[int, int], float], target: int,
             tokens: int = 100_000, seed: int = 0) -> Latency:
  """Monte-Carlo run of the algorithm with i.i.d. Bernoulli acceptance."""
  rng = np.random.default_rng(seed)
  k = len(chain)
  lag = k + 2
  bound = [buffers[0]]
  for t in buffers[1:]:
    bound.append(t + bound[-1])
  spent, calls = 0.0, np.zeros(k + 1)

  def fill(n: int) -> int:
    nonlocal spent
    if n == 0:
      spent += buffers[0] * cost(chain[0], 1)
      calls[0] += buffers[0]
      return buffers[0]
    have, a = 0, alpha(chain[n - 1], chain[n])
    while have < buffers[n]:
      m = fill(n - 1)
      spent += cost(chain[n], bound[n - 1] + lag)
      calls[n] += 1
      acc = 0
      while acc < m and rng.random() < a:
        acc += 1
      have += acc + 1
    return have

  emitted, top_calls = 0, 0
  a_top = alpha(chain[-1], target)
  while emitted < tokens:
    m = fill(k - 1)
    spent += cost(target, bound[-1] + 1)
    calls[k] += 1
    top_calls += 1
    acc = 0
    while acc < m and rng.random() < a_top:
      acc += 1
    emitted += acc + 1
  return Latency(per_token=spent / emitted,
                 tokens_per_target_call=emitted / top_calls,
                 calls_per_token=tuple(calls / emitted),
                 batch_sizes=())
