r"""First and second invocation wall times of the CLI, before vs after.

    python scripts/bench_cli_latency.py --before=/path/to/old/checkout \
        --after=. --modes=decode,eval --repeats=3 \
        --out=benchmarks/results/cli_latency.json

(without ``--before``: the ``--after`` checkout alone).

For each checkout (source tree with gin/ and specdec_jax/; imported by
putting it first on PYTHONPATH) and each mode, a fresh compilation cache
directory: the "first" run fills it, then the "second" run is repeated
``--repeats`` times (a fresh OUTPUT_DIR each time, so nothing is resumed).
Checkouts alternate per repeat (before, after, before, ...) so both see the
same load. Each run's wall time is of the whole process (imports included);
``/proc/loadavg`` is recorded per run. Decode rows' tokens must be the same
in every run of both checkouts (the script fails otherwise).

Modes: ``decode`` (one 13-token request on the built-in T5 pair), ``eval``
(``runs/eval.gin`` + the built-in T5 pair, ``--num_examples=1``, the sweep
``--eval_sweep``), ``main`` (``specdec_jax main --num_examples=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REQUEST = {"inputs": "def add(a, b):\n    return a + b"}
PAIR = "pairs/default_t5_codegen.gin"


def _args(mode: str, work: str, sweep: str) -> list[str]:
  out = os.path.join(work, "out")
  if mode == "decode":
    return ["decode", "--gin_file=runs/decode.gin", f"--gin_file={PAIR}",
            f"--gin.INPUT_FILE='{os.path.join(work, 'req.jsonl')}'",
            f"--gin.OUTPUT_DIR='{out}'"]
  if mode == "eval":
    return ["eval", "--gin_file=runs/eval.gin", f"--gin_file={PAIR}",
            "--num_examples=1", f"--gin.SWEEP='{sweep}'",
            f"--gin.OUTPUT_DIR='{out}'"]
  if mode == "main":
    return ["main", "--num_examples=1", f"--gin.main_job_spec.output_dir="
            f"'{out}'"]
  raise ValueError(f"unknown mode {mode!r}")


def run_once(tree: str, mode: str, cache: str, sweep: str,
             timeout: float) -> dict:
  """One CLI process; returns its wall time, load and decoded tokens."""
  work = tempfile.mkdtemp(prefix="cli_latency_")
  with open(os.path.join(work, "req.jsonl"), "w") as f:
    f.write(json.dumps(REQUEST) + "\n")
  env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu",
             TF_CPP_MIN_LOG_LEVEL="2")
  cmd = [sys.executable, "-m", "specdec_jax.main",
         *_args(mode, work, sweep), f"--compilation_cache_dir={cache}"]
  load = open("/proc/loadavg").read().split()[0]
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True,
                        text=True, timeout=timeout, check=False)
  wall = time.perf_counter() - t0
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
  tokens = None
  if mode == "decode":
    with open(os.path.join(work, "out", "decodes.jsonl")) as f:
      tokens = [json.loads(line)["tokens"] for line in f]
  summary = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:]
  shutil.rmtree(work, ignore_errors=True)
  return dict(wall_s=round(wall, 2), load=float(load), tokens=tokens,
              summary=summary[0] if summary else "")


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--before", default=None,
                  help="the old checkout (omit: time --after alone)")
  ap.add_argument("--after", required=True)
  ap.add_argument("--modes", default="decode")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--eval_sweep", default="configs/sweeps.py:paper_t5")
  ap.add_argument("--timeout", type=float, default=3600)
  ap.add_argument("--out", default=None)
  args = ap.parse_args(argv)
  trees = {"after": os.path.abspath(args.after)}
  if args.before:
    trees = {"before": os.path.abspath(args.before), **trees}
  result = dict(command=" ".join(sys.argv), uptime=subprocess.run(
      ["uptime"], capture_output=True, text=True).stdout.strip(), modes={})
  for mode in args.modes.split(","):
    caches = {k: tempfile.mkdtemp(prefix=f"cli_latency_cache_{k}_")
              for k in trees}
    rows = {k: dict(first=None, second=[]) for k in trees}
    for k, tree in trees.items():
      rows[k]["first"] = run_once(tree, mode, caches[k], args.eval_sweep,
                                  args.timeout)
      print(mode, k, "first", rows[k]["first"]["wall_s"], flush=True)
    for _ in range(args.repeats):
      for k, tree in trees.items():
        r = run_once(tree, mode, caches[k], args.eval_sweep, args.timeout)
        rows[k]["second"].append(r)
        print(mode, k, "second", r["wall_s"], "load", r["load"], flush=True)
    if mode == "decode":
      seen = {json.dumps(r["tokens"]) for k in trees
              for r in [rows[k]["first"], *rows[k]["second"]]}
      if len(seen) != 1:
        raise RuntimeError(f"decoded tokens differ between runs: {seen}")
    for k in trees:
      walls = [r["wall_s"] for r in rows[k]["second"]]
      rows[k]["second_median_s"] = statistics.median(walls) if walls else None
      shutil.rmtree(caches[k], ignore_errors=True)
    result["modes"][mode] = rows
    print(json.dumps({k: (rows[k]["first"]["wall_s"],
                          rows[k]["second_median_s"]) for k in trees}),
          flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
