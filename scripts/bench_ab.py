"""Benchmark: the same decodes timed on two checkouts of specdec_jax (A/B).

Usage: python scripts/bench_ab.py --a /path/old --b . --out /tmp/ab

A refactor must not change speed. This times one fixed grid of decodes --
target-only, a chain (SpecDecode and a TokenV3 cascade), a 2x3 token tree
and the 3-level hierarchy of each default family, at batch 1 and 8, greedy
and T=1 -- through the public calls both checkouts share
(``decoding.generate`` / ``decoding.generate_hierarchy`` on
``eval.default_models``), each checkout in its own process, the processes
alternating A B A B ... (``--rounds``) so that drift in the machine's speed
hits both. Within a process every cell is compiled once, then timed
``--repeats`` times (median). The report gives each cell's tokens/s on A and
B, the per-round B/A ratios and their median, and whether the tokens of the
two checkouts are identical (they must be: same seeds, same request ids)
and whether each cell ran the same device program on both (a hash of the
lowered StableHLO, no debug info): a change to the host side of a call
keeps every program, so its B/A is the host time alone.

Internal mode (one process, one checkout): ``--worker PATH`` prints one
JSON line of {cell: {"tps": ..., "tokens": ...}}.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

FAMILIES = ("default-t5", "default-gemma")
CASES = ("target_only", "spec_decode_g5", "token_v3_g5", "tree_2x3",
         "hierarchy_3")
# Irregular trees (not in the default grid; --cases): the Sequoia 16-node
# trees the planner picks for each default family at T = 0
# (cost_model_structures' plan16), parents by node.
PLAN16 = {"default-gemma": (-1, -1, 0, 0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 9,
                            14),
          "default-t5": (-1, -1, -1, -1, -1, -1, 0, 0, 1, 6, 6, 7, 8, 9, 13,
                         14)}
CACHE = "specdec_jax_bench_ab_xla_cache"


def _cells(cases, batches, temperatures):
  return [(f, c, b, t) for f in FAMILIES for c in cases for b in batches
          for t in temperatures]


def _worker(path: str, cases, batches, temperatures, repeats: int,
            new_tokens: int) -> dict:
  """Times every cell with the checkout at ``path`` (imported first)."""
  sys.path.insert(0, os.path.abspath(path))
  import jax  # pylint: disable=g-import-not-at-top
  from specdec_jax import decoding  # pylint: disable=g-import-not-at-top
  from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
  assert os.path.abspath(decoding.__file__).startswith(
      os.path.abspath(path)), decoding.__file__
  out = {}
  pairs = {f: default_models.load_pair_for_benchmark(f, limit=8)
           for f in FAMILIES}
  seen = _record_programs(decoding)
  for fam, case, batch, temp in _cells(cases, batches, temperatures):
    bp = pairs[fam]
    q, p, qp, pp = bp
    rows = {k: v[:batch] for k, v in (("prompts", bp.prompts),
                                      ("inputs", bp.inputs)) if v}
    sampling = (decoding.Greedy() if temp == 0 else
                decoding.Temperature(float(temp)))
    common = dict(sampling=sampling, max_new_tokens=new_tokens,
                  seeds=list(range(batch)), eos_id=None, **rows)
    if case == "hierarchy_3":
      levels = bp.pair.levels()
      def call(levels=levels, common=common):
        return decoding.generate_hierarchy(levels, [4, 2][:len(levels) - 1],
                                           **common)
    else:
      name = {"target_only": "target_only", "drafter_only": "drafter_only",
              "tree_2x3": "spec_decode",
              "tree_plan16": "spec_decode", "spec_decode_g5": "spec_decode",
              "token_v3_g5": "token_v3"}[case]
      knobs = {"alpha": 0.3} if name == "token_v3" else {}
      method = decoding.make_method(name, **knobs)
      extra = ({"tree": decoding.Topology.kary(2, 3)} if case == "tree_2x3"
               else {"tree": decoding.Topology(PLAN16[fam])}
               if case == "tree_plan16" else {"gamma": 5})
      def call(method=method, common=common, extra=extra):
        return decoding.generate(method, q, p, qp, pp, **common, **extra)
    seen.clear()
    res = call()  # compile
    jax.block_until_ready(res.tokens)
    program = _program_hash(jax, seen)
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      res = call()
      jax.block_until_ready(res.tokens)
      times.append(time.perf_counter() - t0)
    toks = [list(map(int, r)) for r in res.sequences()]
    emitted = sum(len(r) for r in toks)
    print(f"{fam}|{case}|b{batch}|T{temp}", file=sys.stderr, flush=True)
    out[f"{fam}|{case}|b{batch}|T{temp}"] = {
        "tps": emitted / statistics.median(times), "tokens": toks,
        "program": program}
  return out


def round_order(r: int, a: str, b: str) -> tuple:
  """((side, checkout), ...) of round ``r``: A then B in even rounds, B
  then A in odd ones. On this machine the second process of a round ran
  slower (bench_ab on the same device program in both checkouts: B/A
  0.83-0.99, greedy_tree_children/bench_ab.md); alternating which goes
  first spreads that over both sides."""
  order = (("A", a), ("B", b))
  return order if r % 2 == 0 else order[::-1]


def _record_programs(decoding) -> list:
  """Wraps the checkout's ``api.run_program`` to record the (program,
  args) of each call; [] stays empty where the checkout has none."""
  seen = []
  api = getattr(decoding, "api", None)
  real = getattr(api, "run_program", None)
  if real is None:
    return seen

  def recording(program, args, mesh=None):
    seen.append((program, args))
    return real(program, args, mesh)
  api.run_program = recording
  return seen


def _program_hash(jax, seen) -> str | None:
  """sha256 (16 hex digits) of the lowered StableHLO (no debug info) of
  the programs a call ran; None when none was recorded or lowering
  failed."""
  if not seen:
    return None
  digest = hashlib.sha256()
  try:
    for program, args in seen:
      digest.update(jax.jit(program.__call__).lower(args).as_text().encode())
  except Exception:  # pylint: disable=broad-except  (a checkout's internals)
    return None
  return digest.hexdigest()[:16]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--a", help="checkout A (the baseline, e.g. before)")
  ap.add_argument("--b", default=".", help="checkout B (e.g. after)")
  ap.add_argument("--a_label", default="A")
  ap.add_argument("--b_label", default="B")
  ap.add_argument("--rounds", type=int, default=2)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--new_tokens", type=int, default=32)
  ap.add_argument("--cases", default=",".join(CASES))
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--temperatures", default="0,1")
  ap.add_argument("--out", help="write OUT.md and OUT.json")
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  batches = [int(x) for x in args.batches.split(",")]
  temps = [float(x) for x in args.temperatures.split(",")]
  cases = args.cases.split(",")
  known = CASES + ("tree_plan16", "drafter_only")
  if set(cases) - set(known):
    ap.error(f"--cases: unknown {sorted(set(cases) - set(known))}; choose "
             f"from {known}")
  if args.worker:
    print(json.dumps(_worker(args.worker, cases, batches, temps,
                             args.repeats, args.new_tokens)))
    return
  if not args.a or not args.out:
    ap.error("--a and --out are required")
  runs = {"A": [], "B": []}
  for r in range(args.rounds):
    for side, path in round_order(r, args.a, args.b):
      cmd = [sys.executable, os.path.abspath(__file__), "--worker", path,
             "--repeats", str(args.repeats), "--new_tokens",
             str(args.new_tokens), "--batches", args.batches,
             "--temperatures", args.temperatures, "--cases", args.cases]
      # Compiled programs persist between rounds (compile is excluded from
      # the timings anyway): only the first round of each side compiles.
      env = dict(os.environ, PYTHONPATH=os.path.abspath(path),
                 JAX_COMPILATION_CACHE_DIR=os.path.join(
                     tempfile.gettempdir(), CACHE, side),
                 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
      t0 = time.time()
      got = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE,
                           text=True, cwd=os.path.abspath(path))
      runs[side].append(json.loads(got.stdout.strip().splitlines()[-1]))
      print(f"round {r} {side} done in {time.time() - t0:.0f} s", flush=True)
  rows = []
  for key in runs["A"][0]:
    a = [run[key]["tps"] for run in runs["A"]]
    b = [run[key]["tps"] for run in runs["B"]]
    ratios = [y / x for x, y in zip(a, b)]
    same = all(run[key]["tokens"] == runs["A"][0][key]["tokens"]
               for run in runs["A"] + runs["B"])
    hashes = {run[key].get("program") for run in runs["A"] + runs["B"]}
    rows.append({"cell": key, "a_tps": statistics.median(a),
                 "b_tps": statistics.median(b), "ratios": ratios,
                 "ratio_median": statistics.median(ratios),
                 "a_ms": 1e3 * sum(map(len, runs["A"][0][key]["tokens"]))
                 / statistics.median(a),
                 "b_ms": 1e3 * sum(map(len, runs["B"][0][key]["tokens"]))
                 / statistics.median(b),
                 "tokens_identical": same,
                 "same_program": (None if None in hashes
                                  else len(hashes) == 1)})
  sys.path.insert(0, os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  from specdec_jax.eval import results_file  # pylint: disable=g-import-not-at-top
  meds = [r["ratio_median"] for r in rows]
  lines = [f"A = {args.a_label} ({args.a}), B = {args.b_label} ({args.b}); "
           f"{args.rounds} rounds (A first in even rounds, B first in odd "
           f"ones), {args.repeats} timed "
           f"repeats per cell per process (median), {args.new_tokens} new "
           f"tokens, EOS off; cases: {args.cases}.", "",
           f"Median over cells of B/A: {statistics.median(meds):.3f} "
           f"(min {min(meds):.3f}, max {max(meds):.3f}); tokens identical "
           f"in {sum(r['tokens_identical'] for r in rows)}/{len(rows)} "
           f"cells; same device program in "
           f"{sum(r['same_program'] is True for r in rows)}/{len(rows)}.",
           "", "| cell | A tok/s | B tok/s | A ms/call | B ms/call | B/A per "
           "round | B/A median | same tokens | same program |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['cell']} | {r['a_tps']:.1f} | {r['b_tps']:.1f} | "
                 f"{r['a_ms']:.2f} | {r['b_ms']:.2f} | "
                 + ", ".join(f"{x:.2f}" for x in r["ratios"])
                 + f" | {r['ratio_median']:.3f} | {r['tokens_identical']} | "
                 f"{r['same_program']} |")
  body = "# A/B: the same decodes on two checkouts\n\n" + "\n".join(lines)
  results_file.write_report(
      args.out, command="python " + " ".join(sys.argv), markdown=body,
      rows=rows, meta={"a": args.a, "b": args.b, "a_label": args.a_label,
                       "b_label": args.b_label})
  print("\n".join(lines))


if __name__ == "__main__":
  main()
