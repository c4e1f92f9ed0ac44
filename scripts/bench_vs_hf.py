"""Peer benchmark: specdec_jax vs HF transformers on the same CPU and weights.

Usage: python scripts/bench_vs_hf.py --out benchmarks/results/bench_vs_hf  (needs the [hf] extra)

For each default pair the drafter and verifier are exported to HF format
(``checkpoints.save(..., format='hf')``) and loaded with transformers (torch,
float32, eval mode, ``torch.set_num_threads(<cores>)``). On the same
test-split prompts, in ONE process, it measures tokens/s of

  * HF ``generate``, target only: greedy and sampled (T = 1, no top-k/top-p);
  * HF assisted generation (``assistant_model=``): like-for-like (a constant
    ``num_assistant_tokens`` = gamma, no confidence early stop), transformers'
    default assistant settings, and the 'heuristic' schedule from gamma;
  * ours (``decoding.generate``): target-only and SpecDecode at gamma 5 and at
    the best gamma of a greedy sweep, greedy and sampled;

at batch 1 (each prompt alone; the median over ``--repeats`` passes of the
whole prompt set, after one untimed pass that compiles / warms everything;
configurations are interleaved within each pass so load changes hit all
alike) and, for ours, at batch 8 (HF assisted generation refuses batch > 1:
the script records the exact error). Greedy outputs are compared token for
token across the implementations (same max_new_tokens, stop at EOS on both
sides, EOS included); for a sequence that differs, the verifier's logits at
the first divergence are recomputed by both implementations (uncached) to
show the top-1 / top-2 margin there.

  PYTHONPATH=. python scripts/bench_vs_hf.py \\
      --out benchmarks/results/bench_vs_hf              # the default pairs
  PYTHONPATH=. python scripts/bench_vs_hf.py --smoke --out /tmp/bvh
                                                        # tiny random pairs

Writes <out>.json and <out>.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import checkpoints, decoding, models

SHARED_NOTE = ("the machine is shared with other jobs: wall-clock numbers "
               "depend on their load (see load_average); CPU seconds are "
               "this process's")
DEFAULT_GAMMA = 5
SWEEP_GAMMAS = (2, 3, 4, 6, 8)
PAD_TEXT = {"none": "a multiple of 16", "pow2": "a power of two"}


# ------------------------------------------------------------------ pairs


@dataclasses.dataclass
class BenchPair:
  """A drafter/verifier pair and its prompts as token rows.

  Attributes:
    name: pair name.
    drafter, verifier: our models; q_params, p_params: their parameters.
    rows: one token list per prompt: encoder inputs (T5) or BOS-prefixed
      decoder prompts (Gemma).
    max_new_tokens: generation budget (both implementations).
  """

  name: str
  drafter: object
  verifier: object
  q_params: dict
  p_params: dict
  rows: list[list[int]]
  max_new_tokens: int

  @property
  def encdec(self) -> bool:
    return bool(self.verifier.is_encoder_decoder)


def default_pair(name: str, num_prompts: int, assets: str | None
                 ) -> BenchPair:
  """A shipped default pair (float32) and its first test prompts."""
  from specdec_jax.eval import default_models as dm  # pylint: disable=g-import-not-at-top
  pair = dm.load(name, dtype="float32", **({"assets": assets} if assets
                                            else {}))
  rows = list(pair.encode(dm.examples(name, "test", limit=num_prompts))
              .values())[0]
  return BenchPair(name, pair.drafter, pair.verifier, pair.q_params,
                   pair.p_params, [list(map(int, r)) for r in rows],
                   pair.max_new_tokens)


def stand_in_pair(family: str, num_prompts: int, max_new_tokens: int = 16,
                  seed: int = 0) -> BenchPair:
  """A tiny random pair ('t5' or 'gemma') for smoke runs and tests.

  The verifier is a tiny preset with sharpened weights (so greedy outputs
  vary with the context); the drafter is the verifier with noisy weights.
  """
  model = models.get_model({"t5": "t5_tiny", "gemma": "gemma2_tiny"}[family])
  p = model.init_params(jax.random.PRNGKey(seed))
  if family == "gemma":
    p["embedder"]["input_embedding"] = p["embedder"]["input_embedding"] * 3.0
    layers = [v for k, v in p.items() if k.startswith("layer_")]
  else:
    layers = [v for k, v in p["decoder"].items() if k.startswith("layers_")]
  for layer in layers:
    for w in layer["mlp"].values():
      w["kernel"] = w["kernel"] * 3.0
  leaves, tree = jax.tree.flatten(p)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  q = jax.tree.unflatten(tree, [
      x + 0.1 * jax.random.normal(k, x.shape, x.dtype) * (
          jnp.std(x) + 1e-3) for x, k in zip(leaves, keys)])
  rng = np.random.default_rng(seed)
  vocab = model.vocab_size
  rows = []
  for _ in range(num_prompts):
    body = rng.integers(3, vocab, size=int(rng.integers(2, 24))).tolist()
    rows.append(body + [model.eos_id] if family == "t5"
                else [model.config.bos_id] + body)
  return BenchPair(f"tiny_{family}", model, model, q, p, rows,
                   max_new_tokens)


# ------------------------------------------------------------------ HF side


def export_hf(pair: BenchPair, out_dir: str) -> dict[str, str]:
  """Writes both models in HF format; returns {'drafter', 'verifier'} dirs."""
  paths = {}
  for role, model, params in (("drafter", pair.drafter, pair.q_params),
                              ("verifier", pair.verifier, pair.p_params)):
    paths[role] = os.path.join(out_dir, pair.name, role)
    checkpoints.save(paths[role], model, params, format="hf")
  return paths


def load_hf(path: str, encdec: bool):
  """An exported checkpoint as a float32 torch model in eval mode."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  with open(os.path.join(path, "config.json")) as f:
    model_type = json.load(f)["model_type"]
  kw = dict(dtype=torch.float32)
  if model_type == "gemma2":
    kw["attn_implementation"] = "eager"  # SDPA ignores attention soft-capping
  cls = (transformers.AutoModelForSeq2SeqLM if encdec
         else transformers.AutoModelForCausalLM)
  model = cls.from_pretrained(path, **kw).eval()
  return model


