"""Builds the default models: corpus -> tokenizers -> 4 models -> report.

Reproduces ``specdec_jax/assets/default_models`` from this machine's CPython
standard library with fixed seeds (docs/default_models.md):

  PYTHONPATH=. python scripts/train_default_models.py          # everything
  PYTHONPATH=. python scripts/train_default_models.py --pairs gemma_completion
  PYTHONPATH=. python scripts/train_default_models.py --smoke \\
      --out /tmp/dm --workdir /tmp/dm_work                     # a few minutes

Stages per pair: SentencePiece tokenizer on the training split; drafter and
verifier trained from scratch (float32, AdamW, best validation loss kept);
checkpoints written in bfloat16; then greedy quality of both models on the
test split, the acceptance rate of SpecDecode (gamma 5, T = 0 and 1), a
TokenV3 cascade sweep, and the drafter/verifier cost ratios. Everything lands
in ``<out>/metadata.json``.

Resumable: training state is checkpointed to ``--workdir`` at every
evaluation and a rerun continues from it; finished models (a ``done`` marker
in the workdir) and tokenizers are reused unless ``--force``.
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

from specdec_jax import decoding
from specdec_jax import tokenizer as tokenizer_lib
from specdec_jax import train as train_lib
from specdec_jax.checkpoints import native
from specdec_jax.eval import corpus as corpus_lib
from specdec_jax.eval import default_models as dm
from specdec_jax.eval import metrics as metrics_lib
from specdec_jax.models import GemmaConfig, T5Config, model_from_config
from specdec_jax.models.gemma import GLOBAL, LOCAL

V = 2048
ARCHS = {
    "t5_docstring": {
        "verifier": T5Config(vocab_size=V, d_model=256, num_heads=4,
                             head_dim=64, num_encoder_layers=3,
                             num_decoder_layers=3, mlp_dim=768),
        "drafter": T5Config(vocab_size=V, d_model=64, num_heads=2,
                            head_dim=32, num_encoder_layers=2,
                            num_decoder_layers=2, mlp_dim=256),
    },
    "gemma_completion": {  # Gemma 2 style: local/global, soft caps, GQA
        "verifier": GemmaConfig(
            vocab_size=V, d_model=256, num_layers=4, num_heads=4,
            num_kv_heads=2, head_dim=64, mlp_dim=1024,
            attention_types=(LOCAL, GLOBAL) * 2, sliding_window=128,
            attn_logit_softcap=50.0, final_logit_softcap=30.0,
            use_post_attn_norm=True, use_post_ffw_norm=True),
        "drafter": GemmaConfig(
            vocab_size=V, d_model=64, num_layers=2, num_heads=2,
            num_kv_heads=1, head_dim=32, mlp_dim=256,
            attention_types=(LOCAL, GLOBAL), sliding_window=128,
            attn_logit_softcap=50.0, final_logit_softcap=30.0,
            use_post_attn_norm=True, use_post_ffw_norm=True),
    },
}
TRAIN = {
    # (A second, warm-restart cycle of 250 steps raised its validation loss
    # from 3.78 to 3.89: the 5.5k training examples are too few.)
    ("t5_docstring", "verifier"): train_lib.TrainConfig(
        steps=500, learning_rate=1e-3, warmup_steps=50, eval_every=50,
        log_every=10, seed=1),
    ("t5_docstring", "drafter"): train_lib.TrainConfig(
        steps=1500, learning_rate=2e-3, warmup_steps=100, eval_every=100,
        log_every=50, seed=2),
    # Two cycles: the second, warm restart at half the peak.
    ("gemma_completion", "verifier"): train_lib.TrainConfig(
        steps=700, learning_rate=1e-3, warmup_steps=50, eval_every=50,
        log_every=10, seed=3, cycle_lengths=(450, 250), cycle_decay=0.5),
    ("gemma_completion", "drafter"): train_lib.TrainConfig(
        steps=1500, learning_rate=2e-3, warmup_steps=100, eval_every=100,
        log_every=50, seed=4),
}
BATCH_SIZE = 32
DATA_SEED = 0
PROMPT_WEIGHT = 0.5  # Gemma: loss weight of prompt tokens (targets: 1)
T5_INPUT_BUCKETS = (64, 128, 192, 256)
T5_TARGET_BUCKETS = (32, 64)
LM_BUCKETS = (64, 96, 128, 192, 256, 384)
GAMMA = 5
EVAL_BATCH = 512
CASCADE_ALPHAS = (0.1, 0.3, 0.5)


def log(msg: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_tokenizer(task: str, corpus, out_dir: str, force: bool):
  """Trains (or reuses) the task's SentencePiece model on its train split."""
  spec = dm.TASKS[task]
  path = os.path.join(out_dir, task, dm.TOKENIZER)
  if os.path.isfile(path) and not force:
    log(f"{task}: reusing tokenizer {path}")
    return tokenizer_lib.Tokenizer(path, spec.family, extra_ids=0)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  train = corpus.examples[task]["train"]
  texts = [e["inputs"] for e in train] + [e["targets"] for e in train]
  t = time.perf_counter()
  tok = tokenizer_lib.train(texts, spec.vocab_size, spec.family, path=path,
                            extra_ids=0, **dm.SPM_OPTIONS)
  log(f"{task}: tokenizer with {tok.vocab_size} ids in "
      f"{time.perf_counter() - t:.1f}s")
  return tok


