"""The default families' sizes, training schedules, costs and report.

Used by ``build.py``; every number here is part of what the
shipped ``metadata.json`` records (``plan``), so a rerun reproduces it.
Step counts were sized from measured step times on the 2-core build machine
(docs/default_models.md). The first three-size build (2026-11-25, ~7 hours)
stopped the large models while their loss was still falling and made the
medium model the large one's first 2 decoder layers (1.8x cheaper): the
students caught up with their teacher (benchmarks/results/
default_models_progress.md). So the large stages now run ~3x longer and the
medium model is its own architecture, ~3.6x cheaper than the large one,
pretrained like the small one.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp

from specdec_jax.models import GemmaConfig, T5Config
from specdec_jax.models.gemma import GLOBAL, LOCAL
from tools.default_models import train as train_lib

DATA_SEED = 0
PROMPT_WEIGHT = 0.5  # Gemma: loss weight of prompt tokens (targets: 1)
LM_WINDOW = 256  # Gemma pretraining: ids predicted per window
# T5 prefix-LM pretraining pairs per task: (input ids, target ids) cut from
# the pretraining text. 't5_codegen' gives the decoder long targets: the
# T5 large of the fifth build (96 -> 48 pairs) predicted ~4x fewer pretraining
# tokens than the Gemma large (every position of its 256-id windows) and
# ended 0.73 nats per token behind it on the same task's validation targets
# (3.17 vs 2.44), with BLEU 3 against 10; code is what the decoder must write.
PREFIX_LM = {"t5_docstring": (96, 24), "t5_codegen": (64, 127)}
# T5 sizes whose pretraining mixes prefix-LM pairs into the docstring
# examples. Not the large one: pretrained on the 50/50 mix it read its
# prefix-LM inputs (real vs other examples' inputs: 0.25 nats apart) but not
# its task inputs (0.003 nats apart, even after task-tuning on 42k pairs:
# 0.015), looped in 13.7% of its greedy test outputs and scored the worst
# ROUGE-2 of the three sizes; a small model trained on the docstring pairs
# alone read them (0.10 nats) at the same task loss
# (benchmarks/results/default_models_progress.md, 2026-11-26).
PREFIX_LM_LEVELS = {"t5_docstring": ("medium", "small"),
                    "t5_codegen": ("large", "medium", "small")}
TOP_K = 32  # teacher log-probabilities kept per position
TEACHER_SEED = 1
TEACHER_DECODE_BATCH = 512
TEACHER_FORWARD_BATCH = 64
EXTRA_INPUTS = 8000  # teacher-only distillation inputs from the pretraining files
# More teacher-only inputs (the next ones of the same fixed random order of
# the pretraining files' task examples), for the levels of MORE_ROWS_LEVELS
# only: the teacher stage writes its greedy outputs and top-k along them as
# the split 'more'. Why, for the t5_codegen medium: its greedy alpha against
# the large (0.685 on test, ninth session) is measured along the large's own
# greedy outputs -- in greedy speculative decoding every verified prefix is
# the large's -- and the medium had fitted its 24k teacher rows (train loss
# 1.72, validation objective 3.54), so more of the large's greedy
# trajectories are the rows that count; the small (alpha 0.644 >= 0.5)
# keeps its rows.
MORE_INPUTS = {"t5_codegen": 20000}  # of the 21,304 left (this corpus)
MORE_ROWS_LEVELS = {"t5_codegen": ("medium",)}
# Test slice re-evaluated exactly by the tests, which also assert the quality
# ordering on it: 16 examples were too few for ROUGE-2 / BLEU to order.
SLICE_EXAMPLES = 64
SMOKE_EXAMPLES = 40
SMOKE_PRETRAIN_BYTES = 2**20
# Pretraining text per family (pretraining.py selection budget). The
# T5 family pretrains on the text's docstring examples plus prefix-LM pairs:
# 32 MiB gave 12,282 docstring examples, which the large model saw ~3 times
# in 2,400 steps, and it ended data-limited (its task validation loss
# 3.587 vs the medium's 3.664). 128 MiB gives 41,944 examples (measured on
# the build machine), less than one pass. The Gemma family reads windows of
# the whole text and saw 32 MiB about once.
PRETRAIN_BYTES = {"t5_docstring": 128 * 2**20,
                  "gemma_completion": 32 * 2**20,
                  "t5_codegen": 128 * 2**20}
CHECK_EXAMPLES = 96  # validation examples decoded after the large stage


def _gemma(d, layers, heads, kv_heads, head_dim, mlp) -> GemmaConfig:
  """Gemma 2 style: alternating local/global attention, soft caps, GQA."""
  return GemmaConfig(
      vocab_size=2048, d_model=d, num_layers=layers, num_heads=heads,
      num_kv_heads=kv_heads, head_dim=head_dim, mlp_dim=mlp,
      attention_types=((LOCAL, GLOBAL) * layers)[:layers], sliding_window=128,
      attn_logit_softcap=50.0, final_logit_softcap=30.0,
      use_post_attn_norm=True, use_post_ffw_norm=True)


ARCHS = {
    "t5_docstring": {
        "large": T5Config(vocab_size=2048, d_model=256, num_heads=4,
                          head_dim=64, num_encoder_layers=4,
                          num_decoder_layers=4, mlp_dim=1024),
        "medium": T5Config(vocab_size=2048, d_model=128, num_heads=2,
                           head_dim=64, num_encoder_layers=4,
                           num_decoder_layers=4, mlp_dim=512),
        "small": T5Config(vocab_size=2048, d_model=64, num_heads=2,
                          head_dim=32, num_encoder_layers=3,
                          num_decoder_layers=3, mlp_dim=256),
    },
    # The same sizes for the T5 family's next task.
    "t5_codegen": {},
    "gemma_completion": {
        "large": _gemma(256, 4, 4, 2, 64, 1024),
        "medium": _gemma(128, 4, 2, 1, 64, 512),
        "small": _gemma(64, 3, 2, 1, 32, 256),
    },
}


KEEP = ("best", "last", "metric", "metric_within")


@dataclasses.dataclass(frozen=True)
class Stage:
  """One training stage's schedule.

  Attributes:
    config: optimizer and loop settings.
    batch_size: examples (or text windows) per step.
    keep: 'best' (the parameters of the best validation loss), 'last'
      (those of the last step run; pretraining always keeps the last) or
      'metric' (of those two, the one whose greedy outputs score the better
      task metric on the validation check, ``CHECK_EXAMPLES`` examples;
      the best-loss one on a tie) or 'metric_within' (of every evaluated
      step whose validation loss is within ``loss_tolerance`` of the best,
      the one with the best such metric; lower loss on a tie).
    decoder_dropout: fraction of the decoder's input tokens replaced by the
      unknown piece in training (``train.decoder_token_dropout``; 0: none).
    loss_tolerance: 'metric_within' only: nats per token above the best
      validation loss that a kept step may be.
  """

  config: train_lib.TrainConfig
  batch_size: int
  keep: str = "best"
  decoder_dropout: float = 0.0
  loss_tolerance: float = 0.0

  def __post_init__(self):
    if self.keep not in KEEP:
      raise ValueError(f"keep must be one of {KEEP}, got {self.keep!r}")
    if self.loss_tolerance < 0 or (self.loss_tolerance > 0) != (
        self.keep == "metric_within"):
      raise ValueError(f"loss_tolerance must be > 0 with keep="
                       f"'metric_within' and 0 otherwise, got "
                       f"{self.loss_tolerance} with keep={self.keep!r}")
    if not 0.0 <= self.decoder_dropout < 1.0:
      raise ValueError(f"decoder_dropout must be in [0, 1), got "
                       f"{self.decoder_dropout}")


def _cfg(steps, lr, warmup, eval_every, seed, log_every=10, patience=0):
  return train_lib.TrainConfig(steps=steps, learning_rate=lr,
                               warmup_steps=warmup, eval_every=eval_every,
                               log_every=log_every, seed=seed,
                               patience=patience)


STAGES = {
    # (task, stage): schedule; seeds differ per stage. Sized from measured
    # step times on the 2-core build machine with one process per family
    # (benchmarks/results/default_models_progress.md): Gemma large
    # pretraining ~2.8 s/step of 16 x 256 ids, fine-tuning ~2.5 s/step; T5
    # large ~5 s/step of 32 examples. The large stages checkpoint at every
    # evaluation, so they run over several sessions. "<level>_onpolicy" is
    # the second round of the "<level>" distillation stage (its student's own
    # outputs scored by the teacher). The large fine-tuning stages stop after
    # 8 evaluations (400 steps) without a better validation loss: the T5
    # large's best loss came at step 150 (3.568; 3.652 at 550), so it stops
    # at 550; the Gemma large's longest such run was 3 evaluations before
    # its best at step 500, so it runs its 800 steps either way.
    # The large models keep, of their best-loss and last parameters, the
    # ones with the better greedy validation metric: in the second build
    # the T5 large's best-loss step (150, loss 3.568) looped in 30.2% of
    # greedy validation outputs with ROUGE-2 3.31, its last step (550, loss
    # 3.652) in 3.1% with ROUGE-2 4.56 (teacher-forced loss and greedy
    # quality disagree once it fits its 5,476 examples), so a fixed rule
    # ('best' or 'last') is wrong for one family or the other.
    ("gemma_completion", "large_pretrain"): Stage(
        _cfg(3000, 1e-3, 100, 100, seed=3), 16),
    ("gemma_completion", "large"): Stage(
        _cfg(800, 5e-4, 50, 50, seed=13, patience=8), 32, keep="metric"),
    ("gemma_completion", "medium_pretrain"): Stage(
        _cfg(2000, 1.5e-3, 100, 250, seed=5, log_every=50), 16),
    ("gemma_completion", "medium"): Stage(_cfg(2500, 7e-4, 100, 250, seed=23,
                                               log_every=50), 32),
    ("gemma_completion", "medium_onpolicy"): Stage(
        _cfg(1000, 3e-4, 50, 250, seed=24, log_every=50), 32),
    ("gemma_completion", "small_pretrain"): Stage(
        _cfg(1500, 2e-3, 100, 250, seed=4, log_every=50), 16),
    ("gemma_completion", "small"): Stage(_cfg(2000, 1e-3, 100, 200, seed=14,
                                              log_every=50), 32),
    ("gemma_completion", "small_onpolicy"): Stage(
        _cfg(1000, 3e-4, 50, 250, seed=15, log_every=50), 32),
    ("t5_docstring", "large_pretrain"): Stage(
        _cfg(2400, 1e-3, 100, 100, seed=1), 32),
    ("t5_docstring", "large"): Stage(
        _cfg(800, 5e-4, 50, 50, seed=11, patience=8), 32, keep="metric"),
    ("t5_docstring", "medium_pretrain"): Stage(
        _cfg(2000, 1.5e-3, 100, 250, seed=6, log_every=50), 32),
    ("t5_docstring", "medium"): Stage(_cfg(2500, 7e-4, 100, 250, seed=21,
                                           log_every=50), 32),
    ("t5_docstring", "medium_onpolicy"): Stage(
        _cfg(1000, 3e-4, 50, 250, seed=22, log_every=50), 32),
    ("t5_docstring", "small_pretrain"): Stage(
        _cfg(1500, 2e-3, 100, 250, seed=2, log_every=50), 32),
    ("t5_docstring", "small"): Stage(_cfg(2000, 1e-3, 100, 200, seed=12,
                                          log_every=50), 32),
    ("t5_docstring", "small_onpolicy"): Stage(
        _cfg(1000, 3e-4, 50, 250, seed=16, log_every=50), 32),
}
ARCHS["t5_codegen"] = dict(ARCHS["t5_docstring"])


def _codegen_stage(task: str, name: str, st: Stage) -> Stage:
  """A t5_codegen stage: t5_docstring's, query updates scaled
  (:func:`_query_scaled`); the large fine-tune keeps by metric within
  0.05 nats of its best validation loss.

  The seventh build's large (GPU, 2026-11-27) kept its last step by BLEU
  (8.23 vs 4.67 on the validation check) although its validation loss had
  risen from 2.698 (step 150) to 2.869 (step 550): it had memorised its
  5,332 pairs, and on the test split it was no better than the *pretrained*
  medium (2.948 vs 2.949), which distillation then passed. Among the steps
  whose loss is within 0.05 of the best, the best BLEU: a large that is
  best in loss and in the task metric. It stops after
  :data:`CODEGEN_PATIENCE` evaluations without a better loss.
  """
  st = _query_scaled(task, name, st)
  if name == "large":
    st = dataclasses.replace(
        st, keep="metric_within", loss_tolerance=0.05,
        config=dataclasses.replace(st.config, patience=CODEGEN_PATIENCE))
  return st


# The t5_codegen large stops after 4 evaluations (200 steps) without a better
# validation loss: a later step can only be kept if its loss is within 0.05
# of the best, and on the seventh build's GPU run the loss had left that band
# for good 250 steps after its best (2.6975 at 150; 2.8018 at 400), so the
# 8 evaluations of t5_docstring's schedule only spent ~200 CPU steps on
# steps that could not be kept.
CODEGEN_PATIENCE = 4


def _query_scaled(task: str, name: str, st: Stage) -> Stage:
  """``st`` with the T5 query kernel's AdamW updates scaled by
  1/sqrt(head_dim) of the stage's model (``TrainConfig.update_scales``).

  T5 folds attention's 1/sqrt(head_dim) into the query kernel's init; under
  AdamW that kernel then moves sqrt(head_dim) times faster relative to its
  size. The sixth build's T5 large (unscaled) learned no faster per step
  than its medium (pretraining eval 3.435 vs 3.419 at step 1,000, while the
  Gemma large, whose attention scales explicitly, led its medium by 0.46);
  the medium pretrained with the query's updates x1/8 on the same data,
  seed and schedule was 0.09 / 0.11 / 0.135 / 0.130 nats better at steps
  250 / 500 / 750 / 1,000 (benchmarks/experiments/t5_query_lr.py,
  benchmarks/results/default_models_progress.md).
  """
  level = name.split("_")[0]
  head_dim = ARCHS[task][level].head_dim
  cfg = dataclasses.replace(st.config,
                            update_scales=(("query", head_dim ** -0.5),))
  return dataclasses.replace(st, config=cfg)


# The T5 family's next task: the same schedules and seeds (its prefix-LM
# pairs are longer, see PREFIX_LM: ~1.3x the step time), with the query
# kernel's updates scaled and the large kept by metric within a loss
# tolerance (_codegen_stage).
STAGES.update({("t5_codegen", s): _codegen_stage("t5_codegen", s, st)
               for (t, s), st in list(STAGES.items()) if t == "t5_docstring"})


# Tasks whose shipped large model is distilled from its own outputs after
# fine-tuning (the "large_distill" stage: a born-again round, sequence-level
# self-distillation). The seventh build's fine-tuned T5 large (step 150) was
# best in test loss (2.727 vs the medium's 2.881) yet last in greedy test BLEU
# (7.70 vs 10.42, paired bootstrap P(large > medium) = 0.000): it had fitted
# its 5,332 pairs (train loss 1.54 vs validation 2.71 at step 250), while the
# students it taught, trained on its greedy and sampled outputs over 13,332
# inputs, wrote better greedy code lines than it did. The large gets the
# same kind of rows (its own outputs + the ground truth: the self_teacher
# stage), from its fine-tuned parameters; the students then learn from the
# teacher stage's rows of the distilled (shipped) large.
SELF_DISTILL_TASKS = ("t5_codegen",)
# Two cycles (warm restart at step 600, SGDR): the first 600-step cycle
# lifted the large's greedy test BLEU from 7.70 to 9.28 (and its test loss
# from 2.727 to 2.718) with its validation objective still falling at the
# end (3.022 at 100 -> 2.890 at 600), while the medium (10.16) had had 3,500
# steps of distillation; the second cycle continues that run exactly.
STAGES[("t5_codegen", "large_distill")] = _query_scaled(
    "t5_codegen", "large_distill",
    Stage(dataclasses.replace(_cfg(1500, 3e-4, 50, 100, seed=17),
                              cycle_lengths=(600, 900)), 32, keep="metric"))


# The t5_codegen medium: one distillation round on the teacher's rows plus
# its 'more' split (MORE_INPUTS: 44k rows; 4,500 steps of 32 ~ 3.3 passes,
# as many as the ninth session's 2,500 steps over 24k rows), and no
# on-policy round. The on-policy round trains on the student's own greedy
# outputs, and greedy alpha is measured along the large's: for the ninth
# session's medium it lowered alpha against the large from 0.709 to 0.701
# on validation and from 0.692 to 0.685 on test (first round's best vs
# shipped parameters, both in bfloat16). 4,500 steps, not 3,000: the two
# schedules were run side by side (tenth session, lent H200), and 4,500
# steps' medium was the better one on the validation split in what the
# medium is for -- greedy alpha against the large 0.710 vs 0.709, BLEU 3.22
# vs 3.02 (benchmarks/results/default_models_progress.md, tenth session).
STAGES[("t5_codegen", "medium")] = _query_scaled(
    "t5_codegen", "medium",
    Stage(_cfg(4500, 7e-4, 100, 250, seed=21, log_every=50), 32))
del STAGES[("t5_codegen", "medium_onpolicy")]


def has_onpolicy(task: str, level: str) -> bool:
  """Whether ``level``'s distillation stage has an on-policy second round."""
  return (task, f"{level}_onpolicy") in STAGES