@dataclasses.dataclass(frozen=True)
class HFAssist:
  """Assistant settings (``assistant_model.generation_config``).

  Attributes:
    name: label in the results.
    num_tokens: ``num_assistant_tokens``; None keeps transformers' default.
    schedule: ``num_assistant_tokens_schedule``; None keeps the default.
    confidence: ``assistant_confidence_threshold`` (0 disables the early
      stop); None keeps the default.
  """

  name: str
  num_tokens: int | None = None
  schedule: str | None = None
  confidence: float | None = None


class CallCounter:
  """Counts forward calls of a torch module (a forward hook)."""

  def __init__(self, module):
    self.calls = 0
    self._handle = module.register_forward_hook(self._hook)

  def _hook(self, *args):
    del args
    self.calls += 1

  def take(self) -> int:
    n, self.calls = self.calls, 0
    return n


def configure_assistant(assistant, variant: HFAssist) -> dict:
  """Applies ``variant`` to the assistant; returns the effective settings."""
  from transformers import GenerationConfig  # pylint: disable=g-import-not-at-top
  gc = GenerationConfig.from_model_config(assistant.config)
  if variant.num_tokens is not None:
    gc.num_assistant_tokens = variant.num_tokens
  if variant.schedule is not None:
    gc.num_assistant_tokens_schedule = variant.schedule
  if variant.confidence is not None:
    gc.assistant_confidence_threshold = variant.confidence
  assistant.generation_config = gc
  # pylint: disable-next=protected-access
  defaults = GenerationConfig._get_default_generation_params()
  eff = lambda k: (getattr(gc, k) if getattr(gc, k) is not None
                   else defaults[k])
  return {k: eff(k) for k in ("num_assistant_tokens",
                              "num_assistant_tokens_schedule",
                              "assistant_confidence_threshold")}


def hf_generate(model, row: list[int], *, encdec: bool, max_new: int,
                eos_id: int, pad_id: int, sampled: bool, seed: int,
                assistant=None) -> list[int]:
  """One HF ``generate`` call at batch 1 -> the generated ids (EOS kept)."""
  import torch  # pylint: disable=g-import-not-at-top
  ids = torch.tensor([row], dtype=torch.long)
  kw = dict(max_new_tokens=max_new, eos_token_id=eos_id, pad_token_id=pad_id,
            do_sample=sampled, num_beams=1)
  if sampled:
    kw.update(temperature=1.0, top_k=0, top_p=1.0)
    torch.manual_seed(seed)
  if assistant is not None:
    kw["assistant_model"] = assistant
  with torch.inference_mode():
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                         **kw)
  new = out[0, 1:] if encdec else out[0, len(row):]  # drop start / prompt
  return [int(t) for t in new]


def hf_batch_error(model, assistant, rows: list[list[int]], encdec: bool,
                   max_new: int, eos_id: int, pad_id: int) -> str:
  """The error HF assisted generation raises for a batch of 2 prompts."""
  import torch  # pylint: disable=g-import-not-at-top
  two = rows[:2]
  width = max(len(r) for r in two)
  # Left padding for decoder-only (HF's convention), right for the encoder.
  pad = (lambda r: r + [pad_id] * (width - len(r))) if encdec else (
      lambda r: [pad_id] * (width - len(r)) + r)
  mask = (lambda r: [1] * len(r) + [0] * (width - len(r))) if encdec else (
      lambda r: [0] * (width - len(r)) + [1] * len(r))
  ids = torch.tensor([pad(r) for r in two])
  att = torch.tensor([mask(r) for r in two])
  try:
    with torch.inference_mode():
      model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new,
                     eos_token_id=eos_id, pad_token_id=pad_id,
                     do_sample=False, assistant_model=assistant)
  except Exception as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {e}"
  return "(no error: batch 2 assisted generation ran)"


