"""Where speculative decoding pays off on a CPU: the verifier's block cost.

Usage: python scripts/bench_cpu_speed_case.py --speedup auto --out benchmarks/results/cpu_speed_case

Speculative decoding wins when verifying gamma + 1 tokens in one call costs
about as much as decoding one: the block step is memory-bound (weights read
once, reused for every token of the block) rather than compute-bound. This
script measures, for random-weight Gemma-style verifiers of growing size, at
batch 1 and in float32 and bfloat16,

    b = time of a (gamma + 1)-token cached block step / time of a 1-token step

(each inside a jitted ``fori_loop`` of ``--iters`` steps with a rollback to
a fixed context, the two timed alternately, medians of ``--repeats``), and
the smallest size where ``b <= --threshold`` (1.2). Optionally (``--speedup
SIZE``) it decodes with a "speed pair" of that size -- the verifier and a
drafter made of its first layers (:func:`speed_pair`) -- and reports greedy
SpecDecode vs target-only tokens per second.

    PYTHONPATH=. python scripts/bench_cpu_speed_case.py \\
        --out benchmarks/results/cpu_speed_case       # .json + .md

Build the speed pair yourself::

    from bench_cpu_speed_case import speed_pair     # scripts/ on sys.path
    drafter, verifier, q, p = speed_pair("gemma-110m", dtype="bfloat16")
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decoding, models, timing
from specdec_jax.eval import results_file

VOCAB = 8192
# name -> (d_model, layers, heads, mlp); head_dim 64, kv heads = heads.
SIZES = {
    "gemma-7m": (256, 4, 4, 1024),
    "gemma-38m": (512, 8, 8, 2048),
    "gemma-110m": (768, 12, 12, 3072),
    "gemma-280m": (1024, 16, 16, 4096),
    "gemma-430m": (1280, 16, 20, 5120),
}


def verifier_config(name: str, dtype: str = "float32") -> models.GemmaConfig:
  """The Gemma-style config of a named size (vocabulary ``VOCAB``)."""
  if name not in SIZES:
    raise ValueError(f"unknown size {name!r}; choose from {', '.join(SIZES)}")
  d, layers, heads, mlp = SIZES[name]
  return models.GemmaConfig(vocab_size=VOCAB, d_model=d, num_layers=layers,
                            num_heads=heads, num_kv_heads=heads, head_dim=64,
                            mlp_dim=mlp, dtype=dtype, param_dtype=dtype)


def random_params(model, seed: int = 0, embed_scale: float = 4.0) -> dict:
  """N(0, 0.02) weights drawn with numpy (fast for 100M+ parameters).

  Norm scales are 0 (Gemma's ``1 + scale``); the input embedding is scaled
  by ``embed_scale`` so the residual stream is dominated by the token
  embedding and a truncated model's predictions track the full model's (as
  in ``scripts/bench_decode.py``'s random pair).
  """
  rng = np.random.default_rng(seed)
  dt = jnp.dtype(model.config.param_dtype)

  def draw(path, shape):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    if len(shape.shape) < 2:
      return jnp.zeros(shape.shape, dt)
    x = rng.standard_normal(shape.shape, np.float32) * 0.02
    if name.endswith("input_embedding"):
      x *= embed_scale
    return jnp.asarray(x, dt)

  return jax.tree_util.tree_map_with_path(draw, model.param_shapes())


def speed_pair(name: str, dtype: str = "float32", drafter_layers: int = 1,
               seed: int = 0):
  """(drafter, verifier, q_params, p_params) of a random-weight speed pair.

  The drafter is the verifier's first ``drafter_layers`` layers with the
  same embedding and final norm (a truncated config and a subset of the
  verifier's parameter tree; no copies).
  """
  cfg = verifier_config(name, dtype)
  verifier = models.GemmaModel(cfg)
  p = random_params(verifier, seed)
  dcfg = dataclasses.replace(cfg, num_layers=drafter_layers,
                             attention_types=cfg.attention_types[
                                 :drafter_layers])
  drafter = models.GemmaModel(dcfg)
  q = {k: v for k, v in p.items()
       if not k.startswith("layer_") or int(k[6:]) < drafter_layers}
  return drafter, verifier, q, p


def measure_b(name: str, dtype: str, gamma: int, iters: int,
              repeats: int) -> dict:
  """Step time, block time and b of one verifier size."""
  model = models.GemmaModel(verifier_config(name, dtype))
  params = random_params(model)
  one, block = (timing.step_timer(model, params, 1, k, context=64,
                                  min_iters=iters) for k in (1, gamma + 1))
  steps, blocks, ratios = [], [], []
  for _ in range(repeats):
    s, b = one(), block()
    steps.append(s)
    blocks.append(b)
    ratios.append(b / s)
  return dict(size=name, dtype=dtype, params=model.num_params(),
              weight_mb=round(model.num_params() * jnp.dtype(dtype).itemsize
                              / 2**20, 1),
              step_ms=round(1e3 * statistics.median(steps), 3),
              block_ms=round(1e3 * statistics.median(blocks), 3),
              b=round(statistics.median(ratios), 3))


def measure_speedup(name: str, dtype: str, gamma: int, drafter_layers: int,
                    new_tokens: int, prompts: int, repeats: int) -> dict:
  """Greedy SpecDecode vs target-only on the speed pair, batch 1."""
  drafter, verifier, q, p = speed_pair(name, dtype, drafter_layers)
  rng = np.random.default_rng(0)
  rows = [[2] + list(map(int, rng.integers(3, VOCAB, 24)))
          for _ in range(prompts)]
  methods = {"target_only": decoding.make_method("target_only"),
             "spec_decode": decoding.make_method("spec_decode")}

  def run(method):
    t, out = time.perf_counter(), []
    for r in rows:  # batch 1, the latency protocol
      out.append(decoding.generate(
          method, drafter, verifier, q, p, [r], gamma=gamma,
          max_new_tokens=new_tokens, eos_id=None))
    return time.perf_counter() - t, out

  for m in methods.values():
    run(m)  # compile
  times = {k: [] for k in methods}
  ratios = []
  for _ in range(repeats):
    tb, base = run(methods["target_only"])
    ts, spec = run(methods["spec_decode"])
    times["target_only"].append(tb)
    times["spec_decode"].append(ts)
    ratios.append(tb / ts)
  same = all(a.sequences() == b.sequences() for a, b in zip(base, spec))
  drafted = sum(int(o.drafted.sum()) for o in spec)
  accepted = sum(int(o.accepted.sum()) for o in spec)
  tokens = prompts * new_tokens
  return dict(
      size=name, dtype=dtype, gamma=gamma, drafter_layers=drafter_layers,
      drafter_params=drafter.num_params(), verifier_params=verifier.num_params(),
      target_only_tokens_per_s=round(tokens / statistics.median(
          times["target_only"]), 2),
      spec_decode_tokens_per_s=round(tokens / statistics.median(
          times["spec_decode"]), 2),
      speedup=round(statistics.median(ratios), 3),
      acceptance_rate=round(accepted / drafted, 4) if drafted else None,
      identical_to_target=same, prompts=prompts, new_tokens=new_tokens)


def markdown(result: dict) -> str:
  a = result["args"]
  lines = ["# CPU speed case: where the verifier's block step is memory-bound",
           "", f"`{result['command']}` ({result['machine']}, jax "
           f"{result['jax']}). Random-weight Gemma-style verifiers "
           f"(vocabulary {VOCAB}, head_dim 64), batch 1, context 64; b = "
           f"cost of a {a['gamma'] + 1}-token cached block step / a 1-token "
           f"step, each in a jitted loop of {a['iters']} steps, median of "
           f"{a['repeats']} alternating repeats.", "",
           "| verifier | dtype | parameters | weights MB | 1-token step ms | "
           f"{a['gamma'] + 1}-token block ms | b |", "|---|---|---|---|---|---|---|"]
  for r in result["b"]:
    lines.append(f"| {r['size']} | {r['dtype']} | {r['params']:,} | "
                 f"{r['weight_mb']} | {r['step_ms']} | {r['block_ms']} | "
                 f"{r['b']} |")
  lines += [""]
  for dtype, name in result["smallest_memory_bound"].items():
    lines.append(f"- {dtype}: smallest verifier with b <= {a['threshold']}: "
                 f"{name or 'none of the measured sizes'}")
  for s in result.get("speedup", []):
    lines += ["", f"Speed pair {s['size']} ({s['dtype']}): drafter = first "
              f"{s['drafter_layers']} layer(s) ({s['drafter_params']:,} "
              f"parameters), gamma {s['gamma']}, {s['prompts']} random "
              f"prompts x {s['new_tokens']} tokens at batch 1: target-only "
              f"{s['target_only_tokens_per_s']} tokens/s, greedy SpecDecode "
              f"{s['spec_decode_tokens_per_s']} tokens/s (speedup "
              f"{s['speedup']}x, acceptance {s['acceptance_rate']}, identical "
              f"output: {s['identical_to_target']})."]
  return "\n".join(lines) + "\n"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default=",".join(SIZES))
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--gamma", type=int, default=5)
  ap.add_argument("--iters", type=int, default=16)
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--threshold", type=float, default=1.2)
  ap.add_argument("--speedup", default="",
                  help="sizes (comma-separated, 'auto' = the smallest "
                  "memory-bound one per dtype) to decode with the speed pair")
  ap.add_argument("--drafter_layers", type=int, default=1)
  ap.add_argument("--new_tokens", type=int, default=32)
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--out", default="benchmarks/results/cpu_speed_case")
  args = ap.parse_args()
  result = dict(command="PYTHONPATH=. python " + " ".join(sys.argv),
                machine=f"{platform.machine()} {os.cpu_count()} cpus, "
                        f"{jax.default_backend()}",
                jax=jax.__version__, args=vars(args), b=[],
                smallest_memory_bound={})
  dtypes = args.dtypes.split(",")
  for dtype in dtypes:
    for name in args.sizes.split(","):
      r = measure_b(name, dtype, args.gamma, args.iters, args.repeats)
      print(json.dumps(r), flush=True)
      result["b"].append(r)
    ok = [r["size"] for r in result["b"]
          if r["dtype"] == dtype and r["b"] <= args.threshold]
    result["smallest_memory_bound"][dtype] = ok[0] if ok else None
  todo = []
  for item in filter(None, args.speedup.split(",")):
    if item == "auto":
      todo += [(n, d) for d, n in result["smallest_memory_bound"].items()
               if n]
    else:
      todo += [(item, d) for d in dtypes]
  result["speedup"] = []
  for name, dtype in todo:
    s = measure_speedup(name, dtype, args.gamma, args.drafter_layers,
                        args.new_tokens, args.prompts, max(3, args.repeats // 2))
    print(json.dumps(s), flush=True)
    result["speedup"].append(s)
  rows = ([dict(kind="b", **r) for r in result["b"]] +
          [dict(kind="speedup", **r) for r in result["speedup"]])
  results_file.write_report(
      args.out, command=result["command"], markdown=markdown(result),
      rows=rows, extra=result)
  print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
  main()
