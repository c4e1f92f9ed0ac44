"""Benchmark: tree drafting fed one level per call vs the block prefix.

Usage: python scripts/bench_tree_feeds.py --pairs random-gemma --out /tmp/bench_tree_feeds

A drafter with ``masks_cached_slots = True`` (the built-in T5 and Gemma) is
fed each tree level once; ``tree_drafting.PrefixFed(drafter)`` hides that
form, so the same drafter is fed the whole block prefix of depth <= k at
call k (what every tree decode did before the cached-slot step form). Both
decode the same requests with the same seeds; their logits agree to float
rounding (the blocks differ in shape: ~1e-5 on logits of magnitude ~16 on
default-t5), so tokens match except where rounding moves a sampled token
across a CDF boundary; the report gives the fraction of identical requests.
Per (pair, batch, temperature, tree), each
repeat times the prefix-fed run, then the level-fed run; the report gives
the median of their time ratios and both tokens/s.

Usage:
  python scripts/bench_tree_feeds.py --out benchmarks/results/bench_tree_feeds
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

import jax
import numpy as np

from specdec_jax import decoding
from specdec_jax.decoding.loops import tree_drafting
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bench_decode import load_pair  # noqa: E402
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bench_tree import decoder, kary_cut, requests  # noqa: E402

Topology = decoding.Topology


def trees(names) -> dict:
  """{name: Tree}: 'chainD' (a depth-D chain with top-k proposals, so it
  stays on the tree loop), 'karyK-N' (k-ary cut to N nodes)."""
  out = {}
  for name in names:
    if name.startswith("chain"):
      out[name] = decoding.Tree(Topology.chain(int(name[5:])), "top_k")
    elif name.startswith("kary"):
      k, n = name[4:].split("-")
      out[name] = decoding.Tree(kary_cut(int(k), int(n)),
                                "without_replacement")
    else:
      raise ValueError(f"unknown tree {name!r}; use chainD or karyK-N")
  return out


def bench_pair(name, args) -> list[dict]:
  """Rows of one pair."""
  pair = load_pair(name)
  drafter, verifier, qp, pp = pair
  rows_in, _ = requests(pair, verifier, args.num_prompts, 0)
  spec = decoding.make_method("spec_decode")
  prefix = (tree_drafting.PrefixFed(drafter), verifier, qp, pp)
  out = []
  for batch in args.batches:
    for temp in args.temperatures:
      for tname, tree in trees(args.trees).items():
        level_run = decoder(spec, pair, rows_in, temp, args.new_tokens, batch,
                            tree=tree)
        prefix_run = decoder(spec, prefix, rows_in, temp, args.new_tokens,
                             batch, tree=tree)
        ratios, t_level, t_prefix, same, total = [], [], [], 0, 0
        for r in range(args.repeats):
          tp, outs_p = prefix_run(r + 1)
          tl, outs_l = level_run(r + 1)
          for a, b in zip(outs_p, outs_l):
            same += int(np.all(np.asarray(a.tokens) == np.asarray(b.tokens),
                               axis=1).sum())
            total += a.tokens.shape[0]
          ratios.append(tp / tl)
          t_level.append(tl)
          t_prefix.append(tp)
        tokens = sum(int(x.lengths.sum()) for x in outs_l)
        calls = sum(int(x.drafter_calls.sum()) for x in outs_l)
        out.append(dict(
            pair=name, batch=batch, temperature=temp, tree=tname,
            nodes=tree.topology.num_nodes, depth=tree.topology.max_depth,
            level_tokens_per_s=tokens / statistics.median(t_level),
            prefix_tokens_per_s=tokens / statistics.median(t_prefix),
            speedup=statistics.median(ratios), ratios=ratios,
            identical_requests=same / total,
            drafter_calls=calls))
        print(json.dumps(out[-1]), flush=True)
      decoding.clear_compiled()
  return out


def markdown(command, meta, rows) -> str:
  md = ["# Tree drafting: one level per call vs the block prefix\n",
        f"Command: `{command}`\n",
        f"Backend {meta['backend']} ({meta['cpu']}), jax {meta['jax']}. "
        "Each repeat times the prefix-fed decode, then the level-fed one "
        "(same requests and seeds); speedup = median over repeats of prefix "
        "seconds / level seconds; identical = requests whose tokens match "
        "(all repeats).\n",
        "| pair | batch | T | tree | nodes | depth | prefix-fed tok/s | "
        "level-fed tok/s | speedup | identical |",
        "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    md.append(f"| {r['pair']} | {r['batch']} | {r['temperature']:g} | "
              f"{r['tree']} | {r['nodes']} | {r['depth']} | "
              f"{r['prefix_tokens_per_s']:.1f} | {r['level_tokens_per_s']:.1f}"
              f" | {r['speedup']:.2f}x | {100 * r['identical_requests']:.0f}%"
              " |")
  return "\n".join(md) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--pairs", default="random-gemma,default-t5")
  ap.add_argument("--out", default="benchmarks/results/bench_tree_feeds")
  ap.add_argument("--trees", default="chain8,kary2-16,kary4-16,kary2-32")
  ap.add_argument("--num_prompts", type=int, default=8)
  ap.add_argument("--new_tokens", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--temperatures", default="0,1")
  args = ap.parse_args()
  args.trees = args.trees.split(",")
  args.batches = [int(x) for x in args.batches.split(",")]
  args.temperatures = [float(x) for x in args.temperatures.split(",")]
  trees(args.trees)  # fail early on a bad name
  command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
  meta = dict(backend=jax.default_backend(), cpu=platform.machine(),
              jax=jax.__version__)
  rows = []
  for name in args.pairs.split(","):
    rows += bench_pair(name, args)
  results_file.write_report(args.out, command=command,
                            markdown=markdown(command, meta, rows), rows=rows,
                            meta=meta, extra=dict(command=command))
  print(f"wrote {args.out}.md")


if __name__ == "__main__":
  main()