# ------------------------------------------------------------------ timing


@dataclasses.dataclass
class Config:
  """One measured configuration.

  Attributes:
    impl: 'ours' or 'hf'.
    method: 'target_only', 'spec_decode' (ours) or 'assisted' (HF).
    variant: gamma / assistant settings label ('' for target-only).
    sampling: 'greedy' or 'sampled'.
    batch: prompts per call.
    run: fn() -> (token rows, stats dict) of one pass over the prompts.
    gamma: ours' gamma or HF's num_assistant_tokens (None: n/a / default).
  """

  impl: str
  method: str
  variant: str
  sampling: str
  batch: int
  run: Callable[[], tuple[list[list[int]], dict]]
  gamma: int | None = None
  settings: dict = dataclasses.field(default_factory=dict)
  walls: list = dataclasses.field(default_factory=list)
  cpus: list = dataclasses.field(default_factory=list)
  tokens: list = dataclasses.field(default_factory=list)
  outputs: list = dataclasses.field(default_factory=list)
  stats: dict = dataclasses.field(default_factory=dict)
  warmup_s: float = 0.0

  @property
  def label(self) -> str:
    v = f"[{self.variant}]" if self.variant else ""
    return f"{self.impl} {self.method}{v} {self.sampling} b{self.batch}"


def pad_width(rows: Sequence[Sequence[int]], policy: str) -> int | None:
  """``generate``'s ``pad_to`` for a call on ``rows`` under ``policy``.

  'none': None (``generate`` pads to a multiple of 16: no wasted positions,
  one compiled program per width); 'pow2': the next power of two >= 16 (at
  most ~2x the positions, a handful of programs).
  """
  if policy == "none":
    return None
  if policy == "pow2":
    return max(16, 1 << (max(len(r) for r in rows) - 1).bit_length())
  raise ValueError(f"padding policy must be 'none' or 'pow2', got {policy!r}")


def ours_runner(pair: BenchPair, method: str, sampling: str, gamma: int,
                batch: int, seed: int = 0, pad: str = "none"):
  """fn() decoding every prompt with ``decoding.generate`` (``batch`` at a
  time; request ids = prompt indices, so samples do not depend on batch)."""
  meth = decoding.make_method(method)
  samp = decoding.Greedy() if sampling == "greedy" else (
      decoding.Temperature(1.0))
  key = "inputs" if pair.encdec else "prompts"

  def run():
    out, stats = [], dict(verifier_calls=0, drafter_calls=0, drafted=0,
                          accepted=0)
    for lo in range(0, len(pair.rows), batch):
      idx = list(range(lo, min(lo + batch, len(pair.rows))))
      rows = [pair.rows[i] for i in idx]
      res = decoding.generate(
          meth, pair.drafter, pair.verifier, pair.q_params, pair.p_params,
          **{key: rows}, sampling=samp, gamma=gamma,
          max_new_tokens=pair.max_new_tokens, seeds=seed, request_ids=idx,
          pad_to=pad_width(rows, pad))
      out += res.sequences()
      for k in stats:
        stats[k] += int(getattr(res, k).sum())
    return out, stats

  return run


def hf_runner(pair: BenchPair, target: tuple, sampling: str,
              assistant: tuple | None = None,
              variant: HFAssist | None = None, seed: int = 0):
  """fn() decoding every prompt alone with HF ``generate``.

  Args:
    target, assistant: (torch model, its CallCounter).
  """
  cfg = dict(encdec=pair.encdec, max_new=pair.max_new_tokens,
             eos_id=int(pair.verifier.eos_id),
             pad_id=int(pair.verifier.config.pad_id))
  target, t_count = target
  assistant, a_count = assistant or (None, None)

  def run():
    if assistant is not None:
      configure_assistant(assistant, variant)
    t_count.take()
    if a_count:
      a_count.take()
    out = [hf_generate(target, row, sampled=sampling == "sampled",
                       seed=seed * 100003 + i, assistant=assistant, **cfg)
           for i, row in enumerate(pair.rows)]
    stats = dict(verifier_calls=t_count.take())
    if a_count:
      stats["drafter_calls"] = a_count.take()
    return out, stats

  return run