def tokenize(tok, spec, examples):
  return [(dm.encode_inputs(tok, spec, e["inputs"]),
           dm.encode_targets(tok, spec, e["targets"])) for e in examples]


def batch_maker(spec, tok, prompt_weight: float):
  if spec.family == "t5":
    return lambda rows: train_lib.seq2seq_batch(
        rows, T5_INPUT_BUCKETS, T5_TARGET_BUCKETS, tok.eos_id)
  return lambda rows: train_lib.lm_batch(rows, LM_BUCKETS, tok.eos_id,
                                         prompt_weight=prompt_weight)


def train_model(task: str, role: str, tok, data: dict, args) -> dict:
  """Trains one model (or reuses a finished one); returns its report."""
  spec = dm.TASKS[task]
  arch = dataclasses.replace(ARCHS[task][role], vocab_size=tok.vocab_size)
  model = model_from_config(arch)
  cfg = TRAIN[(task, role)]
  if args.smoke:
    cfg = dataclasses.replace(cfg, steps=args.smoke_steps,
                              warmup_steps=2, eval_every=args.smoke_steps,
                              log_every=5)
  workdir = os.path.join(args.workdir, task, role)
  out = os.path.join(args.out, task, role)
  done = os.path.join(workdir, "done.json")
  if os.path.isfile(done) and native.is_native(out) and not args.force:
    log(f"{task}/{role}: reusing trained model {out}")
    with open(done) as f:
      return json.load(f)
  if args.force and os.path.isdir(workdir):
    for name in os.listdir(workdir):
      os.remove(os.path.join(workdir, name))
  log(f"{task}/{role}: {model.num_params():,} parameters, {cfg.steps} steps")
  train_rows = data["train"]
  make = batch_maker(spec, tok, PROMPT_WEIGHT)
  length = lambda r: len(r[0]) + len(r[1])
  stream = lambda start: train_lib.bucketed_stream(
      train_rows, make, BATCH_SIZE, length, seed=DATA_SEED + cfg.seed,
      start_step=start)
  val = sorted(data["validation"], key=length)
  make_eval = batch_maker(spec, tok, 0.0)  # select on target tokens only
  eval_batches = [make_eval(val[i:i + BATCH_SIZE])
                  for i in range(0, len(val), BATCH_SIZE)]
  params = train_lib.init_params(model, cfg.seed)
  result = train_lib.train(model, params, cfg, stream, eval_batches,
                           workdir=workdir, log=lambda s: log(
                               f"{task}/{role}: {s}"))
  native.save(out, model, result.params, dtype="bfloat16")
  history = result.history
  seconds = sum(h["elapsed_s"] for h in _segments(history))
  report = dict(
      config=native.config_to_dict(arch), params=model.num_params(),
      checkpoint_mb=round(os.path.getsize(os.path.join(out, native.PARAMS))
                          / 2**20, 3),
      train_config=dataclasses.asdict(cfg), batch_size=BATCH_SIZE,
      prompt_weight=PROMPT_WEIGHT if spec.family == "gemma" else None,
      best_step=result.best_step, best_eval_loss=result.best_eval_loss,
      final_train_loss=next((h["loss"] for h in reversed(history)
                             if "loss" in h), None),
      train_seconds=round(seconds, 1),
      train_tokens_per_s=round(statistics.median(
          h["tokens_per_s"] for h in history if "tokens_per_s" in h), 1))
  with open(done, "w") as f:
    json.dump(report, f, indent=1)
  return report


