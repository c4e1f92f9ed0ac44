"""Benchmark: skinny matmuls [K, d] x [d, f] on XLA:CPU vs numpy's BLAS.

A float32 verifier block of K tokens (K = 1..16) is a stack of skinny
matmuls; the block cost b stays near 1 only while they are memory-bound.
This measures GFLOP/s (2 K d f flops per product) of

* numpy's BLAS (``np.dot``, its own thread pool),
* XLA:CPU (``jnp.dot`` in a jitted loop, ``timing.fn_timer``) with the
  default options and with each ``--flag_sets`` entry (XLA options of the
  pinned jaxlib, e.g. ``--xla_cpu_use_xnnpack=true``),

each flag set in its own process (XLA reads ``XLA_FLAGS`` once). A flag the
jaxlib does not know makes its process fail; that set is reported as such.

Usage:
  python scripts/bench_cpu_matmul.py --out benchmarks/results/cpu_matmul
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

FLAG_SETS = ("", "--xla_cpu_use_xnnpack=true", "--xla_cpu_use_onednn=true",
             "--xla_cpu_enable_fast_math=true",
             "--xla_cpu_multi_thread_eigen=false",
             "--xla_cpu_prefer_vector_width=512")


def shapes(spec: str) -> list[tuple[int, int]]:
  """'512x2048,2048x512' -> [(512, 2048), (2048, 512)]."""
  out = []
  for item in spec.split(","):
    d, f = item.split("x")
    out.append((int(d), int(f)))
  return out


def numpy_gflops(k, d, f, dtype, repeats, min_seconds=0.05) -> float:
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.standard_normal((k, d)).astype(dtype)
  w = rng.standard_normal((d, f)).astype(dtype)
  np.dot(x, w)
  n, t = 1, 0.0
  while t < min_seconds:
    n *= 2
    t0 = time.perf_counter()
    for _ in range(n):
      np.dot(x, w)
    t = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(n):
      np.dot(x, w)
    times.append((time.perf_counter() - t0) / n)
  return 2 * k * d * f / statistics.median(times) / 1e9


def worker(args) -> None:
  """Times every (shape, K) with XLA (and numpy in the default set)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from specdec_jax import timing  # pylint: disable=g-import-not-at-top
  dtype = jnp.dtype(args.dtype)
  for d, f in shapes(args.shapes):
    w = jax.random.normal(jax.random.key(1), (d, f), dtype)
    for k in map(int, args.ks.split(",")):
      x = jax.random.normal(jax.random.key(0), (k, d), dtype)
      t = timing.fn_timer(lambda a, b: jnp.dot(a, b), x, w, min_seconds=0.05)
      xla = 2 * k * d * f / timing.medians({"t": t}, args.repeats)["t"] / 1e9
      row = dict(flags=args.flags, d=d, f=f, k=k, dtype=args.dtype,
                 xla_gflops=round(xla, 2))
      if not args.flags:
        row["numpy_gflops"] = round(numpy_gflops(k, d, f, args.dtype,
                                                 args.repeats), 2)
      print("ROW " + json.dumps(row), flush=True)


def markdown(command, rows, failed) -> str:
  lines = ["# Skinny matmuls on this CPU: XLA vs numpy BLAS\n",
           f"Command: `{command}`\n",
           "GFLOP/s of [K, d] x [d, f] (2 K d f flops), median of repeats; "
           "XLA in a jitted loop (`timing.fn_timer`), numpy `np.dot`. One "
           "process per XLA flag set.\n"]
  sets = sorted({r["flags"] for r in rows}, key=lambda s: (s != "", s))
  head = "| d x f | K | numpy | " + " | ".join(
      s or "XLA default" for s in sets) + " |"
  lines += [head, "|" + "---|" * (3 + len(sets))]
  keys = sorted({(r["d"], r["f"], r["k"]) for r in rows})
  for d, f, k in keys:
    cell = {r["flags"]: r for r in rows if (r["d"], r["f"], r["k"]) == (d, f,
                                                                        k)}
    base = cell.get("", {})
    lines.append(f"| {d}x{f} | {k} | {base.get('numpy_gflops', '-')} | " +
                 " | ".join(str(cell[s]["xla_gflops"]) if s in cell else "-"
                            for s in sets) + " |")
  for flags, err in failed.items():
    lines.append(f"\n`{flags}`: the process failed ({err}).")
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--shapes", default="512x2048,2048x512,512x8192")
  ap.add_argument("--ks", default="1,2,4,6,8,16")
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--flag_sets", default=";".join(FLAG_SETS),
                  help="';'-separated XLA_FLAGS values ('' = default)")
  ap.add_argument("--flags", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--out", default="benchmarks/results/cpu_matmul")
  args = ap.parse_args()
  if args.flags is not None:
    return worker(args)
  command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
  rows, failed = [], {}
  for flags in args.flag_sets.split(";"):
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, os.path.abspath(__file__), f"--flags={flags}",
           "--shapes", args.shapes, "--ks", args.ks, "--dtype", args.dtype,
           "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          check=False)
    got = [json.loads(line[4:]) for line in proc.stdout.splitlines()
           if line.startswith("ROW ")]
    if proc.returncode or not got:
      failed[flags] = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    rows += got
    print(f"{flags or 'default'}: {len(got)} rows", flush=True)
  from specdec_jax.eval import results_file  # pylint: disable=g-import-not-at-top
  results_file.write_report(args.out, command=command,
                            markdown=markdown(command, rows, failed),
                            rows=rows, meta=dict(failed=failed))
  print(markdown(command, rows, failed))


if __name__ == "__main__":
  main()