def more_inputs(task: str, smoke: bool = False) -> int:
  """How many 'more' teacher-only inputs ``task`` has (MORE_INPUTS)."""
  n = MORE_INPUTS.get(task, 0)
  return min(n, SMOKE_EXAMPLES) if smoke else n


def arch(task: str, level: str, tok=None):
  """The config of one size (vocabulary of ``tok``)."""
  cfg = ARCHS[task][level]
  if tok is not None:
    cfg = dataclasses.replace(cfg, vocab_size=tok.vocab_size)
  return cfg


def stage(task: str, name: str, smoke: bool = False,
          smoke_steps: int = 4) -> Stage:
  st = STAGES[(task, name)]
  if smoke:
    cfg = dataclasses.replace(st.config, steps=smoke_steps, warmup_steps=1,
                              eval_every=smoke_steps, log_every=2,
                              cycle_lengths=())
    st = dataclasses.replace(st, config=cfg,
                             batch_size=min(st.batch_size, 8))
  return st


def describe(smoke: bool = False, smoke_steps: int = 4) -> dict:
  """Everything above, JSON-able (recorded in metadata.json)."""
  from specdec_jax.checkpoints import native  # pylint: disable=g-import-not-at-top
  return dict(
      archs={t: {lv: native.config_to_dict(c) for lv, c in a.items()}
             for t, a in ARCHS.items()},
      stages={f"{t}/{s}": dict(batch_size=st.batch_size, keep=st.keep,
                               decoder_dropout=st.decoder_dropout,
                               loss_tolerance=st.loss_tolerance,
                               **dataclasses.asdict(st.config))
              for (t, s), st in ((k, stage(*k, smoke, smoke_steps))
                                 for k in STAGES)},
      data_seed=DATA_SEED, prompt_weight=PROMPT_WEIGHT, lm_window=LM_WINDOW,
      pretrain_bytes=dict(PRETRAIN_BYTES),
      prefix_lm={t: list(v) for t, v in PREFIX_LM.items()},
      prefix_lm_levels={t: list(v) for t, v in PREFIX_LM_LEVELS.items()},
      top_k=TOP_K,
      teacher_seed=TEACHER_SEED, extra_inputs=EXTRA_INPUTS,
      more_inputs=dict(MORE_INPUTS),
      more_rows_levels={t: list(v) for t, v in MORE_ROWS_LEVELS.items()},
      self_distill_tasks=list(SELF_DISTILL_TASKS), smoke=smoke)


