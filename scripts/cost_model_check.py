r"""The CostModel's predicted tokens/s against measured, every chain gamma.

    python scripts/cost_model_check.py --out benchmarks/results/cost_model

For each pair (the default T5 and Gemma families' drafter -> verifier, and
the random 37.8M Gemma pair of bench_decode), temperature and batch size,
the model is fitted exactly as ``planners.tune`` fits it
(``tune_measure.fit_chains``, one interleaved timing: every model call at
every block width at the decodes' lengths, target-only decodes of two
lengths (new_tokens and 1) for the fixed seconds per call, and TWO anchor
chains (gammas 3 and 7; gamma 3 also decoding one token for the
speculative decode's own fixed seconds per call) for alpha and the loop
overhead per iteration and per draft; model calls priced at their
MARGINAL cost in a loop, ``timing.step_timer``) on CALIBRATION prompts;
iterations per call are the exact expectation with the last one cut at
new_tokens (``costs.chain_iterations``). Then EVERY chain gamma is decoded
and timed back to back with target-only (median over repeats, each timing
at least --min_seconds, compile excluded) twice:

* **calibration**: on the same prompts. The error is the model's own:
  call costs timed alone, alpha interpolated between the anchors, loop
  overheads linear in gamma.
* **held-out**: on other prompts (the workload; here the 8 prompts after
  the calibration's 4, padded to 45 tokens against the calibration's 205
  on the default families, other text). No speculative decode of the
  workload: ``tune_measure.at_workload`` re-times there, at its lengths,
  the models' calls and target-only at two lengths (a call's cost depends
  on the prompt / input length: encode, prefill, attention over the
  cache), carries the loop overheads and the speculative decode's excess
  fixed seconds per call in proportion to those re-timed costs
  (``CostModel.at_workload``) and scales each anchor's alpha by the pair's
  teacher-forced acceptance on the workload over that on the calibration
  prompts. "carried" prices the same re-timing the way this check did
  before (overheads, excess and alpha carried unchanged); "costs moved,
  alpha kept" moves the costs but keeps the anchors' alpha.

"before" prices each cell with the previous model, fitted as it was (one
anchor, gamma 5, from the same calibration pass; the fixed cost per call
folded into the anchor's per-iteration overhead; one alpha; iterations
new_tokens / E[tokens per iteration], ignoring that the last iteration is
cut at new_tokens). A cell is
"within 10%" when |predicted / measured - 1| <= 0.10 (tokens/s; and the
speedup over target-only, predicted vs the back-to-back measured ratio);
the anchors are fitted and not counted. Writes <out>.md and <out>.json.
Trees and hierarchies: ``scripts/cost_model_structures.py``
(cost_model_structures.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

import jax

from specdec_jax import decoding
from specdec_jax.decoding.planners import costs as costs_lib
from specdec_jax.decoding.planners import tune_measure
from specdec_jax.decoding.planners.auto import Candidate
from specdec_jax.decoding.strategy import Chain
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_auto  # pylint: disable=g-import-not-at-top,wrong-import-position  # noqa: E402


def _before(calls: costs_lib.CostModel, alpha0: float, g0: int,
            call0_s: float, g: int, new: int) -> float:
  """The previous model's seconds per call of gamma ``g``: one anchor
  ``g0`` (its alpha ``alpha0``, its seconds per call ``call0_s``); what
  the anchor's time per ITERATION leaves after its model calls is charged
  per iteration at every g -- so the fixed cost per call is spread over
  the anchor's iterations, not paid once."""
  iters0 = new / costs_lib.chain_tokens(alpha0, g0)
  rest = call0_s / iters0 - g0 * calls.call(0, 1) - calls.call(-1, g0 + 1)
  per_iter = g * calls.call(0, 1) + calls.call(-1, g + 1) + max(rest, 0.0)
  return new / costs_lib.chain_tokens(alpha0, g) * per_iter


def _old_alpha(eff: float, gamma: int) -> float:
  """The previous model's alpha: chain_tokens(alpha, gamma) = eff."""
  lo, hi = 0.0, 1.0
  if eff >= gamma + 1:
    return 1.0
  for _ in range(50):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if costs_lib.chain_tokens(mid, gamma) < eff else (
        lo, mid)
  return 0.5 * (lo + hi)


