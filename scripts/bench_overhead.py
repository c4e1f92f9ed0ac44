"""Benchmark: where every microsecond of a decode goes.

For each pair, structure (target-only, drafter-only, chain gamma, token
tree), batch size and temperature this splits the wall time of one
``decoding.generate`` call (compile excluded) into

* a FIXED part per call (host prep, transfers, encode, prefill, result
  copy) and a PER-ITERATION part: each call is timed at ``--new_tokens``
  and at ``--short_tokens`` new tokens (medians over repeats); per
  iteration = the time difference over the difference in loop
  iterations (verifier calls; drafter calls for drafter-only), fixed = the
  short call's time minus its iterations' share;
* per iteration, MODEL CALLS -- each model's call timed alone at the same
  shapes (batch, block width, tree mask, and the cache slots and encoder
  width each of the two decodes allocated, recorded while they are traced)
  in ``timing.step_timer``'s jitted loop; the model share of an iteration
  is the difference of the two calls' model times (calls x step at that
  call's capacity) over the difference in iterations, exactly as the
  wall-time split -- and EVERYTHING ELSE. Each repeat runs every decode
  (both variants, both lengths) and every step timer of the cell in turn;
* named non-model pieces, each timed alone at the same shapes in a jitted
  loop (``timing.fn_timer``): the loop's softmaxes (unscaled q and p and the
  transformed S(q), S(p) over [B, gamma + 1, V], the drafter's per-draft
  S(q) over [B, V]), the drafter's draws and the chain acceptance kernel
  (``verify_block``: accept test, residual and bonus draws). What remains
  (emit, cache bookkeeping, conds, the while loop, copies) is reported as
  ``rest``.

Usage:
  python scripts/bench_overhead.py --out benchmarks/results/overhead
Writes <out>.json and <out>.md (command, machine and load average included).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding, timing
from specdec_jax.decoding.loops import state as state_lib
from specdec_jax.decoding.loops import tree_drafting
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.rules.targets import SpecDecode
from specdec_jax.decoding.verify import tree as tree_lib
from specdec_jax.decoding.verify.chain import verify_block
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bench_decode import load_pair  # noqa: E402

Topology = decoding.Topology


def structures(names: str) -> dict:
  """{name: (method, generate kwargs, verifier block Topology | None)}."""
  out = {}
  for name in names.split(","):
    if name == "target":
      out[name] = (decoding.TargetOnly(), {}, None)
    elif name == "drafter":
      out[name] = (decoding.DrafterOnly(), {}, None)
    elif name.startswith("chain"):
      g = int(name[5:])
      out[name] = (decoding.make_method("spec_decode"), dict(gamma=g),
                   Topology.chain(g))
    elif name.startswith("tree"):
      k, d = map(int, name[4:].split("x"))
      t = Topology.kary(k, d)
      out[name] = (decoding.make_method("spec_decode"),
                   dict(tree=decoding.Tree(t)), t)
    else:
      raise ValueError(f"unknown structure {name!r}: use target, drafter, "
                       f"chainG (e.g. chain3) or treeKxD (e.g. tree2x3)")
  return out


def rows_of(pair, verifier, batch: int):
  """Generate kwargs for ``batch`` requests (the pair's test prompts, else
  random 24-token prompts)."""
  for key in ("prompts", "inputs"):
    rows = getattr(pair, key, None)
    if rows is not None:
      return {key: [list(r) for r in rows[:batch]]}
  rng = np.random.default_rng(0)
  seqs = [list(map(int, rng.integers(3, verifier.vocab_size, 24)))
          for _ in range(batch)]
  return ({"inputs": seqs} if verifier.is_encoder_decoder
          else {"prompts": [[2] + s for s in seqs]})


def iterations(name: str, res) -> int:
  """Loop iterations of one call (the slowest row sets the count)."""
  calls = res.drafter_calls if name == "drafter" else res.verifier_calls
  return int(np.max(calls))


@contextlib.contextmanager
def cache_shapes(models):
  """Records the caches that decodes traced inside the block allocate.

  Yields a dict, filled as tracing goes: {level: (slots, encoder width or
  None)} for each of ``models`` (level = its index in ``models``) whose
  cache ``state_lib.start_cache`` allocated. A decode that was already
  compiled traces nothing and records nothing.
  """
  seen, orig = {}, state_lib.start_cache

  def start_cache(model, params, batch, capacity_):
    for level, m in enumerate(models):
      if m is model:
        enc = None if batch.inputs is None else int(batch.inputs.shape[1])
        seen[level] = (int(capacity_), enc)
    return orig(model, params, batch, capacity_)

  state_lib.start_cache = start_cache
  try:
    yield seen
  finally:
    state_lib.start_cache = orig


class Variant:
  """One ``sampling.LEAN`` setting, installed while entered (its decode
  programs are compiled and cached apart: ``LoopProgram`` keys carry the
  setting), so the lean and the reference loops can be timed alternately
  in one run.
  """

  def __init__(self, lean: bool):
    self.lean = lean

  def __enter__(self):
    sampling_lib.LEAN = self.lean
    return self

  def __exit__(self, *exc):
    sampling_lib.LEAN = True


def split_call(name, method, kw, topo, pair, temp, batch, new, short,
               repeats, variants):
  """Times one cell: {lean: {fixed_ms, per_iter_ms, model_ms, iters, ...}}.

  Each repeat runs, in turn, every variant's short and long decode and each
  model step alone at each decode's cache shapes (``step_timers``), so a
  machine that drifts moves every number of the cell together; medians.
  """
  drafter, verifier, qp, pp = pair
  req = rows_of(pair, verifier, batch)

  def run(n):
    return timing.wall(lambda: decoding.generate(
        method, drafter, verifier, qp, pp, sampling=decoding.Temperature(temp),
        max_new_tokens=n, seeds=1, eos_id=None, **kw, **req))

  first, shapes = {}, {}
  for v in variants:  # compile both lengths (and record their caches)
    with v:
      with cache_shapes((drafter, verifier)) as long_shapes:
        res_long = run(new)[1]
      with cache_shapes((drafter, verifier)) as short_shapes:
        res_short = run(short)[1]
      first[v.lean] = res_long, res_short
      shapes = shapes or {"long": long_shapes, "short": short_shapes}
  ref = first[variants[0].lean]
  for v in variants[1:]:
    if first[v.lean][0].sequences() != ref[0].sequences():
      raise AssertionError(f"{name}: lean={v.lean} changed the tokens")
  it_long, it_short = iterations(name, ref[0]), iterations(name, ref[1])
  if it_long <= it_short:
    raise ValueError(f"{name}: {new} and {short} new tokens took the same "
                     f"number of iterations ({it_long}); widen the gap")

  def decode_timer(v, n):
    def timed():
      with v:
        return run(n)[0]
    return timed

  timers = {}
  for v in variants:
    timers[v.lean, "short"] = decode_timer(v, short)
    timers[v.lean, "long"] = decode_timer(v, new)
  steps = step_timers(name, topo, pair, batch, shapes)
  timers.update(steps)
  med = timing.medians(timers, repeats)
  calls = {"long": model_calls(ref[0]), "short": model_calls(ref[1])}
  gap = it_long - it_short
  its = {"long": it_long, "short": it_short}
  price = lambda lvl, call: model_seconds(name, topo, drafter, lvl, call,
                                          calls, its, med)
  model = {lvl: 1e3 * (price(lvl, "long") - price(lvl, "short")) / gap
           for lvl in dict.fromkeys(k[0] for k in steps)}
  res, iters = ref[0], max(it_long, 1)
  out = {}
  for v in variants:
    t_long, t_short = med[v.lean, "long"], med[v.lean, "short"]
    per = (t_long - t_short) / gap
    out[v.lean] = dict(
        fixed_ms=1e3 * (t_short - it_short * per), per_iter_ms=1e3 * per,
        iters=it_long, total_ms=1e3 * t_long,
        tokens_per_s=float(res.lengths.sum()) / t_long,
        tokens_per_iter=float(np.mean(res.lengths)) / iters,
        drafter_calls_per_iter=float(np.mean(res.drafter_calls)) / iters,
        verifier_calls_per_iter=float(np.mean(res.verifier_calls)) / iters,
        model_ms=model, calls=calls, iters_short=it_short,
        cache_slots={call: {lvl: list(x) for lvl, x in sh.items()}
                     for call, sh in shapes.items()})
  return out


def model_calls(res) -> dict:
  """{level name: calls} of one decode (the slowest row: every loop
  iteration runs the model for all rows)."""
  return {"drafter": int(np.max(res.drafter_calls)),
          "verifier": int(np.max(res.verifier_calls))}


def tree_feeds(topo, drafter) -> tuple[int, ...]:
  """Tokens of each level call the tree drafter makes per iteration (the
  catch-up sync of a lossless tree: calls k = 0 .. D - 1)."""
  return tree_lib.tree_feed_widths(
      topo, tree_drafting.incremental_drafting(drafter))[:topo.max_depth]


def step_timers(name, topo, pair, batch, shapes) -> dict:
  """{(level, 'long' | 'short', width): timer} of each model step the
  structure runs, alone, at the cache slots (and encoder width) that decode
  allocated (``timing.step_timer``, 0.05 s loops). A tree's drafter is
  timed at the width of each of its level calls (siblings at one depth,
  each seeing itself and the cache), the other calls at width 1.
  """
  drafter, verifier, qp, pp = pair
  levels = {"drafter": (0, drafter, qp), "verifier": (1, verifier, pp)}
  runs = (["verifier"] if name == "target" else
          ["drafter"] if name == "drafter" else ["drafter", "verifier"])
  timers = {}
  for lvl in runs:
    idx, model, params = levels[lvl]
    blocks = [(1, {})]
    if lvl == "verifier" and name != "target":
      kw = ({} if topo.is_chain else
            dict(depths=topo.block_depths(), mask=topo.block_mask()))
      blocks = [(topo.num_nodes + 1, kw)]
    elif lvl == "drafter" and topo is not None and not topo.is_chain:
      blocks += [(w, dict(depths=np.zeros(w, np.int32),
                          mask=np.eye(w, dtype=bool)))
                 for w in sorted(set(tree_feeds(topo, drafter)) - {1})]
    for call in ("long", "short"):
      slots, enc = shapes[call][idx]
      for width, kw in blocks:
        timers[lvl, call, width] = timing.step_timer(
            model, params, batch, width, context=1, capacity=slots,
            encoder_len=enc or 16, min_seconds=0.05, **kw)
  return timers


def model_seconds(name, topo, drafter, lvl, call, calls, iters, med) -> float:
  """Seconds of ``lvl``'s model calls in one decode: its calls priced at
  their widths (a tree's drafter: its level calls every iteration, the rest
  -- catch-up feeds -- as one-token steps)."""
  n = calls[call][lvl]
  if lvl != "drafter" or topo is None or topo.is_chain:
    width = 1 if lvl == "drafter" or name == "target" else topo.num_nodes + 1
    return n * med[lvl, call, width]
  feeds = tree_feeds(topo, drafter)
  levels = iters[call] * sum(med[lvl, call, w] for w in feeds)
  return levels + max(0, n - len(feeds) * iters[call]) * med[lvl, call, 1]


def piece_ms(name, topo, vocab, batch, temp, repeats):
  """{piece: ms per iteration} of named non-model work, timed alone."""
  strategy = sampling_lib.canonical(decoding.Temperature(temp))
  key = jax.random.key(0)
  keys = jax.random.split(key, batch)
  one = jax.random.normal(key, (batch, vocab), jnp.float32) * 3
  if name in ("target", "drafter"):
    timers = {
        "softmaxes": timing.fn_timer(
            lambda l: (strategy.probs(l), jnp.max(sampling_lib.unscaled(l),
                                                  -1)), one),
        "sampling": timing.fn_timer(
            lambda l: sampling_lib.sample(keys, strategy.probs(l)), one)}
    return {k: 1e3 * v for k, v in timing.medians(timers, repeats).items()}
  g = topo.num_nodes
  blk = jax.random.normal(key, (batch, g + 1, vocab), jnp.float32) * 3
  drafts = jnp.zeros((batch, g), jnp.int32)
  u = jax.random.uniform(key, (batch, g))

  def softmaxes(q_l, p_l):
    return (sampling_lib.unscaled(q_l), sampling_lib.unscaled(p_l),
            strategy.probs(q_l), strategy.probs(p_l))

  def accept(q_l, p_l):
    q, p, sq, sp = softmaxes(q_l, p_l)
    return verify_block(SpecDecode(), drafts, q, p, sq, sp, u, keys,
                        keys).token

  timers = {
      "softmaxes (verify)": timing.fn_timer(softmaxes, blk, blk),
      "draft S(q) + draw x gamma": timing.fn_timer(
          lambda l: jax.vmap(lambda x: sampling_lib.sample(
              keys, strategy.probs(x)), 1)(l), blk[:, :g]),
  }
  if topo.is_chain:
    timers["softmaxes + acceptance"] = timing.fn_timer(accept, blk, blk)
  out = {k: 1e3 * v for k, v in timing.medians(timers, repeats).items()}
  if "softmaxes + acceptance" in out:
    out["acceptance (kernel)"] = max(0.0, out.pop(
        "softmaxes + acceptance") - out["softmaxes (verify)"])
  return out


def markdown(command, rows) -> str:
  lines = ["# Where a decode's time goes\n",
           f"Command: `{command}`\n",
           "Per call: wall ms of one `generate` call at the long length "
           "(compile excluded), split into fixed ms per call and ms per loop "
           "iteration (two lengths, medians). Per iteration: model calls "
           "(each timed alone in a jitted loop at the same shapes, cache "
           "slots and encoder width as each decode, times its calls; the "
           "same long-minus-short difference) and the rest. Every decode and "
           "step timer of a cell runs in one round-robin per repeat; both "
           "variants share the model timings. Named pieces are timed alone "
           "at the same shapes (ms per iteration). Non-model share = 1 - "
           "model / per-iteration.\n",
           "| pair | structure | batch | T | lean | total ms | fixed ms | iters | "
           "per-iter ms | model ms | non-model ms (share) | tokens/iter | "
           "named pieces (ms) |", "|---|---|---|---|---|---|---|---|---|---|"
           "---|---|---|"]
  for r in rows:
    model = sum(r["model_ms"].values())
    rest = r["per_iter_ms"] - model
    pieces = ", ".join(f"{k} {v:.3f}" for k, v in r["pieces_ms"].items())
    lines.append(
        f"| {r['pair']} | {r['structure']} | {r['batch']} | "
        f"{r['temperature']:g} | {'yes' if r['lean'] else 'no'} | "
        f"{r['total_ms']:.1f} | {r['fixed_ms']:.1f} | "
        f"{r['iters']} | {r['per_iter_ms']:.3f} | {model:.3f} | {rest:.3f} "
        f"({rest / r['per_iter_ms']:.0%}) | {r['tokens_per_iter']:.2f} | "
        f"{pieces} |")
  pairs = {}
  for r in rows:
    key = (r["pair"], r["structure"], r["batch"], r["temperature"])
    pairs.setdefault(key, {})[r["lean"]] = r
  both = {k: v for k, v in pairs.items() if len(v) == 2}
  if both:
    lines += ["", "## Before / after (reference loop vs lean loop, same run, "
              "timed alternately, tokens identical)\n",
              "| pair | structure | batch | T | per-iter ms before | after | "
              "after/before | total ms before | after | after/before |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for (pair, name, batch, temp), v in both.items():
      a, b = v[False], v[True]
      lines.append(
          f"| {pair} | {name} | {batch} | {temp:g} | {a['per_iter_ms']:.3f} "
          f"| {b['per_iter_ms']:.3f} | "
          f"{b['per_iter_ms'] / a['per_iter_ms']:.2f} | {a['total_ms']:.1f} | "
          f"{b['total_ms']:.1f} | {b['total_ms'] / a['total_ms']:.2f} |")
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pairs", default="random-gemma,default-t5,default-gemma")
  ap.add_argument("--structures",
                  default="target,drafter,chain1,chain3,chain5,tree2x3")
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--temperatures", default="0,1")
  ap.add_argument("--new_tokens", type=int, default=64)
  ap.add_argument("--short_tokens", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--variants", default="lean",
                  help="'reference,lean': time the reference (sampling.LEAN "
                  "= False) and the lean loops alternately, tokens checked "
                  "identical")
  ap.add_argument("--out", default="benchmarks/results/overhead")
  args = ap.parse_args()
  command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
  rows = []
  for pname in args.pairs.split(","):
    pair = load_pair(pname)
    drafter, verifier, _, _ = pair
    for batch in map(int, args.batches.split(",")):
      for temp in map(float, args.temperatures.split(",")):
        for name, (method, kw, topo) in structures(args.structures).items():
          variants = [Variant(x == "lean") for x in args.variants.split(",")]
          split = split_call(name, method, kw, topo, pair, temp, batch,
                             args.new_tokens, args.short_tokens, args.repeats,
                             variants)
          for v in variants:
            sampling_lib.LEAN = v.lean
            row = dict(pair=pname, structure=name, batch=batch,
                       temperature=temp, lean=v.lean, **split[v.lean],
                       pieces_ms=piece_ms(name, topo, verifier.vocab_size,
                                          batch, temp, args.repeats),
                       load_average=timing.load_average())
            rows.append(row)
            print(json.dumps(row), flush=True)
          sampling_lib.LEAN = True
        decoding.clear_compiled()
  results_file.write_report(args.out, command=command,
                            markdown=markdown(command, rows), rows=rows)
  print(markdown(command, rows))


if __name__ == "__main__":
  main()