# ------------------------------------------------------------------- costs


def weight_macs_per_token(cfg) -> int:
  """Multiply-adds of the weight matmuls of one decoded token (decoder)."""
  if isinstance(cfg, T5Config):
    inner = cfg.num_heads * cfg.head_dim
    layer = 6 * cfg.d_model * inner + 3 * cfg.d_model * cfg.mlp_dim
    return cfg.num_decoder_layers * layer + cfg.d_model * cfg.vocab_size
  qkvo = cfg.d_model * cfg.head_dim * (2 * cfg.num_heads +
                                       2 * cfg.num_kv_heads)
  layer = qkvo + 3 * cfg.d_model * cfg.mlp_dim
  return cfg.num_layers * layer + cfg.d_model * cfg.vocab_size


def _step_setup(model, params, context):
  enc = None
  if model.is_encoder_decoder:
    enc = model.encode(params, jnp.full((1, 64), 5, jnp.int32))
  cache = model.init_cache(1, context + 8, enc)
  step = jax.jit(model.step)
  _, cache = step(params, jnp.full((1, context), 5, jnp.int32), cache)
  return step, cache


def step_flops(model, params, context: int = 32) -> float:
  """XLA's FLOP count of one 1-token cached step (batch 1)."""
  step, cache = _step_setup(model, params, context)
  one = jnp.full((1, 1), 5, jnp.int32)
  analysis = step.lower(params, one, cache).compile().cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0]
  return float(analysis["flops"])