def cell(ms, ps, calib, held, enc, temp: float, b: int, args) -> list[dict]:
  """Rows (one per gamma and prompt set) of one (pair, T, batch) cell."""
  new, gammas, anchors = args.new_tokens, args.gammas, args.anchors
  top = len(ms) - 1
  chains = {g: Candidate("spec_decode", Chain(g), (0, top)) for g in gammas}
  sampling = decoding.Temperature(temp)
  cal = tune_measure.DecodeMeasurer(ms, ps, calib, enc, new, sampling,
                                    args.repeats, seed=0,
                                    min_seconds=args.min_seconds)
  t0 = time.perf_counter()
  first = cal.measure([chains[g] for g in anchors], b)
  model, alphas = tune_measure.fit_chains(cal, first[1:], b, gammas)
  fit_s = time.perf_counter() - t0  # compiles included
  measured = {"calibration": {m.candidate: m for m in first}}
  measured["calibration"].update({m.candidate: m for m in cal.measure(
      [chains[g] for g in gammas if g not in anchors], b)})
  # The previous model, fitted as it was: one anchor (gamma --old_anchor)
  # from the same calibration pass.
  old = measured["calibration"][chains[args.old_anchor]]
  old_eff = new * cal.chunks(b) / max(
      cal.stats[(old.candidate, b)]["iterations"], 1)  # tokens / iteration
  old_alpha = _old_alpha(old_eff, args.old_anchor)
  old_call_s = b * new / old.tps
  ho = tune_measure.DecodeMeasurer(ms, ps, held, enc, new, sampling,
                                   args.repeats, seed=100,
                                   min_seconds=args.min_seconds)
  # The workload: its calls and target-only re-timed at its lengths, the
  # speculative fits carried in proportion, alpha scaled by the pair's
  # teacher-forced acceptance there (tune_measure.at_workload); "carried":
  # the previous transfer (overheads, the speculative excess and alpha
  # carried unchanged), priced from the same re-timing.
  moved, moved_alphas = tune_measure.at_workload(model, alphas, cal, ho, b,
                                                 (0, top))
  carried = dataclasses.replace(
      moved, iteration_s=(("autoregressive", moved.overhead(
          "autoregressive")),) + tuple(
              (k, model.overhead(k)) for k in ("chain", "draft")),
      spec_call_s=moved.call_s + model.spec_call_s - model.call_s)
  models = {"calibration": (model, alphas),
            "held-out": (moved, moved_alphas)}
  measured["held-out"] = {m.candidate: m for m in ho.measure(
      list(chains.values()), b)}
  teacher = dict(calibration=cal.teacher_alpha((0, top)),
                 held_out=ho.teacher_alpha((0, top)))
  rows = []
  for where, got in measured.items():
    cm, al = models[where]
    base = b * new / cm.target_only_decode(new)
    for g in gammas:
      m = got[chains[g]]
      pred = b * new / cm.chain_decode(tune_measure.alpha_at(al, g), g, new)
      rows.append(dict(
          pair=args.pair_name, batch=b, temperature=temp, prompts=where,
          gamma=g, fitted=where == "calibration" and g in anchors,
          measured_tps=m.tps, ratio=m.ratio, predicted_tps=pred,
          carried_tps=b * new / (cm if where == "calibration" else carried
                                 ).chain_decode(tune_measure.alpha_at(
                                     alphas, g), g, new),
          costs_only_tps=b * new / cm.chain_decode(tune_measure.alpha_at(
              alphas, g), g, new),
          before_tps=b * new / _before(model, old_alpha, args.old_anchor,
                                        old_call_s, g, new),
          predicted_ratio=pred / base, alphas=[list(a) for a in al],
          teacher_alpha=teacher, call_s=cm.call_s,
          ar_s=cm.overhead("autoregressive"),
          spec_call_s=cm.spec_call_s, chain_s=cm.overhead("chain"),
          draft_s=cm.overhead("draft"),
          calls_s=[list(r) for r in cm.seconds], fit_s=fit_s))
  decoding.clear_compiled()
  return rows


def within(rows, key: str, truth: str = "measured_tps",
           tol: float = 0.10) -> tuple[int, int]:
  """(cells within tol, cells counted) of ``key`` vs ``truth``."""
  counted = [r for r in rows if not r["fitted"]]
  return sum(abs(r[key] / r[truth] - 1) <= tol
             for r in counted), len(counted)


def error(r: dict, key: str, truth: str = "measured_tps") -> str:
  """A report cell: r[key] relative to r[truth], as '+4%'."""
  return f"{r[key] / r[truth] - 1:+.0%}"