def pick_torch_threads(pair: BenchPair, target: tuple, assistant: tuple,
                       gamma: int, candidates: Sequence[int], log=print
                       ) -> tuple[int, dict]:
  """The torch thread count at which HF is fastest on this machine now.

  On a CPU shared with other jobs, torch's OpenMP threads can spin-wait on
  each other (every small op synchronises them), making HF many times slower
  with 2 threads than with 1. This times HF greedy target-only plus assisted
  generation on the first 4 prompts at each count (best of 2 after a warm
  pass) and keeps the fastest, so HF is measured at its best.

  Returns:
    (threads, {threads: seconds}).
  """
  import torch  # pylint: disable=g-import-not-at-top
  few = dataclasses.replace(pair, rows=pair.rows[:4])
  runs = [hf_runner(few, target, "greedy"),
          hf_runner(few, target, "greedy", assistant,
                    HFAssist("calibration", gamma, "constant", 0.0))]
  seconds = {}
  for n in candidates:
    torch.set_num_threads(n)
    for r in runs:
      r()
    best = float("inf")
    for _ in range(2):
      t = time.perf_counter()
      for r in runs:
        r()
      best = min(best, time.perf_counter() - t)
    seconds[n] = best
  threads = min(seconds, key=seconds.get)
  torch.set_num_threads(threads)
  log(f"[{pair.name}] torch threads: {threads} (HF seconds on 4 prompts by "
      f"thread count: {seconds})")
  return threads, seconds


def measure(configs: list[Config], repeats: int, log=print) -> None:
  """One untimed pass of every config, then ``repeats`` interleaved passes."""
  for c in configs:
    t = time.perf_counter()
    c.outputs, c.stats = c.run()
    c.warmup_s = time.perf_counter() - t
    log(f"  warm-up {c.label}: {c.warmup_s:.1f} s")
  for r in range(repeats):
    for c in configs:
      w, p = time.perf_counter(), time.process_time()
      out, stats = c.run()
      c.walls.append(time.perf_counter() - w)
      c.cpus.append(time.process_time() - p)
      c.tokens.append(sum(len(o) for o in out))
      if out != c.outputs and c.sampling == "greedy":
        raise RuntimeError(f"{c.label}: greedy outputs changed between "
                           f"passes")
      c.outputs, c.stats = out, stats
    log(f"  pass {r + 1}/{repeats}: " + ", ".join(
        f"{c.label} {c.tokens[-1] / c.walls[-1]:.0f} tok/s" for c in configs))


def summary_row(c: Config) -> dict:
  """The JSON row of a measured config."""
  tps = [n / w for n, w in zip(c.tokens, c.walls)]
  tpc = [n / p for n, p in zip(c.tokens, c.cpus)]
  toks = c.tokens[-1]
  row = dict(impl=c.impl, method=c.method, variant=c.variant,
             sampling=c.sampling, batch=c.batch, gamma=c.gamma,
             tokens_per_s=statistics.median(tps), tokens_per_s_runs=tps,
             tokens_per_cpu_s=statistics.median(tpc),
             wall_s_runs=c.walls, cpu_s_runs=c.cpus, tokens=toks,
             mean_tokens=toks / max(len(c.outputs), 1),
             warmup_s=c.warmup_s, settings=c.settings, **c.stats)
  if c.stats.get("verifier_calls"):
    row["tokens_per_verifier_call"] = toks / c.stats["verifier_calls"]
  if c.stats.get("drafted"):
    row["acceptance_rate"] = c.stats["accepted"] / c.stats["drafted"]
  return row


# ------------------------------------------------------------------ parity


def first_divergence(a: list[int], b: list[int]) -> int | None:
  """Index of the first differing token (a length difference counts)."""
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


def compare(ours: list[list[int]], theirs: list[list[int]]) -> dict:
  """Token-for-token comparison of two lists of generated sequences."""
  diverged = [(i, first_divergence(a, b))
              for i, (a, b) in enumerate(zip(ours, theirs))]
  diverged = [(i, d) for i, d in diverged if d is not None]
  return dict(identical=len(ours) - len(diverged), total=len(ours),
              all_identical=not diverged,
              diverged=[dict(prompt=i, position=d) for i, d in diverged])


def _top2(logits: np.ndarray) -> tuple[int, int, float]:
  order = np.argsort(-logits)
  return int(order[0]), int(order[1]), float(logits[order[0]]
                                              - logits[order[1]])


