"""Cost model vs measurement for trees and hierarchies (issue 39, item 3).

The chain half of the check is ``scripts/cost_model_check.py``. Here, per
pair (the default T5 and Gemma families, the random 37.8M Gemma pair),
temperature and batch size, on CALIBRATION prompts:

* the chain fit as ``tune`` makes it (``tune_measure.fit_chains``, one
  anchor chain): the fixed seconds per decode call (target-only's and a
  speculative decode's) and target-only's loop overhead;
* every model's call timed at exactly the widths the structures below call
  (``structure_fit.needed_widths``, at the decodes' lengths);
* the planners' calibrated inputs: per-rank acceptance
  (``planners.calibrate``, as ``plan-tree`` / bench_tree) and pairwise alpha
  (``planners.pairwise_alpha``, as ``plan-hierarchy`` / bench_hierarchy);
* THREE anchor trees (tune's own candidates, the 2x2 and 2x3 k-ary trees,
  and the 4-deep chain-shaped 1x4: 6 / 14 / 4 nodes, depth 2 / 3 / 4) and
  TWO anchor stacks (buffers (1, 2) and (3, 6), the ends of the range) fit
  each structure's acceptance scale (trees: the first rank's acceptance is
  the anchor chain's alpha, the other ranks scaled), loop overhead per
  block (a constant plus a term per node and per level / per buffered
  token) and -- for the stack -- fixed seconds per call
  (``structure_fit.fit_tree`` / ``fit_stack``).

Then every tree (k-ary shapes and the Sequoia-optimal 16-node tree of the
calibrated acceptance) and every stack (several buffer pairs over small >
medium > target) is decoded back to back with target-only (median over
repeats, compile excluded) and priced: ``CostModel.tree_decode`` /
``stack_decode``. "planner" is what the tree / hierarchy planner alone
predicts (calibrated acceptance, model calls only: no loop overhead, no
fixed cost per call). tokens/call: new_tokens over the verifier calls of a
decode call (measured at batch B: the loop's, i.e. its slowest row's;
predicted: ``costs.iterations``, the last block cut at new_tokens);
acceptance scale: fitted / calibrated acceptance of the last calibrated
rank (trees) or of alpha(small, medium) (stacks).

With --num_prompts N, the N prompts after the calibration ones (the
workload: shorter and other text on the default families) are decoded
too, with NO speculative decode of them in the model: the calls at the
structures' widths and target-only at two lengths are re-timed there, the
fixed parts' excess over target-only's carried in proportion to its fixed
part, the tree and stack loops' fitted overheads carried as fitted
(``CostModel.at_workload``; "scaled as before": in proportion to the
models' calls, ``carry=()``) and the fitted acceptance scaled by the
teacher-forced acceptance there over the calibration's
(``costs_lib.moved_acceptance``), as ``tune_measure.at_workload`` does
for chains (cost_model.md). A cell
is within 10% when |predicted / measured - 1| <= 0.10; anchors are fitted
and not counted. Writes <out>.md and <out>.json.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import jax
import numpy as np

from specdec_jax import decoding
from specdec_jax import timing
from specdec_jax.decoding import planners
from specdec_jax.decoding.planners import costs as costs_lib
from specdec_jax.decoding.planners import structure_fit
from specdec_jax.decoding.planners import tree_shape
from specdec_jax.decoding.planners import tune_measure
from specdec_jax.decoding.planners.auto import Candidate, Measured
from specdec_jax.decoding.strategy import Chain, Stack
from specdec_jax.decoding.verify.topology import Topology
from specdec_jax.decoding.verify.tree import Tree
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_auto  # pylint: disable=g-import-not-at-top,wrong-import-position  # noqa: E402
from cost_model_check import (anchor_tag, cell_args, cell_cells,  # pylint: disable=g-import-not-at-top,wrong-import-position  # noqa: E402
                               drift_lines, error, noise_floor, within)


def parse_trees(spec: str, acceptance) -> dict[str, Topology]:
  """{'2x3': Topology.kary(2, 3), 'plan16': the Sequoia tree of 16 nodes
  (depth <= 6) of ``acceptance``}, from '2x2,2x3,plan16'; a planned tree
  equal to a listed one (at acceptance 1 it is a chain) is left out."""
  out = {}
  for item in spec.split(","):
    if item.startswith("plan"):
      topo = planners.plan_tree(acceptance, max_nodes=int(item[4:]),
                                max_depth=6).topology
      if topo not in out.values():
        out[item] = topo
    else:
      k, d = item.split("x")
      out[item] = Topology.kary(int(k), int(d))
  return out


def calibrated(levels, calib, enc, temp: float, children: int):
  """(per-rank acceptance of levels[0] -> target, pairwise alpha matrix)."""
  (dm, dp), (tm, tp) = levels[0], levels[-1]
  sampling = decoding.Temperature(temp)
  key = "inputs" if enc else "prompts"
  acc = planners.calibrate(decoding.make_method("spec_decode"), dm, tm, dp,
                           tp, **{key: calib}, sampling=sampling,
                           children=children, new_tokens=16)
  alpha = planners.pairwise_alpha(levels, **{key: calib}, sampling=sampling,
                                  new_tokens=16)
  return tuple(acc), alpha


def planner_only(kind, cand, calls, acc, alpha, batch) -> float:
  """Tokens/s the planner alone predicts: calibrated acceptance, model calls
  only (no loop overhead, no fixed cost per decode call)."""
  if kind == "tree":
    topo = cand.structure.topology
    block = tree_shape.block_seconds(topo, calls.tree_costs(), "catchup")
    return batch * (1 + tree_shape.expected_accepted(topo, acc)) / block
  return batch / calls.stack(cand.structure.buffers, alpha).per_token


def cell(levels, calib, enc, temp: float, b: int, args, trees, stacks,
         acc, alpha, held=None) -> list[dict]:
  """Rows of one (pair, T, batch): every tree and stack, fitted and
  measured on the calibration prompts, and -- ``held``: (rows, per-rank
  acceptance, alpha) of held-out prompts -- measured and priced there."""
  ms, ps = [m for m, _ in levels], [p for _, p in levels]
  top, new = len(ms) - 1, args.new_tokens
  sampling = decoding.Temperature(temp)
  cal = tune_measure.DecodeMeasurer(ms, ps, calib, enc, new, sampling,
                                    args.repeats, seed=0,
                                    min_seconds=args.min_seconds)
  t0 = time.perf_counter()
  chain = Candidate("spec_decode", Chain(args.chain_anchor), (0, top))
  cm, alphas = tune_measure.fit_chains(cal, Measured(chain, 1.0, 1.0), b,
                                       [args.chain_anchor])
  cands = {f"tree:{k}": Candidate("spec_decode", Tree(t), (0, top))
           for k, t in trees.items()}
  if top >= 2:
    cands.update({f"stack:{s[0]},{s[1]}": Candidate(
        "spec_decode", Stack(s), (0, 1, top)) for s in stacks})
  level_fed = bool(getattr(ms[0], "masks_cached_slots", False))
  need = structure_fit.needed_widths([c.structure for c in cands.values()],
                                     len(ms), level_fed)
  calls = structure_fit.call_costs(cal, range(len(ms)), b, need)
  calls = costs_lib.CostModel(calls.widths, calls.seconds, b, (),
                              cm.call_s, cm.spec_call_s)
  tree_anchors = [cands[f"tree:{t}"] for t in args.tree_anchors]
  tree_model, acc_pts = structure_fit.fit_tree(
      cal, tree_anchors, b, calls.select((0, top)), acc, level_fed=level_fed,
      rank0=alphas[0][1] if args.rank0 == "chain" else None)
  stack_anchors = [cands[f"stack:{a},{c}"] for a, c in args.stack_anchors
                   if f"stack:{a},{c}" in cands]
  stack_model = alpha_pts = None
  if stack_anchors:
    stack_model, alpha_pts = structure_fit.fit_stack(cal, stack_anchors, b,
                                                     calls, alpha)
  fit = dict(tree=tree_model, stack=stack_model, calls=calls,
             tree_acc=lambda n: structure_fit.at_size(acc_pts, n),
             stack_alpha=lambda n: structure_fit.at_size(alpha_pts, n),
             acc=acc, alpha=alpha, base=b * new / cm.target_only_decode(new),
             anchors=set(tree_anchors) | set(stack_anchors),
             level_fed=level_fed, fit_s=time.perf_counter() - t0)
  rows = priced_rows("calibration", cal, cands, fit, b, temp, args)
  if held is not None:
    rows += priced_rows("held-out", *moved(levels, held, enc, sampling, b,
                                           args, cands, fit, need), b, temp,
                        args)
  decoding.clear_compiled()
  return rows


def moved(levels, held, enc, sampling, b: int, args, cands, fit, need):
  """(measurer, candidates, fit) of the held-out prompts: no speculative
  decode of them is timed for the model -- the calls at the structures'
  widths and target-only at two lengths re-timed there, the fitted
  overheads and fixed parts moved by ``CostModel.at_workload`` (and, as
  fit["scaled"], with every overhead scaled: ``carry=()``) and each fitted
  acceptance scaled by the teacher-forced ratio
  (``costs_lib.moved_acceptance``)."""
  rows, acc_h, alpha_h = held
  ms, ps = [m for m, _ in levels], [p for _, p in levels]
  top = len(ms) - 1
  ho = tune_measure.DecodeMeasurer(ms, ps, rows, enc, args.new_tokens,
                                   sampling, args.repeats, seed=100,
                                   min_seconds=args.min_seconds)
  med = timing.medians(ho.split_timers(b), ho.repeats)
  fixed, step = tune_measure.target_only_split(ho, med, b)
  calls = structure_fit.call_costs(ho, range(len(ms)), b, need)
  ar = max(step - calls.call(-1, 1), 0.0)
  def move(carry):
    tree = fit["tree"].at_workload(calls.select((0, top)), fixed, ar, carry)
    return tree, None if fit["stack"] is None else fit["stack"].at_workload(
        calls, fixed, ar, carry)

  tree, stack = move(costs_lib.STRUCTURE_OVERHEADS)
  acc, alpha = fit["acc"], fit["alpha"]
  return ho, cands, dict(
      fit, tree=tree, stack=stack, calls=calls, acc=acc_h, alpha=alpha_h,
      scaled=dict(zip(("tree", "stack"), move(()))),
      anchors=set(), base=b * ho.new / tree.target_only_decode(ho.new),
      tree_acc=lambda n: costs_lib.moved_acceptance(
          fit["tree_acc"](n), acc, acc_h),
      stack_alpha=lambda n: costs_lib.moved_acceptance(
          fit["stack_alpha"](n), alpha, alpha_h))


def priced_rows(where: str, measurer, cands, fit, b: int, temp: float,
                args) -> list[dict]:
  """Every candidate decoded back to back with target-only on
  ``measurer``'s rows and priced by ``fit`` (its models, acceptance and
  the planner's inputs)."""
  new, top = args.new_tokens, len(measurer.models) - 1
  out = measurer.measure(list(cands.values()), b)
  measured = {m.candidate: m for m in out}
  drift = out[0].tps / fit["base"] - 1  # target-only: measuring vs fit pass
  rows = []
  for name, c in cands.items():
    m, kind = measured[c], name.split(":")[0]
    if kind == "tree":
      topo = c.structure.topology
      fit_acc = fit["tree_acc"](topo.num_nodes)
      seconds = lambda model: model.tree_decode(
          topo, fit_acc, new, level_fed=fit["level_fed"])
      dist = tree_shape.tokens_dist(topo, fit_acc)
      scale = fit_acc[-1] / max(fit["acc"][-1], 1e-9)  # a rank it fits
    else:
      fit_acc = fit["stack_alpha"](sum(c.structure.buffers))
      seconds = lambda model: model.stack_decode(c.structure.buffers,
                                                 fit_acc, new)
      dist = fit["stack"].stack(c.structure.buffers, fit_acc).target_yield
      scale = float(fit_acc[0, 1] / max(fit["alpha"][0, 1], 1e-9))
    iters = max(measurer.stats[(c, b)]["iterations"], 1)
    pred = b * new / seconds(fit[kind])
    scaled = fit.get("scaled", {}).get(kind)  # held-out: the old transfer
    rows.append(dict(
        pair=args.pair_name, batch=b, temperature=temp, kind=kind,
        prompts=where, structure=name.split(":")[1],
        fitted=c in fit["anchors"],
        shape=(list(c.structure.topology.parents) if kind == "tree" else
               list(c.structure.buffers)),
        measured_tps=m.tps, predicted_tps=pred, ratio=m.ratio,
        scaled_tps=None if scaled is None else b * new / seconds(scaled),
        predicted_ratio=pred / fit["base"], drift=drift,
        planner_tps=planner_only(
            kind, c, fit["calls"].select((0, top)) if kind == "tree" else
            fit["calls"], fit["acc"], fit["alpha"], b),
        measured_tokens_per_call=new * measurer.chunks(b) / iters,
        predicted_tokens_per_call=new / costs_lib.iterations(dist, new),
        acceptance_scale=scale,
        fitted_acceptance=np.asarray(fit_acc).tolist(),
        costs=_costs(fit[kind]),
        fit_s=fit["fit_s"]))
  return rows


