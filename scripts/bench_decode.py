"""Benchmark: speculative decoding vs target-only, against the theory.

Usage: python scripts/bench_decode.py --pair=default-t5 --out=benchmarks/results/bench_decode_default_t5

For gamma in {1, 3, 5, 8}, temperature {0, 1} and batch {1, 8} this measures
tokens/s of target-only decoding, SpecDecode and a speculative cascade
(TokenV3), the acceptance statistics, the drafter/verifier cost ratio c
(drafter-only over target-only seconds per token, in the same decode loop)
and compares the measured speedup with Leviathan et al.'s theory

    speedup(alpha, gamma, c) = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1))

where alpha is recovered from the measured block efficiency (tokens per
verifier call = (1 - alpha^(gamma+1)) / (1 - alpha)). The theory assumes a
(gamma+1)-token verifier block costs one step (memory-bound verifier); the
measured block cost b (in a jitted loop, no dispatch) gives the block-aware
``theory_b`` = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + b)).

Noise control on a shared machine: every speedup is the median of per-repeat
ratios, each repeat timing the method and target-only back to back, and b is
timed the same way against a 1-token step. All ratios come from one run.

Usage:
  python scripts/bench_decode.py --pair random-gemma \\
      --out benchmarks/results/bench_decode_random_gemma
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

from specdec_jax import decoding, models, timing
from specdec_jax.eval import results_file


# Random-weight Gemma verifiers by name (``random-<name>``): the 37.8M CPU
# pair and two memory-bound accelerator pairs in bfloat16 (scripts/
# device_bench.sh): ~1.0B parameters, and Gemma 2 2B's shape (2.6B).
# name -> (config fields, drafter layers).
RANDOM_GEMMA = {
    "gemma": (dict(vocab_size=8192, d_model=512, num_layers=8, num_heads=8,
                   num_kv_heads=8, head_dim=64, mlp_dim=2048), 1),
    "gemma1b": (dict(vocab_size=32768, d_model=2048, num_layers=16,
                     num_heads=8, num_kv_heads=1, head_dim=256,
                     mlp_dim=8192, dtype="bfloat16",
                     param_dtype="bfloat16"), 2),
    "gemma2b": (dict(vocab_size=256000, d_model=2304, num_layers=26,
                     num_heads=8, num_kv_heads=4, head_dim=256,
                     mlp_dim=9216, dtype="bfloat16",
                     param_dtype="bfloat16"), 2),
}


def random_pair(family: str):
  """A random-weight verifier and a drafter made of its first layer(s).

  The drafter shares the verifier's embedding (and, for T5, encoder) and
  keeps its first decoder layer(s), so its predictions correlate with the
  verifier's: a truncated target, as in early-exit drafting.

  Args:
    family: 't5' or a key of ``RANDOM_GEMMA`` ('gemma': the 37.8M pair;
      'gemma1b' / 'gemma2b': bfloat16 accelerator pairs).
  """
  if family in RANDOM_GEMMA:
    fields, exit_layers = RANDOM_GEMMA[family]
    cfg = models.GemmaConfig(**fields)
    verifier = models.GemmaModel(cfg)
    p = verifier.init_params(jax.random.PRNGKey(0))
    p["embedder"]["input_embedding"] = p["embedder"]["input_embedding"] * 4.0
    dcfg = models.GemmaConfig(**{**cfg.__dict__, "num_layers": exit_layers,
                                 "attention_types": ()})
    drafter = models.GemmaModel(dcfg)
    keep = {"embedder", "final_norm",
            *(f"layer_{i}" for i in range(exit_layers))}
    q = {k: v for k, v in p.items() if k in keep}
  elif family == "t5":
    cfg = models.T5Config(vocab_size=8192, d_model=512, num_heads=8,
                          num_encoder_layers=4, num_decoder_layers=8,
                          mlp_dim=2048)
    verifier = models.T5Model(cfg)
    p = verifier.init_params(jax.random.PRNGKey(0))
    dcfg = models.T5Config(**{**cfg.__dict__, "num_decoder_layers": 1})
    drafter = models.T5Model(dcfg)
    dec = {k: v for k, v in p["decoder"].items()
           if not k.startswith("layers_") or k == "layers_0"}
    q = {"token_embedder": p["token_embedder"], "encoder": p["encoder"],
         "decoder": dec}
  else:
    raise ValueError(f"unknown random pair 'random-{family}': use random-t5 "
                     f"or one of "
                     f"{', '.join('random-' + k for k in RANDOM_GEMMA)}")
  return drafter, verifier, q, p


def load_pair(name: str):
  if name.startswith("random-"):
    return random_pair(name.split("-", 1)[1])
  from specdec_jax.eval import default_models  # pylint: disable=g-import-not-at-top
  return default_models.load_pair_for_benchmark(name)


def alpha_from_efficiency(eff: float, gamma: int) -> float:
  """Solves (1 - a^(g+1)) / (1 - a) = eff for a in [0, 1]."""
  lo, hi = 0.0, 1.0
  f = lambda a: sum(a**i for i in range(gamma + 1))
  if eff >= gamma + 1:
    return 1.0
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if f(mid) < eff else (lo, mid)
  return 0.5 * (lo + hi)


def theory(alpha: float, gamma: int, c: float, block: float = 1.0) -> float:
  """Expected speedup; ``block`` = cost of a (gamma+1)-token verifier block
  over a 1-token verifier step (1 in Leviathan et al.'s model)."""
  eff = gamma + 1 if alpha >= 1.0 else (1 - alpha**(gamma + 1)) / (1 - alpha)
  return eff / (gamma * c + block)


def block_costs(model, params, batch, gammas, repeats, inputs=None):
  """b(gamma) = verifier block of gamma + 1 tokens over a 1-token step,
  each timed in ``timing.step_timer``'s jitted loop; the two are timed
  alternately and b is the median of the per-repeat ratios (robust to load
  drifting on a shared machine).

  Returns:
    (step seconds, {gamma: b}).
  """
  enc_len = 24 if inputs is None else inputs.shape[1]
  timer = lambda k: timing.step_timer(model, params, batch, k,
                                      encoder_len=enc_len)
  one = timer(1)
  step = timing.medians({"one": one}, repeats)["one"]
  ratios = timing.paired_ratios({g: timer(g + 1) for g in gammas}, one,
                                repeats)
  return step, ratios


def decoder(method, pair, prompts, inputs, temp, gamma, new, batch):
  """Compiles ``method`` and returns ``run(seed) -> (seconds, results)``
  decoding all prompts in batches of ``batch``.

  Every call pads its prompts / encoder inputs to the width of the longest
  of ALL prompts (``pad_to``), so each method compiles once per batch size.
  """
  drafter, verifier, qp, pp = pair
  sampling = decoding.Temperature(temp)
  rows = prompts if prompts is not None else inputs
  width = max(len(r) for r in rows)
  chunks = [slice(i, i + batch) for i in range(0, len(rows), batch)]

  def run(seed):
    t = time.perf_counter()
    results = []
    for sl in chunks:
      results.append(decoding.generate(
          method, drafter, verifier, qp, pp,
          None if prompts is None else prompts[sl],
          inputs=None if inputs is None else inputs[sl], sampling=sampling,
          gamma=gamma, max_new_tokens=new, seeds=seed, eos_id=None,
          pad_to=width))
    jax.block_until_ready([x.tokens for x in results])
    return time.perf_counter() - t, results

  run(0)  # compile
  return run


def paired(run, base, repeats):
  """Times ``run`` and the baseline ``base`` alternately.

  Returns:
    (stats dict of ``run``, median of per-repeat time ratios base / run,
    median baseline seconds).
  """
  times, base_times, ratios, results = [], [], [], None
  for r in range(repeats):
    tb, _ = base(r + 1)
    t, results = run(r + 1)
    times.append(t)
    base_times.append(tb)
    ratios.append(tb / t)
  tokens = sum(int(x.lengths.sum()) for x in results)
  calls = sum(int(x.verifier_calls.sum()) for x in results)
  drafted = sum(int(x.drafted.sum()) for x in results)
  accepted = sum(int(x.accepted.sum()) for x in results)
  med = statistics.median(times)
  return dict(seconds=med, tokens=tokens, tokens_per_s=tokens / med,
              block_efficiency=tokens / calls if calls else None,
              acceptance_rate=accepted / drafted if drafted else None
              ), statistics.median(ratios), statistics.median(base_times)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--pair", default="random-gemma")
  ap.add_argument("--out", default="benchmarks/results/bench_decode")
  ap.add_argument("--num_prompts", type=int, default=8)
  ap.add_argument("--new_tokens", type=int, default=48)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--gammas", default="1,3,5,8")
  ap.add_argument("--temperatures", default="0,1")
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--cascade_alpha", type=float, default=0.3)
  args = ap.parse_args()

  pair = load_pair(args.pair)
  drafter, verifier, qp, pp = pair
  rng = np.random.default_rng(0)
  vocab = verifier.vocab_size
  prompts = getattr(pair, "prompts", None)
  inputs = getattr(pair, "inputs", None)
  if prompts is not None or inputs is not None:
    # A trained pair: its held-out test prompts (the first num_prompts).
    prompts = None if prompts is None else prompts[:args.num_prompts]
    inputs = None if inputs is None else inputs[:args.num_prompts]
    prompt_text = "held-out test prompts"
  else:
    seqs = [list(rng.integers(3, vocab, size=24)) for _ in
            range(args.num_prompts)]
    if verifier.is_encoder_decoder:
      inputs = seqs
    else:
      prompts = [[2] + s for s in seqs]
    prompt_text = "random 24-token prompts"

  rows, costs = [], {}
  gammas = [int(g) for g in args.gammas.split(",")]
  for batch in map(int, args.batches.split(",")):
    enc = None
    if verifier.is_encoder_decoder:
      enc = jnp.full((batch, 24), 5, jnp.int32)
    tq, _ = block_costs(drafter, qp, batch, [], args.repeats, inputs=enc)
    tp, blocks = block_costs(verifier, pp, batch, gammas, args.repeats,
                             inputs=enc)
    costs[batch] = dict(drafter_step_ms=1e3 * tq, verifier_step_ms=1e3 * tp,
                        c=tq / tp, block_over_step=blocks)
    for temp in map(float, args.temperatures.split(",")):
      run = lambda m, g: decoder(m, pair, prompts, inputs, temp, g,
                                 args.new_tokens, batch)
      base_run = run(decoding.TargetOnly(), 1)
      base, _, _ = paired(base_run, base_run, args.repeats)
      rows.append(dict(batch=batch, temperature=temp, gamma=0,
                       method="target_only", **base, speedup=1.0))
      print(json.dumps(rows[-1]), flush=True)
      small, c_inv, _ = paired(run(decoding.DrafterOnly(), 1), base_run,
                               args.repeats)
      # c as the loop sees it: seconds per token of drafter-only over
      # target-only decoding (same while_loop, no per-call dispatch), from
      # alternately timed runs.
      c_loop = 1.0 / c_inv
      costs[batch].setdefault("c_loop", {})[temp] = c_loop
      rows.append(dict(batch=batch, temperature=temp, gamma=0,
                       method="drafter_only", **small, speedup=c_inv))
      print(json.dumps(rows[-1]), flush=True)
      for gamma in gammas:
        for name, method in (
            ("spec_decode", decoding.make_method("spec_decode")),
            (f"token_v3(alpha={args.cascade_alpha})",
             decoding.make_method("token_v3", alpha=args.cascade_alpha))):
          r, speed, _ = paired(run(method, gamma), base_run, args.repeats)
          a = alpha_from_efficiency(r["block_efficiency"], gamma)
          th = theory(a, gamma, c_loop)
          b = costs[batch]["block_over_step"][gamma]
          th_b = theory(a, gamma, c_loop, b)
          rows.append(dict(batch=batch, temperature=temp, gamma=gamma,
                           method=name, **r, speedup=speed, alpha=a,
                           c=c_loop, theory=th,
                           measured_over_theory=speed / th,
                           block_over_step=b, theory_block=th_b,
                           measured_over_theory_block=speed / th_b))
          print(json.dumps(rows[-1]), flush=True)
      decoding.clear_compiled()

  command = "python scripts/bench_decode.py " + " ".join(
      f"--{k}={v}" for k, v in vars(args).items())
  meta = dict(command=command, backend=jax.default_backend(),
              cpu=platform.processor() or platform.machine(),
              jax=jax.__version__,
              drafter_params=drafter.num_params(),
              verifier_params=verifier.num_params(), costs=costs)
  lines = [
      f"# Decode benchmark: {args.pair}\n",
      f"Command: `{meta['command']}`  ",
      f"Backend {meta['backend']} ({meta['cpu']}), jax {meta['jax']}; "
      f"drafter {meta['drafter_params'] / 1e6:.1f}M / verifier "
      f"{meta['verifier_params'] / 1e6:.1f}M parameters; "
      f"{len(prompts if prompts is not None else inputs)} {prompt_text} x "
      f"{args.new_tokens} new tokens (no EOS stop). Each speedup is the "
      f"median over {args.repeats} repeats of the ratio of back-to-back "
      f"timings (target-only, then the method); tokens/s is the method's "
      f"median. alpha is solved from the block efficiency; c is "
      f"drafter-only over target-only seconds per token in the same decode "
      f"loop at the same batch and temperature; theory = (1 - a^(g+1)) / "
      f"((1 - a)(g c + 1)) (Leviathan et al.: a (g+1)-token verifier block "
      f"costs one step); theory_b = (1 - a^(g+1)) / ((1 - a)(g c + b)) with "
      f"b the cost of that block over a 1-token verifier step, both timed "
      f"in a jitted loop (median of back-to-back ratios).\n",
      "| batch | c in the loop, by T | 1-token steps in a loop: drafter / "
      "verifier | b = block/step by gamma |", "|---|---|---|---|"]
  lines += [f"| {b} | " + ", ".join(
      f"T={t:g}: {x:.3f}" for t, x in v["c_loop"].items()) +
            f" | {v['drafter_step_ms']:.2f} ms / "
            f"{v['verifier_step_ms']:.2f} ms ({v['c']:.3f}) | " + ", ".join(
                f"{g}: {x:.2f}" for g, x in v["block_over_step"].items())
            + " |" for b, v in costs.items()]
  if 1 in costs and len(costs) > 1:
    hi = max(costs)
    growth = costs[hi]["verifier_step_ms"] / costs[1]["verifier_step_ms"]
    lines += ["", f"A verifier step at batch {hi} costs {growth:.2f}x one at "
              f"batch 1 ({hi}x the tokens). The theory's premise is a "
              f"memory-bound verifier, where extra tokens per step are nearly "
              f"free (growth ~1, b ~1); growth near {hi} means the verifier "
              f"is compute-bound here and extra verified tokens cost almost "
              f"their full price."]
  lines += ["", "| batch | T | gamma | method | tokens/s | speedup | accept "
            "rate | tokens/call | alpha | theory | measured/theory | "
            "theory_b | measured/theory_b |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    fmt = lambda k, f: (f.format(r[k]) if r.get(k) is not None else "-")
    lines.append(
        f"| {r['batch']} | {r['temperature']:g} | {r['gamma'] or '-'} | "
        f"{r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
        f"{fmt('acceptance_rate', '{:.2f}')} | "
        f"{fmt('block_efficiency', '{:.2f}')} | {fmt('alpha', '{:.2f}')} | "
        f"{fmt('theory', '{:.2f}x')} | {fmt('measured_over_theory', '{:.2f}')}"
        f" | {fmt('theory_block', '{:.2f}x')} | "
        f"{fmt('measured_over_theory_block', '{:.2f}')} |")
  results_file.write_report(args.out, command=command,
                            markdown="\n".join(lines), rows=rows,
                            meta=meta)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
