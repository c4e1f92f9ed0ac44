"""One cost model: what a decode strategy costs on this machine.

A :class:`CostModel` holds measured quantities only:

* ``seconds[i][k]``: one call of model i (cheapest first, the target last)
  on a block of ``widths[k]`` tokens at the model's ``batch`` -- timed by
  ``timing.step_timer`` (:func:`measure`), interpolated in between;
* ``iteration_s``: the loop's non-model seconds per iteration, by structure
  ('autoregressive', 'chain', 'tree', 'hierarchy'; 'draft': per drafted
  token of a chain; ``scripts/bench_overhead.py`` measures them, ``tune``
  fits them);
* ``call_s``: fixed seconds per decode call (host prep, encode, prefill;
  ``tune_measure.fit_chains`` measures it from target-only decodes of
  two lengths); ``spec_call_s`` the same for a speculative decode (the
  drafter's encode and prefill besides the target's; fitted from an anchor
  chain decoded at two lengths).

It prices a strategy as seconds per emitted token from acceptance
statistics (pairwise alpha for chains, per-rank acceptance for trees), a
whole decode call of a chain, a tree or a hierarchy (``chain_decode``,
``tree_decode``, ``stack_decode``: the fixed part plus the expected
iterations, the last one cut at new_tokens; ``structure_fit`` fits the
tree / hierarchy terms from a few anchors of each), and
gives the planners their inputs (``tree_costs`` for ``plan_tree``; the
hierarchy planner takes the CostModel itself as its c_i(w):
``hierarchy_calibration.CallCosts`` is this class), so every planner prices
calls with the same numbers.

Worked example (the test runs it): a target step of 1.0 ms, a 4-token
target block of 1.2 ms, a drafter step of 0.1 ms and 0.05 ms of chain
overhead per iteration. A chain of gamma = 3 at alpha = 0.8 yields
(1 - 0.8^4) / 0.2 = 2.952 tokens per iteration for 3 x 0.1 + 1.2 + 0.05 =
1.55 ms: 0.525 ms per token, 1.90x target-only (1.0 ms per token).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from specdec_jax import timing

# 'draft': non-model seconds per DRAFTED token of a chain (the drafter's
# inner loop: its sampling, cache writes); 'tree_node' / 'tree_depth': per
# tree node / tree level per block; 'hierarchy_buffer': per buffered token
# (T_0 + ... + T_{K-1}) per target round of a hierarchy; the others: per
# iteration.
STRUCTURES = ("autoregressive", "chain", "draft", "tree", "tree_node",
              "tree_depth", "hierarchy", "hierarchy_buffer")
# The tree and hierarchy loops' overheads: carried unchanged to another
# workload (CostModel.at_workload).
STRUCTURE_OVERHEADS = ("tree", "tree_node", "tree_depth", "hierarchy",
                       "hierarchy_buffer")


def chain_tokens(alpha: float, gamma: int) -> float:
  """Expected tokens per chain iteration: (1 - a^(g+1)) / (1 - a)."""
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
  if alpha >= 1.0:
    return float(gamma + 1)
  return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def iterations(token_probs: Sequence[float], new_tokens: int) -> float:
  """Expected loop iterations to emit ``new_tokens`` tokens.

  One iteration emits k tokens with probability ``token_probs[k - 1]``
  (i.i.d. across iterations); the decode stops at new_tokens, so the last
  iteration may emit fewer than it could. A recursion over the tokens
  left: left[n] = 1 + sum_k P(k) left[max(n - k, 0)].

  Args:
    token_probs: [K] P(1 token), ..., P(K tokens); sums to 1.
    new_tokens: tokens per row.

  Returns:
    E[iterations] (float).
  """
  probs = [float(p) for p in token_probs]
  if not probs or min(probs) < 0.0 or abs(sum(probs) - 1.0) > 1e-6:
    raise ValueError(f"token_probs must be probabilities of 1..K tokens "
                     f"summing to 1, got {probs}")
  left = [0.0] * (int(new_tokens) + 1)  # left[n]: iterations for n tokens
  for n in range(1, len(left)):
    left[n] = 1.0 + sum(p * left[max(n - k, 0)]
                        for k, p in enumerate(probs, start=1))
  return left[-1]


def chain_iterations(alpha: float, gamma: int, new_tokens: int) -> float:
  """Expected chain iterations to emit ``new_tokens`` tokens.

  Each iteration emits k = 1..gamma + 1 tokens (k - 1 drafts accepted,
  then a residual or bonus token): P(k) = alpha^(k-1) (1 - alpha) for
  k <= gamma, alpha^gamma for k = gamma + 1 (:func:`iterations`). Exact
  for i.i.d. acceptance, where new_tokens / chain_tokens(alpha, gamma) is
  not: at alpha = 1, 16 tokens take 4 iterations of gamma 4 (5 tokens
  each), not 3.2.
  """
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
  probs = [alpha ** (k - 1) * (1.0 - alpha) for k in range(1, gamma + 1)]
  probs.append(alpha ** gamma)  # [gamma + 1]: k = 1..gamma + 1
  return iterations(probs, new_tokens)


def moved_acceptance(fitted, calibrated, workload):
  """A fitted acceptance moved to another workload: ``fitted`` (per-rank
  or per-anchor tuple, or [n, n] pairwise array; ``structure_fit.at_size``) times the
  workload's teacher-forced acceptance over the calibration's (both
  shaped as ``fitted``: ``planners.calibrate`` / ``pairwise_alpha`` of each
  row set), capped at 1; where the calibration's is 0 the workload's own.
  The fit keeps what teacher forcing misses (a batch waits for its
  slowest row, ranks are not independent), the ratio what the workload
  changes (``tune_measure.at_workload`` moves chain alphas with it; the tree /
  hierarchy check moves per-rank and pairwise acceptance)."""
  f, c, w = (np.asarray(x, np.float64) for x in (fitted, calibrated,
                                                  workload))
  if not f.shape == c.shape == w.shape:
    raise ValueError(f"fitted, calibrated and workload acceptance must "
                     f"have one shape, got {f.shape}, {c.shape}, {w.shape}")
  safe = np.where(c > 0, c, 1.0)
  out = np.minimum(np.where(c > 0, f * w / safe, w), 1.0)
  return out if out.ndim == 2 else tuple(float(v) for v in out)


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Measured costs of a model stack at one batch size.

  Attributes:
    widths: block widths measured, ascending, starting at 1.
    seconds: [levels][len(widths)] seconds of one call, cheapest model
      first, the target last.
    batch: batch size of the measurements.
    iteration_s: ((structure, seconds), ...) non-model seconds per loop
      iteration by structure (missing: 0). A chain's are fitted as
      'chain' + gamma x 'draft' (either may be negative: a linear fit of
      what two anchors leave; :meth:`chain` floors their sum at 0).
    call_s: fixed seconds per target-only decode call.
    spec_call_s: fixed seconds per speculative decode call (None: call_s).
    structure_call_s: ((structure, seconds), ...) fixed seconds per decode
      call of a structure whose fixed part differs from a chain's (a
      hierarchy prefills its middle levels too; missing: spec_call_s).
  """

  widths: tuple[int, ...]
  seconds: tuple[tuple[float, ...], ...]
  batch: int = 1
  iteration_s: tuple[tuple[str, float], ...] = ()
  call_s: float = 0.0
  spec_call_s: float | None = None
  structure_call_s: tuple[tuple[str, float], ...] = ()

  def __post_init__(self):
    if not self.widths or self.widths[0] != 1 or list(self.widths) != sorted(
        set(self.widths)):
      raise ValueError(f"widths must be ascending and start at 1, got "
                       f"{list(self.widths)}")
    for row in self.seconds:
      if len(row) != len(self.widths):
        raise ValueError(f"every seconds row needs one entry per width "
                         f"({len(self.widths)}), got {len(row)}")
    for name, _ in self.iteration_s + self.structure_call_s:
      if name not in STRUCTURES:
        raise ValueError(f"unknown structure {name!r} in iteration_s; use "
                         f"one of {STRUCTURES}")

  def call(self, level: int, width: int) -> float:
    """Seconds of one call of model ``level`` (-1: the target) on
    ``width`` tokens (linear between measured widths, clamped past them)."""
    return float(np.interp(width, self.widths, self.seconds[level]))

  def overhead(self, structure: str) -> float:
    """Non-model seconds per iteration of ``structure``."""
    return dict(self.iteration_s).get(structure, 0.0)

  def target_only(self) -> float:
    """Seconds per token of target-only decoding."""
    return self.call(-1, 1) + self.overhead("autoregressive")

  def chain(self, alpha: float, gamma: int, drafter: int = 0) -> float:
    """Seconds per token of a chain of ``gamma`` drafts of model
    ``drafter`` verified by the target, at pairwise acceptance ``alpha``."""
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
      raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    loop = max(self.overhead("chain") + gamma * self.overhead("draft"), 0.0)
    secs = gamma * self.call(drafter, 1) + self.call(-1, gamma + 1) + loop
    return secs / chain_tokens(alpha, gamma)

  def chain_decode(self, alpha: float, gamma: int, new_tokens: int,
                   drafter: int = 0) -> float:
    """Seconds of one decode call of ``new_tokens`` tokens per row with a
    chain: the speculative fixed part (``spec_call_s``; None: ``call_s``)
    plus ``chain_iterations`` iterations, each gamma drafter steps, one
    target block of gamma + 1 and the chain's loop overheads. The fixed
    part is paid once per call, so a longer chain (fewer iterations) does
    not amortise it any differently than a shorter one."""
    per_iter = self.chain(alpha, gamma, drafter) * chain_tokens(alpha, gamma)
    fixed = self.call_s if self.spec_call_s is None else self.spec_call_s
    return fixed + chain_iterations(alpha, gamma, new_tokens) * per_iter

  def fixed(self, structure: str = "chain") -> float:
    """Fixed seconds per decode call of ``structure`` ('autoregressive':
    ``call_s``; others: ``structure_call_s``, else ``spec_call_s``, else
    ``call_s``)."""
    if structure == "autoregressive":
      return self.call_s
    own = dict(self.structure_call_s)
    if structure in own:
      return own[structure]
    return self.call_s if self.spec_call_s is None else self.spec_call_s

  def tree_decode(self, topology, acceptance: Sequence[float],
                  new_tokens: int, drafter: int = 0, sync: str = "catchup",
                  level_fed: bool = True) -> float:
    """Seconds of one decode call of ``new_tokens`` tokens per row with a
    token tree (``verify.topology.Topology``) at per-rank ``acceptance``:
    the fixed part plus E[blocks] x the tree planner's block seconds
    (``tree_shape.block_seconds``: the drafter's calls, the target's
    N + 1-token block, the 'tree' overhead + N x 'tree_node' + D x
    'tree_depth'); blocks are counted with the
    tree's distribution of tokens per block (``tree_shape.tokens_dist``),
    the last cut at new_tokens (:func:`iterations`)."""
    from specdec_jax.decoding.planners import tree_shape  # pylint: disable=g-import-not-at-top
    block = tree_shape.block_seconds(
        topology, self.tree_costs(drafter, level_fed), sync)
    blocks = iterations(tree_shape.tokens_dist(topology, acceptance),
                        new_tokens)
    return self.fixed("tree") + blocks * block

  def stack(self, buffers: Sequence[int], alpha,
            chain: Sequence[int] | None = None):
    """``hierarchy.latency.evaluate`` of drafters ``chain`` (default: every
    model but the target, cheapest first) with ``buffers`` and pairwise
    acceptance ``alpha(i, j)`` (or an [n, n] matrix), priced by this model:
    the target's seconds per round are ``per_token x
    tokens_per_target_call``, the loop's 'hierarchy' overhead not
    included."""
    from specdec_jax.decoding.hierarchy import latency  # pylint: disable=g-import-not-at-top
    top = len(self.seconds) - 1
    chain = tuple(range(top)) if chain is None else tuple(chain)
    fn = alpha if callable(alpha) else (
        lambda i, j, a=np.asarray(alpha): float(a[i, j]))
    return latency.evaluate(chain, tuple(buffers), fn, self.call, top)

  def stack_decode(self, buffers: Sequence[int], alpha, new_tokens: int,
                   chain: Sequence[int] | None = None) -> float:
    """Seconds of one decode call of ``new_tokens`` tokens per row with a
    hierarchy (:meth:`stack`): the 'hierarchy' fixed part plus E[target
    rounds] x (the latency model's seconds per round + the 'hierarchy'
    overhead + sum(buffers) x 'hierarchy_buffer'), rounds counted with
    the target's distribution of tokens per call, the last cut at
    new_tokens."""
    lat = self.stack(buffers, alpha, chain)
    per_round = (lat.per_token * lat.tokens_per_target_call
                 + self.overhead("hierarchy")
                 + sum(buffers) * self.overhead("hierarchy_buffer"))
    return self.fixed("hierarchy") + iterations(
        lat.target_yield, new_tokens) * per_round

  def at_workload(self, calls: "CostModel", call_s: float,
                  autoregressive: float,
                  carry: Sequence[str] = STRUCTURE_OVERHEADS
                  ) -> "CostModel":
    """This model moved to another workload's lengths (prompt / input
    width): ``calls``' model-call seconds (the same models and batch, timed
    at the workload's lengths), its target-only fixed seconds per call
    ``call_s`` and loop overhead ``autoregressive`` (both re-timed there:
    ``tune_measure.fixed_and_step``). The chain's fitted overheads move in
    proportion, as they grow with the caches and the prompt: per iteration
    with the target's step, per draft ('draft') with the drafter's (model
    0; unscaled when parameter-free); each speculative fixed part's excess
    over ``call_s`` with ``call_s``. Overheads named in ``carry`` (default:
    the tree and hierarchy loops') are carried as fitted; ``carry=()``
    scales them too ('tree_node', 'hierarchy_buffer' with the drafter, the
    rest with the step). Measured on the default families (prompt width 205
    -> 37-45): the chain's overhead and the target's step per iteration
    shrank 0.67 / 0.64 (Gemma) and 0.53 / 0.58 (T5) at batch 8, the
    speculative excess and call_s 0.19 / 0.27 and 0.21 / 0.30; the tree and
    stack loops' non-model time per iteration did not (T5, batch 1: 0.4-2.6
    ms, then 0.8-4.1 ms). Held-out cells within 10%, carried vs scaled: 18
    vs 3 of 24 re-priced from that run; 15 vs 12 of 48 in a fresh one (both
    families; stacks 11 vs 7 of 20; cost_model_structures_heldout.md)."""
    if calls.widths != self.widths or len(calls.seconds) != len(
        self.seconds):
      raise ValueError(
          f"at_workload needs the same models timed at the same widths: "
          f"got {len(calls.seconds)} models at widths {list(calls.widths)}, "
          f"this model has {len(self.seconds)} at {list(self.widths)}")

    def ratio(new: float, old: float) -> float:
      return new / old if old > 0 and new > 0 else 1.0

    step = ratio(calls.call(-1, 1), self.call(-1, 1))
    draft = ratio(calls.call(0, 1), self.call(0, 1))
    fixed = ratio(call_s, self.call_s)
    per_draft = ("draft", "tree_node", "hierarchy_buffer")
    iteration_s = tuple(
        (name, s if name in carry else s * (
            draft if name in per_draft else step))
        for name, s in self.iteration_s if name != "autoregressive")
    moved = lambda s: call_s + (s - self.call_s) * fixed
    return dataclasses.replace(
        self, seconds=calls.seconds, call_s=call_s,
        iteration_s=(("autoregressive", autoregressive),) + iteration_s,
        spec_call_s=None if self.spec_call_s is None else moved(
            self.spec_call_s),
        structure_call_s=tuple((n, moved(s))
                               for n, s in self.structure_call_s))

  def target_only_decode(self, new_tokens: int) -> float:
    """Seconds of one target-only decode call of ``new_tokens`` tokens."""
    return self.call_s + new_tokens * self.target_only()

  def best_gamma(self, alpha: float, gammas: Sequence[int] = range(1, 9),
                 drafter: int = 0) -> tuple[int | None, float]:
    """(gamma, seconds per token) of the fastest chain, or (None,
    target-only seconds per token) when no chain beats target-only."""
    best = (None, self.target_only())
    for g in gammas:
      s = self.chain(alpha, int(g), drafter)
      if s < best[1]:
        best = (int(g), s)
    return best

  def tree_costs(self, drafter: int = 0, level_fed: bool = True):
    """The tree planner's ``calibration.Costs`` (drafter ``drafter`` and the
    target, the tree loop's overhead)."""
    from specdec_jax.decoding.planners.calibration import Costs  # pylint: disable=g-import-not-at-top
    return Costs(self.widths, tuple(self.seconds[drafter]),
                 tuple(self.seconds[-1]), self.overhead("tree"), level_fed,
                 self.overhead("tree_node"), self.overhead("tree_depth"))

  def __call__(self, level: int, width: int) -> float:
    """``call(level, width)``: the hierarchy planner's c_i(w)."""
    return self.call(level, width)

  def select(self, order: Sequence[int]) -> "CostModel":
    """The costs of models ``order`` (re-indexed 0..len(order)-1)."""
    return dataclasses.replace(
        self, seconds=tuple(self.seconds[i] for i in order))

  def call_costs(self) -> "CostModel":
    """The hierarchy planner's costs (``hierarchy_calibration.CallCosts``
    is this class): the model itself."""
    return self


