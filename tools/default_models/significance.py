"""Is a default family's quality ordering real? A paired bootstrap.

Decodes the whole test split greedily with each size of a default family
(small, medium, large; target-only decoding of that size), then resamples
the test examples with replacement (the same resample for every size, so the
comparison is paired) and recomputes the task's primary metric (ROUGE-2 or
corpus BLEU) on each resample. Reports each size's metric with its 95%
bootstrap interval and, for each pair of sizes, the fraction of resamples in
which the larger model scores higher: near 1.0 the ordering is real, near
0.5 the two are indistinguishable on this split.

    python -m tools.default_models.significance \\
        --assets /work/dm_out --resamples 1000 \\
        --out benchmarks/results/default_models_significance

writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

from specdec_jax import decoding
from specdec_jax.eval import metrics as metrics_lib
from specdec_jax.families import loader as dm
from tools.default_models import family_eval as dme

ORDER = (("large", "medium"), ("large", "small"), ("medium", "small"))


def bootstrap(metric: str, targets, preds: dict, resamples: int,
              seed: int) -> dict:
  """Paired bootstrap of ``metric`` over examples.

  Args:
    metric: a metrics name ('rouge2', 'bleu', ...).
    targets: [n] references.
    preds: {level: [n] predictions}.
    resamples: number of bootstrap resamples.
    seed: resampling seed.

  Returns:
    {'levels': {level: {metric, low, high}}, 'wins': {'a>b': fraction}}.
  """
  n = len(targets)
  rng = np.random.default_rng(seed)
  if metric.startswith("rouge"):  # a mean of per-example scores
    per = {lv: np.asarray([metrics_lib.compute([metric], [t], [p])[metric]
                           for t, p in zip(targets, ps)])
           for lv, ps in preds.items()}
    score = lambda idx, lv: float(per[lv][np.asarray(list(idx))].mean())
  else:  # corpus-level (BLEU): recomputed on each resample
    score = lambda idx, lv: metrics_lib.compute(
        [metric], [targets[i] for i in idx], [preds[lv][i] for i in idx])[
            metric]
  draws = {lv: [] for lv in preds}
  for _ in range(resamples):
    idx = rng.integers(0, n, n)
    for lv in preds:
      draws[lv].append(score(idx, lv))
  full = {lv: score(range(n), lv) for lv in preds}
  out = dict(levels={}, wins={})
  for lv, d in draws.items():
    lo, hi = np.percentile(d, [2.5, 97.5])
    out["levels"][lv] = dict(metric=round(float(full[lv]), 4),
                             low=round(float(lo), 4),
                             high=round(float(hi), 4))
  for a, b in ORDER:
    if a in draws and b in draws:
      out["wins"][f"{a}>{b}"] = round(float(np.mean(
          np.asarray(draws[a]) > np.asarray(draws[b]))), 4)
  return out


def run(name: str, assets: str, resamples: int, seed: int,
        limit: int = 0, predictions: str = "") -> dict:
  """Decodes the test split with every size of pair ``name``; bootstraps.

  With ``predictions`` set, also writes each size's decoded test outputs to
  that JSON file ({'targets': [n], 'inputs': [n], level: [n]}).
  """
  pair = dm.load(name, assets=assets)
  exs = dm.examples(name, "test", limit=limit or None)
  levels = [lv for lv in dm.LEVELS if pair.model(lv)[0] is not None]
  preds = {}
  for lv in levels:
    t = time.perf_counter()
    preds[lv], _ = dme.decode(pair, decoding.make_method("target_only"), exs,
                              verifier=lv)
    print(f"{name} {lv}: decoded {len(exs)} in "
          f"{time.perf_counter() - t:.0f}s", flush=True)
  metric = pair.metrics[0]
  targets = [e["targets"] for e in exs]
  res = bootstrap(metric, targets, preds, resamples, seed)
  res.update(metric=metric, examples=len(exs))
  if metric == "bleu":  # why the BLEUs differ: precisions vs brevity
    for lv, ps in preds.items():
      res["levels"][lv]["breakdown"] = metrics_lib.bleu_breakdown(targets, ps)
  if predictions:
    os.makedirs(os.path.dirname(os.path.abspath(predictions)), exist_ok=True)
    with open(predictions, "w") as f:
      json.dump(dict(targets=targets, inputs=[e["inputs"] for e in exs],
                     **preds), f, indent=0)
  return res


def markdown(results: dict, command: str) -> str:
  lines = ["# Default families: is the quality ordering significant?", "",
           f"```\n{command}\n```", "",
           f"{platform.platform()}; {results['resamples']} paired bootstrap "
           f"resamples of the test split (seed {results['seed']}); greedy "
           "target-only decoding of each size; metric in percent, 95% "
           "interval in brackets; 'P(a > b)': fraction of resamples in "
           "which size a scores higher than size b.", ""]
  for name, r in results["pairs"].items():
    lines += [f"## {name} ({r['metric']}, {r['examples']} test examples)",
              "", "| size | " + r["metric"] + " [95% interval] |",
              "|---|---|"]
    for lv, s in r["levels"].items():
      lines.append(f"| {lv} | {s['metric']:.2f} [{s['low']:.2f}, "
                   f"{s['high']:.2f}] |")
    parts = {lv: s["breakdown"] for lv, s in r["levels"].items()
             if "breakdown" in s}
    if parts:
      lines += ["", "| size | 1/2/3/4-gram precision | brevity penalty | "
                "output/reference length |", "|---|---|---|---|"]
      for lv, b in parts.items():
        lines.append(f"| {lv} | " + " / ".join(
            f"{p:.1f}" for p in b["precisions"]) +
                     f" | {b['brevity_penalty']:.3f} | "
                     f"{b['length_ratio']:.3f} |")
    lines += ["", "| comparison | P(a > b) |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in r["wins"].items()]
    lines.append("")
  return "\n".join(lines)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--assets", default=dm.ASSETS)
  ap.add_argument("--pairs", default=",".join(dm.PAIRS))
  ap.add_argument("--resamples", type=int, default=1000)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--limit", type=int, default=0,
                  help="first N test examples (0: all)")
  ap.add_argument("--predictions", default="",
                  help="also write the decoded test outputs to this JSON "
                  "file (one per pair: '{pair}' in the path is replaced)")
  ap.add_argument("--out", required=True,
                  help="output prefix (<out>.json, <out>.md)")
  args = ap.parse_args(argv)
  if args.resamples < 10:
    ap.error(f"--resamples must be >= 10, got {args.resamples}")
  names = [p for p in args.pairs.split(",") if p]
  bad = [p for p in names if p not in dm.PAIRS]
  if bad:
    ap.error(f"unknown pair {bad[0]!r}; choose from {dm.PAIRS}")
  if len(names) > 1 and args.predictions and "{pair}" not in args.predictions:
    ap.error(f"--predictions {args.predictions!r}: with several pairs the "
             "path must contain '{pair}' (one file per pair)")
  results = dict(resamples=args.resamples, seed=args.seed, assets=args.assets,
                 pairs={n: run(n, args.assets, args.resamples, args.seed,
                               args.limit,
                               args.predictions.replace("{pair}", n))
                        for n in names})
  command = "python -m tools.default_models.significance " + " ".join(
      argv or sys.argv[1:])
  results["command"] = command
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(results, f, indent=1)
  with open(args.out + ".md", "w") as f:
    f.write(markdown(results, command))
  print(markdown(results, command))


if __name__ == "__main__":
  main()