def divergence_margin(pair: BenchPair, hf_target, prompt: int, prefix:
                      list[int], ours_next: int | None,
                      hf_next: int | None) -> dict:
  """Verifier logits at a divergence, from both implementations (float32).

  Args:
    prompt: prompt index; prefix: the generated tokens both agree on.
    ours_next, hf_next: the token each implementation chose there (None if
      it had stopped).
  """
  import torch  # pylint: disable=g-import-not-at-top
  row = pair.rows[prompt]
  if pair.encdec:
    start = int(pair.verifier.config.decoder_start_id)
    dec = [start] + prefix
    ours = pair.verifier.forward(pair.p_params, jnp.asarray([dec]),
                                 inputs=jnp.asarray([row]))
    with torch.inference_mode():
      theirs = hf_target(input_ids=torch.tensor([row]),
                         decoder_input_ids=torch.tensor([dec])).logits
  else:
    dec = row + prefix
    ours = pair.verifier.forward(pair.p_params, jnp.asarray([dec]))
    with torch.inference_mode():
      theirs = hf_target(input_ids=torch.tensor([dec])).logits
  ours = np.asarray(ours[0, -1], np.float64)
  theirs = theirs[0, -1].double().numpy()
  o1, o2, om = _top2(ours)
  h1, h2, hm = _top2(theirs)
  return dict(prompt=prompt, position=len(prefix), ours_token=ours_next,
              hf_token=hf_next, ours_top2=[o1, o2], ours_margin=om,
              hf_top2=[h1, h2], hf_margin=hm,
              max_abs_logit_diff=float(np.max(np.abs(ours - theirs))))


def parity(pair: BenchPair, hf_target, ours: list[list[int]],
           theirs: list[list[int]], explain: int = 3) -> dict:
  """:func:`compare` plus the logit margin at the first ``explain``
  divergences."""
  out = compare(ours, theirs)
  for d in out["diverged"][:explain]:
    i, pos = d["prompt"], d["position"]
    nxt = lambda s: s[pos] if pos < len(s) else None
    d.update(divergence_margin(pair, hf_target, i, ours[i][:pos],
                               nxt(ours[i]), nxt(theirs[i])))
  return out


# ------------------------------------------------------------------ a pair