def step_seconds(model, params, context: int = 32, repeats: int = 30):
  """Median seconds of a jitted 1-token step (batch 1) after ``context``."""
  step, cache = _step_setup(model, params, context)
  one = jnp.full((1, 1), 5, jnp.int32)
  jax.block_until_ready(step(params, one, cache))
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(step(params, one, cache))
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def costs(pair) -> dict:
  """Parameters, FLOPs and CPU step time per token of each size."""
  out = {}
  for level in ("small", "medium", "large"):
    model, params = pair.model(level)
    out[level] = dict(
        params=model.num_params(),
        weight_macs_per_token=weight_macs_per_token(model.config),
        step_flops_xla=step_flops(model, params),
        step_ms=round(1e3 * step_seconds(model, params), 3))
  for level in ("small", "medium"):
    out[f"large_over_{level}_flops"] = round(
        out["large"]["step_flops_xla"] / out[level]["step_flops_xla"], 2)
    out[f"large_over_{level}_step_time"] = round(
        out["large"]["step_ms"] / out[level]["step_ms"], 2)
  out["note"] = ("1-token cached decoder step, batch 1, context 32; FLOPs "
                 "from XLA's cost analysis; weight MACs exclude attention "
                 "over the context (T5: the encoder runs once per input)")
  return out