def cell_cells(r: dict) -> str:
  """The leading report cells of a row: '| pair | batch | T | '."""
  return f"| {r['pair']} | {r['batch']} | {r['temperature']:g} | "


def anchor_tag(r: dict) -> str:
  """' (anchor)' for a fitted row (not counted), else ''."""
  return " (anchor)" if r["fitted"] else ""


def noise_floor(rows) -> str:
  """One line: how far the ANCHORS' predictions (their own fitted points,
  timed in the fit's pass) land from the same decodes timed in the
  measuring pass -- the pass-to-pass noise no model can beat -- against
  the other calibration cells' error."""
  cal = [r for r in rows if r["prompts"] == "calibration"]
  err = lambda r: abs(r["predicted_tps"] / r["measured_tps"] - 1)
  anc = [err(r) for r in cal if r["fitted"]]
  rest = [err(r) for r in cal if not r["fitted"]]
  if not anc or not rest:
    return ""
  return (f"- noise floor: the anchors (fitted, so exact in the fit's own "
          f"pass) re-measured in the measuring pass are off by more than "
          f"10% in {sum(e > 0.10 for e in anc)}/{len(anc)}, median "
          f"{statistics.median(anc):.1%}; the other calibration cells' "
          f"median error is {statistics.median(rest):.1%}")


def drift_lines(rows, quiet: float = 0.05) -> list[str]:
  """The machine's drift per cell (target-only tokens/s in the measuring
  pass over the fit's own, - 1) and the within-10% counts of the cells
  that drifted at most ``quiet``."""
  cells = {}
  for r in rows:
    if r.get("drift") is not None:
      cells.setdefault(f"{r['pair']} b{r['batch']} T={r['temperature']:g} "
                       f"{r['prompts']}", r["drift"])
  if not cells:
    return []
  calm = [r for r in rows if r.get("drift") is not None
          and abs(r["drift"]) <= quiet]
  out = ["- machine drift per cell (target-only tokens/s, measuring pass "
         "/ fit pass - 1): " + ", ".join(
             f"{k} {v:+.0%}" for k, v in cells.items())]
  for kind in ("tree", "stack"):
    sel = [r for r in calm if r["kind"] == kind]
    if sel:
      a, n = within(sel, "predicted_tps")
      out.append(f"  - {kind}s in the cells that drifted <= {quiet:.0%}: "
                 f"within 10% {a}/{n}")
  return out


def report(args, rows) -> None:
  """Writes <out>.md / <out>.json of the rows so far."""
  lines = ["# Cost model: predicted vs measured tokens/s, every chain gamma",
           "", (__doc__ or "").split("\n\n", 2)[2].strip(), ""]
  fits = {(r["pair"], r["batch"], r["temperature"]): r["fit_s"]
          for r in rows}
  lines.append(f"Calibration (two anchor chains + target-only at two "
               f"lengths + call timings, compiles included): median "
               f"{sorted(fits.values())[len(fits) // 2]:.0f} s per cell, "
               f"max {max(fits.values()):.0f} s.\n")
  for where in ("calibration", "held-out"):
    sel = [r for r in rows if r["prompts"] == where]
    a, n = within(sel, "predicted_tps")
    bb, _ = within(sel, "before_tps")
    x, _ = within(sel, "predicted_ratio", "ratio")
    cc, _ = within(sel, "carried_tps")
    co, _ = within(sel, "costs_only_tps")
    lines.append(f"- {where}: tokens/s within 10% **{a}/{n}** (before: "
                 f"{bb}/{n}"
                 + (f"; carried: {cc}/{n}; costs moved, alpha kept: {co}/{n}"
                    if where == "held-out" else "")
                 + f"); speedup over target-only within 10% **{x}/{n}**")
    for pair in dict.fromkeys(r["pair"] for r in sel):
      p = [r for r in sel if r["pair"] == pair]
      a, n = within(p, "predicted_tps")
      bb, _ = within(p, "before_tps")
      x, _ = within(p, "predicted_ratio", "ratio")
      cc, _ = within(p, "carried_tps")
      co, _ = within(p, "costs_only_tps")
      lines.append(f"  - {pair}: {a}/{n} (before: {bb}/{n}"
                   + (f"; carried: {cc}/{n}; alpha kept: {co}/{n}"
                      if where == "held-out" else "")
                   + f"); speedup {x}/{n}")
  lines.append(noise_floor(rows))
  lines += ["", "Alpha per cell: the anchors' (gamma 3 / 7, calibration), "
            "teacher-forced on calibration / held-out prompts, and the "
            "held-out alphas the model prices with.", "",
            "| pair | batch | T | anchors | teacher calibration | teacher "
            "held-out | held-out alphas |", "|---|---|---|---|---|---|---|"]
  firsts = {}
  for r in rows:
    firsts.setdefault((r["pair"], r["batch"], r["temperature"]), {})[
        r["prompts"]] = r
  for (pair, b, t), by in firsts.items():
    if "held-out" not in by:
      continue
    fmt = lambda al: " / ".join(f"{a:.3f}" for _, a in al)
    tf = by["held-out"]["teacher_alpha"]
    lines.append(f"| {pair} | {b} | {t:g} | {fmt(by['calibration']['alphas'])}"
                 f" | {tf['calibration']:.3f} | {tf['held_out']:.3f} | "
                 f"{fmt(by['held-out']['alphas'])} |")
  lines += ["", "| pair | batch | T | prompts | gamma | measured tok/s | "
            "predicted | error | before | error | measured x target-only | "
            "predicted x | error |", "|---|---|---|---|---|---|---|---|---|"
            "---|---|---|---|"]
  for r in rows:
    err = lambda k, t="measured_tps", r=r: error(r, k, t)
    lines.append(
        f"{cell_cells(r)}{r['prompts']} | {r['gamma']}{anchor_tag(r)} | "
        f"{r['measured_tps']:.1f} | "
        f"{r['predicted_tps']:.1f} | {err('predicted_tps')} | "
        f"{r['before_tps']:.1f} | {err('before_tps')} | {r['ratio']:.2f} | "
        f"{r['predicted_ratio']:.2f} | {err('predicted_ratio', 'ratio')} |")
  flag = lambda v: ",".join(map(str, v)) if isinstance(v, list) else v
  command = "python scripts/cost_model_check.py " + " ".join(
      f"--{k}={flag(v)}" for k, v in vars(args).items() if k != "pair_name")
  results_file.write_report(args.out, command=command,
                            markdown="\n".join(lines), rows=rows,
                            meta=dict(backend=jax.default_backend()))


