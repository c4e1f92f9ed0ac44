"""Benchmark: where every microsecond of a decode goes.

For each pair, structure (target-only, drafter-only, chain gamma, token
tree), batch size and temperature this splits the wall time of one
``decoding.generate`` call (compile excluded) into

* a FIXED part per call (host prep, transfers, encode, prefill, result
  copy) and a PER-ITERATION part: each call is timed at ``--new_tokens``
  and at ``--short_tokens`` new tokens (back to back, medians over
  repeats); per iteration = the time difference over the difference in loop
  iterations (verifier calls; drafter calls for drafter-only), fixed = the
  short call's time minus its iterations' share;
* per iteration, MODEL CALLS -- each model's call timed alone at the same
  shapes (batch, block width, tree mask) in ``timing.step_timer``'s jitted
  loop, times its measured calls per iteration -- and EVERYTHING ELSE;
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
import json
import os
import shlex
import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding, timing
from specdec_jax.decoding.loops import program as program_lib
from specdec_jax.decoding.rules import sampling as sampling_lib
from specdec_jax.decoding.rules.targets import SpecDecode
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


class Variant:
  """The compiled decode programs of one ``sampling.LEAN`` setting.

  Entering installs the setting and this variant's compiled programs (so
  the lean and the reference loops can be timed alternately in one run);
  leaving keeps what was compiled meanwhile.
  """

  def __init__(self, lean: bool):
    self.lean, self.cache = lean, {}

  def __enter__(self):
    sampling_lib.LEAN = self.lean
    program_lib._COMPILED.clear()  # pylint: disable=protected-access
    program_lib._COMPILED.update(self.cache)  # pylint: disable=protected-access
    return self

  def __exit__(self, *exc):
    self.cache = dict(program_lib._COMPILED)  # pylint: disable=protected-access


def split_call(name, method, kw, pair, temp, batch, new, short, repeats,
               variants):
  """{lean: {fixed_ms, per_iter_ms, iters, calls per iteration, tokens/s}},
  the variants timed alternately (each repeat: every variant short, long)."""
  drafter, verifier, qp, pp = pair
  req = rows_of(pair, verifier, batch)

  def run(n):
    return timing.wall(lambda: decoding.generate(
        method, drafter, verifier, qp, pp, sampling=decoding.Temperature(temp),
        max_new_tokens=n, seeds=1, eos_id=None, **kw, **req))

  first = {}
  for v in variants:  # compile both lengths
    with v:
      first[v.lean] = run(new)[1], run(short)[1]
  ref = first[variants[0].lean]
  for v in variants[1:]:
    if first[v.lean][0].sequences() != ref[0].sequences():
      raise AssertionError(f"{name}: lean={v.lean} changed the tokens")
  it_long, it_short = iterations(name, ref[0]), iterations(name, ref[1])
  if it_long <= it_short:
    raise ValueError(f"{name}: {new} and {short} new tokens took the same "
                     f"number of iterations ({it_long}); widen the gap")
  per, fixed, total = ({v.lean: [] for v in variants} for _ in range(3))
  for _ in range(repeats):
    for v in variants:
      with v:
        t_short, _ = run(short)
        t_long, _ = run(new)
      p = (t_long - t_short) / (it_long - it_short)
      per[v.lean].append(p)
      fixed[v.lean].append(t_short - it_short * p)
      total[v.lean].append(t_long)
  res, iters = ref[0], max(it_long, 1)
  return {lean: dict(
      fixed_ms=1e3 * statistics.median(fixed[lean]),
      per_iter_ms=1e3 * statistics.median(per[lean]), iters=it_long,
      total_ms=1e3 * statistics.median(total[lean]),
      tokens_per_s=float(res.lengths.sum()) / statistics.median(total[lean]),
      tokens_per_iter=float(np.mean(res.lengths)) / iters,
      drafter_calls_per_iter=float(np.mean(res.drafter_calls)) / iters,
      verifier_calls_per_iter=float(np.mean(res.verifier_calls)) / iters)
          for lean in per}


def model_ms(name, topo, pair, batch, split, repeats, enc_len):
  """{level: ms per iteration} of the model calls, each timed alone."""
  drafter, verifier, qp, pp = pair
  timer = lambda m, p, w, **kw: timing.step_timer(
      m, p, batch, w, encoder_len=enc_len, **kw)
  timers, weights = {}, {}
  if name == "target":
    timers["verifier"], weights["verifier"] = timer(verifier, pp, 1), 1.0
  elif name == "drafter":
    timers["drafter"], weights["drafter"] = timer(drafter, qp, 1), 1.0
  else:
    timers["drafter"] = timer(drafter, qp, 1)
    weights["drafter"] = split["drafter_calls_per_iter"]
    if topo.is_chain:
      timers["verifier"] = timer(verifier, pp, topo.num_nodes + 1)
    else:
      timers["verifier"] = timer(verifier, pp, topo.num_nodes + 1,
                                 depths=topo.block_depths(),
                                 mask=topo.block_mask())
    weights["verifier"] = 1.0
  med = timing.medians(timers, repeats)
  return {k: 1e3 * med[k] * weights[k] for k in timers}


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
           "iteration (two lengths, back to back, medians). Per iteration: "
           "model calls (each timed alone at the same shapes in a jitted "
           "loop, times calls per iteration) and the rest; named pieces are "
           "timed alone at the same shapes (ms per iteration). Non-model "
           "share = 1 - model / per-iteration.\n",
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
  ap.add_argument("--repeats", type=int, default=3)
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
    req = rows_of(pair, verifier, 1)
    enc_len = len(req["inputs"][0]) if "inputs" in req else 16
    for batch in map(int, args.batches.split(",")):
      for temp in map(float, args.temperatures.split(",")):
        for name, (method, kw, topo) in structures(args.structures).items():
          variants = [Variant(x == "lean") for x in args.variants.split(",")]
          split = split_call(name, method, kw, pair, temp, batch,
                             args.new_tokens, args.short_tokens, args.repeats,
                             variants)
          for v in variants:
            sampling_lib.LEAN = v.lean
            row = dict(pair=pname, structure=name, batch=batch,
                       temperature=temp, lean=v.lean, **split[v.lean],
                       model_ms=model_ms(name, topo, pair, batch,
                                         split[v.lean], args.repeats,
                                         enc_len),
                       pieces_ms=piece_ms(name, topo, verifier.vocab_size,
                                          batch, temp, args.repeats),
                       load_average=timing.load_average())
            rows.append(row)
            print(json.dumps(row), flush=True)
          program_lib._COMPILED.clear()  # pylint: disable=protected-access
          sampling_lib.LEAN = True
        decoding.clear_compiled()
  results_file.write_report(args.out, command=command,
                            markdown=markdown(command, rows), rows=rows)
  print(markdown(command, rows))


if __name__ == "__main__":
  main()