def bench_pair(pair: BenchPair, hf_dir: str, *, repeats: int = 3,
               batch: int = 8, gammas: Sequence[int] = SWEEP_GAMMAS,
               gamma: int = DEFAULT_GAMMA, seed: int = 0,
               hf_default_variants: bool = True, pad: str = "none",
               torch_threads: Sequence[int] = (), log=print) -> dict:
  """Everything for one pair; returns its JSON dict.

  Args:
    pair: the models and prompts.
    hf_dir: where the HF export goes.
    repeats: timed passes over the prompt set (median reported).
    batch: ours' batched size (0: skip batched runs).
    gammas: ours' greedy batch-1 sweep (besides ``gamma``) for the best one.
    gamma: the like-for-like gamma (HF ``num_assistant_tokens``).
    seed: sampling seed (both sides).
    hf_default_variants: also run transformers' default assistant settings
      and the heuristic schedule.
    pad: ours' padding policy (:func:`pad_width`).
    torch_threads: candidate torch thread counts (:func:`pick_torch_threads`;
      empty: keep the current setting).
  """
  import torch  # pylint: disable=g-import-not-at-top
  t0 = time.perf_counter()
  paths = export_hf(pair, hf_dir)
  hf_p = load_hf(paths["verifier"], pair.encdec)
  hf_q = load_hf(paths["drafter"], pair.encdec)
  target, assistant = (hf_p, CallCounter(hf_p)), (hf_q, CallCounter(hf_q))
  calibration = {}
  if torch_threads:
    _, calibration = pick_torch_threads(pair, target, assistant, gamma,
                                        torch_threads, log)
  log(f"[{pair.name}] {len(pair.rows)} prompts, exported to {hf_dir} and "
      f"loaded in transformers ({time.perf_counter() - t0:.1f} s)")

  # 1. Ours: pick the best greedy gamma at batch 1.
  sweep = [Config("ours", "spec_decode", f"gamma={g}", "greedy", 1,
                  ours_runner(pair, "spec_decode", "greedy", g, 1, seed,
                              pad), gamma=g)
           for g in sorted(set(gammas) | {gamma})]
  log(f"[{pair.name}] gamma sweep (ours, greedy, batch 1)")
  measure(sweep, repeats, log)
  sweep_rows = [summary_row(c) for c in sweep]
  best = max(sweep_rows, key=lambda r: r["tokens_per_s"])["gamma"]
  use = sorted({gamma, best})

  # 2. Everything at batch 1, interleaved.
  configs = []
  for s in ("greedy", "sampled"):
    configs.append(Config("ours", "target_only", "", s, 1,
                          ours_runner(pair, "target_only", s, 1, 1, seed,
                                      pad)))
    for g in use:
      configs.append(Config("ours", "spec_decode", f"gamma={g}", s, 1,
                            ours_runner(pair, "spec_decode", s, g, 1, seed,
                                        pad), gamma=g))
    configs.append(Config("hf", "target_only", "", s, 1,
                          hf_runner(pair, target, s, seed=seed)))
    variants = [HFAssist(f"constant-{g}", g, "constant", 0.0) for g in use]
    if hf_default_variants:
      variants += [HFAssist("default"),
                   HFAssist(f"heuristic-{gamma}", gamma, "heuristic", 0.0)]
    for v in variants:
      settings = configure_assistant(hf_q, v)
      configs.append(Config("hf", "assisted", v.name, s, 1,
                            hf_runner(pair, target, s, assistant, v, seed),
                            gamma=v.num_tokens, settings=settings))
  if batch > 1:
    for s in ("greedy", "sampled"):
      configs.append(Config("ours", "target_only", "", s, batch,
                            ours_runner(pair, "target_only", s, 1, batch,
                                        seed, pad)))
      for g in use:
        configs.append(Config("ours", "spec_decode", f"gamma={g}", s, batch,
                              ours_runner(pair, "spec_decode", s, g, batch,
                                          seed, pad), gamma=g))
  log(f"[{pair.name}] main measurements ({len(configs)} configurations)")
  measure(configs, repeats, log)
  rows = [summary_row(c) for c in configs]

  def find(impl, method, sampling, b=1, variant=""):
    for c, r in zip(configs, rows):
      if (c.impl, c.method, c.sampling, c.batch, c.variant) == (
          impl, method, sampling, b, variant):
        return c, r
    return None, None

  # 3. Speedups and ratios.
  speedups, ratios = [], []
  for s in ("greedy", "sampled"):
    _, ours_t = find("ours", "target_only", s)
    _, hf_t = find("hf", "target_only", s)
    ratios.append(dict(sampling=s, what="target_only",
                       ours_over_hf=ours_t["tokens_per_s"]
                       / hf_t["tokens_per_s"]))
    for c, r in zip(configs, rows):
      if c.sampling != s or c.method == "target_only":
        continue
      base = (ours_t if c.impl == "ours" else hf_t) if c.batch == 1 else (
          find("ours", "target_only", s, c.batch)[1])
      speedups.append(dict(impl=c.impl, variant=c.variant, sampling=s,
                           batch=c.batch,
                           speedup=r["tokens_per_s"] / base["tokens_per_s"],
                           tokens_per_s=r["tokens_per_s"]))
    for g in use:
      _, o = find("ours", "spec_decode", s, 1, f"gamma={g}")
      _, h = find("hf", "assisted", s, 1, f"constant-{g}")
      ratios.append(dict(sampling=s, what=f"spec gamma={g} vs assisted "
                         f"constant-{g}",
                         ours_over_hf=o["tokens_per_s"] / h["tokens_per_s"]))
    hf_best = max((r for c, r in zip(configs, rows)
                   if (c.impl, c.method, c.sampling, c.batch) == (
                       "hf", "assisted", s, 1)),
                  key=lambda r: r["tokens_per_s"])
    ours_best = max((r for c, r in zip(configs, rows)
                     if (c.impl, c.method, c.sampling, c.batch) == (
                         "ours", "spec_decode", s, 1)),
                    key=lambda r: r["tokens_per_s"])
    ratios.append(dict(sampling=s, what=f"best spec ({ours_best['variant']})"
                       f" vs best assisted ({hf_best['variant']})",
                       ours_over_hf=ours_best["tokens_per_s"]
                       / hf_best["tokens_per_s"]))

  # 4. Greedy outputs, token for token.
  ident = {}
  ours_t, _ = find("ours", "target_only", "greedy")
  hf_t, _ = find("hf", "target_only", "greedy")
  ident["target_only: ours vs hf"] = parity(pair, hf_p, ours_t.outputs,
                                            hf_t.outputs)
  for c in configs:
    if c.sampling != "greedy" or c.method == "target_only":
      continue
    ref = ours_t if c.impl == "ours" else hf_t
    ident[f"{c.label} vs {ref.label}"] = compare(c.outputs, ref.outputs)
  ident["hf batch-2 assisted generation"] = hf_batch_error(
      hf_p, hf_q, pair.rows, pair.encdec, pair.max_new_tokens,
      int(pair.verifier.eos_id), int(pair.verifier.config.pad_id))

  # 5. The goal.
  goal = {}
  for s in ("greedy", "sampled"):
    _, ot = find("ours", "target_only", s)
    _, ht = find("hf", "target_only", s)
    _, og = find("ours", "spec_decode", s, 1, f"gamma={gamma}")
    _, hg = find("hf", "assisted", s, 1, f"constant-{gamma}")
    o_sp = og["tokens_per_s"] / ot["tokens_per_s"]
    h_sp = hg["tokens_per_s"] / ht["tokens_per_s"]
    goal[s] = dict(
        target_only_ratio=ot["tokens_per_s"] / ht["tokens_per_s"],
        spec_ratio=og["tokens_per_s"] / hg["tokens_per_s"],
        ours_speedup=o_sp, hf_speedup=h_sp,
        ours_at_least_2x_hf=bool(ot["tokens_per_s"] >= 2 * ht["tokens_per_s"]
                                 and og["tokens_per_s"]
                                 >= 2 * hg["tokens_per_s"]),
        speedup_at_least_hf=bool(o_sp >= h_sp))
  n = [len(r) for r in pair.rows]
  return dict(
      name=pair.name, encoder_decoder=pair.encdec,
      max_new_tokens=pair.max_new_tokens,
      prompts=dict(count=len(n), mean_tokens=float(np.mean(n)),
                   max_tokens=max(n)),
      models=dict(verifier_params=pair.verifier.num_params(),
                  drafter_params=pair.drafter.num_params(),
                  hf_classes=[type(hf_p).__name__, type(hf_q).__name__],
                  hf_attn_implementation=getattr(
                      hf_p.config, "_attn_implementation", None)),
      torch_threads=torch.get_num_threads(),
      torch_threads_calibration=calibration, ours_pad=pad,
      gamma_sweep=sweep_rows,
      best_gamma=best, rows=rows, speedups=speedups, ratios=ratios,
      identity=ident, goal=goal, seconds=time.perf_counter() - t0)


