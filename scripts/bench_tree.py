"""Benchmark: token trees vs chains, and the planner vs hand-picked trees.

Usage: python scripts/bench_tree.py --pairs=default-t5 --out=/tmp/bench_tree

On each pair (the default pairs and the larger random pair of
``bench_decode.py``), at every temperature and batch size, this decodes with

* target-only decoding (the baseline of every speedup);
* chains of gamma in ``--gammas`` (3, 5, 7), and the chain of N drafts for
  every tree size N (the same verifier block width as an N-node tree);
* for every N in ``--nodes`` (8, 16, 32): k-ary trees cut to N nodes
  breadth-first (k in ``--kary``) and the planner's Sequoia-optimal N-node
  tree (``decoding.planners.plan_tree`` on per-rank acceptance calibrated on
  this pair by ``planners.calibrate``, as ``specdec_jax plan-tree`` does);
* the hardware-aware plan of ``specdec_jax plan-tree`` (``plan_tree`` with
  block costs measured on this machine at this batch, <= max N nodes).

It reports tokens per verifier call, tokens/s relative to target-only (the
median over repeats of back-to-back ratios: each repeat times target-only,
then the method) and the verifier cost ratio b(N) of a block of N + 1
tokens (root + N nodes, tree-masked) over a 1-token step, timed in a jitted
loop like bench_decode's block cost b (median of back-to-back ratios).

Verdicts (one line each, printed and written):
* TREE-VS-CHAIN: at the same verifier block width (N nodes), the best tree
  yields >= 15% more tokens per verifier call than the chain of N;
* PLANNER-VS-HAND: the planner's N-node tree is never worse than the best
  hand-picked N-node tree by more than noise (2 standard errors of the
  mean per-request difference of tokens per call: both trees decode the
  same requests with the same seeds).
Tokens per call do not depend on the batch size (each request's randomness
is its own), so verdicts are per (pair, temperature, N), from the first
batch size.

Usage (the real run; minutes to hours on a quiet machine):
  python scripts/bench_tree.py --out benchmarks/results/bench_tree
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

from specdec_jax import decoding, timing
from specdec_jax.decoding import planners
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bench_decode import load_pair  # noqa: E402

Topology = decoding.Topology
GAIN = 1.15  # the tree-vs-chain goal: >= 15% more tokens per call


def kary_cut(k: int, n: int) -> Topology:
  """The k-ary tree cut to its first ``n`` nodes breadth-first."""
  parents, level = [], [-1]
  while len(parents) < n:
    nxt = []
    for p in level:
      for _ in range(k):
        if len(parents) < n:
          nxt.append(len(parents))
          parents.append(p)
    level = nxt
  return Topology(tuple(parents))


def block_ratios(model, params, batch, topologies: dict, repeats, iters):
  """{name: median over repeats of (block seconds / 1-token step seconds)}.

  A block is [root, N nodes] with the tree's positions and ancestor mask,
  timed in ``timing.step_timer``'s jitted loop (the verifier's work of one
  tree iteration, no dispatch), each right after a 1-token step.
  """
  timer = lambda w, **kw: timing.step_timer(model, params, batch, w,
                                            encoder_len=24, min_iters=iters,
                                            **kw)
  loops = {k: timer(t.num_nodes + 1, depths=t.block_depths(),
                    mask=t.block_mask()) for k, t in topologies.items()}
  return timing.paired_ratios(loops, timer(1), repeats)


def decoder(method, pair, rows, temp, new, batch, **kw):
  """Compiles and returns ``run(seed) -> (seconds, [DecodeResult])`` over
  all ``rows`` in batches of ``batch`` (prompt widths padded alike)."""
  drafter, verifier, qp, pp = pair
  key = "inputs" if verifier.is_encoder_decoder else "prompts"
  width = max(len(r) for r in rows)
  chunks = [rows[i:i + batch] for i in range(0, len(rows), batch)]

  def run(seed):
    t = time.perf_counter()
    out = [decoding.generate(method, drafter, verifier, qp, pp,
                             sampling=decoding.Temperature(temp),
                             max_new_tokens=new, seeds=seed, eos_id=None,
                             pad_to=width, **{key: c}, **kw) for c in chunks]
    jax.block_until_ready([x.tokens for x in out])
    return time.perf_counter() - t, out

  run(0)  # compile
  return run


def paired(run, base, repeats):
  """Times ``base`` then ``run`` per repeat (seeds 1..repeats).

  Returns:
    dict: median seconds, tokens/s, speedup (median of base/run ratios),
    tokens_per_call over every repeat, ``row_tokens_per_call`` (each
    request's mean over repeats, in request order) and the standard error
    of their mean.
  """
  times, ratios, per_row, tokens, calls = [], [], [], 0, 0
  for r in range(repeats):
    tb, _ = base(r + 1)
    t, results = run(r + 1)
    times.append(t)
    ratios.append(tb / t)
    tokens += sum(int(x.lengths.sum()) for x in results)
    calls += sum(int(x.verifier_calls.sum()) for x in results)
    per_row.append(np.concatenate([x.lengths / np.maximum(
        x.verifier_calls, 1) for x in results]))  # [rows]
  med = statistics.median(times)
  rows = np.mean(per_row, axis=0)  # [rows]
  return dict(seconds=med, tokens_per_s=tokens / med,
              speedup=statistics.median(ratios),
              tokens_per_call=tokens / calls if calls else None,
              tokens_per_call_se=standard_error(rows),
              row_tokens_per_call=rows.tolist())


def standard_error(x) -> float:
  """Standard error of the mean of ``x`` (nan for fewer than 2 values)."""
  x = np.asarray(x, np.float64)
  return float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else (
      float("nan"))


def requests(pair, verifier, num, calib, seed=0):
  """(benchmark rows, calibration rows): held-out test prompts of a trained
  pair (calibration on the ones after the benchmark's), else random."""
  rows = getattr(pair, "prompts", None) or getattr(pair, "inputs", None)
  if rows is not None:
    if len(rows) < num + calib:
      raise ValueError(f"the pair has {len(rows)} test prompts; ask for at "
                       f"most {len(rows)} in --num_prompts + --calib_prompts")
    return [list(r) for r in rows[:num]], [list(r) for r in
                                           rows[num:num + calib]]
  rng = np.random.default_rng(seed)
  bos = [] if verifier.is_encoder_decoder else [2]
  make = lambda: bos + list(map(int, rng.integers(3, verifier.vocab_size,
                                                  size=24)))
  return [make() for _ in range(num)], [make() for _ in range(calib)]


def trees_for(n: int, karys, acceptance, proposal: str) -> dict:
  """{name: Tree} of size n: k-ary cuts and the planner's optimal tree."""
  out = {f"kary{k}-{n}": kary_cut(k, n) for k in karys if k >= 2}
  out[f"planner-{n}"] = planners.plan_tree(acceptance, max_nodes=n,
                                           max_depth=n).topology
  return {k: decoding.Tree(t, proposal) for k, t in out.items()}


def verdicts(rows, nodes) -> list[str]:
  """The TREE-VS-CHAIN and PLANNER-VS-HAND lines (first batch size)."""
  lines = []
  first = rows[0]["batch"] if rows else None
  keys = sorted({(r["pair"], r["temperature"]) for r in rows})
  for pair, temp in keys:
    sel = {r["method"]: r for r in rows if r["pair"] == pair and
           r["temperature"] == temp and r["batch"] == first}
    for n in nodes:
      chain = sel.get(f"chain-{n}")
      trees = {k: v for k, v in sel.items() if k.endswith(f"-{n}") and
               not k.startswith("chain")}
      if chain is None or not trees:
        continue
      best = max(trees, key=lambda k: trees[k]["tokens_per_call"])
      gain = trees[best]["tokens_per_call"] / chain["tokens_per_call"]
      lines.append(
          f"TREE-VS-CHAIN {pair} T={temp:g} N={n}: best tree {best} "
          f"{trees[best]['tokens_per_call']:.3f} tokens/call vs chain of {n}"
          f" {chain['tokens_per_call']:.3f} ({100 * (gain - 1):+.1f}%): "
          f"{'PASS' if gain >= GAIN else 'FAIL'} (goal >= "
          f"+{100 * (GAIN - 1):.0f}%)")
      hand = {k: v for k, v in trees.items() if not k.startswith("planner")}
      plan = trees.get(f"planner-{n}")
      if plan is None or not hand:
        continue
      top = max(hand, key=lambda k: hand[k]["tokens_per_call"])
      diff = plan["tokens_per_call"] - hand[top]["tokens_per_call"]
      # Paired over requests (same prompts and seeds for both trees).
      noise = 2 * standard_error(np.subtract(plan["row_tokens_per_call"],
                                             hand[top]["row_tokens_per_call"]))
      ok = diff >= -(0.0 if np.isnan(noise) else noise)
      lines.append(
          f"PLANNER-VS-HAND {pair} T={temp:g} N={n}: planner "
          f"{plan['tokens_per_call']:.3f} vs best hand-picked {top} "
          f"{hand[top]['tokens_per_call']:.3f} (diff {diff:+.3f}, noise = 2 "
          f"paired se {noise:.3f}): {'PASS' if ok else 'FAIL'}")
  return lines


def methods_for(args, pair, batch, temp, acceptance, meta) -> dict:
  """{name: generate kwargs} of one (batch, temperature): the chains, the
  trees of every size and, with ``--hw_plan``, plan-tree's choice."""
  drafter, verifier, qp, pp = pair
  nodes = args.nodes
  methods = {f"chain-{g}": dict(gamma=g) for g in sorted(
      set(args.gammas) | set(nodes))}
  for n in nodes:
    methods.update({k: dict(tree=t) for k, t in trees_for(
        n, args.kary, acceptance, args.proposal).items()})
  if args.hw_plan:
    costs = planners.measure_costs(
        drafter, verifier, qp, pp, batch=batch,
        widths=[1, 2, 4, 8, 16, 32, max(nodes) + 1], iters=args.iters,
        repeats=args.repeats)
    plan = planners.plan_tree(acceptance, costs, max(nodes), args.max_depth,
                              "catchup")  # SpecDecode's default sync
    methods["planner-hw"] = dict(tree=decoding.Tree(plan.topology,
                                                    args.proposal))
    meta["hw_plan"][f"b={batch} T={temp:g}"] = dict(
        parents=list(plan.topology.parents),
        predicted_speedup=plan.predicted_speedup,
        predicted_tokens_per_call=plan.tokens_per_call)
  return methods


def bench_pair(name, args) -> tuple[list, dict]:
  """Every row of one pair, and its calibration / block-cost metadata."""
  pair = load_pair(name)
  drafter, verifier, qp, pp = pair
  rows_in, calib = requests(pair, verifier, args.num_prompts,
                            args.calib_prompts)
  key = "inputs" if verifier.is_encoder_decoder else "prompts"
  spec = decoding.make_method("spec_decode")
  out, meta = [], dict(drafter_params=drafter.num_params(),
                       verifier_params=verifier.num_params(),
                       acceptance={}, block_over_step={}, hw_plan={})
  acceptance = {}
  for temp in args.temperatures:  # the planner's input, as plan-tree's
    acceptance[temp] = planners.calibrate(
        spec, drafter, verifier, qp, pp, **{key: calib},
        sampling=decoding.Temperature(temp), proposal=args.proposal,
        children=args.children, new_tokens=args.calib_tokens)
    meta["acceptance"][temp] = list(acceptance[temp])
  for batch in args.batches:
    shapes = {f"N={n}": kary_cut(2, n) for n in sorted(
        set(args.gammas) | set(args.nodes))}  # b(N) depends on N only
    costs = block_ratios(verifier, pp, batch, shapes, args.repeats,
                         args.iters)
    meta["block_over_step"][batch] = costs
    for temp in args.temperatures:
      base = decoder(decoding.TargetOnly(), pair, rows_in, temp,
                     args.new_tokens, batch)
      methods = methods_for(args, pair, batch, temp, acceptance[temp], meta)
      for mname, kw in methods.items():
        topo = kw["tree"].topology if "tree" in kw else Topology.chain(
            kw["gamma"])
        run = decoder(spec, pair, rows_in, temp, args.new_tokens, batch,
                      **kw)
        predicted = (1.0 + planners.expected_accepted(topo, acceptance[temp])
                     if "tree" in kw else None)
        out.append(dict(pair=name, batch=batch, temperature=temp,
                        method=mname, nodes=topo.num_nodes,
                        depth=topo.max_depth, children=topo.max_children,
                        parents=list(topo.parents),
                        **paired(run, base, args.repeats),
                        predicted_tokens_per_call=predicted,
                        block_over_step=costs.get(f"N={topo.num_nodes}")))
        print(json.dumps(out[-1]), flush=True)
      decoding.clear_compiled()
  return out, meta


def markdown(command, meta, rows, lines) -> str:
  """The .md report."""
  md = [f"# Tree benchmark\n", f"Command: `{command}`\n",
        f"Backend {meta['backend']} ({meta['cpu']}), jax {meta['jax']}. "
        f"Speedup: median over repeats of back-to-back ratios (target-only, "
        f"then the method). tokens/call: all repeats; +-: standard error "
        f"across requests. predicted: the planner's model (1 + E[accepted]) "
        f"with the calibrated per-rank acceptance. b(N): verifier block of "
        f"N + 1 tokens over a 1-token step (jitted loop).\n", "## Verdicts\n"]
  md += [f"- {ln}" for ln in lines] + [""]
  for name, m in meta["pairs"].items():
    md.append(f"## {name}: drafter {m['drafter_params'] / 1e6:.1f}M, "
              f"verifier {m['verifier_params'] / 1e6:.1f}M parameters\n")
    for t, a in m["acceptance"].items():
      md.append(f"- per-rank acceptance at T={t:g}: "
                + ", ".join(f"{x:.3f}" for x in a))
    for b, costs in m["block_over_step"].items():
      md.append(f"- b(N) at batch {b}: " + ", ".join(
          f"{k}: {v:.2f}" for k, v in sorted(
              costs.items(), key=lambda kv: int(kv[0][2:]))))
    md += ["", "| batch | T | method | nodes | depth | children | tokens/call"
           " | predicted | b(N) | tokens/s | speedup |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
      if r["pair"] != name:
        continue
      pred, b = r["predicted_tokens_per_call"], r["block_over_step"]
      md.append(
          f"| {r['batch']} | {r['temperature']:g} | {r['method']} | "
          f"{r['nodes']} | {r['depth']} | {r['children']} | "
          f"{r['tokens_per_call']:.3f} +- {r['tokens_per_call_se']:.3f} | "
          f"{'-' if pred is None else f'{pred:.3f}'} | "
          f"{'-' if b is None else f'{b:.2f}'} | "
          f"{r['tokens_per_s']:.1f} | {r['speedup']:.2f}x |")
    md.append("")
  return "\n".join(md) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ints = lambda s: [int(x) for x in s.split(",")]
  ap.add_argument("--pairs", default="default-t5,default-gemma,random-gemma")
  ap.add_argument("--out", default="benchmarks/results/bench_tree")
  ap.add_argument("--num_prompts", type=int, default=8)
  ap.add_argument("--new_tokens", type=int, default=48)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--gammas", type=ints, default=[3, 5, 7])
  ap.add_argument("--nodes", type=ints, default=[8, 16, 32])
  ap.add_argument("--kary", type=ints, default=[2, 3, 4])
  ap.add_argument("--temperatures", type=lambda s: [float(x) for x in
                                                    s.split(",")],
                  default=[0.0, 1.0])
  ap.add_argument("--batches", type=ints, default=[1, 8])
  ap.add_argument("--proposal", default="without_replacement")
  ap.add_argument("--children", type=int, default=8,
                  help="ranks calibrated (most children per node)")
  ap.add_argument("--calib_prompts", type=int, default=8)
  ap.add_argument("--calib_tokens", type=int, default=32)
  ap.add_argument("--max_depth", type=int, default=8,
                  help="depth bound of the hardware-aware plan")
  ap.add_argument("--iters", type=int, default=16,
                  help="steps per jitted block-cost loop")
  ap.add_argument("--hw_plan", type=int, default=1,
                  help="1: also run plan-tree's hardware-aware tree")
  args = ap.parse_args()
  command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
  rows, meta = [], dict(command=command, backend=jax.default_backend(),
                        cpu=platform.processor() or platform.machine(),
                        jax=jax.__version__, pairs={})
  for name in args.pairs.split(","):
    got, meta["pairs"][name] = bench_pair(name, args)
    rows += got
  lines = verdicts(rows, args.nodes)
  meta["verdicts"] = lines
  results_file.write_report(args.out, command=command,
                            markdown=markdown(command, meta, rows, lines),
                            rows=rows, meta=meta)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