# ------------------------------------------------------------------ report


def _fmt(x, digits=2):
  return "-" if x is None else f"{x:.{digits}f}"


def report_markdown(meta: dict) -> str:
  """The Markdown report of ``metadata.json`` (formatting only)."""
  pre = meta["pretraining"]
  if "files_hash" in pre:  # one text for every family (older metadata)
    pre = {task: pre for task in meta["pairs"]}
  texts = "; ".join(
      f"{task} {len(p['files'])} files, {p['max_bytes'] / 2**20:.0f} MiB "
      f"(hash {p['files_hash'][:16]})" for task, p in pre.items())
  lines = ["# Built-in default models: three sizes per family", "",
           f"Produced by `{meta['command']}` (python {meta['python']}, jax "
           f"{meta['jax']}, {meta['machine']}). Task corpus: the CPython "
           f"standard library at `{meta['corpus']['stdlib_root']}` (hash "
           f"{meta['corpus']['corpus_hash'][:16]}), held-out split by file; "
           f"pretraining text: {texts}. Metrics in "
           "percent on the test split, greedy decoding; loss = mean token "
           "cross-entropy of the targets (+EOS) under teacher forcing; "
           "acceptance = accepted / drafted tokens of greedy SpecDecode "
           "(gamma 5) against the large model; alpha = accepted / (accepted "
           "+ rejections), the per-token acceptance rate of the papers.",
           "",
           "For scale: Leviathan et al. (Table 2) measure greedy alpha 0.75 "
           "(WMT EnDe) and 0.65 (CNN/DM) for T5-small drafting T5-XXL, and "
           "0.80-0.82 / 0.73-0.74 for T5-base and T5-large; under i.i.d. "
           "acceptance, alpha a gives accepted / drafted = (a - a^6) / (5 "
           "(1 - a)) at gamma 5, i.e. 0.46 / 0.33 for that T5-small and "
           "0.54-0.57 / 0.43-0.44 for the larger drafters. Acceptance rates "
           "are only comparable at equal gamma; alpha is gamma-free.", ""]
  for task, rep in meta["pairs"].items():
    ev = rep.get("evaluation") or {}
    if not ev.get("levels"):
      continue
    metrics = rep["task"]["metrics"]
    cost = ev["cost"]
    lines += [f"## {task}", "",
              f"{ev['examples']} test examples, max "
              f"{rep['task']['max_new_tokens']} new tokens (stop at EOS).", "",
              "| size | parameters | decoder FLOPs / token | large / this | "
              "validation loss | test loss | " + " | ".join(metrics) +
              " | repetition loops | alpha vs large (accepted / drafted) |"
              " training s |",
              "|---|" + "---|" * (8 + len(metrics))]
    train_s = _training_seconds(rep.get("stages", {}))
    for level in ("small", "medium", "large"):
      r, c = ev["levels"][level], cost[level]
      ratio = cost["large"]["step_flops_xla"] / c["step_flops_xla"]
      acc = ev["acceptance"].get(f"{level}>large")
      alp = ev.get("alpha", {}).get(f"{level}>large")
      acc = "-" if acc is None else (
          f"{_fmt(alp, 3)} ({_fmt(acc, 3)})" if alp is not None else
          _fmt(acc, 3))
      lines.append(
          f"| {level} | {c['params']:,} | {c['step_flops_xla'] / 1e6:.2f} M | "
          f"{ratio:.1f}x | {_fmt(r.get('validation_loss'), 3)} | "
          f"{_fmt(r['loss'], 3)} | "
          + " | ".join(_fmt(r[m]) for m in metrics) +
          f" | {100 * r['repetition_loop_fraction']:.1f}% | "
          f"{acc} | {train_s.get(level, 0):.0f} |")
    acc, alpha = ev["acceptance"], ev.get("alpha", {})
    pairs = ("small>large", "medium>large", "small>medium")
    lines += ["", "Greedy SpecDecode acceptance: " + ", ".join(
        f"{k} {acc[k]:.3f}" + (f" (alpha {alpha[k]:.3f})" if k in alpha
                               else "") for k in pairs) +
              "; tokens per verifier "
              f"call {ev['tokens_per_call']['small>large']:.2f} / "
              f"{ev['tokens_per_call']['medium>large']:.2f} / "
              f"{ev['tokens_per_call']['small>medium']:.2f}; SpecDecode output "
              f"equals the verifier's (target-only) output on "
              f"{100 * min(ev['spec_equals_target'].values()):.1f}% of the "
              f"examples, for every drafter/verifier pair. At T=1, "
              f"small>large acceptance "
              f"{ev['acceptance_t1_small>large']:.3f}.", "",
              f"CPU step time (1 token, batch 1): small {cost['small']['step_ms']}"
              f" ms, medium {cost['medium']['step_ms']} ms, large "
              f"{cost['large']['step_ms']} ms.", ""]
  return "\n".join(lines)


def _training_seconds(stages: dict) -> dict:
  """Training seconds per size (its own stages, large_distill included;
  teacher time -> drafters)."""
  get = lambda s: float(stages.get(s, {}).get("train_seconds", 0.0))
  return dict(large=get("large_pretrain") + get("large") +
              get("large_distill"),
              medium=get("medium_pretrain") + get("medium"),
              small=get("small_pretrain") + get("small"))