def parameter_free(model, params) -> bool:
  """Whether ``model`` is a parameter-free drafter (``models.NgramModel``,
  prompt lookup): its calls are priced at zero (their cost is loop work,
  counted in the structure's overhead)."""
  if type(model).__name__ == "NgramModel":
    return True
  return not jax.tree.leaves(params)


def measure(levels: Sequence, batch: int = 1,
            widths: Sequence[int] = (1, 2, 4, 8, 16), repeats: int = 5,
            iteration_s: dict | None = None, call_s: float = 0.0,
            sampling=None) -> CostModel:
  """Times every model of ``levels`` at every width (this machine).

  Args:
    levels: [(model, params)], cheapest first, the target last. A
      parameter-free drafter (``parameter_free``) costs 0 and is not timed.
    batch: serving batch size.
    widths: block widths (1 is added).
    repeats: timed loops per (model, width); the median is kept, every
      (model, width) timed in turn per repeat.
    iteration_s: {structure: non-model seconds per iteration}.
    call_s: fixed seconds per decode call.
    sampling: sampling strategy timed with each call (None: the call).

  Returns:
    CostModel.
  """
  widths = tuple(sorted({1, *(int(w) for w in widths)}))
  if widths[0] < 1:
    raise ValueError(f"widths must be >= 1, got {list(widths)}")
  free = {i for i, (m, p) in enumerate(levels[:-1]) if parameter_free(m, p)}
  timers = {(i, w): timing.step_timer(m, p, batch, w, sampling=sampling)
            for i, (m, p) in enumerate(levels) for w in widths
            if i not in free}
  med = timing.medians(timers, repeats)
  med.update({(i, w): 0.0 for i in free for w in widths})
  seconds = tuple(tuple(med[i, w] for w in widths)
                  for i in range(len(levels)))
  return CostModel(widths, seconds, batch,
                   tuple(sorted((iteration_s or {}).items())), call_s)


__all__ = ["CostModel", "STRUCTURES", "chain_iterations", "chain_tokens",
           "measure",
           "parameter_free"]