def _segments(history):
  """Last log row of every (possibly resumed) run segment: their elapsed_s
  sum is the total training time."""
  rows = [h for h in history if "elapsed_s" in h]
  out = []
  for a, b in zip(rows, rows[1:] + [None]):
    if b is None or b["elapsed_s"] < a["elapsed_s"]:
      out.append(a)
  return out


# --------------------------------------------------------------- evaluation


def run_method(pair, method, examples, sampling, seed=0):
  """Decodes ``examples`` in a few equal, length-sorted batches.

  At most EVAL_BATCH rows per batch and as few batches as possible: every
  batch's padded prompt width is a new compiled program. Rows get request
  ids 0..n-1, so sampled outputs do not depend on the batching.

  Returns (predictions in example order, summed statistics).
  """
  n_batches = -(-len(examples) // EVAL_BATCH)
  size = -(-len(examples) // n_batches)
  order = sorted(range(len(examples)),
                 key=lambda i: len(examples[i]["inputs"]))
  preds = [None] * len(examples)
  stats = dict(tokens=0, drafted=0, accepted=0, verifier_calls=0,
               drafter_calls=0, deferrals=0.0, seconds=0.0)
  for lo in range(0, len(order), size):
    idx = order[lo:lo + size]
    rows = [examples[i] for i in idx]
    pad = size - len(rows)  # one compiled batch size
    rows += [rows[-1]] * pad
    t = time.perf_counter()
    texts, out = pair.generate(method, rows, sampling=sampling, gamma=GAMMA,
                               seeds=seed,
                               request_ids=idx + [idx[-1]] * pad)
    stats["seconds"] += time.perf_counter() - t
    n = len(idx)
    for i, text in zip(idx, texts[:n]):
      preds[i] = text
    stats["tokens"] += int(out.lengths[:n].sum())
    stats["drafted"] += int(out.drafted[:n].sum())
    stats["accepted"] += int(out.accepted[:n].sum())
    stats["verifier_calls"] += int(out.verifier_calls[:n].sum())
    stats["drafter_calls"] += int(out.drafter_calls[:n].sum())
    stats["deferrals"] += float(out.deferrals[:n].sum())
  return preds, stats


def _row(pair, examples, preds, stats) -> dict:
  targets = [e["targets"] for e in examples]
  scores = metrics_lib.compute(pair.metrics, targets, preds)
  d = stats["drafted"]
  return dict(
      **{k: round(v, 3) for k, v in scores.items()},
      acceptance_rate=round(stats["accepted"] / d, 4) if d else None,
      tokens_per_verifier_call=round(
          stats["tokens"] / stats["verifier_calls"], 3)
      if stats["verifier_calls"] else None,
      deferral_rate=round(stats["deferrals"] / max(stats["tokens"], 1), 4),
      mean_tokens=round(stats["tokens"] / len(examples), 2),
      seconds=round(stats["seconds"], 1))


def step_seconds(model, params, context=32, repeats=30):
  """Median seconds of a jitted 1-token step (batch 1) after ``context``."""
  enc = None
  if model.is_encoder_decoder:
    enc = model.encode(params, jnp.full((1, 64), 5, jnp.int32))
  cache = model.init_cache(1, context + 8, enc)
  step = jax.jit(model.step)
  _, cache = step(params, jnp.full((1, context), 5, jnp.int32), cache)
  one = jnp.full((1, 1), 5, jnp.int32)
  jax.block_until_ready(step(params, one, cache))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(step(params, one, cache))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def step_flops(model, params, context=32) -> float:
  """XLA's FLOP count of one 1-token cached step (batch 1)."""
  enc = None
  if model.is_encoder_decoder:
    enc = model.encode(params, jnp.full((1, 64), 5, jnp.int32))
  cache = model.init_cache(1, context + 8, enc)
  one = jnp.full((1, 1), 5, jnp.int32)
  cost = jax.jit(model.step).lower(params, one, cache).compile()
  analysis = cost.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0]
  return float(analysis["flops"])


def weight_macs_per_token(cfg) -> int:
  """Multiply-adds of the weight matmuls of one decoded token."""
  if isinstance(cfg, T5Config):
    inner = cfg.num_heads * cfg.head_dim
    layer = 6 * cfg.d_model * inner + 3 * cfg.d_model * cfg.mlp_dim
    return cfg.num_decoder_layers * layer + cfg.d_model * cfg.vocab_size
  qkvo = cfg.d_model * cfg.head_dim * (2 * cfg.num_heads +
                                       2 * cfg.num_kv_heads)
  layer = qkvo + 3 * cfg.d_model * cfg.mlp_dim
  return cfg.num_layers * layer + cfg.d_model * cfg.vocab_size


def evaluate_pair(task: str, args) -> dict:
  """Quality, acceptance rates, a cascade sweep and costs of one pair."""
  pair = dm.load(task, assets=args.out)
  test = dm.examples(task, "test")
  if args.eval_limit:
    test = test[:args.eval_limit]
  log(f"{task}: evaluating on {len(test)} test examples")
  greedy, temp1 = decoding.Greedy(), decoding.Temperature(1.0)
  report = dict(test_examples=len(test), gamma=GAMMA)
  preds = {}
  for name, method, sampling in (
      ("verifier", "target_only", greedy), ("drafter", "drafter_only", greedy),
      ("spec_decode_t0", "spec_decode", greedy),
      ("spec_decode_t1", "spec_decode", temp1)):
    p, stats = run_method(pair, decoding.make_method(method), test, sampling)
    preds[name] = p
    report[name] = _row(pair, test, p, stats)
    log(f"{task}: {name}: {report[name]}")
  report["spec_decode_t0_equals_verifier"] = round(float(np.mean(
      [a == b for a, b in zip(preds["spec_decode_t0"], preds["verifier"])])),
                                                   4)
  report["drafter_equals_verifier"] = round(float(np.mean(
      [a == b for a, b in zip(preds["drafter"], preds["verifier"])])), 4)
  sweep = []
  for a in CASCADE_ALPHAS:
    p, stats = run_method(pair, decoding.make_method("token_v3", alpha=a),
                          test, greedy)
    sweep.append(dict(method="token_v3", alpha=a, temperature=0.0,
                      **_row(pair, test, p, stats)))
    log(f"{task}: token_v3 alpha={a}: {sweep[-1]}")
  report["cascade_token_v3"] = sweep
  q, p = pair.drafter, pair.verifier
  tq, tp = step_seconds(q, pair.q_params), step_seconds(p, pair.p_params)
  fq, fp = step_flops(q, pair.q_params), step_flops(p, pair.p_params)
  mq, mp = weight_macs_per_token(q.config), weight_macs_per_token(p.config)
  report["cost"] = dict(
      drafter_params=q.num_params(), verifier_params=p.num_params(),
      param_ratio=round(p.num_params() / q.num_params(), 2),
      drafter_weight_macs_per_token=mq, verifier_weight_macs_per_token=mp,
      weight_macs_ratio=round(mp / mq, 2),
      drafter_step_flops_xla=fq, verifier_step_flops_xla=fp,
      step_flops_ratio_xla=round(fp / fq, 2),
      drafter_step_ms=round(1e3 * tq, 3), verifier_step_ms=round(1e3 * tp, 3),
      measured_step_time_ratio=round(tp / tq, 2),
      c_drafter_over_verifier=round(tq / tp, 3),
      note="1-token cached step, batch 1, context 32; FLOPs from XLA's cost "
           "analysis; weight MACs exclude attention over the context")
  log(f"{task}: cost {report['cost']}")
  return report


def write_metadata(args, corpus, tokenizers: dict, reports: dict) -> None:
  path = os.path.join(args.out, dm.METADATA)
  old = {}
  if os.path.isfile(path):
    with open(path) as f:
      old = json.load(f)
  pairs = dict(old.get("pairs", {}))
  pairs.update(reports)
  meta = dict(
      description="Built-in default drafter/verifier pairs trained on the "
                  "CPython standard library; see docs/default_models.md",
      command="PYTHONPATH=. python " + " ".join(sys.argv),
      python=platform.python_version(), jax=jax.__version__,
      machine=f"{platform.machine()} {os.cpu_count()} cpus, "
              f"{jax.default_backend()}",
      corpus=dict(
          stdlib_root=corpus.root, corpus_hash=corpus.corpus_hash,
          split_seed=corpus_lib.SPLIT_SEED,
          split_percent=dict(test=corpus_lib.TEST_PERCENT,
                             validation=corpus_lib.VALIDATION_PERCENT),
          skip_dirs=sorted(corpus_lib.SKIP_DIRS), stats=corpus.stats,
          examples_hash={t: corpus.examples_hash(t) for t in corpus_lib.TASKS},
          files=list(corpus.files)),
      tokenizers={**old.get("tokenizers", {}), **tokenizers},
      pairs=pairs)
  os.makedirs(args.out, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(meta, f, indent=1)
  os.replace(path + ".tmp", path)
  log(f"wrote {path}")


def _metric_cells(row: dict, metrics) -> str:
  return " | ".join(f"{row[m]:.2f}" if row.get(m) is not None else "-"
                    for m in metrics)


def report_markdown(meta: dict) -> str:
  """The quality / acceptance / cost report of ``metadata.json`` (Markdown).

  Every number is read from the metadata the training run wrote; nothing is
  computed here but formatting.
  """
  lines = ["# Built-in default models: measured quality, acceptance, cost", "",
           f"Produced by `{meta['command']}` (python {meta['python']}, jax "
           f"{meta['jax']}, {meta['machine']}); corpus: the CPython standard "
           f"library at `{meta['corpus']['stdlib_root']}` (hash "
           f"{meta['corpus']['corpus_hash'][:16]}), held-out split by file "
           f"(seed {meta['corpus']['split_seed']}). Metrics in percent; "
           "greedy unless marked T=1.", ""]
  for task, rep in meta["pairs"].items():
    ev = rep.get("evaluation")
    if not ev:
      continue
    metrics = rep["task"]["metrics"]
    lines += [f"## {task}", ""]
    lines += ["| model | parameters | training steps | best step | best "
              "validation loss | checkpoint MB |", "|---|---|---|---|---|---|"]
    for role in ("drafter", "verifier"):
      r = rep[role]
      lines.append(f"| {role} | {r['params']:,} | {r['train_config']['steps']}"
                   f" | {r['best_step']} | {r['best_eval_loss']:.3f} | "
                   f"{r['checkpoint_mb']} |")
    lines += ["", f"{ev['test_examples']} test examples, gamma "
              f"{ev['gamma']}, max {rep['task']['max_new_tokens']} new tokens "
              "(stop at EOS).", "",
              "| run | " + " | ".join(metrics) + " | acceptance rate | tokens "
              "/ verifier call | deferral rate | mean tokens |",
              "|---|" + "---|" * (len(metrics) + 4)]
    runs = [("verifier (target-only)", ev["verifier"]),
            ("drafter (drafter-only)", ev["drafter"]),
            ("SpecDecode", ev["spec_decode_t0"]),
            ("SpecDecode, T=1", ev["spec_decode_t1"])]
    runs += [(f"SpecCascade [TokenV3] alpha={r['alpha']}", r)
             for r in ev["cascade_token_v3"]]
    fmt = lambda x: "-" if x is None else f"{x:.3f}"
    for name, r in runs:
      lines.append(f"| {name} | {_metric_cells(r, metrics)} | "
                   f"{fmt(r['acceptance_rate'])} | "
                   f"{fmt(r['tokens_per_verifier_call'])} | "
                   f"{fmt(r['deferral_rate'])} | {r['mean_tokens']} |")
    c = ev["cost"]
    lines += ["", f"Greedy SpecDecode equals the verifier's greedy output on "
              f"{100 * ev['spec_decode_t0_equals_verifier']:.1f}% of the test "
              f"examples (lossless); the drafter's equals it on "
              f"{100 * ev['drafter_equals_verifier']:.1f}%.", "",
              f"Cost per token (1-token cached step, batch 1): verifier / "
              f"drafter parameters {c['param_ratio']}x, weight multiply-adds "
              f"{c['weight_macs_ratio']}x, XLA FLOPs {c['step_flops_ratio_xla']}"
              f"x, measured CPU step time {c['measured_step_time_ratio']}x "
              f"({c['verifier_step_ms']} ms / {c['drafter_step_ms']} ms; c = "
              f"{c['c_drafter_over_verifier']}).", ""]
  return "\n".join(lines)


def write_report(args) -> None:
  with open(os.path.join(args.out, dm.METADATA)) as f:
    meta = json.load(f)
  os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
  with open(args.report, "w") as f:
    f.write(report_markdown(meta))
  log(f"wrote {args.report}")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=dm.ASSETS)
  ap.add_argument("--workdir", default="/tmp/specdec_default_models")
  ap.add_argument("--pairs", default=",".join(dm.PAIRS))
  ap.add_argument("--stage", default="all",
                  choices=("all", "train", "eval", "report"))
  ap.add_argument("--report", default="benchmarks/results/default_models.md",
                  help="Markdown report written from metadata.json after "
                  "an evaluation ('' for none)")
  ap.add_argument("--roles", default="drafter,verifier",
                  help="models to train (run roles in parallel processes "
                       "with --stage train, then --stage all to finish)")
  ap.add_argument("--eval_limit", type=int, default=0,
                  help="evaluate on the first N test examples (0: all)")
  ap.add_argument("--force", action="store_true",
                  help="retrain tokenizers and models from scratch")
  ap.add_argument("--smoke", action="store_true",
                  help="a few training steps per model (pipeline check)")
  ap.add_argument("--smoke_steps", type=int, default=10)
  ap.add_argument("--compilation_cache_dir", default=None,
                  help="persistent XLA cache (default: <workdir>/xla_cache)")
  args = ap.parse_args()
  jax.config.update("jax_compilation_cache_dir", args.compilation_cache_dir
                    or os.path.join(args.workdir, "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  if args.smoke and os.path.abspath(args.out) == os.path.abspath(dm.ASSETS):
    ap.error("--smoke needs --out outside the shipped assets")
  if args.stage == "report":
    write_report(args)
    return
  tasks = [t for t in args.pairs.split(",") if t]
  bad = [t for t in tasks if t not in dm.TASKS]
  if bad:
    ap.error(f"unknown pair {bad[0]!r}; choose from {dm.PAIRS}")
  t0 = time.perf_counter()
  corpus = corpus_lib.build()
  log(f"corpus: {len(corpus.files)} files, hash {corpus.corpus_hash[:16]}, "
      f"{json.dumps(corpus.stats)}")
  tokenizers, reports = {}, {}
  for task in tasks:
    spec = dm.TASKS[task]
    tok = build_tokenizer(task, corpus, args.out, args.force)
    tokenizers[task] = dict(
        family=spec.family, vocab_size=tok.vocab_size, extra_ids=0,
        fingerprint=tok.fingerprint, options=dm.SPM_OPTIONS,
        mb=round(os.path.getsize(os.path.join(args.out, task, dm.TOKENIZER))
                 / 2**20, 3))
    report = dict(task=dataclasses.asdict(spec))
    if args.stage in ("all", "train"):
      data = {s: tokenize(tok, spec, corpus.examples[task][s])
              for s in ("train", "validation")}
      for role in args.roles.split(","):
        report[role] = train_model(task, role, tok, data, args)
    if args.stage in ("all", "eval"):
      report["evaluation"] = evaluate_pair(task, args)
    old_path = os.path.join(args.out, dm.METADATA)
    if args.stage == "eval" and os.path.isfile(old_path):
      with open(old_path) as f:
        prev = json.load(f).get("pairs", {}).get(task, {})
      report = {**prev, **report}
    reports[task] = report
    write_metadata(args, corpus, tokenizers, reports)
  if args.stage in ("all", "eval") and args.report:
    write_report(args)
  log(f"done in {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
  main()