def _costs(model: costs_lib.CostModel) -> dict:
  """The fitted CostModel's numbers, for the JSON."""
  return dict(widths=list(model.widths),
              seconds=[list(r) for r in model.seconds],
              iteration_s=dict(model.iteration_s),
              structure_call_s=dict(model.structure_call_s),
              call_s=model.call_s, spec_call_s=model.spec_call_s)


def report(args, rows) -> None:
  """Writes <out>.md / <out>.json of the rows so far."""
  lines = ["# Cost model: predicted vs measured tokens/s, trees and "
           "hierarchies", "", (__doc__ or "").split("\n\n", 1)[1].strip(), ""]
  fits = [r["fit_s"] for r in rows]
  lines.append(f"Fit per cell (one anchor chain, call timings, the anchor "
               f"trees and stacks; compiles included): median "
               f"{statistics.median(fits):.0f} s, max {max(fits):.0f} s.\n")
  for kind in ("tree", "stack"):
    for where in ("calibration", "held-out"):
      sel = [r for r in rows if r["kind"] == kind
             and r.get("prompts", "calibration") == where]
      if not sel:
        continue
      a, n = within(sel, "predicted_tps")
      pl, _ = within(sel, "planner_tps")
      x, _ = within(sel, "predicted_ratio", "ratio")
      old = ""
      if all(r.get("scaled_tps") is not None for r in sel):
        old = (f"; overheads scaled to the workload as before "
               f"(``carry=()``): {within(sel, 'scaled_tps')[0]}/{n}")
      lines.append(f"- {kind}s, {where} prompts: tokens/s within 10% "
                   f"**{a}/{n}** (planner alone: {pl}/{n}{old}); speedup "
                   f"over target-only within 10% **{x}/{n}**")
      for pair in dict.fromkeys(r["pair"] for r in sel):
        p = [r for r in sel if r["pair"] == pair]
        a, n = within(p, "predicted_tps")
        pl, _ = within(p, "planner_tps")
        lines.append(f"  - {pair}: {a}/{n} (planner alone: {pl}/{n})")
  lines += [line for line in [noise_floor(rows)] if line]
  lines += drift_lines(rows)
  lines += ["", "| pair | batch | T | prompts | structure | measured tok/s | "
            "predicted "
            "| error | planner alone | error | tokens/call measured | "
            "predicted | acceptance scale | measured x target-only | "
            "predicted x |", "|---|---|---|---|---|---|---|---|---|---|---|"
            "---|---|---|---|"]
  for r in rows:
    lines.append(
        f"{cell_cells(r)}{r.get('prompts', 'calibration')} | "
        f"{r['kind']} {r['structure']}{anchor_tag(r)} | "
        f"{r['measured_tps']:.1f} | "
        f"{r['predicted_tps']:.1f} | {error(r, 'predicted_tps')} | "
        f"{r['planner_tps']:.1f} | {error(r, 'planner_tps')} | "
        f"{r['measured_tokens_per_call']:.2f} | "
        f"{r['predicted_tokens_per_call']:.2f} | "
        f"{r['acceptance_scale']:.2f} | {r['ratio']:.2f} | "
        f"{r['predicted_ratio']:.2f} |")
  results_file.write_report(args.out, command=args.command,
                            markdown="\n".join(lines), rows=rows,
                            meta=dict(backend=jax.default_backend()))


