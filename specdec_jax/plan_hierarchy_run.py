"""``specdec_jax plan-hierarchy``: choose a hierarchy for this machine.

Loads the verifier and the candidate levels (ModelSpecs, early exits of the
verifier ``'exit:K'``), measures the planner's inputs
(``decoding.planners.hierarchy_calibration``): pairwise alpha from one
teacher-forced pass on a few requests and the per-call cost of every model
at the block widths a hierarchy calls it with, at the serving batch size.
Candidates are ordered by measured cost (those not cheaper than the
verifier are dropped), the planner (``decoding.hierarchy.planner.plan``:
brute force for <= 5 drafters, else the DP, both re-scored with the exact
renewal evaluator) ranks the hierarchies, the tables are printed and the
best hierarchy is written as a gin file that decode includes
(``hierarchy_spec`` in main.py; docs/hierarchy.md).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from specdec_jax import hierarchy_spec as spec_lib
from specdec_jax.decoding.hierarchy import planner as planner_lib
from specdec_jax.decoding.planners import hierarchy_calibration as calib
from specdec_jax import plan_tree_run as plan_tree

TARGET = "verifier"


def parse_candidates(candidates) -> list[tuple[str, object]]:
  """[(name, level)] from {name: level} or [level]; ValueError when empty,
  unknown or duplicated."""
  if candidates is None or (hasattr(candidates, "__len__") and
                            not len(candidates)):
    raise ValueError("plan-hierarchy has no candidates: set CANDIDATES to "
                     "models and early exits to choose from, e.g. "
                     "CANDIDATES = [%DRAFTER, 'exit:1', 'exit:2']")
  if isinstance(candidates, (str, bytes)):
    candidates = [candidates]
  if isinstance(candidates, dict):
    items = [(str(k), v) for k, v in candidates.items()]
  else:
    items = [(None, v) for v in candidates]
  out, seen = [], set()
  for i, (name, x) in enumerate(items):
    level = spec_lib.parse_level(
        x, f"candidate {name!r}" if name else f"candidate {i}")
    name = name or spec_lib.level_name(level)
    if name in seen or name == TARGET:
      raise ValueError(f"candidate name {name!r} is used twice (the "
                       f"verifier is {TARGET!r}); name candidates with a "
                       f"dict: CANDIDATES = {{'small': %DRAFTER, ...}}")
    seen.add(name)
    out.append((name, level))
  return out


def _prompts(verifier, v_model, tok, input_file, num_prompts: int,
             seed: int):
  """(prompts, inputs) of the calibration requests (before any weights
  load: ``v_model`` is the verifier's architecture, ``tok`` its
  tokenizer)."""
  enc = v_model.is_encoder_decoder
  if input_file:
    rows, _ = plan_tree.request_rows(input_file, None, verifier, num_prompts)
  elif verifier.default_pair:
    from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
    name = default_models.BENCHMARK_NAMES.get(verifier.default_pair,
                                              verifier.default_pair)
    task = default_models.TASKS[name]
    rows = [default_models.encode_inputs(tok, task, e["inputs"]) for e in
            default_models.examples(name, "test", num_prompts)]
  else:
    rng = np.random.default_rng(seed)
    rows = [[int(x) for x in rng.integers(2, v_model.vocab_size, size=8)]
            for _ in range(num_prompts)]
  return (None, rows) if enc else (rows, None)


def _load(verifier, named):
  """Loads the verifier and the candidates: [(model, params)], the
  candidates then the verifier."""
  v_model, p_params, _ = verifier.load()
  loaded = {}
  out = []
  for name, lv in named:
    if isinstance(lv, spec_lib.EarlyExit):
      out.append((spec_lib.architecture(lv, v_model, f"candidate {name!r}"),
                  p_params))
      continue
    if lv not in loaded:
      loaded[lv] = lv.load(v_model)[:2]
    out.append(loaded[lv])
  return out + [(v_model, p_params)]


def _check_ints(**values) -> None:
  for name, x in values.items():
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
      raise ValueError(f"{name} must be an integer >= 1, got {x!r}")


def run_plan_hierarchy(verifier, candidates, sampling, *, max_buffer: int = 8,
                       max_depth: int | None = 3, planner: str = "auto",
                       batch_size: int = 1, input_file: str | None = None,
                       num_prompts: int = 8, new_tokens: int = 32,
                       repeats: int = 5, top: int = 5,
                       output: str | None = None, seed: int = 0) -> dict:
  """Plans a hierarchy of ``candidates`` under ``verifier``.

  Args:
    verifier: ``runs.ModelSpec`` of the top level.
    candidates: {name: level} or [level]; a level is a ModelSpec or
      'exit:K'.
    sampling: the decode's sampling strategy.
    max_buffer, max_depth, planner, top: the search (buffers 1..max_buffer,
      at most max_depth drafters, 'auto' | 'brute' | 'dp', rows printed).
    batch_size: serving batch size of the cost measurements.
    input_file, num_prompts, new_tokens: calibration requests.
    repeats: timing repeats (median kept).
    output: path of the gin file to write (None: not written).
    seed: sampling seed of the calibration.

  Returns:
    dict with 'names', 'alpha' [n][n], 'costs' {name: [seconds by width]},
    'widths', 'order' (drafters used, cheapest first), 'dropped', 'top'
    (rows of the best hierarchies), 'best', 'speedup',
    'speedup_over_single' and the 'gin' text written to ``output``.
  """
  _check_ints(max_buffer=max_buffer, batch_size=batch_size,
              num_prompts=num_prompts, new_tokens=new_tokens,
              repeats=repeats, top=top)
  if max_depth is not None:
    _check_ints(max_depth=max_depth)
  if planner not in ("auto", "brute", "dp"):
    raise ValueError(f"planner must be 'auto', 'brute' or 'dp', got "
                     f"{planner!r}")
  sampling.validate()
  named = parse_candidates(candidates)
  planner_lib.check_search(len(named) + 1, max_buffer, planner == "brute" or (
      planner == "auto" and len(named) <= 5), 8, max_depth)
  plan_tree.check_output(output)
  v_arch = verifier.architecture()
  v_tok = verifier.load_tokenizer(v_arch)
  for name, lv in named:  # everything checkable before any weights load
    what = f"candidate {name!r}"
    spec_lib.check_tokenizer(lv, spec_lib.architecture(lv, v_arch, what),
                             v_tok, what)
  prompts, inputs = _prompts(verifier, v_arch, v_tok, input_file,
                             num_prompts, seed)
  bar = plan_tree.StageBar("plan-hierarchy", [
      "loading the models", "calibrating pairwise alpha",
      "timing the models", "planning"])
  levels = _load(verifier, named)
  bar.next()
  names = [n for n, _ in named] + [TARGET]
  alpha = calib.pairwise_alpha(levels, prompts, inputs=inputs,
                               sampling=sampling, new_tokens=new_tokens,
                               seed=seed)
  bar.next()
  depth = min(max_depth or len(named), len(named))
  costs = calib.measure_call_costs(
      levels, batch=batch_size,
      widths=calib.planner_widths(max_buffer, depth), sampling=sampling,
      repeats=repeats)
  bar.next()
  report = _plan_and_report(names, alpha, costs, named, max_buffer,
                            max_depth, planner, top, output, sampling,
                            len(prompts or inputs), new_tokens)
  bar.next()
  return report


def order_and_plan(names: Sequence[str], alpha, costs: calib.CallCosts,
                   max_buffer: int, max_depth: int | None, planner: str,
                   top: int):
  """Orders the candidates cheapest first (dropping those not cheaper per
  call than the verifier, the last model) and plans.

  Returns:
    (plan over the kept models, order: their indices into ``names`` with
    the verifier last, dropped: names of the dropped candidates).
  """
  n = len(names)
  c1 = [costs(i, 1) for i in range(n)]
  cheaper = [i for i in range(n - 1) if c1[i] < c1[-1]]
  dropped = [names[i] for i in range(n - 1) if i not in cheaper]
  if not cheaper:
    raise ValueError(
        f"no candidate is cheaper per call than the verifier on this machine "
        f"(verifier {c1[-1] * 1e3:.3f} ms; "
        f"{', '.join(f'{names[i]} {c1[i] * 1e3:.3f} ms' for i in range(n - 1))}"
        f"): a hierarchy cannot beat target-only decoding; try smaller "
        f"candidates or shallower early exits")
  order = sorted(cheaper, key=lambda i: c1[i]) + [n - 1]
  sub_alpha = np.asarray(alpha)[np.ix_(order, order)]
  plan = planner_lib.plan(sub_alpha, costs.select(order), max_buffer,
                          method=planner, top=top,
                          names=[names[i] for i in order],
                          max_depth=max_depth)
  return plan, order, dropped


def _plan_and_report(names, alpha, costs, named, max_buffer, max_depth,
                     planner, top, output, sampling, n_prompts,
                     new_tokens) -> dict:
  """Orders the candidates, plans, prints, writes the gin file."""
  plan, order, dropped = order_and_plan(names, alpha, costs, max_buffer,
                                        max_depth, planner, top)
  sub_names = [names[i] for i in order]
  rows = [dict(chain=[sub_names[i] for i in c.chain],
               buffers=list(c.buffers), seconds_per_token=c.per_token,
               tokens_per_target_call=c.latency.tokens_per_target_call,
               speedup=plan.target_only / c.per_token,
               speedup_over_single=plan.best_single.per_token / c.per_token)
          for c in plan.top]
  best = plan.best
  chosen = [named[order[i]][1] for i in best.chain]
  note = (f"Planned by `specdec_jax plan-hierarchy` for sampling "
          f"{sampling!r}, batch {costs.batch}: predicted "
          f"{best.per_token * 1e3:.3f} ms per token, {plan.speedup:.2f}x over "
          f"target-only and {plan.gain_over_single:.2f}x over the best single"
          f" drafter ({plan.describe(plan.best_single)}) on this machine.")
  text = spec_lib.hierarchy_gin(chosen, best.buffers, note)
  print(format_report(names, alpha, costs, plan, rows, dropped, n_prompts,
                      new_tokens, sampling))
  if output:
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
      f.write(text)
    print(f"wrote {output}")
  return dict(names=list(names), alpha=np.asarray(alpha).tolist(),
              widths=list(costs.widths),
              costs={nm: list(costs.seconds[i]) for i, nm in enumerate(names)},
              order=[names[i] for i in order[:-1]], dropped=dropped,
              top=rows, best=rows[0], speedup=plan.speedup,
              speedup_over_single=plan.gain_over_single,
              target_only=plan.target_only, gin=text)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list:
  return (["| " + " | ".join(header) + " |",
           "|" + "---|" * len(header)] +
          ["| " + " | ".join(r) + " |" for r in rows])


def format_report(names, alpha, costs, plan, rows, dropped, n_prompts,
                  new_tokens, sampling) -> str:
  """The printed report (markdown tables)."""
  lines = [f"calibration: {n_prompts} request(s) x {new_tokens} target "
           f"tokens, sampling {sampling!r}; costs timed at batch "
           f"{costs.batch} on this machine", "",
           "per-call cost c(w) in ms (w = tokens in the block):"]
  lines += _table(["model"] + [f"w={w}" for w in costs.widths],
                  [[nm] + [f"{s * 1e3:.3f}" for s in costs.seconds[i]]
                   for i, nm in enumerate(names)])
  lines += ["", "alpha = E[1 - TV] of the row's tokens under the column "
            "(symmetric):"]
  lines += _table(["model"] + list(names),
                  [[nm] + [f"{alpha[i][j]:.3f}" for j in range(len(names))]
                   for i, nm in enumerate(names)])
  if dropped:
    lines += ["", f"dropped (not cheaper per call than the verifier): "
              f"{', '.join(dropped)}"]
  lines += ["", f"best hierarchies (target-only: "
            f"{plan.target_only * 1e3:.3f} ms per token):"]
  lines += _table(["hierarchy", "buffers", "ms/token", "tokens/target call",
                   "vs target-only", "vs best single"],
                  [[" -> ".join(r["chain"] + [TARGET]), str(r["buffers"]),
                    f"{r['seconds_per_token'] * 1e3:.3f}",
                    f"{r['tokens_per_target_call']:.2f}",
                    f"{r['speedup']:.2f}x", f"{r['speedup_over_single']:.2f}x"]
                   for r in rows])
  lines += ["", f"chosen: {plan.describe(plan.best)}: predicted "
            f"{plan.best.per_token * 1e3:.3f} ms per token, "
            f"{plan.speedup:.2f}x over target-only, "
            f"{plan.gain_over_single:.2f}x over the best single drafter "
            f"({plan.describe(plan.best_single)})"]
  if plan.speedup < 1.0:
    lines.append("note: no hierarchy is predicted to beat target-only "
                 "decoding with these candidates on this machine")
  return "\n".join(lines)


__all__ = ["format_report", "order_and_plan", "parse_candidates",
           "run_plan_hierarchy"]