def cell_args(doc: str, out: str) -> argparse.ArgumentParser:
  """The flags every cost-model check shares: --pairs, --out, --batches,
  --temperatures (its cells)."""
  ap = argparse.ArgumentParser(description=doc.splitlines()[0])
  ap.add_argument("--pairs", default="random-gemma,default-t5,default-gemma")
  ap.add_argument("--out", default=out)
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--temperatures", default="0,1")
  return ap


def main():
  ap = cell_args(__doc__, "benchmarks/results/cost_model")
  ap.add_argument("--gammas", default="1,2,3,4,5,6,7,8")
  ap.add_argument("--anchors", default="3,7",
                  help="the chains the model is fitted to (tune's choice "
                       "for gammas 1-8)")
  ap.add_argument("--old_anchor", type=int, default=5,
                  help="the previous model's one anchor")
  ap.add_argument("--calib_prompts", type=int, default=4)
  ap.add_argument("--num_prompts", type=int, default=8)
  ap.add_argument("--new_tokens", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--min_seconds", type=float, default=0.5,
                  help="each timed decode lasts at least this (tune: 0.2)")
  args = ap.parse_args()
  args.gammas = [int(g) for g in str(args.gammas).split(",")]
  args.anchors = [int(g) for g in str(args.anchors).split(",")]
  if not set(args.anchors + [args.old_anchor]) <= set(args.gammas):
    ap.error(f"--anchors {args.anchors} and --old_anchor {args.old_anchor} "
             f"must be among --gammas {args.gammas}")
  rows = []
  for name in args.pairs.split(","):
    levels, prompts, enc = bench_auto.load_levels(
        name, args.calib_prompts + args.num_prompts)
    levels = [levels[0], levels[-1]]
    ms, ps = [m for m, _ in levels], [p for _, p in levels]
    calib, held = prompts[:args.calib_prompts], prompts[args.calib_prompts:]
    args.pair_name = name
    for temp in map(float, args.temperatures.split(",")):
      for b in map(int, args.batches.split(",")):
        t0 = time.perf_counter()
        rows += cell(ms, ps, calib, held, enc, temp, b, args)
        print(f"{name} T={temp:g} b={b}: {time.perf_counter() - t0:.0f} s; "
              f"within 10% so far {within(rows, 'predicted_tps')}",
              flush=True)
        report(args, rows)


if __name__ == "__main__":
  main()
