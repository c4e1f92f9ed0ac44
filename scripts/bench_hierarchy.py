"""Benchmark: hierarchical speculative decoding against target-only, every
single drafter, and the latency model's prediction.

Usage: python scripts/bench_hierarchy.py --stacks=default-t5 --out=/tmp/bench_hierarchy

Stacks (--stacks):

  default-gemma, default-t5   the built-in family: ``default_models.load(name)
                              .levels()`` = [small, medium, large] (two levels
                              with assets that have no medium model), plus
                              early exits of the large model (--default_exits)
  random-gemma                the 37.8M random Gemma verifier of
                              scripts/bench_decode.py (``random_pair('gemma')``)
                              with early-exit levels (--exits, default 1,3)
  random-tiny                 a 4-layer d=64 random Gemma, exits 1,2 (smoke)

For every stack, batch size (--batches) and temperature (--temperatures):

1. calibrate (``decoding.planners.hierarchy_calibration``): pairwise alpha
   from one teacher-forced pass over --cal_prompts requests, and per-call
   costs of every model at every block width, timed at that batch size;
2. plan (``decoding.hierarchy.planner``, via ``plan_hierarchy_run
   .order_and_plan``): candidates ordered by cost, the ranked hierarchies;
3. measure target-only, every candidate as the single drafter of a 2-level
   stack (with its best buffer under the model), the planner's choice and
   its next --extra_plans runners-up, on --batch requests decoding
   --new_tokens tokens each (EOS ignored, so every configuration emits the
   same tokens count). Every repeat times the configuration and target-only
   back to back (alternating which goes first); tokens/s and the speedup are
   medians over the --repeats repeats.

Reported per configuration: tokens/s, speedup over target-only, measured
and predicted seconds per token (per row: batch wall time / tokens per row;
predicted = the exact renewal model with the measured alpha and costs),
their ratio, predicted speedup, per-level alpha (``DecodeResult.
level_alpha()``) next to the calibrated alpha, and the issue's goals: the
planner's choice within 10% of the best measured configuration, predicted
vs measured latency within 15%.

Usage (the real benchmark, on a quiet machine):
  python scripts/bench_hierarchy.py --out benchmarks/results/bench_hierarchy
Smoke test (tiny settings, a couple of minutes):
  python scripts/bench_hierarchy.py --smoke --out /tmp/bench_hierarchy
Writes <out>.json and <out>.md (the exact command line at the top).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time

import jax
import numpy as np

from specdec_jax import decoding, models
from specdec_jax.decoding.hierarchy import latency
from specdec_jax.decoding.planners import hierarchy_calibration as calib
from specdec_jax import plan_hierarchy_run as plan_hierarchy
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _exits(verifier, params, layers, names_taken=()):
  """[(name, (model, params))] early exits of ``verifier`` (valid ones)."""
  out = []
  for k in layers:
    if 1 <= k < verifier.num_decoder_layers and f"exit:{k}" not in names_taken:
      out.append((f"exit:{k}", (models.early_exit(verifier, k), params)))
    else:
      print(f"note: skipping exit:{k} (the verifier has "
            f"{verifier.num_decoder_layers} decoder layers)", file=sys.stderr)
  return out


def load_stack(name: str, args):
  """(candidates [(name, (model, params))], (verifier, params), requests).

  ``requests(n, offset)`` returns generate keyword arguments for n rows.
  """
  if name.startswith("default-"):
    from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
    pair = default_models.load(name)
    levels = pair.levels()
    labels = ["small", "medium", "large"] if len(levels) == 3 else [
        "small", "large"]
    if len(levels) == 2:
      print(f"note: {name} assets have no medium model: the stack is small "
            f"-> large plus early exits", file=sys.stderr)
    cands = list(zip(labels[:-1], levels[:-1]))
    cands += _exits(*levels[-1], args.default_exits)
    exs = default_models.examples(pair.name, "test", None)

    def requests(n, offset):
      picked = [exs[(offset + i) % len(exs)] for i in range(n)]
      return pair.encode(picked)

    return cands, levels[-1], requests
  if name == "random-gemma":
    from bench_decode import random_pair  # pylint: disable=g-import-not-at-top
    _, v, _, p = random_pair("gemma")
    layers = args.exits
  elif name == "random-tiny":
    cfg = models.GemmaConfig(vocab_size=256, d_model=64, num_layers=4,
                             num_heads=4, num_kv_heads=4, head_dim=16,
                             mlp_dim=128)
    v = models.GemmaModel(cfg)
    p = v.init_params(jax.random.PRNGKey(0))
    p["embedder"]["input_embedding"] = p["embedder"]["input_embedding"] * 4.0
    layers = (1, 2)
  else:
    raise ValueError(f"unknown stack {name!r}")

  def requests(n, offset):
    rng = np.random.default_rng(1000 + offset)
    return {"prompts": [[2] + rng.integers(3, v.vocab_size, 15).tolist()
                        for _ in range(n)]}

  return _exits(v, p, layers), (v, p), requests


def _timed(fn):
  t0 = time.perf_counter()
  out = fn()
  jax.block_until_ready(out.tokens)
  return time.perf_counter() - t0, out


def measure(run, target, new_tokens: int, repeats: int) -> dict:
  """Times ``run(n)`` against ``target(n)`` back to back per repeat.

  Each repeat times both at ``new_tokens`` and at half of it (alternating
  which goes first); the marginal seconds per token (t(N) - t(N/2)) / (N -
  N/2) leave out what a call costs whatever its length (host-side input
  preparation, prefill, copying the result back), which the latency model
  does not count. ``target`` is None for target-only itself.

  Returns:
    dict of medians: seconds, tokens_per_s, speedup (wall clock, back-to-back
    ratios), measured_s_per_token (marginal, per row), marginal_speedup, the
    per-level alpha and tokens per target call of the full-length run.
  """
  half = max(1, new_tokens // 2)
  for fn in (run, target):  # compile both lengths
    if fn is not None:
      _timed(lambda: fn(new_tokens))
      _timed(lambda: fn(half))
  walls, ratios, marg, marg_t = [], [], [], []
  out = None
  for r in range(repeats):
    t = {}
    order = [("m", run), ("t", target)] if r % 2 == 0 else [
        ("t", target), ("m", run)]
    for n in (new_tokens, half):
      for tag, fn in order:
        if fn is None:
          continue
        t[tag, n], got = _timed(lambda: fn(n))
        if tag == "m" and n == new_tokens:
          out = got
    if target is None:
      t["t", new_tokens], t["t", half] = t["m", new_tokens], t["m", half]
    walls.append(t["m", new_tokens])
    ratios.append(t["t", new_tokens] / t["m", new_tokens])
    marg.append((t["m", new_tokens] - t["m", half]) / (new_tokens - half))
    marg_t.append((t["t", new_tokens] - t["t", half]) / (new_tokens - half))
  sec = statistics.median(walls)
  per_token = statistics.median(marg)
  return dict(seconds=sec, tokens_per_s=float(out.lengths.sum()) / sec,
              speedup=statistics.median(ratios),
              measured_s_per_token=per_token,
              wall_s_per_token=sec * out.tokens.shape[0] / float(
                  out.lengths.sum()),
              marginal_speedup=statistics.median(marg_t) / per_token,
              level_alpha=[None if np.isnan(a) else a
                           for a in out.level_alpha()],
              tokens_per_target_call=out.block_efficiency)


def _single_best(alpha, cost, i, target, max_buffer):
  """(buffer, latency) of drafter i alone under the target."""
  a = lambda x, y: float(alpha[x][y])
  return min(((t, latency.evaluate((i,), (t,), a, cost, target))
              for t in range(1, max_buffer + 1)),
             key=lambda x: x[1].per_token)


def bench_setting(cands, ver, requests, batch, temp, args) -> dict:
  """Calibrate, plan and measure one (stack, batch, temperature)."""
  sampling = decoding.Temperature(temp)
  models_ = [lv for _, lv in cands] + [ver]
  names = [n for n, _ in cands] + ["target"]
  cal = requests(args.cal_prompts, 0)
  alpha = calib.pairwise_alpha(models_, cal.get("prompts"),
                               inputs=cal.get("inputs"), sampling=sampling,
                               new_tokens=args.cal_tokens, seed=args.seed)
  depth = min(args.max_depth, len(cands))
  costs = calib.measure_call_costs(
      models_, batch=batch, widths=calib.planner_widths(args.max_buffer,
                                                        depth),
      sampling=sampling, repeats=args.cost_repeats)
  info = dict(batch=batch, temperature=temp, names=names,
              alpha=np.asarray(alpha).tolist(), widths=list(costs.widths),
              costs={n: list(costs.seconds[i]) for i, n in enumerate(names)})
  try:
    plan, order, dropped = plan_hierarchy.order_and_plan(
        names, alpha, costs, args.max_buffer, args.max_depth, "auto",
        1 + args.extra_plans)
  except ValueError as e:  # no candidate is cheaper than the target
    print(f"note: {e}", file=sys.stderr)
    return dict(info, error=str(e), rows=[], dropped=names[:-1])
  sub_alpha = np.asarray(alpha)[np.ix_(order, order)]
  sub_cost = costs.select(order)
  target = len(order) - 1
  kw = dict(sampling=sampling, seeds=args.seed, eos_id=None,
            **requests(batch, args.cal_prompts))
  v, pp = ver
  run_target = lambda n: decoding.generate(
      decoding.TargetOnly(), v, v, pp, pp, max_new_tokens=n, **kw)
  configs = [("target-only", (), (), None)]
  for i in range(target):
    t, lat = _single_best(sub_alpha, sub_cost, i, target, args.max_buffer)
    configs.append((f"single {names[order[i]]}", (i,), (t,), lat))
  for rank, c in enumerate(plan.top):
    configs.append((f"plan #{rank + 1}", c.chain, c.buffers, c.latency))
  rows, seen = [], {}
  for label, chain, bufs, lat in configs:
    key = (chain, bufs)
    if key in seen:  # the plan's choice may be a single drafter
      seen[key]["labels"].append(label)
      continue
    levels = [models_[order[i]] for i in chain] + [ver]
    run = run_target if not chain else (
        lambda n, levels=levels, bufs=bufs: decoding.generate_hierarchy(
            levels, list(bufs), max_new_tokens=n, **kw))
    got = measure(run, run_target if chain else None, args.new_tokens,
                  args.repeats)
    pred = lat.per_token if lat else sub_cost(target, 1)
    row = dict(labels=[label], chain=[names[order[i]] for i in chain],
               buffers=list(bufs), predicted_s_per_token=pred,
               predicted_speedup=sub_cost(target, 1) / pred,
               calibrated_alpha=[float(sub_alpha[a][b]) for a, b in zip(
                   chain, list(chain[1:]) + [target])], **got)
    row["measured_over_predicted"] = row["measured_s_per_token"] / pred
    rows.append(row)
    seen[key] = row
    print(json.dumps(row), flush=True)
  # The planner's choice: its best hierarchy, or target-only when no
  # hierarchy is predicted to beat it.
  pick = "plan #1" if plan.speedup >= 1.0 else "target-only"
  chosen = next(r for r in rows if pick in r["labels"])
  chosen["labels"].append("planner's choice")
  best = max(rows, key=lambda r: r["speedup"])
  decoding.clear_compiled()
  return dict(info, dropped=dropped, rows=rows,
              planner_vs_best=chosen["speedup"] / best["speedup"],
              best_measured=best["labels"][0])


def write_md(command, meta, results) -> str:
  lines = ["# bench_hierarchy", "", "```", command, "```", "",
           f"{meta['platform']}, jax {meta['jax']}, {meta['devices']}; "
           f"{meta['new_tokens']} new tokens per request (EOS ignored), "
           f"{meta['repeats']} repeats (medians of back-to-back ratios).",
           "speedup: wall clock over target-only; marginal: per-token time "
           "between N/2 and N tokens (no per-call fixed costs), which is what "
           "the latency model predicts (meas/pred = marginal ms/tok over "
           "predicted).", ""]
  for res in results:
    lines += [f"## {res['stack']}: batch {res['batch']}, temperature "
              f"{res['temperature']}", "",
              "| config | hierarchy | buffers | tok/s | speedup | "
              "marginal speedup | pred speedup | measured ms/tok | "
              "predicted ms/tok | meas/pred | level alpha (measured) | "
              "alpha (calibrated) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if res.get("error"):
      lines += [f"not measured: {res['error']}", ""]
      continue
    for r in res["rows"]:
      la = ", ".join("-" if a is None else f"{a:.3f}"
                     for a in r["level_alpha"][1:])
      ca = ", ".join(f"{a:.3f}" for a in r["calibrated_alpha"])
      lines.append(
          f"| {' / '.join(r['labels'])} | "
          f"{' -> '.join(r['chain'] + ['target'])} | {r['buffers']} | "
          f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
          f"{r['marginal_speedup']:.2f}x | {r['predicted_speedup']:.2f}x | "
          f"{r['measured_s_per_token'] * 1e3:.3f} | "
          f"{r['predicted_s_per_token'] * 1e3:.3f} | "
          f"{r['measured_over_predicted']:.2f} | {la} | {ca} |")
    worst = max(abs(r["measured_over_predicted"] - 1) for r in res["rows"])
    lines += ["", f"planner's choice / best measured ({res['best_measured']})"
              f": {res['planner_vs_best']:.3f} (goal >= 0.90); largest "
              f"|measured / predicted - 1|: {worst:.3f} (goal <= 0.15)"]
    if res["dropped"]:
      lines.append(f"dropped (not cheaper than the target): "
                   f"{', '.join(res['dropped'])}")
    lines.append("")
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--stacks", default="default-gemma,random-gemma")
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--temperatures", default="0,1")
  ap.add_argument("--exits", default="1,3", help="random-gemma exits")
  ap.add_argument("--default_exits", default="2",
                  help="early exits of the default families' large model")
  ap.add_argument("--new_tokens", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--cal_prompts", type=int, default=8)
  ap.add_argument("--cal_tokens", type=int, default=32)
  ap.add_argument("--cost_repeats", type=int, default=5)
  ap.add_argument("--max_buffer", type=int, default=8)
  ap.add_argument("--max_depth", type=int, default=3)
  ap.add_argument("--extra_plans", type=int, default=2,
                  help="runners-up of the planner measured too")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--smoke", action="store_true",
                  help="tiny settings: random-tiny, batch 1, T=1, few tokens")
  ap.add_argument("--out", required=True)
  args = ap.parse_args()
  if args.smoke:
    args.stacks, args.batches, args.temperatures = "random-tiny", "1", "1"
    args.new_tokens, args.repeats, args.cal_prompts = 8, 2, 2
    args.cal_tokens, args.cost_repeats, args.max_buffer = 6, 2, 3
    args.max_depth, args.extra_plans = 2, 1
  ints = lambda s: [int(x) for x in s.split(",") if x]
  args.exits, args.default_exits = ints(args.exits), ints(args.default_exits)
  command = " ".join(shlex.quote(a) for a in ["python"] + sys.argv)
  meta = dict(command=command, platform=platform.platform(),
              jax=jax.__version__, devices=str(jax.devices()),
              new_tokens=args.new_tokens, repeats=args.repeats,
              args=vars(args))
  results = []
  for stack in args.stacks.split(","):
    cands, ver, requests = load_stack(stack, args)
    for batch in ints(args.batches):
      for temp in [float(t) for t in args.temperatures.split(",")]:
        res = bench_setting(cands, ver, requests, batch, temp, args)
        results.append(dict(stack=stack, **res))
  results_file.write_report(args.out, command=command,
                            markdown=write_md(command, meta, results),
                            rows=results, meta=meta)
  print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
  main()