def main():
  ap = cell_args(__doc__, "benchmarks/results/cost_model_structures")
  ap.add_argument("--trees", default="2x2,2x3,1x4,3x2,4x1,1x6,plan16")
  ap.add_argument("--tree_anchors", default="2x2,2x3,1x4")
  ap.add_argument("--stacks", default="2-4,1-2,1-4,2-2,3-6")
  ap.add_argument("--stack_anchors", default="1-2,3-6")
  ap.add_argument("--rank0", default="chain", choices=("chain", "scaled"),
                  help="trees' first-rank acceptance: the anchor chain's "
                       "alpha, or the calibrated one scaled with the rest")
  ap.add_argument("--chain_anchor", type=int, default=3)
  ap.add_argument("--calib_prompts", type=int, default=4)
  ap.add_argument("--num_prompts", type=int, default=0,
                  help="held-out prompts after the calibration ones (0: "
                       "none), priced with the fit moved to them")
  ap.add_argument("--new_tokens", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--min_seconds", type=float, default=0.5)
  args = ap.parse_args()
  stacks = [tuple(int(x) for x in s.split("-")) for s in
            args.stacks.split(",")]
  command = "python scripts/cost_model_structures.py " + " ".join(
      f"--{k}={v}" for k, v in vars(args).items())
  args.tree_anchors = args.tree_anchors.split(",")
  args.stack_anchors = [tuple(int(x) for x in s.split("-"))
                        for s in args.stack_anchors.split(",")]
  if not (set(args.tree_anchors) <= set(args.trees.split(","))
          and set(args.stack_anchors) <= set(stacks)):
    ap.error("--tree_anchors / --stack_anchors must be among --trees / "
             "--stacks")
  args.command = command
  rows = []
  for name in args.pairs.split(","):
    levels, prompts, enc = bench_auto.load_levels(
        name, args.calib_prompts + args.num_prompts)
    prompts, held = (prompts[:args.calib_prompts],
                     prompts[args.calib_prompts:])
    args.pair_name = name
    for temp in map(float, args.temperatures.split(",")):
      children = max(int(t.split("x")[0]) for t in args.trees.split(",")
                     if "x" in t) + 4
      acc, alpha = calibrated(levels, prompts, enc, temp, children)
      trees = parse_trees(args.trees, acc)
      moved_to = None
      if held:
        acc_h, alpha_h = calibrated(levels, held, enc, temp, children)
        moved_to = (held, acc_h, np.asarray(alpha_h))
      for b in map(int, args.batches.split(",")):
        t0 = time.perf_counter()
        rows += cell(levels, prompts, enc, temp, b, args, trees, stacks,
                     acc, np.asarray(alpha), moved_to)
        print(f"{name} T={temp:g} b={b}: {time.perf_counter() - t0:.0f} s; "
              f"within 10% so far {within(rows, 'predicted_tps')}",
              flush=True)
        report(args, rows)


if __name__ == "__main__":
  main()
