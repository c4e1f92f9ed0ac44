"""Benchmark: cost of a 1-token step vs a (gamma+1)-token block step.

Speculative decoding pays when verifying gamma + 1 tokens in one block step
costs little more than a single-token step. This script measures, on the
current backend (CPU here), the median wall time per call of both, at batch 1
and 8, for a tiny preset and a ~30M-parameter config of each family, plus the
compile time and the number of compilations.

Usage:
  python scripts/bench_models.py --out benchmarks/results/bench_models
Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import models
from specdec_jax.eval import results_file

CONFIGS = {
    "gemma_tiny": models.PRESETS["gemma_tiny"],
    "gemma_30m": models.GemmaConfig(
        vocab_size=8192, d_model=512, num_layers=6, num_heads=8,
        num_kv_heads=8, head_dim=64, mlp_dim=2048),
    "t5_tiny": models.PRESETS["t5_tiny"],
    "t5_30m": models.T5Config(
        vocab_size=8192, d_model=384, num_heads=6, head_dim=64,
        num_encoder_layers=6, num_decoder_layers=6, mlp_dim=1536),
}


def bench_one(name, cfg, batch, block, context, repeats):
  model = models.model_from_config(cfg)
  params = model.init_params(jax.random.PRNGKey(0))
  max_len = context + 64
  rng = np.random.default_rng(0)
  encoded = None
  if model.is_encoder_decoder:
    src = jnp.asarray(rng.integers(2, cfg.vocab_size, (batch, context)))
    encoded = model.encode(params, src)
  cache = model.init_cache(batch, max_len, encoded)
  prefill = jnp.asarray(rng.integers(2, cfg.vocab_size, (batch, context)))
  _, cache = jax.jit(model.step)(params, prefill, cache)
  step = jax.jit(model.step)
  tokens = jnp.asarray(rng.integers(2, cfg.vocab_size, (batch, block)))
  t0 = time.perf_counter()
  lowered = step.lower(params, tokens, cache)
  t1 = time.perf_counter()
  lowered.compile()
  t2 = time.perf_counter()
  times = []
  for _ in range(repeats):
    s = time.perf_counter()
    logits, new_cache = step(params, tokens, cache)
    jax.block_until_ready(logits)
    times.append(time.perf_counter() - s)
    # Roll back so every call writes at the same length.
    cache = new_cache.with_lengths(cache.lengths)
  return dict(
      model=name, params=model.num_params(), batch=batch, block=block,
      context=context, median_ms=1e3 * statistics.median(times[2:]),
      trace_lower_s=t1 - t0, compile_s=t2 - t1,
      compilations=step._cache_size())  # pylint: disable=protected-access


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="benchmarks/results/bench_models")
  ap.add_argument("--repeats", type=int, default=40)
  ap.add_argument("--context", type=int, default=128)
  ap.add_argument("--gamma", type=int, default=5)
  args = ap.parse_args()
  rows = []
  for name, cfg in CONFIGS.items():
    for batch in (1, 8):
      for block in (1, args.gamma + 1):
        r = bench_one(name, cfg, batch, block, args.context, args.repeats)
        print(json.dumps(r))
        rows.append(r)
  ratios = []
  for name in CONFIGS:
    for batch in (1, 8):
      one = next(r for r in rows if r["model"] == name and r["batch"] == batch
                 and r["block"] == 1)
      blk = next(r for r in rows if r["model"] == name and r["batch"] == batch
                 and r["block"] == args.gamma + 1)
      ratios.append(dict(model=name, batch=batch, params=one["params"],
                         step_ms=one["median_ms"], block_ms=blk["median_ms"],
                         ratio=blk["median_ms"] / one["median_ms"]))
  meta = dict(command="python scripts/bench_models.py " + " ".join(
      f"--{k}={v}" for k, v in vars(args).items()),
              backend=jax.default_backend(), devices=str(jax.devices()),
              cpu=platform.processor() or platform.machine(),
              jax=jax.__version__, repeats=args.repeats)
  lines = [f"# Model step benchmark\n", f"Command: `{meta['command']}`  ",
           f"Backend: {meta['backend']} ({meta['cpu']}), jax {meta['jax']}, "
           f"median of {args.repeats} calls after warm-up, context "
           f"{args.context} cached tokens.\n",
           "| model | params | batch | 1-token step (ms) | "
           f"{args.gamma + 1}-token block (ms) | block / step |",
           "|---|---|---|---|---|---|"]
  for r in ratios:
    lines.append(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['batch']} | "
                 f"{r['step_ms']:.3f} | {r['block_ms']:.3f} | "
                 f"{r['ratio']:.2f}x |")
  lines += ["", "| model | batch | block | trace+lower (s) | compile (s) | "
            "compilations |", "|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['model']} | {r['batch']} | {r['block']} | "
                 f"{r['trace_lower_s']:.2f} | {r['compile_s']:.2f} | "
                 f"{r['compilations']} |")
  results_file.write_report(args.out, command=meta["command"],
                            markdown="\n".join(lines), rows=rows, meta=meta,
                            extra=dict(ratios=ratios))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