# ------------------------------------------------------------------ output


def machine_facts() -> dict:
  model = ""
  try:
    with open("/proc/cpuinfo") as f:
      model = next((l.split(":", 1)[1].strip() for l in f
                    if l.startswith("model name")), "")
  except OSError:
    pass
  return dict(cores=os.cpu_count(), cpu=model, platform=platform.platform(),
              load_average_start=list(os.getloadavg()), note=SHARED_NOTE)


def versions() -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  return dict(python=platform.python_version(), jax=jax.__version__,
              jax_backend=jax.default_backend(), torch=torch.__version__,
              transformers=transformers.__version__, numpy=np.__version__)


def _f(x, nd=2):
  return "-" if x is None else f"{x:.{nd}f}"


def markdown(result: dict) -> str:
  m = result["machine"]
  lines = [
      "# specdec_jax vs HF transformers (same CPU, weights and prompts)", "",
      f"Command: `{result['command']}`  ",
      f"Started {result['started']}; {m['cores']} cores ({m['cpu']}); "
      f"load average at start {m['load_average_start']}, at end "
      f"{m['load_average_end']}; {SHARED_NOTE}.  ",
      "Versions: " + ", ".join(f"{k} {v}" for k, v in
                               result["versions"].items()) + ".  ",
      f"Batch 1: each prompt alone; tokens/s = generated tokens / wall "
      f"seconds of a pass over all prompts, median of {result['repeats']} "
      f"passes after one untimed warm-up pass (compilation excluded); "
      f"configurations interleaved within each pass. float32 on both sides. "
      f"HF: eval mode, inference_mode, torch threads per pair below (the "
      f"faster of 1 and all cores, timed first: on a loaded machine torch's "
      f"OpenMP threads spin-wait on each other). Ours: each call pads "
      f"prompts to {PAD_TEXT[result['ours_pad']]}.", ""]
  for p in result["pairs"]:
    lines += [f"## {p['name']}", "",
              f"{p['prompts']['count']} test prompts (mean "
              f"{p['prompts']['mean_tokens']:.0f}, max "
              f"{p['prompts']['max_tokens']} tokens), max_new_tokens "
              f"{p['max_new_tokens']}, stop at EOS; verifier "
              f"{p['models']['verifier_params'] / 1e6:.2f}M / drafter "
              f"{p['models']['drafter_params'] / 1e6:.2f}M parameters; HF "
              f"classes {', '.join(p['models']['hf_classes'])}. Torch "
              f"threads {p['torch_threads']} (calibration seconds "
              f"{p['torch_threads_calibration']}). Best gamma of ours' "
              f"greedy sweep: {p['best_gamma']}.", "",
              "| impl | method | variant | sampling | batch | tokens/s | "
              "tokens/CPU-s | mean tokens | tokens / verifier call | "
              "acceptance |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in p["rows"]:
      lines.append(
          f"| {r['impl']} | {r['method']} | {r['variant'] or '-'} | "
          f"{r['sampling']} | {r['batch']} | {r['tokens_per_s']:.1f} | "
          f"{r['tokens_per_cpu_s']:.1f} | {r['mean_tokens']:.1f} | "
          f"{_f(r.get('tokens_per_verifier_call'))} | "
          f"{_f(r.get('acceptance_rate'))} |")
    lines += ["", "Speedup (vs the same implementation's target-only at the "
              "same sampling and batch):", "",
              "| impl | variant | sampling | batch | speedup |",
              "|---|---|---|---|---|"]
    for s in p["speedups"]:
      lines.append(f"| {s['impl']} | {s['variant']} | {s['sampling']} | "
                   f"{s['batch']} | {s['speedup']:.2f}x |")
    lines += ["", "ours / HF tokens/s at batch 1:", "",
              "| sampling | comparison | ours / HF |", "|---|---|---|"]
    for r in p["ratios"]:
      lines.append(f"| {r['sampling']} | {r['what']} | "
                   f"{r['ours_over_hf']:.2f}x |")
    lines += ["", "Greedy outputs, token for token:", ""]
    for k, v in p["identity"].items():
      if isinstance(v, str):
        lines.append(f"* {k}: `{v}`")
        continue
      lines.append(f"* {k}: {v['identical']}/{v['total']} identical")
      for d in v["diverged"]:
        if "ours_margin" in d:
          lines.append(
              f"  * prompt {d['prompt']}, token {d['position']}: ours "
              f"{d['ours_token']} vs HF {d['hf_token']}; verifier top-2 "
              f"margin ours {d['ours_margin']:.2e} (top-2 {d['ours_top2']}), "
              f"HF {d['hf_margin']:.2e} (top-2 {d['hf_top2']}); max |logit "
              f"diff| {d['max_abs_logit_diff']:.2e}")
    lines += ["", f"Goal (ours >= 2x HF tokens/s at batch 1, speedup >= "
              f"HF's; gamma {result['gamma']} vs constant-"
              f"{result['gamma']}):", ""]
    for s, g in p["goal"].items():
      lines.append(
          f"* {s}: target-only {g['target_only_ratio']:.2f}x HF, spec "
          f"{g['spec_ratio']:.2f}x HF -> 2x goal "
          f"{'MET' if g['ours_at_least_2x_hf'] else 'NOT met'}; speedup ours "
          f"{g['ours_speedup']:.2f}x vs HF {g['hf_speedup']:.2f}x -> "
          f"{'MET' if g['speedup_at_least_hf'] else 'NOT met'}")
    lines.append("")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default="benchmarks/results/bench_vs_hf",
                  help="writes <out>.json and <out>.md")
  ap.add_argument("--pairs", default="t5_codegen,gemma_completion")
  ap.add_argument("--assets", default=None,
                  help="default-models directory (default: the package's)")
  ap.add_argument("--num_prompts", type=int, default=32)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--gamma", type=int, default=DEFAULT_GAMMA)
  ap.add_argument("--sweep_gammas", default=",".join(map(str, SWEEP_GAMMAS)))
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--torch_threads", type=int, default=0,
                  help="0: the faster of 1 and all cores for HF "
                  "(pick_torch_threads)")
  ap.add_argument("--ours_pad", default="none", choices=("none", "pow2"),
                  help="ours' prompt padding (pad_width); 'pow2' compiles "
                  "fewer programs")
  ap.add_argument("--compilation_cache_dir",
                  default=os.path.join(tempfile.gettempdir(),
                                       "bench_vs_hf_jax_cache"),
                  help="persistent JAX compilation cache ('' disables)")
  ap.add_argument("--smoke", action="store_true",
                  help="tiny random T5 / Gemma pairs, 6 prompts, 1 repeat, "
                  "gamma sweep {3}")
  args = ap.parse_args(argv)
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  transformers.logging.set_verbosity_error()
  cores = os.cpu_count() or 1
  torch.set_num_threads(args.torch_threads or cores)
  threads = () if args.torch_threads else tuple(sorted({1, cores}))
  if args.compilation_cache_dir:
    jax.config.update("jax_compilation_cache_dir", args.compilation_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if args.smoke:
    args.num_prompts, args.repeats = min(args.num_prompts, 6), 1
    args.sweep_gammas = "3"
  started = time.strftime("%Y-%m-%d %H:%M:%S")
  facts = machine_facts()
  gammas = [int(g) for g in args.sweep_gammas.split(",") if g]
  pairs = []
  with tempfile.TemporaryDirectory(prefix="bench_vs_hf_") as tmp:
    for name in args.pairs.split(","):
      if args.smoke:
        family = "t5" if "t5" in name else "gemma"
        pair = stand_in_pair(family, args.num_prompts)
      else:
        pair = default_pair(name, args.num_prompts, args.assets)
      pairs.append(bench_pair(pair, tmp, repeats=args.repeats,
                              batch=args.batch, gammas=gammas,
                              gamma=args.gamma, seed=args.seed,
                              pad=args.ours_pad, torch_threads=threads))
      # Free the pair's compiled programs: hundreds of live CPU executables
      # can exhaust the process's memory maps (LLVM "Cannot allocate memory").
      decoding.clear_compiled()
  facts["load_average_end"] = list(os.getloadavg())
  result = dict(command="PYTHONPATH=. python " + " ".join(
      [os.path.relpath(sys.argv[0])] + sys.argv[1:]) if argv is None
                else "bench_vs_hf.main(" + repr(list(argv)) + ")",
                started=started, machine=facts, versions=versions(),
                repeats=args.repeats, gamma=args.gamma,
                ours_pad=args.ours_pad, smoke=args.smoke,
                pairs=pairs)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(args.out + ".md", "w") as f:
    f.write(markdown(result))
  print(markdown(result))
  print(f"wrote {args.out}.json and {args.out}.md")
  return result


if __name__ == "__main__":
  main()
