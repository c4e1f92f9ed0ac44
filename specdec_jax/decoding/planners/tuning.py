"""``tune``: measure candidate strategies per batch size, build the auto table.

For a stack of models (cheapest first, the target last) and a few
calibration prompts, ``tune`` decodes every candidate -- target-only, a
chain of gamma drafts for each gamma, a couple of tree shapes, and with
three or more models a hierarchy (and for objective 'quality' cascade rules
over an alpha grid) -- and keeps, per batch size, the one the objective
prefers:

* ``'latency'``: the fastest LOSSLESS candidate (target-only or SpecDecode
  on a chain / tree / stack). A speculative candidate is chosen only if its
  tokens/s beat target-only's by ``margin`` (default 2%), both timed back to
  back (median of per-repeat ratios; the ``confirm`` fastest are timed
  twice), so auto is never slower than target-only beyond noise: measured
  selection, not a prediction. Candidates within ``margin`` of the fastest
  are a tie, won by the fewest drafted tokens per verifier call
  (:func:`draft_width`: the least hurt where acceptance is lower than on
  the calibration prompts).
* ``'quality'`` with ``latency_budget`` (seconds per token relative to
  target-only, e.g. 0.8): the best quality among candidates within the
  budget (ties: the faster; none within: the fastest);
  ``quality_floor`` (0..1): the fastest candidate reaching it. Quality is
  token agreement with target-only's greedy output on the calibration
  prompts (the fraction of generated positions where the tokens are equal;
  1 for lossless methods), or ``quality_fn(tokens, reference)``.

Cost: one compile per candidate and batch size plus short decodes. With
``price=True`` the CostModel (``costs.py``, fitted by
``tune_measure.fit_chains``: call costs timed by ``timing.step_timer``, the
fixed cost per decode call from target-only decodes of two lengths, alpha
and the chain's loop overheads from two anchor chains) predicts every chain's
tokens/s (``predicted_tps``) and only the ``prune`` best predicted gammas
are decoded.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

from specdec_jax.decoding.planners.auto import (AutoTable, Candidate,
                                                Measured, Row,
                                                check_objective)
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.strategy import Chain, Stack
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree
from specdec_jax.decoding.planners.tune_measure import (  # noqa: F401
    DecodeMeasurer, agreement, predict_chains)

TREES = ((2, 2), (2, 3))          # k-ary (k, depth): 6 and 14 nodes
STACKS = ((2, 4),)                # hierarchy buffers (T_0, T_1)
CASCADES = (("token_v3", (0.1, 0.3, 0.5)),)


def candidates(num_models: int, *, gammas: Sequence[int] = range(1, 9),
               trees: Sequence = TREES, stacks: Sequence = STACKS,
               cascades: Sequence = (), cascade_gamma: int = 4
               ) -> list[Candidate]:
  """The candidates of a stack of ``num_models`` models.

  Args:
    num_models: models given, cheapest first (>= 2).
    gammas: chain block sizes (drafter: model 0).
    trees: (k, depth) full k-ary trees, or Topology values.
    stacks: hierarchy buffers, used with >= 3 models (models 0, 1, top).
    cascades: ((method, alphas), ...) lossy candidates on Chain(
      cascade_gamma) (objective 'quality').
  """
  if num_models < 2:
    raise ValueError(f"tune needs a drafter and a verifier (>= 2 models, "
                     f"cheapest first), got {num_models}")
  top = num_models - 1
  out = [Candidate("target_only", Chain(1), (top,))]
  out += [Candidate("spec_decode", Chain(int(g)), (0, top)) for g in gammas]
  for t in trees:
    topo = t if isinstance(t, Topology) else Topology.kary(*t)
    out.append(Candidate("spec_decode", Tree(topo), (0, top)))
  if num_models >= 3:
    out += [Candidate("spec_decode", Stack(tuple(b)), (0, 1, top))
            for b in stacks]
  for name, alphas in cascades:
    out += [Candidate(name, Chain(cascade_gamma), (0, top),
                      (("alpha", float(a)),)) for a in alphas]
  return out


def choose(measured: Sequence[Measured], objective: str = "latency", *,
           latency_budget: float | None = None,
           quality_floor: float | None = None,
           margin: float = 1.02) -> Measured:
  """The candidate the objective prefers (pure; see the module docstring).

  Args:
    measured: every candidate's numbers, target-only among them (ratio 1).
    objective, latency_budget, quality_floor: as in :func:`tune`.
    margin: a speculative candidate must reach ``margin`` x target-only's
      tokens/s to be chosen over it; for 'latency', speculative candidates
      within ``margin`` of the fastest are a tie, won by the one verifying
      the fewest drafted tokens per call (:func:`draft_width`).
  """
  check_objective(objective, latency_budget, quality_floor)
  if not measured:
    raise ValueError("no candidates to choose from: give tune at least one "
                     "gamma, tree or stack")
  base = [m for m in measured if m.candidate.method == "target_only"]
  if not base:
    raise ValueError("the candidates must include target_only (the "
                     "baseline every choice is compared with)")
  base = base[0]
  quality = lambda m: 1.0 if m.candidate.lossless else (m.quality or 0.0)
  speed = lambda m: 1.0 if m is base else conservative_ratio(m, base)
  pool = [m for m in measured if m is base or speed(m) >= margin]
  if objective == "latency":
    pool = [m for m in pool if m.candidate.lossless]
    best = max(pool, key=speed)
    ties = [m for m in pool if m is not base
            and speed(m) * margin >= speed(best)]
    return min(ties, key=lambda m: (draft_width(m.candidate), -speed(m)),
               default=best)
  if latency_budget is not None:
    fits = [m for m in pool if 1.0 / max(speed(m), 1e-12) <= latency_budget]
    if not fits:
      return max(pool, key=speed)
    return max(fits, key=lambda m: (quality(m), speed(m)))
  fits = [m for m in pool if quality(m) >= quality_floor]
  return max(fits, key=speed)


def draft_width(candidate: Candidate) -> int:
  """Drafted tokens the verifier checks per call: a chain's gamma, a
  tree's nodes, a stack's last buffer (target-only: 0).

  The latency choice breaks ties within noise by it: measured on the
  calibration prompts, a longer block and a shorter one can run equally
  fast, but where the workload's acceptance is lower the longer block
  loses more (its extra drafts are wasted work more often). The default
  Gemma pair's tune chose chain:7 by 0.1% over chain:3 on 4 calibration
  prompts (teacher-forced acceptance 0.89); on the workload (0.63) chain:7
  ran at 0.78x target-only, chain:3 at 0.92x (bench_auto.md).
  """
  if candidate.method == "target_only":
    return 0
  s = candidate.structure
  if isinstance(s, Chain):
    return int(s.gamma)
  if isinstance(s, Tree):
    return int(s.topology.num_nodes)
  return int(s.buffers[-1])


def conservative_ratio(m: Measured, base: Measured) -> float:
  """The smaller of a candidate's two speed estimates against target-only:
  the median of per-repeat ratios (``m.ratio``) and the ratio of median
  tokens/s (``m.tps / base.tps``). Both agree on a quiet machine; when the
  load changes between repeats they part (a run measured 1.43x by one and
  0.42x by the other), and a choice is made only if both clear the margin.
  """
  return min(m.ratio, m.tps / max(base.tps, 1e-12))



def anchors(chains: Sequence[Candidate]) -> list[Candidate]:
  """The chains tune decodes first to fit the CostModel: those at a
  quarter and three quarters of the gamma range (gammas 1-8: 3 and 7), or
  the middle one when there are fewer than 4."""
  chains = sorted(chains, key=lambda c: c.structure.gamma)
  if len(chains) < 4:
    return [chains[len(chains) // 2]]
  return [chains[len(chains) // 4], chains[3 * len(chains) // 4]]


def _measure_batch(measurer, cands, b: int, pricing: bool,
                   prune: int | None) -> list[Measured]:
  """Every candidate measured at batch ``b`` (target-only first); with
  ``pricing`` the CostModel predicts each chain from two anchor chains
  (one when fewer than 4 gammas; ``anchors``) and only the ``prune`` best
  predicted chains are decoded besides them."""
  chains = [c for c in cands if c.method == "spec_decode"
            and isinstance(c.structure, Chain)]
  rest = [c for c in cands if c not in chains]
  predicted = {}
  if pricing and chains:
    anchor = anchors(chains)
    first = measurer.measure(anchor, b)
    base = first[0]
    pred = predict_chains(measurer, first[1:], b,
                          [c.structure.gamma for c in chains])
    predicted = {c: pred[c.structure.gamma] for c in chains}
    predicted[base.candidate] = base.tps  # measured, not priced
    keep = sorted(chains, key=lambda c: -predicted[c])[:prune or None]
    todo = [c for c in keep if c not in anchor] + [
        c for c in rest if c.method != "target_only"]
    measured = first + measurer.measure(todo, b)[1:]
  else:
    measured = measurer.measure([c for c in cands
                                 if c.method != "target_only"], b)
  return [Measured(m.candidate, m.tps, m.ratio,
                   predicted.get(m.candidate, m.predicted_tps), m.quality)
          for m in measured]

def _confirm(measurer, measured: list[Measured], batch: int, top: int,
             lossless: bool) -> list[Measured]:
  """Times the ``top`` fastest candidates (lossless ones for latency)
  again, back to back with target-only; their ratio becomes the geometric
  mean of both passes (a lucky first pass alone does not pick them)."""
  pool = [m for m in measured if m.candidate.method != "target_only"
          and (m.candidate.lossless or not lossless)]
  best = sorted(pool, key=lambda m: -m.ratio)[:top]
  if not best:
    return measured
  again = {m.candidate: m for m in measurer.measure(
      [m.candidate for m in best], batch)[1:]}
  out = []
  for m in measured:
    a = again.get(m.candidate)
    out.append(m if a is None else Measured(
        m.candidate, math.sqrt(m.tps * a.tps), math.sqrt(m.ratio * a.ratio),
        m.predicted_tps, m.quality))
  return out


def repeat_note(measurer, batch: int) -> str:
  """What the progress line of ``batch`` adds when the measurer's
  calibration rows are fewer than the batch: they repeat to fill it, so a
  batch waits for the slowest of fewer distinct rows than the batch of
  distinct requests it is tuned for (at greedy the repeats are the same
  row), and speculation measures optimistic there. '' otherwise."""
  rows = len(getattr(measurer, "rows", ()) or ())
  if not 0 < rows < batch:
    return ""
  return (f"; the {rows} calibration rows repeat to fill it: a batch waits "
          f"for the slowest of {rows} distinct rows, not {batch}, so "
          f"speculation measures faster than on {batch} distinct requests "
          f"(give >= {batch} prompts to measure that)")


def tune(models: Sequence, params: Sequence, prompts=None, *, inputs=None,
         batch_sizes: Sequence[int] = (1, 8), objective: str = "latency",
         latency_budget: float | None = None,
         quality_floor: float | None = None, temperature: float = 0.0,
         gammas: Sequence[int] = range(1, 9), trees: Sequence = TREES,
         stacks: Sequence = STACKS, cascades: Sequence = CASCADES,
         cascade_gamma: int = 4, new_tokens: int = 16, repeats: int = 3,
         prune: int | None = 3, price: bool = True, margin: float = 1.02,
         confirm: int = 2, quality_fn: Callable | None = None, measurer=None,
         seed: int = 0, progress: Callable | None = None) -> AutoTable:
  """Chooses a strategy per batch size for ``models`` on this machine.

  Args:
    models, params: cheapest first, the target last (a drafter and a
      verifier, or a 3-level family for hierarchies).
    prompts / inputs: calibration rows (ragged token lists; ``inputs`` for
      encoder-decoder models). Repeated to fill a batch (:func:`repeat_note`).
    batch_sizes: batch sizes to tune (rows of the table).
    objective: 'latency' or 'quality' (with latency_budget or
      quality_floor); see the module docstring.
    temperature: sampling of the decodes timed (0: greedy).
    gammas, trees, stacks: the lossless candidates; cascades: ((method,
      alphas), ...) lossy ones (objective 'quality' only), each on
      Chain(cascade_gamma).
    new_tokens, repeats: calibration decode length and timed repeats.
    prune: with ``price``, decode only this many chains (the best
      predicted); None: every gamma.
    price: time the models' calls and record the CostModel's
      ``predicted_tps`` of every chain.
    margin: see :func:`choose`.
    confirm: time this many of the fastest candidates a second time (their
      ratio: the geometric mean of both passes); 0: one pass.
    quality_fn: ``(tokens [N, T], reference [N, T]) -> float``; default
      :func:`agreement`.
    measurer: an object with ``measure(candidates, batch) -> [Measured]``
      (tests inject one); default: decode the calibration rows.
    progress: called with one line per step (None: quiet).

  Returns:
    AutoTable.
  """
  check_objective(objective, latency_budget, quality_floor)
  batches = sorted({int(b) for b in batch_sizes})
  if not batches or batches[0] < 1:
    raise ValueError(f"batch_sizes must be integers >= 1, got "
                     f"{list(batch_sizes)}")
  if len(models) != len(params):
    raise ValueError(f"{len(models)} models but {len(params)} parameter sets")
  cands = candidates(len(models), gammas=gammas, trees=trees, stacks=stacks,
                     cascades=cascades if objective == "quality" else (),
                     cascade_gamma=cascade_gamma)
  if len(cands) < 2:
    raise ValueError("the candidate list is empty: give tune at least one "
                     "gamma, tree or stack")
  say = progress or (lambda _: None)
  if measurer is None:
    rows = inputs if inputs is not None else prompts
    if rows is None or not len(rows):
      raise ValueError("tune needs calibration prompts (prompts=, or "
                       "inputs= for encoder-decoder models)")
    measurer = DecodeMeasurer(models, params, rows, inputs is not None,
                              new_tokens, sampling_lib.Temperature(
                                  temperature), repeats, quality_fn, seed)
  pricing = price and isinstance(measurer, DecodeMeasurer)
  out = []
  for b in batches:
    t0 = time.perf_counter()
    measured = _measure_batch(measurer, cands, b, pricing, prune)
    if confirm:
      measured = _confirm(measurer, measured, b, confirm,
                          objective == "latency")
    choice = choose(measured, objective, latency_budget=latency_budget,
                    quality_floor=quality_floor, margin=margin)
    base = next(m for m in measured if m.candidate.method == "target_only")
    out.append(Row(b, choice, base.tps, tuple(measured)))
    say(f"batch {b}: {choice.candidate.label} ({choice.ratio:.2f}x "
        f"target-only, {len(measured)} candidates, "
        f"{time.perf_counter() - t0:.1f} s){repeat_note(measurer, b)}")
  return AutoTable(tuple(out), objective, latency_budget, quality_floor,
                   float(temperature))


__all__ = ["CASCADES", "DecodeMeasurer", "STACKS", "TREES", "agreement",
           "candidates", "choose", "draft_width", "predict_chains",
           "repeat_note", "tune"]
