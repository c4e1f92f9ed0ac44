"""Benchmark: one decode-loop iteration, marginal, on a real decode state.

``bench_overhead.py`` splits whole decodes (two lengths) into fixed and
per-iteration parts and prices the model calls with each model timed
alone; its split is good to about +-15 points per cell. This one times the
loop body itself: the decode is prepared and its state initialised
(``program.init``: prefill, encode) exactly as ``decoding.decode`` does,
then ``program.body`` runs K and K + N times in a jitted ``fori_loop``
from that state, and the difference over N is one iteration (compile and
launch excluded; N is small enough that no row finishes). For chains the
same state also drives three models-only loops at the same shapes and
cache positions: the drafter's gamma one-token steps and the verifier's
(gamma + 1)-token block interleaved as the loop calls them, the drafter's
steps alone and the verifier's block alone. So

* interleaving = interleaved models - (drafter alone + verifier alone):
  what the two models cost more when they take turns (caches, weights
  evicted) than each timed alone, as bench_overhead prices them;
* loop's own = body - interleaved models: everything the iteration does
  besides the model calls (sampling, acceptance, emit, cache bookkeeping,
  conditionals, key derivations).

``--ab_env NAME`` times each cell in child processes with the environment
variable NAME set to 1 and unset, alternately for ``--rounds`` rounds (a
process-wide switch such as ``SPECDEC_JAX_ROLLED_THREEFRY`` cannot be
toggled inside one process), and reports the median of the per-round
ratios unset / set.

Usage:
  python scripts/bench_loop_body.py --out benchmarks/results/loop_body
  python scripts/bench_loop_body.py --ab_env SPECDEC_JAX_ROLLED_THREEFRY \\
      --out benchmarks/results/threefry_unrolled/loop_body
Writes <out>.json and <out>.md (command, machine and load average).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp

from specdec_jax import decoding, timing
from specdec_jax.decoding import request
from specdec_jax.decoding.rules import keys as keys_lib
from specdec_jax.eval import results_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable-next=g-import-not-at-top,wrong-import-position
from bench_overhead import load_pair, rows_of, structures  # noqa: E402


def prepared(pair, name: str, temp: float, batch: int, iters: int):
  """(program, args, state, topology) of one decode, its state after
  ``program.init``; room for ``iters`` iterations without a row ending."""
  method, kw, topo = structures(name)[name]
  structure = (decoding.Chain(kw["gamma"]) if "gamma" in kw
               else kw["tree"])
  drafter, verifier, qp, pp = pair
  strategy = decoding.Strategy(method, structure, decoding.Temperature(temp))
  models, params = request.check(strategy, [drafter, verifier], [qp, pp])
  req = request.prepare(strategy, verifier,
                        max_new_tokens=iters * (topo.max_depth + 1) + 8,
                        seeds=0, mesh=None, **rows_of(pair, verifier, batch))
  cfg = request.loop_config(strategy, verifier.vocab_size, max_new=req.max_new,
                            eos_id=None, pad_id=0, trace=False)
  batch_in = request.with_structure(req.batch, strategy, cfg)
  program = request.build_program(strategy, models, cfg)
  args = (params, batch_in)
  return program, args, jax.jit(program.init)(args), topo


def body_runner(program, args, state):
  """``run(n)``: n loop iterations from ``state`` (returns an array)."""
  loop = jax.jit(lambda a, s, n: jax.lax.fori_loop(
      0, n, lambda _, s: program.body(a, s), s).stream.num_out)
  return lambda n: loop(args, state, n)


def models_runner(pair, state, gamma: int, drafter_on: bool,
                  verifier_on: bool):
  """``run(n)``: n rounds of the chain's model calls on ``state``'s caches:
  gamma drafter steps (each fed a token that depends on the last logits)
  and/or one (gamma + 1)-token verifier block; the caches advance by one
  position per round, as an iteration that accepts nothing."""
  drafter, verifier, qp, pp = pair
  qc, pc = state.levels[0].cache, state.levels[1].cache
  tok = state.stream.pending  # [B]
  b = tok.shape[0]

  @jax.jit
  def loop(qp, pp, qc, pc, tok, n):
    def body(_, carry):
      qc, pc, acc = carry
      t = tok + jnp.isnan(acc).astype(tok.dtype)
      if drafter_on:
        start = qc.lengths
        for _ in range(gamma):
          logits, qc = drafter.step(qp, t[:, None], qc)  # [B, 1, V]
          t = t + (logits[:, 0, 0] > 1e30).astype(t.dtype)
          acc = acc + logits[:, 0, 0]
        qc = qc.with_lengths(start + 1)
      if verifier_on:
        logits, new = verifier.step(
            pp, jnp.broadcast_to(t[:, None], (b, gamma + 1)), pc)
        acc = acc + jnp.sum(logits[:, :, 0], -1)
        pc = new.with_lengths(pc.lengths + 1)
      return qc, pc, acc

    return jax.lax.fori_loop(0, n, body,
                             (qc, pc, jnp.zeros((b,), jnp.float32)))[2]

  return lambda n: loop(qp, pp, qc, pc, tok, n)


def marginal(run, warm: int, iters: int):
  """``timed() -> seconds per iteration``: (t(warm + iters) - t(warm)) /
  iters, both loops compiled first."""
  run(warm).block_until_ready()
  run(warm + iters).block_until_ready()

  def timed():
    t0 = time.perf_counter()
    run(warm).block_until_ready()
    t1 = time.perf_counter()
    run(warm + iters).block_until_ready()
    return ((time.perf_counter() - t1) - (t1 - t0)) / iters

  return timed


def cell(pair, name, temp, batch, args) -> dict:
  """{part: ms per iteration} of one cell (medians over repeats)."""
  program, pargs, state, topo = prepared(pair, name, temp, batch,
                                         args.warm + args.iters)
  runs = {"body": body_runner(program, pargs, state)}
  if topo.is_chain:
    g = topo.num_nodes
    runs["models"] = models_runner(pair, state, g, True, True)
    runs["drafter"] = models_runner(pair, state, g, True, False)
    runs["verifier"] = models_runner(pair, state, g, False, True)
  med = {k: 1e3 * v for k, v in timing.medians(
      {k: marginal(r, args.warm, args.iters) for k, r in runs.items()},
      args.repeats).items()}
  if topo.is_chain:
    alone = med["drafter"] + med["verifier"]
    med["interleaving"] = med["models"] - alone
    med["loop_own"] = med["body"] - med["models"]
    med["non_model_share"] = 1 - alone / med["body"]
    med["loop_own_share"] = med["loop_own"] / med["body"]
  return med


def measure(args) -> list[dict]:
  rows = []
  for pname in args.pairs.split(","):
    pair = load_pair(pname)
    for batch in map(int, args.batches.split(",")):
      for temp in map(float, args.temperatures.split(",")):
        for name in args.structures.split(","):
          ms = cell(pair, name, temp, batch, args)
          rows.append(dict(pair=pname, structure=name, batch=batch,
                           temperature=temp, unrolled=keys_lib.UNROLLED,
                           ms=ms))
          print(json.dumps(rows[-1]), flush=True)
    decoding.clear_compiled()
  return rows


def child_rows(argv, env_name: str, on: bool) -> list[dict]:
  """Rows of this script run in a child process with ``env_name`` set to 1
  (``on``) or unset."""
  env = dict(os.environ)
  env.pop(env_name, None)
  if on:
    env[env_name] = "1"
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "rows")
    subprocess.run([sys.executable, os.path.abspath(__file__), *argv,
                    "--out", out, "--ab_env", ""], env=env, check=True)
    with open(out + ".json") as f:
      return json.load(f)["rows"]


def ab(args, argv) -> list[dict]:
  """Per cell: body ms with the variable set and unset (medians over
  rounds) and the median of per-round ratios unset / set."""
  per = {}
  for r in range(args.rounds):
    for on in (True, False):
      for row in child_rows(argv, args.ab_env, on):
        key = (row["pair"], row["structure"], row["batch"],
               row["temperature"])
        per.setdefault(key, {True: [], False: []})[on].append(row["ms"])
      print(f"round {r + 1}/{args.rounds} {args.ab_env}="
            f"{'1' if on else 'unset'} done", flush=True)
  rows = []
  for (pname, name, batch, temp), sides in per.items():
    ratios = [u["body"] / s["body"] for s, u in zip(sides[True],
                                                     sides[False])]
    med = lambda side, k: statistics.median(m[k] for m in side)
    rows.append(dict(
        pair=pname, structure=name, batch=batch, temperature=temp,
        set_ms={k: med(sides[True], k) for k in sides[True][0]},
        unset_ms={k: med(sides[False], k) for k in sides[False][0]},
        unset_over_set=statistics.median(ratios), ratios=ratios))
  return rows


def _split(ms: dict) -> str:
  if "loop_own" not in ms:
    return "- | - | - | -"
  return (f"{ms['models']:.3f} | {ms['drafter'] + ms['verifier']:.3f} | "
          f"{ms['loop_own']:.3f} ({ms['loop_own_share']:.0%}) | "
          f"{ms['non_model_share']:.0%}")


def markdown(args, rows) -> str:
  head = ["# One loop iteration, marginal, on a real decode state\n",
          "ms per iteration (medians). body: `program.body` K + N vs K "
          "times from the decode's initial state. Chains: models = the "
          "drafter's gamma steps and the verifier's block interleaved, "
          "alone = each timed alone (summed); loop's own = body - models "
          "(share of body); non-model vs alone = 1 - alone / body (what "
          "bench_overhead calls the non-model share).\n"]
  if args.ab_env:
    head.append(f"A/B: {args.rounds} rounds of child processes, "
                f"`{args.ab_env}=1` then unset; ratio = median of the "
                f"per-round body ratios unset / set.\n")
    lines = ["| pair | structure | batch | T | body ms (set) | body ms "
             "(unset) | unset / set | models | alone | loop's own | non-"
             "model vs alone (set) | models | alone | loop's own | non-model"
             " vs alone (unset) |", "|---" * 15 + "|"]
    for r in rows:
      lines.append(
          f"| {r['pair']} | {r['structure']} | {r['batch']} | "
          f"{r['temperature']:g} | {r['set_ms']['body']:.3f} | "
          f"{r['unset_ms']['body']:.3f} | {r['unset_over_set']:.3f} | "
          f"{_split(r['set_ms'])} | {_split(r['unset_ms'])} |")
  else:
    lines = ["| pair | structure | batch | T | body | models | alone | "
             "loop's own | non-model vs alone |", "|---" * 9 + "|"]
    for r in rows:
      lines.append(f"| {r['pair']} | {r['structure']} | {r['batch']} | "
                   f"{r['temperature']:g} | {r['ms']['body']:.3f} | "
                   f"{_split(r['ms'])} |")
  return "\n".join(head + lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pairs", default="default-t5,default-gemma,random-gemma")
  ap.add_argument("--structures", default="chain3,tree2x3")
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--temperatures", default="0,1")
  ap.add_argument("--warm", type=int, default=8)
  ap.add_argument("--iters", type=int, default=24)
  ap.add_argument("--repeats", type=int, default=9)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--ab_env", default="")
  ap.add_argument("--out", default="benchmarks/results/loop_body")
  argv = sys.argv[1:]
  args = ap.parse_args(argv)
  for name in args.structures.split(","):
    if name in ("target", "drafter"):
      raise ValueError(f"--structures: {name!r} has no draft loop body to "
                       f"time here; use chainG or treeKxD")
  if args.ab_env:
    child = [a for i, a in enumerate(argv) if not (
        a.startswith(("--out", "--ab_env")) or
        (i and argv[i - 1] in ("--out", "--ab_env")))]
    rows = ab(args, child)
  else:
    rows = measure(args)
  command = "python scripts/bench_loop_body.py " + " ".join(
      shlex.quote(a) for a in argv)
  results_file.write_report(args.out, command=command,
                            markdown=markdown(args, rows), rows=rows)
  print(markdown(args, rows))


if __name__ == "__main__":
  main()
